"""The low-latency fetch path against a real embedded broker (no mocks).

* broker: a fetch that is read to the end waits without reading; a woken fetch reads
  on the event loop, or on the I/O pool when the first batch is above the inline cap;
  a fetch woken by an append it may not see (an open transaction holds the LSO)
  goes back to waiting; a fetch beyond the log end still gets its error at once;
* consumer: the prefetch a poll sends is used when the positions still match and
  dropped after a seek; records come in order, once, across polls.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Iterator

import pyarrow as pa
import pytest

from logstore import (
    Admin,
    BrokerClient,
    Consumer,
    NewTopic,
    OffsetOutOfRangeError,
    Producer,
    TopicPartition,
)
from logstore.broker.data_plane.fetch import INLINE_READ_BYTES
from logstore.broker.embedded import EmbeddedBroker
from logstore.client.results import FetchRequestPartition

pytestmark = pytest.mark.timeout(120)


@pytest.fixture(scope="module")
def broker() -> Iterator[EmbeddedBroker]:
    with EmbeddedBroker() as b:
        yield b


def _topic(broker: EmbeddedBroker, name: str) -> TopicPartition:
    with Admin(broker.bootstrap) as admin:
        admin.create_topics([NewTopic(name, 1)])
    return TopicPartition(name, 0)


def _send_later(broker: EmbeddedBroker, topic: str, values: list[bytes], delay_s: float) -> threading.Thread:
    def run() -> None:
        time.sleep(delay_s)
        with Producer(broker.bootstrap, linger_ms=0) as producer:
            producer.send_batch(topic, pa.table({"value": pa.array(values, pa.binary())}), partition=0)
            producer.flush()
    thread = threading.Thread(target=run)
    thread.start()
    return thread


def test_a_waiting_fetch_gets_the_append_that_wakes_it(broker: EmbeddedBroker) -> None:
    tp = _topic(broker, "wake-small")
    with BrokerClient(broker.bootstrap) as client:
        sender = _send_later(broker, tp.topic, [b"a", b"b"], 0.3)
        start = time.monotonic()
        [answer] = client.fetch([FetchRequestPartition(tp, 0, 1 << 20)], max_wait_ms=10_000)
        elapsed = time.monotonic() - start
        sender.join()
    assert answer.error is None and answer.next_offset == 2
    assert 0.2 <= elapsed < 5.0


def test_a_woken_fetch_still_gets_a_first_batch_above_the_inline_cap(broker: EmbeddedBroker) -> None:
    """The inline read skips a batch larger than its cap; the pool read then serves it whole."""
    tp = _topic(broker, "wake-large")
    value = b"x" * (INLINE_READ_BYTES + 4096)
    with BrokerClient(broker.bootstrap) as client:
        sender = _send_later(broker, tp.topic, [value], 0.3)
        start = time.monotonic()
        # max_bytes far below the batch: as Kafka, the first batch comes through anyway.
        [answer] = client.fetch([FetchRequestPartition(tp, 0, 1024)], max_wait_ms=20_000, max_bytes=1024)
        elapsed = time.monotonic() - start
        sender.join()
    assert answer.error is None and answer.next_offset == 1
    assert elapsed < 10.0  # when woken, not when max_wait ran out
    assert len(answer.records) > INLINE_READ_BYTES


def test_a_fetch_beyond_the_log_end_gets_its_error_at_once(broker: EmbeddedBroker) -> None:
    tp = _topic(broker, "wake-beyond")
    with BrokerClient(broker.bootstrap) as client:
        start = time.monotonic()
        [answer] = client.fetch([FetchRequestPartition(tp, 5, 1 << 20)], max_wait_ms=10_000)
        assert time.monotonic() - start < 5.0
    assert isinstance(answer.error, OffsetOutOfRangeError)


def test_a_fetch_woken_by_an_invisible_append_waits_on(broker: EmbeddedBroker) -> None:
    """read_committed: a transactional append wakes the fetch but stays above the LSO."""
    tp = _topic(broker, "wake-txn")
    with Producer(broker.bootstrap, transactional_id="wake-txn", linger_ms=0) as producer, \
            BrokerClient(broker.bootstrap) as client:
        producer.init_transactions()
        producer.begin_transaction()

        def send_in_txn() -> None:
            time.sleep(0.3)
            producer.send(tp.topic, b"pending", partition=0)
            producer.flush()

        sender = threading.Thread(target=send_in_txn)
        sender.start()
        start = time.monotonic()
        [answer] = client.fetch([FetchRequestPartition(tp, 0, 1 << 20)], max_wait_ms=1_500,
                                isolation_level="read_committed")
        elapsed = time.monotonic() - start
        sender.join()
        producer.abort_transaction()
    assert answer.error is None and not answer.records
    assert elapsed >= 1.2  # woken at ~0.3 s, found nothing visible, waited out max_wait


def test_prefetched_answers_keep_order_and_a_seek_drops_them(broker: EmbeddedBroker) -> None:
    tp = _topic(broker, "prefetch")
    with Producer(broker.bootstrap, linger_ms=0) as producer:  # one batch: one answer of 1,000
        producer.send_batch(tp.topic, pa.table({"value": pa.array([b"%d" % i for i in range(1000)])}),
                            partition=0)
        producer.flush()
    deadline = time.monotonic() + 60
    with Consumer(broker.bootstrap, auto_offset_reset="earliest", max_poll_records=7,
                  max_partition_fetch_bytes=512, fetch_max_wait_ms=30_000) as consumer:
        consumer.assign([tp])
        seen: list[int] = []
        values: list[bytes] = []
        while len(seen) < 1000:
            assert time.monotonic() < deadline
            got = consumer.poll(timeout_ms=1000)
            seen += [r.offset for r in got]
            values += [r.value for r in got]  # type: ignore[misc]
        assert seen == list(range(1000))
        assert values == [b"%d" % i for i in range(1000)]
        # Every record returned: the prefetch now long-polls at offset 1000 (for up to 30 s).
        assert consumer._prefetch.asked == {tp: 1000}
        consumer.seek(tp, 3)  # it asked for another offset: dropped, and a new fetch goes out
        start = time.monotonic()
        first = consumer.poll(timeout_ms=20_000)
        assert time.monotonic() - start < 10.0
        assert [r.offset for r in first] == list(range(3, 3 + len(first))) and first


def test_prefetch_follows_backlog_answers_only(broker: EmbeddedBroker) -> None:
    """A large answer is followed by a prefetch whose answer the next poll uses; a caught-up
    consumer (small answers) fetches synchronously."""
    tp = _topic(broker, "prefetch-later")
    with Producer(broker.bootstrap, linger_ms=0) as producer, \
            Consumer(broker.bootstrap, fetch_max_wait_ms=5_000, max_poll_records=2_000) as consumer:
        consumer.assign([tp])
        consumer.position(tp)
        producer.send_batch(tp.topic, pa.table({"value": pa.array([b"x"] * 600)}), partition=0)
        producer.flush()
        assert len(consumer.poll(timeout_ms=10_000)) == 600
        assert consumer._prefetch.asked == {tp: 600}  # the next fetch is waiting at the broker
        producer.send(tp.topic, b"two", partition=0).result(timeout=10)
        got = consumer.poll(timeout_ms=10_000)
        assert [(r.offset, r.value) for r in got] == [(600, b"two")]
        assert consumer._prefetch.asked is None  # a one-record answer: no prefetch
        assert consumer.poll(timeout_ms=200) == []


def test_a_woken_read_committed_fetch_drops_an_aborted_transaction(broker: EmbeddedBroker) -> None:
    """The read on the event loop still sends the aborted transactions, so they are filtered."""
    tp = _topic(broker, "wake-abort")

    def produce_later() -> None:
        time.sleep(0.3)
        with Producer(broker.bootstrap, transactional_id="wake-abort", linger_ms=0) as txn:
            txn.init_transactions()
            txn.begin_transaction()
            txn.send(tp.topic, b"aborted", partition=0)
            txn.flush()
            txn.abort_transaction()
        with Producer(broker.bootstrap, linger_ms=0) as plain:
            plain.send(tp.topic, b"kept", partition=0).result(timeout=10)

    with Consumer(broker.bootstrap, fetch_max_wait_ms=10_000) as consumer:
        consumer.assign([tp])
        assert consumer.position(tp) == 0
        sender = threading.Thread(target=produce_later)
        sender.start()
        got: list[bytes | None] = []
        deadline = time.monotonic() + 30
        while b"kept" not in got:
            assert time.monotonic() < deadline, got
            got += [r.value for r in consumer.poll(timeout_ms=1000)]  # type: ignore[misc]
        sender.join()
    assert got == [b"kept"]
