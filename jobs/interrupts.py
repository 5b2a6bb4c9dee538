"""Ctrl-C and SIGTERM for the ``logstore jobs`` commands: one line, no py4j tracebacks.

Why not Python's ``KeyboardInterrupt``: a job's main thread spends its time
inside py4j calls (``awaitTermination``, a Spark action). PySpark's own SIGINT
handler cancels all jobs *from inside the signal handler*, on the same py4j
connection the interrupted call is reading, and raises ``KeyboardInterrupt``
there; py4j then logs "reentrant call" / "Error while sending or receiving"
tracebacks (~150 lines for one Ctrl-C) and the connection is left broken.

:class:`Interrupts` instead records the signal and returns; the command's loop
sees :attr:`Interrupts.requested` within a second and stops in order (the
streaming query, then the session), printing one line. ``on_first`` runs in a
new thread (its own py4j connection), e.g. to cancel a running Spark job so
a blocking action returns. A second signal exits at once (``os._exit``, code
128 + signal): the jobs are crash-safe (a view resumes from its checkpoint, a
compaction keeps nothing half-swapped), so that only skips the clean stop.

Thread-safety: install and restore from the main thread (Python's rule for
``signal.signal``); the handler itself only appends to a list.
"""

from __future__ import annotations

import logging
import os
import signal
import sys
import threading
from collections.abc import Callable
from types import FrameType
from typing import Any

__all__ = ["Interrupts", "quiet_py4j"]

_SIGNALS = (signal.SIGINT, signal.SIGTERM)


def quiet_py4j() -> None:
    """Silence py4j's loggers (for the interrupt path only).

    While the query and the session stop, py4j's threads may log a closed
    callback connection ("Closing down clientserver connection", "Error while
    sending or receiving"); after a requested stop those say nothing.
    """
    for name in ("py4j", "py4j.java_gateway", "py4j.clientserver"):
        logging.getLogger(name).setLevel(logging.CRITICAL)


class Interrupts:
    """Records SIGINT/SIGTERM instead of raising; see the module docstring."""

    def __init__(self, *, on_first: Callable[[], None] | None = None) -> None:
        self.signals: list[int] = []
        self._on_first = on_first
        self._previous: dict[int, Any] = {}

    @property
    def requested(self) -> bool:
        return bool(self.signals)

    @property
    def exit_code(self) -> int:
        """130 after Ctrl-C (the shell's convention), 0 after SIGTERM (a service's stop)."""
        return 128 + signal.SIGINT if self.signals and self.signals[0] == signal.SIGINT else 0

    def install(self) -> Interrupts:
        """(Re)install the handlers; call again after creating a SparkContext (it installs its own)."""
        for s in _SIGNALS:
            previous = signal.signal(s, self._handle)
            self._previous.setdefault(s, previous)
        return self

    def restore(self) -> None:
        for s, handler in self._previous.items():
            signal.signal(s, handler)
        self._previous.clear()

    def _handle(self, signum: int, frame: FrameType | None) -> None:
        self.signals.append(signum)
        if len(self.signals) > 1:
            os.write(2, b"interrupted again: exiting now\n")
            os._exit(128 + signum)
        quiet_py4j()
        if self._on_first is not None:
            threading.Thread(target=self._run_on_first, name="interrupt", daemon=True).start()

    def _run_on_first(self) -> None:
        try:
            assert self._on_first is not None
            self._on_first()
        except Exception as e:  # noqa: BLE001 - best effort; the command's loop stops anyway
            print(f"while stopping: {str(e).strip().splitlines()[0][:200] if str(e).strip() else e!r}",
                  file=sys.stderr)
