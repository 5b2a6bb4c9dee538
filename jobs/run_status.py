"""The scheduler's status file: each job's last run, as JSON, for ``logstore console --jobs-status``.

The scheduler (:mod:`jobs.scheduler`) keeps its runs in memory and logs them;
with ``status_file = "PATH"`` in ``jobs.toml`` it also keeps this file up to
date, so that another process (the web console, which may not import
``jobs``) can show the last runs. Format (version 1)::

    {
      "format": 1,
      "updated_ms": 1764158400000,          # wall clock of the last write
      "pid": 4242,                          # the scheduler's process
      "config": "conf/jobs.toml",
      "jobs": [                             # one entry per job, in first-run order
        {"kind": "compaction",              # plan, compaction or view
         "name": "profiles",                # the topic, or "topic -> table" for a view
         "runs": 3, "failures": 1,
         "last_success_ms": 1764158390000,  # null before the first success
         "last_failure_ms": 1764158000000,  # null when it never failed
         "last": {"ok": true, "finished_ms": 1764158390000, "duration_s": 4.2,
                  "detail": "compacted 3 partitions ..."}}
      ]
    }

Each write replaces the whole file atomically (a temporary file in the same
directory, then ``os.replace``), so a reader never sees half a document. A
write that fails (disk full, directory gone) is logged once as a warning and
never stops the scheduler; the next run tries again.

Thread-safety: a :class:`RunStatusFile` is used by the scheduler's one thread.
"""

from __future__ import annotations

import contextlib
import json
import logging
import os
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any, Protocol

__all__ = ["FORMAT_VERSION", "RunLike", "RunStatusFile"]

FORMAT_VERSION = 1

log = logging.getLogger("logstore.jobs.scheduler")


class RunLike(Protocol):
    """What the status file needs of a run (:class:`jobs.scheduler.RunRecord` is one)."""

    @property
    def kind(self) -> str: ...
    @property
    def name(self) -> str: ...
    @property
    def ok(self) -> bool: ...
    @property
    def duration_s(self) -> float: ...
    @property
    def detail(self) -> str: ...


class RunStatusFile:
    """Keeps ``path`` up to date with each job's last run; see the module docstring."""

    def __init__(self, path: str | os.PathLike[str], *, config: str = "",
                 wall_clock_ms: Callable[[], int] | None = None) -> None:
        self.path = Path(path)
        self.config = config
        self._now_ms = wall_clock_ms or (lambda: int(time.time() * 1000))
        self._jobs: dict[tuple[str, str], dict[str, Any]] = {}
        self._warned = False

    def record(self, run: RunLike) -> None:
        """Note ``run`` as its job's last run and rewrite the file."""
        now = self._now_ms()
        entry = self._jobs.setdefault((run.kind, run.name), {
            "kind": run.kind, "name": run.name, "runs": 0, "failures": 0,
            "last_success_ms": None, "last_failure_ms": None, "last": None,
        })
        entry["runs"] += 1
        if run.ok:
            entry["last_success_ms"] = now
        else:
            entry["failures"] += 1
            entry["last_failure_ms"] = now
        entry["last"] = {"ok": run.ok, "finished_ms": now, "duration_s": round(run.duration_s, 3),
                         "detail": run.detail}
        self.write()

    def document(self) -> dict[str, Any]:
        return {"format": FORMAT_VERSION, "updated_ms": self._now_ms(), "pid": os.getpid(),
                "config": self.config, "jobs": list(self._jobs.values())}

    def write(self) -> None:
        """Replace the file with the current document (atomically); failures are logged once."""
        try:
            self.path.parent.mkdir(parents=True, exist_ok=True)
            fd, tmp = tempfile.mkstemp(prefix=f".{self.path.name}.", dir=self.path.parent)
            try:
                with os.fdopen(fd, "w", encoding="utf-8") as f:
                    json.dump(self.document(), f, indent=1)
                os.replace(tmp, self.path)
            except BaseException:
                with contextlib.suppress(OSError):
                    os.unlink(tmp)
                raise
            self._warned = False
        except OSError as e:
            if not self._warned:
                log.warning("jobs status file %s not written: %s", self.path, e.strerror or e)
                self._warned = True
