"""Progress of the ``logstore jobs`` commands: a bar on a terminal, plain lines elsewhere.

Why ``rich`` (already a dependency of the CLI's tables) rather than tqdm: one
``rich.progress.Progress`` holds several bars (one per partition) and prints
log lines above them without tearing, and the CLI's tables already render
with it, so there is one terminal library.

* :class:`CompactionBars` — a :class:`compaction.job.CompactionListener`: a
  "key scan" spinner while Spark computes the latest offset per key, then a
  bar per partition in bytes read of the planned bytes.
* :class:`CatchUpBar` — ``materialize --available-now``: offsets applied of
  the offsets to read (from the query's progress, Kafka's
  ``offsetsBehindLatest`` computed by :func:`spark_source.offsets_behind_latest`)
  and the batch number.

Both draw only when stderr is a terminal (:func:`bars_wanted`); otherwise the
jobs' log lines (a line per batch, a line every few seconds per partition)
are the progress, as tests and CI logs want. While a bar is shown, writes to
``sys.stderr`` (the jobs' log lines) are printed above it.

Thread-safety: the listener methods may be called from any thread (rich's
``Progress`` is thread-safe); start and stop from the command's thread.
"""

from __future__ import annotations

import sys
import threading
from collections.abc import Sequence
from typing import Any, TextIO

from rich.console import Console
from rich.progress import (
    BarColumn,
    DownloadColumn,
    Progress,
    SpinnerColumn,
    TaskID,
    TextColumn,
    TimeElapsedColumn,
)

__all__ = ["bars_wanted", "CompactionBars", "CatchUpBar", "CurrentStderr"]


def bars_wanted(stream: TextIO | None = None) -> bool:
    """True when ``stream`` (default stderr) is a terminal: bars there, plain lines otherwise."""
    stream = stream or sys.stderr
    try:
        return stream.isatty()
    except (AttributeError, ValueError):
        return False


class CurrentStderr:
    """A stream that writes to whatever ``sys.stderr`` is *now* (rich swaps it while a bar shows).

    Log handlers hold their stream; given this one, their lines go above the bar.
    """

    def write(self, text: str) -> int:
        return sys.stderr.write(text)

    def flush(self) -> None:
        sys.stderr.flush()


def _progress(*columns: Any, console: Console | None) -> Progress:
    return Progress(*columns, console=console or Console(stderr=True), transient=True,
                    redirect_stdout=False, redirect_stderr=True)


class CompactionBars:
    """A :class:`compaction.job.CompactionListener` drawing rich bars (see the module docstring)."""

    def __init__(self, topic: str, *, console: Console | None = None) -> None:
        self._bars = _progress(SpinnerColumn(), TextColumn("{task.description}"), BarColumn(),
                               DownloadColumn(), TimeElapsedColumn(), console=console)
        self._topic = topic
        self._lock = threading.Lock()
        self._tasks: dict[int, TaskID] = {}
        self._scan: TaskID | None = None

    def __enter__(self) -> CompactionBars:
        self._bars.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._bars.stop()

    def planned(self, plans: Sequence[Any]) -> None:
        with self._lock:
            self._scan = self._bars.add_task(f"{self._topic}: key scan ({len(plans)} partition(s))",
                                             total=None)
            for plan in plans:
                self._tasks[plan.partition] = self._bars.add_task(
                    f"{plan.topic}-{plan.partition}: rewrite", total=max(plan.size_bytes, 1), start=False)

    def scanned(self) -> None:
        with self._lock:
            if self._scan is not None:
                self._bars.remove_task(self._scan)
                self._scan = None
            for task in self._tasks.values():
                self._bars.start_task(task)

    def progress(self, tp: Any, done: int, total: int, removed: int) -> None:
        task = self._tasks.get(tp.partition)
        if task is not None:
            self._bars.update(task, completed=done, total=max(total, 1),
                              description=f"{tp}: rewrite, {removed} removed")


class CatchUpBar:
    """``materialize --available-now``: offsets read of the offsets available (see the module docstring)."""

    def __init__(self, topic: str, *, console: Console | None = None) -> None:
        self._bars = _progress(SpinnerColumn(), TextColumn("{task.description}"), BarColumn(),
                               TextColumn("{task.fields[offsets]}"), TimeElapsedColumn(),
                               console=console)
        self._task = self._bars.add_task(f"{topic}: starting", total=None, offsets="")
        self._topic = topic

    def __enter__(self) -> CatchUpBar:
        self._bars.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._bars.stop()

    def update(self, last_progress: dict[str, Any] | None) -> None:
        """Redraw from a ``StreamingQuery.lastProgress`` (``None`` before the first batch)."""
        if not last_progress or not last_progress.get("sources"):
            return
        source = last_progress["sources"][0]
        done = _offset_sum(source.get("endOffset"))
        latest = _offset_sum(source.get("latestOffset"))
        self._bars.update(self._task, completed=done, total=max(latest, done, 1),
                          description=f"{self._topic}: batch {last_progress.get('batchId', 0)}",
                          offsets=f"{done}/{max(latest, done)} offsets")


def _offset_sum(offsets: Any) -> int:
    """Sum of a source offset's per-partition offsets (``{"topic": {"0": 10}}``, maybe JSON text)."""
    import json

    if isinstance(offsets, str):
        try:
            offsets = json.loads(offsets)
        except ValueError:
            return 0
    if not isinstance(offsets, dict):
        return 0
    total = 0
    for per_topic in offsets.values():
        if isinstance(per_topic, dict):
            total += sum(int(v) for v in per_topic.values() if isinstance(v, int | str) and str(v).isdigit())
    return total
