"""The exactly-once Spark sink and the foreachBatch helper.

The kill tests (a log→log query in a child process SIGKILLed at random moments,
restarted from its checkpoint, finished with AvailableNow; topic OUT read with
read_committed must then hold exactly one output per input record) run on a
3-broker cluster whose brokers are killed meanwhile: ``test_cluster_exactly_once.py``
with ``tests/support/sink_chaos.py``.
"""

from __future__ import annotations

import random
import tempfile

import pyarrow as pa
import pytest
from pyspark.errors import PySparkException
from pyspark.sql import SparkSession
from sink_chaos import new_topic, read_committed

import spark_sink
from logstore import Producer


@pytest.fixture
def boot(shared_broker) -> str:  # type: ignore[no-untyped-def]
    return shared_broker.bootstrap


@pytest.mark.timeout(300)
def test_batch_write_routes_by_topic_column_and_is_atomic(spark: SparkSession, boot: str) -> None:
    a, b = new_topic(boot, "wa"), new_topic(boot, "wb", 1)
    df = spark.range(20).selectExpr(
        "cast(id as string) as key", "cast(cast(id as string) as binary) as value",
        f"if(id % 2 = 0, '{a}', '{b}') as topic")
    df.write.format("logstore").option("logstore.bootstrap.servers", boot).mode("append").save()
    got_a = read_committed(boot, a, 2)
    got_b = read_committed(boot, b, 1)
    assert sorted(int(k) for _, _, k, _ in got_a) == list(range(0, 20, 2))
    assert all(int(v) == int(k) for _, _, k, v in got_a)
    assert sorted(int(k) for _, _, k, _ in got_b) == list(range(1, 20, 2))
    # Kafka's partitioner: the same key lands where the Producer would put it.
    with Producer(boot) as p:
        for part, _, key, _ in got_a:
            assert part == p.send(a, b"probe", key=key).result(timeout=30).partition


@pytest.mark.timeout(300)
def test_typed_columns_headers_and_explicit_partition(spark: SparkSession, boot: str) -> None:
    t = new_topic(boot, "typed", 3, pa.schema([("id", pa.int64()), ("name", pa.string())]))
    df = spark.createDataFrame(
        [(b"k1", 1, "a", 2, [("h", b"v")]), (b"k2", 2, None, 0, None)],
        "key binary, id bigint, name string, partition int, headers array<struct<key:string,value:binary>>")
    df.write.format("logstore").option("logstore.bootstrap.servers", boot).option("topic", t).mode("append").save()
    got = sorted(read_committed(boot, t, 3), key=lambda r: r[2])
    assert [(p, k, v) for p, _, k, v in got] == [(2, b"k1", {"id": 1, "name": "a"}), (0, b"k2", {"id": 2, "name": None})]


@pytest.mark.timeout(120)
def test_bad_sink_options(spark: SparkSession, boot: str) -> None:
    df = spark.range(1).selectExpr("cast(cast(id as string) as binary) as value")
    with pytest.raises(PySparkException, match="rows have no topic column and the option topic is not set"):
        df.write.format("logstore").option("logstore.bootstrap.servers", boot).mode("append").save()
    with pytest.raises(PySparkException, match="unknown option 'topics'"):
        df.write.format("logstore").option("topics", "x").mode("append").save()
    with pytest.raises(PySparkException, match="batchId needs the option sinkId"):
        df.write.format("logstore").option("topic", "x").option("batchId", "3").mode("append").save()


@pytest.mark.timeout(300)
def test_foreach_batch_helper_is_a_no_op_for_a_replayed_batch(spark: SparkSession, boot: str) -> None:
    a, b = new_topic(boot, "fa", 1), new_topic(boot, "fb", 1)
    df = spark.range(5).selectExpr("cast(cast(id as string) as binary) as value", f"if(id < 3, '{a}', '{b}') as topic")
    app = f"app-{random.randrange(1 << 30)}"
    spark_sink.write_transactional(df, 0, app_id=app, bootstrap=boot)
    spark_sink.write_transactional(df, 0, app_id=app, bootstrap=boot)  # Spark replays batch 0
    assert len(read_committed(boot, a, 1)) == 3 and len(read_committed(boot, b, 1)) == 2
    spark_sink.write_transactional(df, 1, app_id=app, bootstrap=boot)
    assert len(read_committed(boot, a, 1)) == 6


@pytest.mark.timeout(300)
def test_streaming_log_to_log_in_process(spark: SparkSession, boot: str) -> None:
    src, dst = new_topic(boot, "sin"), new_topic(boot, "sout")
    with Producer(boot) as p:
        p.send_batch(src, pa.table({"key": [f"k{i}" for i in range(50)], "value": [b"%d" % i for i in range(50)]}))
    ck = tempfile.mkdtemp()
    for _ in range(2):  # the second run finds nothing new: nothing is written twice
        q = (spark.readStream.format("logstore").option("logstore.bootstrap.servers", boot).option("subscribe", src)
             .option("startingOffsets", "earliest").option("maxOffsetsPerTrigger", "20").load()
             .selectExpr("key", "value").writeStream.format("logstore").option("logstore.bootstrap.servers", boot)
             .option("topic", dst).option("checkpointLocation", ck).queryName("log-to-log")  # Spark passes it on
             .trigger(availableNow=True).start())
        assert q.awaitTermination(120)
        assert q.name == "log-to-log"
    got = read_committed(boot, dst, 2)
    assert sorted(int(v) for _, _, _, v in got) == list(range(50))
