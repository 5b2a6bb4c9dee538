"""Client quotas (logstore/broker/security/quotas.py): throttled to the quota, others unaffected.

The rate model is checked against Kafka's arithmetic with an injected clock;
the enforcement against a real EmbeddedBroker: a greedy producer (client id
``greedy``, a low produce quota) lands near its quota while a second producer
(no quota) is never throttled; the answers carry ``logstore-throttle-ms``; a
request-rate quota and a fetch quota throttle too. Rates are asserted as
ratios to the quota (the machine is shared), measured after the first
window, whose burst the quota allows by design (as Kafka's).
"""

from __future__ import annotations

import threading
import time
from collections.abc import Iterator
from pathlib import Path

import grpc
import pytest

from logstore import Admin, Consumer, NewTopic, Producer, TopicPartition
from logstore._proto import logstore_pb2 as pb
from logstore._proto import logstore_pb2_grpc as pb_grpc
from logstore.broker.config import load_broker_config
from logstore.broker.embedded import EmbeddedBroker
from logstore.broker.security.quotas import MAX_ENTITIES, QuotaConfig, QuotaManager, SampledRate
from logstore.client.rpc import BrokerClient
from logstore.defaults import CLIENT_ID_METADATA_KEY, THROTTLE_METADATA_KEY
from logstore.errors import InvalidConfigError
from logstore.record import build_batch, encode_batch, encode_schema, untyped_schema
from logstore.wire import encode_produce_request

QUOTA = 500_000  # bytes/s of the greedy producer
REQUESTS = 20  # requests/s of the chatty client
WINDOW = {"quota_window_num": 11, "quota_window_size_ms": 50}  # rates over >= 0.5 s


# --------------------------------------------------------------------------- the model


class Clock:
    def __init__(self) -> None:
        self.now = 100.0

    def __call__(self) -> float:
        return self.now


def test_sampled_rate_is_kafkas_rate() -> None:
    """Total over the samples' span, never less than num-1 samples; old samples fall out."""
    r = SampledRate(11, 1.0)
    r.record(1000, 0.0)
    assert r.rate(0.5) == pytest.approx(1000 / 10)  # a first burst is spread over 10 s
    for t in range(1, 20):
        r.record(1000, float(t))
    assert r.rate(19.5) == pytest.approx(11_000 / 10.5)  # 11 samples, spanning 10.5 s
    assert r.rate(40.0) == 0.0  # idle: every sample expired


def test_throttle_time_brings_the_rate_back_to_the_quota() -> None:
    clock = Clock()
    seen: list[tuple[str, str, int]] = []
    q = QuotaManager(QuotaConfig(producer_byte_rate=1000, window_num=11, window_size_ms=1000), clock=clock,
                     on_throttle=lambda *a: seen.append(a))
    for _ in range(10):  # 1000 B/s for 10 s: at the quota, never above it
        assert q.record("producer_byte_rate", "User:ANONYMOUS", "c", 1000) == 0
        clock.now += 1
    ms = q.record("producer_byte_rate", "User:ANONYMOUS", "c", 5_000)
    # Kafka: (rate - quota) / quota * window = (15000 / 10 s - 1000) / 1000 * 10 s
    assert ms == 5_000
    assert seen == [("User:ANONYMOUS", "producer_byte_rate", 5_000)]
    clock.now += ms / 1000  # after the throttle time the rate is back at the quota
    assert q.record("producer_byte_rate", "User:ANONYMOUS", "c", 0) == 0
    assert q.record("producer_byte_rate", "User:ANONYMOUS", "c", 1) > 0  # ... and no more
    assert q.record("producer_byte_rate", "User:ANONYMOUS", "other", 10_000) == 0  # its own quota
    q.hold("User:ANONYMOUS", "c", 250)
    assert q.held_for_s("User:ANONYMOUS", "c") == pytest.approx(0.25)
    assert q.held_for_s("User:ANONYMOUS", "other") == 0


def test_overrides_resolve_most_specific_first_and_are_shared() -> None:
    table = {"User:alice": {"producer_byte_rate": 100, "request_rate": 5},
             "client-id:etl": {"producer_byte_rate": 50},
             "User:alice,client-id:etl": {"request_rate": 1}}
    config = load_broker_config(overrides={"quotas": table, "quota_producer_byte_rate": 7}, env={})
    qc = config.quota_config()
    assert qc.resolve("producer_byte_rate", "User:alice", "etl") == (("User:alice", ""), 100)
    assert qc.resolve("request_rate", "User:alice", "etl") == (("User:alice", "etl"), 1)
    assert qc.resolve("producer_byte_rate", "User:bob", "etl") == (("", "etl"), 50)
    assert qc.resolve("producer_byte_rate", "User:bob", "x") == (("User:bob", "x"), 7)
    assert qc.resolve("consumer_byte_rate", "User:alice", "etl") == (("User:alice", "etl"), 0)
    # alice's clients share her rate: what one sent counts for the other
    clock = Clock()
    q = QuotaManager(qc, clock=clock)
    assert q.record("producer_byte_rate", "User:alice", "a", 1000) == 0
    assert q.record("producer_byte_rate", "User:alice", "b", 1000) > 0
    assert not QuotaConfig().enabled and QuotaConfig(request_rate=1).enabled


def test_the_shipped_broker_toml_documents_the_quotas() -> None:
    path = Path(__file__).resolve().parents[2] / "conf" / "broker.toml"
    config = load_broker_config(str(path), env={})
    assert config.quotas == () and not config.quota_config().enabled  # no limits by default
    text = path.read_text()
    for key in ("quota_producer_byte_rate", "quota_consumer_byte_rate", "quota_request_rate", "quota_window_num",
                "quota_window_size_ms", "quota_max_throttle_ms", "[quotas]"):
        assert key in text, key


@pytest.mark.parametrize("table, message", [
    ({"alice": {"request_rate": 1}}, "must be"),
    ({"User:alice": {"bytes": 1}}, "unknown quota"),
    ({"client-id:x": {"request_rate": -1}}, ">= 0"),
    ({"client-id:x": 5}, "table of rates"),
])
def test_bad_quota_config_is_refused(table: dict[str, object], message: str) -> None:
    with pytest.raises(InvalidConfigError, match=message):
        load_broker_config(overrides={"quotas": table}, env={})


def test_a_flood_of_client_ids_keeps_state_bounded() -> None:
    clock = Clock()
    q = QuotaManager(QuotaConfig(request_rate=1_000_000, window_num=2, window_size_ms=100), clock=clock)
    for i in range(MAX_ENTITIES + 500):
        q.record("request_rate", "User:ANONYMOUS", f"id-{i}", 1)
        q.hold("User:ANONYMOUS", f"id-{i}", 1)
    assert q.entity_count() <= 2 * MAX_ENTITIES + 2
    clock.now += 10
    q.record("request_rate", "User:ANONYMOUS", "late", 1)  # the sweep drops the idle ones
    assert q.entity_count() <= 2


# --------------------------------------------------------------------------- a real broker


@pytest.fixture(scope="module")
def broker() -> Iterator[EmbeddedBroker]:
    quotas = {"client-id:greedy": {"producer_byte_rate": QUOTA},
              "client-id:chatty": {"request_rate": REQUESTS},
              "client-id:reader": {"consumer_byte_rate": QUOTA},
              "client-id:zero": {"producer_byte_rate": 0}}
    with EmbeddedBroker(overrides={**WINDOW, "quotas": quotas}) as b:
        with Admin(b.bootstrap) as admin:
            admin.create_topics([NewTopic("greedy", 1), NewTopic("free", 1), NewTopic("read", 1)])
        yield b


class Meter:
    """A producer sending 8 KB records as fast as its buffer lets it; acked bytes by time."""

    def __init__(self, bootstrap: str, topic: str, client_id: str) -> None:
        self.producer = Producer(bootstrap, client_id=client_id, acks=1, linger_ms=2, batch_size=32 << 10,
                                 buffer_memory=256 << 10, max_block_ms=30_000)
        self.topic = topic
        self.acked: list[tuple[float, int]] = []
        self.stop = threading.Event()
        self.thread = threading.Thread(target=self._run, daemon=True)

    def _run(self) -> None:
        value = b"x" * 8192
        lock = threading.Lock()

        def acked(err: object, _md: object) -> None:
            if err is None:
                with lock:
                    self.acked.append((time.monotonic(), len(value)))
        while not self.stop.is_set():
            self.producer.send(self.topic, value, on_delivery=acked)
        self.producer.flush(30)

    def rate(self, start: float, end: float) -> float:
        return sum(n for t, n in self.acked if start <= t < end) / (end - start)

    def close(self) -> None:
        self.stop.set()
        self.thread.join(60)
        self.producer.close(30)


@pytest.mark.timeout(120)
def test_a_greedy_producer_is_throttled_to_its_quota_while_another_keeps_its_rate(broker: EmbeddedBroker) -> None:
    free = Meter(broker.bootstrap, "free", "free")
    free.thread.start()
    t0 = time.monotonic()
    time.sleep(1.5)
    solo = free.rate(t0 + 0.5, t0 + 1.5)  # the free producer alone, after its start
    greedy = Meter(broker.bootstrap, "greedy", "greedy")
    greedy.thread.start()
    t1 = time.monotonic()
    time.sleep(5.0)
    try:
        greedy_rate = greedy.rate(t1 + 1.0, t1 + 5.0)  # after the first window's allowed burst
        free_rate = free.rate(t1 + 1.0, t1 + 5.0)
        greedy_throttled, greedy_ms = greedy.producer._client.throttle_stats()
        free_throttled = free.producer._client.throttle_stats()
    finally:
        greedy.close()
        free.close()
    print(f"quota {QUOTA} B/s: greedy {greedy_rate:.0f} B/s ({greedy_rate / QUOTA:.2f}x quota, "
          f"{greedy_throttled} throttled answers, {greedy_ms} ms); free alone {solo:.0f} B/s, "
          f"beside greedy {free_rate:.0f} B/s ({free_rate / solo:.2f}x)")
    assert 0.7 <= greedy_rate / QUOTA <= 1.3
    assert greedy_throttled > 0 and greedy_ms > 0  # the answers carried the throttle time
    assert free_throttled == (0, 0)  # no quota: never throttled
    assert free_rate >= 5 * QUOTA  # far above the greedy one's quota ...
    assert free_rate >= 0.4 * solo  # ... and most of what it did alone (a loaded 2-core machine)


def _records(n: int, size: int) -> bytes:
    schema = untyped_schema()
    batch = build_batch(schema, values=[b"y" * size] * n, timestamps_ms=[1] * n, keys=[None] * n)
    return encode_schema(schema) + encode_batch(batch, base_offset=0).to_bytes()


@pytest.mark.timeout(60)
def test_answers_carry_the_throttle_time_and_the_next_request_waits(broker: EmbeddedBroker) -> None:
    """Raw gRPC (a client that ignores the throttle): the answer says how long, the broker holds the
    next request that long; a client id with a quota of 0 is never throttled."""
    channel = grpc.insecure_channel(broker.bootstrap)
    produce = channel.unary_unary("/logstore.v1.Logstore/Produce", request_serializer=None,
                                  response_deserializer=pb.ProduceResponse.FromString)
    request = encode_produce_request([(TopicPartition("greedy", 0), _records(6, 100_000))], acks=1, timeout_ms=5000)
    assert len(request) > QUOTA  # more than a window's quota in one request: over it at once

    def send(client_id: str) -> tuple[float, int]:
        started = time.monotonic()
        response, call = produce.with_call(request, timeout=30, metadata=((CLIENT_ID_METADATA_KEY, client_id),))
        assert not response.partitions[0].error.code
        ms = dict(call.trailing_metadata()).get(THROTTLE_METADATA_KEY)
        return time.monotonic() - started, int(ms or 0)
    try:
        for _ in range(3):
            assert send("zero") == (pytest.approx(0, abs=5), 0)
        _, first_ms = send("raw-greedy-x")  # default quota 0: nothing
        assert first_ms == 0
        _, throttle_ms = send("greedy")
        assert throttle_ms > 500
        waited, _ = send("greedy")  # held by the broker for the throttle time
        assert waited >= 0.8 * throttle_ms / 1000
    finally:
        channel.close()


@pytest.mark.timeout(60)
def test_a_request_rate_quota_throttles_a_chatty_client(broker: EmbeddedBroker) -> None:
    with BrokerClient(broker.bootstrap, client_id="chatty") as chatty:
        chatty.metadata(["free"])
        count, started = 0, time.monotonic()
        stamps = []
        while time.monotonic() - started < 3.5:
            chatty.metadata(["free"])
            stamps.append(time.monotonic())
            count += 1
        window = [t for t in stamps if t >= started + 1.5]
        rate = len(window) / (stamps[-1] - (started + 1.5))
        print(f"request quota {REQUESTS}/s: {rate:.1f}/s measured")
        assert 0.7 <= rate / REQUESTS <= 1.3
        assert chatty.throttle_stats()[0] > 0


@pytest.mark.timeout(60)
def test_a_fetch_quota_throttles_a_reader(broker: EmbeddedBroker) -> None:
    with BrokerClient(broker.bootstrap, client_id="writer") as writer:
        writer.produce([(TopicPartition("read", 0), _records(8, 100_000))], acks=1)
    stub = pb_grpc.LogstoreStub(grpc.insecure_channel(broker.bootstrap))
    request = pb.FetchRequest(partitions=[pb.FetchPartition(topic="read", partition=0, fetch_offset=0)],
                              max_bytes=8 << 20)
    fetch = stub.Fetch.with_call  # the typed stub: its answer parses as a FetchResponse
    _, call = fetch(request, timeout=30, metadata=((CLIENT_ID_METADATA_KEY, "reader"),))
    assert int(dict(call.trailing_metadata())[THROTTLE_METADATA_KEY]) > 500  # 800 KB at 500 KB/s
    _, call = fetch(request, timeout=30, metadata=((CLIENT_ID_METADATA_KEY, "other-reader"),))
    assert THROTTLE_METADATA_KEY not in dict(call.trailing_metadata())
    # A Consumer sends its client_id and reads the throttle time too.
    with Consumer(broker.bootstrap, client_id="reader", auto_offset_reset="earliest") as consumer:
        consumer.assign([TopicPartition("read", 0)])
        got = 0
        deadline = time.monotonic() + 20
        while got < 8 and time.monotonic() < deadline:
            got += len(consumer.poll(timeout_ms=500))
        assert got == 8
        assert consumer._client.throttle_stats()[0] > 0
