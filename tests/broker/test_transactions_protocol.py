"""Idempotence and transactions at the protocol level (raw gRPC), so every request can be
sent, delayed, repeated or dropped on purpose. DESIGN I5: read_committed never sees
aborted or open-transaction records; fencing by producer id, epoch and transaction."""

from __future__ import annotations

import random
import time
from collections.abc import Iterator

import grpc
import pytest

from logstore._proto import logstore_pb2 as pb
from logstore._proto import logstore_pb2_grpc as pb_grpc
from logstore.broker.embedded import EmbeddedBroker
from logstore.record import (
    ATTR_TRANSACTIONAL,
    build_batch,
    decode_schema,
    encode_batch,
    encode_schema,
    untyped_schema,
)
from logstore.record_reader import iter_batches

pytestmark = pytest.mark.timeout(120)
SCHEMA = untyped_schema()


def stub_for(broker: EmbeddedBroker) -> pb_grpc.LogstoreStub:
    return pb_grpc.LogstoreStub(grpc.insecure_channel(broker.bootstrap))


@pytest.fixture(scope="module")
def broker() -> Iterator[EmbeddedBroker]:
    with EmbeddedBroker() as b:
        yield b


@pytest.fixture(scope="module")
def stub(broker: EmbeddedBroker) -> pb_grpc.LogstoreStub:
    return stub_for(broker)


def topic(stub: pb_grpc.LogstoreStub, prefix: str, partitions: int = 1) -> str:
    name = f"{prefix}-{random.randrange(1 << 30)}"
    r = stub.CreateTopics(pb.CreateTopicsRequest(topics=[pb.NewTopic(name=name, partitions=partitions)]))
    assert not r.results[0].error.code
    return name


def data(values: list[bytes], *, pid: int = -1, epoch: int = -1, seq: int = -1, txn: bool = False) -> bytes:
    batch = build_batch(SCHEMA, values=values, timestamps_ms=[1_000] * len(values))
    enc = encode_batch(batch, base_offset=0, producer_id=pid, producer_epoch=epoch, base_sequence=seq,
                       attributes=ATTR_TRANSACTIONAL if txn else 0)
    return encode_schema(SCHEMA) + enc.to_bytes()


def produce(stub: pb_grpc.LogstoreStub, t: str, p: int, payload: bytes) -> pb.ProducePartitionResponse:
    return stub.Produce(pb.ProduceRequest(acks=-1, partitions=[
        pb.ProducePartition(topic=t, partition=p, records=payload)])).partitions[0]


def init(stub: pb_grpc.LogstoreStub, txn_id: str = "", timeout_ms: int = 60_000) -> tuple[int, int]:
    r = stub.InitProducerId(pb.InitProducerIdRequest(transactional_id=txn_id, transaction_timeout_ms=timeout_ms))
    assert not r.error.code, r.error
    return r.producer_id, r.producer_epoch


def add(stub: pb_grpc.LogstoreStub, txn_id: str, pid: int, epoch: int, *tps: tuple[str, int]) -> pb.AddPartitionsToTxnResponse:
    return stub.AddPartitionsToTxn(pb.AddPartitionsToTxnRequest(
        transactional_id=txn_id, producer_id=pid, producer_epoch=epoch,
        partitions=[pb.TopicPartitionRef(topic=t, partition=p) for t, p in tps]))


def end(stub: pb_grpc.LogstoreStub, txn_id: str, pid: int, epoch: int, number: int, commit: bool) -> pb.EndTxnResponse:
    return stub.EndTxn(pb.EndTxnRequest(transactional_id=txn_id, producer_id=pid, producer_epoch=epoch,
                                        txn_number=number, commit=commit))


def visible(stub: pb_grpc.LogstoreStub, t: str, p: int, *, committed: bool) -> list[bytes]:
    """Values a reader at the given isolation level sees, applying aborted-transaction filtering."""
    out: list[bytes] = []
    offset = 0
    while True:
        r = stub.Fetch(pb.FetchRequest(max_wait_ms=0, isolation_level=pb.READ_COMMITTED if committed else pb.READ_UNCOMMITTED,
                                       partitions=[pb.FetchPartition(topic=t, partition=p, fetch_offset=offset)])).partitions[0]
        assert not r.error.code, r.error
        if not r.records:
            return out
        schema, _ = decode_schema(r.schema)
        aborted = {(a.producer_id, a.first_offset) for a in r.aborted_transactions}
        aborting: set[int] = set()
        for sb in iter_batches(memoryview(r.records)):
            h = sb.header
            if any(pid == h.producer_id and first <= h.base_offset for pid, first in aborted):
                aborting.add(h.producer_id)
            if h.is_control:
                aborting.discard(h.producer_id)
                aborted = {(pid, f) for pid, f in aborted if not (pid == h.producer_id and f <= h.base_offset)}
                continue
            if committed and h.is_transactional and h.producer_id in aborting:
                continue
            out.extend(v for o, v in zip(sb.decode(schema).column("offset").to_pylist(),
                                          sb.decode(schema).column("value").to_pylist(), strict=True) if o >= offset)
        offset = r.next_offset


def bounds(stub: pb_grpc.LogstoreStub, t: str, p: int = 0) -> tuple[int, int]:
    meta = stub.Metadata(pb.MetadataRequest(topics=[t])).topics[0].partitions[p]
    return meta.high_watermark, meta.last_stable_offset


# ---------------------------------------------------------------- idempotence


def test_retried_batch_is_acknowledged_with_its_original_offset(stub: pb_grpc.LogstoreStub) -> None:
    t = topic(stub, "idem")
    pid, epoch = init(stub)
    first = data([b"a", b"b"], pid=pid, epoch=epoch, seq=0)
    r1 = produce(stub, t, 0, first)
    # The response was "lost": the client sends the very same batch again.
    r2 = produce(stub, t, 0, first)
    assert list(r1.base_offsets) == list(r2.base_offsets) == [0]
    r3 = produce(stub, t, 0, data([b"c"], pid=pid, epoch=epoch, seq=2))
    assert list(r3.base_offsets) == [2]
    assert visible(stub, t, 0, committed=False) == [b"a", b"b", b"c"]


def test_out_of_order_sequence_is_rejected(stub: pb_grpc.LogstoreStub) -> None:
    t = topic(stub, "ooo")
    pid, epoch = init(stub)
    assert produce(stub, t, 0, data([b"x"], pid=pid, epoch=epoch, seq=5)).error.code == "OUT_OF_ORDER_SEQUENCE_NUMBER"
    assert not produce(stub, t, 0, data([b"x"], pid=pid, epoch=epoch, seq=0)).error.code
    r = produce(stub, t, 0, data([b"y"], pid=pid, epoch=epoch, seq=3))
    assert r.error.code == "OUT_OF_ORDER_SEQUENCE_NUMBER" and "expected sequence 1, got 3" in r.error.message
    assert visible(stub, t, 0, committed=False) == [b"x"]


def test_idempotence_survives_broker_restart(tmp_path) -> None:  # type: ignore[no-untyped-def]
    with EmbeddedBroker(str(tmp_path)) as b:
        stub = stub_for(b)
        t = topic(stub, "idem-restart")
        pid, epoch = init(stub)
        batch = data([b"once"], pid=pid, epoch=epoch, seq=0)
        assert list(produce(stub, t, 0, batch).base_offsets) == [0]
        b.restart()
        stub = stub_for(b)
        assert list(produce(stub, t, 0, batch).base_offsets) == [0], "the retry after restart was appended again"
        assert visible(stub, t, 0, committed=False) == [b"once"]


# ---------------------------------------------------------------- transactions


def test_commit_and_abort_across_partitions_of_two_topics(stub: pb_grpc.LogstoreStub) -> None:
    a, b = topic(stub, "ta", 2), topic(stub, "tb", 1)
    txn = f"app-{random.randrange(1 << 30)}"
    pid, epoch = init(stub, txn)
    tps = [(a, 0), (a, 1), (b, 0)]
    n1 = add(stub, txn, pid, epoch, *tps).txn_number
    seq = {tp: 0 for tp in tps}
    for tp in tps:
        assert not produce(stub, tp[0], tp[1], data([b"c1", b"c2"], pid=pid, epoch=epoch, seq=seq[tp], txn=True)).error.code
        seq[tp] += 2
    # Open transaction: invisible to read_committed, and it holds the LSO back.
    assert visible(stub, a, 0, committed=True) == []
    assert visible(stub, a, 0, committed=False) == [b"c1", b"c2"]
    assert bounds(stub, a) == (2, 0)
    assert not end(stub, txn, pid, epoch, n1, True).error.code
    for t, p in tps:
        assert visible(stub, t, p, committed=True) == [b"c1", b"c2"]
    n2 = add(stub, txn, pid, epoch, *tps).txn_number
    assert n2 != n1 and n2 > 1 << 20  # a new transaction, a new random (unguessable) number
    for tp in tps:
        assert not produce(stub, tp[0], tp[1], data([b"x1"], pid=pid, epoch=epoch, seq=seq[tp], txn=True)).error.code
        seq[tp] += 1
    assert not end(stub, txn, pid, epoch, n2, False).error.code
    for t, p in tps:
        assert visible(stub, t, p, committed=True) == [b"c1", b"c2"]
        assert visible(stub, t, p, committed=False) == [b"c1", b"c2", b"x1"]
        hwm, lso = bounds(stub, t, p)
        assert hwm == lso == 5  # 2 records + commit marker + 1 aborted record + abort marker


def test_send_to_a_partition_not_in_the_transaction_is_refused(stub: pb_grpc.LogstoreStub) -> None:
    t = topic(stub, "notadded")
    txn = f"na-{random.randrange(1 << 30)}"
    pid, epoch = init(stub, txn)
    r = produce(stub, t, 0, data([b"x"], pid=pid, epoch=epoch, seq=0, txn=True))
    assert r.error.code == "INVALID_TXN_STATE"


def test_zombie_is_fenced_and_its_open_transaction_aborted(stub: pb_grpc.LogstoreStub) -> None:
    t = topic(stub, "zombie")
    txn = f"z-{random.randrange(1 << 30)}"
    pid, old = init(stub, txn)
    n = add(stub, txn, pid, old, (t, 0)).txn_number
    assert not produce(stub, t, 0, data([b"zombie"], pid=pid, epoch=old, seq=0, txn=True)).error.code
    pid2, new = init(stub, txn)  # a restarted instance with the same transactional id
    assert pid2 == pid and new > old
    assert produce(stub, t, 0, data([b"late"], pid=pid, epoch=old, seq=1, txn=True)).error.code == "PRODUCER_FENCED"
    assert end(stub, txn, pid, old, n, True).error.code == "PRODUCER_FENCED"
    assert visible(stub, t, 0, committed=True) == []
    assert bounds(stub, t)[1] == bounds(stub, t)[0], "the predecessor's transaction must not hold the LSO"


def test_stale_end_txn_never_applies_to_a_later_transaction(stub: pb_grpc.LogstoreStub) -> None:
    """The ordering flaw Jepsen found in Kafka: a delayed abort of txn N must not end txn N+1."""
    t = topic(stub, "jepsen")
    txn = f"j-{random.randrange(1 << 30)}"
    pid, epoch = init(stub, txn)
    n1 = add(stub, txn, pid, epoch, (t, 0)).txn_number
    assert not produce(stub, t, 0, data([b"one"], pid=pid, epoch=epoch, seq=0, txn=True)).error.code
    assert not end(stub, txn, pid, epoch, n1, True).error.code
    assert not end(stub, txn, pid, epoch, n1, True).error.code, "a retried commit is answered OK"
    n2 = add(stub, txn, pid, epoch, (t, 0)).txn_number
    assert not produce(stub, t, 0, data([b"two"], pid=pid, epoch=epoch, seq=1, txn=True)).error.code
    stale = end(stub, txn, pid, epoch, n1, False)  # the delayed abort of transaction 1 arrives now
    assert stale.error.code == "INVALID_TXN_STATE" and "stale" in stale.error.message
    assert not end(stub, txn, pid, epoch, n2, True).error.code
    assert visible(stub, t, 0, committed=True) == [b"one", b"two"]


def test_open_transaction_times_out_and_is_aborted() -> None:
    with EmbeddedBroker() as b:
        stub = stub_for(b)
        t = topic(stub, "timeout")
        txn = "slow"
        pid, epoch = init(stub, txn, timeout_ms=300)
        add(stub, txn, pid, epoch, (t, 0))
        assert not produce(stub, t, 0, data([b"dead"], pid=pid, epoch=epoch, seq=0, txn=True)).error.code
        assert bounds(stub, t) == (1, 0)
        deadline = time.monotonic() + 20
        while time.monotonic() < deadline and bounds(stub, t)[1] == 0:
            time.sleep(0.1)
        hwm, lso = bounds(stub, t)
        assert lso == hwm == 2, "the timed-out transaction was not aborted"
        assert visible(stub, t, 0, committed=True) == []
        assert produce(stub, t, 0, data([b"x"], pid=pid, epoch=epoch, seq=1, txn=True)).error.code in (
            "PRODUCER_FENCED", "INVALID_TXN_STATE")


def test_broker_restart_mid_transaction_keeps_it_open_then_commits(tmp_path) -> None:  # type: ignore[no-untyped-def]
    with EmbeddedBroker(str(tmp_path), subprocess=True) as b:
        stub = stub_for(b)
        t = topic(stub, "restart", 2)
        txn = "survivor"
        pid, epoch = init(stub, txn)
        n = add(stub, txn, pid, epoch, (t, 0), (t, 1)).txn_number
        for p in (0, 1):
            assert not produce(stub, t, p, data([b"v"], pid=pid, epoch=epoch, seq=0, txn=True)).error.code
        b.kill()  # no clean shutdown: producer state comes back by replaying the log
        b.start()
        stub = stub_for(b)
        assert bounds(stub, t, 0) == (1, 0), "the open transaction must still hold the LSO after restart"
        assert not end(stub, txn, pid, epoch, n, True).error.code
        for p in (0, 1):
            assert visible(stub, t, p, committed=True) == [b"v"]


# ---------------------------------------------------------------- transaction groups (the Spark sink)


def group_txn(stub: pb_grpc.LogstoreStub, txn_id: str, t: str, p: int, values: list[bytes]) -> pb.TxnRef:
    pid, epoch = init(stub, txn_id)
    number = add(stub, txn_id, pid, epoch, (t, p)).txn_number
    assert not produce(stub, t, p, data(values, pid=pid, epoch=epoch, seq=0, txn=True)).error.code
    return pb.TxnRef(transactional_id=txn_id, producer_id=pid, producer_epoch=epoch, txn_number=number)


def test_group_commit_is_atomic_and_once_per_batch(stub: pb_grpc.LogstoreStub) -> None:
    t = topic(stub, "grp", 2)
    group = f"g-{random.randrange(1 << 30)}"
    prefix = f"{group}/7/"
    ok0 = group_txn(stub, prefix + "0.0", t, 0, [b"a"])
    ok1 = group_txn(stub, prefix + "1.0", t, 1, [b"b"])
    failed = group_txn(stub, prefix + "1.1", t, 1, [b"speculative"])  # an attempt whose message never reached the driver
    r = stub.EndTxnGroup(pb.EndTxnGroupRequest(group_id=group, batch_id=7, txns=[ok0, ok1],
                                               abort_prefix=prefix, commit=True))
    assert not r.error.code and r.committed and r.last_committed_batch_id == 7
    assert visible(stub, t, 0, committed=True) == [b"a"]
    assert visible(stub, t, 1, committed=True) == [b"b"]
    assert failed.transactional_id
    assert bounds(stub, t, 1)[0] == bounds(stub, t, 1)[1], "the unlisted attempt must be aborted, not left open"
    # The batch is replayed (driver crashed after the commit): its new writes must not become visible.
    again = group_txn(stub, prefix + "0.0", t, 0, [b"a-again"])
    r = stub.EndTxnGroup(pb.EndTxnGroupRequest(group_id=group, batch_id=7, txns=[again],
                                               abort_prefix=prefix, commit=True))
    assert not r.error.code and not r.committed
    assert visible(stub, t, 0, committed=True) == [b"a"]
    d = stub.DescribeTxnGroup(pb.DescribeTxnGroupRequest(group_id=group))
    assert d.last_committed_batch_id == 7
    # Abort of a later batch discards everything under its prefix.
    p8 = f"{group}/8/"
    group_txn(stub, p8 + "0.0", t, 0, [b"discard"])
    r = stub.EndTxnGroup(pb.EndTxnGroupRequest(group_id=group, batch_id=8, abort_prefix=p8, commit=False))
    assert not r.error.code and not r.committed
    assert visible(stub, t, 0, committed=True) == [b"a"]
    assert bounds(stub, t, 0)[0] == bounds(stub, t, 0)[1]


def test_group_decisions_survive_restart(tmp_path) -> None:  # type: ignore[no-untyped-def]
    with EmbeddedBroker(str(tmp_path), subprocess=True) as b:
        stub = stub_for(b)
        t = topic(stub, "grp-restart")
        ref = group_txn(stub, "q/3/0.0", t, 0, [b"x"])
        r = stub.EndTxnGroup(pb.EndTxnGroupRequest(group_id="q", batch_id=3, txns=[ref], abort_prefix="q/3/", commit=True))
        assert r.committed
        b.kill()
        b.start()
        stub = stub_for(b)
        assert stub.DescribeTxnGroup(pb.DescribeTxnGroupRequest(group_id="q")).last_committed_batch_id == 3
        assert visible(stub, t, 0, committed=True) == [b"x"]


def test_decided_group_is_completed_by_the_next_coordinator(tmp_path) -> None:  # type: ignore[no-untyped-def]
    """Crash after the decision record, before the markers: the next coordinator to load the
    state partition (another instance, over the same log) writes the markers."""
    from logstore.broker.transactions.coordinator import TransactionCoordinator
    from logstore.broker.transactions.state_log import TopicTxnStateLog
    from logstore.errors import NotCoordinatorError
    from logstore.storage.config import LogConfig
    from logstore.storage.log_manager import LogManager
    from logstore.types import TxnRef

    manager = LogManager(str(tmp_path), topic_defaults=LogConfig())
    manager.startup()
    written: list[tuple[list, int, int, bool, int]] = []

    def crash(partitions, pid, epoch, commit, coordinator_epoch):  # type: ignore[no-untyped-def]
        raise OSError("broker died before writing markers")

    c1 = TransactionCoordinator(str(tmp_path), write_markers=crash, state=TopicTxnStateLog(manager, partitions=4))
    c1.startup()
    pid, epoch = c1.init_producer_id("g/1/0", timeout_ms=60_000)
    n = c1.add_partitions("g/1/0", pid, epoch, [("t", 0)])
    with pytest.raises(OSError):
        c1.end_group("g", 1, [TxnRef("g/1/0", pid, epoch, n)], abort_prefix="g/1/", commit=True)
    state = TopicTxnStateLog(manager)
    c2 = TransactionCoordinator(str(tmp_path), write_markers=lambda *a: written.append(a), state=state)
    with pytest.raises(NotCoordinatorError):
        c2.last_committed_batch("g")  # nothing loaded yet
    c2.load_partition(state.partition_of("g"), 1)
    assert written == [([("t", 0)], pid, epoch, True, 1)]   # with the epoch c2 loaded the partition at
    assert c2.describe("g/1/0").state.value == "COMPLETE_COMMIT"
    assert c2.last_committed_batch("g") == 1
    c2.unload_partition(state.partition_of("g"))
    assert c2.describe("g/1/0") is None
    manager.shutdown()
