"""HTML for the web console: escaping by default, the page frame, tables and SVG charts.

Templates are plain Python (f-strings over :class:`Markup`) rather than
Jinja2: the console has six small pages, and keeping them as functions
costs no dependency, type-checks with the rest, and puts escaping in one
place. The rule that makes it XSS-safe: **every value is escaped unless it
is a** :class:`Markup` (HTML this module or a page built itself). Topic
names, keys, values, group and member ids from the broker are plain ``str``
and therefore always escaped, in text and in attributes (``html.escape``
with ``quote=True``); URLs built from them go through :func:`url`
(percent-encoding) before escaping.

Charts are inline SVG rendered on the server (:func:`line_chart`): a
polyline per series in a fixed viewBox, no JavaScript. The only script on a
page is the optional auto-refresh (``<meta http-equiv="refresh">``, not even
JS).

Thread-safety: pure functions.
"""

from __future__ import annotations

import html
import urllib.parse
from collections.abc import Iterable, Mapping, Sequence

from logstore.byte_sizes import human_bytes

__all__ = ["Markup", "esc", "url", "quote", "page", "table", "line_chart", "link", "fmt_bytes", "fmt_rate"]


class Markup(str):
    """A string that is already HTML: :func:`esc` passes it through unchanged, and ``markup +
    other`` escapes ``other`` unless it is Markup too (as markupsafe's ``Markup``)."""

    __slots__ = ()

    def __add__(self, other: object) -> Markup:
        return Markup(str.__add__(self, esc(other)))


def esc(value: object) -> Markup:
    """``value`` as HTML: a :class:`Markup` as is, None as an em dash, anything else escaped."""
    if isinstance(value, Markup):
        return value
    if value is None:
        return Markup("&mdash;")
    return Markup(html.escape(str(value), quote=True))


def url(path: str, **query: object) -> str:
    """``path`` (whose segments the caller quoted with :func:`urllib.parse.quote`) plus a query
    string of the non-None ``query`` items, percent-encoded."""
    items = {k: str(v) for k, v in query.items() if v is not None}
    return path + ("?" + urllib.parse.urlencode(items) if items else "")


def link(href: str, text: object) -> Markup:
    return Markup(f'<a href="{esc(href)}">{esc(text)}</a>')


def quote(segment: str) -> str:
    """One path segment (a topic or group name) percent-encoded, ``/`` included."""
    return urllib.parse.quote(segment, safe="")


_NAV = (("/", "Cluster"), ("/topics", "Topics"), ("/groups", "Consumer groups"), ("/jobs", "Jobs"))

_STYLE = """
body{font-family:system-ui,-apple-system,Segoe UI,Roboto,sans-serif;margin:0;color:#1d2330;background:#f6f7f9}
header{background:#1d2330;color:#fff;padding:.6em 1.2em;display:flex;gap:1.5em;align-items:center}
header a{color:#cfd8ea;text-decoration:none}header a.on{color:#fff;font-weight:600}
header .brand{font-weight:700;color:#fff;margin-right:1em}
main{padding:1em 1.5em;max-width:1200px}
h1{font-size:1.4em;margin:.4em 0 .6em}h2{font-size:1.1em;margin:1.2em 0 .4em}
table{border-collapse:collapse;background:#fff;margin:.3em 0 1em;font-size:.92em}
th,td{border:1px solid #dde1e8;padding:.3em .6em;text-align:left;vertical-align:top}
th{background:#eef1f5}td.num{text-align:right;font-variant-numeric:tabular-nums}
pre{margin:0;white-space:pre-wrap;word-break:break-all;max-width:60em}
pre,code{font-family:ui-monospace,Menlo,Consolas,monospace;font-size:.9em}
.ok{color:#16794a;font-weight:600}.bad{color:#b3261e;font-weight:600}.muted{color:#6b7280}
.cards{display:flex;gap:1em;flex-wrap:wrap;margin-bottom:1em}
.card{background:#fff;border:1px solid #dde1e8;padding:.6em 1em;min-width:9em}
.card b{display:block;font-size:1.5em}
form.inline{display:flex;gap:.6em;align-items:end;margin:.5em 0 1em}
form.inline label{display:flex;flex-direction:column;font-size:.85em}
svg.chart{background:#fff;border:1px solid #dde1e8}
"""


def page(title: str, body: Markup, *, active: str = "/", refresh_s: float | None = None,
         bootstrap: str = "") -> Markup:
    """A whole page: the navigation bar, ``title`` as heading and ``body``. ``refresh_s`` makes the
    browser reload the page that often (a meta refresh: no script)."""
    nav = "".join(
        f'<a href="{href}"{" class=on" if href == active else ""}>{label}</a>' for href, label in _NAV
    )
    meta = f'<meta http-equiv="refresh" content="{refresh_s:g}">' if refresh_s else ""
    return Markup(
        "<!doctype html><html lang=en><head><meta charset=utf-8>"
        f"<title>{esc(title)} · logstore console</title>{meta}<style>{_STYLE}</style></head>"
        f'<body><header><span class=brand>logstore</span>{nav}'
        f'<span class=muted style="margin-left:auto">{esc(bootstrap)}</span></header>'
        f"<main><h1>{esc(title)}</h1>{body}</main></body></html>"
    )


def table(columns: Sequence[str], rows: Iterable[Sequence[object]], *, numeric: Iterable[str] = (),
          table_id: str | None = None, empty: str = "none") -> Markup:
    """A table whose cells are escaped (:func:`esc`); columns named in ``numeric`` align right."""
    right = set(numeric)
    head = "".join(f"<th>{esc(c)}</th>" for c in columns)
    body = []
    for row in rows:
        cells = "".join(
            f"<td{' class=num' if c in right else ''}>{esc(v)}</td>" for c, v in zip(columns, row, strict=True)
        )
        body.append(f"<tr>{cells}</tr>")
    if not body:
        body.append(f'<tr><td colspan="{len(columns)}" class=muted>{esc(empty)}</td></tr>')
    ident = f' id="{esc(table_id)}"' if table_id else ""
    return Markup(f"<table{ident}><thead><tr>{head}</tr></thead><tbody>{''.join(body)}</tbody></table>")


_COLORS = ("#2563eb", "#dc2626", "#16a34a", "#d97706", "#7c3aed", "#0891b2", "#db2777", "#4b5563")


def line_chart(series: Mapping[str, Sequence[tuple[float, float]]], *, width: int = 720, height: int = 220,
               y_label: str = "", chart_id: str = "chart") -> Markup:
    """Series of ``(t_seconds, value)`` points as an SVG line chart (one polyline each, with a
    legend giving each series' last value in full). The x axis spans the earliest to the latest time of all series; the y axis 0 to the
    largest value. Each polyline carries ``data-series`` (its name) and its points in
    ``points``, so a test can read what is plotted."""
    pad_l, pad_r, pad_t, pad_b = 56, 12, 12, 28
    plot_w, plot_h = width - pad_l - pad_r, height - pad_t - pad_b
    points = [p for pts in series.values() for p in pts]
    parts = [f'<svg class=chart id="{esc(chart_id)}" xmlns="http://www.w3.org/2000/svg" '
             f'width="{width}" height="{height + 18 * max(1, len(series))}" '
             f'viewBox="0 0 {width} {height + 18 * max(1, len(series))}" role="img" '
             f'aria-label="{esc(y_label)}">']
    parts.append(f'<line x1="{pad_l}" y1="{pad_t + plot_h}" x2="{pad_l + plot_w}" y2="{pad_t + plot_h}" '
                 'stroke="#9ca3af"/>')
    parts.append(f'<line x1="{pad_l}" y1="{pad_t}" x2="{pad_l}" y2="{pad_t + plot_h}" stroke="#9ca3af"/>')
    if not points:
        parts.append(f'<text x="{pad_l + 10}" y="{pad_t + plot_h / 2}" fill="#6b7280">no samples yet</text>')
        parts.append("</svg>")
        return Markup("".join(parts))
    t0 = min(t for t, _ in points)
    t1 = max(t for t, _ in points)
    y_max = max(max(v for _, v in points), 1.0)
    span = max(t1 - t0, 1e-9)

    def xy(t: float, v: float) -> str:
        return f"{pad_l + (t - t0) / span * plot_w:.1f},{pad_t + plot_h - v / y_max * plot_h:.1f}"

    for frac in (0.5, 1.0):
        y = pad_t + plot_h - frac * plot_h
        parts.append(f'<line x1="{pad_l}" y1="{y:.1f}" x2="{pad_l + plot_w}" y2="{y:.1f}" '
                     'stroke="#e5e7eb"/>')
        parts.append(f'<text x="{pad_l - 6}" y="{y + 4:.1f}" text-anchor="end" font-size="11" '
                     f'fill="#4b5563">{esc(_short_number(frac * y_max))}</text>')
    parts.append(f'<text x="{pad_l - 6}" y="{pad_t + plot_h + 4}" text-anchor="end" font-size="11" '
                 'fill="#4b5563">0</text>')
    parts.append(f'<text x="{pad_l}" y="{pad_t + plot_h + 18}" font-size="11" fill="#4b5563">'
                 f'-{span:.0f}s</text>')
    parts.append(f'<text x="{pad_l + plot_w}" y="{pad_t + plot_h + 18}" text-anchor="end" font-size="11" '
                 'fill="#4b5563">now</text>')
    for i, (name, pts) in enumerate(series.items()):
        color = _COLORS[i % len(_COLORS)]
        coords = " ".join(xy(t, v) for t, v in pts)
        parts.append(f'<polyline data-series="{esc(name)}" fill="none" stroke="{color}" stroke-width="2" '
                     f'points="{coords}"/>')
        ly = height + 12 + 18 * i
        parts.append(f'<rect x="{pad_l}" y="{ly - 9}" width="10" height="10" fill="{color}"/>')
        last = pts[-1][1] if pts else None
        parts.append(f'<text x="{pad_l + 16}" y="{ly}" font-size="12">{esc(name)}'
                     f'{esc("" if last is None else f" (now {_exact_number(last)})")}</text>')
    parts.append("</svg>")
    return Markup("".join(parts))


def _exact_number(v: float) -> str:
    """``v`` in full, as a page's other numbers are: ``1234567``, not ``:g``'s ``1.23457e+06``."""
    return str(int(v)) if v.is_integer() else f"{v:.6g}"


def _short_number(v: float) -> str:
    for unit, size in (("G", 1e9), ("M", 1e6), ("k", 1e3)):
        if v >= size:
            return f"{v / size:.3g}{unit}"
    return f"{v:.3g}"


def fmt_bytes(n: int | None) -> str | None:
    """``1536`` → ``1.5 KiB``; None (or a negative size) stays None."""
    return None if n is None or n < 0 else human_bytes(n)


def fmt_rate(r: float | None) -> str | None:
    """Records per second, or None before two samples exist."""
    return None if r is None else f"{r:,.1f}/s"
