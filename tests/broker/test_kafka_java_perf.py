"""Apache Kafka's own load generator, ``kafka-producer-perf-test`` (the class
``org.apache.kafka.tools.ProducerPerformance``), writing through the Kafka listener: what it
reports as sent is exactly what logstore's consumer then reads.
"""

from __future__ import annotations

import re
import subprocess
from collections.abc import Iterator

import pytest

pytest.importorskip("kio", reason="the Kafka listener needs kio (Python 3.11+)")

from kafka_tools import NO_KAFKA_JARS, kafka_classpath  # noqa: E402

from logstore import Admin, Consumer, NewTopic, TopicPartition  # noqa: E402
from logstore.broker.embedded import EmbeddedBroker  # noqa: E402

RECORDS = 20_000
RECORD_BYTES = 100


@pytest.fixture(scope="module")
def broker() -> Iterator[EmbeddedBroker]:
    with EmbeddedBroker(kafka_listener="127.0.0.1:0") as b:
        yield b


@pytest.mark.timeout(180)
@pytest.mark.parametrize("compression", ["none", "lz4"])
def test_producer_performance_writes_what_it_reports(broker: EmbeddedBroker, compression: str) -> None:
    classpath = kafka_classpath()
    if classpath is None:
        pytest.skip(NO_KAFKA_JARS)
    topic = f"java-perf-{compression}"
    with Admin(broker.bootstrap) as admin:
        admin.create_topics([NewTopic(topic, 2)])
    done = subprocess.run(
        ["java", "-cp", classpath, "org.apache.kafka.tools.ProducerPerformance", "--topic", topic,
         "--num-records", str(RECORDS), "--record-size", str(RECORD_BYTES), "--throughput", "-1",
         "--producer-props", f"bootstrap.servers={broker.kafka_bootstrap}", "acks=all",
         f"compression.type={compression}", "linger.ms=5"],
        capture_output=True, text=True, timeout=150)
    assert done.returncode == 0, done.stderr[-2000:]
    # Its last line: "20000 records sent, ... records/sec (... MB/sec), ... ms avg latency, ..."
    summary = re.search(r"^(\d+) records sent", done.stdout.strip().splitlines()[-1])
    assert summary is not None and int(summary.group(1)) == RECORDS, done.stdout[-2000:]
    tps = [TopicPartition(topic, p) for p in range(2)]
    with Admin(broker.bootstrap) as admin:
        ends = admin.list_offsets(dict.fromkeys(tps, "latest"))
    assert sum(o.offset for o in ends.values()) == RECORDS
    with Consumer(broker.bootstrap, auto_offset_reset="earliest") as consumer:
        consumer.assign(tps)
        sizes: list[int] = []
        while len(sizes) < RECORDS:
            tables = consumer.poll_arrow(timeout_ms=5_000)
            assert tables, f"read {len(sizes)} of {RECORDS}"
            for table in tables.values():
                sizes += [len(v) for v in table.column("value").to_pylist()]
    assert sizes == [RECORD_BYTES] * RECORDS
