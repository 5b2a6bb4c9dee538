"""Arrow input conversion: what the producer is given, as the stored schema.

Two paths lead to a stored batch (the schema of :mod:`logstore.record`:
``offset``, ``timestamp``, ``key``, ``value``, ``headers``):

* columnar (:meth:`Producer.send_batch`): :func:`to_stored_batch` converts a
  pyarrow ``RecordBatch`` column by column (no per-row Python work except for
  ``headers`` inputs Arrow cannot cast); :func:`input_batches` accepts a
  ``Table``, a ``RecordBatch`` or a pandas ``DataFrame``;
* per record (:meth:`Producer.send`): :func:`to_bytes`,
  :func:`header_entries` and :func:`typed_value` check and normalise one
  record's key, headers and value in the caller's thread (so bad input raises
  synchronously); :func:`records_to_batch` later builds the stored batch of a
  sealed batch's records on the sender thread.

Errors: :class:`TypeError` for a value of the wrong Python or Arrow type,
:class:`ValueError` for unknown or duplicate input columns (data is never
dropped silently), :class:`SchemaMismatchError` for values that do not fit a
typed topic's columns. Offsets of a stored batch are placeholders (zeros):
the broker assigns them.

Thread-safety: pure functions of their arguments.
"""

from __future__ import annotations

import functools
import time
from collections.abc import Mapping
from typing import Any, Protocol

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from logstore.client.producer.metadata import TopicInfo
from logstore.errors import SchemaMismatchError
from logstore.record import HEADERS_TYPE, TIMESTAMP_TYPE, build_batch, value_schema_of


class AppendedRecords(Protocol):
    """Records appended one by one with ``send()``, column by column (the accumulator's open batch)."""

    keys: list[bytes | None]
    values: list[Any]
    timestamps: list[int]
    headers: list[list[dict[str, Any]] | None]

__all__ = [
    "to_stored_batch",
    "input_batches",
    "to_bytes",
    "header_entries",
    "typed_value",
    "typed_value_size",
    "null_headers",
    "records_to_batch",
]

_RESERVED_COLUMNS = ("key", "timestamp", "headers", "partition")


# --------------------------------------------------------------------------- columnar conversion (send_batch)


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


def null_headers(n: int) -> pa.Array:
    """``n`` null header lists with an empty child.

    ``pa.nulls(n, HEADERS_TYPE)`` gives its children length ``n`` too, which
    costs ~12 bytes per record on the wire and on disk, and a slice of it is
    written whole by the IPC writer. Small sizes are built once (arrays are
    immutable): at a low rate every request is a batch of a few ``send()``
    records, and building this array was a sixth of the sender's CPU.
    """
    return _small_null_headers(n) if n <= 64 else _null_headers(n)


@functools.lru_cache(maxsize=64)
def _small_null_headers(n: int) -> pa.Array:
    return _null_headers(n)


def _null_headers(n: int) -> pa.Array:
    offsets = pa.array(np.zeros(n + 1, dtype=np.int32))
    empty = pa.array([], HEADERS_TYPE.value_type)
    return pa.ListArray.from_arrays(offsets, empty, type=HEADERS_TYPE, mask=pa.array(np.ones(n, dtype=bool)))


def _as_headers(arr: pa.Array | None, n: int) -> pa.Array:
    if arr is None or pa.types.is_null(arr.type):
        return null_headers(n)
    if arr.type == HEADERS_TYPE:
        return arr
    try:
        return arr.cast(HEADERS_TYPE)
    except (pa.ArrowInvalid, pa.ArrowNotImplementedError, pa.ArrowTypeError):
        pass
    # Per-row fallback for inputs Arrow cannot cast (e.g. pandas lists of tuples).
    return pa.array([header_entries(h) for h in arr.to_pylist()], HEADERS_TYPE)


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


def input_batches(data: Any) -> list[pa.RecordBatch]:
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


# --------------------------------------------------------------------------- per-record conversion (send)


def to_bytes(value: object, what: str) -> bytes | None:
    if value is None or isinstance(value, bytes):
        return value
    if isinstance(value, str):
        return value.encode()
    if isinstance(value, (bytearray, memoryview)):
        return bytes(value)
    raise TypeError(f"{what} must be bytes, str or None, got {type(value).__name__}")


def header_entries(headers: Any) -> list[dict[str, Any]] | None:
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
        out.append({"key": k, "value": to_bytes(v, f"header {k!r}")})
    return out


def typed_value_size(value: Mapping[str, Any]) -> int:
    size = 0
    for v in value.values():
        size += len(v) if isinstance(v, (bytes, str)) else 8
    return size


def typed_value(info: TopicInfo, value: object) -> dict[str, Any] | None:
    """Check a ``send()`` value for a typed topic: a dict naming only its value
    columns and every NOT NULL one; return a copy (None stays None, a tombstone)."""
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


def records_to_batch(info: TopicInfo, records: AppendedRecords, rows: list[int] | None) -> pa.RecordBatch:
    """The stored batch of the records appended with ``send()`` (all, or the given rows)."""

    def pick(xs: list[Any]) -> list[Any]:
        return xs if rows is None else [xs[i] for i in rows]

    headers = pick(records.headers)
    values = pick(records.values)
    return build_batch(
        info.schema,
        values=pa.array(values, info.value_type),
        timestamps_ms=np.asarray(pick(records.timestamps), dtype=np.int64),
        keys=pick(records.keys),
        headers=null_headers(len(values)) if headers.count(None) == len(headers) else headers,
    )
