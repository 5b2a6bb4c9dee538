"""Group commit: concurrent ``acks=all`` produces to one partition share one fsync.

A single broker has no replicas, so ``acks=all`` means "fsynced before the
ack" (DESIGN §6). Fsyncing inside :meth:`~logstore.storage.log.Log.append`
under the log's lock costs one fsync per produce and stops every other
append to the partition while the disk works. Instead the broker appends
without fsync and then awaits :meth:`GroupCommit.wait_durable` with the log
end offset it saw after its append:

* if no flush is running, the caller starts one (on the I/O pool) and waits
  for it;
* if a flush is running, the caller waits for it to end; if that flush did
  not cover its offsets (it started before the caller's append), the next
  flush — started by the first waiter to wake — covers every append made
  meanwhile. So at most one fsync per partition runs at a time and each one
  acknowledges everything appended before it began: under load the number of
  fsyncs per second is bounded by the disk, not by the produce rate.

Invariant (what makes the ack safe): ``durable_offset`` only advances to an
end offset taken *before* the fsync started, from the active segment's
``next_offset``, which :class:`~logstore.storage.segment.Segment` sets only
after the batch's bytes are written. Every record below it was therefore in
the file (or in an older segment, fsynced when it rolled) when the fsync
began, so the fsync covers it. Appends made during the fsync are only
covered by a later flush. The fsync takes no log lock: appends and reads go
on while the disk works. Indexes are not fsynced here: they are derived state
that recovery rebuilds after an unclean shutdown. The log's own
``recovery_point`` is left to :meth:`Log.flush` (it stays conservative).

Errors: a failed fsync (a retriable ``KAFKA_STORAGE_ERROR``; the producer
retries, and idempotence keeps the retry from appending twice) or a log gone
offline fails every produce waiting for that flush; the next waiter tries
again.

Caller's duty: ``durable_offset`` assumes offsets are never reused. A log truncated
below it (a follower, with replication) must get a new :class:`GroupCommit`.

Thread-safety: a :class:`GroupCommit` belongs to the broker's event loop; only
:func:`fsync_appended` runs on the I/O pool.
"""

from __future__ import annotations

import asyncio
import os
import weakref
from collections.abc import Awaitable, Callable

from logstore.errors import LogOfflineError, StorageError
from logstore.storage.log import Log

__all__ = ["GroupCommit", "fsync_appended", "fsyncs_done"]

_fsyncs = 0


def fsyncs_done() -> int:
    """How many group-commit fsyncs this process has run (for tests and benchmarks)."""
    return _fsyncs


def fsync_appended(log: Log) -> int:
    """fsync every record appended to ``log`` so far, without its lock; return their end offset.

    The end offset is taken before the fsync (see the module docstring); the
    fsync goes through a descriptor of its own (``fsync`` flushes the file,
    whichever descriptor wrote it), so the segment's pooled descriptor is not
    pinned while the disk works.
    """
    if log.offline_reason is not None:
        raise LogOfflineError(f"partition {os.path.basename(log.directory)} is offline: {log.offline_reason}")
    active = log.segments[-1]
    end = active.next_offset
    try:
        fd = os.open(active.path, os.O_RDONLY)
        try:
            os.fsync(fd)
        finally:
            os.close(fd)
    except OSError as e:
        raise StorageError(f"{active.path}: fsync failed: {e}") from e
    return end


class GroupCommit:
    """The flusher of one partition log; see the module docstring.

    ``run`` runs a blocking callable off the event loop (the broker's I/O pool).
    """

    def __init__(self, log: Log, run: Callable[[Callable[[Log], int], Log], Awaitable[int]]) -> None:
        # Weak: the broker keys its flushers by their log, weakly, so a deleted log goes.
        self._log = weakref.ref(log)
        self._run = run
        self._flushing: asyncio.Future[None] | None = None
        self.durable_offset = 0  # every offset below it is known fsynced by a group commit

    async def wait_durable(self, end_offset: int) -> None:
        """Return once every offset below ``end_offset`` is fsynced; raise if the flush failed."""
        while self.durable_offset < end_offset:
            flushing = self._flushing
            if flushing is None:
                flushing = self._flushing = asyncio.ensure_future(self._flush_once())
                # Retrieved here too, so a failure nobody waits for any more is not logged as lost.
                flushing.add_done_callback(lambda f: f.cancelled() or f.exception())
            # Shielded: a cancelled produce does not cancel the flush others wait for.
            await asyncio.shield(flushing)

    async def _flush_once(self) -> None:
        global _fsyncs
        try:
            log = self._log()
            if log is None:
                raise LogOfflineError("the partition was deleted")
            end = await self._run(fsync_appended, log)
            _fsyncs += 1
            self.durable_offset = max(self.durable_offset, end)
        finally:
            self._flushing = None
