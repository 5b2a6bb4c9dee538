"""The Kafka listener against kafka-python, a pure-Python Kafka client (issue 25's client list).

kafka-python's producer (idempotent, gzip), group consumer (Kafka's classic group protocol,
commits), transactional producer with a ``read_committed`` consumer, and admin client,
each checked from the other side with logstore's own clients, on a real broker.
"""

from __future__ import annotations

import random
import time
from collections.abc import Iterator
from typing import Any

import pytest

pytest.importorskip("kio", reason="the Kafka listener needs kio (Python 3.11+)")
kafka = pytest.importorskip("kafka")

from kafka.admin import ConfigResource, ConfigResourceType  # noqa: E402
from kafka.admin import NewTopic as KafkaNewTopic  # noqa: E402

from logstore import Admin, Consumer, NewTopic, Producer, TopicPartition  # noqa: E402
from logstore.broker.embedded import EmbeddedBroker  # noqa: E402

pytestmark = pytest.mark.timeout(120)


@pytest.fixture(scope="module")
def broker() -> Iterator[EmbeddedBroker]:
    with EmbeddedBroker(kafka_listener="127.0.0.1:0") as b:
        yield b


def _topic(broker: EmbeddedBroker, partitions: int = 2) -> str:
    name = f"kp-{random.randrange(1 << 30)}"
    with Admin(broker.bootstrap) as admin:
        admin.create_topics([NewTopic(name, num_partitions=partitions)])
    return name


def _consume_kafka(broker: EmbeddedBroker, topic: str, count: int, **config: Any) -> list[Any]:
    config.setdefault("consumer_timeout_ms", 15_000)  # iteration ends after this long without a record
    consumer = kafka.KafkaConsumer(bootstrap_servers=broker.kafka_bootstrap, auto_offset_reset="earliest", **config)
    try:
        if "group_id" in config:
            consumer.subscribe([topic])
        else:
            consumer.assign([kafka.TopicPartition(topic, p) for p in (0, 1)])
        got = []
        for message in consumer:
            got.append(message)
            if len(got) == count:
                break
        if config.get("group_id"):
            consumer.commit()
        return got
    finally:
        consumer.close()


def test_idempotent_gzip_producer_is_read_by_logstore(broker: EmbeddedBroker) -> None:
    topic = _topic(broker)
    producer = kafka.KafkaProducer(bootstrap_servers=broker.kafka_bootstrap, enable_idempotence=True,
                                   compression_type="gzip", linger_ms=5)
    futures = [producer.send(topic, value=b"v%d" % i, key=b"k%d" % i, partition=i % 2,
                             headers=[("n", str(i).encode())]) for i in range(20)]
    sent = [(f.get(timeout=30).partition, f.get(timeout=30).offset) for f in futures]
    producer.close()
    assert sorted(sent) == sorted((p, o) for p in (0, 1) for o in range(10))
    with Consumer(broker.bootstrap, auto_offset_reset="earliest") as consumer:
        consumer.assign([TopicPartition(topic, p) for p in (0, 1)])
        got: list[Any] = []
        deadline = time.monotonic() + 20
        while len(got) < 20 and time.monotonic() < deadline:
            got += consumer.poll(timeout_ms=500)
    by_value = {r.value: r for r in got}
    assert len(by_value) == 20
    for i, (partition, offset) in enumerate(sent):
        record = by_value[b"v%d" % i]
        assert (record.partition, record.offset, record.key, list(record.headers)) == (
            partition, offset, b"k%d" % i, [("n", str(i).encode())])


def test_group_consumer_reads_and_commits_what_logstore_sees(broker: EmbeddedBroker) -> None:
    topic, group = _topic(broker), f"kp-group-{random.randrange(1 << 30)}"
    with Producer(broker.bootstrap) as producer:
        for i in range(10):
            producer.send(topic, b"v%d" % i, partition=i % 2)
    got = _consume_kafka(broker, topic, 10, group_id=group, enable_auto_commit=False)
    assert sorted(m.value for m in got) == sorted(b"v%d" % i for i in range(10))
    with Consumer(broker.bootstrap, group_id=group) as ours:
        committed = ours.committed([TopicPartition(topic, p) for p in (0, 1)])
    assert {tp.partition: c.offset for tp, c in committed.items() if c is not None} == {0: 5, 1: 5}


def test_transactions_with_a_read_committed_consumer(broker: EmbeddedBroker) -> None:
    topic = _topic(broker)
    producer = kafka.KafkaProducer(bootstrap_servers=broker.kafka_bootstrap, transactional_id=f"kp-tx-{topic}")
    producer.init_transactions()
    producer.begin_transaction()
    for i in range(4):
        producer.send(topic, value=b"committed-%d" % i, partition=i % 2)
    producer.commit_transaction()
    producer.begin_transaction()
    producer.send(topic, value=b"aborted", partition=0)
    producer.flush()
    producer.abort_transaction()
    producer.close()
    # asks for one more than committed: the aborted record must not come within 3 s
    got = _consume_kafka(broker, topic, 5, isolation_level="read_committed", consumer_timeout_ms=3000)
    assert sorted(m.value for m in got) == sorted(b"committed-%d" % i for i in range(4))
    with Consumer(broker.bootstrap, auto_offset_reset="earliest", isolation_level="read_committed") as ours:
        ours.assign([TopicPartition(topic, p) for p in (0, 1)])
        seen: list[Any] = []
        deadline = time.monotonic() + 10
        while len(seen) < 4 and time.monotonic() < deadline:
            seen += ours.poll(timeout_ms=500)
        seen += ours.poll(timeout_ms=500)
    assert sorted(r.value for r in seen) == sorted(b"committed-%d" % i for i in range(4))


def test_admin_client_creates_configures_and_deletes_topics(broker: EmbeddedBroker) -> None:
    admin = kafka.KafkaAdminClient(bootstrap_servers=broker.kafka_bootstrap)
    try:
        name = f"kp-admin-{random.randrange(1 << 30)}"
        admin.create_topics([KafkaNewTopic(name, num_partitions=3, replication_factor=1,
                                           topic_configs={"cleanup.policy": "compact"})])
        with Admin(broker.bootstrap) as ours:
            assert len(ours.describe_topics([name])[name].partitions) == 3
            assert ours.describe_configs([name])[name]["cleanup.policy"] == "compact"
        modified = admin.describe_configs([ConfigResource(ConfigResourceType.TOPIC, name)])["topic"][name]
        assert {k: (v["value"], v["config_source"]) for k, v in modified.items()} == {
            "cleanup.policy": ("compact", "DYNAMIC_TOPIC_CONFIG")}  # the topic's own; defaults filtered out
        assert name in admin.list_topics()
        admin.delete_topics([name])
        with Admin(broker.bootstrap) as ours:
            assert name not in ours.list_topics()
    finally:
        admin.close()
