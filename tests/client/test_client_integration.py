"""Producer, Consumer and Admin against a real embedded broker (no mocks).

One broker serves the module; every test works on its own fresh topics. Tests that
restart the broker get their own.
"""

from __future__ import annotations

import itertools
import threading
import time
from collections.abc import Iterator

import pandas as pd
import pyarrow as pa
import pyarrow.compute as pc
import pytest

from logstore import (
    Admin,
    BrokerClient,
    Consumer,
    ConsumerRecord,
    InvalidConfigError,
    InvalidPartitionsError,
    InvalidTopicError,
    LogstoreError,
    NewTopic,
    OffsetOutOfRangeError,
    Producer,
    RecordMetadata,
    SchemaMismatchError,
    TopicAlreadyExistsError,
    TopicPartition,
    UnknownTopicOrPartitionError,
    fetch_range,
)
from logstore.broker.embedded import EmbeddedBroker
from logstore.client.partitioner import partition_for_key
from logstore.client.results import FetchRequestPartition
from logstore.record import decode_schema
from logstore.record_reader import iter_batches

pytestmark = pytest.mark.timeout(60)

VALUE_SCHEMA = pa.schema([pa.field("id", pa.int64(), nullable=False), ("name", pa.string()),
                          ("score", pa.float64())])
_names = itertools.count()


@pytest.fixture(scope="module")
def broker() -> Iterator[EmbeddedBroker]:
    with EmbeddedBroker() as b:
        yield b


@pytest.fixture(scope="module")
def admin(broker: EmbeddedBroker) -> Iterator[Admin]:
    with Admin(broker.bootstrap) as a:
        yield a


def new_topic(admin: Admin, partitions: int = 1, *, value_schema: pa.Schema | None = None,
              configs: dict[str, str] | None = None) -> str:
    name = f"topic-{next(_names)}"
    admin.create_topics([NewTopic(name, partitions, configs=configs or {}, value_schema=value_schema)])
    return name


def consume(broker: EmbeddedBroker, tps: list[TopicPartition], count: int, *,
            timeout_s: float = 20, **options: object) -> list[ConsumerRecord]:
    """Read ``count`` records from the beginning of ``tps`` (fails after ``timeout_s``)."""
    out: list[ConsumerRecord] = []
    deadline = time.monotonic() + timeout_s
    with Consumer(broker.bootstrap, auto_offset_reset="earliest", **options) as consumer:  # type: ignore[arg-type]
        consumer.assign(tps)
        while len(out) < count:
            assert time.monotonic() < deadline, f"only {len(out)} of {count} records arrived"
            out.extend(consumer.poll(timeout_ms=500, max_records=count - len(out)))
    return out


def stored_batches(broker: EmbeddedBroker, tp: TopicPartition) -> list:
    """The stored batch headers of ``tp`` from offset 0, via the raw client."""
    headers = []
    offset = 0
    with BrokerClient(broker.bootstrap) as client:
        while True:
            [answer] = client.fetch([FetchRequestPartition(tp, offset, 1 << 20)], max_wait_ms=0)
            if not answer.records:
                return headers
            decode_schema(answer.schema)
            for b in iter_batches(memoryview(answer.records)):
                headers.append(b.header)
                offset = b.header.next_offset


# --------------------------------------------------------------------------- round trips


def test_round_trip_of_every_value_kind(broker: EmbeddedBroker, admin: Admin) -> None:
    topic = new_topic(admin)
    with Producer(broker.bootstrap) as producer:
        futures = [
            producer.send(topic, b"bytes", key=b"k1", headers=[("a", b"1"), ("a", "2")]),
            producer.send(topic, "text", key="k2", headers={"h": b"x"}, timestamp_ms=1_234),
            producer.send(topic, {"json": [1, 2]}),
            producer.send(topic, None, key="deleted"),
        ]
        mds = [f.result(timeout=10) for f in futures]
    assert [m.offset for m in mds] == [0, 1, 2, 3]
    assert mds[1] == RecordMetadata(topic, 0, 1, 1_234)
    got = consume(broker, [TopicPartition(topic, 0)], 4)
    assert [(r.offset, r.key, r.value, r.headers) for r in got] == [
        (0, b"k1", b"bytes", (("a", b"1"), ("a", b"2"))),
        (1, b"k2", b"text", (("h", b"x"),)),
        (2, None, b'{"json":[1,2]}', ()),
        (3, b"deleted", None, ()),
    ]
    assert got[1].timestamp_ms == 1_234
    assert got[0].timestamp_ms == mds[0].timestamp_ms


def test_typed_topic_round_trip_with_dicts_and_tables(broker: EmbeddedBroker, admin: Admin) -> None:
    topic = new_topic(admin, value_schema=VALUE_SCHEMA)
    assert admin.describe_topics([topic])[topic].value_schema.equals(VALUE_SCHEMA)
    with Producer(broker.bootstrap) as producer:
        first = producer.send(topic, {"id": 1, "name": "one"}, key="a").result(timeout=10)
        table = pa.table({"id": [2, 3], "name": ["two", None], "score": [0.5, 1.5]})
        result = producer.send_batch(topic, table, partition=0).result(timeout=10)
        tomb = producer.send(topic, None, key="a").result(timeout=10)
    assert first.offset == 0 and result.batches[0].base_offset == 1 and tomb.offset == 3
    got = consume(broker, [TopicPartition(topic, 0)], 4)
    assert [r.value for r in got] == [
        {"id": 1, "name": "one", "score": None},
        {"id": 2, "name": "two", "score": 0.5},
        {"id": 3, "name": None, "score": 1.5},
        None,
    ]
    with Consumer(broker.bootstrap, auto_offset_reset="earliest") as consumer:
        consumer.assign([TopicPartition(topic, 0)])
        tables = consumer.poll_arrow(timeout_ms=5_000)
    values = tables[TopicPartition(topic, 0)].column("value")
    assert pc.struct_field(values, "id").to_pylist() == [1, 2, 3, None]


def test_same_key_same_partition(broker: EmbeddedBroker, admin: Admin) -> None:
    topic = new_topic(admin, 4)
    keys = [f"user-{i % 10}" for i in range(100)]
    with Producer(broker.bootstrap) as producer:
        mds = [producer.send(topic, b"v", key=k) for k in keys]
        producer.flush()
        for key, fut in zip(keys, mds, strict=True):
            assert fut.result().partition == partition_for_key(key.encode(), 4)
    got = consume(broker, [TopicPartition(topic, p) for p in range(4)], 100)
    for rec in got:
        assert rec.partition == partition_for_key(rec.key or b"", 4)


def test_futures_and_callbacks_carry_the_assigned_offsets(broker: EmbeddedBroker, admin: Admin) -> None:
    topic = new_topic(admin, 2)
    delivered: list[RecordMetadata] = []
    lock = threading.Lock()

    def on_delivery(err: LogstoreError | None, md: RecordMetadata | None) -> None:
        assert err is None and md is not None
        with lock:
            delivered.append(md)

    with Producer(broker.bootstrap, linger_ms=2) as producer:
        futures = [producer.send(topic, b"%d" % i, key=b"%d" % (i % 5), on_delivery=on_delivery)
                   for i in range(200)]
        producer.flush()
    mds = [f.result() for f in futures]
    assert sorted(delivered, key=lambda m: (m.partition, m.offset)) == sorted(
        mds, key=lambda m: (m.partition, m.offset))
    got = consume(broker, [TopicPartition(topic, p) for p in range(2)], 200)
    by_address = {(r.partition, r.offset): r.value for r in got}
    for i, md in enumerate(mds):
        assert by_address[(md.partition, md.offset)] == b"%d" % i


def test_linger_and_batch_size_shape_the_stored_batches(broker: EmbeddedBroker, admin: Admin) -> None:
    lingering, small = new_topic(admin), new_topic(admin)
    with Producer(broker.bootstrap, linger_ms=300) as producer:
        futures = [producer.send(lingering, b"x" * 10) for _ in range(20)]
        for f in futures:
            f.result(timeout=10)
    assert [h.record_count for h in stored_batches(broker, TopicPartition(lingering, 0))] == [20]
    with Producer(broker.bootstrap, linger_ms=60_000, batch_size=1_000) as producer:
        futures = [producer.send(small, b"x" * 100) for _ in range(20)]
        producer.flush(timeout=10)
    counts = [h.record_count for h in stored_batches(broker, TopicPartition(small, 0))]
    assert sum(counts) == 20 and len(counts) == 3 and max(counts) == 8


@pytest.mark.parametrize("compression", ["lz4", "zstd"])
def test_compression_round_trip(broker: EmbeddedBroker, admin: Admin, compression: str) -> None:
    topic = new_topic(admin)
    with Producer(broker.bootstrap, compression=compression) as producer:
        producer.send(topic, b"a" * 1_000, key="k").result(timeout=10)
        producer.send_batch(topic, pa.table({"value": [b"b" * 1_000] * 50})).result(timeout=10)
    headers = stored_batches(broker, TopicPartition(topic, 0))
    assert {h.compression for h in headers} == {compression}
    got = consume(broker, [TopicPartition(topic, 0)], 51)
    assert got[0].value == b"a" * 1_000 and all(r.value == b"b" * 1_000 for r in got[1:])


def test_send_batch_arrow_and_pandas(broker: EmbeddedBroker, admin: Admin) -> None:
    topic = new_topic(admin, 3)
    n = 20_000
    table = pa.table({
        "key": [f"k{i % 100}" for i in range(n)],
        "value": [b"v%d" % i for i in range(n)],
        "timestamp": pa.array(range(n), pa.int64()),
    })
    df = pd.DataFrame({"value": [b"p%d" % i for i in range(1_000)]})
    with Producer(broker.bootstrap, batch_size=64 << 10) as producer:
        result = producer.send_batch(topic, table).result(timeout=30)
        from_pandas = producer.send_batch(topic, df, partition=2).result(timeout=30)
    assert result.record_count == n and from_pandas.record_count == 1_000
    assert len(result.batches) > 3  # cut by batch_size
    got = consume(broker, [TopicPartition(topic, p) for p in range(3)], n + 1_000)
    keyed = [r for r in got if r.value.startswith(b"v")]  # type: ignore[union-attr]
    assert all(r.partition == partition_for_key(r.key or b"", 3) for r in keyed)
    assert sorted(r.timestamp_ms for r in keyed) == list(range(n))
    for p in range(3):
        seq = [int(r.value[1:]) for r in keyed if r.partition == p]  # type: ignore[index]
        assert seq == sorted(seq)
    assert [r.value for r in got if r.partition == 2 and r.value.startswith(b"p")] == list(df["value"])  # type: ignore[union-attr]


# --------------------------------------------------------------------------- consumer positions


def _filled_topic(broker: EmbeddedBroker, admin: Admin, count: int = 10) -> tuple[TopicPartition, list[RecordMetadata]]:
    topic = new_topic(admin)
    with Producer(broker.bootstrap) as producer:
        futures = [producer.send(topic, b"%d" % i, timestamp_ms=10_000 + 1_000 * i) for i in range(count)]
        producer.flush()
    return TopicPartition(topic, 0), [f.result() for f in futures]


def test_seek_to_beginning_end_offset_and_timestamp(broker: EmbeddedBroker, admin: Admin) -> None:
    tp, _ = _filled_topic(broker, admin)
    with Consumer(broker.bootstrap) as consumer:
        consumer.assign([tp])
        assert consumer.position(tp) == 10  # auto_offset_reset="latest"
        assert consumer.poll(timeout_ms=100) == []
        consumer.seek_to_beginning()
        assert consumer.position(tp) == 0
        assert [r.offset for r in consumer.poll(timeout_ms=5_000, max_records=3)] == [0, 1, 2]
        assert consumer.position(tp) == 3
        consumer.seek(tp, 7)
        assert [r.offset for r in consumer.poll(timeout_ms=5_000)] == [7, 8, 9]
        consumer.seek_to_timestamp(14_500)
        assert consumer.position(tp) == 5
        assert consumer.poll(timeout_ms=5_000)[0].value == b"5"
        assert consumer.offsets_for_times({tp: 12_000}) == {tp: 2}
        assert consumer.offsets_for_times({tp: 99_000}) == {tp: None}
        consumer.seek_to_timestamp(99_000)
        assert consumer.position(tp) == 10
        consumer.seek_to_end(tp)
        assert consumer.position(tp) == 10
        assert consumer.beginning_offsets([tp]) == {tp: 0}
        assert consumer.end_offsets([tp]) == {tp: 10}
        assert consumer.highwater(tp) == 10


def test_poll_arrow_is_columnar_and_continues_where_it_stopped(broker: EmbeddedBroker, admin: Admin) -> None:
    tp, _ = _filled_topic(broker, admin, 10)
    with Consumer(broker.bootstrap, auto_offset_reset="earliest") as consumer:
        consumer.assign([tp])
        first = consumer.poll_arrow(timeout_ms=5_000, max_records=4)[tp]
        assert first.column_names == ["offset", "timestamp", "key", "value", "headers"]
        assert first.column("offset").to_pylist() == [0, 1, 2, 3]
        rest = consumer.poll_arrow(timeout_ms=5_000)[tp]
        assert rest.column("offset").to_pylist() == list(range(4, 10))
        assert consumer.poll(timeout_ms=100) == []


def test_iteration_yields_records_until_closed(broker: EmbeddedBroker, admin: Admin) -> None:
    tp, _ = _filled_topic(broker, admin, 5)
    consumer = Consumer(broker.bootstrap, auto_offset_reset="earliest")
    consumer.assign([tp])
    seen = []
    threading.Timer(2.0, consumer.close).start()
    for record in consumer:
        seen.append(record.offset)
    assert seen == [0, 1, 2, 3, 4]


def test_long_poll_returns_as_soon_as_data_arrives(broker: EmbeddedBroker, admin: Admin) -> None:
    topic = new_topic(admin)
    tp = TopicPartition(topic, 0)

    def later() -> None:
        time.sleep(0.5)
        with Producer(broker.bootstrap, linger_ms=0) as producer:
            producer.send(topic, b"hello").result(timeout=10)

    with Consumer(broker.bootstrap, fetch_max_wait_ms=20_000) as consumer:
        consumer.assign([tp])
        consumer.seek_to_end()
        sender = threading.Thread(target=later)
        start = time.monotonic()
        sender.start()
        got = consumer.poll(timeout_ms=20_000)
        elapsed = time.monotonic() - start
        sender.join()
    assert [r.value for r in got] == [b"hello"]
    assert 0.4 <= elapsed < 5.0


def test_offset_out_of_range_and_auto_offset_reset(broker: EmbeddedBroker, admin: Admin) -> None:
    tp, _ = _filled_topic(broker, admin, 10)
    assert admin.delete_records({tp: 4}) == {tp: 4}
    with Consumer(broker.bootstrap, auto_offset_reset="earliest") as consumer:
        consumer.assign([tp])
        consumer.seek(tp, 1)  # deleted
        assert [r.offset for r in consumer.poll(timeout_ms=5_000)] == list(range(4, 10))
    with Consumer(broker.bootstrap, auto_offset_reset="latest") as consumer:
        consumer.assign([tp])
        consumer.seek(tp, 50)  # beyond the end
        assert consumer.poll(timeout_ms=1_000) == []
        assert consumer.position(tp) == 10
    with Consumer(broker.bootstrap, auto_offset_reset="none") as consumer:
        consumer.assign([tp])
        with pytest.raises(OffsetOutOfRangeError, match="auto_offset_reset"):
            consumer.poll(timeout_ms=100)
        consumer.seek(tp, 0)
        with pytest.raises(OffsetOutOfRangeError, match="out of range"):
            consumer.poll(timeout_ms=1_000)


def test_fetch_range_is_exact_and_reports_data_loss(broker: EmbeddedBroker, admin: Admin) -> None:
    topic = new_topic(admin)
    tp = TopicPartition(topic, 0)
    with Producer(broker.bootstrap, linger_ms=0) as producer:
        for chunk in range(4):  # four stored batches of 5 records
            producer.send_batch(topic, pa.table({"value": [b"%d" % (chunk * 5 + i) for i in range(5)]})
                                ).result(timeout=10)
    with BrokerClient(broker.bootstrap) as client:
        batches = list(fetch_range(client, tp, 3, 17, max_bytes=200))
        assert [o for b in batches for o in b.column(0).to_pylist()] == list(range(3, 17))
        assert list(fetch_range(client, tp, 5, 5)) == []
        with pytest.raises(LogstoreError, match="did not become readable"):
            list(fetch_range(client, tp, 18, 25, timeout_ms=1_000))
        admin.delete_records({tp: 10})
        with pytest.raises(OffsetOutOfRangeError, match=r"records \[3, 10\) .* were deleted"):
            list(fetch_range(client, tp, 3, 17))
        kept = list(fetch_range(client, tp, 3, 17, fail_on_data_loss=False))
        assert [o for b in kept for o in b.column(0).to_pylist()] == list(range(10, 17))


# --------------------------------------------------------------------------- admin and errors


def test_admin_create_describe_alter_delete(broker: EmbeddedBroker, admin: Admin) -> None:
    name = f"admin-{next(_names)}"
    admin.create_topics([NewTopic(name, 3, configs={"retention.ms": "3600000"})], validate_only=True)
    assert name not in admin.list_topics()
    admin.create_topics([NewTopic(name, 3, configs={"retention.ms": "3600000"})])
    assert name in admin.list_topics()
    desc = admin.describe_topics([name])[name]
    assert desc.num_partitions == 3 and not desc.typed
    assert [p.partition for p in desc.partitions] == [0, 1, 2]
    assert all(p.high_watermark == 0 and p.log_end_offset == 0 for p in desc.partitions)
    assert admin.describe_configs([name])[name]["retention.ms"] == "3600000"
    admin.alter_configs({name: {"retention.ms": "60000", "cleanup.policy": "compact"}})
    configs = admin.describe_configs([name])[name]
    assert configs["retention.ms"] == "60000" and configs["cleanup.policy"] == "compact"
    admin.alter_configs({name: {"cleanup.policy": None}})
    assert admin.describe_configs([name])[name]["cleanup.policy"] == "delete"

    with Producer(broker.bootstrap) as producer:
        producer.send_batch(name, pa.table({"value": [b"x"] * 5, "timestamp": [100, 200, 300, 400, 500]}),
                            partition=1).result(timeout=10)
    tp = TopicPartition(name, 1)
    desc = admin.describe_topics([name])[name]
    assert desc.partitions[1].high_watermark == 5 and desc.partitions[1].last_stable_offset == 5
    found = admin.list_offsets({tp: "earliest"})[tp]
    assert found.offset == 0
    assert admin.list_offsets({tp: "latest"})[tp].offset == 5
    assert admin.list_offsets({tp: 250})[tp].offset == 2
    assert admin.list_offsets({tp: 10_000})[tp].offset is None
    assert admin.delete_records({tp: 2}) == {tp: 2}
    assert admin.list_offsets({tp: "earliest"})[tp].offset == 2
    with pytest.raises(ValueError):
        admin.list_offsets({tp: "first"})

    admin.delete_topics([name])
    assert name not in admin.list_topics()


def test_errors_surface_as_their_classes(broker: EmbeddedBroker, admin: Admin) -> None:
    topic = new_topic(admin)
    with pytest.raises(TopicAlreadyExistsError) as exists:
        admin.create_topics([NewTopic(topic)])
    assert exists.value.code == "TOPIC_ALREADY_EXISTS" and topic in exists.value.message
    with pytest.raises(UnknownTopicOrPartitionError) as unknown:
        admin.describe_topics(["no-such-topic"])
    assert unknown.value.code == "UNKNOWN_TOPIC_OR_PARTITION"
    with pytest.raises(UnknownTopicOrPartitionError):
        admin.delete_topics(["no-such-topic"])
    with pytest.raises(UnknownTopicOrPartitionError):
        admin.list_offsets({TopicPartition("no-such-topic", 0): "latest"})
    with pytest.raises(InvalidConfigError):
        admin.create_topics([NewTopic(f"bad-config-{next(_names)}", configs={"retention.ms": "soon"})])
    with pytest.raises(InvalidConfigError):
        admin.alter_configs({topic: {"no.such.key": "1"}})
    with pytest.raises(InvalidTopicError):
        admin.create_topics([NewTopic("bad/name")])
    with pytest.raises(InvalidPartitionsError):
        admin.create_topics([NewTopic(f"zero-{next(_names)}", 0)])
    with pytest.raises(SchemaMismatchError):
        admin.create_topics([NewTopic(f"bad-schema-{next(_names)}", value_schema=pa.schema([]))])
    with Producer(broker.bootstrap) as producer:
        with pytest.raises(UnknownTopicOrPartitionError):
            producer.send("no-such-topic", b"x")
        with pytest.raises(UnknownTopicOrPartitionError):
            producer.send(topic, b"x", partition=5)
    with Consumer(broker.bootstrap) as consumer:
        consumer.assign([TopicPartition("no-such-topic", 0)])
        with pytest.raises(UnknownTopicOrPartitionError):
            consumer.seek_to_beginning()


def test_producer_rides_over_a_broker_restart(tmp_path: object) -> None:
    with EmbeddedBroker() as broker:
        with Admin(broker.bootstrap) as admin:
            admin.create_topics([NewTopic("restarts")])
        with Producer(broker.bootstrap, linger_ms=0, retry_backoff_ms=200, retries=50) as producer:
            assert producer.send("restarts", b"before").result(timeout=10).offset == 0
            broker.restart()
            assert producer.send("restarts", b"after").result(timeout=30).offset == 1
        got = consume(broker, [TopicPartition("restarts", 0)], 2)
        assert [r.value for r in got] == [b"before", b"after"]
