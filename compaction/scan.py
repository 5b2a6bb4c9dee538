"""Reading a partition's offset range as stored batches: the input of the key scan and of the cleaner.

:func:`iter_range` yields every stored batch (control batches included) that
holds offsets in ``[start, end)``, whole and byte for byte, with its segment
schema and whether it belongs to an aborted transaction. It fetches with
``read_committed`` isolation, so the broker sends the aborted transactions of
each answer (a compacted range always lies below the last stable offset), and
classifies batches as a read_committed consumer would
(:class:`logstore.client.consumer.AbortedFilter`).

:func:`key_rows` turns one such batch into the rows the Spark job aggregates,
without per-row Python (:data:`KEY_ROWS_SCHEMA`):

* ``kind`` 0 — one row per record that a read_committed reader sees and that
  has a key, with offset in ``[start, end)``: ``v = offset * 2 + expired``
  where ``expired`` is 1 for a tombstone (null value) whose timestamp is at or
  before the tombstone horizon (``now - delete.retention.ms``). The largest
  ``v`` per key names the key's latest record and says whether it is an
  expired tombstone, so one ``max`` over a long does the whole per-key work.
* ``kind`` 1 — one row per data batch of an idempotent or transactional
  producer whose last offset is in ``[start, end)``: ``key`` is the producer
  id (8 bytes, big-endian), ``v = last_offset * 2``. The largest per producer
  is the producer's last batch, of which the cleaner keeps at least the last
  record, so that the producer state the broker rebuilds from batch headers
  after a crash still ends at the right sequence number.

Thread-safety: pure functions of their client (which is thread-safe).
"""

from __future__ import annotations

import logging
import time
from collections.abc import Iterator
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass

import numpy as np
import pyarrow as pa

from logstore.client.fetcher import AbortedFilter
from logstore.client.results import FetchedPartition, FetchRequestPartition
from logstore.client.rpc import BrokerClient
from logstore.errors import (
    CompactionConflictError,
    LogstoreError,
    OffsetOutOfRangeError,
    RequestTimedOutError,
    UnknownServerError,
)
from logstore.record import decode_schema
from logstore.record_reader import StoredBatch, iter_batches
from logstore.types import TopicPartition

__all__ = ["RangeBatch", "iter_range", "key_rows", "KEY_ROWS_SCHEMA", "KEY_ROWS_DDL", "KIND_RECORD",
           "KIND_PRODUCER"]

log = logging.getLogger("logstore.compaction")

KIND_RECORD = 0
KIND_PRODUCER = 1
KEY_ROWS_SCHEMA = pa.schema([
    pa.field("partition", pa.int32()),
    pa.field("kind", pa.int8()),
    pa.field("key", pa.binary()),
    pa.field("v", pa.int64()),
])
# The same, as Spark DDL (the output schema of the key scan).
KEY_ROWS_DDL = "partition int, kind byte, key binary, v long"
_FETCH_BYTES = 32 << 20
_RETRY_BACKOFF_S = 0.2


@dataclass(frozen=True, slots=True)
class RangeBatch:
    """A stored batch of a range, as the broker serves it.

    ``schema_message`` is the Arrow IPC schema message of the segment it
    comes from (``schema`` decoded); ``aborted`` is True for the data batch of
    an aborted transaction (never for a control batch).
    """

    schema: pa.Schema
    schema_message: bytes
    stored: StoredBatch
    aborted: bool


def iter_range(
    client: BrokerClient,
    tp: TopicPartition,
    start: int,
    end: int,
    *,
    max_bytes: int = _FETCH_BYTES,
    timeout_ms: int = 120_000,
) -> Iterator[RangeBatch]:
    """Every stored batch of ``tp`` holding offsets in ``[start, end)``, in offset order.

    The first batch may start below ``start`` and batches are never cut.
    Gaps (compacted or aborted records) are skipped; a gap that reaches the
    readable end of the partition ends the range. Raises
    :class:`CompactionConflictError` when records of the range were deleted
    meanwhile (the log start offset passed ``start``): plan again.
    Retriable errors are retried until ``timeout_ms`` passed.
    """
    deadline = time.monotonic() + timeout_ms / 1000
    # One fetch ahead: the broker serves the next batches while these are processed.
    pool = ThreadPoolExecutor(max_workers=1, thread_name_prefix="compaction-fetch")

    def fetch(at: int) -> FetchedPartition:
        [fetched] = client.fetch(
            [FetchRequestPartition(tp, at, max_bytes)],
            max_wait_ms=0, min_bytes=0, max_bytes=max_bytes, isolation_level="read_committed",
        )
        return fetched

    try:
        offset = start
        ahead: tuple[int, Future[FetchedPartition]] | None = None
        while offset < end:
            future = ahead[1] if ahead is not None and ahead[0] == offset else pool.submit(fetch, offset)
            ahead = None
            try:
                fetched = future.result()
                if fetched.error is not None:
                    raise fetched.error
            except OffsetOutOfRangeError as e:
                raise CompactionConflictError(
                    f"{tp}: offsets from {offset} are no longer readable ({e.message}); plan again"
                ) from None
            except LogstoreError as e:
                if not e.retriable or time.monotonic() >= deadline:
                    raise
                log.info("reading %s at %d: %s; retrying", tp, offset, e)
                time.sleep(_RETRY_BACKOFF_S)
                continue
            if not fetched.records:
                bound = fetched.last_stable_offset
                if bound > offset:
                    # Nothing but a gap up to the readable end (batches never straddle it).
                    offset = bound
                    continue
                if time.monotonic() >= deadline:
                    raise RequestTimedOutError(
                        f"{tp}: offsets [{offset}, {end}) did not become readable within {timeout_ms} ms "
                        f"(last stable offset {bound})"
                    )
                time.sleep(_RETRY_BACKOFF_S)
                continue
            next_offset = max(offset, fetched.next_offset)
            if next_offset < end:
                ahead = (next_offset, pool.submit(fetch, next_offset))
            where = f"compaction read of {tp} at offset {offset}"
            schema, _ = decode_schema(fetched.schema, where=where)
            aborted = AbortedFilter(fetched.aborted_transactions)
            for stored in iter_batches(memoryview(fetched.records), where=where):
                h = stored.header
                visible = aborted.keep(h)  # keep() must see every batch, in order
                if h.base_offset >= end:
                    next_offset = end
                    break
                if h.next_offset <= offset:
                    continue
                stored.verify_crc(where=where)
                yield RangeBatch(schema, fetched.schema, stored, aborted=not visible and not h.is_control)
            if next_offset <= offset:
                raise UnknownServerError(f"{where}: the broker answered batches that end before the fetch offset")
            offset = next_offset
    finally:
        pool.shutdown(wait=False, cancel_futures=True)


def key_rows(
    batch: RangeBatch, *, start: int, end: int, partition: int, tombstone_horizon_ms: int
) -> list[pa.RecordBatch]:
    """The key-scan rows of one stored batch (see the module docstring); no per-row Python."""
    h = batch.stored.header
    if h.is_control:
        return []
    out: list[pa.RecordBatch] = []
    if h.producer_id >= 0 and start <= h.last_offset < end:
        out.append(pa.RecordBatch.from_arrays(
            [pa.array([partition], pa.int32()), pa.array([KIND_PRODUCER], pa.int8()),
             pa.array([int(h.producer_id).to_bytes(8, "big", signed=True)], pa.binary()),
             pa.array([h.last_offset * 2], pa.int64())],
            schema=KEY_ROWS_SCHEMA,
        ))
    if batch.aborted:
        return out
    rb = batch.stored.decode(batch.schema)
    offsets = rb.column(0).to_numpy()
    keys = rb.column(2)
    mask = keys.is_valid().to_numpy(zero_copy_only=False)
    if h.base_offset < start or h.last_offset >= end:
        mask &= (offsets >= start) & (offsets < end)
    idx = np.flatnonzero(mask)
    if not len(idx):
        return out
    stamps = rb.column(1).cast(pa.int64()).to_numpy()[idx]
    tombstone = rb.column(3).is_null().to_numpy(zero_copy_only=False)[idx]
    v = offsets[idx] * 2 + (tombstone & (stamps <= tombstone_horizon_ms)).astype(np.int64)
    n = len(idx)
    out.append(pa.RecordBatch.from_arrays(
        [pa.array(np.full(n, partition, dtype=np.int32)), pa.array(np.full(n, KIND_RECORD, dtype=np.int8)),
         keys if n == len(offsets) else keys.take(pa.array(idx)), pa.array(v)],
        schema=KEY_ROWS_SCHEMA,
    ))
    return out
