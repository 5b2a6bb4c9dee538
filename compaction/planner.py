"""What to compact: partitions worth cleaning, and which records survive.

* :func:`plan_cleaning` / :func:`cleanable_partitions` ask the broker for
  each partition's cleaning state (``DescribeCleaning``; on a cluster, each
  partition's leader, whose segments the swap replaces) and pick those whose
  dirty ratio reaches the topic's ``min.cleanable.dirty.ratio`` (every
  partition with cleanable segments when ``force``). A :class:`PartitionPlan`
  names the closed segments to replace — every segment below the cleanable
  end offset, clean and dirty alike, since a key updated in the dirty part
  removes its older copy in the clean part — and the offsets to read,
  ``[log start offset, cleanable end offset)``.
* :class:`Survivors` is what the latest-per-key computation decides for one
  partition: the offsets of keyed records that stay, and each producer's
  last batch. The Spark job computes it at scale (:mod:`compaction.job`);
  :func:`survivors_from_rows` turns the aggregated key-scan rows into it, and
  :func:`reference_survivors` is the same decision in plain Python — the
  specification, used by tests and for tiny inputs.

The rules (what a compaction keeps, below the cleanable end offset):

* the latest record of every key, among the records a read_committed reader
  sees (records of aborted transactions never count, and are removed);
* but not that record when it is a tombstone (null value) whose timestamp is
  at or before ``now - delete.retention.ms``;
* every record without a key (Kafka refuses them on compacted topics; here
  they are never removed, as nothing can supersede them);
* every control batch (transaction markers), whole;
* at least the last record of the last batch of every idempotent or
  transactional producer, so that the producer state the broker rebuilds
  from batch headers keeps the producer's last sequence number.

Everything at or above the cleanable end offset — the active segment,
records at or above the last stable offset, segments younger than
``min.compaction.lag.ms`` — is never touched.

Thread-safety: pure functions, except the two that call the broker.
"""

from __future__ import annotations

import dataclasses
import time
from collections.abc import Iterable, Sequence
from dataclasses import dataclass

import numpy as np
import pyarrow as pa

from compaction.scan import KIND_PRODUCER, KIND_RECORD, RangeBatch, key_rows
from logstore.client.admin import Admin
from logstore.client.results import CleanableSegment, PartitionCleaning, TopicCleaning
from logstore.client.rpc import BrokerClient
from logstore.client.security import ClientSecurity
from logstore.errors import LogstoreError, UnknownTopicOrPartitionError
from logstore.types import TopicPartition

__all__ = [
    "PartitionPlan",
    "Skipped",
    "Survivors",
    "plan_cleaning",
    "cleanable_partitions",
    "survivors_from_rows",
    "reference_survivors",
]


@dataclass(frozen=True, slots=True)
class PartitionPlan:
    """One partition to compact.

    Records of ``[start_offset, end_offset)`` are read (the log start offset to
    the cleanable end offset); ``segments`` — every closed segment below
    ``end_offset`` — are replaced. ``tombstone_horizon_ms``: tombstones at or
    before it are removed (``now - delete.retention.ms``).
    """

    topic: str
    partition: int
    start_offset: int
    end_offset: int
    segments: tuple[CleanableSegment, ...]
    clean_bytes: int
    dirty_bytes: int
    dirty_ratio: float
    min_cleanable_dirty_ratio: float
    tombstone_horizon_ms: int
    segment_bytes: int

    @property
    def topic_partition(self) -> TopicPartition:
        return TopicPartition(self.topic, self.partition)

    @property
    def size_bytes(self) -> int:
        """Bytes of the segments to replace."""
        return sum(s.size_bytes for s in self.segments)


@dataclass(frozen=True, slots=True)
class Skipped:
    """A partition that is not compacted this time, and why."""

    topic: str
    partition: int
    reason: str


def plan_cleaning(
    admin_or_client: Admin | BrokerClient,
    topics: Sequence[str] | None = None,
    *,
    partitions: Iterable[int] | None = None,
    force: bool = False,
    now_ms: int | None = None,
    security: ClientSecurity | None = None,
) -> tuple[list[PartitionPlan], list[Skipped]]:
    """Partitions of ``topics`` (None = every compacted topic) to compact now, most
    dirty first, and the ones skipped with their reason.

    A partition is planned when its topic's cleanup.policy includes compact,
    it has closed segments below its cleanable end offset, no compaction of
    it is running, and its dirty ratio is at least ``min.cleanable.dirty.ratio``
    (``force`` drops that last condition). ``partitions`` restricts the
    partitions considered; ``now_ms`` (default: now) is the clock for
    ``min.compaction.lag.ms`` and ``delete.retention.ms``. Raises
    :class:`UnknownTopicOrPartitionError` for an unknown topic or partition.
    On a cluster, each partition's state comes from its leader (see
    :func:`_describe_at_leaders`; ``security``: how to connect to them).
    """
    now = int(time.time() * 1000) if now_ms is None else now_ms
    names = list(topics) if topics else None
    found: dict[str, TopicCleaning] | dict[str, TopicCleaning | LogstoreError]
    if isinstance(admin_or_client, Admin):
        found = admin_or_client.describe_cleaning(names, now_ms=now)
    else:
        found = _describe_at_leaders(admin_or_client, names, now_ms=now, security=security)
    wanted = None if partitions is None else set(partitions)
    plans: list[PartitionPlan] = []
    skipped: list[Skipped] = []
    for name in sorted(found):
        topic = found[name]
        if isinstance(topic, LogstoreError):
            raise topic
        assert isinstance(topic, TopicCleaning)
        if wanted is not None:
            missing = wanted - {p.partition for p in topic.partitions}
            if missing:
                raise UnknownTopicOrPartitionError(
                    f"topic {name!r} has no partition {min(missing)} (it has {len(topic.partitions)})"
                )
        for p in topic.partitions:
            if wanted is not None and p.partition not in wanted:
                continue
            reason = None
            if not topic.compact:
                reason = f"cleanup.policy is {topic.cleanup_policy}"
            elif p.error is not None:
                reason = f"not available: {p.error}"
            elif p.in_progress:
                reason = "a compaction of it is in progress"
            elif not p.segments:
                reason = (f"nothing cleanable (cleanable end offset {p.cleanable_end_offset}, active "
                          f"segment at {p.active_segment_base}, LSO {p.last_stable_offset})")
            elif not force and (p.dirty_bytes == 0 or p.dirty_ratio < topic.min_cleanable_dirty_ratio):
                reason = (f"dirty ratio {p.dirty_ratio:.2f} is below min.cleanable.dirty.ratio "
                          f"{topic.min_cleanable_dirty_ratio:.2f}")
            if reason is not None:
                skipped.append(Skipped(name, p.partition, reason))
                continue
            plans.append(PartitionPlan(
                topic=name, partition=p.partition,
                start_offset=max(p.log_start_offset, p.segments[0].base_offset),
                end_offset=p.cleanable_end_offset, segments=p.segments,
                clean_bytes=p.clean_bytes, dirty_bytes=p.dirty_bytes, dirty_ratio=p.dirty_ratio,
                min_cleanable_dirty_ratio=topic.min_cleanable_dirty_ratio,
                tombstone_horizon_ms=now - topic.delete_retention_ms, segment_bytes=topic.segment_bytes,
            ))
    plans.sort(key=lambda plan: (-plan.dirty_ratio, plan.topic, plan.partition))
    return plans, skipped


def cleanable_partitions(
    admin_or_client: Admin | BrokerClient,
    topics: Sequence[str] | None = None,
    *,
    force: bool = False,
    now_ms: int | None = None,
    security: ClientSecurity | None = None,
) -> list[PartitionPlan]:
    """The partitions :func:`plan_cleaning` would compact now (most dirty first)."""
    return plan_cleaning(admin_or_client, topics, force=force, now_ms=now_ms, security=security)[0]


def _describe_at_leaders(
    client: BrokerClient, names: list[str] | None, *, now_ms: int, security: ClientSecurity | None,
) -> dict[str, TopicCleaning | LogstoreError]:
    """``DescribeCleaning`` of ``names``, each partition's state as its leader reports it.

    A broker describes its own replicas: on a cluster, a follower's segments
    need not match the leader's (each replica rolls its own), and the plan's
    swap (``ReplaceSegments``) replaces the leader's (the followers' follow,
    :func:`compaction.cleaner.clean_followers`). So the home broker's answer is
    kept only on a single broker (or for a partition without a leader);
    otherwise each leader is asked for the partitions it leads, and each
    follower too: a follower that missed a compaction makes the partition as
    dirty as it is. The metadata call also tells ``client`` where every
    partition is led, so its later fetches and swaps go there at once.
    """
    found = client.cleaning.describe_cleaning(names, now_ms=now_ms)
    described = sorted(n for n, t in found.items() if isinstance(t, TopicCleaning))
    if not described:
        return found
    md = client.metadata(described)
    if len(md.brokers) <= 1:
        return found
    addresses = {b.node_id: f"{b.host}:{b.port}" for b in md.brokers}
    placed = [(name, p) for name in described if name in md.topics for p in md.topics[name].partitions]
    leader_of = {(name, p.partition): p.leader for name, p in placed if p.leader in addresses}
    hosts = {node for _, p in placed for node in p.replicas if node in addresses}
    states: dict[tuple[str, int], PartitionCleaning] = {}
    dirtiest: dict[tuple[str, int], PartitionCleaning] = {}   # of the followers
    for node in sorted(hosts):
        hosted = sorted({name for name, p in placed if node in p.replicas})
        try:
            with BrokerClient(addresses[node], security=security) as broker:
                answer = broker.cleaning.describe_cleaning(hosted, now_ms=now_ms)
        except LogstoreError:
            if node in leader_of.values():
                raise
            continue   # a follower that is away: it catches up in a later run
        for name, topic in answer.items():
            if not isinstance(topic, TopicCleaning):
                continue
            for p in topic.partitions:
                key = (name, p.partition)
                if leader_of.get(key) == node:
                    states[key] = p
                elif p.error is None and p.dirty_ratio > getattr(dirtiest.get(key), "dirty_ratio", -1.0):
                    dirtiest[key] = p
    for key, state in states.items():
        # A follower that missed a compaction (it was away) is dirtier than its leader: the
        # partition is as dirty as its dirtiest replica, so the run that compacts it comes.
        follower = dirtiest.get(key)
        if follower is not None and follower.first_dirty_offset < state.first_dirty_offset \
                and follower.dirty_ratio > state.dirty_ratio:
            states[key] = dataclasses.replace(state, clean_bytes=follower.clean_bytes,
                                              dirty_bytes=follower.dirty_bytes)
    return {name: dataclasses.replace(t, partitions=tuple(states.get((name, p.partition), p) for p in t.partitions))
            if isinstance(t, TopicCleaning) else t for name, t in found.items()}


# --------------------------------------------------------------------------- survivors


@dataclass(frozen=True, slots=True)
class Survivors:
    """The latest-per-key decision for one partition's range.

    ``keep_offsets`` (sorted int64) are the offsets of keyed records that stay;
    ``producer_last_batches`` are the last offsets of each producer's last batch
    (which keeps at least its last record).
    """

    keep_offsets: np.ndarray
    producer_last_batches: frozenset[int]

    @classmethod
    def empty(cls) -> Survivors:
        return cls(np.empty(0, dtype=np.int64), frozenset())

    def contains(self, offsets: np.ndarray) -> np.ndarray:
        """Boolean mask: which of ``offsets`` are in ``keep_offsets`` (vectorized)."""
        keep = self.keep_offsets
        if not len(keep):
            return np.zeros(len(offsets), dtype=bool)
        at = np.minimum(np.searchsorted(keep, offsets), len(keep) - 1)
        return keep[at] == offsets


def survivors_from_rows(rows: pa.Table) -> dict[int, Survivors]:
    """Survivors per partition from aggregated key-scan rows ``(partition, kind, offset)``:
    kind 0 = a surviving record's offset, kind 1 = the last offset of a producer's last batch."""
    out: dict[int, Survivors] = {}
    if rows.num_rows == 0:
        return out
    partition = rows.column("partition").to_numpy()
    kind = rows.column("kind").to_numpy()
    offset = rows.column("offset").to_numpy()
    for p in np.unique(partition):
        here = partition == p
        keep = np.sort(offset[here & (kind == KIND_RECORD)]).astype(np.int64)
        last = frozenset(int(o) for o in offset[here & (kind == KIND_PRODUCER)])
        out[int(p)] = Survivors(keep, last)
    return out


def reference_survivors(
    batches: Iterable[RangeBatch], *, start: int, end: int, tombstone_horizon_ms: int, partition: int = 0
) -> Survivors:
    """The survivors of ``[start, end)`` in plain Python: a dict of the largest scan
    value per key (what the Spark job computes with a groupBy), then the same
    decision (see the module docstring)."""
    latest: dict[tuple[int, bytes], int] = {}
    for batch in batches:
        for rows in key_rows(batch, start=start, end=end, partition=partition,
                             tombstone_horizon_ms=tombstone_horizon_ms):
            for kind, key, v in zip(rows.column("kind").to_pylist(), rows.column("key").to_pylist(),
                                    rows.column("v").to_pylist(), strict=True):
                if v > latest.get((kind, key), -1):
                    latest[(kind, key)] = v
    kept = [(kind, v >> 1) for (kind, _), v in latest.items() if kind == KIND_PRODUCER or not v & 1]
    table = pa.table({
        "partition": pa.array([partition] * len(kept), pa.int32()),
        "kind": pa.array([k for k, _ in kept], pa.int8()),
        "offset": pa.array([o for _, o in kept], pa.int64()),
    })
    return survivors_from_rows(table).get(partition, Survivors.empty())
