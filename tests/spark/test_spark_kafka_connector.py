"""Spark's own Kafka connector (spark-sql-kafka-0-10) reads and writes logstore unchanged.

A job that uses ``format("kafka")`` today points ``kafka.bootstrap.servers`` at a logstore
broker's Kafka listener: its batch write, batch read and checkpointed streaming read work,
with the log's offsets. The connector runs in a JVM of its own
(``tests/support/spark_kafka_connector_child.py``; its package comes from Maven Central, as
Delta's does), against a real broker; logstore's own Consumer checks what it wrote.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from pathlib import Path

import pytest

pytest.importorskip("kio", reason="the Kafka listener needs kio (Python 3.11+)")

from logstore import Admin, Consumer, NewTopic, TopicPartition  # noqa: E402
from logstore.broker.embedded import EmbeddedBroker  # noqa: E402

CHILD = Path(__file__).parents[1] / "support" / "spark_kafka_connector_child.py"


@pytest.mark.timeout(600)  # the first run resolves the connector from Maven Central
def test_spark_kafka_connector_writes_and_reads_through_the_kafka_listener(tmp_path: Path) -> None:
    with EmbeddedBroker(str(tmp_path / "data"), kafka_listener="127.0.0.1:0") as broker:
        with Admin(broker.bootstrap) as admin:
            admin.create_topics([NewTopic("spark-kafka", 2)])
        done = subprocess.run(
            [sys.executable, str(CHILD), broker.kafka_bootstrap, broker.bootstrap, "spark-kafka",
             str(tmp_path / "checkpoint")], capture_output=True, text=True, timeout=560, env=dict(os.environ))
        assert done.returncode == 0, done.stderr[-4000:]
        got = json.loads(done.stdout.strip().splitlines()[-1])
        with Consumer(broker.bootstrap, auto_offset_reset="earliest") as consumer:
            consumer.assign([TopicPartition("spark-kafka", p) for p in (0, 1)])
            stored = []
            deadline = time.monotonic() + 60
            while len(stored) < 15 and time.monotonic() < deadline:
                stored += consumer.poll(timeout_ms=2000)
    written = sorted([r.partition, r.offset, r.key.decode(), r.value.decode()] for r in stored)
    assert got["batch"] == [row for row in written if int(row[3][1:]) < 10]  # the log's offsets, keys, values
    assert sorted(key for _, _, key, _ in got["batch"]) == sorted(f"k{i}" for i in range(10))
    assert got["stream1"] == sorted(f"v{i}" for i in range(10))
    assert got["stream2"] == sorted(f"v{i}" for i in range(10, 15))  # resumed from its checkpoint
