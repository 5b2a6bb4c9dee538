"""The message browser: read a window of one partition and render its records.

``/topics/<name>/messages?partition=P&offset=O&limit=N`` reads at most
``limit`` records (default 50, at most 500) of partition ``P`` from offset
``O`` (default: the last ``limit`` before the end) with a
:class:`~logstore.client.consumer.Consumer` assigned to that partition only
(read_committed, what a consumer sees: nothing at or above the LSO). An
offset below the log start starts at the log start, as a consumer with
``auto_offset_reset="earliest"`` does.

Rendering:

* a **typed** topic (an Arrow value schema) is a table with one column per
  value column (:func:`render_typed`);
* an **untyped** topic is key / value (:func:`render_bytes`): a value that
  parses as JSON is pretty-printed, else UTF-8 text, else a hex dump of the
  first 256 bytes. Tombstones show as ``tombstone``.

Everything goes through :func:`logstore.cli.console.html.esc`.

Thread-safety: :func:`read_window` blocks (call it in a worker thread); the
rest are pure functions.
"""

from __future__ import annotations

import json
import time
from dataclasses import dataclass
from typing import Any

from logstore.cli.common import iso_ms, jsonable
from logstore.cli.console.html import Markup, esc
from logstore.client.consumer import Consumer
from logstore.client.security import ClientSecurity
from logstore.types import ConsumerRecord, PartitionInfo, TopicPartition

__all__ = ["DEFAULT_LIMIT", "MAX_LIMIT", "Window", "read_window", "render_bytes", "render_key", "render_value"]

DEFAULT_LIMIT = 50
MAX_LIMIT = 500
_READ_DEADLINE_S = 5.0
_HEX_BYTES = 256


@dataclass(frozen=True, slots=True)
class Window:
    """The records read from ``start`` (first offset asked, after clamping) up to ``end``
    (exclusive: the LSO, or ``start + limit`` when that is lower)."""

    start: int
    end: int
    records: list[ConsumerRecord]


def window_bounds(info: PartitionInfo, offset: int | None, limit: int) -> tuple[int, int]:
    """The ``[start, end)`` to read: ``offset`` (default: ``limit`` before the end) clamped to
    the log, and at most ``limit`` records, never past the LSO."""
    visible_end = info.last_stable_offset
    start = visible_end - limit if offset is None else offset
    start = max(info.log_start_offset, min(start, visible_end))
    return start, min(visible_end, start + limit)


def read_window(bootstrap: str, info: PartitionInfo, offset: int | None, limit: int,
                security: ClientSecurity | None = None) -> Window:
    """Read the records of ``info``'s partition in :func:`window_bounds` (blocking, at most
    ~5 s: fewer records when a compacted log has gaps or the broker is slow), as a client
    with ``security`` (TLS, SASL)."""
    start, end = window_bounds(info, offset, limit)
    records: list[ConsumerRecord] = []
    if start >= end:
        return Window(start, end, records)
    tp = TopicPartition(info.topic, info.partition)
    with Consumer(bootstrap, auto_offset_reset="earliest", fetch_max_wait_ms=200, security=security) as consumer:
        consumer.assign([tp])
        consumer.seek(tp, start)
        deadline = time.monotonic() + _READ_DEADLINE_S
        while time.monotonic() < deadline:
            got = consumer.poll(timeout_ms=200, max_records=limit - len(records))
            records.extend(r for r in got if r.offset < end)
            if len(records) >= limit or consumer.position(tp) >= end:
                break
    return Window(start, end, records[:limit])


def render_bytes(data: bytes | None) -> Markup:
    """An untyped key or value: pretty JSON, else text, else a hex dump (None: ``tombstone``/—)."""
    if data is None:
        return Markup("<span class=muted>null</span>")
    try:
        text = data.decode("utf-8")
    except UnicodeDecodeError:
        shown = data[:_HEX_BYTES]
        dump = " ".join(f"{b:02x}" for b in shown)
        more = f" … ({len(data)} bytes)" if len(data) > _HEX_BYTES else f" ({len(data)} bytes)"
        return Markup(f"<pre class=hex title=binary>{esc(dump + more)}</pre>")
    stripped = text.strip()
    if stripped[:1] in ("{", "[") or stripped in ("true", "false", "null"):
        try:
            parsed = json.loads(stripped)
        except ValueError:
            pass
        else:
            return Markup(f"<pre class=json>{esc(json.dumps(parsed, indent=2, ensure_ascii=False))}</pre>")
    return Markup(f"<pre>{esc(text)}</pre>")


def render_key(data: bytes | None) -> Markup:
    """A key: its text on one line, or a hex dump when it is not UTF-8 (None: ``null``)."""
    if data is None:
        return Markup("<span class=muted>null</span>")
    try:
        return Markup(f"<code>{esc(data.decode('utf-8'))}</code>")
    except UnicodeDecodeError:
        return render_bytes(data)


def render_value(value: Any) -> Markup:
    """One column of a typed value: its JSON form (nested values as compact JSON)."""
    doc = jsonable(value)
    if doc is None:
        return Markup("<span class=muted>null</span>")
    if isinstance(doc, (dict, list)):
        return Markup(f"<pre>{esc(json.dumps(doc, ensure_ascii=False))}</pre>")
    return esc(doc)


def headers_text(record: ConsumerRecord) -> str | None:
    if not record.headers:
        return None
    return ", ".join(f"{k}={jsonable(v)}" for k, v in record.headers)


def typed_rows(records: list[ConsumerRecord], columns: list[str]) -> list[list[object]]:
    """Rows of offset, timestamp, key, one cell per value column, headers."""
    rows: list[list[object]] = []
    for r in records:
        cells: list[object] = [r.offset, iso_ms(r.timestamp_ms), render_key(r.key)]
        if r.value is None:
            cells.append(Markup("<span class=muted>tombstone</span>"))
            cells.extend("" for _ in columns[1:])
        else:
            assert isinstance(r.value, dict)
            cells.extend(render_value(r.value.get(c)) for c in columns)
        cells.append(headers_text(r))
        rows.append(cells)
    return rows


def untyped_rows(records: list[ConsumerRecord]) -> list[list[object]]:
    """Rows of offset, timestamp, key, value, headers."""
    return [[r.offset, iso_ms(r.timestamp_ms), render_key(r.key),
             Markup("<span class=muted>tombstone</span>") if r.value is None
             else render_bytes(r.value if isinstance(r.value, bytes) else None),
             headers_text(r)] for r in records]
