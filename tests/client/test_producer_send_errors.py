"""``send()`` futures and ``on_delivery`` callbacks under errors, against a real broker (issue 16).

``send()`` returns a :class:`~logstore.client.producer.delivery.RecordFuture`:
a ``concurrent.futures.Future`` whose outcome lives in its batch's
completion. These tests pin its contract where it matters most, on failure:
every record's future ends exactly once with the error, its callback runs
exactly once with ``(error, None)``, ``add_done_callback``,
``concurrent.futures.wait``/``as_completed`` see it, and the failures that
can be known before queueing are raised by ``send()`` itself.
"""

from __future__ import annotations

import concurrent.futures
import threading
import time
from collections.abc import Iterator
from typing import Any

import pytest

from logstore import Admin, NewTopic, Producer, RecordMetadata
from logstore.broker.embedded import EmbeddedBroker
from logstore.client.producer.delivery import RecordFuture
from logstore.errors import (
    BrokerUnavailableError,
    LogstoreError,
    RecordTooLargeError,
    RequestTimedOutError,
    UnknownTopicOrPartitionError,
)


class Outcomes:
    """Callbacks and done-callbacks of many records, counted per record."""

    def __init__(self) -> None:
        self.lock = threading.Lock()
        self.delivered: dict[int, list[tuple[LogstoreError | None, RecordMetadata | None]]] = {}
        self.done: dict[int, int] = {}

    def on_delivery(self, i: int) -> Any:
        def cb(error: LogstoreError | None, md: RecordMetadata | None) -> None:
            with self.lock:
                self.delivered.setdefault(i, []).append((error, md))
        return cb

    def on_done(self, i: int) -> Any:
        def cb(_: concurrent.futures.Future) -> None:
            with self.lock:
                self.done[i] = self.done.get(i, 0) + 1
        return cb


@pytest.fixture
def broker(tmp_path: Any) -> Iterator[EmbeddedBroker]:
    with EmbeddedBroker(str(tmp_path)) as b:
        with Admin(b.bootstrap) as admin:
            admin.create_topics([NewTopic("t", 2), NewTopic("small", 1, configs={"max.message.bytes": "2000"})])
        yield b


def send_many(producer: Producer, topic: str, values: list[bytes], outcomes: Outcomes,
              **kwargs: Any) -> list[concurrent.futures.Future]:
    futures = []
    for i, v in enumerate(values):
        f = producer.send(topic, v, on_delivery=outcomes.on_delivery(i), **kwargs)
        f.add_done_callback(outcomes.on_done(i))
        futures.append(f)
    return futures


def assert_each_failed_once(futures: list[concurrent.futures.Future], outcomes: Outcomes,
                            error_type: type[BaseException] | tuple[type[BaseException], ...]) -> None:
    done, not_done = concurrent.futures.wait(futures, timeout=30)
    assert not not_done
    for i, f in enumerate(futures):
        assert f.done() and not f.cancelled()
        error = f.exception(timeout=0)
        assert isinstance(error, error_type), (i, error)
        with pytest.raises(error_type):
            f.result(timeout=0)
        assert outcomes.delivered[i] == [(error, None)], (i, outcomes.delivered.get(i))
        assert outcomes.done[i] == 1, (i, outcomes.done.get(i))


@pytest.mark.timeout(60)
def test_success_fills_futures_callbacks_and_waiters(broker: EmbeddedBroker) -> None:
    outcomes = Outcomes()
    with Producer(broker.bootstrap, linger_ms=60_000) as producer:
        futures = send_many(producer, "t", [b"v%d" % i for i in range(50)], outcomes, key=b"k")
        first = futures[0]
        assert isinstance(first, RecordFuture) and isinstance(first, concurrent.futures.Future)
        assert not first.done() and first.running() and not first.cancel()
        with pytest.raises(TimeoutError):
            first.result(timeout=0.05)  # lingering: not sent yet
        assert producer.flush(timeout=30) == 0
        seen = list(concurrent.futures.as_completed(futures, timeout=10))
    assert len(seen) == 50
    mds = [f.result(timeout=0) for f in futures]
    assert [md.offset for md in mds] == list(range(50))  # one key: one partition, in order
    assert len({md.partition for md in mds}) == 1
    for i, md in enumerate(mds):
        assert futures[i].exception() is None
        assert outcomes.delivered[i] == [(None, md)]
        assert outcomes.done[i] == 1
    late: list[concurrent.futures.Future] = []
    first.add_done_callback(late.append)  # already done: runs at once
    assert late == [first]


@pytest.mark.timeout(60)
def test_errors_known_before_queueing_are_raised_by_send(broker: EmbeddedBroker) -> None:
    with Producer(broker.bootstrap, max_request_size=1000, max_block_ms=2000) as producer:
        with pytest.raises(RecordTooLargeError):
            producer.send("t", b"x" * 2000)
        with pytest.raises(UnknownTopicOrPartitionError):
            producer.send("no-such-topic", b"x")
        with pytest.raises(UnknownTopicOrPartitionError):
            producer.send("t", b"x", partition=2)
        with pytest.raises(TypeError):
            producer.send("t", 42)  # type: ignore[arg-type]
        with pytest.raises(ValueError, match="64 bits"):
            producer.send("t", b"x", timestamp_ms=2**64)
        assert producer.send("t", b"fine").result(timeout=10).offset == 0


@pytest.mark.timeout(60)
def test_a_batch_the_broker_refuses_fails_each_record_once(broker: EmbeddedBroker) -> None:
    # max.message.bytes=2000 on the topic: a batch of 30 x 100 B is refused whole.
    outcomes = Outcomes()
    with Producer(broker.bootstrap, linger_ms=60_000) as producer:
        futures = send_many(producer, "small", [b"x" * 100] * 30, outcomes)
        assert producer.flush(timeout=30) == 0
        assert_each_failed_once(futures, outcomes, RecordTooLargeError)
        # The partition's sequence has a gap now (the batch failed for good): like Kafka's
        # producer, later batches of that partition fail too; other partitions are unaffected.
        other = producer.send("t", b"other topic")
        assert producer.flush(timeout=30) == 0
        assert other.result(timeout=0).offset == 0


@pytest.mark.timeout(60)
def test_broker_gone_fails_records_at_the_delivery_timeout(broker: EmbeddedBroker) -> None:
    outcomes = Outcomes()
    producer = Producer(broker.bootstrap, linger_ms=5, delivery_timeout_ms=1500, request_timeout_ms=500,
                        retry_backoff_ms=50)
    try:
        producer.send("t", b"warm-up", partition=0).result(timeout=10)  # metadata, producer id
        broker.stop()
        start = time.monotonic()
        futures = send_many(producer, "t", [b"v%d" % i for i in range(20)], outcomes, partition=1)
        # The last attempt's error when no retry fits in delivery_timeout_ms, or the expiry.
        assert_each_failed_once(futures, outcomes, (BrokerUnavailableError, RequestTimedOutError))
        assert time.monotonic() - start < 1.5 + 5  # never much after delivery_timeout_ms
        assert producer.flush(timeout=5) == 0
    finally:
        producer.close(timeout=1)


@pytest.mark.timeout(60)
def test_close_while_records_are_pending_fails_them_once(broker: EmbeddedBroker) -> None:
    outcomes = Outcomes()
    producer = Producer(broker.bootstrap, linger_ms=5, retry_backoff_ms=50)
    producer.send("t", b"warm-up", partition=0).result(timeout=10)
    broker.stop()
    futures = send_many(producer, "t", [b"v%d" % i for i in range(20)], outcomes)
    start = time.monotonic()
    producer.close(timeout=0.5)
    assert time.monotonic() - start < 10
    assert_each_failed_once(futures, outcomes, RequestTimedOutError)
    with pytest.raises(RuntimeError, match="closed"):
        producer.send("t", b"after close")
