"""A typed topic's values as JSON, for Kafka consumers.

A typed topic stores each value as a row of Arrow columns (its schema); Kafka's records
carry bytes. A Kafka consumer of a typed topic reads each value as one JSON object whose
keys are the value columns, in the topic's column order, written as Spark's ``to_json``
writes them:

* integers, floats, booleans and strings as JSON's; a float that is not finite as the
  strings ``"NaN"``, ``"Infinity"``, ``"-Infinity"``;
* decimals as strings (no precision lost to a double), binary as base64 strings;
* timestamps, dates and times as ISO 8601 strings (a timestamp with a time zone ends in
  its offset, ``+00:00`` for UTC);
* lists as arrays, structs and maps as objects; a null column as ``null``.

A tombstone (a null value) stays a null value.

Thread-safety: pure functions.
"""

from __future__ import annotations

import base64
import datetime
import decimal
import json
import math
from typing import Any

import pyarrow as pa

__all__ = ["json_values"]


def json_values(column: pa.Array) -> list[bytes | None]:
    """Each value of a typed topic's struct ``column`` as JSON bytes (None for a null value)."""
    value_type = column.type
    return [None if row is None else json.dumps(_plain(row, value_type), ensure_ascii=False, allow_nan=False,
                                                separators=(",", ":")).encode()
            for row in column.to_pylist()]


def _plain(value: Any, t: pa.DataType) -> Any:
    """``value`` (what Arrow's ``to_pylist`` gives for type ``t``) as what JSON can hold; the
    type tells a map (pairs, as an object, ``{}`` when empty) from a list."""
    if value is None:
        return None
    if pa.types.is_struct(t):
        return {t.field(i).name: _plain(value[t.field(i).name], t.field(i).type) for i in range(t.num_fields)}
    if pa.types.is_map(t):
        return {str(k): _plain(v, t.item_type) for k, v in value}
    if pa.types.is_list(t) or pa.types.is_large_list(t) or pa.types.is_fixed_size_list(t):
        return [_plain(v, t.value_type) for v in value]
    if pa.types.is_dictionary(t):
        return _plain(value, t.value_type)
    if isinstance(value, float) and not math.isfinite(value):
        return "NaN" if math.isnan(value) else ("Infinity" if value > 0 else "-Infinity")
    if isinstance(value, (bytes, bytearray)):
        return base64.b64encode(value).decode()
    if isinstance(value, (datetime.datetime, datetime.date, datetime.time)):
        return value.isoformat()
    if isinstance(value, datetime.timedelta):
        return value.total_seconds()
    if isinstance(value, decimal.Decimal):
        return str(value)
    return value
