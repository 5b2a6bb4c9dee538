"""The source's output shape, and stored batches turned into it column by column.

Output columns, as Spark's Kafka source (``headers`` only with ``includeHeaders``)::

    key binary, value binary, topic string, partition int, offset long,
    timestamp timestamp, timestampType int[, headers array<struct<key string, value binary>>]

A typed topic exposes its value columns by name and type in place of
``value`` (a tombstone has all of them null). ``timestampType`` is 0 for
CreateTime and 1 for LogAppendTime topics.

:func:`to_output_batch` builds the output from a stored batch without
per-row Python objects: columns are reused (zero-copy), constant columns
are built with numpy, timestamps are cast from ms to Spark's µs.

Thread-safety: pure functions.
"""

from __future__ import annotations

from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
from pyspark.sql.pandas.types import from_arrow_type, to_arrow_schema
from pyspark.sql.types import (
    ArrayType,
    BinaryType,
    IntegerType,
    LongType,
    StringType,
    StructField,
    StructType,
    TimestampType,
)

__all__ = ["output_schema", "output_arrow_schema", "to_output_batch", "OutputShape"]

_HEADERS = ArrayType(StructType([StructField("key", StringType()), StructField("value", BinaryType())]))
_METADATA_COLUMNS = ("key", "topic", "partition", "offset", "timestamp", "timestampType", "headers")


class OutputShape:
    """The output schema for a value schema (None = untyped) and the header choice."""

    def __init__(self, value_schema: pa.Schema | None, *, include_headers: bool) -> None:
        self.value_schema = value_schema
        self.include_headers = include_headers
        self.spark = output_schema(value_schema, include_headers=include_headers)
        self.arrow = to_arrow_schema(self.spark, timezone="UTC")

    def __reduce__(self) -> tuple[Any, ...]:
        return (_rebuild_shape, (self.value_schema, self.include_headers))


def _rebuild_shape(value_schema: pa.Schema | None, include_headers: bool) -> OutputShape:
    return OutputShape(value_schema, include_headers=include_headers)


def output_schema(value_schema: pa.Schema | None, *, include_headers: bool) -> StructType:
    """The Spark schema of the source's rows."""
    fields = [StructField("key", BinaryType())]
    if value_schema is None:
        fields.append(StructField("value", BinaryType()))
    else:
        for f in value_schema:
            if f.name in _METADATA_COLUMNS:
                raise ValueError(
                    f"typed topic column {f.name!r} collides with the source's {f.name!r} column"
                )
            fields.append(StructField(f.name, from_arrow_type(f.type, prefer_timestamp_ntz=False), True))
    fields += [
        StructField("topic", StringType()),
        StructField("partition", IntegerType()),
        StructField("offset", LongType()),
        StructField("timestamp", TimestampType()),
        StructField("timestampType", IntegerType()),
    ]
    if include_headers:
        fields.append(StructField("headers", _HEADERS))
    return StructType(fields)


def output_arrow_schema(value_schema: pa.Schema | None, *, include_headers: bool) -> pa.Schema:
    return OutputShape(value_schema, include_headers=include_headers).arrow


def to_output_batch(
    stored: pa.RecordBatch,
    shape: OutputShape,
    *,
    topic: str,
    partition: int,
    timestamp_type: int,
) -> pa.RecordBatch:
    """``stored`` (columns offset, timestamp, key, value, headers) in the output shape."""
    n = stored.num_rows
    columns: list[pa.Array] = [stored.column(2)]
    value = stored.column(3)
    if shape.value_schema is None:
        columns.append(value)
    else:
        # Children of the value struct, with the struct's nulls (tombstones) applied.
        children = value.flatten()
        have = {value.type.field(i).name: children[i] for i in range(value.type.num_fields)}
        for f in shape.value_schema:
            # Batches written before an added column lack it: nulls, as schema evolution promises.
            columns.append(have[f.name] if f.name in have else pa.nulls(n, f.type))
    columns += [
        pc.take(pa.array([topic], pa.string()), pa.array(np.zeros(n, dtype=np.int32))),
        pa.array(np.full(n, partition, dtype=np.int32)),
        stored.column(0),
        stored.column(1),
        pa.array(np.full(n, timestamp_type, dtype=np.int32)),
    ]
    if shape.include_headers:
        columns.append(stored.column(4))
    target = shape.arrow
    out = []
    for col, field in zip(columns, target, strict=True):
        out.append(col if col.type == field.type else col.cast(field.type))
    return pa.RecordBatch.from_arrays(out, schema=target)
