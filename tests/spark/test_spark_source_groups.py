"""The Spark source reporting its progress as a consumer group's committed offsets
(options commitOffsetsToGroup / groupIdPrefix): option rules, best-effort commits that never
fail the query, and a streaming query whose group shows no lag once it caught up.
"""

from __future__ import annotations

import logging
import random
import socket
import tempfile

import pytest

from logstore import Admin, Consumer, Producer, TopicPartition
from spark_source.options import SourceOptionError, parse_source_options
from spark_source.rows import OutputShape
from spark_source.source import LogstoreStreamReader

pytestmark = pytest.mark.timeout(300)


def parse(streaming: bool = True, **opts: str):  # type: ignore[no-untyped-def]
    base = {"logstore.bootstrap.servers": "127.0.0.1:9999", "subscribe": "t"}
    return parse_source_options({**base, **{k.lower(): v for k, v in opts.items()}}, streaming=streaming)


def test_group_reporting_options() -> None:
    assert parse(commitOffsetsToGroup="lag-view").commit_offsets_to_group == "lag-view"
    assert parse(groupIdPrefix="spark-q").group_id_prefix == "spark-q"
    assert parse().commit_offsets_to_group is None and parse().group_id_prefix is None
    for opts, fragment in [
        ({"commitOffsetsToGroup": "a", "groupIdPrefix": "b"}, "not both"),
        ({"commitOffsetsToGroup": ""}, "not a usable group id"),
        ({"groupIdPrefix": "x" * 230}, "33-character suffix"),
        ({"commitOffsetsToGroup": "a\tb"}, "control"),
    ]:
        with pytest.raises(SourceOptionError, match=fragment):
            parse(**opts)
    with pytest.raises(SourceOptionError, match="streaming queries only"):
        parse(streaming=False, commitOffsetsToGroup="g")
    with pytest.raises(SourceOptionError, match="commitOffsetsToGroup"):
        parse(**{"kafka.group.id": "g"})


def test_group_prefix_names_a_new_group_per_run() -> None:
    shape = OutputShape(None, include_headers=False)
    first = LogstoreStreamReader(parse(groupIdPrefix="spark-q"), shape)
    second = LogstoreStreamReader(parse(groupIdPrefix="spark-q"), shape)
    assert first.report_group and first.report_group.startswith("spark-q-")
    assert first.report_group != second.report_group
    assert LogstoreStreamReader(parse(commitOffsetsToGroup="g"), shape).report_group == "g"
    assert LogstoreStreamReader(parse(), shape).report_group is None


def test_a_failed_report_is_logged_and_never_raised(shared_broker, caplog) -> None:  # type: ignore[no-untyped-def]
    boot = shared_broker.bootstrap
    topic = f"sg-{random.randrange(1 << 30)}"
    with Admin(boot) as admin:
        admin.create_topic(topic, 1)
    shape = OutputShape(None, include_headers=False)
    reader = LogstoreStreamReader(parse_source_options(
        {"logstore.bootstrap.servers": boot, "subscribe": topic, "commitoffsetstogroup": f"busy-{topic}"},
        streaming=True), shape)
    # The group has an active member: a commit from outside it is refused (NON_EMPTY_GROUP).
    with Consumer(boot, group_id=f"busy-{topic}", subscribe=[topic], fetch_max_wait_ms=50) as active:
        for _ in range(40):
            active.poll(timeout_ms=50)
            if active.assignment():
                break
        with caplog.at_level(logging.WARNING, logger="logstore.spark_source"):
            reader.commit({topic: {"0": 0}})
        assert "NON_EMPTY_GROUP" in caplog.text
    # No broker at all.
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        dead = f"127.0.0.1:{s.getsockname()[1]}"
    nowhere = LogstoreStreamReader(parse_source_options(
        {"logstore.bootstrap.servers": dead, "subscribe": topic, "commitoffsetstogroup": "g"}, streaming=True), shape)
    caplog.clear()
    with caplog.at_level(logging.WARNING, logger="logstore.spark_source"):
        nowhere.commit({topic: {"0": 3}})
    assert "could not report" in caplog.text
    reader.stop()
    nowhere.stop()


def test_streaming_query_reports_its_offsets_to_the_group(spark, shared_broker) -> None:  # type: ignore[no-untyped-def]
    boot = shared_broker.bootstrap
    topic = f"sg-{random.randrange(1 << 30)}"
    group = f"spark-{topic}"
    with Admin(boot) as admin:
        admin.create_topic(topic, 2)
    with Producer(boot) as p:
        for i in range(30):
            p.send(topic, b"v%d" % i, partition=i % 2)
        p.flush(30)
    q = (spark.readStream.format("logstore").option("logstore.bootstrap.servers", boot)
         .option("subscribe", topic).option("startingOffsets", "earliest").option("maxOffsetsPerTrigger", "10")
         .option("commitOffsetsToGroup", group).load()
         .writeStream.format("memory").queryName(f"sg_{abs(hash(topic))}")
         .option("checkpointLocation", tempfile.mkdtemp()).trigger(availableNow=True).start())
    assert q.awaitTermination(120)
    assert q.exception() is None
    with Admin(boot) as admin:
        offsets = admin.list_group_offsets(group)
        lag = admin.group_lag(group)
    assert {tp: o.offset for tp, o in offsets.items()} == {TopicPartition(topic, 0): 15, TopicPartition(topic, 1): 15}
    assert [(r.partition, r.lag) for r in lag] == [(0, 0), (1, 0)]
