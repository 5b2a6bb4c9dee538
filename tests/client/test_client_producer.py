"""Producer logic without a broker: vectorized murmur2, conversion of Arrow/pandas input
to the stored schema, partition choice, batching (linger, batch_size), ordering, retries,
acks=0, delivery timeout, flush/close. The network side is a scripted in-memory fake of
BrokerClient; the real broker is exercised in test_client_integration.py."""

from __future__ import annotations

import concurrent.futures
import random
import time
from collections import defaultdict
from typing import Any

import numpy as np
import pandas as pd
import pyarrow as pa
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from producer_fakes import UNTYPED, FakeClient, make_producer

from logstore.client.partitioner import (
    murmur2,
    murmur2_array,
    partition_for_key,
    partitions_for_keys,
)
from logstore.client.producer import parse_acks, to_stored_batch
from logstore.client.producer.arrow_input import input_batches
from logstore.errors import (
    BrokerUnavailableError,
    LogstoreError,
    RecordTooLargeError,
    RequestTimedOutError,
    SchemaMismatchError,
    UnknownTopicOrPartitionError,
)
from logstore.record import (
    HEADERS_TYPE,
    TIMESTAMP_TYPE,
    typed_schema,
    value_schema_of,
)
from logstore.types import RecordMetadata, TopicPartition

VALUE_SCHEMA = pa.schema([pa.field("id", pa.int64(), nullable=False), ("name", pa.string()),
                          ("score", pa.float64())])
TYPED = typed_schema(VALUE_SCHEMA)


# --------------------------------------------------------------------------- murmur2


@settings(max_examples=200, deadline=None)
@given(st.lists(st.one_of(st.none(), st.binary(max_size=40)), min_size=1, max_size=60),
       st.integers(min_value=1, max_value=64))
def test_vectorized_murmur2_matches_kafka_port(keys: list[bytes | None], n: int) -> None:
    arr = pa.array(keys, pa.binary())
    hashes = murmur2_array(arr)
    parts = partitions_for_keys(arr, n)
    for i, key in enumerate(keys):
        if key is None:
            assert parts[i] == -1
        else:
            assert int(hashes[i]) == murmur2(key)
            assert int(parts[i]) == partition_for_key(key, n)


def test_vectorized_murmur2_on_slices_strings_and_large_types() -> None:
    keys = [f"key-{i}".encode() * (i % 7) for i in range(500)]
    expected = [partition_for_key(k, 12) for k in keys]
    assert partitions_for_keys(pa.array(keys, pa.binary()), 12).tolist() == expected
    assert partitions_for_keys(pa.array(keys, pa.large_binary()), 12).tolist() == expected
    assert partitions_for_keys(pa.array([k.decode() for k in keys]), 12).tolist() == expected
    sliced = pa.array(keys, pa.binary()).slice(123, 200)
    assert partitions_for_keys(sliced, 12).tolist() == expected[123:323]
    chunked = pa.chunked_array([keys[:100], keys[100:]], pa.binary())
    assert partitions_for_keys(chunked, 12).tolist() == expected
    assert murmur2_array(pa.array([], pa.binary())).tolist() == []
    # Known Kafka values (also pinned by test_partitioner).
    assert murmur2_array(pa.array([b"21"])).tolist() == [murmur2(b"21")]


# --------------------------------------------------------------------------- conversion


def test_untyped_conversion_of_strings_keys_and_default_timestamps() -> None:
    rb = pa.record_batch({"value": ["a", "bb", None], "key": [1, None, 3]})
    stored, parts = to_stored_batch(rb, UNTYPED, now_ms=5_000)
    assert stored.schema.equals(UNTYPED)
    assert parts is None
    assert stored.column(3).to_pylist() == [b"a", b"bb", None]
    assert stored.column(2).to_pylist() == [b"1", None, b"3"]
    assert stored.column(1).cast(pa.int64()).to_pylist() == [5_000] * 3
    assert stored.column(4).null_count == 3


@pytest.mark.parametrize(
    "column",
    [
        pa.array([1_500, None], pa.int64()),
        pa.array([1_500_000_000, None], pa.timestamp("ns")),
        pa.array([1_500_999, None], pa.timestamp("us", tz="Europe/Paris")),
        pa.array([1, None], pa.timestamp("s")),
    ],
)
def test_timestamp_columns_become_utc_milliseconds(column: pa.Array) -> None:
    rb = pa.record_batch({"value": [b"x", b"y"], "timestamp": column})
    stored, _ = to_stored_batch(rb, UNTYPED, now_ms=7)
    got = stored.column(1)
    assert got.type == TIMESTAMP_TYPE
    ms = got.cast(pa.int64()).to_pylist()
    assert ms[0] in (1_500, 1_000) and ms[1] == 7  # null timestamp = now


def test_headers_column_and_partition_column() -> None:
    headers = pa.array([[{"key": "a", "value": b"1"}], None], pa.list_(
        pa.struct([("key", pa.string()), ("value", pa.string())])))
    rb = pa.record_batch({"value": [b"x", b"y"], "headers": headers,
                          "partition": pa.array([2, 0], pa.int8())})
    stored, parts = to_stored_batch(rb, UNTYPED, now_ms=1)
    assert stored.column(4).type == HEADERS_TYPE
    assert stored.column(4).to_pylist() == [[{"key": "a", "value": b"1"}], None]
    assert parts is not None and parts.tolist() == [2, 0]


def test_unknown_and_missing_columns_are_rejected() -> None:
    with pytest.raises(ValueError, match="unknown input columns"):
        to_stored_batch(pa.record_batch({"value": [b"x"], "valeu": [b"y"]}), UNTYPED)
    with pytest.raises(ValueError, match="'value' column"):
        to_stored_batch(pa.record_batch({"key": [b"x"]}), UNTYPED)
    with pytest.raises(ValueError, match="key_column"):
        to_stored_batch(pa.record_batch({"value": [b"x"]}), UNTYPED, key_column="id")
    with pytest.raises(TypeError, match="timestamp"):
        to_stored_batch(pa.record_batch({"value": [b"x"], "timestamp": ["yesterday"]}), UNTYPED)


def test_typed_conversion_casts_and_fills_nullable_columns() -> None:
    rb = pa.record_batch({"id": pa.array([1, 2], pa.int32()), "name": ["a", None]})
    stored, _ = to_stored_batch(rb, TYPED, now_ms=1)
    assert stored.schema.equals(TYPED)
    assert stored.column(3).to_pylist() == [
        {"id": 1, "name": "a", "score": None}, {"id": 2, "name": None, "score": None}]
    assert value_schema_of(stored.schema).equals(VALUE_SCHEMA)


def test_typed_conversion_errors() -> None:
    with pytest.raises(SchemaMismatchError, match="'id' is NOT NULL and missing"):
        to_stored_batch(pa.record_batch({"name": ["a"]}), TYPED)
    with pytest.raises(SchemaMismatchError, match="'id' is NOT NULL but 1 rows are null"):
        to_stored_batch(pa.record_batch({"id": pa.array([1, None], pa.int64())}), TYPED)
    with pytest.raises(SchemaMismatchError, match="'id'"):
        to_stored_batch(pa.record_batch({"id": ["one"]}), TYPED)
    with pytest.raises(ValueError, match="unknown input columns"):
        to_stored_batch(pa.record_batch({"id": [1], "nmae": ["x"]}), TYPED)


def test_typed_struct_value_column_allows_tombstones_and_key_from_a_value_column() -> None:
    value = pa.array([{"id": 1, "name": "a", "score": 1.0}, None], TYPED.field("value").type)
    stored, _ = to_stored_batch(pa.record_batch({"value": value}), TYPED)
    assert stored.column(3).to_pylist()[1] is None
    rb = pa.record_batch({"id": [7, 8], "name": ["x", "y"]})
    stored, _ = to_stored_batch(rb, TYPED, key_column="id")
    assert stored.column(2).to_pylist() == [b"7", b"8"]
    assert stored.column(3).field("id").to_pylist() == [7, 8]


def test_pandas_input() -> None:
    df = pd.DataFrame({"key": ["a", "b"], "value": [b"1", b"2"],
                       "timestamp": pd.to_datetime([1_000, 2_000], unit="ms", utc=True)})
    [rb] = input_batches(df)
    stored, _ = to_stored_batch(rb, UNTYPED)
    assert stored.column(2).to_pylist() == [b"a", b"b"]
    assert stored.column(1).cast(pa.int64()).to_pylist() == [1_000, 2_000]
    with pytest.raises(TypeError, match="pyarrow Table"):
        input_batches([{"value": b"x"}])


def test_parse_acks() -> None:
    assert parse_acks("all") == parse_acks(-1) == -1
    assert parse_acks(1) == 1 and parse_acks("0") == 0
    with pytest.raises(ValueError):
        parse_acks(2)


# --------------------------------------------------------------------------- a fake broker client


def values_of(fake: FakeClient, tp: TopicPartition) -> list[Any]:
    return [r["value"] for r in fake.records[tp]]


# --------------------------------------------------------------------------- producer behaviour


@pytest.mark.timeout(30)
def test_keyed_records_go_to_the_kafka_partition_in_order() -> None:
    fake = FakeClient({"t": (5, UNTYPED)})
    with make_producer(fake, linger_ms=1) as producer:
        futures = [(k, producer.send("t", f"v{i}", key=k)) for i, k in
                   enumerate(random.Random(1).choice(["a", "b", "c", "d"]) for _ in range(200))]
        producer.flush()
        offsets: dict[int, list[int]] = defaultdict(list)
        for key, fut in futures:
            md = fut.result(timeout=5)
            assert md.partition == partition_for_key(key.encode(), 5)
            offsets[md.partition].append(md.offset)
        for got in offsets.values():
            assert got == sorted(got) == list(range(len(got)))


@pytest.mark.timeout(30)
def test_metadata_and_callbacks_carry_offsets() -> None:
    fake = FakeClient({"t": (1, UNTYPED)})
    seen: list[tuple[LogstoreError | None, RecordMetadata | None]] = []
    with make_producer(fake, linger_ms=0) as producer:
        fut = producer.send("t", b"x", timestamp_ms=42, on_delivery=lambda e, md: seen.append((e, md)))
        md = fut.result(timeout=5)
    assert md == RecordMetadata("t", 0, 0, 42)  # CreateTime: the record's own timestamp
    assert seen == [(None, md)]


@pytest.mark.timeout(30)
def test_log_append_time_topics_report_the_broker_time() -> None:
    fake = FakeClient({"t": (1, UNTYPED)}, configs={"message.timestamp.type": "LogAppendTime"})
    with make_producer(fake, linger_ms=0) as producer:
        assert producer.send("t", b"x", timestamp_ms=42).result(timeout=5).timestamp_ms == 12345


@pytest.mark.timeout(30)
def test_linger_collects_records_into_one_batch() -> None:
    fake = FakeClient({"t": (1, UNTYPED)})
    with make_producer(fake, linger_ms=300) as producer:
        start = time.monotonic()
        futures = [producer.send("t", b"v%d" % i, partition=0) for i in range(5)]
        concurrent.futures.wait(futures, timeout=10)
        elapsed = time.monotonic() - start
    assert elapsed >= 0.25
    assert fake.requests == [(-1, [(TopicPartition("t", 0), 1)])]
    assert values_of(fake, TopicPartition("t", 0)) == [b"v%d" % i for i in range(5)]


@pytest.mark.timeout(30)
def test_batch_size_seals_full_batches_without_waiting_for_linger() -> None:
    fake = FakeClient({"t": (1, UNTYPED)})
    with make_producer(fake, linger_ms=60_000, batch_size=1_000) as producer:
        futures = [producer.send("t", b"x" * 100, partition=0) for i in range(30)]
        # 30 records of ~124 bytes: full batches go out at once, only the tail lingers.
        concurrent.futures.wait(futures[:24], timeout=10)
        assert all(f.done() for f in futures[:24])
        assert not futures[-1].done()
        assert producer.flush(timeout=10) == 0
    batches = sum(n for _, counts in fake.requests for _, n in counts)
    assert batches == 4  # 8 + 8 + 8 + 6 records
    assert [f.result().offset for f in futures] == list(range(30))


@pytest.mark.timeout(30)
def test_keyless_records_stick_to_a_partition_until_the_batch_is_sealed() -> None:
    fake = FakeClient({"t": (4, UNTYPED)})
    with make_producer(fake, linger_ms=60_000, batch_size=1_000) as producer:
        futures = [producer.send("t", b"x" * 100) for _ in range(16)]
        producer.flush()
    parts = [f.result().partition for f in futures]
    assert parts[:8] == [parts[0]] * 8          # one full batch on one partition
    assert parts[8:16] == [parts[8]] * 8
    assert parts[8] != parts[0]                 # then the next batch moved on


@pytest.mark.timeout(30)
def test_one_request_in_flight_per_partition() -> None:
    fake = FakeClient({"t": (1, UNTYPED)})
    fake.hold = True
    producer = make_producer(fake, linger_ms=0, batch_size=200)
    try:
        first = producer.send("t", b"a" * 150, partition=0)
        deadline = time.monotonic() + 5
        while not fake.held and time.monotonic() < deadline:
            time.sleep(0.01)
        second = producer.send("t", b"b" * 150, partition=0)
        time.sleep(0.2)
        assert len(fake.held) == 1  # the second batch waits for the first answer
        fake.hold = False
        fake.release()
        assert first.result(timeout=5).offset == 0
        assert second.result(timeout=5).offset == 1
    finally:
        fake.hold = False
        fake.release()
        producer.close()
    assert fake.max_in_flight[TopicPartition("t", 0)] == 1


def _wait_held(fake: FakeClient, n: int) -> None:
    deadline = time.monotonic() + 5
    while len(fake.held) < n and time.monotonic() < deadline:
        time.sleep(0.005)
    assert len(fake.held) == n


@pytest.mark.timeout(30)
@pytest.mark.parametrize("idempotent", [False, True])
def test_records_sent_while_no_request_can_leave_share_the_next_batch(
        idempotent: bool, monkeypatch: pytest.MonkeyPatch) -> None:
    # Kafka's accumulator under back-pressure: with linger 0 and the one in-flight slot taken,
    # the records that arrive meanwhile leave together when the answer comes, not one by one.
    from logstore.client.producer import accumulator

    monkeypatch.setattr(accumulator, "MAX_HOLD_S", 10.0)  # however slow this machine is today
    fake = FakeClient({"t": (1, UNTYPED)})
    fake.hold = True
    producer = make_producer(fake, linger_ms=0, enable_idempotence=idempotent,
                             max_in_flight_requests_per_connection=1)
    try:
        futures = [producer.send("t", b"first", partition=0)]
        _wait_held(fake, 1)
        for i in range(50):  # paced, so that the sender wakes between them
            futures.append(producer.send("t", b"v%d" % i, partition=0))
            time.sleep(0.001)
        # Within the hold: nothing more left, nothing is sealed.
        assert len(fake.held) == 1 and not producer._accumulator.partitions[TopicPartition("t", 0)].queue
        fake.hold = False
        fake.release()
        assert [f.result(timeout=5).offset for f in futures] == list(range(51))
    finally:
        fake.hold = False
        fake.release()
        producer.close()
    assert [counts for _, counts in fake.requests] == [[(TopicPartition("t", 0), 1)]] * 2


@pytest.mark.timeout(30)
def test_a_held_buffer_is_sealed_after_the_hold_bound_even_if_nothing_can_leave() -> None:
    from logstore.client.producer.accumulator import MAX_HOLD_S

    fake = FakeClient({"t": (1, UNTYPED)})
    fake.hold = True
    producer = make_producer(fake, linger_ms=0, max_in_flight_requests_per_connection=1)
    state = lambda: producer._accumulator.partitions[TopicPartition("t", 0)]  # noqa: E731
    try:
        producer.send("t", b"first", partition=0)
        _wait_held(fake, 1)
        producer.send("t", b"second", partition=0)
        deadline = time.monotonic() + 5
        while not state().queue and time.monotonic() < deadline:
            time.sleep(0.005)
        assert len(state().queue) == 1 and len(fake.held) == 1
        assert time.monotonic() < deadline
        held_for = time.monotonic() - state().queue[0].created
        assert held_for >= MAX_HOLD_S
    finally:
        fake.hold = False
        fake.release()
        producer.close()


@pytest.mark.timeout(30)
@pytest.mark.parametrize(("idempotent", "expected"), [(False, 1), (True, 3)])
def test_only_idempotent_producers_pipeline_a_partition(idempotent: bool, expected: int) -> None:
    # Without idempotence nothing would keep a retried batch in order: one request at a time.
    fake = FakeClient({"t": (1, UNTYPED)})
    fake.hold = True
    producer = make_producer(fake, linger_ms=0, batch_size=200, enable_idempotence=idempotent,
                             max_in_flight_requests_per_connection=5)
    try:
        futures = []
        for i in range(3):
            futures.append(producer.send("t", b"%d" % i * 150, partition=0))
            deadline = time.monotonic() + 5
            while len(fake.held) < min(i + 1, expected) and time.monotonic() < deadline:
                time.sleep(0.01)
        time.sleep(0.2)
        assert len(fake.held) == expected
        fake.hold = False
        fake.release()
        assert [f.result(timeout=5).offset for f in futures] == [0, 1, 2]
    finally:
        fake.hold = False
        fake.release()
        producer.close()
    assert fake.max_in_flight[TopicPartition("t", 0)] == expected


@pytest.mark.timeout(30)
def test_retriable_errors_are_retried_in_order() -> None:
    fake = FakeClient({"t": (1, UNTYPED)})
    fake.script.append(lambda tps: BrokerUnavailableError("down"))
    fake.script.append(lambda tps: {tps[0]: UnknownTopicOrPartitionError("not yet")})
    with make_producer(fake, linger_ms=0, retry_backoff_ms=10) as producer:
        futures = [producer.send("t", b"%d" % i, partition=0) for i in range(20)]
        producer.flush()
    assert [f.result().offset for f in futures] == list(range(20))
    assert values_of(fake, TopicPartition("t", 0)) == [b"%d" % i for i in range(20)]


@pytest.mark.timeout(30)
def test_non_retriable_errors_fail_the_records() -> None:
    fake = FakeClient({"t": (1, UNTYPED)})
    fake.script.append(lambda tps: {tps[0]: RecordTooLargeError("too big")})
    errors: list[LogstoreError | None] = []
    with make_producer(fake, linger_ms=0) as producer:
        fut = producer.send("t", b"x", on_delivery=lambda e, md: errors.append(e))
        with pytest.raises(RecordTooLargeError, match="too big"):
            fut.result(timeout=5)
    assert isinstance(errors[0], RecordTooLargeError)


@pytest.mark.timeout(30)
def test_retries_are_bounded() -> None:
    fake = FakeClient({"t": (1, UNTYPED)})
    for _ in range(10):
        # What gRPC says when nothing listens: the request never left (else the
        # outcome would be unknown, see test_producer_retries.py).
        fake.script.append(lambda tps: BrokerUnavailableError(
            "broker b:1 is unavailable (Produce: failed to connect to all addresses; "
            "last error: UNKNOWN: ipv4:127.0.0.1:1: Failed to connect to remote host: Connection refused)"))
    with make_producer(fake, linger_ms=0, retries=2, retry_backoff_ms=1) as producer:
        fut = producer.send("t", b"x")
        with pytest.raises(BrokerUnavailableError):
            fut.result(timeout=5)
    assert len(fake.script) == 7  # 1 attempt + 2 retries


@pytest.mark.timeout(30)
def test_delivery_timeout_expires_batches() -> None:
    fake = FakeClient({"t": (1, UNTYPED)})
    for _ in range(1000):
        fake.script.append(lambda tps: BrokerUnavailableError("down"))
    with make_producer(fake, linger_ms=0, retries=1000, retry_backoff_ms=20,
                       delivery_timeout_ms=200) as producer:
        fut = producer.send("t", b"x")
        with pytest.raises((RequestTimedOutError, BrokerUnavailableError)):
            fut.result(timeout=5)


@pytest.mark.timeout(30)
def test_acks_zero_reports_offset_minus_one() -> None:
    fake = FakeClient({"t": (1, UNTYPED)})
    with make_producer(fake, acks=0, linger_ms=0) as producer:
        md = producer.send("t", b"x").result(timeout=5)
    assert md.offset == -1
    assert fake.requests[0][0] == 0


@pytest.mark.timeout(30)
def test_synchronous_errors() -> None:
    fake = FakeClient({"t": (2, UNTYPED), "typed": (1, TYPED)})
    with make_producer(fake, max_request_size=1_000) as producer:
        with pytest.raises(UnknownTopicOrPartitionError):
            producer.send("nope", b"x")
        with pytest.raises(UnknownTopicOrPartitionError, match="partition 2"):
            producer.send("t", b"x", partition=2)
        with pytest.raises(TypeError, match="value"):
            producer.send("t", 12)  # type: ignore[arg-type]
        with pytest.raises(TypeError, match="key"):
            producer.send("t", b"x", key=12)  # type: ignore[arg-type]
        with pytest.raises(RecordTooLargeError):
            producer.send("t", b"x" * 2_000)
        with pytest.raises(SchemaMismatchError, match="unknown columns"):
            producer.send("typed", {"id": 1, "nmae": "x"})
        with pytest.raises(SchemaMismatchError, match="NOT NULL"):
            producer.send("typed", {"name": "x"})
        with pytest.raises(TypeError, match="dicts"):
            producer.send("typed", b"raw")
    with pytest.raises(RuntimeError, match="closed"):
        producer.send("t", b"x")
    producer.close()  # idempotent


@pytest.mark.timeout(30)
@pytest.mark.parametrize("idempotent", [False, True])
def test_values_of_every_kind(idempotent: bool) -> None:
    fake = FakeClient({"t": (1, UNTYPED), "typed": (1, TYPED)})
    with make_producer(fake, linger_ms=0, enable_idempotence=idempotent) as producer:
        futures = [
            producer.send("t", b"raw", key=b"k", headers=[("h", b"1"), ("h", "2")]),
            producer.send("t", "text", headers={"x": None}),
            producer.send("t", {"a": 1}),
            producer.send("t", None, key="tomb"),
            producer.send("typed", {"id": 1, "name": "n"}),
        ]
        if idempotent:
            # Sequences are reserved when a batch seals, so a bad value fails in send().
            with pytest.raises(SchemaMismatchError, match="not a number"):
                producer.send("typed", {"id": "not a number"})
        else:
            futures.append(producer.send("typed", {"id": "not a number"}))  # fails alone, at encode time
        futures += [
            producer.send("typed", {"id": 2, "score": 0.5}),
            producer.send("typed", None, key="gone"),
        ]
        producer.flush()
    assert [r["value"] for r in fake.records[TopicPartition("t", 0)]] == [b"raw", b"text", b'{"a":1}', None]
    assert fake.records[TopicPartition("t", 0)][0]["headers"] == [
        {"key": "h", "value": b"1"}, {"key": "h", "value": b"2"}]
    assert fake.records[TopicPartition("t", 0)][1]["headers"] == [{"key": "x", "value": None}]
    assert fake.records[TopicPartition("t", 0)][3]["key"] == b"tomb"
    typed = [r["value"] for r in fake.records[TopicPartition("typed", 0)]]
    assert typed == [{"id": 1, "name": "n", "score": None}, {"id": 2, "name": None, "score": 0.5}, None]
    typed_futures = futures[4:]
    if not idempotent:
        with pytest.raises(SchemaMismatchError):
            typed_futures.pop(1).result()
    assert [f.result().offset for f in typed_futures] == [0, 1, 2]


@pytest.mark.timeout(30)
def test_send_batch_routes_keys_like_send() -> None:
    fake = FakeClient({"t": (6, UNTYPED)})
    keys = [f"user-{i % 37}" for i in range(5_000)]
    table = pa.table({"key": keys, "value": [f"v{i}".encode() for i in range(5_000)]})
    with make_producer(fake, batch_size=16_000) as producer:
        result = producer.send_batch("t", table).result(timeout=10)
    assert result.record_count == 5_000
    seen = 0
    for p in range(6):
        rows = fake.records[TopicPartition("t", p)]
        seen += len(rows)
        assert all(partition_for_key(r["key"], 6) == p for r in rows)
        values = [int(r["value"][1:]) for r in rows]
        assert values == sorted(values)  # input order kept within a partition
    assert seen == 5_000
    for tp, batches in result.by_partition().items():
        assert [b.base_offset for b in batches] == sorted(b.base_offset for b in batches)
        assert sum(b.record_count for b in batches) == len(fake.records[tp])
    assert all(b.record_count * 20 <= 16_000 * 1.5 for b in result.batches)


@pytest.mark.timeout(30)
def test_send_batch_keyless_spreads_chunks_and_explicit_partition() -> None:
    fake = FakeClient({"t": (3, UNTYPED)})
    rb = pa.record_batch({"value": [b"x" * 100] * 300})
    with make_producer(fake, batch_size=10_000) as producer:
        spread = producer.send_batch("t", rb).result(timeout=10)
        assert len({b.partition for b in spread.batches}) == 3
        fixed = producer.send_batch("t", rb, partition=1).result(timeout=10)
        assert {b.partition for b in fixed.batches} == {1}
        assert fixed.record_count == 300
        by_column = producer.send_batch(
            "t", pa.table({"value": [b"a", b"b", b"c"], "partition": [2, 0, 2]})).result(timeout=10)
        assert sorted((b.partition, b.record_count) for b in by_column.batches) == [(0, 1), (2, 2)]
        with pytest.raises(UnknownTopicOrPartitionError):
            producer.send_batch("t", pa.table({"value": [b"a"], "partition": [3]}))


@pytest.mark.timeout(30)
def test_send_batch_pandas_and_typed() -> None:
    fake = FakeClient({"typed": (2, TYPED)})
    df = pd.DataFrame({"id": np.arange(100), "name": [f"n{i}" for i in range(100)],
                       "key": [f"k{i}" for i in range(100)]})
    with make_producer(fake) as producer:
        result = producer.send_batch("typed", df).result(timeout=10)
    assert result.record_count == 100
    rows = fake.records[TopicPartition("typed", 0)] + fake.records[TopicPartition("typed", 1)]
    assert sorted(r["value"]["id"] for r in rows) == list(range(100))
    assert all(r["value"]["name"] == f"n{r['value']['id']}" for r in rows)


@pytest.mark.timeout(30)
def test_send_batch_keeps_order_after_pending_send_records() -> None:
    fake = FakeClient({"t": (1, UNTYPED)})
    with make_producer(fake, linger_ms=60_000) as producer:
        first = producer.send("t", b"first")
        result = producer.send_batch("t", pa.table({"value": [b"second", b"third"]})).result(timeout=10)
        assert first.result(timeout=5).offset == 0
    assert result.batches[0].base_offset == 1
    assert values_of(fake, TopicPartition("t", 0)) == [b"first", b"second", b"third"]


@pytest.mark.timeout(30)
def test_send_batch_failure_surfaces_in_the_future() -> None:
    fake = FakeClient({"t": (1, UNTYPED)})
    fake.script.append(lambda tps: {tps[0]: SchemaMismatchError("nope")})
    with make_producer(fake) as producer:
        fut = producer.send_batch("t", pa.table({"value": [b"a"]}))
        with pytest.raises(SchemaMismatchError):
            fut.result(timeout=10)


@pytest.mark.timeout(30)
def test_flush_timeout_reports_pending_records_and_close_fails_them() -> None:
    fake = FakeClient({"t": (1, UNTYPED)})
    fake.hold = True
    producer = make_producer(fake, linger_ms=0)
    fut = producer.send("t", b"x")
    assert producer.flush(timeout=0.2) == 1
    producer.close(timeout=0.2)
    with pytest.raises(RequestTimedOutError):
        fut.result(timeout=5)
    fake.release()


@pytest.mark.timeout(30)
def test_concurrent_senders() -> None:
    fake = FakeClient({"t": (3, UNTYPED)})
    with make_producer(fake, linger_ms=2, batch_size=2_000) as producer:
        def work(n: int) -> list[concurrent.futures.Future]:
            return [producer.send("t", b"%d-%d" % (n, i), key=b"%d" % n) for i in range(300)]
        with concurrent.futures.ThreadPoolExecutor(4) as pool:
            results = list(pool.map(work, range(8)))
        producer.flush()
    for n, futures in enumerate(results):
        offsets = [f.result().offset for f in futures]
        assert offsets == sorted(offsets)  # one thread's records of a key stay in order
        assert {f.result().partition for f in futures} == {partition_for_key(b"%d" % n, 3)}


@pytest.mark.timeout(30)
def test_interrupted_with_block_does_not_wait_for_outstanding_records() -> None:
    fake = FakeClient({"t": (1, UNTYPED)})
    fake.hold = True
    start = time.monotonic()
    with pytest.raises(SystemExit), make_producer(fake, linger_ms=0, enable_idempotence=False) as producer:
        fut = producer.send("t", b"x")
        raise SystemExit(1)
    assert time.monotonic() - start < 5
    with pytest.raises(RequestTimedOutError):
        fut.result(timeout=5)
    fake.release()
