"""Helpers of the materialized-view tests: topics, a model of a view computed from the topic, the table read back.

The *model* of a view is computed independently of Spark: the topic is read
with the Python :class:`~logstore.Consumer`, and per key the record with the
highest offset (up to given offsets per partition) wins; a tombstone (value
None) removes the key. Records without a key are not part of a view.
"""

from __future__ import annotations

import random
from collections.abc import Callable, Iterable, Mapping
from typing import Any

import pyarrow as pa
from pyspark.sql import SparkSession

from logstore import Admin, Consumer, ConsumerRecord, NewTopic, Producer, TopicPartition

# key -> (partition, offset, value as the view stores it)
View = dict[bytes, tuple[int, int, Any]]


def new_topic(bootstrap: str, prefix: str, partitions: int = 2, *,
              value_schema: pa.Schema | None = None, compacted: bool = True) -> str:
    name = f"{prefix}-{random.randrange(1 << 30)}"
    configs = {"cleanup.policy": "compact"} if compacted else {}
    with Admin(bootstrap) as admin:
        admin.create_topics([NewTopic(name, partitions, configs=configs, value_schema=value_schema)])
    return name


def send_all(bootstrap: str, topic: str, records: Iterable[tuple[Any, Any]]) -> None:
    """Produce ``(key, value)`` pairs in order (default partitioner) and wait for every ack."""
    with Producer(bootstrap, linger_ms=2) as producer:
        futures = [producer.send(topic, value, key=key) for key, value in records]
        producer.flush(60)
        for f in futures:
            f.result(timeout=60)


def read_topic(bootstrap: str, topic: str, timeout_s: float = 60) -> list[ConsumerRecord]:
    """Every record of ``topic`` up to its current end, in offset order per partition."""
    import time

    with Admin(bootstrap) as admin:
        n = admin.describe_topics([topic])[topic].num_partitions
    tps = [TopicPartition(topic, p) for p in range(n)]
    out: list[ConsumerRecord] = []
    with Consumer(bootstrap, auto_offset_reset="earliest") as consumer:
        consumer.assign(tps)
        ends = consumer.end_offsets(tps)
        deadline = time.monotonic() + timeout_s
        while any(consumer.position(tp) < ends[tp] for tp in tps):
            assert time.monotonic() < deadline, "reading the topic back took too long"
            out.extend(consumer.poll(timeout_ms=500))
    return out


def model(records: Iterable[ConsumerRecord], *, upto: Mapping[int, int] | None = None,
          value: Callable[[Any], Any] = lambda v: v) -> View:
    """The view of ``records``: latest non-tombstone per key (only offsets <= ``upto[p]`` if given)."""
    latest: dict[bytes, ConsumerRecord] = {}
    for r in records:
        if r.key is None:
            continue
        if upto is not None and r.offset > upto.get(r.partition, -1):
            continue
        old = latest.get(r.key)
        if old is None or (old.partition == r.partition and r.offset > old.offset) or (
            old.partition != r.partition and (r.timestamp_ms, r.partition) > (old.timestamp_ms, old.partition)
        ):
            latest[r.key] = r
    return {k: (r.partition, r.offset, value(r.value)) for k, r in latest.items() if r.value is not None}


def read_view(spark: SparkSession, table: str, value_columns: list[str]) -> View:
    """The Delta table as key -> (partition, offset, value) (value: one column as is, several as a tuple)."""
    df = spark.read.format("delta").load(table) if "/" in table else spark.table(table)
    out: View = {}
    for row in df.collect():
        vals = tuple(row[c] for c in value_columns)
        v = bytes(vals[0]) if len(vals) == 1 and isinstance(vals[0], (bytes, bytearray)) else (
            vals[0] if len(vals) == 1 else vals)
        key = bytes(row["key"])
        assert key not in out, f"key {key!r} has two rows"
        out[key] = (row["_partition"], row["_offset"], v)
    return out
