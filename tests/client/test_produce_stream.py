"""Produce over one long-lived stream per connection (issue 24): order, exactly once, fallback.

The producer writes its requests into a ``ProduceStream`` call and the broker answers each
by correlation id (``logstore.client.produce_stream``, ``logstore.broker.request_streams``).
A gRPC client interceptor (:class:`BreakStreams`) sits between the producer's stream and a
real :class:`EmbeddedBroker` and breaks streams mid-flight: after a stream's k-th answer,
the next answer is dropped and the stream fails with UNAVAILABLE, as a connection reset
would. The answer dropped belongs to a request the broker appended (a *lost answer*); the
requests behind it may or may not have reached the broker (*lost requests*, answered
OUT_OF_ORDER_SEQUENCE_NUMBER when a later one arrives first). The idempotent producer must
end with every partition holding exactly the records sent to it, once each, in send order,
at the offsets the futures reported. Also: a broker restarted in the middle of a stream,
and a broker that serves no stream (quotas on), which gets unary calls.
"""

from __future__ import annotations

import threading
import time
from collections import Counter, defaultdict
from collections.abc import Callable, Iterator
from typing import Any

import grpc
import pytest
from grpc_fakes import UnavailableCall

from logstore import Admin, BrokerClient, NewTopic, Producer, TopicPartition
from logstore.broker.embedded import EmbeddedBroker
from logstore.client.fetcher import fetch_range
from logstore.client.produce_stream import PRODUCE_STREAM_METHOD, ProduceStream
from logstore.errors import LogstoreError

pytestmark = pytest.mark.timeout(120)

PRODUCE = "/logstore.v1.Logstore/Produce"


# --------------------------------------------------------------------------- fault injection


class InjectedReset(UnavailableCall):
    """What a stream whose connection was reset raises from its answers."""

    def __init__(self) -> None:
        super().__init__("injected: the connection was reset with requests in flight")


class _Breaking:
    """A stream call's answers, until the one after the ``keep``-th: it is dropped, the real call
    is cancelled and :class:`InjectedReset` is raised."""

    def __init__(self, call: Any, keep: int, faults: BreakStreams) -> None:
        self._call = call
        self._keep = keep
        self._faults = faults
        self._seen = 0

    def __iter__(self) -> _Breaking:
        return self

    def __next__(self) -> Any:
        answer = next(self._call)
        if self._seen < self._keep:
            self._seen += 1
            return answer
        self._call.cancel()
        with self._faults.lock:
            self._faults.breaks += 1
        raise InjectedReset()

    def cancel(self) -> bool:
        return bool(self._call.cancel())


class BreakStreams(grpc.StreamStreamClientInterceptor, grpc.UnaryUnaryClientInterceptor):
    """Breaks produce stream number n (from 1) after ``plan(n)`` answers (None: never); counts
    the streams opened, the breaks, and unary Produce calls."""

    def __init__(self, plan: Callable[[int], int | None]) -> None:
        self.plan = plan
        self.lock = threading.Lock()
        self.streams = 0
        self.breaks = 0
        self.unary_produces = 0

    def install(self, producer: Producer) -> None:
        """Put this interceptor on the channel the producer's streams are opened on."""
        conn = producer._client.transport.router.home  # a single broker: every produce goes home
        conn.channel = grpc.intercept_channel(conn.channel, self)
        conn.produce_raw = conn.channel.unary_unary(PRODUCE, request_serializer=None,
                                                    response_deserializer=lambda b: _produce_response(b))

    def intercept_stream_stream(self, continuation: Any, details: Any, request_iterator: Any) -> Any:
        call = continuation(details, request_iterator)
        if details.method != PRODUCE_STREAM_METHOD:
            return call
        with self.lock:
            self.streams += 1
            keep = self.plan(self.streams)
        return call if keep is None else _Breaking(call, keep, self)

    def intercept_unary_unary(self, continuation: Any, details: Any, request: Any) -> Any:
        if details.method == PRODUCE:
            with self.lock:
                self.unary_produces += 1
        return continuation(details, request)


def _produce_response(data: bytes) -> Any:
    from logstore._proto import logstore_pb2 as pb

    return pb.ProduceResponse.FromString(data)


# --------------------------------------------------------------------------- helpers


@pytest.fixture
def broker(tmp_path: Any) -> Iterator[EmbeddedBroker]:
    with EmbeddedBroker(str(tmp_path)) as b:
        yield b


def new_topic(bootstrap: str, name: str, partitions: int) -> str:
    with Admin(bootstrap) as admin:
        admin.create_topics([NewTopic(name, partitions)])
    return name


def send_paced(producer: Producer, topic: str, count: int, *, keyed: bool,
               pause_every: int = 10, pause_s: float = 0.002) -> list[tuple[bytes, Any]]:
    """``count`` unique values, a few at a time with a pause, so that requests pipeline."""
    sent = []
    for i in range(count):
        key = b"k%d" % (i % 7) if keyed else None
        value = b"%s-%06d" % (key or b"-", i)
        sent.append((value, producer.send(topic, value, key=key)))
        if i % pause_every == pause_every - 1:
            time.sleep(pause_s)
    return sent


def check_exactly_once_in_order(bootstrap: str, topic: str, partitions: int,
                                sent: list[tuple[bytes, Any]]) -> None:
    """Each partition holds exactly what was sent to it, once each, in send order, at the
    offsets the futures reported."""
    expected: dict[int, list[bytes]] = defaultdict(list)
    reported: dict[bytes, tuple[int, int]] = {}
    for value, future in sent:
        md = future.result(timeout=60)
        expected[md.partition].append(value)
        reported[value] = (md.partition, md.offset)
    with BrokerClient(bootstrap) as client:
        tps = [TopicPartition(topic, p) for p in range(partitions)]
        ends = client.list_offsets(dict.fromkeys(tps, -1))
        for tp in tps:
            end = ends[tp]
            assert not isinstance(end, LogstoreError), end
            assert end.offset is not None
            log: list[tuple[int, bytes]] = []
            for batch in fetch_range(client, tp, 0, end.offset, isolation_level="read_uncommitted"):
                log += zip(batch.column("offset").to_pylist(), batch.column("value").to_pylist(), strict=True)
            values = [v for _, v in log]
            dups = [v for v, n in Counter(values).items() if n > 1]
            assert not dups, f"partition {tp.partition}: {len(dups)} values appended twice, e.g. {dups[:3]}"
            assert values == expected[tp.partition], f"partition {tp.partition}: the log's order differs"
            for offset, value in log:
                assert reported[value] == (tp.partition, offset), (value, reported[value], offset)


# --------------------------------------------------------------------------- tests


def test_the_producer_sends_over_one_stream_and_no_unary_call(broker: EmbeddedBroker) -> None:
    topic = new_topic(broker.bootstrap, "one-stream", 3)
    faults = BreakStreams(lambda n: None)
    producer = Producer(broker.bootstrap, linger_ms=1, batch_size=600, acks=1)
    faults.install(producer)
    with producer:
        sent = send_paced(producer, topic, 1500, keyed=True)
        assert producer.flush(timeout=60) == 0
        assert producer._client.transport.produce_streams_opened == 1
    assert faults.streams == 1 and faults.unary_produces == 0, (faults.streams, faults.unary_produces)
    check_exactly_once_in_order(broker.bootstrap, topic, 3, sent)


@pytest.mark.parametrize(("partitions", "keyed", "acks"), [(1, False, 1), (4, True, "all")],
                         ids=["1-partition-acks1", "4-keyed-acks-all"])
def test_streams_broken_mid_flight_neither_duplicate_reorder_nor_lose(
    broker: EmbeddedBroker, partitions: int, keyed: bool, acks: int | str,
) -> None:
    topic = new_topic(broker.bootstrap, "broken-streams", partitions)
    # Streams 1..6 break after 1, 2, ..., 6 answers (the next answer is lost); later ones live.
    faults = BreakStreams(lambda n: n if n <= 6 else None)
    producer = Producer(broker.bootstrap, linger_ms=1, batch_size=400, retry_backoff_ms=5,
                        retry_backoff_max_ms=20, acks=acks)
    faults.install(producer)
    with producer:
        sent = send_paced(producer, topic, 3000, keyed=keyed)
        assert producer.flush(timeout=60) == 0
    assert faults.breaks == 6, f"only {faults.breaks} streams were broken"
    assert faults.streams > faults.breaks and faults.unary_produces == 0
    check_exactly_once_in_order(broker.bootstrap, topic, partitions, sent)


@pytest.mark.timeout(180)
def test_a_producer_rides_over_a_broker_restart_in_the_middle_of_a_stream(tmp_path: Any) -> None:
    with EmbeddedBroker(str(tmp_path), subprocess=True) as broker:
        topic = new_topic(broker.bootstrap, "restart-mid-stream", 3)
        producer = Producer(broker.bootstrap, linger_ms=0, acks="all", retry_backoff_ms=50,
                            retry_backoff_max_ms=200, delivery_timeout_ms=120_000)
        sent: list[tuple[bytes, Any]] = []
        sending = threading.Event()
        stop = threading.Event()

        def send() -> None:
            i = 0
            while not stop.is_set():
                value = b"v-%06d" % i
                sent.append((value, producer.send(topic, value, key=b"k%d" % (i % 5))))
                i += 1
                if i == 300:
                    sending.set()
                time.sleep(0.001)

        with producer:
            sender = threading.Thread(target=send, daemon=True)
            sender.start()
            assert sending.wait(30)
            streams_before = producer._client.transport.produce_streams_opened
            broker.restart()  # same port, same data directory
            time.sleep(0.5)  # records keep coming after the restart
            stop.set()
            sender.join(30)
            assert producer.flush(timeout=90) == 0
            assert streams_before == 1
            assert producer._client.transport.produce_streams_opened >= 2, "no new stream after the restart"
        assert len(sent) > 300
        check_exactly_once_in_order(broker.bootstrap, topic, 3, sent)


def test_a_broker_without_the_stream_gets_unary_calls(tmp_path: Any) -> None:
    # A broker with client quotas serves no ProduceStream (its throttling is per call): the
    # stream's first request is answered UNIMPLEMENTED and resent as a unary call.
    quotas = {"client-id:someone-else": {"producer_byte_rate": 1 << 30}}
    with EmbeddedBroker(str(tmp_path), overrides={"quotas": quotas}) as broker:
        topic = new_topic(broker.bootstrap, "unary-fallback", 2)
        faults = BreakStreams(lambda n: None)
        producer = Producer(broker.bootstrap, linger_ms=1, batch_size=600, acks=1)
        faults.install(producer)
        with producer:
            sent = send_paced(producer, topic, 500, keyed=True)
            assert producer.flush(timeout=60) == 0
            streams = list(producer._client.transport._streams.values())
        assert faults.streams == 1, "the producer kept opening streams the broker refuses"
        assert faults.unary_produces >= 5
        assert streams == [False]
        check_exactly_once_in_order(broker.bootstrap, topic, 2, sent)


def test_a_stream_request_gets_the_unary_error_of_its_request(broker: EmbeddedBroker) -> None:
    """A request that fails as a whole (here: acks=5) is answered on the stream with the error
    a unary call ends with; the stream goes on."""
    topic = new_topic(broker.bootstrap, "stream-errors", 1)
    tp = TopicPartition(topic, 0)
    with BrokerClient(broker.bootstrap) as client:
        records = _one_record_stream()
        unary_error = _unary_produce_error(client, tp, records)
        stream_futures = [client.produce_async([(tp, records)], acks=5) for _ in range(3)]
        stream_errors = [f.exception(timeout=30) for f in stream_futures]
        assert unary_error.code == "INVALID_REQUEST"
        assert all(type(e) is type(unary_error) and (e.code, e.message) == (unary_error.code, unary_error.message)
                   for e in stream_errors), (unary_error, stream_errors)
        ok = client.produce_async([(tp, records)], acks=1).result(timeout=30)
        assert ok[0].error is None  # the same stream still serves
        assert [s for s in client.transport._streams.values() if isinstance(s, ProduceStream)]
        assert client.transport.produce_streams_opened == 1


def _one_record_stream() -> bytes:
    from logstore.record import build_batch, encode_batch, encode_schema, untyped_schema

    schema = untyped_schema()
    batch = build_batch(schema, values=[b"v"], timestamps_ms=[1])
    return encode_schema(schema) + encode_batch(batch, base_offset=0).to_bytes()


def _unary_produce_error(client: BrokerClient, tp: TopicPartition, records: bytes) -> LogstoreError:
    client.transport.use_produce_streams = False
    try:
        error = client.produce_async([(tp, records)], acks=5).exception(timeout=30)
    finally:
        client.transport.use_produce_streams = True
    assert isinstance(error, LogstoreError), error
    return error


def test_a_stopping_broker_ends_its_streams_instead_of_waiting_out_its_grace(tmp_path: Any) -> None:
    """A stream never ends by itself: the broker ends it (status OK, after answering what it
    read) before it stops its listener; the client's next request opens a new stream."""
    broker = EmbeddedBroker(str(tmp_path)).start()
    try:
        topic = new_topic(broker.bootstrap, "stop-ends-streams", 1)
        with BrokerClient(broker.bootstrap) as client:
            tp = TopicPartition(topic, 0)
            assert client.produce([(tp, _one_record_stream())], acks=1)[0].error is None
            (stream,) = [s for s in client.transport._streams.values() if isinstance(s, ProduceStream)]
            broker.stop()
            deadline = time.monotonic() + 10
            while not stream.broken and time.monotonic() < deadline:
                time.sleep(0.01)
            # Ended by the broker (a clean end of the answers), not cancelled by the listener's stop.
            assert stream.broken and "ended the produce stream" in str(stream._ended), stream._ended
            broker.start()
            assert client.produce([(tp, _one_record_stream())], acks=1)[0].error is None
            assert client.transport.produce_streams_opened == 2
    finally:
        broker.close()
