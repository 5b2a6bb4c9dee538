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
    return [None if row is None else json.dumps(_plain(row), ensure_ascii=False, allow_nan=False,
                                                separators=(",", ":")).encode()
            for row in column.to_pylist()]


def _plain(value: Any) -> Any:
    """``value`` (what Arrow's ``to_pylist`` gives) as what JSON can hold."""
    if isinstance(value, dict):
        return {str(k): _plain(v) for k, v in value.items()}
    if isinstance(value, list):
        if value and isinstance(value[0], tuple) and len(value[0]) == 2:  # a map: [(key, value), ...]
            return {str(k): _plain(v) for k, v in value}
        return [_plain(v) for v in value]
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
