"""ListOffsets' lookup, for every front end: the offset of a partition for a timestamp.

``-2`` (EARLIEST) is the log start offset; ``-1`` (LATEST) the end a consumer may read to
(the HWM, or the LSO for read_committed); a timestamp ``t >= 0`` the first offset below
that end whose record's timestamp is ``t`` or later, with that timestamp, or
:data:`NO_OFFSET` when there is none.

Thread-safety: :func:`offset_for_timestamp` runs on the event loop; the log is read on
the I/O pool.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from typing import Any

import pyarrow as pa

from logstore.errors import InvalidRequestError
from logstore.storage.log_manager import Partition

__all__ = ["EARLIEST", "LATEST", "NO_OFFSET", "offset_for_timestamp"]

EARLIEST = -2
LATEST = -1
NO_OFFSET = (-1, -1)  # no record at or after the timestamp: (offset, timestamp)


async def offset_for_timestamp(part: Partition, timestamp: int, *, read_committed: bool,
                               run_io: Callable[..., Awaitable[Any]]) -> tuple[int, int]:
    """(offset, timestamp) of ``part`` for ``timestamp``; see the module docstring. The
    timestamp is -1 for EARLIEST and LATEST."""
    bound = part.upper_bound(read_committed=read_committed)
    if timestamp == EARLIEST:
        return part.log.log_start_offset, -1
    if timestamp == LATEST:
        return bound, -1
    if timestamp < 0:
        raise InvalidRequestError(f"timestamp must be -2 (earliest), -1 (latest) or >= 0, got {timestamp}")
    found = await run_io(part.log.find_offset_for_timestamp, timestamp)
    if found is None or found >= bound:
        return NO_OFFSET
    return found, await run_io(_timestamp_at, part, found, bound)


def _timestamp_at(part: Partition, offset: int, bound: int) -> int:
    """The timestamp (ms) of the record at ``offset`` (which must exist below ``bound``)."""
    for batch in part.log.read(offset, max_bytes=1, upper_bound=bound).decode():
        return int(batch.column(1).cast(pa.int64())[0].as_py())
    return -1
