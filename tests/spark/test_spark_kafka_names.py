"""Spark's Kafka option names on format ``logstore``, and one-line errors (issue 13).

* Spark's Kafka connector spellings are synonyms of ours (``kafka.bootstrap.servers``,
  ``kafka.isolation.level``, ``kafkaConsumer.pollTimeoutMs``); both spellings with
  different values fail naming both; ``fetchOffset.numRetries``/``retryIntervalMs``
  retry the driver's partition lookups.
* A batch read of an unknown topic, ``endingOffsets`` on a stream, a
  ``startingOffsets`` JSON that leaves out partitions, and a write to a missing
  output topic each fail with one message naming the option and what to do.

The parsing tests need no Spark; the others share the session's SparkSession
and the embedded broker of ``conftest.py``.
"""

from __future__ import annotations

import logging
import random
import socket
import tempfile
import time

import pytest
from pyspark.errors import PySparkException
from pyspark.sql import SparkSession

from logstore import Consumer
from logstore.client.admin import Admin
from logstore.client.rpc import BrokerClient
from logstore.errors import BrokerUnavailableError
from logstore.types import NewTopic, TopicPartition
from spark_sink.options import SinkOptionError, parse_sink_options
from spark_source.options import OffsetSpec, SourceOptionError, parse_source_options
from spark_source.planner import PartitionBounds, discover, resolve_positions

pytestmark = pytest.mark.timeout(300)


def new_topic(boot: str, prefix: str, partitions: int) -> str:
    name = f"{prefix}-{random.randrange(1 << 30)}"
    with Admin(boot) as admin:
        admin.create_topics([NewTopic(name, num_partitions=partitions)])
    return name


def fill(spark: SparkSession, boot: str, topic: str, n: int) -> None:
    """Write ``n`` records (values "0".."n-1") through our own sink."""
    (spark.range(n).selectExpr("cast(id as string) as key", "cast(cast(id as string) as binary) as value")
     .write.format("logstore").option("logstore.bootstrap.servers", boot).option("topic", topic)
     .mode("append").save())


@pytest.fixture
def boot(shared_broker) -> str:  # type: ignore[no-untyped-def]
    return shared_broker.bootstrap


# ---------------------------------------------------------------- parsing (no Spark)


def test_kafka_spellings_mean_our_options() -> None:
    o = parse_source_options({
        "kafka.bootstrap.servers": "10.0.0.5:9092", "subscribe": "t",
        "kafka.isolation.level": "read_uncommitted", "kafkaConsumer.pollTimeoutMs": "5000",
        "fetchOffset.numRetries": "7", "fetchOffset.retryIntervalMs": "250",
    }, streaming=True)
    assert (o.bootstrap, o.isolation_level, o.fetch_timeout_ms) == ("10.0.0.5:9092", "read_uncommitted", 5000)
    assert (o.fetch_offset_num_retries, o.fetch_offset_retry_interval_ms) == (7, 250)
    defaults = parse_source_options({"subscribe": "t"}, streaming=True)
    assert (defaults.fetch_offset_num_retries, defaults.fetch_offset_retry_interval_ms) == (3, 10)
    # Both spellings with one value: fine. Spark passes keys lower-cased.
    same = parse_source_options({"kafka.bootstrap.servers": "h:1", "logstore.bootstrap.servers": "h:1",
                                 "subscribe": "t"}, streaming=False)
    assert same.bootstrap == "h:1"
    assert parse_sink_options({"kafka.bootstrap.servers": "h:2", "topic": "t"}, streaming=False).bootstrap == "h:2"


@pytest.mark.parametrize(("theirs", "ours", "a", "b"), [
    ("kafka.bootstrap.servers", "logstore.bootstrap.servers", "h:1", "h:2"),
    ("kafka.isolation.level", "isolationLevel", "read_committed", "read_uncommitted"),
    ("kafkaConsumer.pollTimeoutMs", "fetchTimeoutMs", "1000", "2000"),
])
def test_both_spellings_with_different_values_is_one_clear_error(theirs: str, ours: str, a: str, b: str) -> None:
    with pytest.raises(SourceOptionError, match=rf"options {theirs.lower()} = '{a}' and {ours.lower()} = '{b}' "
                                                "are the same option with different values; give one of them"):
        parse_source_options({theirs: a, ours: b, "subscribe": "t"}, streaming=True)


def test_sink_both_bootstrap_spellings_disagree() -> None:
    with pytest.raises(SinkOptionError, match="kafka.bootstrap.servers = 'h:1' and logstore.bootstrap.servers = 'h:2'"):
        parse_sink_options({"kafka.bootstrap.servers": "h:1", "logstore.bootstrap.servers": "h:2", "topic": "t"},
                           streaming=False)


def test_bad_kafka_spelled_values_name_the_option() -> None:
    with pytest.raises(SourceOptionError, match="fetchOffset.numRetries must be >= 0"):
        parse_source_options({"subscribe": "t", "fetchOffset.numRetries": "-1"}, streaming=True)
    with pytest.raises(SourceOptionError, match="fetchOffset.retryIntervalMs = 'soon' is not an integer"):
        parse_source_options({"subscribe": "t", "fetchOffset.retryIntervalMs": "soon"}, streaming=True)
    with pytest.raises(SourceOptionError, match="isolationLevel must be read_committed or read_uncommitted"):
        parse_source_options({"subscribe": "t", "kafka.isolation.level": "dirty"}, streaming=True)


def test_offsets_json_must_list_every_partition_of_a_topic_it_names() -> None:
    opts = parse_source_options({"subscribe": "a,b", "startingOffsets": '{"a": {"0": 5, "2": -2}}'},
                                streaming=False)
    bounds = {TopicPartition(t, p): PartitionBounds(0, 10) for t, n in (("a", 3), ("b", 2)) for p in range(n)}
    # The client is not consulted for JSON offsets: the check runs before any lookup.
    with pytest.raises(SourceOptionError, match="option startingOffsets names topic 'a' but leaves out its "
                                                "partitions 1; list every partition"):
        resolve_positions(None, opts.starting, bounds, opts, starting=True)  # type: ignore[arg-type]
    full = OffsetSpec("offsets", offsets={"a": {0: 5, 1: -1, 2: -2}})
    got = resolve_positions(None, full, bounds, opts, starting=True)  # type: ignore[arg-type]
    # Topic b is not named: it starts at earliest.
    assert got == {TopicPartition("a", 0): 5, TopicPartition("a", 1): 10, TopicPartition("a", 2): 0,
                   TopicPartition("b", 0): 0, TopicPartition("b", 1): 0}
    ending = OffsetSpec("offsets", offsets={"b": {1: 4}})
    with pytest.raises(SourceOptionError, match="option endingOffsets names topic 'b' but leaves out its partitions 0"):
        resolve_positions(None, ending, bounds, opts, starting=False)  # type: ignore[arg-type]


@pytest.mark.timeout(60)
def test_fetch_offset_retries_are_spaced_and_counted(caplog: pytest.LogCaptureFixture) -> None:
    s = socket.socket()
    s.bind(("127.0.0.1", 0))
    port = s.getsockname()[1]
    s.close()  # nobody listens there: every lookup fails at once, retriably
    opts = parse_source_options({"subscribe": "t", "kafka.bootstrap.servers": f"127.0.0.1:{port}",
                                 "fetchOffset.numRetries": "2", "fetchOffset.retryIntervalMs": "200"},
                                streaming=True)
    caplog.set_level(logging.WARNING, logger="logstore.spark_source")
    began = time.monotonic()
    with BrokerClient(opts.bootstrap) as client, pytest.raises(BrokerUnavailableError):
        discover(client, opts)
    assert time.monotonic() - began >= 0.4
    retries = [r.getMessage() for r in caplog.records if "retry" in r.getMessage()]
    assert [m.rsplit("; ", 1)[1] for m in retries] == ["retry 1 of 2 in 200 ms", "retry 2 of 2 in 200 ms"]


# ---------------------------------------------------------------- Spark, real broker


def test_batch_read_and_write_with_kafka_spellings(spark: SparkSession, boot: str) -> None:
    src, dst = new_topic(boot, "kn-src", 2), new_topic(boot, "kn-dst", 1)
    fill(spark, boot, src, 30)
    df = (spark.read.format("logstore").option("kafka.bootstrap.servers", boot).option("subscribe", src)
          .option("kafka.isolation.level", "read_committed").option("kafkaConsumer.pollTimeoutMs", "30000")
          .option("fetchOffset.numRetries", "1").option("fetchOffset.retryIntervalMs", "5").load())
    assert sorted(int(bytes(r["value"])) for r in df.select("value").collect()) == list(range(30))
    (df.selectExpr("key", "value").write.format("logstore").option("kafka.bootstrap.servers", boot)
     .option("topic", dst).mode("append").save())
    with Consumer(boot, isolation_level="read_committed") as c:
        c.assign([TopicPartition(dst, 0)])
        c.seek_to_beginning()
        got: list[bytes] = []
        deadline = time.monotonic() + 30
        while len(got) < 30 and time.monotonic() < deadline:
            got.extend(r.value for r in c.poll(timeout_ms=200))
    assert sorted(int(v) for v in got) == list(range(30))


def test_batch_read_of_an_unknown_topic_names_it_and_how_to_create_it(spark: SparkSession, boot: str) -> None:
    with pytest.raises(PySparkException) as info:
        (spark.read.format("logstore").option("kafka.bootstrap.servers", boot)
         .option("subscribe", "no-such-topic").load().collect())
    text = str(info.value)
    assert "topic 'no-such-topic' named in the option subscribe does not exist" in text
    assert f"logstore topics create no-such-topic --partitions N --bootstrap {boot}" in text
    assert "AssertionError" not in text


@pytest.mark.parametrize(("option", "value", "says"), [
    ("maxOffsetsPerTrigger", "abc", "[INVALID_CONFIG] option maxOffsetsPerTrigger = 'abc' is not an integer"),
    ("startingOffsets", "{not json", "[INVALID_CONFIG] option startingOffsets"),
    ("noSuchOption", "1", "[INVALID_CONFIG]"),
])
def test_a_bad_option_is_one_line_that_starts_with_the_message(spark: SparkSession, boot: str, option: str,
                                                                 value: str, says: str) -> None:
    # register() turned on Spark's hideTraceback: no Python traceback before our line.
    with pytest.raises(PySparkException) as info:
        (spark.read.format("logstore").option("kafka.bootstrap.servers", boot).option("subscribe", "t")
         .option(option, value).load().collect())
    first, *rest = str(info.value).splitlines()
    assert says in first, str(info.value)
    assert "Traceback" not in str(info.value) and len(rest) <= 1, str(info.value)  # at most " SQLSTATE: ..."


def test_batch_read_of_an_empty_topic_is_empty(spark: SparkSession, boot: str) -> None:
    t = new_topic(boot, "kn-empty", 2)
    df = spark.read.format("logstore").option("kafka.bootstrap.servers", boot).option("subscribe", t).load()
    assert df.count() == 0


def test_starting_offsets_leaving_out_partitions_is_refused(spark: SparkSession, boot: str) -> None:
    t = new_topic(boot, "kn-part", 3)
    with pytest.raises(PySparkException, match=f"option startingOffsets names topic '{t}' but leaves out its "
                                               "partitions 1, 2"):
        (spark.read.format("logstore").option("kafka.bootstrap.servers", boot).option("subscribe", t)
         .option("startingOffsets", f'{{"{t}": {{"0": 0}}}}').load().collect())


def test_ending_offsets_on_a_stream_is_our_error_not_pysparks(spark: SparkSession, boot: str) -> None:
    t = new_topic(boot, "kn-end", 1)
    df = (spark.readStream.format("logstore").option("kafka.bootstrap.servers", boot).option("subscribe", t)
          .option("endingOffsets", "latest").load())
    with pytest.raises(PySparkException) as info:
        q = df.writeStream.format("noop").option("checkpointLocation", tempfile.mkdtemp()).start()
        q.awaitTermination(60)
    text = str(info.value)
    assert "endingOffsets, endingTimestamp and endingOffsetsByTimestamp are for batch queries only" in text
    assert "UnboundLocalError" not in text


def test_missing_output_topic_is_one_error_before_any_task(spark: SparkSession, boot: str) -> None:
    df = spark.range(3).selectExpr("cast(cast(id as string) as binary) as value")
    hint = f"create it first: logstore topics create kn-missing --partitions N --bootstrap {boot}"
    with pytest.raises(PySparkException) as info:
        df.write.format("logstore").option("kafka.bootstrap.servers", boot).option("topic", "kn-missing") \
            .mode("append").save()
    assert "output topic 'kn-missing' (option topic) does not exist" in str(info.value)
    assert hint in str(info.value)
    assert "UNKNOWN_TOPIC_OR_PARTITION" in str(info.value)  # the error's code, once
    stream = (spark.readStream.format("rate").option("rowsPerSecond", "1").load()
              .selectExpr("cast(cast(value as string) as binary) as value"))
    with pytest.raises(PySparkException) as info:
        q = (stream.writeStream.format("logstore").option("logstore.bootstrap.servers", boot)
             .option("topic", "kn-missing").option("checkpointLocation", tempfile.mkdtemp()).start())
        try:
            q.awaitTermination(60)
        finally:
            q.stop()
    assert hint in str(info.value)
