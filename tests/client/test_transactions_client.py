"""Idempotent and transactional Producer against a real broker, read back with the Consumer."""

from __future__ import annotations

import concurrent.futures
import random
from collections.abc import Iterator
from typing import Any

import pyarrow as pa
import pytest

from logstore import Consumer, Producer
from logstore.broker.embedded import EmbeddedBroker
from logstore.client.admin import Admin
from logstore.errors import InvalidTxnStateError, ProducerFencedError, RequestTimedOutError
from logstore.types import NewTopic, TopicPartition

pytestmark = pytest.mark.timeout(120)


@pytest.fixture(scope="module")
def broker() -> Iterator[EmbeddedBroker]:
    with EmbeddedBroker() as b:
        yield b


def new_topic(broker: EmbeddedBroker, prefix: str, partitions: int = 1) -> str:
    name = f"{prefix}-{random.randrange(1 << 30)}"
    with Admin(broker.bootstrap) as admin:
        admin.create_topics([NewTopic(name, num_partitions=partitions)])
    return name


def read_all(broker: EmbeddedBroker, topic: str, partitions: int, isolation: str) -> dict[int, list[tuple[int, bytes]]]:
    out: dict[int, list[tuple[int, bytes]]] = {p: [] for p in range(partitions)}
    with Consumer(broker.bootstrap, isolation_level=isolation, fetch_max_wait_ms=50) as c:
        c.assign([TopicPartition(topic, p) for p in range(partitions)])
        c.seek_to_beginning()
        empty = 0
        while empty < 3:
            records = c.poll(timeout_ms=100)
            empty = 0 if records else empty + 1
            for r in records:
                out[r.partition].append((r.offset, r.value))
    return out


class LoseResponses:
    """Wraps a client: the first ``n`` produce answers are dropped after the broker appended."""

    def __init__(self, client: Any, n: int) -> None:
        self._client = client
        self.left = n

    def __getattr__(self, name: str) -> Any:
        return getattr(self._client, name)

    def produce_async(self, *args: Any, **kwargs: Any) -> concurrent.futures.Future:
        real = self._client.produce_async(*args, **kwargs)
        if self.left <= 0:
            return real
        self.left -= 1
        lost: concurrent.futures.Future = concurrent.futures.Future()

        def drop(f: concurrent.futures.Future) -> None:
            f.exception()  # the broker did append (or fail); the client never hears of it
            lost.set_exception(RequestTimedOutError("injected: the produce response was lost"))

        real.add_done_callback(drop)
        return lost


@pytest.mark.parametrize("idempotent", [True, False])
def test_lost_responses_are_retried_without_duplicates_only_when_idempotent(broker: EmbeddedBroker, idempotent: bool) -> None:
    t = new_topic(broker, "lost")
    producer = Producer(broker.bootstrap, enable_idempotence=idempotent, linger_ms=0, retry_backoff_ms=10)
    producer._client = LoseResponses(producer._client, 3)  # type: ignore[assignment]
    with producer:
        offsets = [producer.send(t, f"v{i}".encode(), partition=0).result(timeout=30).offset for i in range(10)]
    values = [v for _, v in read_all(broker, t, 1, "read_uncommitted")[0]]
    if idempotent:
        assert values == [f"v{i}".encode() for i in range(10)], "a retried batch was appended twice"
        assert offsets == list(range(10))
    else:
        # Without idempotence the same faults duplicate records: the reason idempotence is the default.
        assert len(values) > 10 and sorted(set(values)) == sorted(f"v{i}".encode() for i in range(10))


def test_commit_and_abort_across_three_partitions_of_two_topics(broker: EmbeddedBroker) -> None:
    a, b = new_topic(broker, "txa", 2), new_topic(broker, "txb", 1)
    with Producer(broker.bootstrap, transactional_id=f"tx-{random.randrange(1 << 30)}") as p:
        p.init_transactions()
        p.begin_transaction()
        for part in (0, 1):
            p.send(a, b"committed-a", partition=part)
        p.send_batch(b, pa.table({"value": [b"committed-b1", b"committed-b2"]}), partition=0)
        p.commit_transaction()
        p.begin_transaction()
        for part in (0, 1):
            p.send(a, b"aborted-a", partition=part)
        p.send(b, b"aborted-b", partition=0)
        p.abort_transaction()
        p.begin_transaction()
        p.send(a, b"after", partition=0)
        p.commit_transaction()
    committed_a = read_all(broker, a, 2, "read_committed")
    assert [v for _, v in committed_a[0]] == [b"committed-a", b"after"]
    assert [v for _, v in committed_a[1]] == [b"committed-a"]
    assert [v for _, v in read_all(broker, b, 1, "read_committed")[0]] == [b"committed-b1", b"committed-b2"]
    uncommitted = read_all(broker, a, 2, "read_uncommitted")
    assert [v for _, v in uncommitted[0]] == [b"committed-a", b"aborted-a", b"after"]
    # Markers take offsets but are never records: offsets have gaps.
    assert [o for o, _ in uncommitted[0]] == [0, 2, 4]


def test_open_transaction_is_invisible_until_commit(broker: EmbeddedBroker) -> None:
    t = new_topic(broker, "open")
    with Producer(broker.bootstrap, transactional_id=f"o-{random.randrange(1 << 30)}") as p:
        p.init_transactions()
        p.begin_transaction()
        p.send(t, b"pending", partition=0)
        p.flush()
        assert read_all(broker, t, 1, "read_committed")[0] == []
        assert [v for _, v in read_all(broker, t, 1, "read_uncommitted")[0]] == [b"pending"]
        with Admin(broker.bootstrap) as admin:
            (info,) = admin.describe_topics([t])[t].partitions
        assert (info.high_watermark, info.last_stable_offset) == (1, 0)
        p.commit_transaction()
    assert [v for _, v in read_all(broker, t, 1, "read_committed")[0]] == [b"pending"]


def test_second_producer_with_the_same_transactional_id_fences_the_first(broker: EmbeddedBroker) -> None:
    t = new_topic(broker, "fence")
    txn_id = f"f-{random.randrange(1 << 30)}"
    first = Producer(broker.bootstrap, transactional_id=txn_id)
    first.init_transactions()
    first.begin_transaction()
    first.send(t, b"zombie", partition=0)
    first.flush()
    with Producer(broker.bootstrap, transactional_id=txn_id) as second:
        second.init_transactions()  # aborts the zombie's open transaction
        second.begin_transaction()
        second.send(t, b"live", partition=0)
        second.commit_transaction()
    with pytest.raises(ProducerFencedError):
        first.commit_transaction()
    first.close()
    assert [v for _, v in read_all(broker, t, 1, "read_committed")[0]] == [b"live"]


def test_transactional_producer_refuses_sends_outside_a_transaction(broker: EmbeddedBroker) -> None:
    t = new_topic(broker, "outside")
    with Producer(broker.bootstrap, transactional_id=f"x-{random.randrange(1 << 30)}") as p:
        with pytest.raises(InvalidTxnStateError, match="begin_transaction"):
            p.send(t, b"x")
        p.init_transactions()
        with pytest.raises(InvalidTxnStateError, match="begin_transaction"):
            p.send(t, b"x")
        with pytest.raises(InvalidTxnStateError):
            p.commit_transaction()
    with pytest.raises(ValueError, match="acks"):
        Producer(broker.bootstrap, transactional_id="y", acks=1)
