"""Filter pushdown of batch reads: which of Spark's filters the source takes, and what it does with them.

Spark (``DataSourceReader.pushFilters``, with ``spark.sql.python.filterPushdown.enabled``,
which :func:`spark_source.register` turns on) offers the conjuncts of a query's
``WHERE`` as :class:`pyspark.sql.datasource.Filter` values. The rule: **a pushed
filter never drops a row that matches**, and a filter the source does not evaluate
exactly is handed back to Spark. So a filter is pushed (:func:`accepts`) only when
:func:`row_mask` can evaluate it exactly, with Spark's semantics, on the source's
output columns:

* filters: ``=``, ``<=>``, ``<``, ``<=``, ``>``, ``>=``, ``IN``, ``IS [NOT] NULL``,
  ``NOT`` of any of these, and ``LIKE 'abc%'`` / ``'%abc'`` / ``'%abc%'`` on strings;
* on top-level columns of type integer, string, binary, boolean, timestamp (with time
  zone) and date, with a literal of the column's Python type and no null in an ``IN``
  list (``IS [NOT] NULL`` on any column). Floating point (NaN orders above everything in
  Spark, below nothing in Arrow) and decimals stay with Spark;
* SQL's three-valued logic as Arrow's Kleene kernels: a comparison with null is null,
  ``NOT null`` is null, and a row whose mask is null is dropped, as Spark's ``WHERE``
  drops it.

What pushed filters do:

* ``topic``, ``partition`` and ``timestampType`` are the same for every row of a
  partition: :func:`keeps_partition` evaluates those filters once per partition when the
  read is planned, and partitions that fail are not read at all (exact);
* ``offset`` comparisons narrow each partition's planned range (:func:`offset_bounds`,
  exact for ``=``, ``<``, ``<=``, ``>``, ``>=``; ``IN`` narrows to its smallest and
  largest offset);
* ``timestamp >= t`` / ``> t`` / ``= t`` / ``IN`` move each partition's start to the
  first offset whose record's timestamp is at least the bound (:func:`timestamp_floor_ms`,
  resolved with the broker's ListOffsets by timestamp: the time index promises that every
  record *before* that offset is older). An upper bound cannot cut the range: with
  CreateTime, timestamps are not monotone within a partition and the log keeps no
  per-batch minimum timestamp;
* every pushed filter on another column (and on ``offset`` and ``timestamp``, since a
  narrowed range still holds non-matching rows) is evaluated by :func:`row_mask` on each
  Arrow batch in the Spark task, with ``pyarrow.compute``, before the batch goes to Spark.

Thread-safety: pure functions over immutable values.
"""

from __future__ import annotations

import datetime as dt
from collections.abc import Iterable, Sequence
from typing import Any

import pyarrow as pa
import pyarrow.compute as pc
from pyspark.sql.datasource import (
    EqualNullSafe,
    EqualTo,
    Filter,
    GreaterThan,
    GreaterThanOrEqual,
    In,
    IsNotNull,
    IsNull,
    LessThan,
    LessThanOrEqual,
    Not,
    StringContains,
    StringEndsWith,
    StringStartsWith,
)

__all__ = [
    "PARTITION_COLUMNS",
    "accepts",
    "column_of",
    "keeps_partition",
    "offset_bounds",
    "row_filters",
    "row_mask",
    "timestamp_floor_ms",
]

PARTITION_COLUMNS = ("topic", "partition", "timestampType")
"""Columns whose value is the same for every row of a partition: filtered when planning."""

_COMPARISONS = {
    EqualTo: pc.equal,
    GreaterThan: pc.greater,
    GreaterThanOrEqual: pc.greater_equal,
    LessThan: pc.less,
    LessThanOrEqual: pc.less_equal,
}
_STRING_MATCHES = {
    StringStartsWith: pc.starts_with,
    StringEndsWith: pc.ends_with,
    StringContains: pc.match_substring,
}
_NULL_TESTS = (IsNull, IsNotNull)
_NULL_BOOL = pa.scalar(None, pa.bool_())


def column_of(f: Filter) -> str:
    """The (top-level) column a filter reads; ``Not`` reads its child's."""
    while isinstance(f, Not):
        f = f.child
    path = f.attribute  # type: ignore[attr-defined]
    return ".".join(path)


def _literal_fits(value: Any, t: pa.DataType) -> bool:
    """Whether ``value`` (as Spark hands it) is a literal of a column of type ``t``."""
    if value is None:
        return False
    if pa.types.is_integer(t):
        ok = isinstance(value, int) and not isinstance(value, bool)
    elif pa.types.is_boolean(t):
        ok = isinstance(value, bool)
    elif pa.types.is_string(t) or pa.types.is_large_string(t):
        ok = isinstance(value, str)
    elif pa.types.is_binary(t) or pa.types.is_large_binary(t):
        ok = isinstance(value, (bytes, bytearray))
    elif pa.types.is_timestamp(t):
        # Spark's TIMESTAMP (with time zone): an aware datetime; TIMESTAMP_NTZ stays with Spark.
        ok = t.tz is not None and isinstance(value, dt.datetime) and value.tzinfo is not None
    elif pa.types.is_date32(t):
        ok = isinstance(value, dt.date) and not isinstance(value, dt.datetime)
    else:
        return False
    if not ok:
        return False
    try:
        pa.scalar(value, type=t)
    except (pa.ArrowInvalid, pa.ArrowTypeError, OverflowError, TypeError, ValueError):
        return False
    return True


def accepts(f: Filter, schema: pa.Schema) -> bool:
    """Whether :func:`row_mask` evaluates ``f`` exactly on batches of ``schema``."""
    if isinstance(f, Not):
        return accepts(f.child, schema)
    path = getattr(f, "attribute", None)
    if not isinstance(path, tuple) or len(path) != 1 or path[0] not in schema.names:
        return False
    t = schema.field(path[0]).type
    if isinstance(f, _NULL_TESTS):
        return True
    if isinstance(f, tuple(_STRING_MATCHES)):
        return (pa.types.is_string(t) or pa.types.is_large_string(t)) and isinstance(f.value, str)  # type: ignore[attr-defined]
    if isinstance(f, In):
        return isinstance(f.value, (list, tuple)) and all(_literal_fits(v, t) for v in f.value)
    if isinstance(f, (EqualNullSafe, *_COMPARISONS)):
        return _literal_fits(f.value, t)  # type: ignore[attr-defined]
    return False


def _mask_of(f: Filter, batch: pa.RecordBatch) -> pa.ChunkedArray | pa.Array:
    if isinstance(f, Not):
        return pc.invert(_mask_of(f.child, batch))
    col = batch.column(f.attribute[0])  # type: ignore[attr-defined]
    if isinstance(f, IsNull):
        return pc.is_null(col)
    if isinstance(f, IsNotNull):
        return pc.is_valid(col)
    if isinstance(f, In):
        found = pc.is_in(col, value_set=pa.array(list(f.value), col.type))
        return pc.if_else(pc.is_valid(col), found, _NULL_BOOL)  # null IN (...) is null
    if isinstance(f, EqualNullSafe):
        return pc.fill_null(pc.equal(col, pa.scalar(f.value, col.type)), False)
    for kind, match in _STRING_MATCHES.items():
        if isinstance(f, kind):
            return match(col, pattern=f.value)  # type: ignore[attr-defined]
    compare = _COMPARISONS[type(f)]
    return compare(col, pa.scalar(f.value, col.type))  # type: ignore[attr-defined]


def row_mask(filters: Sequence[Filter], batch: pa.RecordBatch) -> pa.Array | None:
    """The rows of ``batch`` that every filter keeps (null = dropped), or None for no filter."""
    mask = None
    for f in filters:
        m = _mask_of(f, batch)
        mask = m if mask is None else pc.and_kleene(mask, m)
    return mask


def row_filters(filters: Iterable[Filter]) -> tuple[Filter, ...]:
    """The pushed filters a task evaluates on its batches (all but :data:`PARTITION_COLUMNS`')."""
    return tuple(f for f in filters if column_of(f) not in PARTITION_COLUMNS)


def keeps_partition(filters: Iterable[Filter], *, topic: str, partition: int, timestamp_type: int) -> bool:
    """Whether a partition's rows can pass the filters on :data:`PARTITION_COLUMNS` (exact)."""
    mine = [f for f in filters if column_of(f) in PARTITION_COLUMNS]
    if not mine:
        return True
    row = pa.RecordBatch.from_pydict(
        {"topic": [topic], "partition": [partition], "timestampType": [timestamp_type]},
        schema=pa.schema([("topic", pa.string()), ("partition", pa.int32()), ("timestampType", pa.int32())]),
    )
    mask = row_mask(mine, row)
    return mask is not None and mask[0].as_py() is True


def offset_bounds(filters: Iterable[Filter]) -> tuple[int | None, int | None]:
    """``[low, high)`` that every offset a filter keeps lies in (None: unbounded)."""
    low: int | None = None
    high: int | None = None

    def raise_low(v: int) -> None:
        nonlocal low
        low = v if low is None else max(low, v)

    def cut_high(v: int) -> None:
        nonlocal high
        high = v if high is None else min(high, v)

    for f in filters:
        if isinstance(f, Not) or column_of(f) != "offset":
            continue
        if isinstance(f, (EqualTo, EqualNullSafe)):
            raise_low(f.value)
            cut_high(f.value + 1)
        elif isinstance(f, In):
            if not f.value:
                raise_low(0)
                cut_high(0)
            else:
                raise_low(min(f.value))
                cut_high(max(f.value) + 1)
        elif isinstance(f, GreaterThan):
            raise_low(f.value + 1)
        elif isinstance(f, GreaterThanOrEqual):
            raise_low(f.value)
        elif isinstance(f, LessThan):
            cut_high(f.value)
        elif isinstance(f, LessThanOrEqual):
            cut_high(f.value + 1)
    return low, high


_MICROS = pa.timestamp("us", tz="UTC")


def _micros(value: dt.datetime) -> int:
    return int(pa.scalar(value, type=_MICROS).value)


def timestamp_floor_ms(filters: Iterable[Filter]) -> int | None:
    """The smallest record timestamp (ms, as stored) that the ``timestamp`` filters keep, if bounded.

    Spark's ``timestamp`` is in microseconds, the log's in milliseconds: a stored ``m``
    passes ``timestamp >= v`` iff ``m * 1000 >= v``, i.e. ``m >= ceil(v / 1000)``, and
    ``timestamp > v`` iff ``m >= floor(v / 1000) + 1``.
    """
    floor: int | None = None
    for f in filters:
        if isinstance(f, Not) or column_of(f) != "timestamp":
            continue
        if isinstance(f, (EqualTo, EqualNullSafe, GreaterThanOrEqual)):
            ms = -(-_micros(f.value) // 1000)
        elif isinstance(f, GreaterThan):
            ms = _micros(f.value) // 1000 + 1
        elif isinstance(f, In) and f.value:
            ms = -(-min(_micros(v) for v in f.value) // 1000)
        else:
            continue
        floor = ms if floor is None else max(floor, ms)
    return floor
