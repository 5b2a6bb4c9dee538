"""The data plane's requests and answers: plain values, no protobuf (each front end converts).

A fetch is one :class:`FetchParams` for a consumer and for a follower replica alike
(``replica_id`` set: read up to the log end offset, and the leader records the
follower's progress); its answer is one :class:`PartitionRead` per partition. A produce
answers one :class:`PartitionAppend` per partition. The isolation level is an enum,
validated once where a front end converts its request.

Thread-safety: the frozen values are immutable; a :class:`PartitionRead` is filled by
the one fetch that made it.
"""

from __future__ import annotations

import enum
from dataclasses import dataclass, field

from logstore.errors import LogstoreError
from logstore.storage.producer_state import AbortedTxn

__all__ = ["FetchParams", "FetchPartition", "Isolation", "PartitionAppend", "PartitionRead"]


class Isolation(enum.Enum):
    """What a consumer may read: up to the HWM, or up to the LSO without aborted records."""

    READ_UNCOMMITTED = "read_uncommitted"
    READ_COMMITTED = "read_committed"


@dataclass(frozen=True, slots=True)
class FetchPartition:
    """Read ``topic``-``partition`` from ``offset``; ``max_bytes`` 0: no cap of its own."""

    topic: str
    partition: int
    offset: int
    max_bytes: int = 0
    current_leader_epoch: int = -1  # -1: the request did not say (KIP-320)


@dataclass(frozen=True, slots=True)
class FetchParams:
    """A fetch: wait up to ``max_wait_s`` for ``min_bytes``; the answer within ``max_bytes``
    (0: the broker's ceiling for consumers, 16 MiB for followers). ``replica_id`` marks a
    follower's fetch."""

    partitions: tuple[FetchPartition, ...]
    max_wait_s: float = 0.0
    min_bytes: int = 0
    max_bytes: int = 0
    isolation: Isolation = Isolation.READ_UNCOMMITTED
    replica_id: int | None = None

    @property
    def from_replica(self) -> bool:
        return self.replica_id is not None


@dataclass(slots=True)
class PartitionRead:
    """One partition's answer: its bounds, and the records read (views of the log's bytes)
    with the schema message they need; ``error`` instead when it could not be read."""

    topic: str
    partition: int
    next_offset: int
    error: LogstoreError | None = None
    high_watermark: int = 0
    last_stable_offset: int = 0
    log_start_offset: int = 0
    schema: bytes = b""
    records: memoryview = field(default_factory=lambda: memoryview(b""))
    aborted: tuple[AbortedTxn, ...] = ()


@dataclass(frozen=True, slots=True)
class PartitionAppend:
    """One partition's answer to a produce: the base offset of each batch, in request order."""

    topic: str
    partition: int
    error: LogstoreError | None = None
    base_offsets: tuple[int, ...] = ()
    log_append_time_ms: int = -1
    log_start_offset: int = 0
