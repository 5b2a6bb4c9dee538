"""The append path: a produce's records validated, appended, and made as durable as ``acks`` asks.

For each partition of a produce (at most :data:`~logstore.broker.data_plane.fanout.FANOUT`
at once), on the partition's leader:

1. with ``acks=all`` on a replicated partition, refuse at once (NOT_ENOUGH_REPLICAS) when
   the ISR is smaller than ``min.insync.replicas``: nothing is appended;
2. validate the records and append them (:mod:`logstore.broker.data_plane.appends`: one trip to the
   I/O pool in the common case); a request that overtook its predecessors waits for
   them (:class:`~logstore.broker.data_plane.appends.SequenceGate`), and the first transactional
   batch of a transaction whose coordinator is another broker waits for that
   coordinator's confirmation (:mod:`logstore.broker.transactions.verifier`);
3. wake the fetches waiting on the partition;
4. ``acks=all``: on a replicated partition wait until every in-sync replica has the
   records (the HWM passed them; no fsync per ack); on a partition with one replica,
   fsync before the answer, shared with the produces appended meanwhile
   (:class:`~logstore.broker.data_plane.group_fsync.GroupCommit`).

A partition's failure is its answer's ``error``; the others go on.

Thread-safety: :meth:`AppendPath.append_records` runs on the event loop; validation and
appends run on the I/O pool under each partition's lock.
"""

from __future__ import annotations

import weakref
from collections.abc import Awaitable, Callable, Sequence
from typing import TYPE_CHECKING, Any, Protocol

from logstore.broker.data_plane.appends import SequenceGate, append_valid, validate_and_append
from logstore.broker.data_plane.fanout import gather_bounded
from logstore.broker.data_plane.group_fsync import GroupCommit
from logstore.broker.data_plane.params import PartitionAppend
from logstore.broker.placement import Placement
from logstore.broker.unexpected import unexpected
from logstore.errors import InvalidRequestError, LogOfflineError, LogstoreError, StorageError
from logstore.record import BatchHeader
from logstore.storage.log import Log
from logstore.storage.log_manager import LogManager
from logstore.storage.validation import ValidatedRecords

if TYPE_CHECKING:
    from logstore.broker.transactions.coordinator import TransactionCoordinator
    from logstore.broker.transactions.verifier import TxnVerifier

__all__ = ["AppendPath", "RecordsForPartition"]


class RecordsForPartition(Protocol):
    """A produce's records for one partition, as a front end parsed them."""

    @property
    def topic(self) -> str: ...
    @property
    def partition(self) -> int: ...
    @property
    def records(self) -> bytes | memoryview: ...
    @property
    def current_leader_epoch(self) -> int: ...


class AppendPath:
    """Appends a produce's records; see the module docstring.

    ``placement`` says where partitions are led (:class:`~.placement.Placement`); ``wake`` wakes
    the partition's waiting fetches; ``on_appended(topic, partition, nbytes, valid)`` is told
    of every partition appended (metrics).
    """

    def __init__(self, *, manager: LogManager, run_io: Callable[..., Awaitable[Any]],
                 placement: Placement, coordinator: TransactionCoordinator, txn_verifier: TxnVerifier,
                 wake: Callable[[str, int], None], max_decompressed_bytes: int,
                 on_appended: Callable[[str, int, int, ValidatedRecords], None] | None = None) -> None:
        self._manager = manager
        self._run_io = run_io
        self._placement = placement
        self._coordinator = coordinator
        self._txn_verifier = txn_verifier
        self._wake = wake
        self._max_decompressed_bytes = max_decompressed_bytes
        self._on_appended = on_appended
        self._sequence_gate = SequenceGate()
        self._group_commits: weakref.WeakKeyDictionary[Log, GroupCommit] = weakref.WeakKeyDictionary()

    async def append_records(self, partitions: Sequence[RecordsForPartition], *, acks: int, timeout_ms: int,
                             transactional_id: str = "",
                             check_producer: Callable[[BatchHeader], None] | None = None,
                             ) -> list[PartitionAppend]:
        """Append each partition's records; one answer per partition, in order.
        ``check_producer`` (the authorizer's) sees every batch header with a producer id first."""
        if acks not in (-1, 0, 1):
            raise InvalidRequestError(f"acks must be -1 (all), 0 or 1, got {acks}")
        if len(partitions) == 1:  # the common case: no task to gather
            return [await self._append(partitions[0], acks, timeout_ms, transactional_id, check_producer)]
        return await gather_bounded(
            self._append(p, acks, timeout_ms, transactional_id, check_producer) for p in partitions)

    async def _append(self, data: RecordsForPartition, acks: int, timeout_ms: int, transactional_id: str,
                      check_producer: Callable[[BatchHeader], None] | None) -> PartitionAppend:
        topic, partition = data.topic, data.partition
        try:
            part = self._placement.leader(topic, partition, data.current_leader_epoch)
            replicas = self._placement.replicas if self._placement.replicated(topic) else None
            if replicas is not None and acks == -1:
                replicas.check_enough_replicas(topic, partition)
            attempt = await self._run_io(lambda: validate_and_append(
                part, data.records, max_decompressed_bytes=self._max_decompressed_bytes,
                manager=self._manager, coordinator=self._coordinator, check_producer=check_producer))
            valid, appended, unverified = attempt
            try:
                if appended is None:
                    if unverified is not None:  # opens a transaction coordinated elsewhere: ask there
                        await self._txn_verifier.verify(transactional_id, unverified.producer_id,
                                                        unverified.producer_epoch, topic, partition)
                    # it may have overtaken the batches sent before it: wait for them
                    await self._sequence_gate.wait_turn(part, valid)
                    appended = await self._run_io(lambda: append_valid(
                        part, valid, manager=self._manager, coordinator=self._coordinator,
                        guard=None if unverified is None else unverified.guard))
            finally:
                self._sequence_gate.appended(topic, partition)
                if unverified is not None:  # used, refused or abandoned: it lives no longer than this
                    part.release_verification_guard(unverified.producer_id, unverified.guard)
            base_offsets, append_time = appended
            if self._on_appended is not None:
                self._on_appended(topic, partition, len(data.records), valid)
            end_offset = part.log.log_end_offset
            self._wake(topic, partition)
            if replicas is not None and acks == -1:
                # Durability is the quorum: acknowledged once every in-sync replica has the
                # records (the HWM passed them); no fsync per ack (the flush policy applies).
                await replicas.wait_replicated(topic, partition, end_offset, max(timeout_ms, 1) / 1000)
            if acks == -1 and self._placement.replica_count(topic, partition) == 1:
                # One replica: fsync before the ack, shared with the produces appended meanwhile.
                try:
                    await self._group_commit(part.log).wait_durable(end_offset)
                except LogOfflineError as e:  # appended, then offline: not a definite LOG_OFFLINE
                    raise StorageError(f"{e.message} (after the records were appended)") from e
            return PartitionAppend(topic, partition, base_offsets=tuple(base_offsets), log_append_time_ms=append_time,
                                   log_start_offset=part.log.log_start_offset)
        except LogstoreError as e:
            return PartitionAppend(topic, partition, error=e)
        except Exception as e:  # noqa: BLE001 - a bug: one sentence out, the traceback logged
            return PartitionAppend(topic, partition, error=unexpected(e, "Produce"))

    def _group_commit(self, log_: Log) -> GroupCommit:
        """The flusher of ``log_`` (made on first use; forgotten with the log object)."""
        flusher = self._group_commits.get(log_)
        if flusher is None:
            flusher = self._group_commits[log_] = GroupCommit(log_, self._run_io)
        return flusher
