"""Rate limits for log lines: a flood of the same message must not flood the log.

:class:`RepeatedMessageFilter` is a :class:`logging.Filter` for handlers. It
groups records by a key — (logger, level, message template) by default, so
``"refused a %s request from %s: %s"`` is one message whatever its arguments —
and lets at most ``burst`` records of a key through per ``interval_s``; the
rest are dropped and counted. The first record of that key let through after
a suppression carries a note: ``[suppressed K similar messages]``. Records
below ``min_level`` always pass. Used by the broker's log (every handler of
the root logger; issue 14: 18 MB of log in 2 minutes of bad requests) and by
the CLI's client warnings.

Memory: one small entry per key; keys are templates (a bounded set in a
program), or logger names with ``by="logger"``.

Thread-safety: :meth:`RepeatedMessageFilter.filter` may be called from any
thread (a lock guards the counters).
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable
from typing import Literal

__all__ = ["RepeatedMessageFilter"]


class RepeatedMessageFilter(logging.Filter):
    """At most ``burst`` records of each key every ``interval_s``; later ones counted and dropped."""

    def __init__(
        self,
        *,
        burst: int = 5,
        interval_s: float = 60.0,
        min_level: int = logging.WARNING,
        by: Literal["template", "logger"] = "template",
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        super().__init__()
        if burst < 1 or interval_s <= 0:
            raise ValueError(f"burst must be >= 1 and interval_s > 0, got {burst} and {interval_s}")
        self.burst = burst
        self.interval_s = interval_s
        self.min_level = min_level
        self._by = by
        self._clock = clock
        self._lock = threading.Lock()
        # key -> [window start, records let through in the window, suppressed since the last one let through]
        self._state: dict[tuple[object, ...], list[float]] = {}

    def _key(self, record: logging.LogRecord) -> tuple[object, ...]:
        if self._by == "logger":
            return (record.name,)
        return (record.name, record.levelno, str(record.msg))

    def filter(self, record: logging.LogRecord) -> bool:
        if record.levelno < self.min_level:
            return True
        now = self._clock()
        key = self._key(record)
        with self._lock:
            state = self._state.get(key)
            if state is None:
                self._state[key] = [now, 1, 0]
                return True
            if now - state[0] >= self.interval_s:
                state[0], state[1] = now, 0
            if state[1] >= self.burst:
                state[2] += 1
                return False
            state[1] += 1
            suppressed, state[2] = int(state[2]), 0
        if suppressed:
            # Appended to the template (the arguments are unchanged): no '%' in the note.
            record.msg = f"{record.msg} [suppressed {suppressed} similar messages]"
        return True
