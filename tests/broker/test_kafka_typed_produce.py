"""Kafka producers writing JSON to a typed topic (value.format=json), end to end.

A real broker (EmbeddedBroker with ``kafka_listener``) and confluent-kafka (librdkafka): its
JSON values land as the topic's columns, read by logstore's own Consumer; a value that
does not fit refuses its partition's batch with INVALID_RECORD and KIP-467 record errors,
and nothing of that batch is stored; the round trip logstore Producer -> Kafka consumer
(JSON) -> Kafka producer -> logstore Consumer keeps the rows. No component of ours is mocked.
"""

from __future__ import annotations

import datetime
import decimal
import io
import json
import math
import random
import sys
import time
from collections.abc import Iterator
from typing import Any

import pyarrow as pa
import pytest

pytest.importorskip("kio", reason="the Kafka listener needs kio (Python 3.11+)")
ck = pytest.importorskip("confluent_kafka")

from confluent_kafka.admin import AdminClient  # noqa: E402
from confluent_kafka.admin import NewTopic as KafkaNewTopic  # noqa: E402
from kafka_tools import CLIENT_CONF, kafka_call  # noqa: E402
from kio.index import load_request_schema  # noqa: E402
from kio.records.schema import NewRecordBatch, Record  # noqa: E402
from kio.records.writers import write_batch  # noqa: E402

from logstore import Admin, Consumer, NewTopic, Producer, TopicPartition  # noqa: E402
from logstore.broker.embedded import EmbeddedBroker  # noqa: E402
from logstore.errors import InvalidConfigError  # noqa: E402

UTC = datetime.timezone.utc
SCHEMA = pa.schema([pa.field("id", pa.int64(), nullable=False), pa.field("name", pa.string()),
                    pa.field("at", pa.timestamp("ms", tz="UTC")), pa.field("price", pa.decimal128(10, 2)),
                    pa.field("raw", pa.binary()), pa.field("score", pa.float64()),
                    pa.field("tags", pa.list_(pa.string()))])
JSON_FORMAT = {"value.format": "json"}


@pytest.fixture(scope="module")
def broker() -> Iterator[EmbeddedBroker]:
    with EmbeddedBroker(kafka_listener="127.0.0.1:0") as b:
        yield b


def _topic(broker: EmbeddedBroker, prefix: str, *, configs: dict[str, str] | None = None,
           schema: pa.Schema | None = SCHEMA) -> str:
    name = f"{prefix}-{random.randrange(1 << 30)}"
    with Admin(broker.bootstrap) as admin:
        admin.create_topics([NewTopic(name, value_schema=schema, configs=configs or {})])
    return name


def _produce_kafka(broker: EmbeddedBroker, topic: str, records: list[dict[str, Any]],
                   **config: Any) -> list[tuple[Any, int]]:
    """Produce with confluent-kafka; every record's (error, offset), in order."""
    producer = ck.Producer({"bootstrap.servers": broker.kafka_bootstrap, "enable.idempotence": False,
                            "message.send.max.retries": 0, **CLIENT_CONF, **config})
    results: list[tuple[Any, int]] = [(None, -1)] * len(records)
    for i, record in enumerate(records):
        def report(err: Any, msg: Any, i: int = i) -> None:
            results[i] = (err, msg.offset())
        producer.produce(topic, on_delivery=report, **record)
    assert producer.flush(20) == 0, "records still queued after 20 s"
    return results


def _read_logstore(broker: EmbeddedBroker, topic: str, count: int) -> list[Any]:
    with Consumer(broker.bootstrap, auto_offset_reset="earliest") as consumer:
        consumer.assign([TopicPartition(topic, 0)])
        got: list[Any] = []
        deadline = time.monotonic() + 20
        while len(got) < count and time.monotonic() < deadline:
            got += consumer.poll(timeout_ms=500)
    return got


def _end_offset(broker: EmbeddedBroker, topic: str) -> int:
    with Admin(broker.bootstrap) as admin:
        return admin.list_offsets({TopicPartition(topic, 0): "latest"})[TopicPartition(topic, 0)].offset


def _produce_raw(broker: EmbeddedBroker, topic: str, values: list[bytes | None]) -> Any:
    """One Produce v9 request (one batch of ``values``) to partition 0; its partition response."""
    buffer = io.BytesIO()
    at = datetime.datetime(2026, 1, 1, tzinfo=UTC)
    write_batch(buffer, NewRecordBatch(producer_id=-1, producer_epoch=-1, base_sequence=-1, attributes=0, records=tuple(
        Record(attributes=0, timestamp=at, offset=i, key=None, value=v, headers=()) for i, v in enumerate(values))))
    module = sys.modules[load_request_schema(0, 9).__module__]
    response = kafka_call(broker.kafka_bootstrap, 0, 9, transactional_id=None, acks=-1,
                          timeout=datetime.timedelta(seconds=5), topic_data=(module.TopicProduceData(
                              name=topic, partition_data=(module.PartitionProduceData(
                                  index=0, records=buffer.getvalue()),)),))
    [partition] = response.responses[0].partition_responses
    return partition


# ---------------------------------------------------------------------------- produce


@pytest.mark.timeout(90)
def test_kafka_producers_json_lands_as_the_topics_columns(broker: EmbeddedBroker) -> None:
    topic = _topic(broker, "json-in", configs=JSON_FORMAT)
    now = int(time.time() * 1000)
    values: list[dict[str, Any] | None] = [
        {"id": 1, "name": "Ada", "at": "2026-11-29T01:02:03.456+00:00", "price": "12.50", "raw": "AP8=",
         "score": 1.5, "tags": ["a", "b"]},
        {"id": 2, "name": None, "price": 3.25, "score": "NaN"},  # nulls, a missing column, a number as decimal
        None,  # a tombstone
        {"id": 4, "at": "2026-11-29T02:02:03Z", "score": "-Infinity", "tags": []},
    ]
    sent = [{"key": b"k%d" % i, "value": None if v is None else json.dumps(v).encode(), "timestamp": now + i,
             "headers": [("h", b"%d" % i)] if i % 2 else None} for i, v in enumerate(values)]
    results = _produce_kafka(broker, topic, sent, **{"linger.ms": 20})
    assert results == [(None, i) for i in range(4)]
    got = _read_logstore(broker, topic, 4)
    assert [(r.offset, r.key, r.timestamp_ms) for r in got] == [(i, s["key"], s["timestamp"]) for i, s in enumerate(sent)]
    assert [tuple(r.headers) for r in got] == [tuple(s["headers"] or ()) for s in sent]
    first, second, tombstone, fourth = (r.value for r in got)
    assert first == {"id": 1, "name": "Ada", "at": datetime.datetime(2026, 11, 29, 1, 2, 3, 456000, tzinfo=UTC),
                     "price": decimal.Decimal("12.50"), "raw": b"\x00\xff", "score": 1.5, "tags": ["a", "b"]}
    assert {k: v for k, v in second.items() if k != "score"} == {
        "id": 2, "name": None, "at": None, "price": decimal.Decimal("3.25"), "raw": None, "tags": None}
    assert math.isnan(second["score"]) and tombstone is None
    assert (fourth["at"], fourth["score"], fourth["tags"]) == (
        datetime.datetime(2026, 11, 29, 2, 2, 3, tzinfo=UTC), -math.inf, [])


@pytest.mark.timeout(90)
def test_a_value_that_does_not_fit_refuses_its_batch_with_invalid_record(broker: EmbeddedBroker) -> None:
    topic = _topic(broker, "json-bad", configs=JSON_FORMAT)
    good = json.dumps({"id": 1}).encode()
    sent = [{"value": v} for v in (good, b'{"id": "one"}', good, b"not json", good)]
    results = _produce_kafka(broker, topic, sent, **{"linger.ms": 200, "batch.num.messages": 100})
    # KIP-467 in librdkafka: each bad record fails with INVALID_RECORD (87), the others of its batch
    # with _INVALID_DIFFERENT_RECORD (-138, "a different record in the batch was invalid")
    bad, other = ck.KafkaError.INVALID_RECORD, ck.KafkaError._INVALID_DIFFERENT_RECORD
    assert [err.code() if err else None for err, _ in results] == [other, bad, other, bad, other]
    assert _end_offset(broker, topic) == 0  # nothing of the batch was written
    partition = _produce_raw(broker, topic, [good, None, b'{"id": 1, "extra": true}', b"[1]", good])
    assert (partition.error_code, partition.base_offset) == (87, -1)
    assert [(e.batch_index, e.batch_index_error_message) for e in partition.record_errors] == [
        (2, "the value has 'extra', not a column of the topic's schema (at, id, name, price, raw, score, tags)"),
        (3, "a JSON array, not an object of the topic's columns")]
    assert partition.error_message.startswith(f"{topic}-0: 2 of 5 values do not fit the topic's schema")
    assert _end_offset(broker, topic) == 0
    assert _produce_raw(broker, topic, [good, None]).error_code == 0  # a good batch is appended after
    assert _end_offset(broker, topic) == 2


@pytest.mark.timeout(60)
def test_a_typed_topic_without_value_format_still_refuses_kafka_producers(broker: EmbeddedBroker) -> None:
    topic = _topic(broker, "json-none")
    [(err, _)] = _produce_kafka(broker, topic, [{"value": json.dumps({"id": 1}).encode()}])
    assert err is not None and err.code() == ck.KafkaError.UNSUPPORTED_FOR_MESSAGE_FORMAT  # 43
    partition = _produce_raw(broker, topic, [b'{"id": 1}'])
    assert partition.error_code == 43 and "set value.format=json" in partition.error_message
    assert _end_offset(broker, topic) == 0


# ---------------------------------------------------------------------------- the config


@pytest.mark.timeout(60)
def test_value_format_is_validated_described_and_altered(broker: EmbeddedBroker) -> None:
    with Admin(broker.bootstrap) as admin:
        with pytest.raises(InvalidConfigError, match="value.format") as unknown:
            admin.create_topics([NewTopic("json-xml", value_schema=SCHEMA, configs={"value.format": "xml"})])
        assert unknown.value.code == "INVALID_CONFIG" and "json" in unknown.value.message
        with pytest.raises(InvalidConfigError, match="untyped"):
            admin.create_topics([NewTopic("json-untyped", configs=JSON_FORMAT)])
    topic = _topic(broker, "json-alter")
    with Admin(broker.bootstrap) as admin:
        assert admin.describe_configs([topic])[topic]["value.format"] == "none"
        admin.alter_configs({topic: JSON_FORMAT})
        assert admin.describe_configs([topic])[topic]["value.format"] == "json"
    assert _produce_raw(broker, topic, [b'{"id": 7}']).error_code == 0
    assert [r.value["id"] for r in _read_logstore(broker, topic, 1)] == [7]


@pytest.mark.timeout(60)
def test_kafka_create_topics_takes_the_schema_and_value_format(broker: EmbeddedBroker) -> None:
    topic = f"json-kafka-admin-{random.randrange(1 << 30)}"
    admin = AdminClient({"bootstrap.servers": broker.kafka_bootstrap, **CLIENT_CONF})
    [future] = admin.create_topics([KafkaNewTopic(topic, 1, 1, config={
        "schema": "id long NOT NULL, name string", "value.format": "json"})]).values()
    future.result(timeout=20)
    results = _produce_kafka(broker, topic, [{"value": b'{"id": 1, "name": "x"}'}])
    assert results == [(None, 0)]
    assert [r.value for r in _read_logstore(broker, topic, 1)] == [{"id": 1, "name": "x"}]


# ---------------------------------------------------------------------------- round trip


def _random_row(rng: random.Random) -> dict[str, Any] | None:
    if rng.random() < 0.1:
        return None
    maybe = lambda value: None if rng.random() < 0.2 else value  # noqa: E731
    return {"id": rng.randrange(-2**63, 2**63), "name": maybe("".join(rng.choice("aé字 \"\\\n") for _ in range(5))),
            "at": maybe(datetime.datetime(1970, 1, 1, tzinfo=UTC) + datetime.timedelta(milliseconds=rng.randrange(2**33))),
            "price": maybe(decimal.Decimal(rng.randrange(-10**9, 10**9)).scaleb(-2)),
            "raw": maybe(rng.randbytes(rng.randrange(0, 6))),
            "score": maybe(rng.choice([rng.uniform(-1e9, 1e9), math.inf, -math.inf, 0.0])),
            "tags": maybe([str(rng.randrange(9)) for _ in range(rng.randrange(3))])}


@pytest.mark.timeout(120)
def test_rows_survive_logstore_then_kafka_consumer_then_kafka_producer(broker: EmbeddedBroker) -> None:
    rng = random.Random(467)
    rows = [_random_row(rng) for _ in range(40)]
    source, copy = _topic(broker, "json-source"), _topic(broker, "json-copy", configs=JSON_FORMAT)
    with Producer(broker.bootstrap) as producer:
        for i, row in enumerate(rows):
            producer.send(source, row, key=b"%d" % i)
        producer.flush(timeout=30)
    consumer = ck.Consumer({"bootstrap.servers": broker.kafka_bootstrap, "group.id": "unused",
                            "enable.auto.commit": False, **CLIENT_CONF})
    try:
        consumer.assign([ck.TopicPartition(source, 0, 0)])
        messages: list[Any] = []
        deadline = time.monotonic() + 20
        while len(messages) < len(rows) and time.monotonic() < deadline:
            message = consumer.poll(0.5)
            if message is not None and message.error() is None:
                messages.append(message)
    finally:
        consumer.close()
    results = _produce_kafka(broker, copy, [{"key": m.key(), "value": m.value()} for m in messages],
                             **{"linger.ms": 20})
    assert [err for err, _ in results] == [None] * len(rows)
    got = _read_logstore(broker, copy, len(rows))
    assert [r.key for r in got] == [b"%d" % i for i in range(len(rows))]
    assert [r.value for r in got] == rows
