"""Kafka producers' JSON values decoded into a typed topic's columns (``value.format=json``).

A typed topic stores each value as a row of Arrow columns; a Kafka producer sends bytes.
On a topic whose ``value.format`` is ``json`` the broker decodes each produced value, a
JSON object, into the topic's value struct before it is appended, so records from any
Kafka producer land as the columns Spark reads. The mapping is the inverse of
:mod:`.json_values` (what Kafka consumers of a typed topic read, Spark's ``to_json``):

* the object's keys are the value columns; a key the schema does not have is refused, a
  column the object lacks (or gives as ``null``) is null, refused if it is NOT NULL (the
  top-level columns, as logstore's Producer checks them);
* integers, booleans and strings as JSON's, strictly (``"1"`` is not an integer, ``1.0``
  is not one either, ``1`` is not a string); floats from JSON numbers or the strings
  (and literals) ``NaN``, ``Infinity``, ``-Infinity``;
* decimals from strings or numbers, refused when they do not fit the precision and
  scale (never rounded); binary from base64 strings;
* timestamps, dates and times from ISO 8601 strings: a timestamp column with a time zone
  needs an offset (``Z``, ``+01:00``), one without refuses it; a fraction finer than the
  column's unit is truncated; durations from seconds;
* lists from arrays, structs and maps from objects (map keys: strings or integers).

A null value (a tombstone) stays a null value.

Speed: the values of a produce's partition are decoded together, vectorized: pyarrow's
JSON reader over the newline-joined values with the topic's schema (post-processing the
top-level binary, timestamp, date and time columns with Arrow kernels): 0.76 M values/s
of 108 bytes, 0.59x pyarrow's reader alone and 23x value by value, on 2 loaded cores
(``benchmarks/bench_kafka_json_produce.py``). When that read fails, or the schema has a
type it cannot read (maps, durations, dictionaries, binary or temporal types below the
top level), each value is decoded alone in Python: the reference rules above, and the
only way to say *which* values are bad.

Refusal: a value that does not fit refuses the whole partition's records
(:class:`RecordsRefused`, answered as Kafka's INVALID_RECORD with one KIP-467 record error
per bad value: its index among the partition's records, counted across its batches, and
why); nothing of them is appended.

Thread-safety: pure functions (the reading plan of a schema is cached).
"""

from __future__ import annotations

import base64
import binascii
import datetime
import decimal
import functools
import io
import json
import math
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any, cast

import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.json as pa_json

from logstore.broker.kafka.record_batch import KafkaBatch, to_stored_records
from logstore.errors import SchemaMismatchError

__all__ = ["RecordsRefused", "decode_json_values", "json_stored_records"]

_MAX_ERROR_CHARS = 200  # one record error's message, at most
_NON_FINITE = {"NaN": math.nan, "Infinity": math.inf, "-Infinity": -math.inf}


class RecordsRefused(SchemaMismatchError):
    """Values that do not fit a typed topic's schema; ``record_errors`` holds (index, why)
    for each, the index counted among the partition's records. Nothing of them is appended."""

    def __init__(self, message: str, record_errors: Sequence[tuple[int, str]] = ()) -> None:
        super().__init__(message)
        self.record_errors = tuple(record_errors)

    def __reduce__(self) -> Any:
        return (type(self), (self.message, self.record_errors))


def decode_json_values(values: Sequence[bytes | None], value_type: pa.StructType, *, where: str) -> pa.StructArray:
    """``values`` (JSON objects; None: a tombstone) as a struct array of ``value_type``, one
    row per value; see the module docstring. Raises :class:`RecordsRefused` naming every
    value that does not fit."""
    tombstones = None in values
    present = [i for i, v in enumerate(values) if v is not None] if tombstones else range(len(values))
    texts = cast("Sequence[bytes]", [values[i] for i in present] if tombstones else values)
    decoded = _vectorized(texts, value_type) if texts else pa.array([], value_type)
    if decoded is None:
        decoded, errors = _one_by_one(texts, value_type)
    else:
        errors = _null_errors(decoded, value_type)
    if errors:
        errors = [(present[i], why) for i, why in errors]
        first_index, first_why = errors[0]
        raise RecordsRefused(
            f"{where}: {len(errors)} of {len(values)} values do not fit the topic's schema (value.format=json; "
            f"nothing was appended); record {first_index}: {first_why}", errors)
    assert decoded is not None
    if not tombstones:
        return decoded
    rows: list[int | None] = [None] * len(values)
    for row, i in enumerate(present):
        rows[i] = row
    return decoded.take(pa.array(rows, pa.int64()))


# --------------------------------------------------------------------------- vectorized


@dataclass(frozen=True, slots=True)
class _Plan:
    """How pyarrow's JSON reader reads a value type: the schema it reads with, and for each
    top-level column the Arrow conversion of what it read (None: read as is)."""

    read_schema: pa.Schema
    convert: tuple[Callable[[pa.Array], pa.Array] | None, ...]


def _vectorized(texts: Sequence[bytes], value_type: pa.StructType) -> pa.StructArray | None:
    """The values read together by pyarrow (None: they did not all read, or the schema has a
    type the reader does not read; decode them one by one)."""
    plan = _plan(value_type)
    if plan is None or not all(t.strip() for t in texts):  # a blank value would shift the rows
        return None
    options = pa_json.ParseOptions(explicit_schema=plan.read_schema, unexpected_field_behavior="error")
    try:
        table = pa_json.read_json(io.BytesIO(b"\n".join(texts)), parse_options=options)
        if table.num_rows != len(texts):  # a value holding two objects (every value holds one or more)
            return None
        columns = []
        for i, convert in enumerate(plan.convert):
            column = table.column(i).combine_chunks()
            columns.append(column if convert is None else convert(column))
        fields = [value_type.field(i) for i in range(value_type.num_fields)]
        decoded = pa.StructArray.from_arrays(columns, fields=fields)
        decoded.validate(full=True)  # the reader does not check that strings are UTF-8
    except (pa.ArrowException, ValueError):  # UnicodeDecodeError is a ValueError
        return None
    return decoded


@functools.lru_cache(maxsize=256)
def _plan(value_type: pa.StructType) -> _Plan | None:
    """The reading plan of ``value_type``, or None when pyarrow's reader cannot read it."""
    read_fields: list[pa.Field] = []
    converts: list[Callable[[pa.Array], pa.Array] | None] = []
    for i in range(value_type.num_fields):
        field = value_type.field(i)
        t = field.type
        # Read as nullable: a NOT NULL column's nulls are found after, vectorized (:func:`_null_errors`).
        if _natively_read(t):
            read_type = _widened(t)
            read_fields.append(pa.field(field.name, read_type))
            converts.append(None if read_type == t else functools.partial(_cast, t=t))
            continue
        convert = _top_level_conversion(t)
        if convert is None:
            return None
        read_fields.append(pa.field(field.name, pa.string()))
        converts.append(convert)
    return _Plan(pa.schema(read_fields), tuple(converts))


def _natively_read(t: pa.DataType) -> bool:
    """Whether pyarrow's JSON reader reads ``t`` by this module's rules, as is."""
    if (pa.types.is_boolean(t) or pa.types.is_integer(t) or t in (pa.float32(), pa.float64())
            or pa.types.is_decimal(t) or pa.types.is_string(t) or pa.types.is_large_string(t)):
        return True
    if pa.types.is_list(t) or pa.types.is_large_list(t):
        return _natively_read(t.value_type)
    if pa.types.is_struct(t):
        return all(_natively_read(t.field(i).type) for i in range(t.num_fields))
    return False


def _widened(t: pa.DataType) -> pa.DataType:
    """``t`` with its decimals at the widest precision: pyarrow's reader does not check a
    decimal's precision, the cast back to ``t`` does (:func:`_cast`)."""
    if pa.types.is_decimal(t):
        return pa.decimal128(38, t.scale) if t.precision <= 38 else pa.decimal256(76, t.scale)
    if pa.types.is_list(t):
        return pa.list_(t.value_field.with_type(_widened(t.value_type)))
    if pa.types.is_large_list(t):
        return pa.large_list(t.value_field.with_type(_widened(t.value_type)))
    if pa.types.is_struct(t):
        return pa.struct([t.field(i).with_type(_widened(t.field(i).type)) for i in range(t.num_fields)])
    return t


def _cast(column: pa.Array, *, t: pa.DataType) -> pa.Array:
    return column.cast(t)  # safe: a decimal past its precision raises


def _top_level_conversion(t: pa.DataType) -> Callable[[pa.Array], pa.Array] | None:
    """For a top-level column of type ``t`` read as strings: the conversion to ``t``, or None."""
    if pa.types.is_binary(t) or pa.types.is_large_binary(t):
        return functools.partial(_base64_column, t=t)
    if pa.types.is_timestamp(t):
        # Parsed at nanoseconds (fractions finer than the unit are truncated, as one by one), and
        # "+00:00" as "Z": Arrow's ISO 8601 parser takes fractions with "Z" only; other offsets
        # with fractions fail here and are decoded one by one.
        at_ns = pa.timestamp("ns", tz=t.tz)
        if t.tz is None:
            return lambda column: column.cast(at_ns).cast(t, safe=False)
        return lambda column: pc.replace_substring_regex(column, r"[+-]00:?00$", "Z").cast(at_ns).cast(t, safe=False)
    if pa.types.is_date(t):
        return lambda column: column.cast(t)
    if pa.types.is_time(t):
        return lambda column: (pc.binary_join_element_wise("1970-01-01T", column, "").cast(pa.timestamp("ns"))
                               .cast(pa.time64("ns")).cast(t, safe=False))
    return None


def _base64_column(column: pa.Array, *, t: pa.DataType) -> pa.Array:
    """Base64 strings as the bytes they encode (a bad one raises ValueError)."""
    return pa.array([None if s is None else base64.b64decode(s, validate=True) for s in column.to_pylist()], t)


def _null_errors(decoded: pa.StructArray, value_type: pa.StructType) -> list[tuple[int, str]]:
    """(row, why) for each row with a null in a NOT NULL column (vectorized)."""
    errors: dict[int, str] = {}
    for i in range(value_type.num_fields):
        field = value_type.field(i)
        if field.nullable or not decoded.field(i).null_count:
            continue
        for row in pc.indices_nonzero(decoded.field(i).is_null()).to_pylist():
            errors.setdefault(row, _missing(field.name))
    return sorted(errors.items())


def _missing(name: str) -> str:
    return f"column {name!r} is NOT NULL but the value lacks it (or gives null)"


# --------------------------------------------------------------------------- one by one


class _Unfit(ValueError):
    """One value does not fit; the message says where and why."""


def _one_by_one(texts: Sequence[bytes],
                value_type: pa.StructType) -> tuple[pa.StructArray | None, list[tuple[int, str]]]:
    """The values decoded each alone by the reference rules: the rows, or None and (index,
    why) for each value that does not fit."""
    rows: list[dict[str, Any] | None] = []
    errors: list[tuple[int, str]] = []
    for i, text in enumerate(texts):
        if not text.strip():
            errors.append((i, "an empty value, not a JSON object (a null value is a tombstone)"))
            continue
        try:
            rows.append(_row(text, value_type))
        except _Unfit as e:
            rows.append(None)
            errors.append((i, str(e)[:_MAX_ERROR_CHARS]))
    if errors:
        return None, errors
    try:
        return pa.array(rows, value_type), []
    except (pa.ArrowException, ValueError, TypeError, OverflowError) as e:  # a bound missed above: say so, whole
        return None, [(i, f"the values do not convert together: {e}"[:_MAX_ERROR_CHARS]) for i in range(len(texts))]


def _row(text: bytes, value_type: pa.StructType) -> dict[str, Any]:
    try:
        document = json.loads(text.decode("utf-8-sig"), parse_float=decimal.Decimal,
                              object_pairs_hook=_object)
    except UnicodeDecodeError as e:
        raise _Unfit(f"not UTF-8 text ({e.reason} at byte {e.start})") from None
    except json.JSONDecodeError as e:
        raise _Unfit(f"not JSON ({e.msg} at character {e.pos})") from None
    if not isinstance(document, dict):
        raise _Unfit(f"a JSON {_kind(document)}, not an object of the topic's columns")
    row = _struct(document, value_type, "")
    for i in range(value_type.num_fields):
        field = value_type.field(i)
        if not field.nullable and row[field.name] is None:
            raise _Unfit(_missing(field.name))
    return row


def _object(pairs: list[tuple[str, Any]]) -> dict[str, Any]:
    out: dict[str, Any] = {}
    for key, value in pairs:
        if key in out:
            raise _Unfit(f"key {key!r} appears twice in an object")
        out[key] = value
    return out


def _kind(value: Any) -> str:
    if value is None:
        return "null"
    if isinstance(value, bool):
        return "boolean"
    if isinstance(value, (int, float, decimal.Decimal)):
        return "number"
    if isinstance(value, str):
        return "string"
    return "array" if isinstance(value, list) else "object"


def _struct(document: dict[str, Any], t: pa.StructType, path: str) -> dict[str, Any]:
    names = {t.field(i).name for i in range(t.num_fields)}
    unknown = [k for k in document if k not in names]
    if unknown:
        raise _Unfit(f"{'the value' if not path else repr(path)} has {unknown[0]!r}, not a column of the topic's "
                     f"schema ({', '.join(sorted(names))})")
    return {t.field(i).name: _convert(document.get(t.field(i).name), t.field(i).type, path + t.field(i).name)
            for i in range(t.num_fields)}


def _convert(value: Any, t: pa.DataType, path: str) -> Any:
    """``value`` (what ``json.loads`` gave) as the Python value pyarrow builds ``t`` from."""
    if value is None:
        return None
    convert = _converter(t)
    if convert is None:
        raise _Unfit(f"column {path!r}: type {t} cannot be produced as JSON")
    try:
        return convert(value, t, path)
    except (ValueError, TypeError, ArithmeticError) as e:
        if isinstance(e, _Unfit):
            raise
        raise _Unfit(f"column {path!r}: {_kind(value)} {_short(value)} is not a {t} ({e})") from None


def _short(value: Any) -> str:
    text = json.dumps(value, default=str)
    return text if len(text) <= 40 else text[:37] + "..."


def _expect(ok: bool, value: Any, t: pa.DataType, path: str, want: str) -> None:
    if not ok:
        raise _Unfit(f"column {path!r}: expected {want} for {t}, got {_kind(value)} {_short(value)}")


def _integer(value: Any, t: pa.DataType, path: str) -> int:
    _expect(isinstance(value, int) and not isinstance(value, bool), value, t, path, "an integer")
    bits = t.bit_width
    low, high = (0, 2 ** bits - 1) if pa.types.is_unsigned_integer(t) else (-(2 ** (bits - 1)), 2 ** (bits - 1) - 1)
    if not low <= value <= high:
        raise _Unfit(f"column {path!r}: {value} is out of the range of {t}")
    return int(value)


def _floating(value: Any, t: pa.DataType, path: str) -> float:
    if isinstance(value, str) and value in _NON_FINITE:
        return _NON_FINITE[value]
    _expect(isinstance(value, (int, float, decimal.Decimal)) and not isinstance(value, bool), value, t, path,
            'a number (or "NaN", "Infinity", "-Infinity")')
    return float(value)


def _decimal(value: Any, t: pa.DataType, path: str) -> decimal.Decimal:
    _expect(isinstance(value, (str, int, decimal.Decimal)) and not isinstance(value, bool), value, t, path,
            "a decimal string or number")
    number = decimal.Decimal(value.strip() if isinstance(value, str) else value)
    if not number.is_finite():
        raise _Unfit(f"column {path!r}: {value} is not a finite decimal")
    exact = decimal.Context(prec=max(t.precision, len(number.as_tuple().digits)) + t.scale + 2)
    fitted = number.quantize(decimal.Decimal(1).scaleb(-t.scale), context=exact)
    if fitted != number or len(fitted.as_tuple().digits) > t.precision:
        raise _Unfit(f"column {path!r}: {value} does not fit {t} (it would be rounded or overflow)")
    return fitted


def _string(value: Any, t: pa.DataType, path: str) -> str:
    _expect(isinstance(value, str), value, t, path, "a string")
    return str(value)


def _boolean(value: Any, t: pa.DataType, path: str) -> bool:
    _expect(isinstance(value, bool), value, t, path, "true or false")
    return bool(value)


def _binary(value: Any, t: pa.DataType, path: str) -> bytes:
    _expect(isinstance(value, str), value, t, path, "a base64 string")
    try:
        data = base64.b64decode(value, validate=True)
    except (binascii.Error, ValueError):
        raise _Unfit(f"column {path!r}: {_short(value)} is not base64") from None
    if pa.types.is_fixed_size_binary(t) and len(data) != t.byte_width:
        raise _Unfit(f"column {path!r}: {len(data)} bytes, {t} holds {t.byte_width}")
    return data


def _timestamp(value: Any, t: pa.DataType, path: str) -> datetime.datetime:
    _expect(isinstance(value, str), value, t, path, "an ISO 8601 string")
    at = datetime.datetime.fromisoformat(value)
    if t.tz is not None and at.tzinfo is None:
        raise _Unfit(f"column {path!r}: {value!r} has no offset (Z or +hh:mm); {t} needs one")
    if t.tz is None and at.tzinfo is not None:
        raise _Unfit(f"column {path!r}: {value!r} has an offset; {t} has no time zone")
    return at


def _date(value: Any, t: pa.DataType, path: str) -> datetime.date:
    _expect(isinstance(value, str), value, t, path, "an ISO 8601 date string")
    return datetime.date.fromisoformat(value)


def _time(value: Any, t: pa.DataType, path: str) -> datetime.time:
    _expect(isinstance(value, str), value, t, path, "an ISO 8601 time string")
    at = datetime.time.fromisoformat(value)
    if at.tzinfo is not None:
        raise _Unfit(f"column {path!r}: {value!r} has an offset; {t} has none")
    return at


def _duration(value: Any, t: pa.DataType, path: str) -> datetime.timedelta:
    _expect(isinstance(value, (int, decimal.Decimal)) and not isinstance(value, bool), value, t, path,
            "a number of seconds")
    return datetime.timedelta(seconds=float(value))


def _list(value: Any, t: pa.DataType, path: str) -> list[Any]:
    _expect(isinstance(value, list), value, t, path, "an array")
    if pa.types.is_fixed_size_list(t) and len(value) != t.list_size:
        raise _Unfit(f"column {path!r}: {len(value)} items, {t} holds {t.list_size}")
    return [_convert(v, t.value_type, f"{path}[{i}]") for i, v in enumerate(value)]


def _nested_struct(value: Any, t: pa.DataType, path: str) -> dict[str, Any]:
    _expect(isinstance(value, dict), value, t, path, "an object")
    return _struct(value, t, path + ".")


def _map(value: Any, t: pa.DataType, path: str) -> list[tuple[Any, Any]]:
    _expect(isinstance(value, dict), value, t, path, "an object")
    key_type = t.key_type
    if not (pa.types.is_string(key_type) or pa.types.is_large_string(key_type) or pa.types.is_integer(key_type)):
        raise _Unfit(f"column {path!r}: map keys of type {key_type} cannot be produced as JSON")
    out = []
    for k, v in value.items():
        key = k if not pa.types.is_integer(key_type) else _integer(int(k), key_type, f"{path} key")
        out.append((key, _convert(v, t.item_type, f"{path}[{k!r}]")))
    return out


def _dictionary(value: Any, t: pa.DataType, path: str) -> Any:
    return _convert(value, t.value_type, path)


def _null(value: Any, t: pa.DataType, path: str) -> None:
    _expect(False, value, t, path, "null")


_CONVERTERS: tuple[tuple[Callable[[pa.DataType], bool], Callable[[Any, Any, str], Any]], ...] = (
    (pa.types.is_boolean, _boolean),
    (pa.types.is_integer, _integer),
    (pa.types.is_floating, _floating),
    (pa.types.is_decimal, _decimal),
    (lambda t: pa.types.is_string(t) or pa.types.is_large_string(t), _string),
    (lambda t: pa.types.is_binary(t) or pa.types.is_large_binary(t) or pa.types.is_fixed_size_binary(t), _binary),
    (pa.types.is_timestamp, _timestamp),
    (pa.types.is_date, _date),
    (pa.types.is_time, _time),
    (pa.types.is_duration, _duration),
    (lambda t: pa.types.is_list(t) or pa.types.is_large_list(t) or pa.types.is_fixed_size_list(t), _list),
    (pa.types.is_struct, _nested_struct),
    (pa.types.is_map, _map),
    (pa.types.is_dictionary, _dictionary),
    (pa.types.is_null, _null),
)


def _converter(t: pa.DataType) -> Callable[[Any, Any, str], Any] | None:
    for matches, convert in _CONVERTERS:
        if matches(t):
            return convert
    return None


def json_stored_records(batches: list[KafkaBatch], schema: pa.Schema, *, where: str) -> bytes:
    """A produce's batches for one partition of a typed topic (stored ``schema``) as a logstore
    produce's records, their JSON values decoded together into the value columns. Raises
    :class:`RecordsRefused` naming every value that does not fit (indexes counted across the
    batches)."""
    if any(batch.control for batch in batches):
        return to_stored_records(batches)  # refuses them, as for an untyped topic
    values = [v for batch in batches for v in batch.values.to_pylist()]
    decoded = decode_json_values(values, schema.field("value").type, where=where)
    split, start = [], 0
    for batch in batches:
        split.append(decoded.slice(start, len(batch.values)))
        start += len(batch.values)
    return to_stored_records(batches, schema=schema, values=split)
