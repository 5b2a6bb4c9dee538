"""The fetcher: decoding fetch answers, and :func:`fetch_range`, the bounded reader.

This is the toolkit every reader shares: the :class:`~logstore.client.consumer.Consumer`,
the Spark source's tasks (:func:`fetch_range`) and the compaction job's
scans (:class:`AbortedFilter`).

Decoding (:func:`decode_fetched`)
---------------------------------
The broker serves stored batches byte for byte. Decoding a fetch answer
verifies each batch's CRC32C (``check_crcs``; a mismatch raises
:class:`CorruptRecordError` naming the partition and offset), skips control
batches and (read_committed) batches of aborted transactions
(:class:`AbortedFilter`, Kafka's algorithm), and trims records below the fetch
offset and at or above an optional end offset. Batches are Arrow record
batches in the stored schema (``offset``, ``timestamp``, ``key``, ``value``,
``headers``), zero-copy for uncompressed bodies; offsets may have gaps
(compaction, markers, aborted records). :func:`records_from_batch` turns one
into :class:`ConsumerRecord` objects.

Bounded reads (:func:`fetch_range`)
-----------------------------------
Exactly the offsets ``[start_offset, end_offset)`` of one partition (end
offsets are exclusive): stateless, for Spark tasks. Records deleted or
truncated away are data loss (:class:`OffsetOutOfRangeError`, or a warning
with ``fail_on_data_loss=False``); records not yet visible (above the HWM or
LSO) are long-polled for until ``timeout_ms``.

Thread-safety: everything here is a pure function of its arguments and its
client (which is thread-safe); an :class:`AbortedFilter` belongs to one
decoding pass.
"""

from __future__ import annotations

import dataclasses
import logging
import time
from collections import deque
from collections.abc import Iterable, Iterator
from dataclasses import dataclass
from itertools import repeat

import numpy as np
import pyarrow as pa

from logstore.client.results import AbortedTransaction, FetchedPartition, FetchRequestPartition
from logstore.client.rpc import (
    DEFAULT_REQUEST_TIMEOUT_MS,
    EARLIEST_TIMESTAMP,
    ISOLATION_LEVELS,
    LATEST_TIMESTAMP,
    BrokerClient,
)
from logstore.errors import LogstoreError, OffsetOutOfRangeError, RequestTimedOutError
from logstore.record import BatchHeader, decode_schema
from logstore.record_reader import iter_batches
from logstore.types import ConsumerRecord, ListedOffset, TopicPartition

__all__ = [
    "AbortedFilter",
    "FetchedBatches",
    "decode_fetched",
    "fetch_range",
    "records_from_batch",
]

log = logging.getLogger("logstore.client.consumer")

_RETRY_BACKOFF_S = 0.1


# --------------------------------------------------------------------------- decoding


class AbortedFilter:
    """Drops batches of aborted transactions from one fetch answer (read_committed).

    Kafka's algorithm: walking the batches in offset order, a producer id
    becomes *aborted* once a batch reaches the ``first_offset`` of one of its
    aborted transactions; its transactional batches are dropped until its
    next control batch (the abort marker) ends the range. Until transactions
    land the broker sends no aborted transactions and this keeps every batch.
    """

    __slots__ = ("_pending", "_aborted")

    def __init__(self, aborted: Iterable[AbortedTransaction]) -> None:
        self._pending = deque(sorted(aborted, key=lambda a: a.first_offset))
        self._aborted: set[int] = set()

    def keep(self, header: BatchHeader) -> bool:
        """Whether the records of the batch with ``header`` are visible (control batches never are)."""
        while self._pending and self._pending[0].first_offset <= header.last_offset:
            self._aborted.add(self._pending.popleft().producer_id)
        if header.is_control:
            self._aborted.discard(header.producer_id)
            return False
        return not (header.is_transactional and header.producer_id in self._aborted)


@dataclass(frozen=True, slots=True)
class FetchedBatches:
    """The visible records of one fetch answer, decoded.

    ``batches`` hold the records in ``[fetch_offset, end_offset)`` in offset
    order, in the stored schema ``schema`` (None when there were no batches).
    ``next_offset`` is where the next fetch starts; it may exceed the last
    record's offset + 1 (control batches, aborted or compacted records).
    """

    schema: pa.Schema | None
    batches: tuple[pa.RecordBatch, ...]
    next_offset: int

    @property
    def record_count(self) -> int:
        return sum(b.num_rows for b in self.batches)


def _trim(rb: pa.RecordBatch, start: int, end: int | None) -> pa.RecordBatch:
    """Keep the rows of ``rb`` whose offsets are in ``[start, end)`` (offsets increase)."""
    offsets = rb.column(0).to_numpy()
    lo = int(np.searchsorted(offsets, start)) if offsets[0] < start else 0
    hi = int(np.searchsorted(offsets, end)) if end is not None and offsets[-1] >= end else len(offsets)
    return rb if lo == 0 and hi == len(offsets) else rb.slice(lo, max(0, hi - lo))


def decode_fetched(
    fetched: FetchedPartition,
    *,
    fetch_offset: int,
    check_crcs: bool = True,
    read_committed: bool = True,
    end_offset: int | None = None,
) -> FetchedBatches:
    """Decode a fetch answer into Arrow batches of the visible records.

    Verifies every batch's CRC32C when ``check_crcs`` (raising
    :class:`CorruptRecordError` naming the partition and offset), skips
    control batches and, when ``read_committed``, batches of aborted
    transactions, and trims records below ``fetch_offset`` and at or above
    ``end_offset``. Does not look at ``fetched.error``.
    """
    tp = fetched.topic_partition
    next_offset = max(fetch_offset, fetched.next_offset)
    if not fetched.records:
        return FetchedBatches(None, (), next_offset)
    where = f"fetch of {tp} at offset {fetch_offset}"
    schema = _decoded_schema(fetched.schema, where)
    aborted = AbortedFilter(fetched.aborted_transactions) if read_committed else None
    out: list[pa.RecordBatch] = []
    for stored in iter_batches(memoryview(fetched.records), where=where):
        header = stored.header
        next_offset = max(next_offset, header.next_offset)
        if header.next_offset <= fetch_offset:
            continue
        if check_crcs:
            stored.verify_crc(where=where)
        # The filter must see control batches too: a marker ends its producer's aborted range.
        visible = aborted.keep(header) if aborted is not None else not header.is_control
        if not visible:
            continue
        if end_offset is not None and header.base_offset >= end_offset:
            break
        rb = _trim(stored.decode(schema), fetch_offset, end_offset)
        if rb.num_rows:
            out.append(rb)
    return FetchedBatches(schema, tuple(out), next_offset)


_SCHEMAS: dict[bytes, pa.Schema] = {}  # schema message -> schema: most answers repeat one
_MAX_SCHEMAS = 64


def _decoded_schema(message: bytes, where: str) -> pa.Schema:
    """``decode_schema`` of a fetch answer's schema message, remembered (a low-rate consumer
    gets one answer per record, and decoding the schema was a fifth of decoding the answer)."""
    schema = _SCHEMAS.get(message)
    if schema is None:
        schema, _ = decode_schema(message, where=where)
        if len(_SCHEMAS) >= _MAX_SCHEMAS:
            _SCHEMAS.clear()
        _SCHEMAS[bytes(message)] = schema
    return schema


def records_from_batch(topic: str, partition: int, batch: pa.RecordBatch) -> list[ConsumerRecord]:
    """One :class:`ConsumerRecord` per row of a stored-schema batch (the per-row path).

    Built column by column: each column becomes a Python list once, and the
    records' fields are filled by ``map`` over their slots (C loops) instead of
    one ``__init__`` call per record, which is most of a per-record poll's cost
    (a frozen dataclass's ``__init__`` sets every field through
    ``object.__setattr__``). The records are the same as ``ConsumerRecord(...)``
    would make: every slot is set, nothing else exists.
    """
    n = batch.num_rows
    offsets = batch.column(0).to_numpy().tolist()
    timestamps = _int64s(batch.column(1))
    keys = batch.column(2).to_pylist()
    values = batch.column(3).to_pylist()
    headers_col = batch.column(4)
    headers: Iterable[tuple[tuple[str, bytes], ...]]
    if headers_col.null_count == len(headers_col):
        headers = repeat((), n)
    else:
        headers = [
            () if hs is None else tuple((h["key"], h["value"]) for h in hs)
            for hs in headers_col.to_pylist()
        ]
    records: list[ConsumerRecord] = list(map(_new_object, repeat(ConsumerRecord, n)))
    columns = (repeat(topic, n), repeat(partition, n), offsets, timestamps, keys, values, headers)
    for set_field, column in zip(_RECORD_SLOT_SETTERS, columns, strict=True):
        deque(map(set_field, records, column), maxlen=0)
    return records


def _int64s(column: pa.Array) -> list[int]:
    """A timestamp (or integer) column as Python ints, without a compute kernel when it has no nulls."""
    if column.null_count == 0 and pa.types.is_timestamp(column.type):
        return column.view(pa.int64()).to_numpy().tolist()
    return column.cast(pa.int64()).to_numpy(zero_copy_only=False).tolist()


_new_object = object.__new__
_RECORD_FIELDS = ("topic", "partition", "offset", "timestamp_ms", "key", "value", "headers")
if tuple(f.name for f in dataclasses.fields(ConsumerRecord)) != _RECORD_FIELDS:  # pragma: no cover
    raise ImportError(f"records_from_batch fills {_RECORD_FIELDS}; ConsumerRecord has other fields")
_RECORD_SLOT_SETTERS = tuple(ConsumerRecord.__dict__[name].__set__ for name in _RECORD_FIELDS)


# --------------------------------------------------------------------------- fetch_range


def fetch_range(
    client: BrokerClient,
    tp: TopicPartition,
    start_offset: int,
    end_offset: int,
    *,
    isolation_level: str = "read_committed",
    max_bytes: int = 16 << 20,
    check_crcs: bool = True,
    fail_on_data_loss: bool = True,
    timeout_ms: int = DEFAULT_REQUEST_TIMEOUT_MS,
) -> Iterator[pa.RecordBatch]:
    """Yield Arrow batches covering exactly the offsets ``[start_offset, end_offset)`` of ``tp``.

    The low-level reader for Spark tasks: stateless, one partition, bounded.
    Batches are in the stored schema (offset, timestamp, key, value,
    headers), trimmed at both ends; control batches and (read_committed)
    aborted records are skipped, and offsets may have gaps (compaction,
    markers). Each fetch asks for at most ``max_bytes``.

    Data loss: if records in the range were deleted (``start_offset`` below
    the log start offset), lost (offsets whose loss an operator accepted with
    ``logstore partitions recover --accept-data-loss``), or the log ends
    before ``end_offset`` (truncation),
    raises :class:`OffsetOutOfRangeError` saying which offsets are gone;
    with ``fail_on_data_loss=False`` it logs a warning and reads what is
    left instead. When records of the range are not yet visible (above the
    HWM/LSO) it long-polls for them and raises
    :class:`RequestTimedOutError` if they do not appear within ``timeout_ms``.
    Other errors surface as their :class:`LogstoreError`; retriable ones are
    retried until the same deadline.
    """
    if isolation_level not in ISOLATION_LEVELS:
        raise ValueError(f"isolation_level must be one of {sorted(ISOLATION_LEVELS)}, got {isolation_level!r}")
    if start_offset < 0 or end_offset < start_offset:
        raise ValueError(f"need 0 <= start_offset <= end_offset, got [{start_offset}, {end_offset})")
    read_committed = isolation_level == "read_committed"
    deadline = time.monotonic() + timeout_ms / 1000
    offset = start_offset
    while offset < end_offset:
        remaining_ms = int((deadline - time.monotonic()) * 1000)
        try:
            [fetched] = client.fetch(
                [FetchRequestPartition(tp, offset, max_bytes)],
                max_wait_ms=max(0, min(500, remaining_ms)),
                min_bytes=1,
                max_bytes=max_bytes,
                isolation_level=isolation_level,
            )
            lost_gap = isinstance(fetched.error, OffsetOutOfRangeError) and fetched.next_offset > offset
            if fetched.error is not None and not lost_gap:
                raise fetched.error
        except OffsetOutOfRangeError:
            offset = _data_loss(client, tp, offset, end_offset, fail_on_data_loss)
            continue
        except LogstoreError as e:
            if not e.retriable or time.monotonic() >= deadline:
                raise
            log.info("fetch_range %s at %d: %s; retrying", tp, offset, e)
            time.sleep(min(_RETRY_BACKOFF_S, max(0.0, deadline - time.monotonic())))
            continue
        if lost_gap and fetched.error is not None:
            offset = _lost_gap(tp, offset, end_offset, fetched.next_offset, fetched.error, fail_on_data_loss)
            continue
        decoded = decode_fetched(
            fetched, fetch_offset=offset, check_crcs=check_crcs,
            read_committed=read_committed, end_offset=end_offset,
        )
        yield from decoded.batches
        if decoded.next_offset > offset:
            offset = decoded.next_offset
            continue
        bound = fetched.last_stable_offset if read_committed else fetched.high_watermark
        if not fetched.records and offset < bound:
            # No batch below the readable end: [offset, bound) is a gap (compacted or
            # aborted records; batches never straddle the HWM or the LSO), not data to wait for.
            offset = bound
            continue
        if time.monotonic() >= deadline:
            raise RequestTimedOutError(
                f"offsets [{offset}, {end_offset}) of {tp} did not become readable within "
                f"{timeout_ms} ms: the {'last stable offset' if read_committed else 'high watermark'} "
                f"is {bound}"
            )


def _lost_gap(tp: TopicPartition, offset: int, end_offset: int, gap_end: int, error: LogstoreError,
              fail: bool) -> int:
    """``offset`` is inside offsets the broker lost (an accepted loss; the log goes on at
    ``gap_end``): raise, or with ``fail`` False warn and return where to go on."""
    message = f"records [{offset}, {min(gap_end, end_offset)}) of {tp} were lost: {error.message}"
    if fail:
        raise OffsetOutOfRangeError(message + "; set fail_on_data_loss=False to skip them")
    log.warning("%s; skipping them", message)
    return min(gap_end, end_offset)


def _data_loss(
    client: BrokerClient, tp: TopicPartition, offset: int, end_offset: int, fail: bool
) -> int:
    """Explain (or with ``fail`` False, skip) an out-of-range offset; return where to go on."""
    found = client.list_offsets({tp: EARLIEST_TIMESTAMP}, isolation_level="read_uncommitted")
    found_end = client.list_offsets({tp: LATEST_TIMESTAMP}, isolation_level="read_uncommitted")
    start_info, end_info = found.get(tp), found_end.get(tp)
    for info in (start_info, end_info):
        if isinstance(info, LogstoreError):
            raise info
    assert isinstance(start_info, ListedOffset) and isinstance(end_info, ListedOffset)
    log_start = start_info.offset if start_info.offset is not None else 0
    log_end = end_info.offset if end_info.offset is not None else 0
    if offset < log_start:
        message = (
            f"records [{offset}, {min(log_start, end_offset)}) of {tp} were deleted before they "
            f"were read (log start offset is now {log_start}): data loss"
        )
        resume = min(log_start, end_offset)
    else:
        message = (
            f"offset {offset} of {tp} is beyond its log end offset {log_end}; records "
            f"[{offset}, {end_offset}) are lost (was the log truncated?)"
        )
        resume = end_offset
    if fail:
        raise OffsetOutOfRangeError(message + "; set fail_on_data_loss=False to skip them")
    log.warning("%s; skipping them", message)
    return resume
