"""One fetch path for consumers and followers: resolve, read within a budget, or wait.

A fetch (:class:`~logstore.broker.data_plane.params.FetchParams`) goes round by round:

1. **Resolve** each partition on the event loop: a consumer's to the partition this
   broker leads (``leader``: NOT_LEADER_OR_FOLLOWER, FENCED_LEADER_EPOCH, ... otherwise);
   a follower's through the replica manager (``replica_partition``), which on the
   fetch's first round also records the follower's log end offset, moves the HWM and
   may add the follower to the ISR.
2. **Read** in request order until the records and schemas add up to the answer's
   budget (Kafka's ``fetch.max.bytes``): the first partition with data always gets its
   first batch, even when larger, so a reader makes progress; later partitions get
   their bounds and no records. A consumer reads up to the HWM (read_uncommitted) or
   the LSO with the aborted transactions of what it read (read_committed); a follower
   up to the log end offset. Reads run on the I/O pool, except the small read after a
   wake-up: what a waiting fetch reads was appended just now (in the page cache), so
   up to ``INLINE_READ_BYTES`` are read on the loop, where a trip to the pool and back
   costs more than the read.
3. **Answer** once there are ``min_bytes`` (at least one byte), an error, or the wait
   is over; else **wait** on the partitions' futures
   (:class:`~logstore.broker.data_plane.waiters.PartitionWaiters`, registered before the
   read) until something is appended or a HWM moves, up to ``max_wait_s``. A fetch
   with nothing to read for its role (every partition read to its end) waits without
   a read at all.

Thread-safety: :meth:`FetchPath.fetch_records` runs on the event loop; a read runs on
one I/O thread or on the loop, and touches only the :class:`PartitionRead` values of
its own round.
"""

from __future__ import annotations

import asyncio
import contextlib
import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from typing import Any

from logstore.broker.data_plane.params import FetchParams, FetchPartition, Isolation, PartitionRead
from logstore.broker.data_plane.waiters import PartitionWaiters
from logstore.broker.unexpected import unexpected
from logstore.errors import LogstoreError, OffsetOutOfRangeError
from logstore.record import encode_schema
from logstore.storage.log_manager import Partition

__all__ = ["FetchPath", "INLINE_READ_BYTES", "REPLICA_MAX_BYTES"]

INLINE_READ_BYTES = 1 << 20  # a woken fetch reads up to this much on the event loop
REPLICA_MAX_BYTES = 16 << 20  # a follower's answer when it names no max_bytes

ReplicaPartition = Callable[[int, str, int, int, int, bool], Awaitable[Partition]]


@dataclass(slots=True)
class _Target:
    """A partition of this round: the answer being built, the partition (None: ``read.error``)."""

    read: PartitionRead
    part: Partition | None
    spec: FetchPartition


class FetchPath:
    """Serves :class:`FetchParams`; see the module docstring.

    ``leader(topic, partition, current_leader_epoch)`` is the partition a consumer reads;
    ``replica_partition(follower, topic, partition, offset, current_leader_epoch, first)`` the
    one a follower reads (an awaitable; it records the follower's progress when ``first``);
    ``exists(topic, partition)`` says whether a partition is hosted here (only those are
    watched); ``run_io`` runs a call on the I/O pool; ``max_reply_bytes`` caps a consumer's
    answer.
    """

    def __init__(self, *, waiters: PartitionWaiters, leader: Callable[[str, int, int], Partition],
                 replica_partition: ReplicaPartition, exists: Callable[[str, int], bool],
                 run_io: Callable[..., Awaitable[Any]], max_reply_bytes: int) -> None:
        self._waiters = waiters
        self._leader = leader
        self._replica_partition = replica_partition
        self._exists = exists
        self._run_io = run_io
        self._max_reply_bytes = max_reply_bytes

    def _budget(self, params: FetchParams) -> int:
        if params.from_replica:
            return params.max_bytes if params.max_bytes > 0 else REPLICA_MAX_BYTES
        ceiling = self._max_reply_bytes
        return min(params.max_bytes, ceiling) if params.max_bytes > 0 else ceiling

    async def fetch_records(self, params: FetchParams) -> list[PartitionRead]:
        """Each partition's answer (see the module docstring)."""
        if not params.partitions:
            return []
        deadline = time.monotonic() + params.max_wait_s
        max_bytes = self._budget(params)
        keys = [(p.topic, p.partition) for p in params.partitions]
        first, woken = True, False
        loop = asyncio.get_running_loop()
        while True:
            # Register interest before reading, so an append between the read and the wait still wakes us.
            waiter: asyncio.Future[None] = loop.create_future()
            watched = self._waiters.watch(keys, waiter, exists=self._exists)
            try:
                targets = await self._resolve(params, first=first)
                first = False
                if params.max_wait_s > 0 and len(watched) == len(keys) and self._read_to_end(targets, params):
                    reads = None  # nothing to read yet: wait without a read
                elif woken:
                    reads = await self._read_fresh(targets, params, max_bytes)
                else:
                    reads = await self._run_io(self._read_all, targets, params, max_bytes)
                remaining = deadline - time.monotonic()
                if reads is not None and (sum(len(r.records) for r in reads) >= max(params.min_bytes, 1)
                                          or any(r.error is not None for r in reads) or remaining <= 0):
                    return reads
                if remaining > 0:
                    with contextlib.suppress(asyncio.TimeoutError):
                        await asyncio.wait_for(waiter, remaining)
                    woken = waiter.done() and not waiter.cancelled()
                if time.monotonic() >= deadline:
                    targets = await self._resolve(params, first=False)
                    return list(await self._run_io(self._read_all, targets, params, max_bytes))
            finally:
                self._waiters.unwatch(watched, waiter)

    async def _resolve(self, params: FetchParams, *, first: bool) -> list[_Target]:
        targets = []
        for spec in params.partitions:
            read = PartitionRead(spec.topic, spec.partition, next_offset=spec.offset)
            part: Partition | None = None
            try:
                if params.replica_id is not None:
                    part = await self._replica_partition(params.replica_id, spec.topic, spec.partition,
                                                         spec.offset, spec.current_leader_epoch, first)
                else:
                    part = self._leader(spec.topic, spec.partition, spec.current_leader_epoch)
            except LogstoreError as e:
                read.error = e
            targets.append(_Target(read, part, spec))
        return targets

    @staticmethod
    def _end(part: Partition, params: FetchParams) -> int:
        """Where this reader's view of ``part`` ends: the LEO (a follower) or the HWM. Never
        below the LSO, so a consumer read to it has nothing to read either way."""
        return part.log.log_end_offset if params.from_replica else part.high_watermark

    def _read_to_end(self, targets: list[_Target], params: FetchParams) -> bool:
        """Whether every partition exists, is online and is read to its end: a read would find
        nothing, so the fetch waits for an append at once. No I/O: cheap enough for the loop."""
        for t in targets:
            part = t.part
            if part is None or part.log.offline_reason is not None or t.spec.offset != self._end(part, params):
                return False
        return True

    async def _read_fresh(self, targets: list[_Target], params: FetchParams, max_bytes: int) -> list[PartitionRead]:
        """The read after a wake-up: on the event loop when small (see the module docstring);
        a larger read (a first batch above the cap) goes to the pool as any other read."""
        reads = self._read_all(targets, params, min(max_bytes, INLINE_READ_BYTES), on_loop=True)
        if any(len(r.records) or r.error is not None for r in reads):
            return reads
        committed = params.isolation is Isolation.READ_COMMITTED and not params.from_replica
        readable = any(
            t.part is not None and t.spec.offset < (
                t.part.log.log_end_offset if params.from_replica
                else t.read.last_stable_offset if committed else t.read.high_watermark)
            for t in targets)
        if not readable:  # woken, but nothing visible yet (an open transaction holds the LSO)
            return reads
        targets = [_Target(PartitionRead(t.spec.topic, t.spec.partition, next_offset=t.spec.offset), t.part, t.spec)
                   for t in targets]
        return list(await self._run_io(self._read_all, targets, params, max_bytes))

    @staticmethod
    def _read_all(targets: list[_Target], params: FetchParams, max_bytes: int, on_loop: bool = False,
                  ) -> list[PartitionRead]:
        """Each partition's bounds and records, within ``max_bytes`` for the whole answer.

        ``on_loop`` (the loop's small reads, :meth:`_read_fresh`): no batch above ``max_bytes``,
        and the aborted transactions are read without the partition's lock, which an append
        holds while it writes. That is safe: the list is only appended to or replaced whole,
        and an abort is in it before the LSO (read first) moves past the aborted records.
        """
        replica = params.from_replica
        committed = params.isolation is Isolation.READ_COMMITTED and not replica
        budget = max_bytes
        for t in targets:
            read, part, spec = t.read, t.part, t.spec
            if part is None:
                continue  # its error is the answer
            try:
                # Bounds first, so that an OFFSET_OUT_OF_RANGE answer still says where the log is.
                read.high_watermark = part.high_watermark
                read.last_stable_offset = part.last_stable_offset
                read.log_start_offset = part.log.log_start_offset
                if budget <= 0:
                    continue
                # Room for the schema sent along: the log's newest schema, never smaller than an
                # older segment's (evolution only adds columns).
                room = budget - len(encode_schema(part.log.schema))
                limit = min(spec.max_bytes if spec.max_bytes > 0 else room, room)
                result = part.log.read(
                    spec.offset, max_bytes=max(limit, 0),
                    upper_bound=None if replica else part.upper_bound(read_committed=committed),
                    min_one_batch=not on_loop and budget == max_bytes,
                )
                read.log_start_offset = result.log_start_offset
                if result.batches:
                    read.schema = encode_schema(result.schema)
                    read.records = result.data
                    read.next_offset = result.next_offset
                    budget -= len(result.data) + len(read.schema)
                    if committed:
                        start, end = result.batches[0].header.base_offset, result.next_offset
                        read.aborted = tuple(part.producers.aborted_between(start, end) if on_loop
                                             else part.aborted_transactions(start, end))
            except LogstoreError as e:
                read.error = e
                if isinstance(e, OffsetOutOfRangeError) and not replica:
                    # Inside offsets an operator accepted to lose: next_offset says where the log goes on.
                    gap = part.log.lost_range_at(spec.offset)
                    if gap is not None:
                        read.next_offset = gap[1]
            except Exception as e:  # noqa: BLE001 - a bug: one sentence out, the traceback logged
                read.error = unexpected(e, "Fetch")
        return [t.read for t in targets]
