"""The group log: how the group coordinator's state is persisted.

Where the records go is a :class:`GroupLog` (the broker's is the internal
compacted topic ``__consumer_offsets``; :class:`MemoryGroupLog` in tests).

When the coordinator (:class:`~logstore.broker.groups.coordinator.GroupCoordinator`,
its methods named below) writes them:

* a commit's offset records are appended durably (fsync; on a replicated log,
  copied by the in-sync replicas) *before* the commit is acknowledged and
  becomes visible. Appends are serialized; waiting for the replicas is not
  (``append_commit``, then ``apply_commit``), and concurrent commits become
  visible in the order they were appended;
* a group's metadata record is written behind, by ``flush_metadata``, never on
  a heartbeat's path. After a restart members resume where the last write left
  them (their sessions restart); a member whose epoch is ahead of the restored
  one is fenced and rejoins;
* deleting a group writes tombstones for its metadata and every offset.

A transaction's offsets (Kafka's ``send_offsets_to_transaction``:
AddOffsetsToTxn, then TxnOffsetCommit) are appended as a transactional batch of
the producer (``commit_txn_offsets``) and kept *pending* per producer id:
invisible to OffsetFetch (which answers UNSTABLE_OFFSET_COMMIT for them when
asked for stable offsets). The transaction coordinator ends the transaction
with a marker on the group's log partition, as on every partition of the
transaction; when it lands there the broker calls ``complete_transaction``,
which applies them (COMMIT; a partition committed again later in the log keeps
the later offset) or drops them (ABORT). Replay
(:func:`logstore.broker.groups.state.replay_groups`) does the same from the
log's markers, so offsets of an undecided transaction stay pending after a
restart and decided ones are applied or dropped.

Records
-------
Keys are compact JSON arrays, values JSON objects carrying their format
version ``"v"`` (:data:`FORMAT`); a ``None`` value is a tombstone. All records
of a group go to one partition, so their order is kept; on replay the last
record per key wins.

* ``["offset", group, topic, partition]`` (:func:`offset_key`) →
  ``{"v", "offset", "metadata", "commit_ms", "member_id", "member_epoch"}``
  (:func:`offset_value`): one committed offset;
* ``["group", group]`` (:func:`group_key`) → the group's metadata: group and
  assignment epochs, assignor, the partition counts the target was computed
  for, the target, and the members with their subscriptions, epochs and
  owned partitions (partition sets are lists of ``[topic, partition]``,
  :func:`tps_doc`);
* deleting a group writes tombstones for its metadata and every offset;
* a transaction's consumer offsets (Kafka's TxnOffsetCommit) are ``offset``
  records too, written as a *transactional* batch of the producer
  (:meth:`GroupLog.append_transactional`): they are *pending* until the
  transaction's COMMIT or ABORT marker for that producer lands on the same
  partition (written by the transaction coordinator as on any partition of the
  transaction). Read back, such records are :class:`TxnRecord` and the markers
  :class:`TxnMarker`; other records are ``(key, value)`` pairs
  (:data:`GroupLogEntry`). A COMMIT applies a pending offset unless a commit
  appended *after* it in the log changed that partition's offset meanwhile
  (log order decides, as in Kafka); an ABORT drops them.

Thread-safety: the functions are pure; a :class:`GroupLog` is called by one
writer at a time (the coordinator serializes its writes).
"""

from __future__ import annotations

import json
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from typing import Any, TypeAlias

from logstore.broker.groups.model import CommittedOffset, TPs
from logstore.types import TopicPartition

__all__ = [
    "FORMAT",
    "GroupLogEntry",
    "GroupRecord",
    "ReplicaPosition",
    "TxnMarker",
    "TxnRecord",
    "GroupLog",
    "MemoryGroupLog",
    "offset_key",
    "group_key",
    "offset_value",
    "parse_offset_value",
    "tps_doc",
    "tps_from",
]

FORMAT = 1


# (topic, partition, end offset): a replicated log's records below the end offset are durable
# once its in-sync replicas have them.
ReplicaPosition = tuple[str, int, int]


@dataclass(frozen=True, slots=True)
class GroupRecord:
    """A record of the group log; ``value`` None is a tombstone. ``producer_id`` (only in
    :class:`MemoryGroupLog`) is the producer of a transactional record, -1 otherwise."""

    group_id: str
    key: bytes
    value: bytes | None
    producer_id: int = -1


@dataclass(frozen=True, slots=True)
class TxnRecord:
    """A record of a producer's transactional batch, read back (a transaction's consumer
    offset): pending until that producer's marker on the same ``partition`` of the log."""

    key: bytes
    value: bytes | None
    producer_id: int
    partition: int = 0


@dataclass(frozen=True, slots=True)
class TxnMarker:
    """A COMMIT (``commit``) or ABORT marker of ``producer_id`` on ``partition`` of the log, read back."""

    producer_id: int
    commit: bool
    partition: int = 0


# What reading the group log gives back, in log order.
GroupLogEntry: TypeAlias = tuple[bytes, bytes | None] | TxnRecord | TxnMarker


class GroupLog:
    """Where the coordinator keeps its state. ``append`` must have written the records (and,
    with ``fsync``, made them durable) when it returns; records of one group keep their order."""

    def append(self, records: Sequence[GroupRecord], *, fsync: bool) -> None:  # pragma: no cover
        raise NotImplementedError

    def read_all(self) -> Iterable[GroupLogEntry]:  # pragma: no cover
        raise NotImplementedError

    def hold_transaction(self, group_id: str, producer_id: int) -> object:
        """A token to verify ``producer_id``'s transaction under: while it is held, a marker for the
        producer on the group's partition makes :meth:`append_transactional` with it refuse to
        open a transaction there (InvalidTxnStateError). None by default (no check)."""
        return None

    def release_transaction(self, hold: object) -> None:
        """Give back what :meth:`hold_transaction` returned."""

    def append_transactional(self, records: Sequence[GroupRecord], *, producer_id: int, producer_epoch: int,
                             hold: object = None) -> tuple[ReplicaPosition, ...]:  # pragma: no cover
        """Append ``records`` durably as a transactional batch of ``producer_id`` (open until its
        marker), checked with ``hold`` (:meth:`hold_transaction`); return the positions, as
        :meth:`append_pending`."""
        raise NotImplementedError

    def append_pending(self, records: Sequence[GroupRecord], *, fsync: bool) -> tuple[ReplicaPosition, ...]:
        """Append now; return the positions the records are durable at once the replicas reach
        them (a replicated log), for :meth:`wait_durable` or the broker's own wait. The
        default appends durably at once and returns none."""
        self.append(records, fsync=fsync)
        return ()

    def wait_durable(self, positions: Sequence[ReplicaPosition]) -> None:
        """Block until the replicas reach ``positions`` (nothing to wait for by default)."""


class MemoryGroupLog(GroupLog):
    """An in-memory :class:`GroupLog` of one partition (tests); ``fail`` makes the next appends
    raise; :meth:`append_marker` is what a transaction coordinator's marker would add."""

    def __init__(self) -> None:
        self.records: list[GroupRecord | TxnMarker] = []
        self.fail: Exception | None = None

    def append(self, records: Sequence[GroupRecord], *, fsync: bool) -> None:
        if self.fail is not None:
            raise self.fail
        self.records.extend(records)

    def append_transactional(self, records: Sequence[GroupRecord], *, producer_id: int, producer_epoch: int,
                             hold: object = None) -> tuple[ReplicaPosition, ...]:
        if self.fail is not None:
            raise self.fail
        self.records.extend(GroupRecord(r.group_id, r.key, r.value, producer_id) for r in records)
        return ()

    def append_marker(self, producer_id: int, *, commit: bool) -> None:
        self.records.append(TxnMarker(producer_id, commit))

    def read_all(self) -> Iterable[GroupLogEntry]:
        return [r if isinstance(r, TxnMarker) else (r.key, r.value) if r.producer_id < 0
                else TxnRecord(r.key, r.value, r.producer_id) for r in self.records]


# --------------------------------------------------------------------------- keys and values


def offset_key(group_id: str, tp: TopicPartition) -> bytes:
    return json.dumps(["offset", group_id, tp.topic, tp.partition], separators=(",", ":")).encode()


def group_key(group_id: str) -> bytes:
    return json.dumps(["group", group_id], separators=(",", ":")).encode()


def offset_value(c: CommittedOffset) -> bytes:
    return json.dumps({
        "v": FORMAT, "offset": c.offset, "metadata": c.metadata, "commit_ms": c.commit_timestamp_ms,
        "member_id": c.member_id, "member_epoch": c.member_epoch}).encode()


def parse_offset_value(value: bytes) -> CommittedOffset:
    """The committed offset in ``value``; raises ValueError, KeyError or TypeError when malformed."""
    v = json.loads(value)
    return CommittedOffset(
        int(v["offset"]), str(v.get("metadata", "")), int(v.get("commit_ms", -1)),
        str(v.get("member_id", "")), int(v.get("member_epoch", -1)))


def tps_doc(tps: Iterable[TopicPartition]) -> list[list[object]]:
    return [[tp.topic, tp.partition] for tp in sorted(tps)]


def tps_from(doc: Any) -> TPs:
    return frozenset(TopicPartition(str(t), int(p)) for t, p in doc)
