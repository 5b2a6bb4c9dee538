"""A transaction's consumer offsets through the Kafka listener: AddOffsetsToTxn, TxnOffsetCommit
(logstore.broker.kafka.txn_apis) and OffsetFetch's ``require_stable`` (group_apis).

confluent-kafka's and kafka-python's transactional read-process-write loops on a real broker: a
consumer in a group reads the input, a transactional producer writes the output and sends the
consumer's positions to the transaction; a commit moves the group's committed offsets and makes
the output visible to ``read_committed`` readers, an abort does neither. With raw requests:
pending offsets are UNSTABLE_OFFSET_COMMIT to a ``require_stable`` OffsetFetch, and survive a
broker restart between TxnOffsetCommit and EndTxn (replayed pending, then applied by the commit
marker). No component of ours is mocked.
"""

from __future__ import annotations

import datetime
import io
import random
import socket
import struct
import sys
import time
from collections.abc import Iterator
from typing import Any

import pytest

pytest.importorskip("kio", reason="the Kafka listener needs kio (Python 3.11+)")
ck = pytest.importorskip("confluent_kafka")

from kafka_tools import CLIENT_CONF, kafka_values  # noqa: E402
from kio.index import load_request_schema, load_response_schema  # noqa: E402
from kio.schema.errors import ErrorCode  # noqa: E402
from kio.serial import entity_reader, entity_writer  # noqa: E402

from logstore import Admin, NewTopic  # noqa: E402
from logstore.broker.embedded import EmbeddedBroker  # noqa: E402

pytestmark = pytest.mark.timeout(120)
_CLIENT = CLIENT_CONF


@pytest.fixture(scope="module")
def broker() -> Iterator[EmbeddedBroker]:
    with EmbeddedBroker(kafka_listener="127.0.0.1:0") as b:
        yield b


def _topic(broker: EmbeddedBroker, prefix: str, partitions: int = 2) -> str:
    name = f"{prefix}-{random.randrange(1 << 30)}"
    with Admin(broker.bootstrap) as admin:
        admin.create_topics([NewTopic(name, num_partitions=partitions)])
    return name


def _fill(broker: EmbeddedBroker, topic: str, count: int) -> None:
    producer = ck.Producer({"bootstrap.servers": broker.kafka_bootstrap, **_CLIENT})
    for i in range(count):
        producer.produce(topic, value=b"in-%d" % i, partition=i % 2)
    assert producer.flush(20) == 0


def _committed(broker: EmbeddedBroker, group: str, topic: str, *, isolation: str = "read_committed",
               timeout_s: float = 20) -> dict[int, int]:
    """The group's committed offsets of ``topic`` (-1001: none), as a Kafka client fetches them
    (librdkafka asks for stable offsets when ``read_committed``, and waits while they are not)."""
    reader = ck.Consumer({"bootstrap.servers": broker.kafka_bootstrap, "group.id": group,
                          "isolation.level": isolation, "enable.auto.commit": False, **_CLIENT})
    try:
        return {tp.partition: tp.offset for tp in reader.committed([ck.TopicPartition(topic, p) for p in (0, 1)],
                                                                   timeout=timeout_s)}
    finally:
        reader.close()


def _read_committed(broker: EmbeddedBroker, topic: str, expected: int) -> list[bytes]:
    return kafka_values(broker.kafka_bootstrap, topic, isolation="read_committed", expected=expected)


def _poll_batch(consumer: Any, count: int) -> list[Any]:
    got: list[Any] = []
    deadline = time.monotonic() + 30
    while time.monotonic() < deadline and len(got) < count:
        message = consumer.poll(0.5)
        if message is not None:
            assert message.error() is None, message.error()
            got.append(message)
    assert len(got) == count, f"read {len(got)} of {count} input records in 30 s"
    return got


def _positions(consumer: Any, messages: list[Any]) -> list[Any]:
    """The next offset of each partition the messages came from (what a commit names)."""
    ends: dict[int, int] = {}
    for m in messages:
        ends[m.partition()] = max(ends.get(m.partition(), 0), m.offset() + 1)
    return [ck.TopicPartition(messages[0].topic(), p, o) for p, o in sorted(ends.items())]


# ---------------------------------------------------------------------------- confluent-kafka


def test_confluent_read_process_write_commits_output_and_offsets_together(broker: EmbeddedBroker) -> None:
    source, sink = _topic(broker, "rpw-in"), _topic(broker, "rpw-out")
    group = f"rpw-{source}"
    _fill(broker, source, 8)
    consumer = ck.Consumer({"bootstrap.servers": broker.kafka_bootstrap, "group.id": group,
                            "isolation.level": "read_committed", "auto.offset.reset": "earliest",
                            "enable.auto.commit": False, "session.timeout.ms": 10_000, **_CLIENT})
    producer = ck.Producer({"bootstrap.servers": broker.kafka_bootstrap, "transactional.id": f"rpw-{sink}",
                            **_CLIENT})
    try:
        producer.init_transactions(30)
        consumer.subscribe([source])

        # A committed transaction: 4 records processed, the output and the offsets together.
        first = _poll_batch(consumer, 4)
        producer.begin_transaction()
        for m in first:
            producer.produce(sink, value=b"out-" + m.value(), partition=m.partition())
        producer.send_offsets_to_transaction(_positions(consumer, first), consumer.consumer_group_metadata(), 30)
        producer.flush(30)
        assert _read_committed(broker, sink, 0) == []  # nothing visible before the commit
        # nor any offset: the last committed ones (none) read uncommitted, none stable yet
        assert _committed(broker, group, source, isolation="read_uncommitted") == {0: -1001, 1: -1001}
        with pytest.raises(ck.KafkaException) as unstable:
            _committed(broker, group, source, timeout_s=3)
        assert unstable.value.args[0].code() == ck.KafkaError._TIMED_OUT  # librdkafka retried UNSTABLE_OFFSET_COMMIT
        producer.commit_transaction(30)
        committed = {tp.partition: tp.offset for tp in _positions(consumer, first)}
        assert _committed(broker, group, source) == {p: committed.get(p, -1001) for p in (0, 1)}
        outputs = sorted(b"out-" + m.value() for m in first)
        assert _read_committed(broker, sink, 4) == outputs

        # An aborted one: neither its output nor its offsets count.
        second = _poll_batch(consumer, 4)
        producer.begin_transaction()
        for m in second:
            producer.produce(sink, value=b"lost-" + m.value(), partition=m.partition())
        producer.send_offsets_to_transaction(_positions(consumer, second), consumer.consumer_group_metadata(), 30)
        producer.abort_transaction(30)
        assert _committed(broker, group, source) == {p: committed.get(p, -1001) for p in (0, 1)}
        assert _read_committed(broker, sink, 4) == outputs
    finally:
        consumer.close()


# ---------------------------------------------------------------------------- kafka-python


def test_kafka_python_send_offsets_to_transaction_moves_the_groups_offsets(broker: EmbeddedBroker) -> None:
    kafka = pytest.importorskip("kafka")
    source, sink = _topic(broker, "kp-in"), _topic(broker, "kp-out")
    group = f"kp-{source}"
    _fill(broker, source, 6)
    consumer = kafka.KafkaConsumer(bootstrap_servers=broker.kafka_bootstrap, group_id=group,
                                   isolation_level="read_committed", auto_offset_reset="earliest",
                                   enable_auto_commit=False)
    producer = kafka.KafkaProducer(bootstrap_servers=broker.kafka_bootstrap, transactional_id=f"kp-{sink}")
    try:
        producer.init_transactions()
        consumer.subscribe([source])
        records: list[Any] = []
        deadline = time.monotonic() + 30
        while time.monotonic() < deadline and len(records) < 6:
            for batch in consumer.poll(timeout_ms=500).values():
                records += batch
        assert len(records) == 6
        producer.begin_transaction()
        for r in records:
            producer.send(sink, value=b"out-" + r.value, partition=r.partition)
        ends = {}
        for r in records:
            ends[r.partition] = max(ends.get(r.partition, 0), r.offset + 1)
        producer.send_offsets_to_transaction(
            {kafka.TopicPartition(source, p): kafka.OffsetAndMetadata(o, "", -1) for p, o in ends.items()},
            consumer.group_metadata())
        producer.commit_transaction()
        assert _committed(broker, group, source) == {0: ends[0], 1: ends[1]}
        assert _read_committed(broker, sink, 6) == sorted(b"out-" + r.value for r in records)
    finally:
        consumer.close()
        producer.close()


# ---------------------------------------------------------------------------- raw requests


class _Connection:
    """One Kafka connection speaking kio's request types (versions given per call)."""

    def __init__(self, broker: EmbeddedBroker) -> None:
        self._sock = socket.create_connection(("127.0.0.1", broker.kafka_port), timeout=20)
        self._correlation = 0

    def call(self, api_key: int, version: int, **fields: Any) -> Any:
        self._correlation += 1
        request_type: Any = load_request_schema(api_key, version)
        header_type: Any = request_type.__header_schema__
        buffer = io.BytesIO()
        entity_writer(header_type)(buffer, header_type(request_api_key=api_key, request_api_version=version,
                                                       correlation_id=self._correlation, client_id="test"))
        entity_writer(request_type)(buffer, request_type(**fields))
        self._sock.sendall(struct.pack(">i", buffer.tell()) + buffer.getvalue())
        (size,) = struct.unpack(">i", self._sock.recv(4, socket.MSG_WAITALL))
        frame = self._sock.recv(size, socket.MSG_WAITALL)
        response_type: Any = load_response_schema(api_key, version)
        header, offset = entity_reader(response_type.__header_schema__)(frame, 0)
        assert header.correlation_id == self._correlation
        response, _ = entity_reader(response_type)(frame, offset)
        return response

    def close(self) -> None:
        self._sock.close()


def _entity(api_key: int, version: int, entity: str, /, **fields: Any) -> Any:
    module = sys.modules[load_request_schema(api_key, version).__module__]
    return getattr(module, entity)(**fields)


INIT_PRODUCER_ID, ADD_OFFSETS, END_TXN, TXN_OFFSET_COMMIT, OFFSET_FETCH = 22, 25, 26, 28, 9


def _begin_with_offsets(conn: _Connection, txn_id: str, group: str, topic: str, offset: int) -> tuple[int, int]:
    """InitProducerId, AddOffsetsToTxn and TxnOffsetCommit of ``offset`` for ``topic``-0: the
    producer id and epoch of the transaction now open."""
    init = conn.call(INIT_PRODUCER_ID, 4, transactional_id=txn_id, transaction_timeout=datetime.timedelta(seconds=60),
                     producer_id=-1, producer_epoch=-1)
    assert init.error_code == ErrorCode.none
    pid, epoch = int(init.producer_id), int(init.producer_epoch)
    added = conn.call(ADD_OFFSETS, 3, transactional_id=txn_id, producer_id=pid, producer_epoch=epoch, group_id=group)
    assert added.error_code == ErrorCode.none
    committed = conn.call(TXN_OFFSET_COMMIT, 3, transactional_id=txn_id, group_id=group, producer_id=pid,
                          producer_epoch=epoch, generation_id=-1, member_id="", group_instance_id=None, topics=(
                              _entity(TXN_OFFSET_COMMIT, 3, "TxnOffsetCommitRequestTopic", name=topic, partitions=(
                                  _entity(TXN_OFFSET_COMMIT, 3, "TxnOffsetCommitRequestPartition", partition_index=0,
                                          committed_offset=offset, committed_leader_epoch=-1,
                                          committed_metadata="txn"),)),))
    assert [p.error_code for t in committed.topics for p in t.partitions] == [ErrorCode.none]
    return pid, epoch


def _fetch(conn: _Connection, group: str, topic: str, *, require_stable: bool) -> tuple[ErrorCode, int]:
    answer = conn.call(OFFSET_FETCH, 7, group_id=group, require_stable=require_stable, topics=(
        _entity(OFFSET_FETCH, 7, "OffsetFetchRequestTopic", name=topic, partition_indexes=(0,)),))
    assert answer.error_code == ErrorCode.none
    (partition,) = answer.topics[0].partitions
    return partition.error_code, int(partition.committed_offset)


def test_pending_offsets_are_unstable_to_require_stable_and_invisible_otherwise(broker: EmbeddedBroker) -> None:
    topic = _topic(broker, "stable", partitions=1)
    group, txn_id = f"g-{topic}", f"tx-{topic}"
    conn = _Connection(broker)
    try:
        pid, epoch = _begin_with_offsets(conn, txn_id, group, topic, 42)
        assert _fetch(conn, group, topic, require_stable=True) == (ErrorCode.unstable_offset_commit, -1)
        assert _fetch(conn, group, topic, require_stable=False) == (ErrorCode.none, -1)
        ended = conn.call(END_TXN, 3, transactional_id=txn_id, producer_id=pid, producer_epoch=epoch, committed=True)
        assert ended.error_code == ErrorCode.none
        assert _fetch(conn, group, topic, require_stable=True) == (ErrorCode.none, 42)
    finally:
        conn.close()


def test_txn_offset_commit_without_add_offsets_is_refused(broker: EmbeddedBroker) -> None:
    topic = _topic(broker, "unadded", partitions=1)
    group, txn_id = f"g-{topic}", f"tx-{topic}"
    conn = _Connection(broker)
    try:
        init = conn.call(INIT_PRODUCER_ID, 4, transactional_id=txn_id,
                         transaction_timeout=datetime.timedelta(seconds=60), producer_id=-1, producer_epoch=-1)
        pid, epoch = int(init.producer_id), int(init.producer_epoch)
        answer = conn.call(TXN_OFFSET_COMMIT, 3, transactional_id=txn_id, group_id=group, producer_id=pid,
                           producer_epoch=epoch, generation_id=-1, member_id="", group_instance_id=None, topics=(
                               _entity(TXN_OFFSET_COMMIT, 3, "TxnOffsetCommitRequestTopic", name=topic, partitions=(
                                   _entity(TXN_OFFSET_COMMIT, 3, "TxnOffsetCommitRequestPartition", partition_index=0,
                                           committed_offset=5, committed_leader_epoch=-1,
                                           committed_metadata=None),)),))
        assert [p.error_code for t in answer.topics for p in t.partitions] == [ErrorCode.invalid_txn_state]
        conn.call(INIT_PRODUCER_ID, 4, transactional_id=txn_id,  # a new producer of the id fences this one
                  transaction_timeout=datetime.timedelta(seconds=60), producer_id=-1, producer_epoch=-1)
        fenced = conn.call(ADD_OFFSETS, 3, transactional_id=txn_id, producer_id=pid, producer_epoch=epoch,
                           group_id=group)
        assert fenced.error_code == ErrorCode.producer_fenced
        old = conn.call(ADD_OFFSETS, 1, transactional_id=txn_id, producer_id=pid, producer_epoch=epoch,
                        group_id=group)
        assert old.error_code == ErrorCode.invalid_producer_epoch  # before v2, as Kafka's broker answers
        assert _fetch(conn, group, topic, require_stable=True) == (ErrorCode.none, -1)
    finally:
        conn.close()


@pytest.mark.parametrize("commit", [True, False])
def test_a_restart_between_txn_offset_commit_and_end_txn_keeps_the_offsets_pending(commit: bool) -> None:
    with EmbeddedBroker(kafka_listener="127.0.0.1:0") as restarted:
        topic = _topic(restarted, "restart", partitions=1)
        group, txn_id = f"g-{topic}", f"tx-{topic}"
        conn = _Connection(restarted)
        try:
            pid, epoch = _begin_with_offsets(conn, txn_id, group, topic, 17)
        finally:
            conn.close()
        restarted.stop()
        restarted.start()
        conn = _Connection(restarted)
        try:
            assert _fetch(conn, group, topic, require_stable=True) == (ErrorCode.unstable_offset_commit, -1)
            ended = conn.call(END_TXN, 3, transactional_id=txn_id, producer_id=pid, producer_epoch=epoch,
                              committed=commit)
            assert ended.error_code == ErrorCode.none
            assert _fetch(conn, group, topic, require_stable=True) == (ErrorCode.none, 17 if commit else -1)
        finally:
            conn.close()
        restarted.stop()  # and once more: the decided offsets replay as decided
        restarted.start()
        conn = _Connection(restarted)
        try:
            assert _fetch(conn, group, topic, require_stable=True) == (ErrorCode.none, 17 if commit else -1)
        finally:
            conn.close()
