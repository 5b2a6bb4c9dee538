"""A partition log's behaviour when its disk is full: refuse appends, heal when space returns.

An append failing with ENOSPC or EDQUOT (:data:`DISK_FULL_ERRNOS`) does not
take the log offline. :meth:`DiskFullGuard.refuse` hides the failed batch
from readers at once (the active segment's next offset goes back to the log
end offset before the append) and returns a retriable
:class:`~logstore.errors.StorageError` (``KAFKA_STORAGE_ERROR``) saying the
batch was not appended; reads go on.

While blocked, every append first calls :meth:`DiskFullGuard.heal`, which
tries at most every :data:`RETRY_INTERVAL_S` (raising the same error in
between) to reopen the active segment from disk
(:func:`reopen_active_segment`): segment files above it (a roll the failure
cut short: they never held a batch) are removed, its tail is truncated back
to the last complete batch before the failure, and its indexes are rebuilt
and fsynced. When that works appends proceed, and ``partition ... is
writable again after N s of disk full`` is logged (WARNING, as was the
failure). A failure other than running out of space while reopening is
the caller's to handle (the log goes offline).

Thread-safety: the guard is used under its log's lock.
"""

from __future__ import annotations

import contextlib
import errno
import logging
import os
import time
from dataclasses import dataclass

from logstore.errors import CorruptRecordError, StorageError
from logstore.storage.fileutil import fsync_dir
from logstore.storage.segment import (
    INDEX_SUFFIX,
    SEGMENT_SUFFIX,
    TIMEINDEX_SUFFIX,
    Segment,
    segment_file_name,
)

__all__ = ["DISK_FULL_ERRNOS", "RETRY_INTERVAL_S", "DiskFullGuard", "reopen_active_segment"]

log = logging.getLogger("logstore.storage.log")

#: errno values of a write that failed because space ran out: retriable, the log heals.
DISK_FULL_ERRNOS = frozenset({errno.ENOSPC, errno.EDQUOT})
#: at most one attempt per this many seconds to reopen the active segment.
RETRY_INTERVAL_S = 0.2


@dataclass(slots=True)
class _Blocked:
    message: str
    log_end_offset: int  # the log's end before the failed append
    since: float
    retry_at: float


class DiskFullGuard:
    """Whether a log refuses appends after running out of space; see the module docstring."""

    __slots__ = ("_name", "blocked")

    def __init__(self, name: str) -> None:
        self._name = name
        self.blocked: _Blocked | None = None

    @property
    def reason(self) -> str | None:
        return None if self.blocked is None else self.blocked.message

    def refuse(self, error: OSError, *, active: Segment, log_end_offset: int) -> StorageError:
        """Block appends after ``error``; hide a written-but-failed batch; return the error to raise."""
        if active.next_offset > log_end_offset:
            # The batch was written but its flush failed: readers must not see it.
            active.next_offset = log_end_offset
        now = time.monotonic()
        if self.blocked is None:
            log.warning("partition %s: append failed, disk full (%s); appends are refused until "
                        "space returns (log end offset %d)", self._name, error, log_end_offset)
            message = (
                f"partition {self._name}: disk full ({error.strerror or error}); the batch was not "
                "appended. Free space on the data directory's disk: the partition accepts appends "
                "again without a restart"
            )
            self.blocked = _Blocked(message, log_end_offset, now, now + RETRY_INTERVAL_S)
        else:
            self.blocked.retry_at = now + RETRY_INTERVAL_S
        return StorageError(self.blocked.message)

    def heal(self, active: Segment, *, index_interval_bytes: int, force: bool = False) -> Segment:
        """Reopen ``active`` if it is time (or ``force``); return the segment to use instead.

        Raises :class:`StorageError` while the disk is still full; other
        OSErrors and :class:`CorruptRecordError` propagate.
        """
        blocked = self.blocked
        assert blocked is not None
        if not force and time.monotonic() < blocked.retry_at:
            raise StorageError(blocked.message)
        try:
            segment = reopen_active_segment(active, blocked.log_end_offset,
                                            index_interval_bytes=index_interval_bytes)
        except OSError as e:
            if e.errno in DISK_FULL_ERRNOS:
                raise self.refuse(e, active=active, log_end_offset=blocked.log_end_offset) from e
            raise
        self.blocked = None
        log.warning("partition %s is writable again after %.1f s of disk full (log end offset %d)",
                    self._name, time.monotonic() - blocked.since, segment.next_offset)
        return segment


def reopen_active_segment(active: Segment, log_end_offset: int, *, index_interval_bytes: int) -> Segment:
    """A fresh object for ``active``'s file, ending with the last batch below ``log_end_offset``.

    Removes segment files above it (a roll cut short), truncates a torn or
    unacknowledged tail, rebuilds and fsyncs the indexes. The old object's
    index files are closed (its buffered entries dropped); readers holding it
    keep its descriptor until they drop it. Raises OSError while the disk is
    still full.
    """
    directory = active.directory
    for name in os.listdir(directory):
        stem = name[: -len(SEGMENT_SUFFIX)]
        if name.endswith(SEGMENT_SUFFIX) and stem.isdigit() and int(stem) > active.base_offset:
            for suffix in (SEGMENT_SUFFIX, INDEX_SUFFIX, TIMEINDEX_SUFFIX):
                with contextlib.suppress(FileNotFoundError):
                    os.remove(os.path.join(directory, segment_file_name(int(stem), suffix)))
    for index in (active.offset_index, active.time_index):
        with contextlib.suppress(OSError):
            index.close()
    segment: Segment | None = None
    if os.path.exists(active.path):
        try:
            segment = Segment.open(directory, active.base_offset, index_interval_bytes=index_interval_bytes,
                                   created_ms=active.created_ms)
        except CorruptRecordError:
            if active.next_offset != active.base_offset:
                raise
            os.remove(active.path)  # a re-creation (schema change) cut short: it held no batch
    if segment is None:
        segment = Segment.create(directory, active.base_offset, active.schema,
                                 index_interval_bytes=index_interval_bytes, created_ms=active.created_ms)
    else:
        segment.recover()
        if segment.next_offset > log_end_offset:
            segment.truncate_to(log_end_offset)
        segment.flush()
    if segment.next_offset != log_end_offset:
        raise CorruptRecordError(
            f"{segment.path}: ends at offset {segment.next_offset} after reopening, expected {log_end_offset}"
        )
    fsync_dir(directory)
    return segment
