"""Transactions on a real 3-broker cluster: markers on partition leaders wherever they are.

A transaction's partitions are led by different brokers; the transaction coordinator
(the leader of the transactional id's ``__transaction_state`` partition, found with
FindCoordinator) writes the markers it leads itself and sends the others with
``WriteTxnMarkers`` to their leaders. Checked through
the public clients: a read_committed consumer sees a committed transaction on every
partition and nothing of an aborted one; and a commit decided while one leader is
stopped, then SIGKILLed, lands on that partition once a new leader is elected (the
transactional id refusing a new transaction with CONCURRENT_TRANSACTIONS meanwhile).
"""

from __future__ import annotations

import time
from collections.abc import Iterator

import pytest
from cluster_harness import find_coordinator
from cluster_harness import leaders as leaders_of

from logstore._proto import logstore_pb2 as pb
from logstore.client.admin import Admin
from logstore.client.consumer import Consumer
from logstore.client.error_mapping import raise_for_item
from logstore.client.producer import Producer
from logstore.client.rpc import BrokerClient
from logstore.dev.local_cluster import LocalCluster
from logstore.errors import ConcurrentTransactionsError, InvalidTxnStateError
from logstore.record import (
    ATTR_TRANSACTIONAL,
    build_batch,
    encode_batch,
    encode_schema,
    untyped_schema,
)
from logstore.types import NewTopic, TopicPartition

pytestmark = pytest.mark.timeout(120)

@pytest.fixture(scope="module")
def cluster() -> Iterator[LocalCluster]:
    # A stopped broker keeps its leaderships for the session timeout: longer than the decision's
    # wait for the in-sync replicas of __transaction_state (the stopped broker leaves that ISR
    # after replica_lag_time_max_ms) plus one marker attempt (2 s), so a commit decided meanwhile
    # has its marker pending for a while.
    with LocalCluster(3, session_timeout_ms=10_000, replica_lag_time_max_ms=2000) as c:
        yield c


def _topic_led_by_every_broker(cluster: LocalCluster, topic: str) -> dict[int, int]:
    """Create a 3-partition RF 3 topic; return partition → leader (all three brokers lead one)."""
    with Admin(cluster.bootstrap) as admin:
        admin.create_topics([NewTopic(topic, 3, replication_factor=3, configs={"min.insync.replicas": "2"})])
    deadline = time.monotonic() + 30
    while time.monotonic() < deadline:
        leaders = leaders_of(cluster, topic)
        if sorted(leaders.values()) == [1, 2, 3]:
            return leaders
        time.sleep(0.1)
    raise AssertionError(f"{topic}'s leaders are not spread over the three brokers: {leaders}")


def _read_committed(cluster: LocalCluster, topic: str, expected: int, timeout_s: float = 60) -> list[bytes]:
    got: list[bytes] = []
    with Consumer(cluster.bootstrap, auto_offset_reset="earliest", isolation_level="read_committed") as consumer:
        consumer.assign([TopicPartition(topic, p) for p in range(3)])
        deadline = time.monotonic() + timeout_s
        while len(got) < expected and time.monotonic() < deadline:
            got += [r.value for r in consumer.poll(0.5)]
        got += [r.value for r in consumer.poll(0.5)]  # nothing more may come
    return sorted(got)


def test_a_transaction_over_partitions_led_by_all_three_brokers(cluster: LocalCluster) -> None:
    topic = "txn-spread"
    leaders = _topic_led_by_every_broker(cluster, topic)
    with Producer(cluster.bootstrap, transactional_id="spread", acks="all") as producer:
        producer.init_transactions()
        producer.begin_transaction()
        for p in range(3):
            producer.send(topic, f"aborted-{p}".encode(), partition=p)
        producer.abort_transaction()
        producer.begin_transaction()
        for p in range(3):
            producer.send(topic, f"committed-{p}".encode(), partition=p)
        producer.commit_transaction()
    assert _read_committed(cluster, topic, 3) == [f"committed-{p}".encode() for p in range(3)], leaders


def _transactional_batch(producer_id: int, epoch: int) -> bytes:
    schema = untyped_schema()
    batch = build_batch(schema, values=[b"hanging"], timestamps_ms=[1_000])
    return encode_schema(schema) + encode_batch(batch, base_offset=0, producer_id=producer_id, producer_epoch=epoch,
                                                base_sequence=0, attributes=ATTR_TRANSACTIONAL).to_bytes()


def test_no_transaction_opens_where_its_coordinator_did_not_add_the_partition(cluster: LocalCluster) -> None:
    """A transactional batch for a partition its transaction never added is refused on every
    leader, the transaction coordinator's and the two others alike (before, the two others took
    it: a transaction no coordinator knew, open forever, and read_committed readers stalled)."""
    topic = "txn-unverified"
    leaders = _topic_led_by_every_broker(cluster, topic)
    tps = [TopicPartition(topic, p) for p in range(3)]
    with BrokerClient(cluster.bootstrap) as client:
        pid, epoch = client.init_producer_id("never-added")
        for transactional_id in ("never-added", ""):
            errors: dict[int, type | None] = {}
            deadline = time.monotonic() + 20
            while time.monotonic() < deadline:  # a leader may not have taken its leadership yet
                answers = client.produce_async([(tp, _transactional_batch(pid, epoch)) for tp in tps], acks=-1,
                                               transactional_id=transactional_id).result(30)
                errors = {a.partition: type(a.error) for a in answers}
                if not any(a.error is not None and a.error.retriable for a in answers):
                    break
                time.sleep(0.2)
            assert errors == dict.fromkeys(range(3), InvalidTxnStateError), (transactional_id, leaders, answers)
    with Producer(cluster.bootstrap, acks="all") as producer:
        for p in range(3):
            producer.send(topic, f"after-{p}".encode(), partition=p)
        producer.flush(30)
    assert _read_committed(cluster, topic, 3, timeout_s=20) == [f"after-{p}".encode() for p in range(3)]


def test_markers_land_on_a_partition_whose_leader_died_after_the_decision(cluster: LocalCluster) -> None:
    topic = "txn-leader-dies"
    leaders = _topic_led_by_every_broker(cluster, topic)
    with Producer(cluster.bootstrap, transactional_id="leader-dies", acks="all") as producer:
        producer.init_transactions()
        coordinator = find_coordinator(cluster, pb.TRANSACTION, "leader-dies")
        victim_partition = next(p for p, leader in leaders.items() if leader != coordinator)
        victim = leaders[victim_partition]
        producer.begin_transaction()
        for p in range(3):
            producer.send(topic, f"v-{p}".encode(), partition=p)
        producer.flush()
        cluster.pause(victim)  # its marker cannot land: the commit is decided, the marker pending
        try:
            producer.commit_transaction()
            # No new transaction before the markers. Asked once, of the coordinator itself: the
            # client would retry CONCURRENT_TRANSACTIONS until its deadline, and a bootstrap list
            # led by the paused broker would spend that deadline connecting to it.
            with BrokerClient(cluster.address(coordinator)) as client:
                answer = client.transport.call("AddPartitionsToTxn", pb.AddPartitionsToTxnRequest(
                    transactional_id="leader-dies", producer_id=producer._txn._producer_id,
                    producer_epoch=producer._txn._producer_epoch,
                    partitions=[pb.TopicPartitionRef(topic=topic, partition=0)],
                ), timeout_s=30)
            with pytest.raises(ConcurrentTransactionsError):
                raise_for_item(answer.error)
            cluster.kill(victim)
        finally:
            if cluster.running(victim):
                cluster.resume(victim)
    try:
        deadline = time.monotonic() + 30
        while leaders_of(cluster, topic).get(victim_partition, -1) in (victim, -1) and time.monotonic() < deadline:
            time.sleep(0.1)
        assert leaders_of(cluster, topic).get(victim_partition, -1) not in (victim, -1), "no new leader was elected"
        assert _read_committed(cluster, topic, 3) == [b"v-0", b"v-1", b"v-2"]
        # The transactional id is usable again once every marker landed.
        with Producer(cluster.bootstrap, transactional_id="leader-dies", acks="all") as producer:
            producer.init_transactions()
            producer.begin_transaction()
            producer.send(topic, b"after", partition=victim_partition)
            producer.commit_transaction()
        assert _read_committed(cluster, topic, 4) == [b"after", b"v-0", b"v-1", b"v-2"]
    finally:
        cluster.start(victim)


def test_a_deposed_coordinators_marker_is_refused(cluster: LocalCluster) -> None:
    """A late ABORT from a coordinator of an older epoch does not end the producer's next
    transaction: the leader answers TRANSACTION_COORDINATOR_FENCED and the commit stands (before,
    the leader wrote it and read_committed readers lost the committed record)."""
    topic, txn_id = "txn-fenced", "fenced"
    with Admin(cluster.bootstrap) as admin:   # three partitions for _read_committed; 0 is used
        admin.create_topics([NewTopic(topic, 3, replication_factor=3)])
    coordinator = find_coordinator(cluster, pb.TRANSACTION, txn_id)
    assert coordinator is not None
    cluster.kill(coordinator)   # its successor coordinates the id at a newer epoch (>= 1)
    try:
        with Producer(cluster.bootstrap, transactional_id=txn_id, acks="all") as producer:
            producer.init_transactions()
            producer.begin_transaction()
            producer.send(topic, b"first", partition=0)
            producer.commit_transaction()            # its marker carries the new coordinator epoch
            producer.begin_transaction()
            producer.send(topic, b"second", partition=0)
            producer.flush(30)                       # open on the partition now
            pid, epoch = producer._txn._producer_id, producer._txn._producer_epoch
            leader = leaders_of(cluster, topic)[0]
            marker = pb.TxnMarker(producer_id=pid, producer_epoch=epoch, commit=False, coordinator_epoch=0,
                                  partitions=[pb.TopicPartitionRef(topic=topic, partition=0)])
            with BrokerClient(cluster.address(leader)) as client:
                answer = client.transport.call("WriteTxnMarkers", pb.WriteTxnMarkersRequest(markers=[marker]),
                                               timeout_s=10)
            assert [p.error.code for m in answer.markers for p in m.partitions] == ["TRANSACTION_COORDINATOR_FENCED"]
            producer.commit_transaction()
        assert _read_committed(cluster, topic, 2) == [b"first", b"second"]
    finally:
        cluster.start(coordinator)
