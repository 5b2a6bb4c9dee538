"""The Kafka protocol listener (logstore.broker.kafka) against a real Kafka client.

A real broker (EmbeddedBroker with ``kafka_listener``) and confluent-kafka (librdkafka):
its AdminClient's metadata, its Producer's records read back by logstore's own Consumer,
and its Consumer reading what logstore's own Producer wrote, offsets equal both ways.
The raw-socket tests pin what ApiVersions advertises and that bytes which are not Kafka
requests close their connection, not the listener. No component of ours is mocked.
"""

from __future__ import annotations

import dataclasses
import datetime
import decimal
import io
import json
import os
import random
import socket
import struct
import subprocess
import sys
import time
from collections.abc import Iterator
from typing import Any

import pyarrow as pa
import pytest

pytest.importorskip("kio", reason="the Kafka listener needs kio (Python 3.11+)")
ck = pytest.importorskip("confluent_kafka")

from confluent_kafka.admin import AdminClient  # noqa: E402
from kafka_tools import NO_KAFKA_JARS, kafka_classpath, recv_exactly  # noqa: E402
from kio.index import load_request_schema, load_response_schema  # noqa: E402
from kio.records.schema import NewRecordBatch, Record  # noqa: E402
from kio.records.writers import write_batch  # noqa: E402
from kio.serial import entity_reader, entity_writer  # noqa: E402

from logstore import Admin, Consumer, NewTopic, Producer, TopicPartition  # noqa: E402
from logstore.broker.embedded import EmbeddedBroker  # noqa: E402
from logstore.broker.kafka import SUPPORTED  # noqa: E402
from logstore.errors import InvalidConfigError  # noqa: E402

_CLIENT = {"socket.timeout.ms": 10_000, "reconnect.backoff.max.ms": 500}


@pytest.fixture(scope="module")
def broker() -> Iterator[EmbeddedBroker]:
    with EmbeddedBroker(kafka_listener="127.0.0.1:0") as b:
        yield b


def _topic(broker: EmbeddedBroker, prefix: str, partitions: int = 1, **kwargs: Any) -> str:
    name = f"{prefix}-{random.randrange(1 << 30)}"
    with Admin(broker.bootstrap) as admin:
        admin.create_topics([NewTopic(name, num_partitions=partitions, **kwargs)])
    return name


def _produce_kafka(broker: EmbeddedBroker, topic: str, records: list[dict[str, Any]],
                   **config: Any) -> list[tuple[Any, int]]:
    """Produce with confluent-kafka; every record's (error, offset), in order."""
    producer = ck.Producer({"bootstrap.servers": broker.kafka_bootstrap, "enable.idempotence": False,
                            **_CLIENT, **config})
    results: list[tuple[Any, int]] = [(None, -1)] * len(records)
    for i, record in enumerate(records):
        def report(err: Any, msg: Any, i: int = i) -> None:
            results[i] = (err, msg.offset())
        producer.produce(topic, on_delivery=report, **record)
    assert producer.flush(20) == 0, "records still queued after 20 s"
    return results


def _read_logstore(broker: EmbeddedBroker, topic: str, partition: int, count: int) -> list[Any]:
    with Consumer(broker.bootstrap, auto_offset_reset="earliest") as consumer:
        consumer.assign([TopicPartition(topic, partition)])
        got: list[Any] = []
        deadline = time.monotonic() + 20
        while len(got) < count and time.monotonic() < deadline:
            got += consumer.poll(timeout_ms=500)
    return got


def _read_kafka(broker: EmbeddedBroker, topic: str, partition: int, offset: int, count: int,
                **config: Any) -> list[Any]:
    consumer = ck.Consumer({"bootstrap.servers": broker.kafka_bootstrap, "group.id": "unused",
                            "enable.auto.commit": False, **_CLIENT, **config})
    try:
        consumer.assign([ck.TopicPartition(topic, partition, offset)])
        got: list[Any] = []
        deadline = time.monotonic() + 20
        while len(got) < count and time.monotonic() < deadline:
            msg = consumer.poll(0.5)
            if msg is None:
                continue
            assert msg.error() is None, msg.error()
            got.append(msg)
        return got
    finally:
        consumer.close()


# ---------------------------------------------------------------------------- metadata


@pytest.mark.timeout(60)
def test_admin_client_lists_this_broker_and_its_topics(broker: EmbeddedBroker) -> None:
    topic = _topic(broker, "md", partitions=3)
    admin = AdminClient({"bootstrap.servers": broker.kafka_bootstrap, **_CLIENT})
    metadata = admin.list_topics(timeout=20)
    assert {b.id: (b.host, b.port) for b in metadata.brokers.values()} == {0: ("127.0.0.1", broker.kafka_port)}
    assert sorted(metadata.topics[topic].partitions) == [0, 1, 2]
    assert all(p.leader == 0 and list(p.replicas) == [0] for p in metadata.topics[topic].partitions.values())
    missing = admin.list_topics(topic="no-such-topic", timeout=20).topics["no-such-topic"]
    assert missing.error is not None and missing.error.code() == ck.KafkaError.UNKNOWN_TOPIC_OR_PART


# ---------------------------------------------------------------------------- produce


@pytest.mark.timeout(90)
def test_kafka_producer_records_read_back_by_logstore_consumer(broker: EmbeddedBroker) -> None:
    topic = _topic(broker, "produce", partitions=2)
    now = int(time.time() * 1000)
    sent = [{"key": b"k%d" % i, "value": b"v%d" % i if i != 3 else None, "partition": 1,
             "timestamp": now + i, "headers": [("h", b"%d" % i), ("h", None)] if i % 2 else None}
            for i in range(20)]
    results = _produce_kafka(broker, topic, sent, **{"linger.ms": 20})
    assert [err for err, _ in results] == [None] * 20
    assert [offset for _, offset in results] == list(range(20))
    got = _read_logstore(broker, topic, 1, 20)
    assert [r.offset for r in got] == list(range(20))
    assert [(r.key, r.value, r.timestamp_ms) for r in got] == [(s["key"], s["value"], s["timestamp"]) for s in sent]
    assert [tuple(r.headers) for r in got] == [tuple(s["headers"] or ()) for s in sent]


@pytest.mark.timeout(90)
@pytest.mark.parametrize("codec", ["gzip", "snappy", "lz4", "zstd"])
def test_compressed_produce_is_stored_uncompressed_records(broker: EmbeddedBroker, codec: str) -> None:
    topic = _topic(broker, f"codec-{codec}")
    sent = [{"key": b"key-%d" % i, "value": b"%d " % i * 50} for i in range(200)]
    results = _produce_kafka(broker, topic, sent, **{"compression.type": codec, "linger.ms": 50})
    assert [err for err, _ in results] == [None] * 200
    got = _read_logstore(broker, topic, 0, 200)
    assert [(r.offset, r.key, r.value) for r in got] == [(i, s["key"], s["value"]) for i, s in enumerate(sent)]


@pytest.mark.timeout(90)
def test_idempotent_producer_gets_a_producer_id_and_appends_once(broker: EmbeddedBroker) -> None:
    topic = _topic(broker, "idempotent", partitions=2)
    sent = [{"key": b"%d" % i, "value": b"v%d" % i, "partition": i % 2} for i in range(100)]
    results = _produce_kafka(broker, topic, sent, **{"enable.idempotence": True, "linger.ms": 5,
                                                      "max.in.flight.requests.per.connection": 5})
    assert [err for err, _ in results] == [None] * 100
    assert sorted(offset for _, offset in results) == sorted(list(range(50)) * 2)
    got = _read_logstore(broker, topic, 0, 50) + _read_logstore(broker, topic, 1, 50)
    assert sorted(r.value for r in got) == sorted(s["value"] for s in sent)


@pytest.mark.timeout(60)
def test_a_transactional_id_gets_a_new_epoch_each_time_and_stale_epochs_are_fenced(broker: EmbeddedBroker) -> None:
    def init(version: int, correlation_id: int, producer_id: int = -1, producer_epoch: int = -1) -> Any:
        sock.sendall(_request(22, version, correlation_id, transactional_id=f"txn-{broker.kafka_port}",
                              transaction_timeout=datetime.timedelta(seconds=60), producer_id=producer_id,
                              producer_epoch=producer_epoch))
        response, _ = entity_reader(load_response_schema(22, version))(_answer(sock), 5)
        return response

    with _connect(broker) as sock:
        first = init(4, 1)
        second = init(4, 2)  # a new producer of the same id fences the first
        assert (first.error_code, second.error_code, second.producer_id) == (0, 0, first.producer_id)
        assert (first.producer_epoch, second.producer_epoch) == (0, 1)
        # KIP-360: bumping with an epoch that is no longer the id's current one is fenced,
        # answered in each version's terms (PRODUCER_FENCED from v4 on, INVALID_PRODUCER_EPOCH before)
        assert init(4, 3, first.producer_id, first.producer_epoch).error_code == 90
        assert init(3, 4, first.producer_id, first.producer_epoch).error_code == 47
        bumped = init(4, 5, second.producer_id, second.producer_epoch)
        assert (bumped.error_code, bumped.producer_id, bumped.producer_epoch) == (0, first.producer_id, 2)


@pytest.mark.timeout(60)
def test_acks_zero_and_all_append_the_same(broker: EmbeddedBroker) -> None:
    topic = _topic(broker, "acks")
    assert [e for e, _ in _produce_kafka(broker, topic, [{"value": b"all"}], acks="all")] == [None]
    _produce_kafka(broker, topic, [{"value": b"none"}], acks=0)  # no answer: offsets unknown to the client
    got = _read_logstore(broker, topic, 0, 2)
    assert [(r.offset, r.value) for r in got] == [(0, b"all"), (1, b"none")]


@pytest.mark.timeout(60)
def test_produce_to_a_typed_topic_is_refused_per_partition(broker: EmbeddedBroker) -> None:
    topic = _topic(broker, "typed", value_schema=pa.schema([pa.field("n", pa.int64())]))
    [(err, _)] = _produce_kafka(broker, topic, [{"value": b"x"}], **{"message.send.max.retries": 0})
    assert err is not None and err.code() == ck.KafkaError.UNSUPPORTED_FOR_MESSAGE_FORMAT  # 43


# ---------------------------------------------------------------------------- fetch


@pytest.mark.timeout(60)
def test_kafka_consumer_reads_a_typed_topics_values_as_json(broker: EmbeddedBroker) -> None:
    schema = pa.schema([pa.field("id", pa.int64()), pa.field("name", pa.string()), pa.field("score", pa.float64()),
                        pa.field("at", pa.timestamp("ms", tz="UTC")), pa.field("day", pa.date32()),
                        pa.field("raw", pa.binary()), pa.field("price", pa.decimal128(10, 2)),
                        pa.field("tags", pa.list_(pa.string()))])
    topic = _topic(broker, "typed-read", value_schema=schema)
    at = datetime.datetime(2026, 11, 29, 1, 2, 3, 456000, tzinfo=datetime.timezone.utc)
    with Producer(broker.bootstrap) as producer:
        producer.send(topic, {"id": 1, "name": "Ada", "score": 1.5, "at": at, "day": at.date(), "raw": b"\x00\xff",
                              "price": decimal.Decimal("12.50"), "tags": ["a", "b"]}, key="k1").result(timeout=30)
        producer.send(topic, {"id": 2, "name": None, "score": float("nan"), "at": None, "day": None, "raw": None,
                              "price": None, "tags": []}, key="k2").result(timeout=30)
        producer.send(topic, None, key="k1").result(timeout=30)  # a tombstone
    got = _read_kafka(broker, topic, 0, 0, 3)
    assert [m.key() for m in got] == [b"k1", b"k2", b"k1"]
    assert [None if m.value() is None else json.loads(m.value()) for m in got] == [
        {"id": 1, "name": "Ada", "score": 1.5, "at": "2026-11-29T01:02:03.456000+00:00", "day": "2026-11-29",
         "raw": "AP8=", "price": "12.50", "tags": ["a", "b"]},
        {"id": 2, "name": None, "score": "NaN", "at": None, "day": None, "raw": None, "price": None, "tags": []},
        None]


@pytest.mark.timeout(90)
@pytest.mark.parametrize("isolation", ["read_uncommitted", "read_committed"])
def test_kafka_consumer_reads_what_logstore_producer_wrote(broker: EmbeddedBroker, isolation: str) -> None:
    topic = _topic(broker, "fetch", partitions=2)
    with Producer(broker.bootstrap) as producer:
        futures = [producer.send(topic, b"value-%d" % i, key=b"key-%d" % i, partition=0,
                                 headers=[("n", str(i).encode())], timestamp_ms=1_700_000_000_000 + i)
                   for i in range(30)]
        offsets = [f.result().offset for f in futures]
    assert offsets == list(range(30))
    got = _read_kafka(broker, topic, 0, 10, 20, **{"isolation.level": isolation})
    assert [m.offset() for m in got] == list(range(10, 30))
    assert [(m.key(), m.value(), m.headers(), m.timestamp()) for m in got] == [
        (b"key-%d" % i, b"value-%d" % i, [("n", str(i).encode())], (ck.TIMESTAMP_CREATE_TIME, 1_700_000_000_000 + i))
        for i in range(10, 30)]


@pytest.mark.timeout(60)
def test_a_waiting_kafka_consumer_gets_records_appended_later(broker: EmbeddedBroker) -> None:
    topic = _topic(broker, "wait")
    consumer = ck.Consumer({"bootstrap.servers": broker.kafka_bootstrap, "group.id": "unused",
                            "fetch.wait.max.ms": 5000, **_CLIENT})
    try:
        consumer.assign([ck.TopicPartition(topic, 0, 0)])
        assert consumer.poll(1.0) is None
        with Producer(broker.bootstrap) as producer:
            producer.send(topic, b"late").result()
        msg = None
        deadline = time.monotonic() + 20
        while msg is None and time.monotonic() < deadline:
            msg = consumer.poll(0.5)
        assert msg is not None and msg.error() is None and (msg.offset(), msg.value()) == (0, b"late")
    finally:
        consumer.close()


@pytest.mark.timeout(60)
def test_list_offsets_gives_watermarks_and_offsets_for_times(broker: EmbeddedBroker) -> None:
    topic = _topic(broker, "offsets")
    with Producer(broker.bootstrap) as producer:
        for i in range(5):
            producer.send(topic, b"%d" % i, timestamp_ms=1_000_000 + 1000 * i).result()
    consumer = ck.Consumer({"bootstrap.servers": broker.kafka_bootstrap, "group.id": "unused", **_CLIENT})
    try:
        assert consumer.get_watermark_offsets(ck.TopicPartition(topic, 0), timeout=20) == (0, 5)
        [found] = consumer.offsets_for_times([ck.TopicPartition(topic, 0, 1_002_500)], timeout=20)
        assert found.offset == 3
        [past] = consumer.offsets_for_times([ck.TopicPartition(topic, 0, 9_000_000)], timeout=20)
        assert past.offset == -1
    finally:
        consumer.close()


@pytest.mark.timeout(60)
def test_fetch_beyond_the_end_resets_by_auto_offset_reset(broker: EmbeddedBroker) -> None:
    topic = _topic(broker, "oor")
    with Producer(broker.bootstrap) as producer:
        producer.send(topic, b"only").result()
    got = _read_kafka(broker, topic, 0, 42, 1, **{"auto.offset.reset": "earliest"})
    assert [(m.offset(), m.value()) for m in got] == [(0, b"only")]


@pytest.mark.timeout(90)
def test_committed_offsets_are_shared_with_logstore_consumers(broker: EmbeddedBroker) -> None:
    topic = _topic(broker, "commit")
    group = f"group-{topic}"
    with Producer(broker.bootstrap) as producer:
        for i in range(10):
            producer.send(topic, b"%d" % i).result()
    first = ck.Consumer({"bootstrap.servers": broker.kafka_bootstrap, "group.id": group,
                         "enable.auto.commit": False, **_CLIENT})
    try:
        first.assign([ck.TopicPartition(topic, 0, 0)])
        got = []
        while len(got) < 4:
            msg = first.poll(1.0)
            if msg is not None:
                assert msg.error() is None, msg.error()
                got.append(msg)
        [done] = first.commit(message=got[3], asynchronous=False)
        assert done.error is None and done.offset == 4
        [committed] = first.committed([ck.TopicPartition(topic, 0)], timeout=20)
        assert committed.offset == 4
    finally:
        first.close()
    with Consumer(broker.bootstrap, group_id=group) as ours:
        committed_here = ours.committed([TopicPartition(topic, 0)])[TopicPartition(topic, 0)]
        assert committed_here is not None and committed_here.offset == 4
    resumed = _read_kafka(broker, topic, 0, ck.OFFSET_STORED, 6, **{"group.id": group})
    assert [m.offset() for m in resumed] == list(range(4, 10))


@pytest.mark.timeout(60)
def test_find_coordinator_names_this_broker_for_groups_and_transactional_ids(broker: EmbeddedBroker) -> None:
    with _connect(broker) as sock:
        sock.sendall(_request(10, 3, 1, key="g", key_type=0) + _request(10, 3, 2, key="t", key_type=1)
                     + _request(10, 3, 3, key="s", key_type=2))
        response_type: Any = load_response_schema(10, 3)
        group, _ = entity_reader(response_type)(_answer(sock), 5)
        txn, _ = entity_reader(response_type)(_answer(sock), 5)
        share, _ = entity_reader(response_type)(_answer(sock), 5)
    for answer in (group, txn):
        assert (answer.error_code, answer.node_id, answer.host, answer.port) == (0, 0, "127.0.0.1", broker.kafka_port)
    assert share.error_code == 42  # INVALID_REQUEST: only groups and transactional ids have coordinators


# ---------------------------------------------------------------------------- raw protocol


def _request(api_key: int, version: int, correlation_id: int, **fields: Any) -> bytes:
    request_type: Any = load_request_schema(api_key, version)
    header_type: Any = request_type.__header_schema__
    buffer = io.BytesIO()
    entity_writer(header_type)(buffer, header_type(request_api_key=api_key, request_api_version=version,
                                                   correlation_id=correlation_id, client_id="test"))
    entity_writer(request_type)(buffer, request_type(**fields))
    return struct.pack(">i", buffer.tell()) + buffer.getvalue()


def _answer(sock: socket.socket) -> bytes:
    size = struct.unpack(">i", recv_exactly(sock, 4))[0]
    return recv_exactly(sock, size)


def _connect(broker: EmbeddedBroker) -> socket.socket:
    sock = socket.create_connection(("127.0.0.1", broker.kafka_port), timeout=10)
    return sock


def _api_versions(sock: socket.socket, version: int) -> Any:
    sock.sendall(_request(18, version, 7, client_software_name="test", client_software_version="1")
                 if version >= 3 else _request(18, version, 7))
    frame = _answer(sock)
    assert struct.unpack_from(">i", frame)[0] == 7  # the correlation id, header v0 always
    response_type: Any = load_response_schema(18, version)
    response, _ = entity_reader(response_type)(frame, 4)
    return response


@pytest.mark.timeout(30)
@pytest.mark.parametrize("version", [0, 1, 2, 3])
def test_api_versions_lists_exactly_what_is_served(broker: EmbeddedBroker, version: int) -> None:
    with _connect(broker) as sock:
        response = _api_versions(sock, version)
    assert response.error_code == 0
    assert {k.api_key: (k.min_version, k.max_version) for k in response.api_keys} == SUPPORTED
    assert SUPPORTED == {0: (3, 9), 1: (4, 12), 2: (1, 6), 3: (1, 12), 8: (2, 8), 9: (1, 7), 10: (0, 3),
                         11: (0, 9), 12: (0, 4), 13: (0, 5), 14: (0, 5), 15: (0, 5), 16: (0, 5), 18: (0, 3),
                         19: (2, 7), 20: (1, 6), 42: (0, 2),
                         21: (0, 2), 22: (0, 4), 24: (0, 3), 25: (0, 4), 26: (0, 4), 28: (0, 4), 32: (1, 4),
                         37: (0, 3), 44: (0, 1),
                         29: (1, 3), 30: (1, 3), 31: (1, 3), 60: (0, 1), 68: (0, 1)}


@pytest.mark.timeout(30)
def test_api_versions_newer_than_served_answers_v0_with_unsupported_version(broker: EmbeddedBroker) -> None:
    with _connect(broker) as sock:
        sock.sendall(struct.pack(">ihhi", 10, 18, 99, 5) + struct.pack(">h", -1))
        frame = _answer(sock)
        response, _ = entity_reader(load_response_schema(18, 0))(frame, 4)
        assert struct.unpack_from(">i", frame)[0] == 5
        assert response.error_code == 35  # UNSUPPORTED_VERSION
        assert {k.api_key for k in response.api_keys} == set(SUPPORTED)
        assert _api_versions(sock, 3).error_code == 0  # the connection stays open


@pytest.mark.timeout(30)
@pytest.mark.parametrize("garbage", [
    b"\xff" * 64,                                       # a negative frame size
    struct.pack(">i", 1 << 30) + b"x",                  # larger than max_request_bytes
    struct.pack(">ihhi", 10, 11, 5, 1) + b"\0\0",       # JoinGroup: an API not served
    struct.pack(">ihhi", 10, 3, 50, 1) + b"\0\0",       # Metadata v50
    struct.pack(">ihhi", 12, 0, 9, 1) + b"\xff\xff\xff\xff",  # Produce v9 whose header does not parse
])
def test_garbage_closes_its_connection_and_the_listener_serves_on(broker: EmbeddedBroker, garbage: bytes) -> None:
    with _connect(broker) as sock:
        sock.sendall(garbage)
        assert sock.recv(1) == b""  # closed, no answer
    with _connect(broker) as sock:
        assert _api_versions(sock, 3).error_code == 0


@pytest.mark.timeout(30)
def test_requests_of_one_connection_are_answered_in_order(broker: EmbeddedBroker) -> None:
    topic = _topic(broker, "order")
    with _connect(broker) as sock:
        sock.sendall(b"".join(_metadata_request(i, [topic]) for i in range(5)))
        assert [struct.unpack_from(">i", _answer(sock))[0] for _ in range(5)] == [0, 1, 2, 3, 4]


def _entity(module: Any, entity_name: str, /, **values: Any) -> Any:
    """Entity ``entity_name`` of a request version's module, from those of ``values`` it has fields for."""
    entity = getattr(module, entity_name)
    names = {f.name for f in dataclasses.fields(entity)}
    return entity(**{k: v for k, v in values.items() if k in names})


def _every_version_request(api_key: int, version: int, topic: str, records: bytes) -> bytes:
    request_type: Any = load_request_schema(api_key, version)
    m = sys.modules[request_type.__module__]
    main = request_type.__name__
    if api_key == 0:
        body = _entity(m, main, transactional_id=None, acks=1, timeout=datetime.timedelta(seconds=5), topic_data=(
            _entity(m, "TopicProduceData", name=topic, partition_data=(
                _entity(m, "PartitionProduceData", index=0, records=records),)),))
    elif api_key == 1:
        body = _entity(m, main, replica_id=-1, max_wait=datetime.timedelta(0), min_bytes=0, max_bytes=1 << 20,
                       isolation_level=0, session_id=0, session_epoch=-1, forgotten_topics_data=(), rack_id="",
                       topics=(_entity(m, "FetchTopic", topic=topic, partitions=(_entity(
                           m, "FetchPartition", partition=0, current_leader_epoch=-1, fetch_offset=0,
                           last_fetched_epoch=-1, log_start_offset=-1, partition_max_bytes=1 << 20),)),))
    elif api_key == 2:
        body = _entity(m, main, replica_id=-1, isolation_level=0, topics=(_entity(
            m, "ListOffsetsTopic", name=topic, partitions=(_entity(
                m, "ListOffsetsPartition", partition_index=0, current_leader_epoch=-1, timestamp=-1),)),))
    elif api_key == 3:
        body = _entity(m, main, topics=(_entity(m, "MetadataRequestTopic", topic_id=None, name=topic),),
                       allow_auto_topic_creation=False, include_cluster_authorized_operations=False,
                       include_topic_authorized_operations=False)
    elif api_key == 8:
        body = _entity(m, main, group_id=f"g-{topic}", generation_id_or_member_epoch=-1, member_id="",
                       group_instance_id=None, retention_time=datetime.timedelta(milliseconds=-1), topics=(_entity(
                           m, "OffsetCommitRequestTopic", name=topic, partitions=(_entity(
                               m, "OffsetCommitRequestPartition", partition_index=0, committed_offset=1,
                               committed_leader_epoch=-1, committed_metadata=""),)),))
    elif api_key == 9:
        body = _entity(m, main, group_id=f"g-{topic}", require_stable=False, topics=(_entity(
            m, "OffsetFetchRequestTopic", name=topic, partition_indexes=(0,)),))
    elif api_key == 10:
        body = _entity(m, main, key=f"g-{topic}", key_type=0)
    else:  # 22
        body = _entity(m, main, transactional_id=None, transaction_timeout=datetime.timedelta(seconds=60),
                       producer_id=-1, producer_epoch=-1)
    header_type: Any = request_type.__header_schema__
    buffer = io.BytesIO()
    entity_writer(header_type)(buffer, header_type(request_api_key=api_key, request_api_version=version,
                                                   correlation_id=version, client_id="test"))
    entity_writer(request_type)(buffer, body)
    return struct.pack(">i", buffer.tell()) + buffer.getvalue()


@pytest.mark.timeout(120)
@pytest.mark.parametrize("api_key", [0, 1, 2, 3, 8, 9, 10, 22])
def test_every_advertised_version_is_answered_in_that_version(broker: EmbeddedBroker, api_key: int) -> None:
    topic = _topic(broker, f"versions-{api_key}")
    buffer = io.BytesIO()
    write_batch(buffer, NewRecordBatch(producer_id=-1, producer_epoch=-1, base_sequence=-1, attributes=0, records=(
        Record(attributes=0, timestamp=datetime.datetime(2026, 1, 1, tzinfo=datetime.timezone.utc), offset=0,
               key=b"k", value=b"v", headers=()),)))
    low, high = SUPPORTED[api_key]
    with _connect(broker) as sock:
        for version in range(low, high + 1):
            sock.sendall(_every_version_request(api_key, version, topic, buffer.getvalue()))
            frame = _answer(sock)
            response_type: Any = load_response_schema(api_key, version)
            at = 4 if response_type.__header_schema__.__name__ == "ResponseHeader" and not \
                response_type.__header_schema__.__flexible__ else 5
            assert struct.unpack_from(">i", frame)[0] == version
            response, size = entity_reader(response_type)(frame, at)
            assert at + size == len(frame), f"v{version}: {len(frame) - at - size} bytes left over"
            codes = [p.error_code for t in getattr(response, "responses", getattr(response, "topics", ()))
                     for p in getattr(t, "partitions", getattr(t, "partition_responses", ()))]
            assert all(c == 0 for c in codes) and getattr(response, "error_code", 0) == 0, (version, response)


@pytest.mark.timeout(120)
def test_every_version_of_the_classic_group_protocol_joins_syncs_beats_and_leaves(broker: EmbeddedBroker) -> None:
    from kio.index import load_entity_schema
    from kio.static.constants import EntityType
    topic = _topic(broker, "classic-versions", partitions=2)
    subscription: Any = load_entity_schema("consumer_protocol_subscription", 0, EntityType.data)
    metadata = io.BytesIO()
    metadata.write(struct.pack(">h", 0))
    entity_writer(subscription)(metadata, subscription(topics=(topic,), user_data=None))
    assignment_type: Any = load_entity_schema("consumer_protocol_assignment", 0, EntityType.data)

    def call(sock: socket.socket, api_key: int, version: int, **fields: Any) -> Any:
        request_type: Any = load_request_schema(api_key, version)
        m = sys.modules[request_type.__module__]
        if api_key == 11:
            fields["protocols"] = (_entity(m, "JoinGroupRequestProtocol", name="range", metadata=metadata.getvalue()),)
        if api_key == 13 and hasattr(m, "MemberIdentity"):
            fields["members"] = (_entity(m, "MemberIdentity", member_id=fields["member_id"]),)
        header_type: Any = request_type.__header_schema__
        buffer = io.BytesIO()
        entity_writer(header_type)(buffer, header_type(request_api_key=api_key, request_api_version=version,
                                                       correlation_id=api_key, client_id="test"))
        entity_writer(request_type)(buffer, _entity(m, request_type.__name__, **fields))
        sock.sendall(struct.pack(">i", buffer.tell()) + buffer.getvalue())
        response_type: Any = load_response_schema(api_key, version)
        frame = _answer(sock)
        response, _ = entity_reader(response_type)(frame, 5 if response_type.__header_schema__.__flexible__ else 4)
        return response

    group = f"classic-{topic}"
    with _connect(broker) as sock:
        for i in range(10):
            joined = call(sock, 11, i, group_id=group, session_timeout=datetime.timedelta(seconds=30),
                          rebalance_timeout=datetime.timedelta(seconds=30), member_id="", group_instance_id=None,
                          protocol_type="consumer", reason=None)
            assert (joined.error_code, joined.leader, joined.members) == (0, "", ()), (i, joined)
            member, generation = joined.member_id, joined.generation_id
            synced = call(sock, 14, min(i, 5), group_id=group, generation_id=generation, member_id=member,
                          group_instance_id=None, protocol_type="consumer", protocol_name="range", assignments=())
            assert synced.error_code == 0, (i, synced)
            assigned, _ = entity_reader(assignment_type)(synced.assignment, 2)
            assert [(t.topic, sorted(t.partitions)) for t in assigned.assigned_partitions] == [(topic, [0, 1])]
            beat = call(sock, 12, min(i, 4), group_id=group, generation_id=generation, member_id=member,
                        group_instance_id=None)
            assert beat.error_code == 0, (i, beat)
            left = call(sock, 13, min(i, 5), group_id=group, member_id=member)
            assert left.error_code == 0 and all(m.error_code == 0 for m in getattr(left, "members", ())), (i, left)


# ---------------------------------------------------------------------------- config


@pytest.mark.timeout(30)
@pytest.mark.parametrize("overrides, says", [
    ({"kafka_listener": "9092"}, "HOST:PORT"),
    ({"kafka_listener": "10.1.2.3:9092"}, "plaintext"),
    ({"kafka_listener": "10.1.2.3:9092", "metadata": "etcd://127.0.0.1:2379"}, "plaintext"),
])
def test_config_refuses_what_the_listener_cannot_serve(overrides: dict[str, Any], says: str) -> None:
    from logstore.broker.config import load_broker_config
    with pytest.raises(InvalidConfigError, match=says):
        load_broker_config(None, overrides=overrides, env={})


@pytest.mark.timeout(30)
def test_config_gives_a_broker_of_a_cluster_a_kafka_listener() -> None:
    """A cluster's brokers each serve Kafka (tests/e2e/test_cluster_kafka.py runs them)."""
    from logstore.broker.config import load_broker_config
    config = load_broker_config(None, overrides={"kafka_listener": "127.0.0.1:9092", "metadata": "etcd://127.0.0.1:2379"},
                                env={})
    assert config.clustered and config.kafka_listener == "127.0.0.1:9092"


@pytest.mark.timeout(60)
def test_a_taken_kafka_port_fails_the_start_with_one_line() -> None:
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = taken.getsockname()[1]
        with pytest.raises(OSError, match="in use"), EmbeddedBroker(kafka_listener=f"127.0.0.1:{port}"):
            pass


@pytest.mark.timeout(90)
def test_a_child_broker_reports_its_kafka_port_and_keeps_it_across_restarts() -> None:
    with EmbeddedBroker(subprocess=True, kafka_listener="127.0.0.1:0") as child:
        port = child.kafka_port
        topic = _topic(child, "child")
        admin = AdminClient({"bootstrap.servers": child.kafka_bootstrap, **_CLIENT})
        assert topic in admin.list_topics(timeout=20).topics
        child.restart()
        assert child.kafka_port == port
        assert [e for e, _ in _produce_kafka(child, topic, [{"value": b"after restart"}])] == [None]


@pytest.mark.timeout(60)
def test_the_cli_refuses_a_careless_kafka_listener_in_one_line(tmp_path: Any) -> None:
    script = os.path.join(os.path.dirname(sys.executable), "logstore")
    failed = subprocess.run([script, "broker", "start", "--data-dir", str(tmp_path), "--port", "0",
                             "--kafka-listener", "10.1.2.3:9092"], capture_output=True, text=True, timeout=50)
    assert failed.returncode == 2 and "Traceback" not in failed.stderr
    assert failed.stderr.strip().splitlines() == [
        "error: [INVALID_CONFIG] refusing to listen on 10.1.2.3 in plaintext: anyone on the network could read "
        "and write every topic; give --tls-cert/--tls-key, or --allow-plaintext to accept that"]


@pytest.mark.timeout(30)
def test_python_3_10_refuses_the_kafka_listener_in_one_line(monkeypatch: pytest.MonkeyPatch) -> None:
    from logstore.broker.config import load_broker_config
    monkeypatch.setattr(sys, "version_info", (3, 10, 14, "final", 0))
    with pytest.raises(InvalidConfigError, match=r"needs Python 3.11 or later .* this is Python 3.10$"):
        load_broker_config(None, overrides={"kafka_listener": "127.0.0.1:9092"}, env={})


@pytest.mark.timeout(90)
def test_read_committed_kafka_consumer_skips_aborted_transactions_and_markers(broker: EmbeddedBroker) -> None:
    topic = _topic(broker, "txn")
    with Producer(broker.bootstrap, transactional_id=f"txn-{topic}") as producer:
        producer.init_transactions()
        producer.begin_transaction()
        producer.send(topic, b"aborted-1", partition=0)
        producer.send(topic, b"aborted-2", partition=0)
        producer.abort_transaction()
        producer.begin_transaction()
        producer.send(topic, b"committed", partition=0)
        producer.commit_transaction()
    with Producer(broker.bootstrap) as plain:
        plain.send(topic, b"plain", partition=0).result()
    # Offsets: 0-1 aborted, 2 abort marker, 3 committed, 4 commit marker, 5 plain.
    committed = _read_kafka(broker, topic, 0, 0, 2, **{"isolation.level": "read_committed"})
    assert [(m.offset(), m.value()) for m in committed] == [(3, b"committed"), (5, b"plain")]
    everything = _read_kafka(broker, topic, 0, 0, 4, **{"isolation.level": "read_uncommitted"})
    assert [(m.offset(), m.value()) for m in everything] == [
        (0, b"aborted-1"), (1, b"aborted-2"), (3, b"committed"), (5, b"plain")]


def _metadata_request(correlation_id: int, topics: list[str]) -> bytes:
    request_type: Any = load_request_schema(3, 12)
    entry = sys.modules[request_type.__module__].MetadataRequestTopic
    return _request(3, 12, correlation_id, topics=tuple(entry(topic_id=None, name=t) for t in topics),
                    allow_auto_topic_creation=False, include_topic_authorized_operations=False)


@pytest.mark.timeout(60)
def test_a_request_over_max_request_entries_closes_its_connection() -> None:
    with EmbeddedBroker(kafka_listener="127.0.0.1:0", overrides={"max_request_entries": 3}) as small, \
            _connect(small) as sock:
        sock.sendall(_metadata_request(1, ["a", "b", "c"]))
        assert struct.unpack_from(">i", _answer(sock))[0] == 1
        sock.sendall(_metadata_request(2, ["a", "b", "c", "d"]))
        assert sock.recv(1) == b""


@pytest.mark.timeout(60)
def test_a_log_append_time_topic_says_so_both_ways(broker: EmbeddedBroker) -> None:
    topic = _topic(broker, "append-time", configs={"message.timestamp.type": "LogAppendTime"})
    before = int(time.time() * 1000)
    producer = ck.Producer({"bootstrap.servers": broker.kafka_bootstrap, "enable.idempotence": False, **_CLIENT})
    delivered: list[Any] = []
    producer.produce(topic, b"v", timestamp=1_000, on_delivery=lambda err, msg: delivered.append((err, msg)))
    assert producer.flush(20) == 0
    [(err, msg)] = delivered
    assert err is None and msg.timestamp()[0] == ck.TIMESTAMP_LOG_APPEND_TIME and msg.timestamp()[1] >= before
    [read] = _read_kafka(broker, topic, 0, 0, 1)
    assert read.timestamp() == msg.timestamp()


@pytest.mark.timeout(120)
@pytest.mark.parametrize("protocol", ["consumer", "classic"])
def test_kafka_consumers_subscribe_as_members_of_a_group(broker: EmbeddedBroker, protocol: str) -> None:
    topic = _topic(broker, "subscribe", partitions=4)
    group = f"members-{topic}"
    with Producer(broker.bootstrap) as producer:
        for i in range(40):
            producer.send(topic, b"%d" % i, partition=i % 4).result()
    config = {"bootstrap.servers": broker.kafka_bootstrap, "group.id": group, "group.protocol": protocol,
              "auto.offset.reset": "earliest", "auto.commit.interval.ms": 200, **_CLIENT}
    consumers = [ck.Consumer(config), ck.Consumer(config)]
    try:
        for c in consumers:
            c.subscribe([topic])
        seen: dict[int, set[int]] = {0: set(), 1: set()}
        deadline = time.monotonic() + 60
        while sum(len(s) for s in seen.values()) < 40 or not all(c.assignment() for c in consumers):
            assert time.monotonic() < deadline, (seen, [c.assignment() for c in consumers])
            for i, c in enumerate(consumers):
                msg = c.poll(0.2)
                if msg is not None and msg.error() is None:
                    seen[i].add(int(msg.value()))
        assert seen[0] | seen[1] == set(range(40))
        owned = [{tp.partition for tp in c.assignment()} for c in consumers]
        assert owned[0] | owned[1] == {0, 1, 2, 3} and not owned[0] & owned[1]
    finally:
        for c in consumers:
            c.close()
    with Consumer(broker.bootstrap, group_id=group) as ours:  # the members' commits, as logstore sees them
        committed = ours.committed([TopicPartition(topic, p) for p in range(4)])
        assert {tp.partition: c.offset if c else None for tp, c in committed.items()} == {0: 10, 1: 10, 2: 10, 3: 10}


@pytest.mark.timeout(60)
@pytest.mark.parametrize("records, code", [
    (b"not a record batch at all", 2),  # CORRUPT_MESSAGE
    (b"\0" * 61, 2),
    (None, 42),  # INVALID_REQUEST: no records
])
def test_bad_records_are_refused_per_partition_and_nothing_is_stored(
        broker: EmbeddedBroker, records: bytes | None, code: int) -> None:
    topic = _topic(broker, "bad-records")
    request_type: Any = load_request_schema(0, 9)
    module = sys.modules[request_type.__module__]
    with _connect(broker) as sock:
        sock.sendall(_request(0, 9, 1, transactional_id=None, acks=-1, timeout=datetime.timedelta(seconds=5),
                              topic_data=(module.TopicProduceData(name=topic, partition_data=(
                                  module.PartitionProduceData(index=0, records=records),)),)))
        response, _ = entity_reader(load_response_schema(0, 9))(_answer(sock), 5)
        [partition] = response.responses[0].partition_responses
        assert (partition.error_code, partition.base_offset) == (code, -1) and partition.error_message
        assert _api_versions(sock, 3).error_code == 0  # the connection serves on
    with Admin(broker.bootstrap) as admin:
        assert admin.list_offsets({TopicPartition(topic, 0): "latest"})[TopicPartition(topic, 0)].offset == 0


# ---------------------------------------------------------------------------- Apache Kafka's Java client


@pytest.mark.timeout(180)
def test_apache_kafkas_java_console_tools_produce_and_consume_in_a_group(broker: EmbeddedBroker) -> None:
    classpath = kafka_classpath()
    if classpath is None:
        pytest.skip(NO_KAFKA_JARS)
    topic = _topic(broker, "java", partitions=2)
    java = ["java", "-cp", classpath]
    produced = subprocess.run(  # idempotent by default: InitProducerId, then Produce
        [*java, "org.apache.kafka.tools.ConsoleProducer", "--bootstrap-server", broker.kafka_bootstrap,
         "--topic", topic, "--reader-property", "parse.key=true", "--reader-property", "key.separator=:"],
        input="k1:one\nk2:two\nk3:three\n", capture_output=True, text=True, timeout=90)
    assert produced.returncode == 0, produced.stderr[-2000:]
    for protocol in ("consumer", "classic"):  # Kafka's new group protocol (KIP-848), and its default
        consumed = subprocess.run(
            [*java, "org.apache.kafka.tools.consumer.ConsoleConsumer", "--bootstrap-server", broker.kafka_bootstrap,
             "--topic", topic, "--group", f"java-{protocol}-{topic}", "--from-beginning", "--max-messages", "3",
             "--command-property", f"group.protocol={protocol}", "--formatter-property", "print.key=true",
             "--timeout-ms", "60000"], capture_output=True, text=True, timeout=90)
        assert consumed.returncode == 0, (protocol, consumed.stderr[-2000:])
        assert sorted(line for line in consumed.stdout.splitlines() if "\t" in line) == [
            "k1\tone", "k2\ttwo", "k3\tthree"], protocol


@pytest.mark.timeout(60)
def test_an_unknown_member_saying_unchanged_is_told_to_rejoin(broker: EmbeddedBroker) -> None:
    with _connect(broker) as sock:  # as after a broker restart: epoch 3, fields null ("unchanged")
        sock.sendall(_request(68, 0, 9, group_id="g-restarted", member_id="m1", member_epoch=3, instance_id=None,
                              rack_id=None, subscribed_topic_names=None, server_assignor=None,
                              topic_partitions=None))
        response, _ = entity_reader(load_response_schema(68, 0))(_answer(sock), 5)
    assert response.error_code == 110 and "rejoin" in response.error_message  # FENCED_MEMBER_EPOCH
