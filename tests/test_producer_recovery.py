"""Producers recover by themselves after an outage longer than ``delivery_timeout_ms`` (issue 22).

An idempotent producer whose batch expired (the broker was SIGKILLed or
SIGSTOPped for longer than ``delivery_timeout_ms``) must write to the
partition again once the broker is back: Kafka's KIP-360 — once the
partition's requests in flight are resolved it restarts its sequence
numbers under a new epoch. A transactional producer whose transaction
failed must commit the next one after ``abort_transaction()`` (the abort
bumps the epoch with InitProducerId naming the current producer id and
epoch). A producer started before its broker is up retries InitProducerId
until ``delivery_timeout_ms`` instead of failing at once.

Single child broker (``EmbeddedBroker(subprocess=True)``); each test < 30 s.
"""

from __future__ import annotations

import os
import signal
import socket
import threading
import time
from collections.abc import Iterator

import pytest

from logstore import Admin, NewTopic, Producer, TopicPartition
from logstore.broker.embedded import EmbeddedBroker
from logstore.client.fetcher import fetch_range
from logstore.client.rpc import BrokerClient
from logstore.errors import LogstoreError, ProducerFencedError
from logstore.record import (
    ATTR_TRANSACTIONAL,
    build_batch,
    encode_batch,
    untyped_schema,
    with_producer,
)
from logstore.record_reader import parse_batch_at

OUTAGE_S = 8.0
DELIVERY_TIMEOUT_MS = 5000


@pytest.fixture
def broker(tmp_path) -> Iterator[EmbeddedBroker]:
    b = EmbeddedBroker(str(tmp_path), subprocess=True)
    b.start()
    try:
        with Admin(b.bootstrap) as admin:
            admin.create_topics([NewTopic("t", 1)])
        yield b
    finally:
        if b._proc is not None and b._proc.poll() is None:
            os.kill(b._proc.pid, signal.SIGCONT)
        b.stop()


def _values(broker: EmbeddedBroker, topic: str = "t") -> list[bytes]:
    """Every value of partition 0 of ``topic``, read committed, in offset order."""
    with BrokerClient(broker.bootstrap) as client:
        tp = TopicPartition(topic, 0)
        end = client.list_offsets({tp: -1}, isolation_level="read_committed")[tp]
        assert not isinstance(end, LogstoreError), end
        assert end.offset is not None
        return [v for batch in fetch_range(client, tp, 0, end.offset, isolation_level="read_committed")
                for v in batch.column("value").to_pylist()]


def _outage(broker: EmbeddedBroker, how: str) -> None:
    """Take the broker away for OUTAGE_S: SIGKILL then restart, or SIGSTOP then SIGCONT."""
    assert broker._proc is not None
    if how == "kill":
        broker.kill()
        time.sleep(OUTAGE_S)
        broker.start()
    else:
        os.kill(broker._proc.pid, signal.SIGSTOP)
        time.sleep(OUTAGE_S)
        os.kill(broker._proc.pid, signal.SIGCONT)


@pytest.mark.timeout(60)
@pytest.mark.parametrize("how", ["kill", "stop"])
def test_idempotent_producer_writes_again_after_its_batches_expired(broker: EmbeddedBroker, how: str) -> None:
    with Producer(broker.bootstrap, linger_ms=0, delivery_timeout_ms=DELIVERY_TIMEOUT_MS,
                  request_timeout_ms=1000, retry_backoff_max_ms=200) as producer:
        for i in range(5):
            producer.send("t", b"before-%d" % i).result(timeout=10)
        stop = threading.Event()
        during: list = []

        def keep_sending() -> None:
            n = 0
            while not stop.is_set():
                during.append(producer.send("t", b"during-%d" % n))
                n += 1
                time.sleep(0.05)

        sender = threading.Thread(target=keep_sending, daemon=True)
        sender.start()
        time.sleep(0.3)
        _outage(broker, how)
        stop.set()
        sender.join(10)
        expired = [f for f in during if f.exception(timeout=30) is not None]
        assert expired, "some sends must have expired during an outage longer than delivery_timeout_ms"
        after = [producer.send("t", b"after-%d" % i) for i in range(20)]
        errors = [f.exception(timeout=30) for f in after]
        assert [e for e in errors if e is not None] == [], errors
    values = _values(broker)
    wanted = [b"after-%d" % i for i in range(20)]
    assert [v for v in values if v.startswith(b"after-")] == wanted
    assert values[:5] == [b"before-%d" % i for i in range(5)]
    assert len(values) == len(set(values)), "a record was written twice"


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@pytest.mark.timeout(60)
@pytest.mark.parametrize("idempotent", [True, False], ids=["idempotent", "plain"])
def test_producer_waits_for_a_broker_that_is_not_up_yet(tmp_path, idempotent: bool) -> None:
    """InitProducerId (and the topic's metadata) are retried while the broker is unreachable."""
    broker = EmbeddedBroker(str(tmp_path), port=_free_port(), subprocess=True)
    broker.start()
    with Admin(broker.bootstrap) as admin:
        admin.create_topics([NewTopic("t", 1)])
    broker.stop()
    starter = threading.Timer(1.5, broker.start)
    try:
        with Producer(broker.bootstrap, linger_ms=0, delivery_timeout_ms=20_000, max_block_ms=20_000,
                      enable_idempotence=idempotent, retry_backoff_max_ms=200) as producer:
            started = time.monotonic()
            starter.start()
            future = producer.send("t", b"x")  # failed at once with BROKER_NOT_AVAILABLE
            assert future.result(timeout=20).offset == 0
            assert time.monotonic() - started >= 1.0
    finally:
        starter.cancel()
        starter.join()
        broker.stop()


@pytest.mark.parametrize("compression", [None, "zstd"])
def test_with_producer_restamps_a_batch_as_encode_batch_would(compression: str | None) -> None:
    batch = build_batch(untyped_schema(), values=[b"a", b"bb", None], timestamps_ms=[1, 2, 3])

    def encode(epoch: int, sequence: int):
        return encode_batch(batch, base_offset=0, compression=compression, producer_id=7,
                            producer_epoch=epoch, base_sequence=sequence, attributes=ATTR_TRANSACTIONAL)

    restamped = with_producer(encode(0, 40), producer_id=7, producer_epoch=1, base_sequence=0)
    assert restamped.to_bytes() == encode(1, 0).to_bytes()
    assert restamped.header == encode(1, 0).header
    stored = parse_batch_at(memoryview(restamped.to_bytes()), 0)
    stored.verify_crc()
    assert (stored.header.producer_epoch, stored.header.base_sequence) == (1, 0)


@pytest.mark.timeout(60)
def test_transactional_producer_commits_again_after_an_aborted_failed_transaction(broker: EmbeddedBroker) -> None:
    """A transaction whose batches expired cannot commit; after abort_transaction() (which
    bumps the epoch, KIP-360) the next transaction on the same producer commits."""
    with Producer(broker.bootstrap, transactional_id="tx-recover", linger_ms=0,
                  delivery_timeout_ms=DELIVERY_TIMEOUT_MS, request_timeout_ms=1000,
                  retry_backoff_max_ms=200) as producer:
        producer.init_transactions()
        producer.begin_transaction()
        for i in range(3):
            producer.send("t", b"first-%d" % i).result(timeout=10)
        producer.commit_transaction()

        producer.begin_transaction()
        producer.send("t", b"doomed-0").result(timeout=10)
        broker.kill()
        doomed = [producer.send("t", b"doomed-%d" % i) for i in range(1, 4)]
        time.sleep(OUTAGE_S)
        broker.start()
        assert all(f.exception(timeout=30) is not None for f in doomed)
        with pytest.raises(LogstoreError, match="abort"):
            producer.commit_transaction()
        producer.abort_transaction()

        producer.begin_transaction()
        after = [producer.send("t", b"after-%d" % i) for i in range(20)]
        assert [e for e in (f.exception(timeout=30) for f in after) if e is not None] == []
        producer.commit_transaction()
    values = _values(broker)
    assert values == [b"first-%d" % i for i in range(3)] + [b"after-%d" % i for i in range(20)]


@pytest.mark.timeout(60)
def test_a_fenced_transactional_producer_fails_fatally_and_says_to_create_a_new_one(broker: EmbeddedBroker) -> None:
    """A producer whose abort would bump an epoch a newer producer owns is fenced for good
    (the newer one keeps its epoch), and every later call says to create a new producer."""
    with Producer(broker.bootstrap, transactional_id="tx-zombie", linger_ms=0) as old:
        old.init_transactions()
        old.begin_transaction()
        old.send("t", b"old").result(timeout=10)
        old._txn.record_error(LogstoreError("a send failed"))  # an abortable error: abort bumps
        with Producer(broker.bootstrap, transactional_id="tx-zombie", linger_ms=0) as new:
            new.init_transactions()
            with pytest.raises(ProducerFencedError, match="create a new Producer"):
                old.abort_transaction()
            with pytest.raises(ProducerFencedError, match="create a new Producer"):
                old.begin_transaction()
            new.begin_transaction()
            new.send("t", b"new").result(timeout=10)
            new.commit_transaction()
    assert _values(broker) == [b"new"]
