"""Transactional Kafka producers through the Kafka listener (logstore.broker.kafka.txn_apis).

confluent-kafka's transactional Producer (librdkafka) commits and aborts transactions on a
real broker; what committed is all a ``read_committed`` reader sees, whether that reader is
Kafka's consumer or logstore's own, and a second producer with the same transactional id
fences the first. No component of ours is mocked.
"""

from __future__ import annotations

import random
import time
from collections.abc import Iterator
from typing import Any

import pytest

pytest.importorskip("kio", reason="the Kafka listener needs kio (Python 3.11+)")
ck = pytest.importorskip("confluent_kafka")

from kafka_tools import CLIENT_CONF, kafka_values  # noqa: E402

from logstore import Admin, Consumer, NewTopic, TopicPartition  # noqa: E402
from logstore.broker.embedded import EmbeddedBroker  # noqa: E402

pytestmark = pytest.mark.timeout(120)
_CLIENT = CLIENT_CONF


@pytest.fixture(scope="module")
def broker() -> Iterator[EmbeddedBroker]:
    with EmbeddedBroker(kafka_listener="127.0.0.1:0") as b:
        yield b


def _topic(broker: EmbeddedBroker, partitions: int) -> str:
    name = f"txn-{random.randrange(1 << 30)}"
    with Admin(broker.bootstrap) as admin:
        admin.create_topics([NewTopic(name, num_partitions=partitions)])
    return name


def _producer(broker: EmbeddedBroker, transactional_id: str) -> Any:
    producer = ck.Producer({"bootstrap.servers": broker.kafka_bootstrap, "transactional.id": transactional_id,
                            **_CLIENT})
    producer.init_transactions(30)
    return producer


def _send(producer: Any, topic: str, values: list[bytes]) -> None:
    for i, value in enumerate(values):
        producer.produce(topic, value=value, key=b"k%d" % i, partition=i % 2)
    producer.flush(30)


def _kafka_values(broker: EmbeddedBroker, topic: str, isolation: str, expected: int) -> list[bytes]:
    return kafka_values(broker.kafka_bootstrap, topic, isolation=isolation, expected=expected)


def _logstore_values(broker: EmbeddedBroker, topic: str) -> list[bytes]:
    with Consumer(broker.bootstrap, auto_offset_reset="earliest", isolation_level="read_committed") as consumer:
        consumer.assign([TopicPartition(topic, p) for p in (0, 1)])
        with Admin(broker.bootstrap) as admin:
            ends = admin.list_offsets({TopicPartition(topic, p): "latest" for p in (0, 1)})
        got: list[bytes] = []
        deadline = time.monotonic() + 20
        while time.monotonic() < deadline and any(
                consumer.position(tp) < ends[tp].offset for tp in ends):
            got += [r.value for r in consumer.poll(timeout_ms=500)]
        return sorted(got)


def test_committed_transactions_are_what_read_committed_readers_see(broker: EmbeddedBroker) -> None:
    topic = _topic(broker, 2)
    producer = _producer(broker, f"tx-{topic}")
    producer.begin_transaction()
    _send(producer, topic, [b"c1", b"c2", b"c3"])
    producer.commit_transaction(30)
    producer.begin_transaction()
    _send(producer, topic, [b"a1", b"a2"])
    producer.abort_transaction(30)
    producer.begin_transaction()
    _send(producer, topic, [b"c4"])
    producer.commit_transaction(30)

    committed = [b"c1", b"c2", b"c3", b"c4"]
    assert _kafka_values(broker, topic, "read_committed", 4) == committed
    assert _logstore_values(broker, topic) == committed
    assert _kafka_values(broker, topic, "read_uncommitted", 6) == sorted(committed + [b"a1", b"a2"])


def test_a_new_producer_with_the_same_id_fences_the_old_and_aborts_its_transaction(broker: EmbeddedBroker) -> None:
    topic = _topic(broker, 2)
    old = _producer(broker, f"fence-{topic}")
    old.begin_transaction()
    _send(old, topic, [b"old-1", b"old-2"])

    new = _producer(broker, f"fence-{topic}")  # aborts the old producer's open transaction
    new.begin_transaction()
    _send(new, topic, [b"new-1"])
    new.commit_transaction(30)

    with pytest.raises(ck.KafkaException) as fenced:
        old.commit_transaction(30)
    error = fenced.value.args[0]
    assert (error.code(), error.fatal()) == (ck.KafkaError._FENCED, True), error  # librdkafka's "fenced"
    assert _kafka_values(broker, topic, "read_committed", 1) == [b"new-1"]
    assert _logstore_values(broker, topic) == [b"new-1"]
