"""The ``/jobs`` page: compaction and view jobs' last runs, from the scheduler's status file.

The scheduler (``logstore jobs schedule``) writes a JSON status file when
``status_file = "PATH"`` is set in its ``jobs.toml`` (the format is
documented in ``jobs/run_status.py``; the CLI layer may not import
``jobs``, so this module reads the JSON itself and tolerates missing keys).
``logstore console --jobs-status PATH`` points the console at it. Without
the option, or while the file does not exist yet, the page says how to get
one; an unreadable or malformed file is one line on the page.

Thread-safety: pure functions (plus one file read).
"""

from __future__ import annotations

import json
import time
from pathlib import Path
from typing import Any

from logstore.cli.common import iso_ms
from logstore.cli.console.html import Markup, esc, table

__all__ = ["HOW_TO", "load_status", "render_jobs"]

HOW_TO = (
    'Set status_file = "data/jobs-status.json" in the scheduler\'s jobs.toml, run '
    "logstore jobs schedule --config conf/jobs.toml, and start the console with "
    "--jobs-status data/jobs-status.json."
)


def load_status(path: Path) -> dict[str, Any]:
    """The parsed status file; raises OSError or ValueError (bad JSON, wrong shape)."""
    doc = json.loads(path.read_text(encoding="utf-8"))
    if not isinstance(doc, dict) or not isinstance(doc.get("jobs", []), list):
        raise ValueError("not a jobs status document (no \"jobs\" list)")
    return doc


def _ago(ms: Any, now_ms: int) -> str | None:
    if not isinstance(ms, int):
        return None
    seconds = max(0, (now_ms - ms) // 1000)
    return f"{iso_ms(ms)} ({seconds}s ago)"


def render_jobs(path: Path | None) -> Markup:
    """The body of ``/jobs`` for the status file ``path`` (None: no ``--jobs-status`` given)."""
    if path is None:
        return Markup(f"<p id=jobs-missing>No jobs status file: the console was started without "
                      f"--jobs-status. {esc(HOW_TO)}</p>")
    try:
        doc = load_status(path)
    except FileNotFoundError:
        return Markup(f"<p id=jobs-missing>{esc(str(path))} does not exist yet: the scheduler writes it "
                      f"after its first run. {esc(HOW_TO)}</p>")
    except (OSError, ValueError) as e:
        return Markup(f"<p class=bad id=jobs-error>{esc(str(path))}: cannot read the jobs status: "
                      f"{esc(e)}</p>")
    now_ms = int(time.time() * 1000)
    rows = []
    for job in doc.get("jobs", []):
        if not isinstance(job, dict):
            continue
        last: dict[str, Any] = job["last"] if isinstance(job.get("last"), dict) else {}
        ok = last.get("ok")
        rows.append((
            job.get("kind"), job.get("name"),
            Markup("<span class=ok>ok</span>") if ok is True
            else Markup("<span class=bad>FAILED</span>") if ok is False else None,
            _ago(last.get("finished_ms"), now_ms),
            f"{last['duration_s']:.1f}s" if isinstance(last.get("duration_s"), (int, float)) else None,
            last.get("detail"), job.get("runs"), job.get("failures"),
            _ago(job.get("last_success_ms"), now_ms),
        ))
    updated = _ago(doc.get("updated_ms"), now_ms)
    body = Markup(f"<p>{esc(str(path))}: written by the scheduler (pid {esc(doc.get('pid'))}, "
                  f"config {esc(doc.get('config') or None)}), last at {esc(updated)}</p>")
    body += table(("kind", "job", "last run", "finished", "took", "detail", "runs", "failures", "last success"),
                  rows, numeric=("took", "runs", "failures"), table_id="jobs",
                  empty="no runs yet")
    return body
