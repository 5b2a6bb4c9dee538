"""What :class:`~logstore.client.rpc.BrokerClient` takes and answers beyond :mod:`logstore.types`.

Frozen, slotted dataclasses — plus :class:`RpcFuture`, the future of a call
started without blocking. They carry no protobuf: :mod:`logstore.client.messages`
reads them from the answers (item-level errors mapped and kept next to their
items). Value types shared beyond the RPC client (``TopicDescription``,
``GroupDescription``, ...) are in :mod:`logstore.types`.

Thread-safety: values are immutable; an :class:`RpcFuture` is a
:class:`concurrent.futures.Future`.
"""

from __future__ import annotations

import concurrent.futures
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any, TypeVar

from logstore.cleaning import CleanableSegment, CleaningState
from logstore.errors import LogstoreError
from logstore.types import (
    TopicDescription,
    TopicPartition,
)

__all__ = [
    "RpcFuture",
    "GroupHeartbeat",
    "BrokerInfo",
    "ClusterMetadata",
    "ProducedPartition",
    "FetchRequestPartition",
    "AbortedTransaction",
    "FetchedPartition",
    "ConfigAlteration",
    "CleanableSegment",
    "PartitionCleaning",
    "TopicCleaning",
    "ReplacedSegments",
]
_T = TypeVar("_T")


class RpcFuture(concurrent.futures.Future[_T]):
    """The future of a call started without blocking; :meth:`cancel_call` abandons the call
    (the future then fails with :class:`BrokerUnavailableError` "was cancelled" unless the
    answer arrived first)."""

    _call: Any = None

    def cancel_call(self) -> None:
        if self._call is not None and not self.done():
            self._call.cancel()


@dataclass(frozen=True, slots=True)
class GroupHeartbeat:
    """The answer to a consumer group heartbeat: the member's epoch and every partition it
    may consume now (see :meth:`BrokerClient.group_heartbeat_async`)."""

    member_id: str
    member_epoch: int
    heartbeat_interval_ms: int
    session_timeout_ms: int
    assignment: frozenset[TopicPartition]


@dataclass(frozen=True, slots=True)
class BrokerInfo:
    node_id: int
    host: str
    port: int
    rack: str = ""


@dataclass(frozen=True, slots=True)
class ClusterMetadata:
    """A Metadata answer: the brokers, described topics and per-topic errors."""

    cluster_id: str
    controller_id: int
    brokers: tuple[BrokerInfo, ...]
    topics: Mapping[str, TopicDescription]
    topic_errors: Mapping[str, LogstoreError]


@dataclass(frozen=True, slots=True)
class ProducedPartition:
    """The broker's answer for one partition of a Produce request.

    ``base_offsets`` has one entry per batch sent, in request order; record i
    of a batch has offset ``base_offset + i``. ``log_append_time_ms`` is -1
    unless the topic stamps records with the broker's append time.
    """

    topic: str
    partition: int
    error: LogstoreError | None
    base_offsets: tuple[int, ...]
    log_append_time_ms: int
    log_start_offset: int


@dataclass(frozen=True, slots=True)
class FetchRequestPartition:
    """One partition to fetch from ``offset``, at most ``max_bytes`` of batches."""

    topic_partition: TopicPartition
    offset: int
    max_bytes: int
    current_leader_epoch: int = -1


@dataclass(frozen=True, slots=True)
class AbortedTransaction:
    producer_id: int
    first_offset: int


@dataclass(frozen=True, slots=True)
class FetchedPartition:
    """The broker's answer for one partition of a Fetch request.

    ``schema`` is the Arrow schema message of the segment the batches come
    from, ``records`` the stored batch messages back to back (see
    :func:`logstore.record.iter_batches`; a view of the broker's answer, not a
    copy); the first batch may start before the fetch offset. ``next_offset`` is where the next fetch should start.
    """

    topic: str
    partition: int
    error: LogstoreError | None
    high_watermark: int
    last_stable_offset: int
    log_start_offset: int
    schema: bytes
    records: bytes | memoryview
    aborted_transactions: tuple[AbortedTransaction, ...]
    next_offset: int

    @property
    def topic_partition(self) -> TopicPartition:
        return TopicPartition(self.topic, self.partition)


@dataclass(frozen=True, slots=True)
class ConfigAlteration:
    """Config changes for one topic: keys to ``set`` and keys to ``delete`` (reset to default)."""

    set: Mapping[str, str]
    delete: tuple[str, ...] = ()


@dataclass(frozen=True, slots=True, kw_only=True)
class PartitionCleaning(CleaningState):
    """A partition's cleaning state (:class:`logstore.cleaning.CleaningState`: what may be
    compacted, how dirty it is) with the partition it belongs to; ``error`` when the broker
    could not tell (the state's fields are then zero)."""

    topic: str
    partition: int
    error: LogstoreError | None

    @property
    def topic_partition(self) -> TopicPartition:
        return TopicPartition(self.topic, self.partition)


@dataclass(frozen=True, slots=True)
class TopicCleaning:
    """A topic's compaction configs and the cleaning state of each partition."""

    name: str
    cleanup_policy: str
    min_cleanable_dirty_ratio: float
    delete_retention_ms: int
    min_compaction_lag_ms: int
    segment_bytes: int
    partitions: tuple[PartitionCleaning, ...]

    @property
    def compact(self) -> bool:
        return "compact" in self.cleanup_policy


@dataclass(frozen=True, slots=True)
class ReplacedSegments:
    """The answer of a successful :meth:`BrokerClient.replace_segments`."""

    new_base_offsets: tuple[int, ...]
    bytes_before: int
    bytes_after: int
    batches: int
    records: int
    cleaner_checkpoint: int
