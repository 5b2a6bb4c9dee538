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
from child_helpers import child_broker
from producer_fakes import UNTYPED, FakeClient, make_producer

from logstore import Admin, NewTopic, Producer, TopicPartition
from logstore.broker.embedded import EmbeddedBroker
from logstore.broker.transactions.coordinator import TransactionCoordinator
from logstore.broker.transactions.state_log import TopicTxnStateLog
from logstore.client.fetcher import fetch_range
from logstore.client.rpc import BrokerClient
from logstore.errors import (
    InvalidTxnStateError,
    LogstoreError,
    OutOfOrderSequenceError,
    ProducerFencedError,
)
from logstore.record import (
    ATTR_TRANSACTIONAL,
    build_batch,
    decode_schema,
    encode_batch,
    untyped_schema,
    with_producer,
)
from logstore.record_reader import iter_batches, parse_batch_at
from logstore.storage.config import LogConfig
from logstore.storage.log_manager import LogManager

OUTAGE_S = 8.0
DELIVERY_TIMEOUT_MS = 5000


@pytest.fixture
def broker(tmp_path) -> Iterator[EmbeddedBroker]:
    with child_broker(str(tmp_path), topic="t", partitions=1) as b:
        yield b


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
def test_commit_and_abort_wait_for_a_broker_that_is_restarting(broker: EmbeddedBroker) -> None:
    """commit_transaction() and abort_transaction() ask again while no coordinator can be reached
    (a broker restarting, a coordinator moving) until delivery_timeout_ms, as Kafka's block until
    done; one request timeout was all they waited (BROKER_NOT_AVAILABLE from FindCoordinator
    while the client's channel was still backing off after the broker came back)."""
    with Producer(broker.bootstrap, transactional_id="tx-restart", linger_ms=0, delivery_timeout_ms=20_000,
                  request_timeout_ms=1000, retry_backoff_max_ms=200) as producer:
        producer.init_transactions()
        for end in (producer.abort_transaction, producer.commit_transaction):
            producer.begin_transaction()
            producer.send("t", b"kept" if end == producer.commit_transaction else b"dropped").result(timeout=10)
            broker.kill()
            restart = threading.Timer(3.0, broker.start)
            restart.start()
            try:
                end()  # waits for the broker instead of failing after one request timeout
            finally:
                restart.join()
    assert _values(broker) == [b"kept"]


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


# ---------------------------------------------------------------- the rules, against a fake broker


class _EpochClient(FakeClient):
    """tests.test_client_producer's FakeClient, remembering the (epoch, base sequence) of every
    batch sent, with transactions and a producer id whose epoch InitProducerId bumps."""

    def __init__(self) -> None:
        super().__init__({"t": (1, UNTYPED)})
        self.sent: list[tuple[int, int]] = []
        self.epoch = 0
        self.bumps: list[object] = []
        self.ended: list[bool] = []

    def init_producer_id(self, transactional_id: str = "", **kw: object) -> tuple[int, int]:
        self.bumps.append(kw.get("current"))
        if kw.get("current") is not None:
            self.epoch += 1
        return 7, self.epoch

    def add_partitions_to_txn(self, ref: object, partitions: object, **_: object) -> int:
        return 1

    def end_txn(self, ref: object, *, commit: bool, **_: object) -> None:
        self.ended.append(commit)

    def produce_async(self, items, **kw):  # type: ignore[no-untyped-def]
        for _, pieces in items:
            data = b"".join(bytes(x) for x in pieces)
            _, size = decode_schema(data)
            for b in iter_batches(memoryview(data), start=size):
                self.sent.append((b.header.producer_epoch, b.header.base_sequence))
        return super().produce_async(items, **kw)


def _refuse_out_of_order(tps: list) -> dict:
    return {tp: OutOfOrderSequenceError("expected sequence 0, got 3") for tp in tps}


@pytest.mark.timeout(30)
def test_a_refused_oldest_batch_restarts_the_partition_under_a_new_epoch() -> None:
    fake = _EpochClient()
    with make_producer(fake, linger_ms=0, retry_backoff_ms=1) as producer:
        producer.send("t", b"a", partition=0).result(timeout=5)
        fake.script.append(_refuse_out_of_order)  # e.g. a new leader lost the acks=1 tail
        assert producer.send("t", b"b", partition=0).result(timeout=5).offset == 1
        producer.send("t", b"c", partition=0).result(timeout=5)
    # The refused batch went again as the first of epoch 1; the next followed it.
    assert fake.sent == [(0, 0), (0, 1), (1, 0), (1, 1)]


@pytest.mark.timeout(30)
def test_a_transactional_producer_bumps_only_through_its_coordinator() -> None:
    fake = _EpochClient()
    with make_producer(fake, linger_ms=0, retry_backoff_ms=1, transactional_id="tx") as producer:
        producer.init_transactions()
        producer.begin_transaction()
        fake.script.append(_refuse_out_of_order)
        with pytest.raises(LogstoreError, match="OUT_OF_ORDER"):
            producer.send("t", b"a", partition=0).result(timeout=5)  # abortable: not retried
        with pytest.raises(LogstoreError, match="abort"):
            producer.commit_transaction()
        producer.abort_transaction()
        producer.begin_transaction()
        producer.send("t", b"b", partition=0).result(timeout=5)
        producer.commit_transaction()
    assert fake.bumps == [None, (7, 0)]  # init_transactions, then the abort's bump
    assert fake.ended == [False, True]
    assert fake.sent == [(0, 0), (1, 0)]


@pytest.mark.timeout(30)
def test_a_transactional_batch_that_expires_unsent_does_not_bump_the_epoch_locally() -> None:
    """Only the coordinator gives a transactional producer a new epoch: batches sent after one
    that expired in the queue keep the transaction's epoch (its markers are written with it)."""
    fake = _EpochClient()
    with make_producer(fake, linger_ms=0, delivery_timeout_ms=300, transactional_id="tx") as producer:
        producer.init_transactions()
        producer.begin_transaction()
        fake.hold = True  # the first request waits: the second batch stays queued, and expires
        first = producer.send("t", b"a", partition=0)
        time.sleep(0.1)
        expired = producer.send("t", b"b", partition=0)
        assert expired.exception(timeout=5) is not None
        fake.hold = False
        fake.release()
        first.result(timeout=5)
        producer.send("t", b"c", partition=0).result(timeout=5)
        producer.abort_transaction()
    assert {epoch for epoch, _ in fake.sent} == {0}, fake.sent


@pytest.mark.timeout(30)
def test_abort_after_a_commit_whose_answer_was_lost_leaves_the_producer_ready() -> None:
    """EndTxn(commit) timed out, yet committed: abort_transaction() is then refused by the
    coordinator (the transaction is COMPLETE_COMMIT). The abort must not wedge the producer:
    it bumps the epoch, and the next transaction commits."""
    from logstore.errors import RequestTimedOutError

    class LostCommitAnswer(_EpochClient):
        def end_txn(self, ref: object, *, commit: bool, **kw: object) -> None:
            super().end_txn(ref, commit=commit, **kw)
            if len(self.ended) == 1:
                raise RequestTimedOutError("EndTxn to broker b:1 timed out (Deadline Exceeded)")
            if len(self.ended) == 2:
                raise InvalidTxnStateError("cannot abort transaction 1 of 'tx': it is COMPLETE_COMMIT")

    fake = LostCommitAnswer()
    with make_producer(fake, linger_ms=0, transactional_id="tx") as producer:
        producer.init_transactions()
        producer.begin_transaction()
        producer.send("t", b"a", partition=0).result(timeout=5)
        with pytest.raises(RequestTimedOutError):
            producer.commit_transaction()
        producer.abort_transaction()
        producer.begin_transaction()
        producer.send("t", b"b", partition=0).result(timeout=5)
        producer.commit_transaction()
    assert fake.ended == [True, False, True]
    assert fake.bumps == [None, (7, 0)]
    assert fake.sent == [(0, 0), (1, 0)]


# ---------------------------------------------------------------- the coordinator's side of the bump


def _coordinator(data_dir: str, manager: object) -> TransactionCoordinator:
    c = TransactionCoordinator(data_dir, write_markers=lambda *a: [],
                               state=TopicTxnStateLog(manager, partitions=3))  # type: ignore[arg-type]
    c.startup()
    return c


def test_a_bump_whose_answer_was_lost_is_answered_again_and_a_newer_producer_is_never_fenced(tmp_path) -> None:
    manager = LogManager(str(tmp_path), topic_defaults=LogConfig())
    manager.startup()
    try:
        c = _coordinator(str(tmp_path), manager)
        pid, epoch = c.init_producer_id("x", timeout_ms=60_000)
        n = c.add_partitions("x", pid, epoch, [("t", 0)])
        bumped = c.init_producer_id("x", timeout_ms=60_000, current=(pid, epoch))  # aborts, bumps
        assert bumped[0] == pid and bumped[1] > epoch
        # The answer was lost; the producer asks again with the epoch it knows: same answer, no bump.
        assert c.init_producer_id("x", timeout_ms=60_000, current=(pid, epoch)) == bumped
        with pytest.raises(InvalidTxnStateError, match="abort"):  # aborted by the bump: abortable
            c.end_txn("x", pid, epoch, n, commit=True)
        # A coordinator that loads the id from the log knows the last bump too.
        again = _coordinator(str(tmp_path), manager)
        assert again.init_producer_id("x", timeout_ms=60_000, current=(pid, epoch)) == bumped
        # A new producer takes the id over: the old one can neither bump nor "retry" any more.
        assert again.init_producer_id("x", timeout_ms=60_000) == (pid, bumped[1] + 1)
        for old in (epoch, bumped[1]):
            with pytest.raises(ProducerFencedError, match="cannot bump"):
                again.init_producer_id("x", timeout_ms=60_000, current=(pid, old))
        assert again.describe("x").producer_epoch == bumped[1] + 1
    finally:
        manager.shutdown()


@pytest.mark.timeout(60)
def test_a_transaction_aborted_by_its_timeout_is_abortable_not_fatal(broker: EmbeddedBroker) -> None:
    """KIP-588: the coordinator aborts a transaction open longer than its timeout (bumping the
    epoch); the producer's commit fails, its abort gets the new epoch, and it goes on."""
    with Producer(broker.bootstrap, transactional_id="tx-timeout", linger_ms=0,
                  transaction_timeout_ms=1000) as producer:
        producer.init_transactions()
        producer.begin_transaction()
        producer.send("t", b"late-0").result(timeout=10)
        time.sleep(3.0)  # the coordinator checks every second
        with pytest.raises(LogstoreError, match="transaction.timeout.ms"):
            producer.send("t", b"late-1").result(timeout=10)
        with pytest.raises(LogstoreError, match="abort"):
            producer.commit_transaction()
        producer.abort_transaction()
        producer.begin_transaction()
        producer.send("t", b"next").result(timeout=10)
        producer.commit_transaction()
    assert _values(broker) == [b"next"]
