"""The Spark source against a real embedded broker: batch and streaming reads.

Checks what the issue asks: content, order and offsets match what was
produced; every form of starting/ending offsets; subscribePattern picking up
a new topic; admission control; AvailableNow; restart from a checkpoint with
no gaps or duplicates; failOnDataLoss both ways; typed topics; bad options.
"""

from __future__ import annotations

import json
import os
import random
import tempfile
import time
from collections.abc import Sequence

import pyarrow as pa
import pytest
from chispa import assert_df_equality
from pyspark.errors import PySparkException
from pyspark.sql import DataFrame, SparkSession
from pyspark.sql.types import BinaryType, IntegerType, LongType, StringType, StructField, StructType

from logstore.client.rpc import BrokerClient
from logstore.record import build_batch, encode_batch, encode_schema, typed_schema, untyped_schema
from logstore.types import NewTopic, TopicPartition

pytestmark = pytest.mark.timeout(300)


# ---------------------------------------------------------------- helpers


def new_topic(client: BrokerClient, prefix: str, partitions: int = 1, *,
              value_schema: pa.Schema | None = None, **configs: str) -> str:
    name = f"{prefix}-{random.randrange(1 << 30)}"
    errors = client.create_topics([NewTopic(name, num_partitions=partitions, configs=configs,
                                            value_schema=value_schema)])
    assert errors[name] is None, errors
    return name


def produce(client: BrokerClient, topic: str, partition: int, values: Sequence[bytes | None], *,
            keys: Sequence[bytes | None] | None = None, ts: int = 1_700_000_000_000,
            schema: pa.Schema | None = None) -> int:
    """Append one batch; return its base offset."""
    schema = schema or untyped_schema()
    value_array = values if isinstance(values, pa.Array) else pa.array(values, schema.field("value").type)
    batch = build_batch(schema, values=value_array, timestamps_ms=[ts + i for i in range(len(values))],
                        keys=keys)
    data = encode_schema(schema) + encode_batch(batch, base_offset=0).to_bytes()
    (result,) = client.produce([(TopicPartition(topic, partition), data)], acks=-1)
    assert result.error is None, result.error
    return result.base_offsets[0]


def fill(client: BrokerClient, topic: str, partitions: int, per_partition: int, *, tag: str = "v") -> set[tuple[int, int, bytes]]:
    """Produce ``per_partition`` records to each partition in a few batches; return (p, offset, value)."""
    expected = set()
    for p in range(partitions):
        done = 0
        while done < per_partition:
            n = min(per_partition - done, 1 + (done * 7 + p) % 13)
            values = [f"{tag}-{p}-{done + i}".encode() for i in range(n)]
            base = produce(client, topic, p, values, keys=[b"k%d" % (done + i) for i in range(n)])
            expected |= {(p, base + i, v) for i, v in enumerate(values)}
            done += n
    return expected


def rows(df: DataFrame) -> set[tuple[int, int, bytes]]:
    return {(r["partition"], r["offset"], bytes(r["value"])) for r in df.select("partition", "offset", "value").collect()}


def reader(spark: SparkSession, bootstrap: str, **options: str):  # type: ignore[no-untyped-def]
    r = spark.read.format("logstore").option("logstore.bootstrap.servers", bootstrap)
    for k, v in options.items():
        r = r.option(k, v)
    return r


def stream(spark: SparkSession, bootstrap: str, **options: str):  # type: ignore[no-untyped-def]
    r = spark.readStream.format("logstore").option("logstore.bootstrap.servers", bootstrap)
    for k, v in options.items():
        r = r.option(k, v)
    return r.load()


def run_available_now(df: DataFrame, table: str, checkpoint: str, timeout_s: float = 120):  # type: ignore[no-untyped-def]
    q = (df.writeStream.format("memory").queryName(table).option("checkpointLocation", checkpoint)
         .outputMode("append").trigger(availableNow=True).start())
    assert q.awaitTermination(timeout_s), "AvailableNow query did not finish in time"
    if q.exception():
        raise AssertionError(f"query failed: {q.exception()}")
    return q


@pytest.fixture(scope="module")
def client(shared_broker) -> BrokerClient:  # type: ignore[no-untyped-def]
    with BrokerClient(shared_broker.bootstrap) as c:
        yield c


@pytest.fixture
def boot(shared_broker) -> str:  # type: ignore[no-untyped-def]
    return shared_broker.bootstrap


# ---------------------------------------------------------------- batch reads


def test_batch_read_matches_what_was_produced(spark: SparkSession, client: BrokerClient, boot: str) -> None:
    t = new_topic(client, "batch", 3)
    expected = fill(client, t, 3, 40)
    df = reader(spark, boot, subscribe=t).load()
    assert df.schema == StructType([
        StructField("key", BinaryType()), StructField("value", BinaryType()),
        StructField("topic", StringType()), StructField("partition", IntegerType()),
        StructField("offset", LongType()), StructField("timestamp", df.schema["timestamp"].dataType),
        StructField("timestampType", IntegerType()),
    ])
    assert rows(df) == expected
    got = df.orderBy("partition", "offset").collect()
    assert {r["topic"] for r in got} == {t} and {r["timestampType"] for r in got} == {0}
    # Order within each partition is offset order, and offsets are dense from 0.
    for p in range(3):
        offsets = [r["offset"] for r in got if r["partition"] == p]
        assert offsets == list(range(40))
    first = next(r for r in got if r["partition"] == 0 and r["offset"] == 0)
    assert first["key"] == b"k0" and first["timestamp"].timestamp() == pytest.approx(1_700_000_000.0)


def test_batch_starting_and_ending_offsets(spark: SparkSession, client: BrokerClient, boot: str) -> None:
    t = new_topic(client, "range", 2)
    expected = fill(client, t, 2, 30)
    ranged = reader(spark, boot, subscribe=t,
                    startingOffsets=json.dumps({t: {"0": 5, "1": -2}}),
                    endingOffsets=json.dumps({t: {"0": 12, "1": -1}})).load()
    assert rows(ranged) == {(p, o, v) for p, o, v in expected if (p == 0 and 5 <= o < 12) or p == 1}
    # Timestamps: records of partition p have ts base+i within each batch, so use offsets by timestamp.
    by_ts = reader(spark, boot, subscribe=t, startingTimestamp=str(1_700_000_000_000 + 10),
                   endingOffsets="latest").load()
    assert all(o >= 1 for _, o, _ in rows(by_ts))
    with pytest.raises(PySparkException, match="starting offset 20 of .* is after its ending offset 10"):
        reader(spark, boot, subscribe=t, startingOffsets=json.dumps({t: {"0": 20, "1": -2}}),
               endingOffsets=json.dumps({t: {"0": 10, "1": -1}})).load().collect()


def test_min_partitions_splits_large_partitions(spark: SparkSession, client: BrokerClient, boot: str) -> None:
    t = new_topic(client, "split", 1)
    expected = fill(client, t, 1, 100)
    df = reader(spark, boot, subscribe=t, minPartitions="4").load()
    assert df.rdd.getNumPartitions() >= 4
    assert rows(df) == expected
    df = reader(spark, boot, subscribe=t, maxRecordsPerPartition="10").load()
    assert df.rdd.getNumPartitions() == 10
    assert rows(df) == expected


def test_assign_reads_only_the_listed_partitions(spark: SparkSession, client: BrokerClient, boot: str) -> None:
    t = new_topic(client, "assign", 3)
    expected = fill(client, t, 3, 5)
    df = reader(spark, boot, assign=json.dumps({t: [0, 2]})).load()
    assert rows(df) == {e for e in expected if e[0] in (0, 2)}


def test_typed_topic_exposes_value_columns(spark: SparkSession, client: BrokerClient, boot: str) -> None:
    value_schema = pa.schema([("id", pa.int64()), ("name", pa.string()), ("price", pa.float64())])
    t = new_topic(client, "typed", 1, value_schema=value_schema)
    schema = typed_schema(value_schema)
    values = pa.array([{"id": 1, "name": "a", "price": 1.5}, {"id": 2, "name": None, "price": 2.5}, None],
                      schema.field("value").type)
    produce(client, t, 0, values, keys=[b"1", b"2", b"1"], schema=schema)
    df = reader(spark, boot, subscribe=t).load()
    assert df.columns == ["key", "id", "name", "price", "topic", "partition", "offset", "timestamp", "timestampType"]
    expected = spark.createDataFrame(
        [(b"1", 1, "a", 1.5, 0), (b"2", 2, None, 2.5, 1), (b"1", None, None, None, 2)],
        "key binary, id bigint, name string, price double, offset bigint",
    )
    assert_df_equality(df.select("key", "id", "name", "price", "offset"), expected, ignore_row_order=True)


def test_headers_when_asked(spark: SparkSession, client: BrokerClient, boot: str) -> None:
    t = new_topic(client, "hdr", 1)
    schema = untyped_schema()
    batch = build_batch(schema, values=[b"x", b"y"], timestamps_ms=[1, 2],
                        headers=[[{"key": "trace", "value": b"abc"}], None])
    (r,) = client.produce([(TopicPartition(t, 0), encode_schema(schema) + encode_batch(batch, base_offset=0).to_bytes())], acks=1)
    assert r.error is None
    got = reader(spark, boot, subscribe=t, includeHeaders="true").load().orderBy("offset").collect()
    assert [(h["key"], bytes(h["value"])) for h in got[0]["headers"]] == [("trace", b"abc")]
    assert got[1]["headers"] is None
    assert "headers" not in reader(spark, boot, subscribe=t).load().columns


def test_bad_options_fail_at_query_start_naming_the_option(spark: SparkSession, boot: str) -> None:
    with pytest.raises(PySparkException, match="unknown option 'startingoffset'"):
        reader(spark, boot, subscribe="x", startingOffset="earliest").load()
    with pytest.raises(PySparkException, match="exactly one of the options subscribe"):
        reader(spark, boot).load()
    # A stream learns it is a stream only when it starts: the query ends at once with the error.
    q = stream(spark, boot, subscribe="x", endingOffsets="latest").writeStream.format("noop") \
        .option("checkpointLocation", tempfile.mkdtemp()).start()
    with pytest.raises(PySparkException, match="endingOffsets, endingTimestamp and endingOffsetsByTimestamp are for batch"):
        q.awaitTermination(60)
    with pytest.raises(PySparkException, match="startingOffsets = latest is not valid for batch"):
        reader(spark, boot, subscribe="x", startingOffsets="latest").load().collect()


# ---------------------------------------------------------------- streaming


def test_stream_available_now_respects_max_offsets_per_trigger(spark: SparkSession, client: BrokerClient, boot: str) -> None:
    t = new_topic(client, "adm", 2)
    expected = fill(client, t, 2, 60)
    ck = tempfile.mkdtemp()
    q = run_available_now(stream(spark, boot, subscribe=t, startingOffsets="earliest", maxOffsetsPerTrigger="25"),
                          "adm_out", ck)
    sizes = [p["numInputRows"] for p in q.recentProgress if p["numInputRows"]]
    assert sizes == [25, 25, 25, 25, 20]
    assert rows(spark.table("adm_out")) == expected


def test_available_now_stops_at_offsets_seen_at_start(spark: SparkSession, client: BrokerClient, boot: str) -> None:
    t = new_topic(client, "avn", 1)
    fill(client, t, 1, 30)
    df = stream(spark, boot, subscribe=t, startingOffsets="earliest", maxOffsetsPerTrigger="5")

    seen = []

    def each(batch_df: DataFrame, batch_id: int) -> None:
        seen.append(batch_df.count())
        if batch_id == 0:  # data that arrives after the query started is not read
            produce(client, t, 0, [b"late"] * 10)

    q = df.writeStream.foreachBatch(each).option("checkpointLocation", tempfile.mkdtemp()) \
        .trigger(availableNow=True).start()
    assert q.awaitTermination(120)
    assert sum(seen) == 30 and max(seen) <= 5


def test_restart_from_checkpoint_has_no_gaps_or_duplicates(spark: SparkSession, client: BrokerClient, boot: str) -> None:
    t = new_topic(client, "resume", 2)
    expected = fill(client, t, 2, 20, tag="a")
    ck = tempfile.mkdtemp()
    out = tempfile.mkdtemp()
    def run() -> None:
        q = (stream(spark, boot, subscribe=t, startingOffsets="earliest", maxOffsetsPerTrigger="7")
             .select("partition", "offset", "value")
             .writeStream.format("parquet").option("path", out).option("checkpointLocation", ck)
             .trigger(availableNow=True).start())
        assert q.awaitTermination(120)
        assert q.exception() is None
    run()
    expected |= fill(client, t, 2, 15, tag="b")
    run()
    got = spark.read.parquet(out).collect()
    keys = [(r["partition"], r["offset"]) for r in got]
    assert len(keys) == len(set(keys)), "a record was read twice"
    assert {(r["partition"], r["offset"], bytes(r["value"])) for r in got} == expected


def test_continuous_stream_sees_new_records_and_new_pattern_topics(spark: SparkSession, client: BrokerClient, boot: str) -> None:
    prefix = f"pat{random.randrange(1 << 30)}"
    first = f"{prefix}-a"
    assert client.create_topics([NewTopic(first, num_partitions=1)])[first] is None
    produce(client, first, 0, [b"1", b"2"])
    q = (stream(spark, boot, subscribePattern=f"{prefix}-.*", startingOffsets="earliest")
         .select("topic", "offset", "value").writeStream.format("memory").queryName("pattern_out")
         .option("checkpointLocation", tempfile.mkdtemp()).trigger(processingTime="200 milliseconds").start())
    try:
        second = f"{prefix}-b"
        assert client.create_topics([NewTopic(second, num_partitions=2)])[second] is None
        produce(client, second, 1, [b"x", b"y", b"z"])
        produce(client, first, 0, [b"3"])
        deadline = time.monotonic() + 90
        want = {(first, 0, b"1"), (first, 1, b"2"), (first, 2, b"3"),
                (second, 0, b"x"), (second, 1, b"y"), (second, 2, b"z")}
        got: set[tuple[str, int, bytes]] = set()
        while time.monotonic() < deadline and got != want:
            q.processAllAvailable()
            got = {(r[0], r[1], bytes(r[2])) for r in spark.table("pattern_out").collect()}
        assert got == want
    finally:
        q.stop()


def test_min_offsets_per_trigger_waits_for_max_trigger_delay_in_every_query(
        spark: SparkSession, client: BrokerClient, boot: str) -> None:
    """Fewer than minOffsetsPerTrigger records wait maxTriggerDelay, counted from the query's
    start, in each query of a session. The second query runs on a warm JVM and warm Python
    workers, where a batch released at once lands well within the delay (issue 29: the
    minimum alone was handed to Spark as ReadAllAvailable, which released it at once)."""
    t = new_topic(client, "minoff", 1)
    produce(client, t, 0, [b"a"] * 3)
    delay_s = 4.0
    for run in range(2):
        started = time.monotonic()
        q = (stream(spark, boot, subscribe=t, startingOffsets="earliest", minOffsetsPerTrigger="10",
                    maxTriggerDelay=f"{delay_s:g}s")
             .writeStream.format("memory").queryName(f"minoff_out_{run}")
             .option("checkpointLocation", tempfile.mkdtemp())
             .trigger(processingTime="100 milliseconds").start())
        try:
            deadline = started + 60
            while time.monotonic() < deadline and spark.table(f"minoff_out_{run}").count() < 3:
                time.sleep(0.1)
            waited = time.monotonic() - started
            assert spark.table(f"minoff_out_{run}").count() == 3, "maxTriggerDelay must release the batch"
            assert waited >= delay_s, f"query {run}: 3 < minOffsetsPerTrigger records released after {waited:.1f} s"
        finally:
            q.stop()


def run_to_parquet(df: DataFrame, out: str, ck: str) -> None:
    """Run ``df`` with AvailableNow into a parquet directory (a sink that supports restarts)."""
    q = (df.select("offset").writeStream.format("parquet").option("path", out)
         .option("checkpointLocation", ck).trigger(availableNow=True).start())
    q.awaitTermination(120)


def test_fail_on_data_loss_both_ways(spark: SparkSession, client: BrokerClient, boot: str) -> None:
    t = new_topic(client, "loss", 1, **{"segment.bytes": "4096"})
    now_ms = int(time.time() * 1000)  # recent, so time retention leaves the segments alone
    for i in range(30):
        produce(client, t, 0, [os.urandom(200) for _ in range(3)], ts=now_ms + i)
    runs = {name: (tempfile.mkdtemp(), tempfile.mkdtemp()) for name in ("strict", "lenient")}
    for out, ck in runs.values():
        run_to_parquet(stream(spark, boot, subscribe=t, startingOffsets="earliest", maxOffsetsPerTrigger="9"), out, ck)
        assert spark.read.parquet(out).count() == 90
    # Both queries are at offset 90; produce more, then delete part of it before they read it.
    for i in range(30):
        produce(client, t, 0, [os.urandom(200) for _ in range(3)], ts=now_ms + 100 + i)
    (low,) = client.delete_records({TopicPartition(t, 0): 150}).values()
    assert low == 150
    out, ck = runs["strict"]
    with pytest.raises(PySparkException) as info:
        run_to_parquet(stream(spark, boot, subscribe=t), out, ck)
    assert "offsets 90 to 149" in str(info.value) and "failOnDataLoss" in str(info.value)
    assert spark.read.parquet(out).count() == 90
    out, ck = runs["lenient"]
    run_to_parquet(stream(spark, boot, subscribe=t, failOnDataLoss="false"), out, ck)
    offsets = sorted(r["offset"] for r in spark.read.parquet(out).collect())
    assert offsets == list(range(90)) + list(range(150, 180))
