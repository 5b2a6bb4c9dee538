"""Readers across compaction gaps: a gap is not data loss (DESIGN I3).

The Consumer, ``fetch_range`` and the Spark source read a compacted partition
without data-loss errors and without waiting; a consumer positioned inside a
removed range continues at the next surviving offset; a gap that reaches the
readable end (the LSO of an open transaction) ends a bounded read at once.
"""

from __future__ import annotations

import time
from collections.abc import Iterator

import grpc
import pytest
from compaction_helpers import (
    compact_topic,
    compact_without_spark,
    model_after_compaction,
    produce_batches,
    read_records,
)

from logstore._proto import logstore_pb2 as pb
from logstore._proto import logstore_pb2_grpc as pb_grpc
from logstore.broker.embedded import EmbeddedBroker
from logstore.client.admin import Admin
from logstore.client.consumer import Consumer
from logstore.client.fetcher import fetch_range
from logstore.client.producer import Producer
from logstore.client.rpc import BrokerClient
from logstore.record import (
    ATTR_TRANSACTIONAL,
    build_batch,
    encode_batch,
    encode_schema,
    untyped_schema,
)
from logstore.types import TopicPartition

pytestmark = pytest.mark.timeout(180)
NOW_MS = 1_700_000_000_000


@pytest.fixture(scope="module")
def broker() -> Iterator[EmbeddedBroker]:
    with EmbeddedBroker() as b:
        yield b


def keyed_topic(broker: EmbeddedBroker, prefix: str) -> tuple[str, list[tuple[int, int, bytes, bytes]]]:
    """A compacted topic of 12 closed-ish batches over 5 keys, compacted once; return the
    topic and the records before compaction."""
    with Admin(broker.bootstrap) as admin:
        topic = compact_topic(admin, prefix, segment_bytes=2048)
    with Producer(broker.bootstrap, linger_ms=0) as producer:
        produce_batches(producer, topic, [
            [(NOW_MS + 10 * b + i, b"k%d" % ((b * 10 + i) % 5), b"v%d" % (b * 10 + i)) for i in range(10)]
            for b in range(12)
        ])
    before = read_records(broker.bootstrap, TopicPartition(topic, 0))
    [result] = compact_without_spark(broker.bootstrap, topic, now_ms=NOW_MS)
    assert result.error is None, result.error
    assert result.records_removed > 0
    return topic, before


def test_fetch_range_reads_exactly_the_survivors_across_gaps(broker: EmbeddedBroker) -> None:
    topic, before = keyed_topic(broker, "gaps-range")
    tp = TopicPartition(topic, 0)
    after = read_records(broker.bootstrap, tp)
    with BrokerClient(broker.bootstrap) as client:
        info = client.cleaning.describe_cleaning([topic])[topic]
    end = info.partitions[0].first_dirty_offset
    assert after == model_after_compaction(before, cleanable_end=end, now_ms=NOW_MS,
                                           delete_retention_ms=86_400_000)
    assert [r[0] for r in after] == sorted({r[0] for r in after})  # offsets preserved, increasing
    assert len(after) < len(before)


def test_consumer_inside_a_removed_range_continues_at_the_next_survivor(broker: EmbeddedBroker) -> None:
    topic, before = keyed_topic(broker, "gaps-consumer")
    tp = TopicPartition(topic, 0)
    after = read_records(broker.bootstrap, tp)
    survivors = [r[0] for r in after]
    removed = sorted({r[0] for r in before} - set(survivors))
    probe = removed[len(removed) // 2]
    expected_next = min(o for o in survivors if o > probe)
    with Consumer(broker.bootstrap, isolation_level="read_committed", auto_offset_reset="none") as consumer:
        consumer.assign([tp])
        consumer.seek(tp, probe)
        seen = []
        deadline = time.monotonic() + 20
        while len(seen) < len([o for o in survivors if o > probe]) and time.monotonic() < deadline:
            seen.extend(r.offset for r in consumer.poll(timeout_ms=500))
    assert seen[0] == expected_next
    assert seen == [o for o in survivors if o > probe]


def _raw_txn_batch(stub: pb_grpc.LogstoreStub, topic: str, size: int) -> int:
    """Open a transaction on partition 0 of ``topic`` with one large batch; return its offset."""
    init = stub.InitProducerId(pb.InitProducerIdRequest(transactional_id=f"tx-{topic}",
                                                        transaction_timeout_ms=120_000))
    added = stub.AddPartitionsToTxn(pb.AddPartitionsToTxnRequest(
        transactional_id=f"tx-{topic}", producer_id=init.producer_id, producer_epoch=init.producer_epoch,
        partitions=[pb.TopicPartitionRef(topic=topic, partition=0)]))
    assert not added.error.code, added.error
    schema = untyped_schema()
    batch = build_batch(schema, values=[b"x" * size], keys=[b"txn"], timestamps_ms=[NOW_MS])
    enc = encode_batch(batch, base_offset=0, producer_id=init.producer_id, producer_epoch=init.producer_epoch,
                       base_sequence=0, attributes=ATTR_TRANSACTIONAL)
    r = stub.Produce(pb.ProduceRequest(acks=-1, partitions=[
        pb.ProducePartition(topic=topic, partition=0, records=encode_schema(schema) + enc.to_bytes())]))
    assert not r.partitions[0].error.code, r.partitions[0].error
    return r.partitions[0].base_offsets[0]


def test_bounded_read_ends_at_once_when_a_gap_reaches_the_lso(broker: EmbeddedBroker) -> None:
    """A removed tail of the last compacted segment followed by an open transaction: the
    records up to the LSO are all gone, so a read_committed fetch_range to the LSO must end
    (it used to long-poll until its timeout)."""
    with Admin(broker.bootstrap) as admin:
        topic = compact_topic(admin, "gap-lso", segment_bytes=4096)
    tp = TopicPartition(topic, 0)
    with Producer(broker.bootstrap, linger_ms=0) as producer:
        # The last record below the LSO is an expired tombstone: compaction removes it
        # and every older record of its key, leaving a gap up to the LSO.
        produce_batches(producer, topic, [[(NOW_MS, b"a", b"1"), (NOW_MS, b"b", b"1")],
                                          [(NOW_MS, b"a", b"2"), (NOW_MS, b"c", b"1")],
                                          [(NOW_MS, b"b", b"2"), (NOW_MS - 2 * 86_400_000, b"c", None)]])
    stub = pb_grpc.LogstoreStub(grpc.insecure_channel(broker.bootstrap))
    lso = _raw_txn_batch(stub, topic, 5000)  # does not fit: rolls, and starts the active segment
    with BrokerClient(broker.bootstrap) as client:
        part = client.cleaning.describe_cleaning([topic])[topic].partitions[0]
        assert part.active_segment_base == part.last_stable_offset == lso
        compact_without_spark(broker.bootstrap, topic, now_ms=NOW_MS)
        kept = [r[0] for r in read_records(broker.bootstrap, tp, isolation_level="read_committed")]
        assert kept and kept[-1] < lso - 1, kept  # the tail below the LSO is a gap now
        started = time.monotonic()
        rows = list(fetch_range(client, tp, kept[-1] + 1, lso, isolation_level="read_committed",
                                timeout_ms=10_000))
        assert rows == []
        assert time.monotonic() - started < 5


def test_spark_batch_and_stream_read_a_compacted_topic_without_data_loss(
        spark, broker: EmbeddedBroker, tmp_path) -> None:  # type: ignore[no-untyped-def]
    topic, _ = keyed_topic(broker, "gaps-spark")
    expected = read_records(broker.bootstrap, TopicPartition(topic, 0))
    df = (spark.read.format("logstore")
          .option("logstore.bootstrap.servers", broker.bootstrap)
          .option("subscribe", topic)
          .option("startingOffsets", "earliest").option("endingOffsets", "latest")
          .option("failOnDataLoss", "true").option("minPartitions", "4")
          .load())
    rows = sorted((r.offset, r.key, r.value) for r in df.select("offset", "key", "value").collect())
    assert rows == [(o, k, v) for o, _, k, v in expected]
    query = (spark.readStream.format("logstore")
             .option("logstore.bootstrap.servers", broker.bootstrap)
             .option("subscribe", topic).option("startingOffsets", "earliest")
             .option("maxOffsetsPerTrigger", "7").option("failOnDataLoss", "true")
             .load().select("offset")
             .writeStream.format("memory").queryName("compacted_stream")
             .option("checkpointLocation", str(tmp_path / "cp"))
             .trigger(availableNow=True).start())
    assert query.awaitTermination(120)
    assert query.exception() is None
    streamed = sorted(r.offset for r in spark.sql("select offset from compacted_stream").collect())
    assert streamed == [o for o, *_ in expected]
