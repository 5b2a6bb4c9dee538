"""Pipelined idempotent produce keeps order and appends every sequence once (issue 16).

The producer keeps up to ``max_in_flight_requests_per_connection`` produce
requests in flight, several of them for the same partition. A gRPC client
interceptor (:class:`Faults`) sits between the producer and a real
:class:`EmbeddedBroker`: it lets some requests reach the broker and then
replaces their answer with UNAVAILABLE (*lost answers*: the broker appended,
the producer retries and must be answered with the original offsets), and
fails other requests before they leave (*lost requests*: the broker then
refuses the requests behind them with OUT_OF_ORDER_SEQUENCE_NUMBER, and the
producer must resend everything in order). Every test reads the log back:
each partition holds exactly the records sent to it, once each, in send order,
at the offsets the futures reported.

The broker's side (``logstore.storage.producer_state``) is also checked alone:
only the next sequence is accepted, a duplicate of any of the producer's last
5 batches is answered with its original offsets, anything else is a gap.
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
from logstore._proto import logstore_pb2 as pb
from logstore.broker.embedded import EmbeddedBroker
from logstore.client.fetcher import fetch_range
from logstore.errors import LogstoreError, OutOfOrderSequenceError
from logstore.record import BatchHeader, build_batch, encode_batch, encode_schema, untyped_schema
from logstore.storage.producer_state import DEDUP_WINDOW, ProducerStateManager

PRODUCE = "/logstore.v1.Logstore/Produce"


# --------------------------------------------------------------------------- fault injection


class InjectedFailure(UnavailableCall, grpc.Future):  # type: ignore[misc]
    """A produce call that ends with UNAVAILABLE when :meth:`fail` is called."""

    def __init__(self, details: str) -> None:
        super().__init__(details)
        self._done = threading.Event()
        self._lock = threading.Lock()
        self._callbacks: list[Callable[[Any], None]] | None = []

    def fail(self) -> None:
        with self._lock:
            callbacks, self._callbacks = self._callbacks or [], None
            self._done.set()
        for cb in callbacks:
            cb(self)

    # grpc.Future (grpc.Call is UnavailableCall's)
    def cancelled(self) -> bool:
        return False

    def running(self) -> bool:
        return not self._done.is_set()

    def done(self) -> bool:
        return self._done.is_set()

    def result(self, timeout: float | None = None) -> Any:
        self._done.wait(timeout)
        raise self

    def exception(self, timeout: float | None = None) -> Any:
        self._done.wait(timeout)
        return self

    def traceback(self, timeout: float | None = None) -> Any:
        return None

    def add_done_callback(self, fn: Callable[[Any], None]) -> None:
        with self._lock:
            if self._callbacks is not None:
                self._callbacks.append(fn)
                return
        fn(self)


class Faults(grpc.UnaryUnaryClientInterceptor):
    """Decides per produce call (numbered from 1): ``"pass"``, ``"lose_answer"`` or ``"lose_request"``.

    Counts the calls in flight (the most at once), the injected faults and the
    OUT_OF_ORDER_SEQUENCE_NUMBER answers the broker gave.
    """

    def __init__(self, plan: Callable[[int], str]) -> None:
        self.plan = plan
        self.lock = threading.Lock()
        self.calls = 0
        self.in_flight = 0
        self.max_in_flight = 0
        self.injected: Counter[str] = Counter()
        self.out_of_order = 0

    def install(self, producer: Producer) -> None:
        """Route the producer's produce calls through this interceptor (same channel)."""
        # Unary Produce calls (the produce stream has its own tests: tests/client/test_produce_stream.py).
        producer._client.transport.use_produce_streams = False
        conn = producer._client.transport.router.home  # a single broker: every produce goes home
        channel = grpc.intercept_channel(conn.channel, self)
        conn.produce_raw = channel.unary_unary(
            PRODUCE, request_serializer=None, response_deserializer=pb.ProduceResponse.FromString
        )

    def _answered(self, call: Any) -> None:
        with self.lock:
            self.in_flight -= 1
            try:
                response = call.result()
            except Exception:  # noqa: BLE001 - a real failure: nothing to count
                return
            self.out_of_order += sum(
                1 for p in response.partitions if p.error.code == OutOfOrderSequenceError.code
            )

    def intercept_unary_unary(self, continuation: Any, details: Any, request: Any) -> Any:
        if details.method != PRODUCE:
            return continuation(details, request)
        with self.lock:
            self.calls += 1
            decision = self.plan(self.calls)
            self.injected[decision] += 1
        if decision == "lose_request":
            # Never sent; reported a little later, so that requests behind it are in flight.
            failure = InjectedFailure("injected: failed to connect to all addresses")
            threading.Timer(0.05, failure.fail).start()
            return failure
        with self.lock:
            self.in_flight += 1
            self.max_in_flight = max(self.max_in_flight, self.in_flight)
        real = continuation(details, request)
        real.add_done_callback(self._answered)
        if decision == "pass":
            return real
        lost = InjectedFailure("injected: the connection was reset after the request was sent")
        real.add_done_callback(lambda _: lost.fail())
        return lost


# --------------------------------------------------------------------------- helpers


@pytest.fixture
def broker(tmp_path: Any) -> Iterator[EmbeddedBroker]:
    with EmbeddedBroker(str(tmp_path)) as b:
        yield b


def log_values(bootstrap: str, topic: str, partitions: int) -> dict[int, list[tuple[int, bytes]]]:
    """(offset, value) of every record of ``topic``, per partition, read back from the broker."""
    out: dict[int, list[tuple[int, bytes]]] = {}
    with BrokerClient(bootstrap) as client:
        tps = [TopicPartition(topic, p) for p in range(partitions)]
        ends = client.list_offsets(dict.fromkeys(tps, -1))
        for tp in tps:
            end = ends[tp]
            assert not isinstance(end, LogstoreError), end
            assert end.offset is not None
            records: list[tuple[int, bytes]] = []
            for batch in fetch_range(client, tp, 0, end.offset, isolation_level="read_uncommitted"):
                records += zip(batch.column("offset").to_pylist(), batch.column("value").to_pylist(),
                               strict=True)
            out[tp.partition] = records
    return out


def send_paced(producer: Producer, topic: str, count: int, *, keyed: bool) -> list[tuple[bytes, Any]]:
    """``count`` unique values, 10 at a time with a pause, so that batches seal while others fly."""
    sent = []
    for i in range(count):
        key = b"k%d" % (i % 7) if keyed else None
        value = b"%s-%06d" % (key or b"-", i)
        sent.append((value, producer.send(topic, value, key=key)))
        if i % 10 == 9:
            time.sleep(0.002)
    return sent


def check_exactly_once_in_order(bootstrap: str, topic: str, partitions: int,
                                sent: list[tuple[bytes, Any]]) -> None:
    expected: dict[int, list[bytes]] = defaultdict(list)
    reported: dict[bytes, tuple[int, int]] = {}
    for value, future in sent:
        md = future.result(timeout=60)
        expected[md.partition].append(value)
        reported[value] = (md.partition, md.offset)
    log = log_values(bootstrap, topic, partitions)
    for p in range(partitions):
        values = [v for _, v in log[p]]
        dups = [v for v, n in Counter(values).items() if n > 1]
        assert not dups, f"partition {p}: {len(dups)} values appended twice, e.g. {dups[:3]}"
        assert values == expected[p], f"partition {p}: the log's order differs from the send order"
        for offset, value in log[p]:
            assert reported[value] == (p, offset), (value, reported[value], (p, offset))


def new_topic(bootstrap: str, name: str, partitions: int) -> str:
    with Admin(bootstrap) as admin:
        admin.create_topics([NewTopic(name, partitions)])
    return name


# --------------------------------------------------------------------------- through the broker


@pytest.mark.timeout(120)
@pytest.mark.parametrize(("partitions", "keyed"), [(1, False), (3, True)], ids=["1-partition", "3-keyed"])
def test_lost_answers_under_pipelining_neither_duplicate_nor_reorder(
    broker: EmbeddedBroker, partitions: int, keyed: bool
) -> None:
    topic = new_topic(broker.bootstrap, "lost-answers", partitions)
    faults = Faults(lambda n: "lose_answer" if n % 3 == 0 and n <= 60 else "pass")
    producer = Producer(broker.bootstrap, linger_ms=1, batch_size=600, retry_backoff_ms=5,
                        retry_backoff_max_ms=20, acks=1)
    faults.install(producer)
    with producer:
        sent = send_paced(producer, topic, 2000, keyed=keyed)
        assert producer.flush(timeout=60) == 0
    assert faults.injected["lose_answer"] >= 10, faults.injected
    assert faults.max_in_flight >= 2, "no two produce requests were ever in flight: nothing was pipelined"
    check_exactly_once_in_order(broker.bootstrap, topic, partitions, sent)


@pytest.mark.timeout(120)
def test_a_lost_request_is_resent_before_the_requests_behind_it(broker: EmbeddedBroker) -> None:
    topic = new_topic(broker.bootstrap, "lost-requests", 1)
    faults = Faults(lambda n: "lose_request" if n % 7 == 3 and n <= 60 else "pass")
    producer = Producer(broker.bootstrap, linger_ms=1, batch_size=600, retry_backoff_ms=5,
                        retry_backoff_max_ms=20, acks=1)
    faults.install(producer)
    with producer:
        sent = send_paced(producer, topic, 2000, keyed=False)
        assert producer.flush(timeout=60) == 0
    assert faults.injected["lose_request"] >= 5, faults.injected
    # Requests behind a lost one reached the broker first and were refused as a gap.
    assert faults.out_of_order >= 1, "the broker never saw a batch pipelined behind a lost one"
    check_exactly_once_in_order(broker.bootstrap, topic, 1, sent)


@pytest.mark.timeout(120)
def test_lost_answers_and_lost_requests_mixed_with_all_partitions(broker: EmbeddedBroker) -> None:
    topic = new_topic(broker.bootstrap, "mixed", 4)
    plan = {1: "pass", 2: "lose_answer", 3: "lose_request"}
    faults = Faults(lambda n: plan[1 + (n * 7919) % 3] if n <= 80 else "pass")
    producer = Producer(broker.bootstrap, linger_ms=1, batch_size=400, retry_backoff_ms=5,
                        retry_backoff_max_ms=20, acks="all")
    faults.install(producer)
    with producer:
        sent = send_paced(producer, topic, 3000, keyed=True)
        assert producer.flush(timeout=60) == 0
    assert faults.injected["lose_answer"] >= 10 and faults.injected["lose_request"] >= 10, faults.injected
    check_exactly_once_in_order(broker.bootstrap, topic, 4, sent)


@pytest.mark.timeout(60)
def test_one_request_in_flight_when_asked(broker: EmbeddedBroker) -> None:
    topic = new_topic(broker.bootstrap, "one-in-flight", 1)
    faults = Faults(lambda n: "pass")
    producer = Producer(broker.bootstrap, linger_ms=1, batch_size=600, acks=1,
                        max_in_flight_requests_per_connection=1)
    faults.install(producer)
    with producer:
        sent = send_paced(producer, topic, 1000, keyed=False)
        assert producer.flush(timeout=60) == 0
    assert faults.calls >= 5
    assert faults.max_in_flight == 1
    check_exactly_once_in_order(broker.bootstrap, topic, 1, sent)


def test_more_than_five_in_flight_with_idempotence_is_refused() -> None:
    with pytest.raises(ValueError, match="at most 5 with idempotence"):
        Producer("127.0.0.1:1", max_in_flight_requests_per_connection=6)


# --------------------------------------------------------------------------- the broker's rules alone


def header(seq: int, count: int, *, pid: int = 9, epoch: int = 0, base: int = 0) -> BatchHeader:
    return BatchHeader(base_offset=base, last_offset_delta=count - 1, record_count=count, max_timestamp=0,
                       producer_id=pid, producer_epoch=epoch, base_sequence=seq)


def test_broker_answers_a_duplicate_of_any_of_the_last_five_batches(tmp_path: Any) -> None:
    state = ProducerStateManager(str(tmp_path))
    offset = 0
    for b in range(8):  # batches of 3 records: sequences 3b..3b+2 at offsets 3b..3b+2 (+100)
        h = header(3 * b, 3, base=100 + offset)
        assert state.check(h, 3) is None  # the next sequence: accepted
        state.apply(h)
        offset += 3
    assert DEDUP_WINDOW == 5
    for b in range(3, 8):  # each of the last 5: a duplicate with its original offsets
        dup = state.check(header(3 * b, 3), 3)
        assert dup is not None and (dup.base_offset, dup.last_offset) == (100 + 3 * b, 100 + 3 * b + 2)
    with pytest.raises(OutOfOrderSequenceError):
        state.check(header(3 * 2, 3), 3)  # older than the window: not recognised
    with pytest.raises(OutOfOrderSequenceError, match="expected sequence 24, got 27"):
        state.check(header(27, 3), 3)  # a gap
    with pytest.raises(OutOfOrderSequenceError):
        state.check(header(21, 2), 2)  # overlaps the last batch without being it
    assert state.check(header(24, 1), 1) is None  # still only the next sequence


def test_broker_refuses_a_first_batch_that_does_not_start_at_zero(tmp_path: Any) -> None:
    state = ProducerStateManager(str(tmp_path))
    with pytest.raises(OutOfOrderSequenceError):
        state.check(header(5, 1), 1)
    assert state.check(header(0, 1), 1) is None


def test_pipelined_requests_are_appended_in_the_order_they_arrived(broker: EmbeddedBroker) -> None:
    """A large request followed at once by small ones for the same partition: validating the
    large one takes longest, yet every request is appended in arrival order (logstore.broker.data_plane.appends),
    so none is refused as out of order."""
    topic = new_topic(broker.bootstrap, "arrival-order", 1)
    tp = TopicPartition(topic, 0)
    schema = untyped_schema()
    with BrokerClient(broker.bootstrap) as client:
        pid, epoch = client.init_producer_id()
        seq = 0
        for _ in range(3):  # a few rounds: without the ordering the race is a matter of timing
            streams = []
            for n in (200_000, 1, 1, 1, 1):
                batch = build_batch(schema, values=[b"v" * 20] * n, timestamps_ms=[1] * n)
                encoded = encode_batch(batch, base_offset=0, producer_id=pid, producer_epoch=epoch,
                                       base_sequence=seq)
                streams.append(encode_schema(schema) + encoded.to_bytes())
                seq += n
            futures = [client.produce_async([(tp, s)], acks=1) for s in streams]
            answers = [f.result(timeout=60)[0] for f in futures]
            assert [a.error for a in answers] == [None] * len(streams)
            bases = [a.base_offsets[0] for a in answers]
            assert bases == sorted(bases) and len(set(bases)) == len(bases)


def test_a_batch_is_ahead_only_past_the_next_expected_sequence(tmp_path: Any) -> None:
    state = ProducerStateManager(str(tmp_path))
    assert state.is_ahead(header(3, 1)) and not state.is_ahead(header(0, 1))  # unknown: must start at 0
    assert not state.is_ahead(header(7, 1, pid=-1))  # not idempotent: nothing to wait for
    state.apply(header(0, 3, base=0))
    assert not state.is_ahead(header(3, 2))  # the next one
    assert state.is_ahead(header(5, 2))  # overtook sequences 3 and 4
    assert not state.is_ahead(header(0, 3))  # a duplicate is answered, not held
    assert state.is_ahead(header(0, 1, epoch=1)) is False and state.is_ahead(header(4, 1, epoch=1))
    assert state.is_ahead(header(5, 1, epoch=0))
