"""JSON values into a typed topic's columns (logstore.broker.kafka.json_produce), no network.

The decoder has two paths: pyarrow's JSON reader over the whole batch (vectorized) and the
reference rules, value by value, which also name the bad values. The model here is
:mod:`logstore.broker.kafka.json_values` (what a Kafka consumer of a typed topic reads):
decoding its JSON gives the rows back, by either path, and each kind of unfit value is
refused with its index and a reason.
"""

from __future__ import annotations

import datetime
import decimal
import json
import math
from typing import Any

import pyarrow as pa
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from logstore.broker.kafka import json_produce
from logstore.broker.kafka.json_produce import RecordsRefused, decode_json_values
from logstore.broker.kafka.json_values import json_values

UTC = datetime.timezone.utc
# Every column type whose JSON both paths read (the vectorized one after its conversions).
FLAT = pa.struct([
    pa.field("id", pa.int64(), nullable=False), pa.field("small", pa.int8()), pa.field("name", pa.string()),
    pa.field("score", pa.float64()), pa.field("ok", pa.bool_()), pa.field("at", pa.timestamp("ms", tz="UTC")),
    pa.field("local", pa.timestamp("us")), pa.field("day", pa.date32()), pa.field("clock", pa.time64("us")),
    pa.field("raw", pa.binary()), pa.field("price", pa.decimal128(10, 2)), pa.field("tags", pa.list_(pa.string())),
    pa.field("point", pa.struct([pa.field("x", pa.int32()), pa.field("y", pa.float64())])),
])
# Types only the value-by-value path reads.
NESTED = pa.struct([pa.field("id", pa.int64()), pa.field("attrs", pa.map_(pa.string(), pa.int64())),
                    pa.field("spans", pa.list_(pa.timestamp("ms", tz="UTC"))), pa.field("wait", pa.duration("us"))])


def _row(i: int) -> dict[str, Any]:
    return {"id": i, "small": -i % 100, "name": f"n{i}", "score": i / 4, "ok": i % 2 == 0,
            "at": datetime.datetime(2026, 1, 2, 3, 4, 5, 123000 + i, tzinfo=UTC).replace(microsecond=123000),
            "local": datetime.datetime(2026, 1, 2, 3, 4, 5, i), "day": datetime.date(2026, 1, 1 + i % 28),
            "clock": datetime.time(1, 2, 3, i), "raw": bytes([i % 256, 255]), "price": decimal.Decimal(f"{i}.25"),
            "tags": ["a", str(i)], "point": {"x": i, "y": 0.5}}


def _same(a: pa.Array, b: pa.Array) -> bool:
    """Equal arrays, NaN equal to NaN (as JSON writes both)."""
    return a.type == b.type and json_values(a) == json_values(b)


def test_json_as_kafka_consumers_read_it_decodes_to_the_same_rows_vectorized() -> None:
    rows = pa.array([_row(i) for i in range(50)], FLAT)
    assert json_produce._vectorized(json_values(rows), FLAT) is not None  # the fast path takes it all
    assert _same(decode_json_values(json_values(rows), FLAT, where="t-0"), rows)


def test_tombstones_nulls_and_non_finite_floats_keep_their_places() -> None:
    rows = pa.array([_row(0), None, {"id": 1, "score": math.nan}, None, {"id": 2, "score": -math.inf}], FLAT)
    values = json_values(rows)
    assert values[1] is None and b'"score":"NaN"' in values[2]  # Spark's to_json
    decoded = decode_json_values(values, FLAT, where="t-0")
    assert decoded.null_count == 2 and _same(decoded, rows)
    # NaN and Infinity as JSON literals (Python's json.dumps writes them) read the same
    literal = decode_json_values([b'{"id": 1, "score": NaN}', b'{"id": 2, "score": -Infinity}'], FLAT, where="t")
    assert literal.field("score").to_pylist()[1] == -math.inf and math.isnan(literal.field("score").to_pylist()[0])


def test_types_the_reader_lacks_are_decoded_value_by_value() -> None:
    rows = pa.array([{"id": 1, "attrs": [("a", 1), ("b", 2)], "wait": datetime.timedelta(seconds=1.5),
                      "spans": [datetime.datetime(2026, 1, 1, 0, 0, 0, 1000, tzinfo=UTC)]},
                     {"id": 2, "attrs": [], "spans": None, "wait": None}], NESTED)
    assert json_produce._vectorized(json_values(rows), NESTED) is None
    assert _same(decode_json_values(json_values(rows), NESTED, where="t-0"), rows)


def test_offsets_fractions_and_pretty_printed_values_are_read() -> None:
    values = [json.dumps({"id": 1, "at": "2026-01-02T04:04:05.5+01:00"}, indent=2).encode(),
              b'{"id": 2, "at": "2026-01-02T03:04:05Z", "local": "2026-01-02 03:04:05.123456789"}']
    decoded = decode_json_values(values, FLAT, where="t-0").to_pylist()
    assert [r["at"] for r in decoded] == [datetime.datetime(2026, 1, 2, 3, 4, 5, 500000, tzinfo=UTC),
                                          datetime.datetime(2026, 1, 2, 3, 4, 5, tzinfo=UTC)]
    assert decoded[1]["local"] == datetime.datetime(2026, 1, 2, 3, 4, 5, 123456)  # truncated to the unit


@pytest.mark.parametrize("value, says", [
    (b"nope", "not JSON"),
    (b"", "an empty value"),
    (b"[1, 2]", "a JSON array, not an object"),
    (b'"text"', "a JSON string, not an object"),
    (b'{"id": 1}{"id": 2}', "not JSON (Extra data"),
    (b'{"small": 1}', "column 'id' is NOT NULL"),
    (b'{"id": null}', "column 'id' is NOT NULL"),
    (b'{"id": 1, "extra": 2}', "has 'extra', not a column"),
    (b'{"id": 1, "point": {"x": 1, "z": 2}}', "'point.' has 'z'"),
    (b'{"id": "1"}', "expected an integer for int64, got string"),
    (b'{"id": 1.0}', "expected an integer for int64, got number"),
    (b'{"id": true}', "expected an integer for int64, got boolean"),
    (b'{"id": 1, "small": 300}', "300 is out of the range of int8"),
    (b'{"id": 1, "name": 5}', "expected a string"),
    (b'{"id": 1, "price": "1.255"}', "does not fit decimal128(10, 2)"),
    (b'{"id": 1, "price": "123456789.5"}', "does not fit decimal128(10, 2)"),
    (b'{"id": 1, "raw": "not base64!"}', "is not base64"),
    (b'{"id": 1, "at": "2026-01-02T03:04:05"}', "has no offset"),
    (b'{"id": 1, "local": "2026-01-02T03:04:05+01:00"}', "has an offset"),
    (b'{"id": 1, "day": "yesterday"}', "is not a date32"),
    (b'{"id": 1, "id": 2}', "'id' appears twice"),
    (b'{"id": 1, "name": "\xff"}', "not UTF-8"),
])
def test_an_unfit_value_refuses_the_batch_naming_each_bad_record(value: bytes, says: str) -> None:
    good = json_values(pa.array([_row(1)], FLAT))[0]
    with pytest.raises(RecordsRefused) as refused:
        decode_json_values([good, None, value, good, value], FLAT, where="orders-3")
    assert [i for i, _ in refused.value.record_errors] == [2, 4]
    assert all(says in why for _, why in refused.value.record_errors), refused.value.record_errors
    assert refused.value.code == "SCHEMA_MISMATCH"  # Kafka's INVALID_RECORD (error_codes.OURS)
    assert refused.value.message.startswith("orders-3: 2 of 5 values do not fit") and says in refused.value.message


def test_a_batch_of_a_type_without_json_form_is_refused_not_raised() -> None:
    schema = pa.struct([pa.field("id", pa.int64()), pa.field("u", pa.dense_union([pa.field("a", pa.int8())]))])
    with pytest.raises(RecordsRefused, match="cannot be produced as JSON"):
        decode_json_values([b'{"id": 1, "u": 1}'], schema, where="t-0")


_scalars = st.one_of(st.none(), st.integers(-2**63, 2**63 - 1))


@settings(max_examples=60, deadline=None)
@given(st.lists(st.one_of(st.none(), st.fixed_dictionaries({
    "id": st.integers(-2**63, 2**63 - 1), "name": st.one_of(st.none(), st.text(max_size=8)),
    "score": st.one_of(st.none(), st.floats(allow_nan=True, allow_infinity=True)),
    "raw": st.one_of(st.none(), st.binary(max_size=8)),
    "price": st.one_of(st.none(), st.decimals(min_value=-10**7, max_value=10**7, places=2)),
    "at": st.one_of(st.none(), st.datetimes(min_value=datetime.datetime(1970, 1, 1),
                                            max_value=datetime.datetime(2200, 1, 1), timezones=st.just(UTC))),
})), max_size=12))
def test_both_paths_give_the_rows_that_were_written_as_json(rows: list[dict[str, Any] | None]) -> None:
    schema = pa.struct([FLAT.field("id"), FLAT.field("name"), FLAT.field("score"), FLAT.field("raw"),
                        FLAT.field("price"), FLAT.field("at")])
    written = pa.array(rows, schema)
    values = json_values(written)
    assert _same(decode_json_values(values, schema, where="t-0"), written)
    texts = [v for v in values if v is not None]
    one_by_one, errors = json_produce._one_by_one(texts, schema)
    assert errors == [] and _same(one_by_one, written.drop_null())


def test_an_empty_map_is_written_as_an_empty_object_and_read_back() -> None:
    rows = pa.array([{"id": 1, "attrs": []}, {"id": 2, "attrs": [("a", 1)]}], NESTED)
    assert [json.loads(v)["attrs"] for v in json_values(rows)] == [{}, {"a": 1}]  # was [] (an array) for {}
    assert decode_json_values(json_values(rows), NESTED, where="t-0").to_pylist() == rows.to_pylist()
