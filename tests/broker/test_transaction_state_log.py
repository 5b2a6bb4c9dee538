"""The transaction coordinator's state as records of ``__transaction_state``: load and unload.

Unit level: coordinators over one real state log (a LogManager in a temporary directory)
stand for the brokers that lead a state partition one after another — what one wrote,
the next loads: decisions are finished, open transactions stay open, epochs keep
fencing, and ids of partitions not loaded are refused with NOT_COORDINATOR. Broker
level: an embedded broker keeps its coordinator state in the topic across a SIGKILL,
and imports the per-id JSON files an older version left.
"""

from __future__ import annotations

import json
import os
from collections.abc import Iterator
from pathlib import Path

import grpc
import pytest

from logstore._proto import logstore_pb2 as pb
from logstore._proto import logstore_pb2_grpc as pb_grpc
from logstore.broker.embedded import EmbeddedBroker
from logstore.broker.transactions.coordinator import TransactionCoordinator, TxnState
from logstore.broker.transactions.records import TXN_STATE_TOPIC, coordinator_key
from logstore.broker.transactions.state_log import TopicTxnStateLog
from logstore.errors import ConcurrentTransactionsError, NotCoordinatorError, ProducerFencedError
from logstore.storage.config import LogConfig
from logstore.storage.log_manager import LogManager

pytestmark = pytest.mark.timeout(60)

Written = list[tuple[list[tuple[str, int]], int, int, bool]]


@pytest.fixture()
def manager(tmp_path: Path) -> Iterator[LogManager]:
    m = LogManager(str(tmp_path), topic_defaults=LogConfig())
    m.startup()
    yield m
    m.shutdown()


def _coordinator(manager: LogManager, written: Written, *, fail: bool = False) -> TransactionCoordinator:
    def write(partitions, pid, epoch, commit, coordinator_epoch):  # type: ignore[no-untyped-def]
        written.append((list(partitions), pid, epoch, commit))
        return list(partitions) if fail else []
    return TransactionCoordinator(manager.data_dir, write_markers=write, state=TopicTxnStateLog(manager, partitions=5))


def test_the_coordinator_key_puts_a_sink_on_one_partition(manager: LogManager) -> None:
    state = TopicTxnStateLog(manager, partitions=5)
    state.prepare()
    assert coordinator_key("sink-a/12/3.0") == "sink-a" and coordinator_key("plain") == "plain"
    assert {state.partition_of(k) for k in ("sink-a", "sink-a/1/0.0", "sink-a/99/7.1")} == {state.partition_of("sink-a")}
    assert len({state.partition_of(f"id-{i}") for i in range(50)}) == 5  # spread over every partition


def test_a_load_finishes_decisions_keeps_open_transactions_and_fences(manager: LogManager) -> None:
    first: Written = []
    c1 = _coordinator(manager, first, fail=True)  # its markers never land: it "dies" in PREPARE_*
    c1.startup()
    pid_c, ep_c = c1.init_producer_id("commit-me", timeout_ms=60_000)
    n_c = c1.add_partitions("commit-me", pid_c, ep_c, [("t", 0), ("t", 1)])
    c1.end_txn("commit-me", pid_c, ep_c, n_c, commit=True)  # decided; markers pending
    assert c1.describe("commit-me").state == TxnState.PREPARE_COMMIT
    with pytest.raises(ConcurrentTransactionsError):
        c1.add_partitions("commit-me", pid_c, ep_c, [("t", 0)])
    pid_o, ep_o = c1.init_producer_id("open", timeout_ms=60_000)
    n_o = c1.add_partitions("open", pid_o, ep_o, [("t", 2)])

    second: Written = []
    c2 = _coordinator(manager, second)
    state = TopicTxnStateLog(manager)
    for key in ("commit-me", "open"):
        c2.load_partition(state.partition_of(key), 3)
    assert ([("t", 0), ("t", 1)], pid_c, ep_c, True) in second
    assert c2.describe("commit-me").state == TxnState.COMPLETE_COMMIT
    assert c2.describe("open") == c1.describe("open")  # still ONGOING, same number
    assert c2.describe("open").state == TxnState.ONGOING and c2.describe("open").txn_number == n_o
    # A restarted producer fences its predecessor on the new coordinator too.
    pid2, ep2 = c2.init_producer_id("open", timeout_ms=60_000)
    assert (pid2, ep2) == (pid_o, ep_o + 2)  # one bump aborts (fencing the old producer), one is its own
    assert ([("t", 2)], pid_o, ep_o + 1, False) in second  # its open transaction was aborted
    with pytest.raises(ProducerFencedError):
        c2.add_partitions("open", pid_o, ep_o, [("t", 2)])
    # A third instance sees what the second wrote.
    c3 = _coordinator(manager, [])
    c3.load_partition(state.partition_of("open"), 4)
    assert c3.describe("open").producer_epoch == ep2


def test_ids_of_partitions_not_loaded_are_refused(manager: LogManager) -> None:
    c = _coordinator(manager, [])
    state = TopicTxnStateLog(manager)
    c.startup()
    c.init_producer_id("sink/1/0.0", timeout_ms=60_000)
    c.unload_partition(state.partition_of("sink"))
    assert c.describe("sink/1/0.0") is None
    with pytest.raises(NotCoordinatorError):
        c.init_producer_id("sink/1/0.0", timeout_ms=60_000)
    with pytest.raises(NotCoordinatorError):
        c.end_group("sink", 1, [], abort_prefix="sink/1/", commit=True)
    c.load_partition(state.partition_of("sink"), 1)
    assert c.describe("sink/1/0.0") is not None


def test_a_marker_that_did_not_land_is_retried_until_it_does(manager: LogManager) -> None:
    written: Written = []
    landing = {"ok": False}

    def write(partitions, pid, epoch, commit, coordinator_epoch):  # type: ignore[no-untyped-def]
        written.append((list(partitions), pid, epoch, commit))
        return [tp for tp in partitions if tp[1] == 1 and not landing["ok"]]
    c = TransactionCoordinator(manager.data_dir, write_markers=write, state=TopicTxnStateLog(manager, partitions=5))
    c.startup()
    pid, ep = c.init_producer_id("x", timeout_ms=60_000)
    n = c.add_partitions("x", pid, ep, [("t", 0), ("t", 1)])
    c.end_txn("x", pid, ep, n, commit=True)
    assert c.retry_markers() == 1 and c.describe("x").state == TxnState.PREPARE_COMMIT
    with pytest.raises(ConcurrentTransactionsError):
        c.init_producer_id("x", timeout_ms=60_000)
    landing["ok"] = True
    assert c.retry_markers() == 0 and c.describe("x").state == TxnState.COMPLETE_COMMIT
    assert written[-1] == ([("t", 1)], pid, ep, True)  # only the partition still missing its marker
    c.end_txn("x", pid, ep, n, commit=True)  # a retried EndTxn: OK


def _stub(b: EmbeddedBroker) -> pb_grpc.LogstoreStub:
    return pb_grpc.LogstoreStub(grpc.insecure_channel(b.bootstrap))


def test_a_broker_replays_its_state_from_the_topic_after_sigkill(tmp_path: Path) -> None:
    with EmbeddedBroker(str(tmp_path), subprocess=True) as b:
        stub = _stub(b)
        first = stub.InitProducerId(pb.InitProducerIdRequest(transactional_id="replayed", transaction_timeout_ms=60_000))
        assert not first.error.code
        b.kill()
        b.start()
        again = _stub(b).InitProducerId(pb.InitProducerIdRequest(transactional_id="replayed",
                                                                 transaction_timeout_ms=60_000))
        assert (again.producer_id, again.producer_epoch) == (first.producer_id, first.producer_epoch + 1)
    assert not os.path.exists(tmp_path / "meta" / "transactions")
    m = LogManager(str(tmp_path), topic_defaults=LogConfig())
    m.startup()
    try:
        state = TopicTxnStateLog(m)
        records = list(state.read_partition(state.partition_of("replayed")))
        assert [(r.producer_epoch, r.state) for r in records] == [  # type: ignore[union-attr]
            (first.producer_epoch, TxnState.EMPTY), (first.producer_epoch + 1, TxnState.EMPTY)]
        assert len(m.partitions_of(TXN_STATE_TOPIC)) == 10
    finally:
        m.shutdown()


def test_state_files_of_an_older_version_are_imported(tmp_path: Path) -> None:
    legacy = tmp_path / "meta" / "transactions"
    legacy.mkdir(parents=True)
    (legacy / (b"old".hex() + ".json")).write_text(json.dumps({
        "transactional_id": "old", "producer_id": 4242, "producer_epoch": 3, "state": "COMPLETE_COMMIT",
        "txn_number": 77, "timeout_ms": 60_000, "partitions": [], "txn_start_ms": 1}))
    (tmp_path / "meta" / "producer-id-block").write_text("5000\n")
    with EmbeddedBroker(str(tmp_path), subprocess=True) as b:
        r = _stub(b).InitProducerId(pb.InitProducerIdRequest(transactional_id="old", transaction_timeout_ms=60_000))
        assert (r.producer_id, r.producer_epoch) == (4242, 4)
    assert not legacy.exists()

