"""Filter pushdown's pieces without Spark or a broker (:mod:`spark_source.pushdown`,
:func:`spark_source.planner.narrow_positions`), each against a simple model:
SQL's three-valued logic written out in Python, and "every kept value lies in the bounds"."""

from __future__ import annotations

import datetime as dt
from collections.abc import Mapping

import pyarrow as pa
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
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

from logstore.errors import LogstoreError
from logstore.types import ListedOffset, TopicPartition
from spark_source.options import parse_source_options
from spark_source.planner import narrow_positions
from spark_source.pushdown import (
    accepts,
    keeps_partition,
    offset_bounds,
    row_filters,
    row_mask,
    timestamp_floor_ms,
)
from spark_source.rows import OutputShape

UTC = dt.timezone.utc
SCHEMA = pa.schema([("key", pa.binary()), ("n", pa.int64()), ("s", pa.string()), ("b", pa.bool_()),
                    ("timestamp", pa.timestamp("us", tz="UTC"))])
T0 = dt.datetime(2024, 1, 1, tzinfo=UTC)


# ---------------------------------------------------------------- what is accepted


@pytest.mark.parametrize(("f", "ok"), [
    (EqualTo(("key",), b"a"), True),
    (Not(In(("n",), [1, 2])), True),
    (In(("n",), [1, None]), False),                               # NULL in IN: left to Spark
    (EqualTo(("n",), 1.5), False),                                # not the column's type
    (EqualTo(("n",), True), False),
    (EqualTo(("n",), 1 << 70), False),                            # does not fit the column
    (GreaterThan(("x",), 1), False),                              # no such column
    (EqualTo(("s", "inner"), "a"), False),                        # nested
    (StringStartsWith(("s",), "a"), True),
    (StringStartsWith(("key",), "a"), False),                     # LIKE on binary
    (GreaterThan(("timestamp",), T0), True),
    (GreaterThan(("timestamp",), T0.replace(tzinfo=None)), False),  # a TIMESTAMP_NTZ literal
    (IsNull(("timestamp",)), True),
])
def test_accepts_only_what_it_evaluates_exactly(f: Filter, ok: bool) -> None:
    assert accepts(f, SCHEMA) is ok


def test_floating_point_columns_stay_with_spark() -> None:
    schema = pa.schema([("x", pa.float64())])
    assert not accepts(GreaterThan(("x",), 1.0), schema)
    assert not accepts(EqualTo(("x",), 1.0), schema)
    assert accepts(IsNotNull(("x",)), schema)


def test_the_untyped_output_shape_pushes_its_columns() -> None:
    arrow = OutputShape(None, include_headers=False).arrow
    assert accepts(EqualTo(("key",), b"k"), arrow)
    assert accepts(GreaterThanOrEqual(("timestamp",), T0), arrow)
    assert accepts(In(("partition",), [0, 1]), arrow)
    assert not accepts(IsNull(("headers",)), arrow)  # not in the shape without includeHeaders


# ---------------------------------------------------------------- row masks against SQL's logic


def _model(f: Filter, row: Mapping[str, object]) -> bool | None:
    """SQL's three-valued result of ``f`` on one row (None = NULL)."""
    if isinstance(f, Not):
        inner = _model(f.child, row)
        return None if inner is None else not inner
    v = row[f.attribute[0]]  # type: ignore[attr-defined]
    if isinstance(f, IsNull):
        return v is None
    if isinstance(f, IsNotNull):
        return v is not None
    if isinstance(f, EqualNullSafe):
        return v == f.value
    if v is None:
        return None
    value = f.value  # type: ignore[attr-defined]
    if isinstance(f, In):
        return v in value
    ops = {EqualTo: lambda: v == value, GreaterThan: lambda: v > value, GreaterThanOrEqual: lambda: v >= value,
           LessThan: lambda: v < value, LessThanOrEqual: lambda: v <= value,
           StringStartsWith: lambda: v.startswith(value), StringEndsWith: lambda: v.endswith(value),
           StringContains: lambda: value in v}
    return bool(ops[type(f)]())


_keys = st.sampled_from([None, b"", b"a", b"ab", b"b", b"\xff"])
_ns = st.one_of(st.none(), st.integers(-3, 3))
_ss = st.sampled_from([None, "", "eu", "east", "us", "é"])
_bs = st.sampled_from([None, True, False])
_ts = st.one_of(st.none(), st.integers(-2, 2).map(lambda ms: T0 + dt.timedelta(microseconds=ms)))
_values = {"key": _keys, "n": _ns, "s": _ss, "b": _bs, "timestamp": _ts}


@st.composite
def filters(draw: st.DrawFn) -> Filter:
    column = draw(st.sampled_from(sorted(_values)))
    literal = _values[column].filter(lambda v: v is not None)
    kinds: list[type] = [EqualTo, EqualNullSafe, GreaterThan, GreaterThanOrEqual, LessThan, LessThanOrEqual,
                         In, IsNull, IsNotNull]
    if column == "s":
        kinds += [StringStartsWith, StringEndsWith, StringContains]
    kind = draw(st.sampled_from(kinds))
    if kind in (IsNull, IsNotNull):
        f: Filter = kind((column,))
    elif kind is In:
        f = In((column,), draw(st.lists(literal, max_size=3)))
    else:
        f = kind((column,), draw(literal))
    return Not(f) if draw(st.booleans()) else f


@settings(max_examples=300, deadline=None)
@given(rows=st.lists(st.fixed_dictionaries(_values), min_size=1, max_size=8),
       fs=st.lists(filters(), min_size=1, max_size=3))
def test_row_mask_keeps_exactly_the_rows_sql_keeps(rows: list[dict[str, object]], fs: list[Filter]) -> None:
    assert all(accepts(f, SCHEMA) for f in fs)
    batch = pa.RecordBatch.from_pylist(rows, schema=SCHEMA)
    kept = batch.filter(row_mask(fs, batch)).to_pylist()
    want = [r for r in rows if all(_model(f, r) is True for f in fs)]
    assert kept == want


def test_row_filters_leave_out_what_planning_decides() -> None:
    fs = [EqualTo(("partition",), 1), In(("topic",), ["a"]), EqualTo(("timestampType",), 0), EqualTo(("key",), b"k")]
    assert row_filters(fs) == (fs[3],)
    assert keeps_partition(fs, topic="a", partition=1, timestamp_type=0)
    assert not keeps_partition(fs, topic="a", partition=2, timestamp_type=0)
    assert not keeps_partition(fs, topic="b", partition=1, timestamp_type=0)
    assert not keeps_partition(fs, topic="a", partition=1, timestamp_type=1)
    assert not keeps_partition([Not(EqualTo(("partition",), 1))], topic="a", partition=1, timestamp_type=0)


# ---------------------------------------------------------------- bounds never exclude a match


_offset_filters = st.one_of(
    st.builds(lambda k, v: k(("offset",), v),
              st.sampled_from([EqualTo, EqualNullSafe, GreaterThan, GreaterThanOrEqual, LessThan, LessThanOrEqual]),
              st.integers(-2, 30)),
    st.builds(lambda vs: In(("offset",), vs), st.lists(st.integers(-2, 30), max_size=3)),
    st.builds(lambda v: Not(EqualTo(("offset",), v)), st.integers(0, 30)),
)


@settings(max_examples=300, deadline=None)
@given(fs=st.lists(_offset_filters, min_size=1, max_size=3))
def test_offset_bounds_hold_every_matching_offset(fs: list[Filter]) -> None:
    low, high = offset_bounds(fs)
    for offset in range(0, 40):
        if all(_model(f, {"offset": offset}) for f in fs):
            assert (low is None or offset >= low) and (high is None or offset < high), (offset, low, high)


@settings(max_examples=300, deadline=None)
@given(kind=st.sampled_from([GreaterThan, GreaterThanOrEqual, EqualTo, In]),
       micros=st.integers(-5_000, 5_000), stored_ms=st.integers(-10, 10))
def test_timestamp_floor_is_the_least_stored_millisecond_that_can_match(kind: type, micros: int, stored_ms: int) -> None:
    v = T0 + dt.timedelta(microseconds=micros)
    f = In(("timestamp",), [v]) if kind is In else kind(("timestamp",), v)
    floor = timestamp_floor_ms([f])
    base_ms = int(T0.timestamp()) * 1000
    m = base_ms + stored_ms
    record = T0 + dt.timedelta(milliseconds=stored_ms)
    matches = _model(f, {"timestamp": record})
    assert floor is not None
    if matches:
        assert m >= floor
    if kind in (GreaterThan, GreaterThanOrEqual):  # the floor is tight: it is the least match
        assert (m >= floor) == bool(matches)


def test_upper_bounds_and_negations_give_no_timestamp_floor() -> None:
    assert timestamp_floor_ms([LessThan(("timestamp",), T0), Not(GreaterThan(("timestamp",), T0))]) is None


# ---------------------------------------------------------------- narrowing the planned offsets


class FakeOffsets:
    """ListOffsets by timestamp answered from a table of (offset, timestamp ms) per partition."""

    def __init__(self, records: Mapping[TopicPartition, list[int]]) -> None:
        self.records = records
        self.asked: dict[TopicPartition, int] = {}

    def list_offsets(self, timestamps: Mapping[TopicPartition, int], *, isolation_level: str) -> dict[TopicPartition, ListedOffset | LogstoreError]:
        self.asked.update(timestamps)
        out: dict[TopicPartition, ListedOffset | LogstoreError] = {}
        for tp, t in timestamps.items():
            hit = next((o for o, ts in enumerate(self.records[tp]) if ts >= t), None)
            out[tp] = ListedOffset(hit, -1 if hit is None else self.records[tp][hit])
        return out


def test_narrow_positions_cuts_by_partition_offsets_and_timestamp_floor() -> None:
    a0, a1, a2 = (TopicPartition("a", p) for p in range(3))
    fake = FakeOffsets({a0: [5, 1, 9, 2, 7, 3], a1: [1, 2, 3, 4, 5, 6], a2: [0] * 6})
    opts = parse_source_options({"subscribe": "a", "logstore.bootstrap.servers": "127.0.0.1:1"}, streaming=False)
    start, end = narrow_positions(fake, {a0: 0, a1: 1, a2: 0}, {a0: 6, a1: 6, a2: 6}, opts,  # type: ignore[arg-type]
                                  keep=lambda tp: tp.partition < 2, offsets=(1, 5), timestamp_floor_ms=4)
    # a0: first timestamp >= 4 is at offset 0, below the offset bound 1; a1: at offset 3; a2 not kept.
    assert (start, end) == ({a0: 1, a1: 3}, {a0: 5, a1: 5})
    start, end = narrow_positions(fake, {a0: 0, a1: 0}, {a0: 6, a1: 6}, opts,  # type: ignore[arg-type]
                                  keep=lambda tp: True, offsets=(None, None), timestamp_floor_ms=8)
    assert (start, end) == ({a0: 2, a1: 6}, {a0: 6, a1: 6})  # a1: no record that recent: empty
    fake.asked.clear()
    start, end = narrow_positions(fake, {a0: 4}, {a0: 6}, opts,  # type: ignore[arg-type]
                                  keep=lambda tp: True, offsets=(10, 12), timestamp_floor_ms=1)
    assert (start, end) == ({a0: 6}, {a0: 6}) and fake.asked == {}  # never widens; empty asks nothing


# ---------------------------------------------------------------- the option


def test_push_filters_option() -> None:
    def parse(**extra: str):  # type: ignore[no-untyped-def]
        return parse_source_options({"subscribe": "a", "logstore.bootstrap.servers": "127.0.0.1:1", **extra},
                                    streaming=False)

    assert parse().push_filters is True
    assert parse(pushfilters="FALSE").push_filters is False
    with pytest.raises(LogstoreError, match="pushFilters must be true or false"):
        parse(pushfilters="sometimes")
