"""The Spark compaction job end to end: run_compaction against a model, Spark survivors
equal to the reference, transactions (aborted removed, markers kept, LSO respected),
compaction while producing and consuming, the CLI verb and ``python -m compaction.job``.
"""

from __future__ import annotations

import json
import random
import subprocess
import sys
import threading
import time
from collections.abc import Iterator

import grpc
import pytest
from click.testing import CliRunner
from compaction_helpers import (
    compact_topic,
    model_after_compaction,
    produce_batches,
    producer_last_batches,
    read_records,
)

from compaction.job import compute_survivors, run_compaction
from compaction.planner import plan_cleaning, reference_survivors
from compaction.scan import iter_range
from logstore._proto import logstore_pb2 as pb
from logstore._proto import logstore_pb2_grpc as pb_grpc
from logstore.broker.embedded import EmbeddedBroker
from logstore.client.admin import Admin
from logstore.client.consumer import Consumer
from logstore.client.fetcher import fetch_range
from logstore.client.producer import Producer
from logstore.client.results import FetchRequestPartition
from logstore.client.rpc import BrokerClient
from logstore.record import (
    ATTR_TRANSACTIONAL,
    build_batch,
    encode_batch,
    encode_schema,
    untyped_schema,
)
from logstore.record_reader import iter_batches
from logstore.types import TopicPartition

pytestmark = pytest.mark.timeout(300)

NOW_MS = 1_700_000_000_000
DAY_MS = 86_400_000


@pytest.fixture(scope="module")
def broker() -> Iterator[EmbeddedBroker]:
    with EmbeddedBroker() as b:
        yield b


def random_batches(rng: random.Random, n: int, *, keys: int = 12) -> list[list[tuple[int, bytes | None, bytes | None]]]:
    """Keyed records with young and expired tombstones and a few keyless records."""
    out = []
    for _ in range(n):
        batch = []
        for _ in range(rng.randint(1, 9)):
            key = None if rng.random() < 0.05 else b"key-%d" % rng.randrange(keys)
            value = None if rng.random() < 0.15 else bytes(rng.randrange(256) for _ in range(rng.randint(0, 90)))
            batch.append((NOW_MS - rng.randint(0, 3 * DAY_MS), key, value))
        out.append(batch)
    return out


def cleanable_ends(bootstrap: str, topic: str) -> dict[int, int]:
    with BrokerClient(bootstrap) as client:
        info = client.cleaning.describe_cleaning([topic], now_ms=NOW_MS)[topic]
    return {p.partition: p.cleanable_end_offset for p in info.partitions}


def test_run_compaction_matches_the_model_and_reports(spark, broker: EmbeddedBroker) -> None:  # type: ignore[no-untyped-def]
    rng = random.Random(7)
    with Admin(broker.bootstrap) as admin:
        topic = compact_topic(admin, "job-model", partitions=2, segment_bytes=1024)
    with Producer(broker.bootstrap, linger_ms=0) as producer:
        for p in range(2):
            produce_batches(producer, topic, random_batches(rng, 40), partition=p)
    tps = [TopicPartition(topic, p) for p in range(2)]
    before = {tp: read_records(broker.bootstrap, tp) for tp in tps}
    ends = cleanable_ends(broker.bootstrap, topic)
    producers = {tp: producer_last_batches(broker.bootstrap, tp, ends[tp.partition]) for tp in tps}
    assert all(producers.values()), "the producer is idempotent: its batches carry a producer id"
    summary = run_compaction(spark, bootstrap=broker.bootstrap, topic=topic, now_ms=NOW_MS)
    assert summary.ok and len(summary.compacted) == 2, summary.format()
    for tp in tps:
        want = model_after_compaction(before[tp], cleanable_end=ends[tp.partition], now_ms=NOW_MS,
                                      delete_retention_ms=DAY_MS, producer_last=producers[tp])
        assert read_records(broker.bootstrap, tp) == want
    removed = sum(len(before[tp]) - len(read_records(broker.bootstrap, tp)) for tp in tps)
    assert summary.records_removed == removed > 0
    assert 0 < summary.bytes_after < summary.bytes_before
    assert json.loads(json.dumps(summary.to_dict()))["ok"] is True
    assert "records removed" in summary.format()
    # Nothing dirty any more: the next run plans nothing; a forced one changes nothing.
    again = run_compaction(spark, bootstrap=broker.bootstrap, topic=topic, now_ms=NOW_MS)
    assert again.partitions == () and len(again.skipped) == 2
    assert all("dirty ratio" in s.reason for s in again.skipped)
    forced = run_compaction(spark, bootstrap=broker.bootstrap, topic=topic, now_ms=NOW_MS, force=True,
                            partitions=[1])
    assert forced.ok and [r.partition for r in forced.partitions] == [1] and forced.records_removed == 0


def test_spark_survivors_equal_the_reference(spark, broker: EmbeddedBroker) -> None:  # type: ignore[no-untyped-def]
    rng = random.Random(11)
    with Admin(broker.bootstrap) as admin:
        topic = compact_topic(admin, "job-ref", partitions=3, segment_bytes=1024)
    with Producer(broker.bootstrap, linger_ms=0) as producer:
        for p in range(3):
            produce_batches(producer, topic, random_batches(rng, 25, keys=30), partition=p)
    with BrokerClient(broker.bootstrap) as client:
        plans, _ = plan_cleaning(client, [topic], force=True, now_ms=NOW_MS)
        assert len(plans) == 3
        by_spark = compute_survivors(spark, bootstrap=broker.bootstrap, plans=plans)
        for plan in plans:
            ref = reference_survivors(iter_range(client, plan.topic_partition, plan.start_offset, plan.end_offset),
                                      start=plan.start_offset, end=plan.end_offset,
                                      tombstone_horizon_ms=plan.tombstone_horizon_ms, partition=plan.partition)
            got = by_spark[plan.partition]
            assert got.keep_offsets.tolist() == ref.keep_offsets.tolist()
            assert got.producer_last_batches == ref.producer_last_batches


def test_policy_delete_topics_and_unknown_partitions(spark, broker: EmbeddedBroker) -> None:  # type: ignore[no-untyped-def]
    from logstore.errors import InvalidRequestError, UnknownTopicOrPartitionError

    with Admin(broker.bootstrap) as admin:
        plain = f"job-delete-{random.randrange(1 << 30)}"
        admin.create_topic(plain, 1, configs={"segment.bytes": "1024"})
        keyed = compact_topic(admin, "job-unknown")
    with Producer(broker.bootstrap, linger_ms=0) as producer:
        produce_batches(producer, plain, [[(NOW_MS, b"k", b"v" * 400)] for _ in range(6)])
    summary = run_compaction(spark, bootstrap=broker.bootstrap, topic=plain, now_ms=NOW_MS, force=True)
    assert summary.partitions == () and "cleanup.policy is delete" in summary.skipped[0].reason
    with pytest.raises(UnknownTopicOrPartitionError):
        run_compaction(spark, bootstrap=broker.bootstrap, topic=keyed, partitions=[5], now_ms=NOW_MS)
    # The broker refuses to swap segments of a topic whose policy does not include compact.
    with BrokerClient(broker.bootstrap) as client:
        info = client.cleaning.describe_cleaning([plain])[plain].partitions[0]
        with pytest.raises(InvalidRequestError, match="cleanup.policy"):
            client.cleaning.replace_segments(TopicPartition(plain, 0), segments=info.segments,
                                    end_offset=info.cleanable_end_offset, chunks=[])


# ---------------------------------------------------------------- transactions


class _Txn:
    """A transactional producer over raw gRPC (one partition)."""

    def __init__(self, stub: pb_grpc.LogstoreStub, topic: str, name: str) -> None:
        self.stub, self.topic, self.name = stub, topic, name
        r = stub.InitProducerId(pb.InitProducerIdRequest(transactional_id=name, transaction_timeout_ms=120_000))
        self.pid, self.epoch, self.seq, self.number = r.producer_id, r.producer_epoch, 0, -1

    def send(self, records: list[tuple[bytes, bytes]]) -> int:
        if self.number < 0:
            r = self.stub.AddPartitionsToTxn(pb.AddPartitionsToTxnRequest(
                transactional_id=self.name, producer_id=self.pid, producer_epoch=self.epoch,
                partitions=[pb.TopicPartitionRef(topic=self.topic, partition=0)]))
            assert not r.error.code, r.error
            self.number = r.txn_number
        schema = untyped_schema()
        batch = build_batch(schema, values=[v for _, v in records], keys=[k for k, _ in records],
                            timestamps_ms=[NOW_MS] * len(records))
        enc = encode_batch(batch, base_offset=0, producer_id=self.pid, producer_epoch=self.epoch,
                           base_sequence=self.seq, attributes=ATTR_TRANSACTIONAL)
        self.seq += len(records)
        r = self.stub.Produce(pb.ProduceRequest(acks=-1, partitions=[
            pb.ProducePartition(topic=self.topic, partition=0, records=encode_schema(schema) + enc.to_bytes())]))
        assert not r.partitions[0].error.code, r.partitions[0].error
        return r.partitions[0].base_offsets[0]

    def end(self, commit: bool) -> None:
        r = self.stub.EndTxn(pb.EndTxnRequest(transactional_id=self.name, producer_id=self.pid,
                                              producer_epoch=self.epoch, txn_number=self.number, commit=commit))
        assert not r.error.code, r.error
        self.number = -1


def test_transactions_aborted_records_go_markers_stay_and_the_lso_holds(spark, broker: EmbeddedBroker) -> None:  # type: ignore[no-untyped-def]
    with Admin(broker.bootstrap) as admin:
        topic = compact_topic(admin, "job-txn", segment_bytes=1024)
    tp = TopicPartition(topic, 0)
    stub = pb_grpc.LogstoreStub(grpc.insecure_channel(broker.bootstrap))
    pad = b"." * 300
    with Producer(broker.bootstrap, linger_ms=0) as producer:
        produce_batches(producer, topic, [[(NOW_MS, b"a", b"a0" + pad)], [(NOW_MS, b"b", b"b0" + pad)]])
        t1 = _Txn(stub, topic, f"{topic}-t1")
        t1.send([(b"a", b"a1" + pad), (b"b", b"b1" + pad)])
        t1.end(commit=True)
        t1.send([(b"a", b"a2-aborted" + pad), (b"c", b"c2-aborted" + pad)])
        t1.end(commit=False)
        t1.send([(b"d", b"d3" + pad)])
        t1.end(commit=True)
        produce_batches(producer, topic, [[(NOW_MS, b"e", b"e4" + pad)], [(NOW_MS, b"f", b"f5" + pad)]])
        t2 = _Txn(stub, topic, f"{topic}-t2")
        open_offset = t2.send([(b"a", b"a6-open" + pad)])  # stays open: the LSO
        produce_batches(producer, topic, [[(NOW_MS, b"a", b"a7" + pad)], [(NOW_MS, b"g", b"g8" + pad)]])
    with BrokerClient(broker.bootstrap) as client:
        part = client.cleaning.describe_cleaning([topic])[topic].partitions[0]
    assert part.last_stable_offset == open_offset and part.cleanable_end_offset <= open_offset
    uncommitted_before = read_records(broker.bootstrap, tp)
    summary = run_compaction(spark, bootstrap=broker.bootstrap, topic=topic, now_ms=NOW_MS, force=True)
    assert summary.ok, summary.format()
    after = read_records(broker.bootstrap, tp)
    values = [r[3][:len(r[3]) - len(pad)] if r[3] else r[3] for r in after]
    assert b"a2-aborted" not in values and b"c2-aborted" not in values  # aborted: removed
    assert b"a0" not in values and b"b0" not in values  # superseded by the committed transaction
    assert b"a1" in values and b"b1" in values and b"d3" in values  # committed: kept as latest
    # Everything at or above the cleanable end (the open transaction and what follows) is untouched.
    end = part.cleanable_end_offset
    assert [r for r in after if r[0] >= end] == [r for r in uncommitted_before if r[0] >= end]
    # Markers are kept: every transaction still resolves for read_committed readers.
    with BrokerClient(broker.bootstrap) as client:
        control = 0
        offset = 0
        while offset < part.last_stable_offset:
            [f] = client.fetch([FetchRequestPartition(tp, offset, 1 << 20)], max_wait_ms=0,
                               isolation_level="read_uncommitted")
            control += sum(sb.header.is_control for sb in iter_batches(memoryview(f.records)))
            offset = f.next_offset
        assert control == 3
        committed = [r for rb in fetch_range(client, tp, 0, part.last_stable_offset) for r in rb.column("value").to_pylist()]
    assert [v[:-len(pad)] for v in committed] == [b"a1", b"b1", b"d3", b"e4", b"f5"]


# ---------------------------------------------------------------- live traffic


def test_compaction_while_producing_and_consuming(spark, broker: EmbeddedBroker) -> None:  # type: ignore[no-untyped-def]
    with Admin(broker.bootstrap) as admin:
        topic = compact_topic(admin, "job-live", segment_bytes=2048)
    tp = TopicPartition(topic, 0)
    keys = [b"k%02d" % i for i in range(40)]
    stop = threading.Event()
    produced: dict[bytes, bytes] = {}
    errors: list[BaseException] = []

    def produce() -> None:
        try:
            with Producer(broker.bootstrap, linger_ms=0) as producer:
                n = 0
                while not stop.is_set() or n < 300:
                    batch = [(int(time.time() * 1000), keys[(n + i) % len(keys)], b"%08d" % (n + i)) for i in range(7)]
                    produce_batches(producer, topic, [batch])
                    for _, k, v in batch:
                        produced[k] = v
                    n += 7
                    time.sleep(0.002)
        except BaseException as e:  # noqa: BLE001
            errors.append(e)

    seen: dict[bytes, bytes] = {}
    offsets: list[int] = []

    def consume() -> None:
        try:
            with Consumer(broker.bootstrap, auto_offset_reset="earliest", isolation_level="read_committed") as c:
                c.assign([tp])
                idle_deadline = None
                while True:
                    records = c.poll(timeout_ms=200)
                    for r in records:
                        offsets.append(r.offset)
                        seen[r.key] = r.value
                    if stop.is_set() and not records:
                        if c.position(tp) >= c.end_offsets([tp])[tp]:
                            return
                        idle_deadline = idle_deadline or time.monotonic() + 30
                        if time.monotonic() > idle_deadline:
                            raise AssertionError("consumer did not catch up")
        except BaseException as e:  # noqa: BLE001
            errors.append(e)

    threads = [threading.Thread(target=produce), threading.Thread(target=consume)]
    for t in threads:
        t.start()
    try:
        time.sleep(1.0)
        runs = [run_compaction(spark, bootstrap=broker.bootstrap, topic=topic, force=True) for _ in range(3)]
    finally:
        stop.set()
        for t in threads:
            t.join(120)
    assert not errors, errors
    assert all(r.ok for r in runs), [r.format() for r in runs]
    assert sum(r.records_removed for r in runs) > 0
    assert all(b > a for a, b in zip(offsets, offsets[1:], strict=False)), "offsets strictly increase"
    assert seen == produced, "the consumer saw the latest value of every key"


# ---------------------------------------------------------------- entry points


def test_cli_verb_and_python_module(spark, broker: EmbeddedBroker) -> None:  # type: ignore[no-untyped-def]
    from jobs.cli import jobs

    with Admin(broker.bootstrap) as admin:
        topic = compact_topic(admin, "job-cli", segment_bytes=1024)
    with Producer(broker.bootstrap, linger_ms=0) as producer:
        produce_batches(producer, topic, [[(NOW_MS, b"k%d" % (i % 3), b"v" * 200)] for i in range(12)])
    result = CliRunner().invoke(jobs, ["compact", "--bootstrap", broker.bootstrap, "--topic", topic,
                                       "--format", "json"])
    assert result.exit_code == 0, result.output
    doc = json.loads(result.stdout)
    assert doc["ok"] and doc["partitions"][0]["records_removed"] > 0
    with Producer(broker.bootstrap, linger_ms=0) as producer:
        produce_batches(producer, topic, [[(NOW_MS, b"k%d" % (i % 3), b"w" * 200)] for i in range(12)])
    proc = subprocess.run(
        [sys.executable, "-m", "compaction.job", "--bootstrap", broker.bootstrap, "--topic", topic,
         "--format", "json", "--master", "local[1]"],
        capture_output=True, text=True, timeout=240,
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    out = json.loads(proc.stdout)
    assert out["ok"] and out["records_removed"] > 0
    assert "latest offsets per key computed" in proc.stderr  # progress lines
