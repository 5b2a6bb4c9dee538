"""How to compact one partition: given its survivors, build the replacement and have the broker swap it in.

:func:`clean_partition` reads the partition's range ``[start_offset,
end_offset)`` of a :class:`~compaction.planner.PartitionPlan` as stored
batches (:func:`compaction.scan.iter_range`), decides per batch with
:func:`compact_batch`, and streams the result to the broker's
``ReplaceSegments`` (:meth:`logstore.client.rpc.BrokerClient.replace_segments`),
which checks every batch, writes the replacement segments and swaps them in
atomically (see :mod:`logstore.storage.segment_replacement`).

Per batch (vectorized with numpy / Arrow, no per-row Python):

* a control batch is passed on byte for byte;
* otherwise the records that stay are those whose offset is a survivor and
  those without a key — none of an aborted transaction's. A producer's last
  batch in the range keeps at least its last record, so that the producer
  state the broker rebuilds from batch headers after a crash still knows the
  producer's last sequence number (Kafka keeps an empty batch for this; a
  logstore batch holds at least one record). All records stay → the batch is
  passed on byte for byte; none → dropped; some → re-encoded with
  :func:`logstore.record.encode_batch` at their original offsets
  (``offsets=``), with the batch's producer id and epoch, leader epoch,
  transactional flag and compression, and a base sequence that keeps the
  batch's last sequence number (``base_sequence + record_count - 1``) unchanged.

Records are never renumbered and keep their order. Batches are never merged
(their facts belong to one producer append); small segments are merged by the
broker, up to ``segment.bytes``.

On a cluster every replica is compacted (:func:`clean_followers`, after the
leader): stored batches are the same bytes on every replica and only segment
boundaries differ, so each follower's closed segments inside the leader's
compacted range are replaced with the leader's compacted batches of exactly
their offsets (``ReplaceSegments`` with ``follower``, bounded by the
follower's own last stable offset). A follower that was away keeps its
uncompacted copy until the next run, which the planner then forces
(:func:`compaction.planner.plan_cleaning`).

Failure: any error — reading, a CRC, the broker refusing the replacement —
cancels the ``ReplaceSegments`` call, the broker discards what it received,
and the partition stays as it was; the next run simply retries.

Thread-safety: :func:`clean_partition` may run for different partitions in
parallel threads (the client is thread-safe).
"""

from __future__ import annotations

import time
from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass, field

import numpy as np
import pyarrow as pa

from compaction.planner import PartitionPlan, Survivors
from compaction.scan import RangeBatch, iter_range
from logstore.cleaning import CleanableSegment
from logstore.client.results import PartitionCleaning, TopicCleaning
from logstore.client.rpc import BrokerClient
from logstore.client.security import ClientSecurity
from logstore.errors import LogstoreError
from logstore.record import encode_batch
from logstore.types import TopicPartition

__all__ = ["CleanStats", "PartitionResult", "ProgressCallback", "compact_batch", "compacted_chunks",
           "clean_partition", "clean_followers", "follower_range"]

_SEQ_MOD = 2**31
_CHUNK_BYTES = 8 << 20

# progress(tp, bytes read so far, bytes to read, records removed so far)
ProgressCallback = Callable[[TopicPartition, int, int, int], None]


@dataclass(slots=True)
class CleanStats:
    """Counts of one partition's compaction, filled in while it streams."""

    batches_in: int = 0
    records_in: int = 0
    bytes_in: int = 0
    batches_out: int = 0
    records_out: int = 0
    bytes_out: int = 0

    @property
    def records_removed(self) -> int:
        return self.records_in - self.records_out


@dataclass(frozen=True, slots=True)
class PartitionResult:
    """The outcome of compacting one partition.

    ``bytes_before``/``bytes_after`` are the replaced and replacement segment
    sizes as the broker counted them; ``records_before``/``records_after`` the
    records read and written. ``error`` is None on success, else the failure
    (then nothing changed: after == before), and ``retriable`` says whether
    simply running again later may succeed.
    """

    topic: str
    partition: int
    segments_before: int
    segments_after: int
    bytes_before: int
    bytes_after: int
    records_before: int
    records_after: int
    duration_s: float
    error: str | None = None
    retriable: bool = False
    stats: CleanStats = field(default_factory=CleanStats, repr=False)

    @property
    def records_removed(self) -> int:
        return self.records_before - self.records_after


def compact_batch(batch: RangeBatch, survivors: Survivors) -> tuple[memoryview | bytes, int] | None:
    """The stored bytes that replace ``batch`` and their record count (see the module
    docstring), or None to drop it."""
    stored = batch.stored
    h = stored.header
    if h.is_control:
        return stored.data, h.record_count
    producer_last = h.last_offset in survivors.producer_last_batches
    if batch.aborted and not producer_last:
        return None
    rb = stored.decode(batch.schema)
    offsets = rb.column(0).to_numpy()
    if batch.aborted:
        keep = np.zeros(len(offsets), dtype=bool)
    else:
        keep = survivors.contains(offsets) | rb.column(2).is_null().to_numpy(zero_copy_only=False)
    if producer_last and not keep[-1] and not keep.any():
        keep[-1] = True  # the producer state rebuilt from headers needs this batch's last sequence
    kept = int(np.count_nonzero(keep))
    if kept == len(offsets):
        return stored.data, kept
    if kept == 0:
        return None
    kept_offsets = offsets[keep]
    # The batch's last sequence number stays what it was (the producer state derives
    # it as base_sequence + record_count - 1).
    sequence = (h.base_sequence if h.base_sequence < 0
                else (h.base_sequence + h.record_count - kept) % _SEQ_MOD)
    encoded = encode_batch(
        rb.filter(pa.array(keep)), base_offset=int(kept_offsets[0]), offsets=kept_offsets,
        leader_epoch=h.leader_epoch, producer_id=h.producer_id, producer_epoch=h.producer_epoch,
        base_sequence=sequence, attributes=h.attributes & 0x0F, compression=h.compression,
    )
    return encoded.to_bytes(), kept


def compacted_chunks(
    batches: Iterable[RangeBatch], survivors: Survivors, stats: CleanStats,
    *, chunk_bytes: int = _CHUNK_BYTES, on_batch: Callable[[], None] | None = None,
) -> Iterator[tuple[bytes, bytes]]:
    """``(schema message, records)`` chunks of the compacted ``batches`` for
    ``ReplaceSegments``: about ``chunk_bytes`` of whole batches each, the schema
    message sent with the first chunk and again whenever it changes."""
    sent_schema = b""
    schema = b""
    pending: list[memoryview | bytes] = []
    size = 0
    for batch in batches:
        h = batch.stored.header
        stats.batches_in += 1
        stats.records_in += h.record_count
        stats.bytes_in += batch.stored.size
        compacted = compact_batch(batch, survivors)
        if compacted is not None:
            out, count = compacted
            if batch.schema_message != schema and pending:
                yield (schema if schema != sent_schema else b""), b"".join(pending)
                sent_schema, pending, size = schema, [], 0
            schema = batch.schema_message
            pending.append(out)
            size += len(out)
            stats.batches_out += 1
            stats.bytes_out += len(out)
            stats.records_out += count
            if size >= chunk_bytes:
                yield (schema if schema != sent_schema else b""), b"".join(pending)
                sent_schema, pending, size = schema, [], 0
        if on_batch is not None:
            on_batch()
    if pending:
        yield (schema if schema != sent_schema else b""), b"".join(pending)


def clean_partition(
    client: BrokerClient,
    plan: PartitionPlan,
    survivors: Survivors,
    *,
    progress: ProgressCallback | None = None,
    chunk_bytes: int = _CHUNK_BYTES,
    timeout_ms: int = 3_600_000,
) -> PartitionResult:
    """Compact ``plan``'s partition with ``survivors``; never raises for a
    partition-level failure (it is in ``PartitionResult.error``)."""
    tp = plan.topic_partition
    started = time.monotonic()
    stats = CleanStats()
    total = max(plan.size_bytes, 1)
    last_report = [0.0]

    def on_batch() -> None:
        now = time.monotonic()
        if progress is not None and now - last_report[0] >= 0.5:
            last_report[0] = now
            progress(tp, stats.bytes_in, total, stats.records_removed)

    batches = iter_range(client, tp, plan.start_offset, plan.end_offset, timeout_ms=timeout_ms)
    chunks = compacted_chunks(batches, survivors, stats, chunk_bytes=chunk_bytes, on_batch=on_batch)
    try:
        replaced = client.cleaning.replace_segments(
            tp, segments=plan.segments, end_offset=plan.end_offset, chunks=chunks,
            cleaner_checkpoint=plan.end_offset, timeout_ms=timeout_ms,
        )
    except LogstoreError as e:
        return PartitionResult(
            topic=plan.topic, partition=plan.partition,
            segments_before=len(plan.segments), segments_after=len(plan.segments),
            bytes_before=plan.size_bytes, bytes_after=plan.size_bytes,
            records_before=stats.records_in, records_after=stats.records_in,
            duration_s=time.monotonic() - started, error=str(e), retriable=e.retriable, stats=stats,
        )
    if progress is not None:
        progress(tp, total, total, stats.records_removed)
    return PartitionResult(
        topic=plan.topic, partition=plan.partition,
        segments_before=len(plan.segments), segments_after=len(replaced.new_base_offsets),
        bytes_before=replaced.bytes_before, bytes_after=replaced.bytes_after,
        records_before=stats.records_in, records_after=stats.records_out,
        duration_s=time.monotonic() - started, stats=stats,
    )


def follower_range(state: PartitionCleaning, plan: PartitionPlan) -> tuple[tuple[CleanableSegment, ...], int]:
    """The closed segments of a follower's replica (``state``, as that follower describes it)
    that lie inside the leader's compacted range ``[plan.start_offset, plan.end_offset)``, and
    the base offset of the segment after them; ``((), -1)`` when none does."""
    segments = state.segments
    first = next((i for i, s in enumerate(segments) if s.base_offset >= plan.start_offset), len(segments))
    chosen: list[CleanableSegment] = []
    end = -1
    for i in range(first, len(segments)):
        after = segments[i + 1].base_offset if i + 1 < len(segments) else state.cleanable_end_offset
        if after > plan.end_offset:
            break
        chosen.append(segments[i])
        end = after
    return tuple(chosen), end


def clean_followers(
    client: BrokerClient,
    plan: PartitionPlan,
    survivors: Survivors,
    *,
    security: ClientSecurity | None = None,
    timeout_ms: int = 3_600_000,
) -> list[str]:
    """Compact every follower's replica of ``plan``'s partition once its leader's is (see the
    module docstring); return what could not be done, one line per follower (empty: all)."""
    tp = plan.topic_partition
    md = client.metadata([plan.topic])
    topic = md.topics.get(plan.topic)
    if topic is None or len(md.brokers) <= 1:
        return []
    addresses = {b.node_id: f"{b.host}:{b.port}" for b in md.brokers}
    info = next((p for p in topic.partitions if p.partition == plan.partition), None)
    if info is None:
        return []
    problems: list[str] = []
    for node in info.replicas:
        if node == info.leader:
            continue
        if node not in addresses:
            problems.append(f"broker {node} is not registered: its replica stays as it was")
            continue
        try:
            with BrokerClient(addresses[node], security=security) as follower:
                described = follower.cleaning.describe_cleaning([plan.topic]).get(plan.topic)
                if not isinstance(described, TopicCleaning):
                    raise described if isinstance(described, LogstoreError) else LogstoreError("not described")
                state = next(p for p in described.partitions if p.partition == plan.partition)
                if state.error is not None:
                    raise state.error
                segments, end = follower_range(state, plan)
                if not segments:
                    continue
                batches = iter_range(client, tp, segments[0].base_offset, end, timeout_ms=timeout_ms)
                follower.cleaning.replace_segments(
                    tp, segments=segments, end_offset=end, chunks=compacted_chunks(batches, survivors, CleanStats()),
                    cleaner_checkpoint=end, timeout_ms=timeout_ms, follower=True)
        except (LogstoreError, StopIteration) as e:
            problems.append(f"the replica on broker {node}: {e}")
    return problems
