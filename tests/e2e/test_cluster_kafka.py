"""Kafka's protocol on a 3-broker cluster (issue 25): Kafka clients route to leaders and coordinators.

A real LocalCluster (etcd and three broker processes, each with a Kafka listener) and
confluent-kafka (librdkafka). Metadata from any broker's Kafka listener names the same
brokers, controller and leaders as logstore's own client; FindCoordinator names the leader
of the key's shard of the coordinator topic, and another broker refuses the group with
NOT_COORDINATOR; a topic Kafka's AdminClient creates with RF=3 is replicated; and an
idempotent acks=all Kafka producer and a Kafka consumer group (the classic protocol) carry
on across a SIGKILL of a broker that leads a partition and coordinates the group, every
acknowledged record read back once at its acknowledged offset.
No component of ours is mocked. One cluster for the file; the SIGKILL test runs last.
"""

from __future__ import annotations

import threading
import time
import zlib
from collections.abc import Iterator
from typing import Any

import pytest

pytest.importorskip("kio", reason="the Kafka listener needs kio (Python 3.11+)")
ck = pytest.importorskip("confluent_kafka")

from cluster_harness import (  # noqa: E402
    cluster_metadata,
    create_topic,
    find_coordinator,
    leaders,
    wait_fully_replicated,
)
from confluent_kafka.admin import AdminClient, NewTopic  # noqa: E402
from kafka_tools import kafka_call, kafka_values  # noqa: E402

from logstore import Admin  # noqa: E402
from logstore import NewTopic as LogstoreTopic  # noqa: E402
from logstore._proto import logstore_pb2 as pb  # noqa: E402
from logstore.dev.local_cluster import LocalCluster  # noqa: E402

pytestmark = pytest.mark.timeout(120)

_CLIENT = {"socket.timeout.ms": 10_000, "reconnect.backoff.max.ms": 500}
FIND_COORDINATOR, OFFSET_FETCH = 10, 9
NOT_COORDINATOR, COORDINATOR_NOT_AVAILABLE, COORDINATOR_LOAD_IN_PROGRESS = 16, 15, 14


@pytest.fixture(scope="module")
def cluster() -> Iterator[LocalCluster]:
    with LocalCluster(3, session_timeout_ms=2000, replica_lag_time_max_ms=2000, kafka=True,
                      extra_config={"group_heartbeat_interval_ms": 500}) as c:
        yield c


def _find(cluster: LocalCluster, node: int, key: str, key_type: int) -> Any:
    """FindCoordinator v3 asked of ``node``'s Kafka listener; waits (bounded) while the
    coordinator topic is being created or its shard loaded."""
    deadline = time.monotonic() + 20
    while True:
        answer = kafka_call(cluster.kafka_address(node), FIND_COORDINATOR, 3, key=key, key_type=key_type)
        if answer.error_code not in (COORDINATOR_NOT_AVAILABLE, COORDINATOR_LOAD_IN_PROGRESS) \
                or time.monotonic() > deadline:
            return answer
        time.sleep(0.2)


def test_metadata_from_every_broker_names_the_leaders_our_client_names(cluster: LocalCluster) -> None:
    topic = "kafka-md"
    with Admin(cluster.bootstrap) as admin:
        admin.create_topics([LogstoreTopic(topic, 3, replication_factor=3)])
    ours = wait_fully_replicated(cluster, topic, 30)
    assert ours is not None, "the topic never became fully replicated"
    expected = {p.partition: (p.leader, sorted(p.replicas), sorted(p.isr)) for p in ours.topics[0].partitions}
    assert all(leader > 0 for leader, _, _ in expected.values())
    brokers = {n: cluster.kafka_address(n) for n in cluster.node_ids}
    for n in cluster.node_ids:  # each broker's Kafka listener, asked alone
        admin = AdminClient({"bootstrap.servers": cluster.kafka_address(n), **_CLIENT})
        theirs = admin.list_topics(topic=topic, timeout=20)
        assert {b.id: f"{b.host}:{b.port}" for b in theirs.brokers.values()} == brokers, n
        assert (theirs.cluster_id, theirs.controller_id) == ("logstore", ours.controller_id), n
        partitions = theirs.topics[topic].partitions
        assert {p.id: (p.leader, sorted(p.replicas), sorted(p.isrs)) for p in partitions.values()} == expected, n


def test_find_coordinator_names_the_leader_of_the_keys_shard(cluster: LocalCluster) -> None:
    for key, key_type, topic, grpc_type in (("kafka-group", 0, "__consumer_offsets", pb.GROUP),
                                            ("kafka-txn", 1, "__transaction_state", pb.TRANSACTION)):
        answers = {n: _find(cluster, n, key, key_type) for n in cluster.node_ids}
        named = {(a.error_code, a.node_id, a.host, a.port) for a in answers.values()}
        assert len(named) == 1, answers  # every broker names the same coordinator
        error_code, node_id, host, port = named.pop()
        assert error_code == 0 and f"{host}:{port}" == cluster.kafka_address(node_id), answers
        shards = cluster_metadata(cluster, topic)
        assert shards is not None
        partitions = sorted(shards.topics[0].partitions, key=lambda p: p.partition)
        assert node_id == partitions[zlib.crc32(key.encode()) % len(partitions)].leader, (key, partitions)
        assert find_coordinator(cluster, grpc_type, key) == node_id  # the gRPC front end agrees
    coordinator = _find(cluster, 1, "kafka-group", 0).node_id
    for n in cluster.node_ids:  # the group's offsets: only from its coordinator
        answer = kafka_call(cluster.kafka_address(n), OFFSET_FETCH, 6, group_id="kafka-group", topics=None)
        assert answer.error_code == (0 if n == coordinator else NOT_COORDINATOR), (n, coordinator, answer)


def test_a_topic_kafkas_admin_client_creates_with_rf_3_is_replicated(cluster: LocalCluster) -> None:
    admin = AdminClient({"bootstrap.servers": cluster.kafka_bootstrap, **_CLIENT})
    created = admin.create_topics([NewTopic("kafka-made", num_partitions=2, replication_factor=3,
                                            config={"min.insync.replicas": "2"}),
                                   NewTopic("kafka-too-many", num_partitions=1, replication_factor=4)])
    created["kafka-made"].result(30)
    with pytest.raises(ck.KafkaException) as refused:
        created["kafka-too-many"].result(30)
    assert refused.value.args[0].code() == ck.KafkaError.INVALID_REPLICATION_FACTOR, refused.value
    with Admin(cluster.bootstrap) as ours:
        description = ours.describe_topics(["kafka-made"])["kafka-made"]
        configs = ours.describe_configs(["kafka-made"])["kafka-made"]
        assert "kafka-too-many" not in ours.list_topics()
    assert [sorted(p.replicas) for p in description.partitions] == [[1, 2, 3], [1, 2, 3]]
    assert configs["min.insync.replicas"] == "2"
    described = admin.describe_configs([ck.admin.ConfigResource("topic", "kafka-made")])
    entries = next(iter(described.values())).result(30)
    assert entries["min.insync.replicas"].value == "2"


def test_a_transaction_spans_partitions_led_by_every_broker_and_commits_its_offsets(
        cluster: LocalCluster) -> None:
    """Read-process-write with ``send_offsets_to_transaction`` on the cluster: the transaction
    coordinator (one shard leader) adds partitions led by all three brokers and the group's
    ``__consumer_offsets`` partition, led by another broker: the group's coordinator checks
    the transaction with it (before, it asked its own transaction coordinator, which answered
    NOT_COORDINATOR until librdkafka gave up), the markers reach every leader, and the group
    coordinator applies the offsets on its marker."""
    source, sink, group = "kafka-txn-in", "kafka-txn-out", "kafka-txn-group"
    group_coordinator = _find(cluster, cluster.node_ids[0], group, 0).node_id
    transactional_id = next(t for t in (f"kafka-txn-{i}" for i in range(64))
                            if _find(cluster, cluster.node_ids[0], t, 1).node_id != group_coordinator)
    for topic in (source, sink):
        create_topic(cluster, topic, 3, replication_factor=3, min_insync_replicas=2)
        assert wait_fully_replicated(cluster, topic, 30) is not None
    assert len(set(leaders(cluster, sink).values())) == 3, "each broker should lead a partition"
    plain = ck.Producer({"bootstrap.servers": cluster.kafka_bootstrap, "acks": "all", **_CLIENT})
    for i in range(6):
        plain.produce(source, value=b"in-%d" % i, partition=i % 3)
    assert plain.flush(30) == 0
    consumer = ck.Consumer({"bootstrap.servers": cluster.kafka_bootstrap, "group.id": group,
                            "isolation.level": "read_committed", "auto.offset.reset": "earliest",
                            "enable.auto.commit": False, **_CLIENT})
    producer = ck.Producer({"bootstrap.servers": cluster.kafka_bootstrap, "transactional.id": transactional_id,
                            **_CLIENT})
    try:
        producer.init_transactions(30)
        consumer.subscribe([source])
        read: list[Any] = []
        deadline = time.monotonic() + 30
        while len(read) < 6 and time.monotonic() < deadline:
            message = consumer.poll(0.5)
            if message is not None and message.error() is None:
                read.append(message)
        assert len(read) == 6
        producer.begin_transaction()
        for m in read:
            producer.produce(sink, value=b"out-" + m.value(), partition=m.partition())
        ends: dict[int, int] = {}
        for m in read:
            ends[m.partition()] = max(ends.get(m.partition(), 0), m.offset() + 1)
        producer.send_offsets_to_transaction([ck.TopicPartition(source, p, o) for p, o in ends.items()],
                                             consumer.consumer_group_metadata(), 30)
        producer.commit_transaction(30)
    finally:
        consumer.close()
    assert kafka_values(cluster.kafka_bootstrap, sink, isolation="read_committed", expected=6,
                        partitions=(0, 1, 2)) == sorted(b"out-in-%d" % i for i in range(6))
    with Admin(cluster.bootstrap) as admin:
        committed = {tp.partition: o.offset for tp, o in admin.list_group_offsets(group).items()}
    assert committed == {0: 2, 1: 2, 2: 2}


class _GroupReader(threading.Thread):
    """A Kafka consumer of ``group`` subscribed to ``topic``, recording every record it reads."""

    def __init__(self, bootstrap: str, topic: str, group: str) -> None:
        super().__init__(name="kafka-group-reader", daemon=True)
        self.consumer = ck.Consumer({
            "bootstrap.servers": bootstrap, "group.id": group, "auto.offset.reset": "earliest",
            "enable.auto.commit": True, "auto.commit.interval.ms": 200, **_CLIENT})
        self.consumer.subscribe([topic])
        self.read: list[tuple[int, int, bytes]] = []
        self.errors: list[str] = []
        self._stopping = threading.Event()

    def run(self) -> None:
        while not self._stopping.is_set():
            msg = self.consumer.poll(0.2)
            if msg is None:
                continue
            if msg.error() is not None:
                self.errors.append(str(msg.error()))  # transient ones while the leader moves; logged below
                continue
            self.read.append((msg.partition(), msg.offset(), msg.value()))

    def stop(self) -> None:
        self._stopping.set()
        self.join(30)
        self.consumer.close()


def test_kafka_producer_and_consumer_group_carry_on_across_a_leader_sigkill(cluster: LocalCluster) -> None:
    topic, group, count = "kafka-kill", "kafka-kill-group", 600
    create_topic(cluster, topic, 3, replication_factor=3, min_insync_replicas=2)
    assert wait_fully_replicated(cluster, topic, 30) is not None
    # The victim leads a partition and coordinates the group: both move when it dies.
    deadline = time.monotonic() + 20
    while (victim := find_coordinator(cluster, pb.GROUP, group)) is None and time.monotonic() < deadline:
        time.sleep(0.2)
    led = leaders(cluster, topic)
    assert victim in led.values(), (victim, led)  # three partitions, three brokers: each leads one
    moved = [p for p, leader in led.items() if leader == victim]
    acked: dict[tuple[int, int], bytes] = {}
    failed: list[str] = []

    def report(err: Any, msg: Any) -> None:
        if err is not None:
            failed.append(f"{msg.value()!r}: {err}")
        else:
            acked[(msg.partition(), msg.offset())] = msg.value()

    producer = ck.Producer({"bootstrap.servers": cluster.kafka_bootstrap, "enable.idempotence": True,
                            "acks": "all", "linger.ms": 5, "message.timeout.ms": 60_000, **_CLIENT})
    reader = _GroupReader(cluster.kafka_bootstrap, topic, group)
    reader.start()
    try:
        for i in range(count):
            producer.produce(topic, key=f"k{i}".encode(), value=f"v{i}".encode(), on_delivery=report)
            producer.poll(0)
            if i == count // 3:
                assert producer.flush(30) == 0
                cluster.kill(victim)  # mid-stream: SIGKILL
            time.sleep(0.005)  # the records after the kill span the fail-over (~2 s session)
        assert producer.flush(60) == 0, "records still queued 60 s after the last was produced"
        deadline = time.monotonic() + 45
        while not set(acked) <= {(p, o) for p, o, _ in reader.read} and time.monotonic() < deadline:
            time.sleep(0.2)
        led_after = leaders(cluster, topic)
        coordinator_after = find_coordinator(cluster, pb.GROUP, group)
    finally:
        reader.stop()
        cluster.start(victim)
    assert not failed, failed[:5]
    assert len(acked) == count and sorted(acked.values()) == sorted(f"v{i}".encode() for i in range(count))
    read: dict[tuple[int, int], bytes] = {}
    for partition, offset, value in reader.read:  # a record read again after a rebalance: the same one
        assert read.setdefault((partition, offset), value) == value, (partition, offset)
    assert read == acked, (f"{len(set(acked) - set(read))} acknowledged records never read, "
                           f"{len(set(read) - set(acked))} read but never acknowledged; reader errors "
                           f"{reader.errors[:5]}")
    assert all(led_after.get(p) not in (None, -1, victim) for p in moved), (victim, led_after)  # they moved
    assert coordinator_after not in (None, victim), (victim, coordinator_after)
