"""Which closed segments retention deletes: ``retention.ms`` and ``retention.bytes``.

A pure decision over a log's closed segments (oldest first), applied by
:meth:`logstore.storage.log.Log.enforce_retention` under the log's lock:

* ``retention.ms`` (``-1``: unlimited): a segment is past it when its largest
  record timestamp is older than ``now_ms - retention.ms``; deletion stops at
  the first segment that is not (segments are deleted oldest first only).
* ``retention.bytes`` (``-1``: unlimited): then, oldest first, segments are
  deleted while the log stays at least ``retention.bytes`` without them.

The active segment is never a candidate (the caller passes closed ones only).

Thread-safety: a pure function.
"""

from __future__ import annotations

from collections.abc import Sequence

from logstore.storage.config import LogConfig
from logstore.storage.segment import Segment

__all__ = ["segments_past_retention"]


def segments_past_retention(closed: Sequence[Segment], config: LogConfig, *, now_ms: int,
                            log_size_bytes: int) -> list[Segment]:
    """The oldest closed segments that ``config``'s retention deletes (a prefix of ``closed``)."""
    doomed: list[Segment] = []
    if config.retention_ms >= 0:
        horizon = now_ms - config.retention_ms
        for seg in closed:
            if seg.max_timestamp >= horizon:
                break
            doomed.append(seg)
    if config.retention_bytes >= 0:
        total = log_size_bytes - sum(s.size for s in doomed)
        for seg in closed[len(doomed):]:
            if total - seg.size < config.retention_bytes:
                break
            doomed.append(seg)
            total -= seg.size
    return doomed
