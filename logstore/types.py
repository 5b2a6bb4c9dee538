"""Value types of the public client API.

Every type here is a frozen, slotted dataclass: immutable, hashable where its
fields are, cheap, and picklable (Spark ships them between processes).

Offsets are logical record addresses (int64); end offsets are exclusive.
Timestamps are milliseconds since the Unix epoch, UTC.

Thread-safety: instances are immutable and may be shared freely.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

import pyarrow as pa

__all__ = [
    "TopicPartition",
    "RecordMetadata",
    "BatchMetadata",
    "SendBatchResult",
    "ConsumerRecord",
    "NewTopic",
    "PartitionInfo",
    "TopicDescription",
    "ListedOffset",
    "Header",
    "OffsetAndMetadata",
    "GroupListing",
    "MemberDescription",
    "GroupDescription",
    "PartitionLag",
    "TxnRef",
]

# One record header: a string key and a bytes value (duplicates allowed, order kept).
Header = tuple[str, bytes]


@dataclass(frozen=True, slots=True, order=True)
class TopicPartition:
    """A partition of a topic: the unit of ordering, assignment and offsets."""

    topic: str
    partition: int

    def __str__(self) -> str:
        return f"{self.topic}-{self.partition}"


@dataclass(frozen=True, slots=True)
class RecordMetadata:
    """Where a record produced with :meth:`Producer.send` was appended.

    ``offset`` is the record's offset, or ``-1`` when the producer runs with
    ``acks=0`` (the broker's answer is not waited for). ``timestamp_ms`` is the
    record's create time, or the broker's append time when the topic uses
    ``message.timestamp.type=LogAppendTime``.
    """

    topic: str
    partition: int
    offset: int
    timestamp_ms: int

    @property
    def topic_partition(self) -> TopicPartition:
        return TopicPartition(self.topic, self.partition)


@dataclass(frozen=True, slots=True)
class BatchMetadata:
    """One batch appended by :meth:`Producer.send_batch`.

    Its records have offsets ``base_offset .. base_offset + record_count - 1``,
    in the order they had in the (partition's share of the) input.
    ``base_offset`` is ``-1`` with ``acks=0``.
    """

    topic: str
    partition: int
    base_offset: int
    record_count: int

    @property
    def topic_partition(self) -> TopicPartition:
        return TopicPartition(self.topic, self.partition)

    @property
    def end_offset(self) -> int:
        """The offset after the batch's last record (exclusive end)."""
        return self.base_offset + self.record_count


@dataclass(frozen=True, slots=True)
class SendBatchResult:
    """What :meth:`Producer.send_batch` appended: its batches, in send order per partition."""

    batches: tuple[BatchMetadata, ...]

    @property
    def record_count(self) -> int:
        return sum(b.record_count for b in self.batches)

    def by_partition(self) -> dict[TopicPartition, list[BatchMetadata]]:
        """The batches grouped by partition, each list in offset order."""
        out: dict[TopicPartition, list[BatchMetadata]] = {}
        for b in self.batches:
            out.setdefault(b.topic_partition, []).append(b)
        return out


@dataclass(frozen=True, slots=True)
class ConsumerRecord:
    """One record returned by :meth:`Consumer.poll`.

    ``key`` is bytes or None. ``value`` is bytes for an untyped topic, a dict
    of the value columns for a typed topic, and None for a tombstone.
    ``headers`` keeps the producer's order and duplicates.
    """

    topic: str
    partition: int
    offset: int
    timestamp_ms: int
    key: bytes | None
    value: bytes | dict[str, Any] | None
    headers: tuple[Header, ...] = ()

    @property
    def topic_partition(self) -> TopicPartition:
        return TopicPartition(self.topic, self.partition)


@dataclass(frozen=True, slots=True)
class NewTopic:
    """A topic to create with :meth:`Admin.create_topics`.

    ``value_schema`` makes a *typed* topic whose records' values are rows of
    these Arrow columns, stored natively; None makes an untyped topic (key and
    value are opaque bytes). ``configs`` are Kafka-style topic configs
    (``{"retention.ms": "3600000"}``); values are sent as strings.
    ``replication_factor`` None takes the cluster's ``default_replication_factor``
    (a single broker has one replica of everything).
    """

    name: str
    num_partitions: int = 1
    configs: Mapping[str, str] = field(default_factory=dict)
    value_schema: pa.Schema | None = None
    replication_factor: int | None = None


@dataclass(frozen=True, slots=True)
class PartitionInfo:
    """A partition's leadership and offsets, as :meth:`Admin.describe_topics` reports them.

    ``log_end_offset`` (LEO) is the offset the next record gets;
    ``high_watermark`` bounds what read_uncommitted consumers see and
    ``last_stable_offset`` what read_committed consumers see (both exclusive).
    """

    topic: str
    partition: int
    leader: int
    leader_epoch: int
    replicas: tuple[int, ...]
    isr: tuple[int, ...]
    log_start_offset: int
    log_end_offset: int
    high_watermark: int
    last_stable_offset: int
    size_bytes: int
    # Set when the broker could not describe this partition (e.g. LOG_OFFLINE).
    error: Exception | None = None

    @property
    def topic_partition(self) -> TopicPartition:
        return TopicPartition(self.topic, self.partition)


@dataclass(frozen=True, slots=True)
class TopicDescription:
    """A topic: its id, stored Arrow schema and partitions (sorted by number).

    ``schema`` is the stored schema (columns offset, timestamp, key, value,
    headers; see :mod:`logstore.record`); ``value_schema`` is the value
    columns of a typed topic, None for an untyped one.
    """

    name: str
    topic_id: str
    schema: pa.Schema
    value_schema: pa.Schema | None
    partitions: tuple[PartitionInfo, ...]

    @property
    def typed(self) -> bool:
        return self.value_schema is not None

    @property
    def num_partitions(self) -> int:
        return len(self.partitions)


@dataclass(frozen=True, slots=True)
class ListedOffset:
    """The answer of :meth:`Admin.list_offsets` for one partition.

    ``offset`` is None when a timestamp was asked and no record is that
    recent. ``timestamp_ms`` is the found record's timestamp, or -1 when the
    broker reports none (earliest/latest lookups).
    """

    offset: int | None
    timestamp_ms: int


# --------------------------------------------------------------------------- consumer groups


@dataclass(frozen=True, slots=True)
class OffsetAndMetadata:
    """A committed offset: the next offset the group reads from the partition (exclusive end
    of what it consumed), an optional metadata string, and when it was committed (-1: unknown)."""

    offset: int
    metadata: str = ""
    commit_timestamp_ms: int = -1


@dataclass(frozen=True, slots=True)
class GroupListing:
    """A consumer group as :meth:`Admin.list_groups` lists it.

    ``state`` is ``Empty`` (no members), ``Reconciling`` (partitions are moving)
    or ``Stable``.
    """

    group_id: str
    state: str
    members: int
    assignor: str


@dataclass(frozen=True, slots=True)
class MemberDescription:
    """A member of a consumer group.

    ``assignment`` is what it owns and consumes, ``pending_revocation`` what it
    owns but was asked to give up, ``target_assignment`` where the coordinator
    is taking it. ``left``: a static member that left for now (its partitions
    wait for it until its session times out).
    """

    member_id: str
    instance_id: str
    client_id: str
    client_host: str
    member_epoch: int
    subscribed_topics: tuple[str, ...]
    assignment: frozenset[TopicPartition]
    pending_revocation: frozenset[TopicPartition]
    target_assignment: frozenset[TopicPartition]
    assignor: str = ""
    left: bool = False


@dataclass(frozen=True, slots=True)
class GroupDescription:
    """A consumer group: state, epochs, the chosen assignor, members and committed offsets."""

    group_id: str
    state: str
    group_epoch: int
    assignment_epoch: int
    assignor: str
    members: tuple[MemberDescription, ...]
    offsets: Mapping[TopicPartition, OffsetAndMetadata]

    def owner(self, tp: TopicPartition) -> MemberDescription | None:
        """The member that owns ``tp`` (assigned or still revoking), or None."""
        for m in self.members:
            if tp in m.assignment or tp in m.pending_revocation:
                return m
        return None


@dataclass(frozen=True, slots=True)
class PartitionLag:
    """How far a group is behind on one partition.

    ``lag`` is ``log_end_offset - committed_offset`` (the high-water mark minus
    the committed offset); both None when the group committed nothing for it.
    ``member_id`` is the member that owns it now, None when nobody does.
    """

    topic: str
    partition: int
    committed_offset: int | None
    log_end_offset: int
    lag: int | None
    member_id: str | None = None
    client_host: str = ""

    @property
    def topic_partition(self) -> TopicPartition:
        return TopicPartition(self.topic, self.partition)


@dataclass(frozen=True, slots=True)
class TxnRef:
    """One transaction of a group, as the producer that wrote it knows it."""

    transactional_id: str
    producer_id: int
    producer_epoch: int
    txn_number: int
