"""A state log kept in an internal topic: what the coordinators persist their state in.

The transaction coordinator's state (``__transaction_state``) and the
group coordinator's offsets and metadata (``__consumer_offsets``) are
records of an internal topic, appended by the broker itself and replayed on
start-up. :class:`InternalTopicLog` is that log:

* the topic is created on first use (an append, or :meth:`InternalTopicLog.partitions`)
  with the partition count and configs given; a topic that exists already
  (created meanwhile, or by an earlier broker with another count) is used as it is;
* a record has an ``owner`` (a group id): all records of one owner go to
  partition ``crc32(owner) % partitions``, in the order appended, so an
  owner's history is one ordered sequence;
* :meth:`InternalTopicLog.append` writes one batch per partition touched and
  returns once the records are in the log (and, with ``fsync``, on disk);
* :meth:`InternalTopicLog.read_all` reads every record back as ``(key, value)``
  (``value`` None: a tombstone), partition by partition, each in offset
  order; it does not create the topic (nothing written, nothing to read);
* :meth:`InternalTopicLog.append_transactional` writes records as a transactional
  batch of a producer (the consumer offsets of a transaction), open on the
  partition until the transaction's COMMIT/ABORT marker; the ``*_entries`` readers
  give records back with their batch's producer and the markers
  (:class:`InternalEntry`), for a replay that must tell pending from decided.

Records use the untyped schema (binary key and value) and the wall clock as
their timestamp.

On a cluster (:meth:`InternalTopicLog.use_cluster`) the topic is a replicated
cluster topic, created in etcd by the broker (:mod:`logstore.broker.cluster_topics`),
not here: its partition count is the cluster's, an append goes to the local
*leader* replica of each partition touched (NOT_COORDINATOR where this broker
does not lead it), and an append with ``fsync`` returns only once the in-sync
replicas have it (acks=all, :class:`InternalReplication`);
:meth:`InternalTopicLog.append_pending` returns before that, with the positions
the replicas must reach, so a coordinator can wait for them outside its locks
(the group coordinator awaits them on the event loop). The coordinators read
one partition at a time there (:meth:`InternalTopicLog.read_partition`), when
they become its leader.

Thread-safety: appends go through the partition logs, which have their own
locks; records of one owner appended from several threads interleave in the
order the appends take the partition's lock.
"""

from __future__ import annotations

import contextlib
import time
import zlib
from collections import defaultdict
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass
from typing import Protocol

import pyarrow.compute as pc

from logstore.errors import (
    CoordinatorNotAvailableError,
    LogstoreError,
    NotCoordinatorError,
    UnknownTopicOrPartitionError,
)
from logstore.record import NO_PRODUCER_ID, build_batch
from logstore.storage.log_manager import LogManager, Partition

__all__ = ["InternalEntry", "InternalRecord", "InternalTopicLog", "InternalReplication", "TransactionHold"]

_READ_BYTES = 8 << 20


@dataclass(frozen=True, slots=True)
class InternalRecord:
    """One record of an internal topic; ``value`` None is a tombstone."""

    owner: str
    key: bytes
    value: bytes | None


@dataclass(frozen=True, slots=True)
class InternalEntry:
    """A record read back with its batch's transaction facts: ``producer_id`` is the producer of
    a transactional batch (-1 otherwise); ``marker`` is None for a record, True for a COMMIT and
    False for an ABORT marker of ``producer_id`` (then ``key`` and ``value`` are None)."""

    key: bytes | None
    value: bytes | None
    producer_id: int = NO_PRODUCER_ID
    marker: bool | None = None


@dataclass(frozen=True, slots=True)
class TransactionHold:
    """A verification guard of ``producer_id`` taken on ``partition`` (:meth:`InternalTopicLog.hold_transaction`)."""

    partition: Partition
    producer_id: int
    guard: object


_NOT_HELD = object()  # a guard no partition holds: only a continuing transaction passes


class InternalReplication(Protocol):
    """What an internal topic needs of a cluster (the broker's coordinators, over its :class:`~logstore.broker.membership.ClusterMembership`)."""

    def internal_partition_count(self, topic: str) -> int | None:
        """The cluster topic's partition count (None: not created yet)."""

    def internal_leader(self, topic: str, partition: int) -> Partition:
        """The local leader replica; NOT_COORDINATOR when this broker does not lead it."""

    def internal_wait_replicated(self, topic: str, partition: int, end_offset: int) -> None:
        """Block (on an I/O thread) until the ISR has everything below ``end_offset``."""


class InternalTopicLog:
    """Keyed records in the internal topic ``topic``; see the module docstring."""

    def __init__(self, manager: LogManager, topic: str, *, partitions: int,
                 configs: Mapping[str, str]) -> None:
        self._manager = manager
        self.topic = topic
        self._wanted_partitions = partitions
        self._configs = dict(configs)
        self._cluster: InternalReplication | None = None

    def use_cluster(self, cluster: InternalReplication) -> None:
        """Make this a replicated cluster topic (see the module docstring); call before any append."""
        self._cluster = cluster

    @property
    def clustered(self) -> bool:
        return self._cluster is not None

    def partition_count(self) -> int:
        """The topic's partition count (a single broker creates the topic if it does not exist)."""
        if self._cluster is None:
            return len(self.partitions())
        n = self._cluster.internal_partition_count(self.topic)
        if not n:
            raise CoordinatorNotAvailableError(f"the internal topic {self.topic} does not exist yet")
        return n

    def _existing(self) -> list[Partition] | None:
        try:
            return self._manager.partitions_of(self.topic)
        except UnknownTopicOrPartitionError:
            return None

    def partitions(self) -> list[Partition]:
        """The topic's partitions, creating the topic if it does not exist."""
        parts = self._existing()
        if parts is None:
            with contextlib.suppress(LogstoreError):  # created meanwhile
                self._manager.create_topic(self.topic, partitions=self._wanted_partitions,
                                           configs=self._configs, value_schema=None)
            parts = self._manager.partitions_of(self.topic)
        return parts

    def append(self, records: Sequence[InternalRecord], *, fsync: bool) -> None:
        """Append ``records`` (one batch per partition, in partition order); see the module docstring."""
        self.wait_replicated(self.append_pending(records, fsync=fsync))

    def append_pending(self, records: Sequence[InternalRecord], *, fsync: bool) -> tuple[tuple[str, int, int], ...]:
        """:meth:`append`, returning before a cluster's replicas have the records: the
        ``(topic, partition, end offset)`` positions they must reach (with ``fsync``; none on a
        single broker). So a caller can append under its lock and wait for the replicas outside
        it (:meth:`wait_replicated`, or the broker's event loop)."""
        if self._cluster is not None:
            return self._append_replicated(self._cluster, records, fsync=fsync)
        parts = self.partitions()
        by_partition = _by_partition(records, len(parts))
        now_ms = int(time.time() * 1000)
        for index, group in sorted(by_partition.items()):
            part = parts[index]
            batch = build_batch(part.log.schema, values=[r.value for r in group], keys=[r.key for r in group],
                                timestamps_ms=[now_ms] * len(group))
            part.log.append(batch, leader_epoch=part.leader_epoch, fsync=fsync)
        return ()

    def _leader_of(self, owner: str) -> Partition:
        """The local leader replica of ``owner``'s partition (NOT_COORDINATOR on a cluster when
        this broker does not lead it)."""
        if self._cluster is None:
            parts = self.partitions()
            return parts[zlib.crc32(owner.encode()) % len(parts)]
        return self._cluster.internal_leader(self.topic, zlib.crc32(owner.encode()) % self.partition_count())

    def hold_transaction(self, owner: str, producer_id: int) -> TransactionHold:
        """The verification guard of ``producer_id`` on ``owner``'s partition, taken *before* the
        caller asks the transaction coordinator whether the transaction includes it; a marker
        written meanwhile drops it, so :meth:`append_transactional` with it is refused then.
        Give it back with :meth:`release_transaction`."""
        part = self._leader_of(owner)
        return TransactionHold(part, producer_id, part.verification_guard(producer_id))

    @staticmethod
    def release_transaction(hold: TransactionHold) -> None:
        hold.partition.release_verification_guard(hold.producer_id, hold.guard)

    def append_transactional(self, records: Sequence[InternalRecord], *, producer_id: int,
                             producer_epoch: int, hold: TransactionHold | None = None
                             ) -> tuple[tuple[str, int, int], ...]:
        """Append ``records`` as one fsynced transactional batch of ``producer_id`` per partition
        touched (:meth:`~logstore.storage.partition.Partition.append_coordinator_transactional`:
        the transaction stays open there until its COMMIT/ABORT marker); return what
        :meth:`append_pending` returns (the positions a cluster's replicas must reach). With
        ``hold`` (:meth:`hold_transaction`) a batch that would open the transaction needs its
        guard, still held (another replica of the partition than the held one: refused)."""
        cluster = self._cluster
        parts = self.partitions() if cluster is None else []
        n = len(parts) if cluster is None else self.partition_count()
        by_partition = _by_partition(records, n)
        now_ms = int(time.time() * 1000)
        ends: list[tuple[str, int, int]] = []
        for index, group in sorted(by_partition.items()):
            part = parts[index] if cluster is None else cluster.internal_leader(self.topic, index)
            if not part.is_leader:
                raise NotCoordinatorError(f"{self.topic}-{index} is no longer led here; find the coordinator again")
            batch = build_batch(part.log.schema, values=[r.value for r in group], keys=[r.key for r in group],
                                timestamps_ms=[now_ms] * len(group))
            guard = None if hold is None else hold.guard if hold.partition is part else _NOT_HELD
            _, last = part.append_coordinator_transactional(batch, producer_id=producer_id,
                                                            producer_epoch=producer_epoch, fsync=True,
                                                            txn_guard=guard)
            ends.append((self.topic, index, last + 1))
        return tuple(ends) if self._cluster is not None else ()

    def wait_replicated(self, positions: Sequence[tuple[str, int, int]]) -> None:
        """Block (on an I/O thread) until the in-sync replicas reach ``positions``."""
        for topic, index, end_offset in positions:
            assert self._cluster is not None
            self._cluster.internal_wait_replicated(topic, index, end_offset)

    def _append_replicated(self, cluster: InternalReplication, records: Sequence[InternalRecord], *,
                           fsync: bool) -> tuple[tuple[str, int, int], ...]:
        n = self.partition_count()
        by_partition = _by_partition(records, n)
        now_ms = int(time.time() * 1000)
        ends: list[tuple[str, int, int]] = []
        for index, group in sorted(by_partition.items()):
            part = cluster.internal_leader(self.topic, index)
            if not part.is_leader:
                raise NotCoordinatorError(f"{self.topic}-{index} is no longer led here; find the coordinator again")
            batch = build_batch(part.log.schema, values=[r.value for r in group], keys=[r.key for r in group],
                                timestamps_ms=[now_ms] * len(group))
            result = part.log.append(batch, leader_epoch=part.leader_epoch, fsync=fsync)
            listener = part.on_append  # the replica manager: moves the HWM, wakes the followers' fetches
            if listener is not None:
                listener(part)
            ends.append((self.topic, index, result.last_offset + 1))
        return tuple(ends) if fsync else ()

    def read_partition(self, index: int) -> Iterator[tuple[bytes, bytes | None]]:
        """Every record of one local partition as ``(key, value)``, in offset order (nothing when
        there is no such partition here)."""
        try:
            part = self._manager.partition(self.topic, index)
        except LogstoreError:
            return
        yield from _read(part)

    def read_partition_entries(self, index: int) -> Iterator[InternalEntry]:
        """Every record of one local partition with what its batch says of transactions, in
        offset order, markers included (nothing when there is no such partition here)."""
        try:
            part = self._manager.partition(self.topic, index)
        except LogstoreError:
            return
        yield from _read_entries(part)

    def read_all_entries(self) -> Iterator[tuple[int, InternalEntry]]:
        """:meth:`read_partition_entries` of every partition, with the partition's index."""
        for part in self._existing() or ():
            for entry in _read_entries(part):
                yield part.partition, entry

    def partition_of(self, owner: str) -> int:
        """The partition ``owner``'s records go to (creating the topic if it does not exist)."""
        return zlib.crc32(owner.encode()) % self.partition_count()

    def read_all(self) -> Iterator[tuple[bytes, bytes | None]]:
        """Every record as ``(key, value)``, partition by partition, each in offset order."""
        for part in self._existing() or ():
            yield from _read(part)


def _by_partition(records: Sequence[InternalRecord], partitions: int) -> dict[int, list[InternalRecord]]:
    """``records`` by the partition of their owner (``crc32(owner) % partitions``), in order."""
    out: dict[int, list[InternalRecord]] = defaultdict(list)
    for r in records:
        out[zlib.crc32(r.owner.encode()) % partitions].append(r)
    return out


def _read(part: Partition) -> Iterator[tuple[bytes, bytes | None]]:
    offset = part.log.log_start_offset
    while offset < part.log.log_end_offset:
        result = part.log.read(offset, max_bytes=_READ_BYTES)
        if not result.batches:
            break
        for rb in result.decode():
            if rb.num_rows:
                yield from zip(rb.column("key").to_pylist(), rb.column("value").to_pylist(), strict=True)
        offset = result.next_offset


def _read_entries(part: Partition) -> Iterator[InternalEntry]:
    offset = part.log.log_start_offset
    while offset < part.log.log_end_offset:
        result = part.log.read(offset, max_bytes=_READ_BYTES)
        if not result.batches:
            break
        for stored in result.batches:
            h = stored.header
            if h.is_control:
                yield InternalEntry(None, None, h.producer_id, marker=not h.is_abort_marker)
                continue
            rb = stored.decode(result.schema)
            if h.base_offset < offset:  # the log starts inside this batch
                rb = rb.filter(pc.greater_equal(rb.column("offset"), offset))
            pid = h.producer_id if h.is_transactional else NO_PRODUCER_ID
            for key, value in zip(rb.column("key").to_pylist(), rb.column("value").to_pylist(), strict=True):
                yield InternalEntry(key, value, pid)
        offset = result.next_offset
