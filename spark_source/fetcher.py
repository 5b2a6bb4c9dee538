"""Task-side reading: fetch exactly the offsets ``[start, end)`` of one partition.

A Spark task opens its own :class:`~logstore.client.BrokerClient` (nothing
network-related is pickled), fetches stored Arrow batches, verifies each
batch's CRC32C, skips control batches (transaction markers) and, for
read_committed, records of aborted transactions, trims the first and last
batch to the range, and yields Arrow batches. Offsets absent from the range
(compaction, markers, aborted records) are simply not yielded — they are
not data loss.

If the range's start fell below the log start offset since planning
(retention ran in between), ``failOnDataLoss`` decides: fail with a message
naming the offsets, or continue from the log start.

Thread-safety: each call uses its own client; nothing is shared.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Iterator

import numpy as np
import pyarrow as pa

from logstore.client import BrokerClient, FetchRequestPartition
from logstore.errors import OffsetOutOfRangeError, RequestTimedOutError
from logstore.record import decode_schema, iter_batches
from logstore.types import TopicPartition

from spark_source.planner import DataLossError, OffsetRange

__all__ = ["read_range"]

log = logging.getLogger("logstore.spark_source")
_POLL_MS = 500


def read_range(
    client: BrokerClient,
    r: OffsetRange,
    *,
    isolation_level: str,
    fail_on_data_loss: bool,
    fetch_max_bytes: int,
    fetch_timeout_ms: int,
) -> Iterator[pa.RecordBatch]:
    """Yield stored-schema batches holding exactly the records of ``r`` that a reader may see."""
    tp = TopicPartition(r.topic, r.partition)
    offset = r.start
    deadline = time.monotonic() + fetch_timeout_ms / 1000
    while offset < r.end:
        (answer,) = client.fetch(
            [FetchRequestPartition(tp, offset, fetch_max_bytes)],
            max_wait_ms=_POLL_MS, max_bytes=fetch_max_bytes, isolation_level=isolation_level,
        )
        if isinstance(answer.error, OffsetOutOfRangeError) and offset < answer.log_start_offset:
            msg = (f"offsets {offset} to {min(answer.log_start_offset, r.end) - 1} of partition {tp} "
                   f"were deleted (log start offset is now {answer.log_start_offset}) before this "
                   "task read them.")
            if fail_on_data_loss:
                raise DataLossError(msg + " Set failOnDataLoss to false to skip them.")
            log.warning("%s Skipping them (failOnDataLoss=false).", msg)
            offset = answer.log_start_offset
            continue
        if answer.error is not None:
            raise answer.error
        if not answer.records:
            bound = answer.last_stable_offset if isolation_level == "read_committed" else answer.high_watermark
            if bound >= r.end:
                return  # everything left in the range is gone (compaction) or invisible
            if time.monotonic() > deadline:
                raise RequestTimedOutError(
                    f"partition {tp} did not reach offset {r.end} within {fetch_timeout_ms} ms "
                    f"(readable end is {bound}); raise fetchTimeoutMs if the broker is slow"
                )
            continue
        deadline = time.monotonic() + fetch_timeout_ms / 1000
        schema, _ = decode_schema(answer.schema, where=f"fetch of {tp}")
        aborted = _aborted_ranges(answer) if isolation_level == "read_committed" else {}
        for stored in iter_batches(memoryview(answer.records), where=f"fetch of {tp}"):
            stored.verify_crc(where=f"fetch of {tp}")
            h = stored.header
            if h.next_offset <= offset:
                continue
            if h.base_offset >= r.end:
                return
            if h.is_control:
                _note_marker(aborted, h.producer_id)
                continue
            if h.is_transactional and h.producer_id in aborted and aborted[h.producer_id] <= h.base_offset:
                continue
            batch = stored.decode(schema)
            offsets = batch.column(0).to_numpy()
            lo = int(np.searchsorted(offsets, offset)) if h.base_offset < offset else 0
            hi = int(np.searchsorted(offsets, r.end)) if h.last_offset >= r.end else len(offsets)
            if hi > lo:
                yield batch.slice(lo, hi - lo)
        offset = max(answer.next_offset, offset)


def _aborted_ranges(answer) -> dict[int, int]:  # type: ignore[no-untyped-def]
    """producer id → first offset of its aborted transaction overlapping this fetch."""
    return {a.producer_id: a.first_offset for a in answer.aborted_transactions}


def _note_marker(aborted: dict[int, int], producer_id: int) -> None:
    # A control batch ends the producer's transaction: later batches of the
    # same producer belong to a new transaction.
    aborted.pop(producer_id, None)
