"""The producer: :class:`Producer` batches records per partition and appends them.

Semantics (Kafka's, with Pythonic names)
----------------------------------------
* **Partition choice**: an explicit ``partition``; else a record with a key goes
  to ``partition_for_key(key, n)`` (Kafka's murmur2 formula, so keys land where
  the Java producer puts them); else the topic's *sticky* partition (KIP-480),
  which moves on every time a batch for it is sealed.
* **Batching**: each partition has one open batch. It is sealed when adding a
  record would take it past ``batch_size`` bytes, when it has been open
  ``linger_ms``, or on :meth:`Producer.flush`. Sealed batches queue per partition.
* **Sending**: a background sender thread sends queued batches. At most one
  request per partition is in flight, so batches of a partition are appended
  in the order they were sealed, retries included; requests for different
  partitions overlap. One request carries the ready batches of one or more
  partitions, up to 4 MiB (or ``max_request_size`` if smaller; a single
  larger batch goes alone).
* **Retries**: a batch that fails with a retriable error
  (:attr:`LogstoreError.retriable`) is sent again after ``retry_backoff_ms``,
  up to ``retries`` times and never after ``delivery_timeout_ms`` since it was
  created.
* **Idempotence** (``enable_idempotence=True``, the default): the producer
  gets a producer id and epoch from the broker and numbers each partition's
  batches (``base_sequence``, counting records, assigned in queue order when a
  batch is sealed or enqueued). A retry after a *lost response* sends the
  same bytes; the broker recognises the sequence and answers with the
  original offsets, so nothing is appended twice. A batch that fails for
  good leaves a gap that fails the partition's later batches with
  OUT_OF_ORDER_SEQUENCE_NUMBER (as Kafka's producer): create a new producer.
* **Transactions** (``transactional_id=...``): :meth:`Producer.init_transactions`
  once, then :meth:`~Producer.begin_transaction`, sends to any topics and
  partitions, and :meth:`~Producer.commit_transaction` or
  :meth:`~Producer.abort_transaction`. Partitions join the transaction
  (``AddPartitionsToTxn``) before their first batch is queued. Records of a
  transaction become visible to read_committed consumers atomically at commit;
  an aborted transaction's records never do. A newer producer with the same
  transactional id fences this one (:class:`ProducerFencedError`).
* **Acknowledgement**: ``acks="all"`` (-1) waits for the batch to be durable on
  every in-sync replica (on a single broker: fsynced), ``acks=1`` for the
  leader's append, ``acks=0`` for nothing: futures complete with offset -1 as
  soon as the request is sent, and errors are only logged.
* **Back-pressure**: queued bytes are capped by ``buffer_memory``; ``send`` and
  ``send_batch`` block up to ``max_block_ms`` for room, then fail with
  :class:`RequestTimedOutError`.

``send`` raises synchronously for what it can know before queueing (bad
argument types, unknown topic, partition out of range, a value that does not
fit a typed topic's columns, a record bigger than ``max_request_size``);
everything after that is reported through the returned future and the
``on_delivery`` callback.

The columnar fast path :meth:`Producer.send_batch` converts a pyarrow
``Table``/``RecordBatch`` or a pandas ``DataFrame`` to the stored schema
column by column (:func:`to_stored_batch`), partitions it with a vectorized
murmur2 (:func:`murmur2_array`), cuts it into batches of at most
``batch_size`` bytes and encodes them in the calling thread while the sender
ships earlier ones.

Thread-safety: a :class:`Producer` is thread-safe; share one per process.
Delivery callbacks and future callbacks run on the sender thread: keep them
short and do not call :meth:`Producer.flush` or :meth:`Producer.close` from them.
"""

from __future__ import annotations

import concurrent.futures
import itertools
import json
import logging
import threading
import time
from collections import deque
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass
from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from logstore.client.partitioner import StickyPartitioner, partition_for_key
from logstore.client.results import ProducedPartition
from logstore.client.rpc import DEFAULT_REQUEST_TIMEOUT_MS, BrokerClient
from logstore.errors import (
    InvalidTxnStateError,
    LogstoreError,
    RecordTooLargeError,
    RequestTimedOutError,
    SchemaMismatchError,
    UnknownServerError,
    UnknownTopicOrPartitionError,
)
from logstore.record import (
    ATTR_TRANSACTIONAL,
    HEADERS_TYPE,
    TIMESTAMP_TYPE,
    EncodedBatch,
    build_batch,
    encode_batch,
    encode_schema,
    value_schema_of,
)
from logstore.types import BatchMetadata, RecordMetadata, SendBatchResult, TopicPartition, TxnRef

__all__ = [
    "Producer",
    "DeliveryCallback",
    "to_stored_batch",
    "murmur2_array",
    "partitions_for_keys",
    "parse_acks",
]

log = logging.getLogger(__name__)

# on_delivery(error, metadata): exactly one of them is None.
DeliveryCallback = Callable[[LogstoreError | None, RecordMetadata | None], None]
HeadersArg = Mapping[str, bytes | str | None] | Iterable[tuple[str, bytes | str | None]] | None

_ACKS: dict[object, int] = {"all": -1, "-1": -1, -1: -1, "1": 1, 1: 1, "0": 0, 0: 0}
_COMPRESSIONS = (None, "lz4", "zstd")
# Fixed per-record overhead counted towards batch_size: offset, timestamp, validity, offsets.
_RECORD_OVERHEAD = 24
_RESERVED_COLUMNS = ("key", "timestamp", "headers", "partition")
# Produce requests are cut at this size (or max_request_size if smaller): gRPC moves
# 1-4 MiB messages fastest, and smaller requests let partitions overlap in flight.
_REQUEST_TARGET_BYTES = 4 << 20
# Producer sequence numbers wrap at 2**31, as Kafka's do.
_SEQUENCE_MOD = 2**31


def parse_acks(acks: object) -> int:
    """``"all"``/-1 → -1, 1 → 1, 0 → 0 (strings accepted); anything else raises ValueError."""
    try:
        return _ACKS[acks]
    except (KeyError, TypeError):
        raise ValueError(f"acks must be 'all', -1, 1 or 0, got {acks!r}") from None


# --------------------------------------------------------------------------- topic metadata


@dataclass(frozen=True, slots=True)
class _TopicInfo:
    name: str
    num_partitions: int
    schema: pa.Schema
    value_schema: pa.Schema | None
    schema_message: bytes
    value_type: pa.DataType
    value_names: frozenset[str]
    # message.timestamp.type=LogAppendTime: records carry the broker's append time.
    log_append_time: bool = False


# --------------------------------------------------------------------------- vectorized murmur2

_M = np.uint32(0x5BD1E995)
_SEED = 0x9747B28C


def murmur2_array(keys: pa.Array | pa.ChunkedArray) -> np.ndarray:
    """Kafka's ``murmur2`` of every key of a binary/string array, as int32 (vectorized).

    Equal to ``[logstore.client.partitioner.murmur2(k) for k in keys]`` for non-null
    keys; null keys hash like the empty key (callers mask them). Works on the
    Arrow buffers directly: one numpy pass per 4-byte block of the longest key.
    """
    if isinstance(keys, pa.ChunkedArray):
        keys = keys.combine_chunks() if keys.num_chunks != 1 else keys.chunk(0)
    if not (pa.types.is_binary(keys.type) or pa.types.is_large_binary(keys.type)):
        keys = keys.cast(pa.large_binary() if pa.types.is_large_string(keys.type) else pa.binary())
    n = len(keys)
    if n == 0:
        return np.zeros(0, dtype=np.int32)
    offset_type = np.int64 if pa.types.is_large_binary(keys.type) else np.int32
    _, offsets_buf, data_buf = keys.buffers()
    offsets = np.frombuffer(offsets_buf, dtype=offset_type, count=keys.offset + n + 1)[keys.offset:]
    starts = offsets[:-1].astype(np.int64)
    lengths = (offsets[1:] - offsets[:-1]).astype(np.int64)
    if data_buf is None or len(data_buf) == 0:
        data = np.zeros(8, dtype=np.uint8)
    else:
        # Pad so that reads of up to 3 bytes past a key's end stay in bounds.
        raw = np.frombuffer(data_buf, dtype=np.uint8)
        data = np.concatenate([raw, np.zeros(8, dtype=np.uint8)])
    with np.errstate(over="ignore"):
        h = np.uint32(_SEED) ^ lengths.astype(np.uint32)
        nblocks = lengths >> 2
        max_blocks = int(nblocks.max()) if n else 0
        for j in range(max_blocks):
            rows = np.flatnonzero(nblocks > j)
            at = starts[rows] + 4 * j
            k = (
                data[at].astype(np.uint32)
                | (data[at + 1].astype(np.uint32) << np.uint32(8))
                | (data[at + 2].astype(np.uint32) << np.uint32(16))
                | (data[at + 3].astype(np.uint32) << np.uint32(24))
            )
            k = k * _M
            k ^= k >> np.uint32(24)
            k = k * _M
            h[rows] = (h[rows] * _M) ^ k
        tail = lengths & 3
        tail_at = starts + (nblocks << 2)
        t3 = tail == 3
        h[t3] ^= data[tail_at[t3] + 2].astype(np.uint32) << np.uint32(16)
        t2 = tail >= 2
        h[t2] ^= data[tail_at[t2] + 1].astype(np.uint32) << np.uint32(8)
        t1 = tail >= 1
        h[t1] ^= data[tail_at[t1]].astype(np.uint32)
        h[t1] = h[t1] * _M
        h ^= h >> np.uint32(13)
        h = h * _M
        h ^= h >> np.uint32(15)
    return h.view(np.int32)


def partitions_for_keys(keys: pa.Array | pa.ChunkedArray, num_partitions: int) -> np.ndarray:
    """``partition_for_key`` of every key (int32 array; null keys give -1)."""
    if num_partitions < 1:
        raise ValueError(f"num_partitions must be >= 1, got {num_partitions!r}")
    hashes = murmur2_array(keys)
    parts = ((hashes.astype(np.int64) & 0x7FFFFFFF) % num_partitions).astype(np.int32)
    if keys.null_count:
        valid = np.asarray(pc.is_valid(keys).to_numpy(zero_copy_only=False), dtype=bool)
        parts[~valid] = -1
    return parts


# --------------------------------------------------------------------------- columnar conversion


def _as_binary(arr: pa.Array, what: str) -> pa.Array:
    t = arr.type
    if pa.types.is_binary(t):
        return arr
    if pa.types.is_null(t):
        return pa.nulls(len(arr), pa.binary())
    if pa.types.is_string(t) or pa.types.is_large_binary(t) or pa.types.is_large_string(t) \
            or pa.types.is_binary_view(t) or pa.types.is_string_view(t) \
            or pa.types.is_fixed_size_binary(t):
        return arr.cast(pa.binary())
    if pa.types.is_integer(t) or pa.types.is_floating(t) or pa.types.is_boolean(t) \
            or pa.types.is_decimal(t) or pa.types.is_temporal(t):
        # Keys from numbers/dates are their text form, UTF-8 encoded.
        return arr.cast(pa.string()).cast(pa.binary())
    raise TypeError(f"column {what!r} of type {t} cannot be used as bytes")


def _as_timestamps(arr: pa.Array | None, n: int, now_ms: int) -> pa.Array:
    if arr is None:
        return pa.array(np.full(n, now_ms, dtype=np.int64)).cast(TIMESTAMP_TYPE)
    t = arr.type
    if pa.types.is_timestamp(t):
        out = pc.cast(arr, pa.timestamp("ms", tz=t.tz), safe=False)
        out = out.cast(TIMESTAMP_TYPE) if t.tz is not None else pa.Array.from_buffers(
            TIMESTAMP_TYPE, len(out), out.buffers(), null_count=out.null_count, offset=out.offset
        )
    elif pa.types.is_integer(t):
        out = arr.cast(pa.int64()).cast(TIMESTAMP_TYPE)
    elif pa.types.is_date(t):
        out = pc.cast(arr, pa.timestamp("ms")).cast(pa.int64()).cast(TIMESTAMP_TYPE)
    elif pa.types.is_null(t):
        out = pa.nulls(n, TIMESTAMP_TYPE)
    else:
        raise TypeError(
            f"column 'timestamp' must be a timestamp or integer milliseconds since the epoch, got {t}"
        )
    if out.null_count:
        out = pc.fill_null(out, pa.scalar(now_ms, TIMESTAMP_TYPE))
    return out


def _null_headers(n: int) -> pa.Array:
    """``n`` null header lists with an empty child.

    ``pa.nulls(n, HEADERS_TYPE)`` gives its children length ``n`` too, which
    costs ~12 bytes per record on the wire and on disk, and a slice of it is
    written whole by the IPC writer.
    """
    offsets = pa.array(np.zeros(n + 1, dtype=np.int32))
    empty = pa.array([], HEADERS_TYPE.value_type)
    return pa.ListArray.from_arrays(offsets, empty, type=HEADERS_TYPE, mask=pa.array(np.ones(n, dtype=bool)))


def _as_headers(arr: pa.Array | None, n: int) -> pa.Array:
    if arr is None or pa.types.is_null(arr.type):
        return _null_headers(n)
    if arr.type == HEADERS_TYPE:
        return arr
    try:
        return arr.cast(HEADERS_TYPE)
    except (pa.ArrowInvalid, pa.ArrowNotImplementedError, pa.ArrowTypeError):
        pass
    # Per-row fallback for inputs Arrow cannot cast (e.g. pandas lists of tuples).
    return pa.array([_header_entries(h) for h in arr.to_pylist()], HEADERS_TYPE)


def _check_not_null(arr: pa.Array, field: pa.Field) -> None:
    if not field.nullable and arr.null_count:
        raise SchemaMismatchError(
            f"value column {field.name!r} is NOT NULL but {arr.null_count} rows are null"
        )


def _value_struct(
    columns: Mapping[str, pa.Array], value_type: pa.StructType, n: int
) -> pa.Array:
    arrays: list[pa.Array] = []
    for i in range(value_type.num_fields):
        f = value_type.field(i)
        arr = columns.get(f.name)
        if arr is None:
            if not f.nullable:
                raise SchemaMismatchError(
                    f"value column {f.name!r} is NOT NULL and missing from the input"
                )
            arrays.append(pa.nulls(n, f.type))
            continue
        if arr.type != f.type:
            try:
                arr = arr.cast(f.type)
            except (pa.ArrowInvalid, pa.ArrowNotImplementedError, pa.ArrowTypeError) as e:
                raise SchemaMismatchError(
                    f"value column {f.name!r} of type {arr.type} does not convert to the "
                    f"topic's type {f.type}: {e}"
                ) from None
        _check_not_null(arr, f)
        arrays.append(arr)
    return pa.StructArray.from_arrays(arrays, fields=[value_type.field(i) for i in range(value_type.num_fields)])


def to_stored_batch(
    batch: pa.RecordBatch,
    schema: pa.Schema,
    *,
    key_column: str | None = None,
    now_ms: int | None = None,
) -> tuple[pa.RecordBatch, np.ndarray | None]:
    """Convert an input batch to ``schema`` (a stored schema), column by column.

    Input columns:

    * untyped topic: ``value`` (required; binary or string), optional ``key``
      (binary/string; other types use their text form), ``timestamp``
      (timestamp, or int milliseconds; nulls and a missing column mean now),
      ``headers`` (``list<struct<key string, value binary>>`` or castable) and
      ``partition`` (int, an explicit partition per row).
    * typed topic: the topic's value columns (missing nullable ones become
      null; a missing NOT NULL one is an error), each cast to the topic's
      type, or a single struct ``value`` column (a null row is a tombstone);
      plus the optional columns above. A value column named like one of the
      optional columns is a value column.

    ``key_column`` names the column whose values are the record keys
    (default ``key``); it may also be a value column. Unknown columns raise
    :class:`ValueError` so data is never dropped silently. Type problems
    raise :class:`SchemaMismatchError` or :class:`TypeError`.

    Returns the stored batch (placeholder offsets) and the ``partition``
    column as int32 numpy (None when absent). No per-row Python work except
    for ``headers`` inputs Arrow cannot cast.
    """
    n = batch.num_rows
    now = int(time.time() * 1000) if now_ms is None else now_ms
    names = batch.schema.names
    if len(set(names)) != len(names):
        raise ValueError(f"input columns must be unique, got {names}")
    cols = {name: batch.column(i) for i, name in enumerate(names)}
    value_schema = value_schema_of(schema)
    value_type = schema.field("value").type
    value_names = set(value_schema.names) if value_schema is not None else set()
    special = [c for c in _RESERVED_COLUMNS if c not in value_names]
    used: set[str] = set(special)
    key_name = key_column or "key"
    if key_column is not None and key_column not in cols:
        raise ValueError(f"key_column {key_column!r} is not a column of the input (columns: {names})")
    used.add(key_name)
    if value_schema is None:
        if "value" not in cols:
            raise ValueError(f"input for an untyped topic needs a 'value' column, got {names}")
        values = _as_binary(cols["value"], "value")
        used.add("value")
    elif "value" in cols and "value" not in value_names:
        arr = cols["value"]
        if not pa.types.is_struct(arr.type):
            raise SchemaMismatchError(
                f"column 'value' of a typed topic must be a struct of {value_type}, got {arr.type}"
            )
        try:
            values = arr if arr.type == value_type else arr.cast(value_type)
        except (pa.ArrowInvalid, pa.ArrowNotImplementedError, pa.ArrowTypeError) as e:
            raise SchemaMismatchError(
                f"column 'value' of type {arr.type} does not convert to the topic's {value_type}: {e}"
            ) from None
        used.add("value")
    else:
        values = _value_struct(cols, value_type, n)
        used |= value_names
    unknown = [c for c in names if c not in used]
    if unknown:
        expected = sorted(value_names or {"value"}) + list(special)
        raise ValueError(f"unknown input columns {unknown}; expected some of {expected}")
    keys = _as_binary(cols[key_name], key_name) if key_name in cols else pa.nulls(n, pa.binary())
    timestamps = _as_timestamps(cols.get("timestamp") if "timestamp" in special else None, n, now)
    headers = _as_headers(cols.get("headers") if "headers" in special else None, n)
    partitions: np.ndarray | None = None
    if "partition" in special and "partition" in cols:
        part_col = cols["partition"]
        if not pa.types.is_integer(part_col.type) or part_col.null_count:
            raise TypeError("column 'partition' must be integers without nulls")
        partitions = np.asarray(part_col.to_numpy(zero_copy_only=False), dtype=np.int32)
    offsets = pa.array(np.zeros(n, dtype=np.int64))
    stored = pa.RecordBatch.from_arrays([offsets, timestamps, keys, values, headers], schema=schema)
    return stored, partitions


def _input_batches(data: Any) -> list[pa.RecordBatch]:
    if isinstance(data, pa.RecordBatch):
        return [data]
    if isinstance(data, pa.Table):
        return data.to_batches()
    module = type(data).__module__
    if module.startswith("pandas"):
        return pa.Table.from_pandas(data, preserve_index=False).to_batches()
    raise TypeError(
        f"send_batch takes a pyarrow Table or RecordBatch or a pandas DataFrame, got {type(data).__name__}"
    )


# --------------------------------------------------------------------------- per-record conversion


def _to_bytes(value: object, what: str) -> bytes | None:
    if value is None or isinstance(value, bytes):
        return value
    if isinstance(value, str):
        return value.encode()
    if isinstance(value, (bytearray, memoryview)):
        return bytes(value)
    raise TypeError(f"{what} must be bytes, str or None, got {type(value).__name__}")


def _header_entries(headers: Any) -> list[dict[str, Any]] | None:
    if headers is None:
        return None
    items = headers.items() if isinstance(headers, Mapping) else headers
    out = []
    for item in items:
        if isinstance(item, Mapping):
            k, v = item.get("key"), item.get("value")
        else:
            k, v = item
        if not isinstance(k, str):
            raise TypeError(f"header keys must be str, got {type(k).__name__}")
        out.append({"key": k, "value": _to_bytes(v, f"header {k!r}")})
    return out


def _typed_value_size(value: Mapping[str, Any]) -> int:
    size = 0
    for v in value.values():
        size += len(v) if isinstance(v, (bytes, str)) else 8
    return size


# --------------------------------------------------------------------------- batches and sinks


class _RecordSink:
    """Futures and callbacks of records appended with ``send()``, in batch order."""

    __slots__ = ("futures", "callbacks", "timestamps")

    def __init__(self) -> None:
        self.futures: list[concurrent.futures.Future[RecordMetadata]] = []
        self.callbacks: list[DeliveryCallback | None] = []
        self.timestamps: list[int] = []

    def succeed(self, tp: TopicPartition, base_offset: int, append_time_ms: int) -> None:
        for i, (fut, cb, ts) in enumerate(zip(self.futures, self.callbacks, self.timestamps, strict=True)):
            md = RecordMetadata(
                tp.topic, tp.partition, base_offset + i if base_offset >= 0 else -1,
                append_time_ms if append_time_ms >= 0 else ts,
            )
            fut.set_result(md)
            if cb is not None:
                _run_callback(cb, None, md)

    def fail(self, error: LogstoreError) -> None:
        for fut, cb in zip(self.futures, self.callbacks, strict=True):
            fut.set_exception(error)
            if cb is not None:
                _run_callback(cb, error, None)


def _run_callback(cb: DeliveryCallback, error: LogstoreError | None, md: RecordMetadata | None) -> None:
    try:
        cb(error, md)
    except Exception:
        log.exception("on_delivery callback raised")


class _SendBatchCall:
    """Tracks the batches of one ``send_batch`` call and completes its future."""

    __slots__ = ("future", "_lock", "_added", "_pending", "_sealed", "_results", "_error")

    def __init__(self) -> None:
        self.future: concurrent.futures.Future[SendBatchResult] = concurrent.futures.Future()
        self.future.set_running_or_notify_cancel()
        self._lock = threading.Lock()
        self._added = 0
        self._pending = 0
        self._sealed = False
        self._results: list[tuple[int, BatchMetadata]] = []
        self._error: BaseException | None = None

    def add(self) -> int:
        """Register one more batch; return its index in the call."""
        with self._lock:
            self._pending += 1
            self._added += 1
            return self._added - 1

    def seal(self, error: BaseException | None = None) -> None:
        with self._lock:
            self._sealed = True
            if error is not None and self._error is None:
                self._error = error
        self._maybe_complete()

    def succeed(self, index: int, md: BatchMetadata) -> None:
        with self._lock:
            self._pending -= 1
            self._results.append((index, md))
        self._maybe_complete()

    def fail(self, error: BaseException) -> None:
        with self._lock:
            self._pending -= 1
            if self._error is None:
                self._error = error
        self._maybe_complete()

    def _maybe_complete(self) -> None:
        with self._lock:
            if not self._sealed or self._pending or self.future.done():
                return
            error, results = self._error, sorted(self._results, key=lambda r: r[0])
        if error is not None:
            self.future.set_exception(error)
        else:
            self.future.set_result(SendBatchResult(tuple(md for _, md in results)))


class _OpenBatch:
    """Records appended with ``send()`` to a partition's not-yet-sealed batch."""

    __slots__ = ("keys", "values", "timestamps", "headers", "sink", "size", "created")

    def __init__(self, now: float) -> None:
        self.keys: list[bytes | None] = []
        self.values: list[Any] = []
        self.timestamps: list[int] = []
        self.headers: list[list[dict[str, Any]] | None] = []
        self.sink = _RecordSink()
        self.size = 0
        self.created = now


class _Batch:
    """A sealed batch waiting in a partition queue (or in flight).

    ``records`` holds the unencoded records until the sender encodes them;
    ``data`` then holds the stored batch message. ``empty`` marks a batch all
    of whose records failed conversion (nothing to send).
    """

    __slots__ = ("id", "tp", "info", "records", "data", "empty", "count", "size", "created",
                 "attempts", "record_sink", "call", "call_index", "reported", "base_sequence")

    def __init__(
        self, batch_id: int, info: _TopicInfo, partition: int, *, created: float, size: int, count: int
    ) -> None:
        self.id = batch_id
        self.info = info
        self.tp = TopicPartition(info.name, partition)
        self.records: _OpenBatch | None = None
        self.data: EncodedBatch | None = None
        self.empty = False
        self.count = count
        self.size = size
        self.created = created
        self.attempts = 0
        self.record_sink: _RecordSink | None = None
        self.call: _SendBatchCall | None = None
        self.call_index = 0
        self.reported = False
        self.base_sequence = -1

    def succeed(self, base_offset: int, append_time_ms: int) -> None:
        if self.record_sink is not None:
            self.record_sink.succeed(self.tp, base_offset, append_time_ms)
        if self.call is not None:
            self.call.succeed(
                self.call_index, BatchMetadata(self.tp.topic, self.tp.partition, base_offset, self.count)
            )

    def fail(self, error: LogstoreError) -> None:
        if self.record_sink is not None:
            self.record_sink.fail(error)
        if self.call is not None:
            self.call.fail(error)


class _PartitionState:
    __slots__ = ("tp", "info", "open", "open_id", "queue", "in_flight", "retry_at", "next_seq")

    def __init__(self, info: _TopicInfo, partition: int) -> None:
        self.tp = TopicPartition(info.name, partition)
        self.info = info
        self.open: _OpenBatch | None = None
        self.open_id = 0
        self.queue: deque[_Batch] = deque()
        self.in_flight = False
        self.retry_at = 0.0
        self.next_seq = 0


# A produce request in flight: its batches per partition, and how it ended.
_InFlight = tuple[dict[TopicPartition, list[_Batch]], "concurrent.futures.Future[list[ProducedPartition]]"]


# --------------------------------------------------------------------------- the producer


class Producer:
    """Appends records to topics; see the module docstring for the semantics.

    Options (keyword-only except ``bootstrap``; Kafka's names in snake case):

    * ``bootstrap`` — ``"host:port"`` of a broker (default ``$LOGSTORE_BOOTSTRAP``
      or ``127.0.0.1:9392``);
    * ``acks`` — ``"all"``/-1 (default), 1 or 0;
    * ``linger_ms`` — how long a batch stays open for more records (default 5);
    * ``batch_size`` — bytes per partition batch, uncompressed estimate (default 1 MiB);
    * ``max_request_size`` — bytes per produce request, and the largest record (default 16 MiB);
    * ``compression`` — None, ``"lz4"`` or ``"zstd"`` (Arrow IPC buffer compression);
    * ``retries`` (default 5), ``retry_backoff_ms`` (default 100);
    * ``request_timeout_ms`` — how long the broker and the client wait for one request (default 30 s);
    * ``delivery_timeout_ms`` — upper bound from ``send`` to success or failure (default 120 s);
    * ``buffer_memory`` — bytes of sealed batches waiting to be sent (default 128 MiB);
    * ``max_block_ms`` — how long ``send``/``send_batch`` wait for metadata or buffer room (default 60 s);
    * ``enable_idempotence`` — number batches so retries never duplicate (default True);
    * ``transactional_id`` — makes the producer transactional (implies idempotence);
    * ``transaction_timeout_ms`` — the broker aborts a transaction open longer (default 60 s).

    Use as a context manager, or call :meth:`close`. Thread-safe.
    """

    def __init__(
        self,
        bootstrap: str | None = None,
        *,
        acks: int | str = "all",
        linger_ms: int = 5,
        batch_size: int = 1 << 20,
        max_request_size: int = 16 << 20,
        compression: str | None = None,
        retries: int = 5,
        retry_backoff_ms: int = 100,
        request_timeout_ms: int = DEFAULT_REQUEST_TIMEOUT_MS,
        delivery_timeout_ms: int = 120_000,
        buffer_memory: int = 128 << 20,
        max_block_ms: int = 60_000,
        enable_idempotence: bool = True,
        transactional_id: str | None = None,
        transaction_timeout_ms: int = 60_000,
    ) -> None:
        if compression not in _COMPRESSIONS:
            raise ValueError(f"compression must be None, 'lz4' or 'zstd', got {compression!r}")
        for name, value, low in (
            ("linger_ms", linger_ms, 0), ("batch_size", batch_size, 1),
            ("max_request_size", max_request_size, 1), ("retries", retries, 0),
            ("retry_backoff_ms", retry_backoff_ms, 0), ("request_timeout_ms", request_timeout_ms, 1),
            ("delivery_timeout_ms", delivery_timeout_ms, 1), ("buffer_memory", buffer_memory, 1),
            ("max_block_ms", max_block_ms, 0),
        ):
            if not isinstance(value, int) or isinstance(value, bool) or value < low:
                raise ValueError(f"{name} must be an integer >= {low}, got {value!r}")
        self._acks = parse_acks(acks)
        if transactional_id is not None and (not isinstance(transactional_id, str) or not transactional_id):
            raise ValueError(f"transactional_id must be a non-empty str, got {transactional_id!r}")
        if transactional_id is not None and self._acks != -1:
            raise ValueError("a transactional producer needs acks='all'")
        self._idempotent = enable_idempotence or transactional_id is not None
        self._transactional_id = transactional_id
        self._transaction_timeout_ms = transaction_timeout_ms
        self._producer_id = -1
        self._producer_epoch = -1
        self._txn_number = 0
        self._in_transaction = False
        self._txn_partitions: set[TopicPartition] = set()
        self._txn_error: LogstoreError | None = None
        self._txn_lock = threading.Lock()
        self._linger_s = linger_ms / 1000
        self._batch_size = batch_size
        self._max_request_size = max_request_size
        self._request_bytes = min(max_request_size, _REQUEST_TARGET_BYTES)
        self._compression = compression
        self._retries = retries
        self._retry_backoff_s = retry_backoff_ms / 1000
        self._request_timeout_ms = request_timeout_ms
        self._delivery_timeout_s = delivery_timeout_ms / 1000
        self._buffer_memory = buffer_memory
        self._max_block_s = max_block_ms / 1000

        self._client = BrokerClient(bootstrap, request_timeout_ms=request_timeout_ms)
        self._sticky = StickyPartitioner()
        self._topics: dict[str, _TopicInfo] = {}
        self._metadata_lock = threading.Lock()

        # One lock guards the partition states, the buffer accounting and the
        # in-flight bookkeeping. Futures and callbacks are completed outside it.
        self._lock = threading.Lock()
        self._wakeup = threading.Condition(self._lock)   # the sender waits on it
        self._changed = threading.Condition(self._lock)  # flush and back-pressure wait on it
        self._partitions: dict[TopicPartition, _PartitionState] = {}
        self._incomplete: dict[int, int] = {}  # batch id -> record count, until reported
        self._ids = itertools.count(1)
        self._queued_bytes = 0
        self._in_flight: list[_InFlight] = []
        self._completed: deque[_InFlight] = deque()
        self._closing = False
        self._stopping = False
        self._stop_deadline: float | None = None  # with _stopping: when to give up on in-flight requests
        self._failure: BaseException | None = None
        self._sender = threading.Thread(
            target=self._run_sender, name="logstore-producer-sender", daemon=True
        )
        self._sender.start()

    # ------------------------------------------------------------------ public API

    @property
    def bootstrap(self) -> str:
        return self._client.bootstrap

    def __enter__(self) -> Producer:
        return self

    def __exit__(self, exc_type: type[BaseException] | None, *exc_info: object) -> None:
        # On KeyboardInterrupt/SystemExit (not an Exception) do not wait for outstanding records.
        interrupted = exc_type is not None and not issubclass(exc_type, Exception)
        self.close(timeout=0 if interrupted else None)

    def __reduce__(self) -> Any:
        raise TypeError("a Producer cannot be pickled; create one per process from its bootstrap")

    def partitions_for(self, topic: str) -> list[int]:
        """The partition numbers of ``topic`` (from cached metadata, fetched if needed)."""
        return list(range(self._topic(topic).num_partitions))

    def send(
        self,
        topic: str,
        value: bytes | str | Mapping[str, Any] | None = None,
        *,
        key: bytes | str | None = None,
        headers: HeadersArg = None,
        partition: int | None = None,
        timestamp_ms: int | None = None,
        on_delivery: DeliveryCallback | None = None,
    ) -> concurrent.futures.Future[RecordMetadata]:
        """Queue one record; return a future of where it was appended.

        ``value``: bytes; str (UTF-8); a dict (JSON-encoded for an untyped
        topic, the row of value columns for a typed topic); None (a
        tombstone). ``key``: bytes, str (UTF-8) or None. ``headers``: a dict
        or a list of ``(str, bytes | str | None)`` pairs. ``timestamp_ms``
        defaults to now. ``on_delivery(error, metadata)`` runs on the sender
        thread once the record is acknowledged or has failed. Blocks up to
        ``max_block_ms`` while the buffer is full.

        Raises (synchronously) :class:`TypeError` for values of the wrong type,
        :class:`UnknownTopicOrPartitionError` for an unknown topic or partition,
        :class:`SchemaMismatchError` for a dict that names unknown value columns
        or lacks a NOT NULL one, :class:`RecordTooLargeError` for a record
        bigger than ``max_request_size``, :class:`RequestTimedOutError` when
        the buffer stays full, :class:`RuntimeError` after :meth:`close`.
        """
        self._check_open()
        self._check_can_send()
        info = self._topic(topic)
        key_bytes = _to_bytes(key, "key")
        if info.value_schema is None:
            if isinstance(value, Mapping):
                value = json.dumps(value, separators=(",", ":")).encode()
            stored_value: Any = _to_bytes(value, "value")
            value_size = len(stored_value) if stored_value is not None else 0
        else:
            stored_value = self._typed_value(info, value)
            value_size = _typed_value_size(stored_value) if stored_value is not None else 0
            if self._idempotent and stored_value is not None:
                # A batch's sequence numbers are reserved when it is sealed, so a record
                # that would fail conversion later must fail here instead.
                try:
                    pa.array([stored_value], info.value_type)
                except (pa.ArrowException, TypeError, ValueError) as e:
                    raise SchemaMismatchError(
                        f"record value does not fit the columns of topic {info.name!r}: {e}"
                    ) from None
        header_entries = _header_entries(headers)
        size = _RECORD_OVERHEAD + value_size + (len(key_bytes) if key_bytes else 0)
        if header_entries:
            size += sum(len(h["key"]) + len(h["value"] or b"") + 8 for h in header_entries)
        if size > self._max_request_size:
            raise RecordTooLargeError(
                f"the record is about {size} bytes, larger than max_request_size "
                f"({self._max_request_size})"
            )
        ts = int(time.time() * 1000) if timestamp_ms is None else int(timestamp_ms)
        n = info.num_partitions
        if partition is not None:
            fixed: int | None = self._check_partition(info, partition)
        elif key_bytes is not None:
            fixed = partition_for_key(key_bytes, n)
        else:
            fixed = None
        future: concurrent.futures.Future[RecordMetadata] = concurrent.futures.Future()
        future.set_running_or_notify_cancel()
        with self._lock:
            self._wait_for_room(0)
            now = time.monotonic()
            p = fixed if fixed is not None else self._sticky.partition(topic, n)
            state = self._state(info, p)
            if state.open is not None and state.open.size + size > self._batch_size:
                self._seal(state)
                if fixed is None:
                    state = self._state(info, self._sticky.partition(topic, n))
            if state.open is None:
                state.open = _OpenBatch(now)
                state.open_id = next(self._ids)
                self._incomplete[state.open_id] = 0
                self._wakeup.notify()
            batch = state.open
            batch.keys.append(key_bytes)
            batch.values.append(stored_value)
            batch.timestamps.append(ts)
            batch.headers.append(header_entries)
            batch.sink.futures.append(future)
            batch.sink.callbacks.append(on_delivery)
            batch.sink.timestamps.append(ts)
            batch.size += size
            self._incomplete[state.open_id] += 1
            if batch.size >= self._batch_size:
                self._seal(state)
        return future

    def send_batch(
        self,
        topic: str,
        data: Any,
        *,
        partition: int | None = None,
        key_column: str | None = None,
    ) -> concurrent.futures.Future[SendBatchResult]:
        """Append a columnar batch of records: the fast path (no per-row Python objects).

        ``data`` is a pyarrow ``Table``/``RecordBatch`` or a pandas
        ``DataFrame`` whose columns are described in :func:`to_stored_batch`.
        Rows go to ``partition`` if given; else to the row's ``partition``
        column; else by key (``key_column``, default the ``key`` column) with
        Kafka's murmur2, vectorized; rows without a key go to the topic's
        sticky partition, and a keyless input is cut into ``batch_size``
        chunks spread round-robin over the partitions. Each partition's rows
        keep their input order and are cut into batches of at most
        ``batch_size`` bytes (a single larger row makes its own batch).

        Conversion and encoding run in the calling thread while the sender
        ships earlier batches; this call blocks while the buffer is full (up
        to ``max_block_ms``). The future holds a :class:`SendBatchResult`
        (base offset and count of every batch) or the first error. Batches are
        not atomic as a group (until transactions): some may be appended when
        the future fails.

        Raises synchronously for bad input (:class:`TypeError`,
        :class:`ValueError`, :class:`SchemaMismatchError`), unknown topics or
        partitions, and after :meth:`close`.
        """
        self._check_open()
        self._check_can_send()
        info = self._topic(topic)
        if partition is not None:
            self._check_partition(info, partition)
        n = info.num_partitions
        now_ms = int(time.time() * 1000)
        # Convert everything first, so that bad input fails before anything is queued.
        converted = [
            to_stored_batch(rb, info.schema, key_column=key_column, now_ms=now_ms)
            for rb in _input_batches(data)
            if rb.num_rows
        ]
        for _, parts in converted:
            if parts is not None and partition is None and len(parts):
                low, high = int(parts.min()), int(parts.max())
                if low < 0 or high >= n:
                    raise UnknownTopicOrPartitionError(
                        f"partition {low if low < 0 else high} of topic {topic!r} does not exist "
                        f"(it has {n} partitions)"
                    )
        call = _SendBatchCall()
        try:
            for stored, parts in converted:
                for p, chunk in self._route(info, stored, partition, parts):
                    self._enqueue_encoded(info, p, chunk, call)
        except LogstoreError as e:
            call.seal(e)
            return call.future
        call.seal()
        return call.future

    # ------------------------------------------------------------------ transactions

    def init_transactions(self) -> None:
        """Register the transactional id: fences older producers with the same id and aborts
        their open transaction. Call once, before the first transaction."""
        if self._transactional_id is None:
            raise InvalidTxnStateError("init_transactions() needs a Producer with a transactional_id")
        self._check_open()
        with self._txn_lock:
            pid, epoch = self._client.init_producer_id(
                self._transactional_id, transaction_timeout_ms=self._transaction_timeout_ms,
            )
            with self._lock:
                self._producer_id, self._producer_epoch = pid, epoch
                for state in self._partitions.values():
                    state.next_seq = 0
            self._in_transaction = False

    def begin_transaction(self) -> None:
        """Start a transaction: records sent until commit/abort belong to it."""
        if self._transactional_id is None or self._producer_id < 0:
            raise InvalidTxnStateError("call init_transactions() before begin_transaction()")
        if self._in_transaction:
            raise InvalidTxnStateError("a transaction is already open; commit or abort it first")
        self._txn_partitions = set()
        self._txn_error = None
        self._in_transaction = True

    def transaction_ref(self) -> TxnRef | None:
        """The open transaction as the broker knows it (None before it touched a partition)."""
        if not self._in_transaction or not self._txn_partitions or self._transactional_id is None:
            return None
        return TxnRef(self._transactional_id, self._producer_id, self._producer_epoch, self._txn_number)

    def prepare_transaction(self) -> TxnRef | None:
        """Flush and check the open transaction without ending it; return its reference.

        For writers whose transaction another process ends (the Spark sink's
        driver ends a micro-batch's transactions together).
        """
        self._finish_sends("prepare")
        return self.transaction_ref()

    def commit_transaction(self) -> None:
        """Flush, then commit: every record of the transaction becomes visible atomically."""
        self._finish_sends("commit")
        ref = self.transaction_ref()
        if ref is not None:
            self._client.end_txn(ref, commit=True)
        self._in_transaction = False

    def abort_transaction(self) -> None:
        """Flush, then abort: no record of the transaction ever becomes visible to read_committed."""
        if not self._in_transaction:
            raise InvalidTxnStateError("no transaction is open")
        self.flush()
        ref = self.transaction_ref()
        if ref is not None:
            self._client.end_txn(ref, commit=False)
        self._in_transaction = False

    def _finish_sends(self, what: str) -> None:
        if not self._in_transaction:
            raise InvalidTxnStateError(f"no transaction is open to {what}")
        self.flush()
        if self._txn_error is not None:
            raise InvalidTxnStateError(
                f"cannot {what} the transaction: a send failed ({self._txn_error}); abort it"
            )

    def _check_can_send(self) -> None:
        """Before queueing: a producer id for idempotence; an open transaction if transactional."""
        if self._transactional_id is not None:
            if not self._in_transaction:
                raise InvalidTxnStateError(
                    "a transactional producer sends inside a transaction: call begin_transaction()"
                )
            return
        if self._idempotent and self._producer_id < 0:
            with self._txn_lock:
                if self._producer_id < 0:
                    pid, epoch = self._client.init_producer_id("")
                    with self._lock:
                        self._producer_id, self._producer_epoch = pid, epoch

    def _encode_stored(self, stored: pa.RecordBatch, base_sequence: int) -> EncodedBatch:
        """Encode with this producer's id, epoch and (when idempotent) ``base_sequence``."""
        if not self._idempotent:
            return encode_batch(stored, base_offset=0, compression=self._compression)
        return encode_batch(
            stored, base_offset=0, compression=self._compression,
            producer_id=self._producer_id, producer_epoch=self._producer_epoch,
            base_sequence=base_sequence,
            attributes=ATTR_TRANSACTIONAL if self._transactional_id is not None else 0,
        )

    def flush(self, timeout: float | None = None) -> int:
        """Send every record queued so far and wait for their outcomes.

        Returns the number of those records still undelivered when ``timeout``
        seconds passed (0 = each was acknowledged or failed; see its future).
        """
        deadline = None if timeout is None else time.monotonic() + timeout
        with self._lock:
            if not self._incomplete:
                return 0
            last_id = max(self._incomplete)
            for state in self._partitions.values():
                self._seal(state)
            self._wakeup.notify()
            while True:
                waiting = [c for i, c in self._incomplete.items() if i <= last_id]
                if not waiting:
                    return 0
                remaining = None if deadline is None else deadline - time.monotonic()
                if remaining is not None and remaining <= 0:
                    return sum(waiting)
                self._changed.wait(remaining)

    def close(self, timeout: float | None = None) -> None:
        """Flush, then stop the sender and close the connection. Idempotent.

        Records not delivered within ``timeout`` seconds (None = no limit)
        fail with :class:`RequestTimedOutError`; :meth:`send` raises
        RuntimeError afterwards. An open transaction is left open, as Kafka's
        producer leaves it: another process may end it (the Spark sink's
        driver does), or the broker aborts it after ``transaction_timeout_ms``.
        """
        deadline = None if timeout is None else time.monotonic() + timeout
        with self._lock:
            first = not self._closing
            self._closing = True
        if first:
            self.flush(timeout)
            with self._lock:
                self._stopping = True
                self._stop_deadline = deadline
                self._wakeup.notify()
            self._client.close()  # cancels what is still in flight
        self._sender.join()

    # ------------------------------------------------------------------ internals: caller side

    def _check_open(self) -> None:
        if self._failure is not None:
            raise RuntimeError(f"the producer's sender thread failed: {self._failure!r}")
        if self._closing:
            raise RuntimeError("the producer is closed")

    def _wait_for_room(self, size: int) -> None:
        """Block until ``size`` more bytes fit in ``buffer_memory``. Caller holds the lock."""
        deadline = time.monotonic() + self._max_block_s
        while True:
            self._check_open()
            if not self._queued_bytes or self._queued_bytes + size <= self._buffer_memory:
                return
            remaining = deadline - time.monotonic()
            if remaining <= 0:
                raise RequestTimedOutError(
                    f"the producer buffer stayed full (buffer_memory={self._buffer_memory} bytes) "
                    f"for max_block_ms ({int(self._max_block_s * 1000)}); the broker is not keeping up"
                )
            self._changed.wait(remaining)

    def _topic(self, topic: str) -> _TopicInfo:
        info = self._topics.get(topic)
        if info is not None:
            return info
        with self._metadata_lock:
            info = self._topics.get(topic)
            if info is None:
                info = self._fetch_topic(topic)
                self._topics[topic] = info
            return info

    def _fetch_topic(self, topic: str) -> _TopicInfo:
        if not isinstance(topic, str) or not topic:
            raise TypeError(f"topic must be a non-empty str, got {topic!r}")
        md = self._client.metadata([topic], timeout_ms=max(1, int(self._max_block_s * 1000)))
        if topic in md.topic_errors:
            raise md.topic_errors[topic]
        desc = md.topics.get(topic)
        if desc is None or desc.num_partitions < 1:
            raise UnknownTopicOrPartitionError(f"topic {topic!r} does not exist")
        configs = self._client.describe_configs([topic]).get(topic)
        timestamp_type = configs.get("message.timestamp.type") if isinstance(configs, dict) else None
        return _TopicInfo(
            name=topic,
            num_partitions=desc.num_partitions,
            schema=desc.schema,
            value_schema=desc.value_schema,
            schema_message=encode_schema(desc.schema),
            value_type=desc.schema.field("value").type,
            value_names=frozenset(desc.value_schema.names if desc.value_schema is not None else ()),
            log_append_time=timestamp_type == "LogAppendTime",
        )

    def _forget_topic(self, topic: str) -> None:
        with self._metadata_lock:
            self._topics.pop(topic, None)

    @staticmethod
    def _check_partition(info: _TopicInfo, partition: int) -> int:
        if not isinstance(partition, int) or isinstance(partition, bool):
            raise TypeError(f"partition must be an int, got {type(partition).__name__}")
        if not 0 <= partition < info.num_partitions:
            raise UnknownTopicOrPartitionError(
                f"partition {partition} of topic {info.name!r} does not exist "
                f"(it has {info.num_partitions} partitions)"
            )
        return partition

    @staticmethod
    def _typed_value(info: _TopicInfo, value: object) -> dict[str, Any] | None:
        if value is None:
            return None
        assert info.value_schema is not None
        if not isinstance(value, Mapping):
            raise TypeError(
                f"values of typed topic {info.name!r} are dicts of its columns "
                f"{info.value_schema.names}, got {type(value).__name__}"
            )
        unknown = [k for k in value if k not in info.value_names]
        if unknown:
            raise SchemaMismatchError(
                f"value names unknown columns {unknown} of topic {info.name!r}; "
                f"its columns are {info.value_schema.names}"
            )
        for f in info.value_schema:
            if not f.nullable and value.get(f.name) is None:
                raise SchemaMismatchError(
                    f"value column {f.name!r} of topic {info.name!r} is NOT NULL but the record lacks it"
                )
        return dict(value)

    def _state(self, info: _TopicInfo, partition: int) -> _PartitionState:
        """The state of a partition, created on first use. Caller holds the lock."""
        tp = TopicPartition(info.name, partition)
        state = self._partitions.get(tp)
        if state is None:
            state = self._partitions[tp] = _PartitionState(info, partition)
        elif state.info is not info and state.open is None:
            state.info = info  # metadata was refreshed
        return state

    def _seal(self, state: _PartitionState) -> None:
        """Move the open batch of ``state`` to its queue. Caller holds the lock."""
        open_batch = state.open
        if open_batch is None:
            return
        state.open = None
        batch = _Batch(state.open_id, state.info, state.tp.partition, created=open_batch.created,
                       size=open_batch.size, count=len(open_batch.values))
        batch.records = open_batch
        batch.record_sink = open_batch.sink
        if self._idempotent:
            batch.base_sequence = state.next_seq
            state.next_seq = (state.next_seq + batch.count) % _SEQUENCE_MOD
        state.queue.append(batch)
        self._queued_bytes += batch.size
        self._sticky.on_new_batch(state.tp.topic, state.info.num_partitions, state.tp.partition)
        self._wakeup.notify()

    def _route(
        self,
        info: _TopicInfo,
        stored: pa.RecordBatch,
        partition: int | None,
        parts: np.ndarray | None,
    ) -> Iterable[tuple[int, pa.RecordBatch]]:
        """Yield ``(partition, chunk of at most batch_size bytes)`` for a converted batch."""
        n = info.num_partitions
        rows = stored.num_rows
        if partition is None and parts is None:
            keys = stored.column(2)
            if keys.null_count < rows:
                parts = partitions_for_keys(keys, n)
                if keys.null_count:
                    parts[parts < 0] = self._sticky.partition(info.name, n)
        if partition is not None or parts is None:
            # One partition, or no keys: round-robin chunks from the sticky partition.
            start = partition if partition is not None else self._sticky.partition(info.name, n)
            last = start
            for i, chunk in enumerate(self._chunks(stored)):
                last = start if partition is not None else (start + i) % n
                yield last, chunk
            if partition is None:
                self._sticky.on_new_batch(info.name, n, self._sticky.partition(info.name, n))
            return
        first = int(parts[0])
        if (parts == first).all():
            for chunk in self._chunks(stored):
                yield first, chunk
            return
        order = np.argsort(parts, kind="stable")
        sorted_parts = parts[order]
        cuts = np.flatnonzero(np.diff(sorted_parts)) + 1
        taken = stored.take(pa.array(order))
        bounds = [0, *cuts.tolist(), rows]
        for lo, hi in zip(bounds[:-1], bounds[1:], strict=True):
            for chunk in self._chunks(taken.slice(lo, hi - lo)):
                yield int(sorted_parts[lo]), chunk

    def _chunks(self, batch: pa.RecordBatch) -> Iterable[pa.RecordBatch]:
        rows = batch.num_rows
        if rows == 0:
            return
        per_row = max(1, batch.nbytes // rows)
        step = max(1, self._batch_size // per_row)
        for lo in range(0, rows, step):
            yield batch.slice(lo, min(step, rows - lo))

    def _enqueue_encoded(
        self, info: _TopicInfo, partition: int, chunk: pa.RecordBatch, call: _SendBatchCall
    ) -> None:
        if not self._idempotent:
            data = self._encode_stored(chunk, -1)
            self._check_request_size(info, chunk, data)
        with self._lock:
            self._wait_for_room(data.size if not self._idempotent else chunk.nbytes)
            state = self._state(info, partition)
            self._seal(state)  # records sent earlier with send() go first
            if self._idempotent:
                # Sequences follow queue order, so encode here, under the lock.
                data = self._encode_stored(chunk, state.next_seq)
                self._check_request_size(info, chunk, data)
                state.next_seq = (state.next_seq + chunk.num_rows) % _SEQUENCE_MOD
            batch = _Batch(next(self._ids), info, partition, created=time.monotonic(),
                           size=data.size, count=chunk.num_rows)
            batch.data = data
            batch.call = call
            batch.call_index = call.add()
            self._incomplete[batch.id] = batch.count
            state.queue.append(batch)
            self._queued_bytes += batch.size
            self._wakeup.notify()

    def _check_request_size(self, info: _TopicInfo, chunk: pa.RecordBatch, data: EncodedBatch) -> None:
        if data.size + len(info.schema_message) > self._max_request_size:
            raise RecordTooLargeError(
                f"a batch of {chunk.num_rows} records encodes to {data.size} bytes, more than "
                f"max_request_size ({self._max_request_size}); lower batch_size or raise "
                "max_request_size"
            )

    # ------------------------------------------------------------------ internals: sender thread

    def _run_sender(self) -> None:
        try:
            while True:
                with self._lock:
                    requests, expired = self._collect()
                    done = list(self._completed)
                    self._completed.clear()
                    if not requests and not expired and not done:
                        if self._stopping and (
                            not self._in_flight
                            or (self._stop_deadline is not None
                                and time.monotonic() >= self._stop_deadline)
                        ):
                            break
                        self._wakeup.wait(self._next_wakeup())
                        continue
                for batch, error in expired:
                    self._complete(batch, error=error)
                for request in requests:
                    self._send(request)
                for in_flight in done:
                    self._handle_response(*in_flight)
        except BaseException as e:  # never leave futures hanging
            log.exception("the producer's sender thread failed")
            self._failure = e
            self._fail_everything(UnknownServerError(f"the producer's sender thread failed: {e!r}"))
            raise
        self._fail_everything(
            RequestTimedOutError("the producer was closed before the record was delivered")
        )

    def _next_wakeup(self) -> float | None:
        """Seconds until a linger, a backoff or a delivery timeout ends (None = until notified)."""
        now = time.monotonic()
        times: list[float] = []
        if self._stopping and self._stop_deadline is not None:
            times.append(self._stop_deadline)
        for state in self._partitions.values():
            if state.open is not None:
                times.append(state.open.created + self._linger_s)
            if state.queue and not state.in_flight:
                times.append(max(state.retry_at, now))
                times.append(state.queue[0].created + self._delivery_timeout_s)
        if not times:
            return None
        return max(0.0, min(times) - now)

    def _collect(
        self,
    ) -> tuple[list[dict[TopicPartition, list[_Batch]]], list[tuple[_Batch, LogstoreError]]]:
        """Seal lingered batches, expire old ones, pick what to send. Caller holds the lock."""
        now = time.monotonic()
        expired: list[tuple[_Batch, LogstoreError]] = []
        requests: list[dict[TopicPartition, list[_Batch]]] = []
        current: dict[TopicPartition, list[_Batch]] = {}
        current_bytes = 0
        for state in self._partitions.values():
            if state.open is not None and (
                now - state.open.created >= self._linger_s or self._stopping
            ):
                self._seal(state)
            if self._stopping:
                while state.queue:
                    batch = state.queue.popleft()
                    self._queued_bytes -= batch.size
                    expired.append((batch, RequestTimedOutError(
                        f"the producer was closed before the batch for {batch.tp} was sent"
                    )))
                continue
            if state.in_flight or not state.queue or state.retry_at > now:
                continue
            while state.queue and now - state.queue[0].created >= self._delivery_timeout_s:
                batch = state.queue.popleft()
                self._queued_bytes -= batch.size
                expired.append((batch, RequestTimedOutError(
                    f"a batch of {batch.count} records for {batch.tp} expired: not delivered "
                    f"within delivery_timeout_ms ({int(self._delivery_timeout_s * 1000)}) "
                    f"after {batch.attempts} attempts"
                )))
            if not state.queue:
                continue
            picked: list[_Batch] = []
            picked_bytes = 0
            while state.queue and (
                not picked or picked_bytes + state.queue[0].size <= self._request_bytes
            ):
                batch = state.queue.popleft()
                picked.append(batch)
                picked_bytes += batch.size
            if current and current_bytes + picked_bytes > self._request_bytes:
                requests.append(current)
                current, current_bytes = {}, 0
            current[state.tp] = picked
            current_bytes += picked_bytes
            state.in_flight = True
        if current:
            requests.append(current)
        if expired:
            self._changed.notify_all()
        return requests, expired

    def _encode(self, batch: _Batch) -> None:
        """Turn a batch of ``send()`` records into a stored batch message (sender thread).

        Records whose values Arrow cannot convert to the topic's columns fail
        alone with :class:`SchemaMismatchError`; the rest are sent.
        """
        records = batch.records
        assert records is not None
        info = batch.info
        try:
            stored: pa.RecordBatch | None = _build(info, records, None)
        except (pa.ArrowException, TypeError, ValueError):
            good: list[int] = []
            for i in range(len(records.values)):
                try:
                    _build(info, records, [i])
                    good.append(i)
                except (pa.ArrowException, TypeError, ValueError) as e:
                    err = SchemaMismatchError(
                        f"record value does not fit the columns of topic {info.name!r}: {e}"
                    )
                    records.sink.futures[i].set_exception(err)
                    cb = records.sink.callbacks[i]
                    if cb is not None:
                        _run_callback(cb, err, None)
            sink = _RecordSink()
            sink.futures = [records.sink.futures[i] for i in good]
            sink.callbacks = [records.sink.callbacks[i] for i in good]
            sink.timestamps = [records.sink.timestamps[i] for i in good]
            batch.record_sink = sink
            batch.count = len(good)
            with self._lock:
                self._incomplete[batch.id] = len(good)
            stored = _build(info, records, good) if good else None
        batch.records = None
        if stored is None:
            batch.empty = True
        else:
            batch.data = self._encode_stored(stored, batch.base_sequence)

    def _join_transaction(self, request: dict[TopicPartition, list[_Batch]]) -> None:
        """Add the request's new partitions to the open transaction (sender thread).

        On failure the partitions' batches fail with the error and leave the request.
        """
        new = [tp for tp in request if tp not in self._txn_partitions]
        if not new:
            return
        ref = TxnRef(self._transactional_id or "", self._producer_id, self._producer_epoch, self._txn_number)
        try:
            self._txn_number = self._client.add_partitions_to_txn(ref, new)
            self._txn_partitions.update(new)
        except LogstoreError as e:
            for tp in new:
                batches = request.pop(tp)
                self._release(tp, batches, retry=False)
                for b in batches:
                    self._complete(b, error=e)

    def _send(self, request: dict[TopicPartition, list[_Batch]]) -> None:
        if self._transactional_id is not None:
            self._join_transaction(request)
        items: list[tuple[TopicPartition, list[bytes | memoryview]]] = []
        for tp, batches in list(request.items()):
            for batch in batches:
                if batch.data is None and not batch.empty:
                    self._encode(batch)
            kept = [b for b in batches if not b.empty]
            for b in batches:
                if b.empty:  # every record failed conversion and was reported
                    self._complete(b, error=None)
            if not kept:
                del request[tp]
                self._release(tp, [], retry=False)
                continue
            request[tp] = kept
            for b in kept:
                b.attempts += 1
            parts: list[bytes | memoryview] = [kept[0].info.schema_message]
            for b in kept:
                assert b.data is not None
                parts += (b.data.head, b.data.body)
            items.append((tp, parts))
        if not items:
            return
        try:
            future = self._client.produce_async(
                items, acks=self._acks, timeout_ms=self._request_timeout_ms
            )
        except (RuntimeError, ValueError):  # the client was closed under us
            future = concurrent.futures.Future()
            future.set_exception(
                RequestTimedOutError("the producer was closed before the batch was sent")
            )
        entry: _InFlight = (request, future)
        with self._lock:
            self._in_flight.append(entry)
        if self._acks == 0:
            # Nothing will be waited for: report success as soon as the request is out.
            for batches in request.values():
                for b in batches:
                    self._report(b, None)

        def on_done(_: concurrent.futures.Future[list[ProducedPartition]]) -> None:
            with self._lock:
                self._completed.append(entry)
                self._wakeup.notify()

        future.add_done_callback(on_done)

    def _handle_response(
        self,
        request: dict[TopicPartition, list[_Batch]],
        future: concurrent.futures.Future[list[ProducedPartition]],
    ) -> None:
        with self._lock:
            self._in_flight = [e for e in self._in_flight if e[1] is not future]
        results: dict[TopicPartition, ProducedPartition | LogstoreError]
        try:
            results = {TopicPartition(r.topic, r.partition): r for r in future.result()}
        except LogstoreError as e:
            results = dict.fromkeys(request, e)
        except Exception as e:
            results = dict.fromkeys(request, UnknownServerError(f"produce failed: {e!r}"))
        for tp, batches in request.items():
            outcome = results.get(tp)
            if outcome is None:
                outcome = UnknownServerError(f"the broker's produce answer has no entry for {tp}")
            elif isinstance(outcome, ProducedPartition):
                if outcome.error is not None:
                    outcome = outcome.error
                elif len(outcome.base_offsets) != len(batches):
                    outcome = UnknownServerError(
                        f"the broker returned {len(outcome.base_offsets)} base offsets for "
                        f"{len(batches)} batches sent to {tp}"
                    )
            if isinstance(outcome, ProducedPartition):
                self._release(tp, batches, retry=False)
                for b, base in zip(batches, outcome.base_offsets, strict=True):
                    # Brokers may report an append time for CreateTime topics too: ignore it there.
                    append_time = outcome.log_append_time_ms if b.info.log_append_time else -1
                    self._complete(b, error=None, base_offset=base, append_time_ms=append_time)
                continue
            if self._acks == 0:
                log.warning("acks=0 produce to %s failed: %s", tp, outcome)
                self._release(tp, batches, retry=False)
                for b in batches:
                    self._complete(b, error=outcome)
                continue
            if isinstance(outcome, UnknownTopicOrPartitionError):
                self._forget_topic(tp.topic)
            now = time.monotonic()
            retry = (
                outcome.retriable
                and not self._stopping
                and all(b.attempts <= self._retries for b in batches)
                and all(
                    now + self._retry_backoff_s - b.created < self._delivery_timeout_s
                    for b in batches
                )
            )
            self._release(tp, batches, retry=retry)
            if retry:
                log.info("retrying %d batches for %s after %s", len(batches), tp, outcome)
            else:
                for b in batches:
                    self._complete(b, error=outcome)

    def _release(self, tp: TopicPartition, batches: list[_Batch], *, retry: bool) -> None:
        """End the in-flight state of ``tp``; on retry put ``batches`` back at the queue's head."""
        with self._lock:
            state = self._partitions[tp]
            state.in_flight = False
            if retry:
                state.queue.extendleft(reversed(batches))
                state.retry_at = time.monotonic() + self._retry_backoff_s
            else:
                for b in batches:
                    self._queued_bytes -= b.size
            self._changed.notify_all()
            self._wakeup.notify()

    @staticmethod
    def _report(
        batch: _Batch, error: LogstoreError | None, base_offset: int = -1, append_time_ms: int = -1
    ) -> None:
        """Complete the batch's futures and callbacks, once. Never called under the lock."""
        if batch.reported:
            return
        batch.reported = True
        if error is None:
            batch.succeed(base_offset, append_time_ms)
        else:
            batch.fail(error)

    def _complete(
        self,
        batch: _Batch,
        *,
        error: LogstoreError | None,
        base_offset: int = -1,
        append_time_ms: int = -1,
    ) -> None:
        """Report a batch's outcome, then stop counting it as pending."""
        if error is not None and self._transactional_id is not None:
            self._txn_error = self._txn_error or error
        self._report(batch, error, base_offset, append_time_ms)
        with self._lock:
            self._incomplete.pop(batch.id, None)
            self._changed.notify_all()

    def _fail_everything(self, error: LogstoreError) -> None:
        """Fail every batch not yet reported (when the sender exits)."""
        with self._lock:
            leftovers: list[_Batch] = []
            for state in self._partitions.values():
                self._seal(state)
                leftovers.extend(state.queue)
                state.queue.clear()
            for request, _ in self._in_flight:
                for batches in request.values():
                    leftovers.extend(batches)
            self._in_flight.clear()
            self._queued_bytes = 0
        for batch in leftovers:
            self._report(batch, error)
        with self._lock:
            self._incomplete.clear()
            self._changed.notify_all()


def _build(info: _TopicInfo, records: _OpenBatch, rows: list[int] | None) -> pa.RecordBatch:
    """The stored batch of ``records`` (all, or the given rows)."""

    def pick(xs: list[Any]) -> list[Any]:
        return xs if rows is None else [xs[i] for i in rows]

    headers = pick(records.headers)
    values = pick(records.values)
    return build_batch(
        info.schema,
        values=pa.array(values, info.value_type),
        timestamps_ms=np.asarray(pick(records.timestamps), dtype=np.int64),
        keys=pick(records.keys),
        headers=_null_headers(len(values)) if all(h is None for h in headers) else headers,
    )
