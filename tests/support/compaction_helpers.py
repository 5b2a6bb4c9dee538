"""Helpers of the compaction tests: keyed topics, deterministic produce batches, reading a
partition back, a Spark-free compaction (the reference survivors), and a model of what a
compaction keeps.

A record here is ``(offset, timestamp_ms, key, value)``; ``value`` None is a tombstone.
"""

from __future__ import annotations

import random
from collections.abc import Iterable, Iterator, Sequence

import pyarrow as pa
from storage_helpers import read_all

from compaction.cleaner import (
    CleanStats,
    PartitionResult,
    clean_followers,
    clean_partition,
    compacted_chunks,
)
from compaction.planner import plan_cleaning, reference_survivors
from compaction.scan import RangeBatch, iter_range
from logstore.client.admin import Admin
from logstore.client.fetcher import fetch_range
from logstore.client.producer import Producer
from logstore.client.rpc import BrokerClient
from logstore.record import encode_schema
from logstore.storage.log import Log
from logstore.storage.segment_replacement import SegmentReplacement, segment_summary
from logstore.types import TopicPartition

Rec = tuple[int, int, "bytes | None", "bytes | None"]
Draft = tuple[int, "bytes | None", "bytes | None"]  # (timestamp_ms, key, value)


def compact_topic(admin: Admin, prefix: str, *, partitions: int = 1, **configs: object) -> str:
    """A new topic with cleanup.policy=compact and ``configs`` (underscores for dots)."""
    name = f"{prefix}-{random.randrange(1 << 30)}"
    props = {"cleanup.policy": "compact", "min.cleanable.dirty.ratio": "0.01"}
    props.update({k.replace("_", "."): str(v) for k, v in configs.items()})
    admin.create_topic(name, partitions, configs=props)
    return name


def produce_batches(producer: Producer, topic: str, batches: Iterable[Sequence[Draft]], *,
                    partition: int = 0) -> list[int]:
    """Append each draft list as (at least) one batch, in order; return the base offsets."""
    bases: list[int] = []
    for drafts in batches:
        table = pa.table({
            "key": pa.array([d[1] for d in drafts], pa.binary()),
            "value": pa.array([d[2] for d in drafts], pa.binary()),
            "timestamp": pa.array([d[0] for d in drafts], pa.int64()),
        })
        result = producer.send_batch(topic, table, partition=partition).result(timeout=30)
        bases.extend(b.base_offset for b in result.batches)
    return bases


def read_records(bootstrap: str, tp: TopicPartition, *, isolation_level: str = "read_uncommitted",
                 start: int | None = None) -> list[Rec]:
    """Every record of ``tp`` from ``start`` (default: the log start) to the HWM (or LSO), via fetch_range.
    The offsets are the leader's: on a cluster another broker's HWM can trail it."""
    with BrokerClient(bootstrap) as client:
        md = client.metadata([tp.topic], leader_offsets=True).topics[tp.topic].partitions[tp.partition]
        end = md.last_stable_offset if isolation_level == "read_committed" else md.high_watermark
        out: list[Rec] = []
        first = md.log_start_offset if start is None else start
        for rb in fetch_range(client, tp, first, end, isolation_level=isolation_level, timeout_ms=20_000):
            out.extend(zip(rb.column("offset").to_pylist(),
                           rb.column("timestamp").cast(pa.int64()).to_pylist(),
                           rb.column("key").to_pylist(), rb.column("value").to_pylist(), strict=True))
        return out


def compact_without_spark(bootstrap: str, topic: str, *, now_ms: int, force: bool = True,
                          partitions: Sequence[int] | None = None,
                          follower_problems: list[str] | None = None) -> list[PartitionResult]:
    """Plan and compact ``topic`` with the reference (plain-Python) survivors instead of Spark,
    on a cluster every replica, as the job does. What a follower could not do goes into
    ``follower_problems``; without that list, there must be nothing."""
    with BrokerClient(bootstrap) as client:
        plans, _ = plan_cleaning(client, [topic], partitions=partitions, force=force, now_ms=now_ms)
        results = []
        for plan in plans:
            survivors = reference_survivors(
                iter_range(client, plan.topic_partition, plan.start_offset, plan.end_offset),
                start=plan.start_offset, end=plan.end_offset,
                tombstone_horizon_ms=plan.tombstone_horizon_ms, partition=plan.partition,
            )
            result = clean_partition(client, plan, survivors)
            if result.error is None:
                problems = clean_followers(client, plan, survivors)
                if follower_problems is None:
                    assert problems == []
                else:
                    follower_problems += problems
            results.append(result)
        return results


def model_after_compaction(records: Sequence[Rec], *, cleanable_end: int, now_ms: int,
                           delete_retention_ms: int, aborted: frozenset[int] = frozenset(),
                           producer_last: Sequence[tuple[int, int]] = ()) -> list[Rec]:
    """What a compaction of ``[.., cleanable_end)`` keeps of ``records`` (all visible, plain
    Python, written from the rules rather than from the code): below the cleanable end the
    latest record per key unless it is a tombstone at or before ``now - delete.retention.ms``,
    and every keyless record; everything from the cleanable end on. ``aborted`` offsets never
    count and are removed. ``producer_last`` are the ``(base, last)`` offsets of each
    producer's last batch below the cleanable end: when nothing of one would stay, its last
    record does."""
    latest: dict[bytes, Rec] = {}
    for r in records:
        if r[0] < cleanable_end and r[2] is not None and r[0] not in aborted:
            latest[r[2]] = r
    horizon = now_ms - delete_retention_ms
    keep = {r[0] for r in latest.values() if not (r[3] is None and r[1] <= horizon)}
    keep |= {r[0] for r in records if r[2] is None and r[0] not in aborted}
    for base, last in producer_last:
        if not any(base <= o <= last for o in keep):
            keep.add(last)
    return [r for r in records if r[0] >= cleanable_end or r[0] in keep]


def producer_last_batches(bootstrap: str, tp: TopicPartition, end: int) -> list[tuple[int, int]]:
    """``(base, last)`` offsets of each producer's last data batch below ``end`` (from batch headers)."""
    last: dict[int, tuple[int, int]] = {}
    with BrokerClient(bootstrap) as client:
        for b in iter_range(client, tp, 0, end):
            h = b.stored.header
            if h.producer_id >= 0 and not h.is_control:
                last[h.producer_id] = (h.base_offset, h.last_offset)
    return list(last.values())


# --------------------------------------------------------------------------- storage level


def local_range(log: Log, start: int, end: int) -> Iterator[RangeBatch]:
    """Stored batches of ``log`` holding offsets in ``[start, end)`` (as iter_range yields them,
    with no aborted transactions)."""
    offset = start
    while offset < end:
        res = log.read(offset, max_bytes=1 << 20)
        if not res.batches:
            return
        message = encode_schema(res.schema)
        for stored in res.batches:
            if stored.header.base_offset >= end:
                return
            yield RangeBatch(res.schema, message, stored, aborted=False)
        offset = res.next_offset


def compact_local(log: Log, *, now_ms: int, delete_retention_ms: int,
                  chunk_bytes: int = 4096) -> SegmentReplacement:
    """Compact every closed segment of ``log`` in-process, as the broker would for a
    ReplaceSegments (reference survivors); return the (committed) replacement."""
    segments = log.segments
    end = segments[-1].base_offset
    start = log.log_start_offset
    batches = list(local_range(log, start, end))
    survivors = reference_survivors(batches, start=start, end=end,
                                    tombstone_horizon_ms=now_ms - delete_retention_ms)
    replacement = SegmentReplacement.begin(log, replaced=[segment_summary(s) for s in segments[:-1]],
                                           end_offset=end)
    try:
        for schema_message, records in compacted_chunks(batches, survivors, CleanStats(),
                                                         chunk_bytes=chunk_bytes):
            replacement.add(schema_message, records)
        log.replace_segments(replacement, max_end_offset=log.log_end_offset)
    finally:
        replacement.abort()
    return replacement


def log_records(log: Log) -> list[Rec]:
    """Every record of ``log`` as ``(offset, timestamp, key, value)``."""
    return [(o, t, k, v) for o, t, k, v, _ in read_all(log)]
