"""Consumer-side decoding without a broker: trimming fetch answers to the fetch offset,
CRC checks, control batches, aborted-transaction filtering, record conversion."""

from __future__ import annotations

import pyarrow as pa
import pytest

from logstore.client.consumer import Consumer
from logstore.client.fetcher import AbortedFilter, decode_fetched, records_from_batch
from logstore.client.results import AbortedTransaction, FetchedPartition
from logstore.errors import CorruptRecordError
from logstore.record import (
    ATTR_CONTROL,
    ATTR_TRANSACTIONAL,
    BatchHeader,
    build_batch,
    encode_batch,
    encode_schema,
    typed_schema,
    untyped_schema,
)
from logstore.types import ConsumerRecord, TopicPartition

SCHEMA = untyped_schema()


def batch_bytes(base: int, values: list[bytes | None], *, attributes: int = 0, producer_id: int = -1,
                schema: pa.Schema = SCHEMA, typed_values: list | None = None) -> bytes:
    n = len(values) if typed_values is None else len(typed_values)
    rb = build_batch(
        schema,
        values=values if typed_values is None else pa.array(typed_values, schema.field("value").type),
        timestamps_ms=[1_000 + base + i for i in range(n)],
        keys=[b"k%d" % (base + i) for i in range(n)],
        headers=[[{"key": "h", "value": b"%d" % (base + i)}] for i in range(n)],
    )
    return encode_batch(rb, base_offset=base, attributes=attributes, producer_id=producer_id).to_bytes()


def answer(records: bytes, *, schema: pa.Schema = SCHEMA, next_offset: int = 0,
           aborted: tuple[AbortedTransaction, ...] = ()) -> FetchedPartition:
    return FetchedPartition("t", 0, None, 100, 100, 0, encode_schema(schema), records, aborted, next_offset)


def offsets(batches: tuple[pa.RecordBatch, ...]) -> list[int]:
    return [o for b in batches for o in b.column(0).to_pylist()]


def test_records_below_the_fetch_offset_are_dropped() -> None:
    data = batch_bytes(10, [b"a", b"b", b"c", b"d"]) + batch_bytes(14, [b"e", b"f"])
    got = decode_fetched(answer(data, next_offset=16), fetch_offset=12)
    assert offsets(got.batches) == [12, 13, 14, 15]
    assert got.next_offset == 16
    assert got.schema is not None and got.schema.equals(SCHEMA)
    assert got.record_count == 4


def test_end_offset_trims_and_stops() -> None:
    data = batch_bytes(0, [b"a", b"b", b"c"]) + batch_bytes(3, [b"d", b"e"])
    got = decode_fetched(answer(data), fetch_offset=1, end_offset=4)
    assert offsets(got.batches) == [1, 2, 3]


def test_empty_answer_keeps_the_fetch_offset_unless_told_otherwise() -> None:
    assert decode_fetched(answer(b""), fetch_offset=7).next_offset == 7
    assert decode_fetched(answer(b"", next_offset=9), fetch_offset=7).next_offset == 9
    assert decode_fetched(answer(b""), fetch_offset=7).batches == ()


def test_control_batches_are_never_records_but_advance_the_offset() -> None:
    data = batch_bytes(0, [b"a"]) + batch_bytes(1, [b""], attributes=ATTR_CONTROL)
    got = decode_fetched(answer(data), fetch_offset=0)
    assert offsets(got.batches) == [0]
    assert got.next_offset == 2


def test_crc_mismatch_raises_unless_checks_are_off() -> None:
    data = bytearray(batch_bytes(0, [b"hello world"]))
    at = data.find(b"hello world")
    data[at] ^= 0xFF
    with pytest.raises(CorruptRecordError, match="CRC32C"):
        decode_fetched(answer(bytes(data)), fetch_offset=0)
    got = decode_fetched(answer(bytes(data)), fetch_offset=0, check_crcs=False)
    assert got.record_count == 1


def _header(base: int, count: int, *, pid: int, txn: bool = False, control: bool = False) -> BatchHeader:
    attrs = (ATTR_TRANSACTIONAL if txn else 0) | (ATTR_CONTROL if control else 0)
    return BatchHeader(base, count - 1, count, 0, producer_id=pid, attributes=attrs)


def test_aborted_filter_follows_kafkas_algorithm() -> None:
    f = AbortedFilter([AbortedTransaction(producer_id=7, first_offset=10)])
    assert f.keep(_header(0, 5, pid=7, txn=True))       # before the aborted range
    assert f.keep(_header(5, 5, pid=8, txn=True))       # another producer
    assert not f.keep(_header(10, 5, pid=7, txn=True))  # inside the aborted range
    assert f.keep(_header(15, 5, pid=9))                # non-transactional
    assert not f.keep(_header(20, 1, pid=7, txn=True, control=True))  # the abort marker
    assert f.keep(_header(21, 5, pid=7, txn=True))      # the producer's next transaction
    assert AbortedFilter([]).keep(_header(0, 1, pid=1, txn=True))


def test_read_committed_drops_aborted_batches_from_an_answer() -> None:
    data = (batch_bytes(0, [b"keep"], attributes=ATTR_TRANSACTIONAL, producer_id=3)
            + batch_bytes(1, [b"drop"], attributes=ATTR_TRANSACTIONAL, producer_id=4)
            + batch_bytes(2, [b""], attributes=ATTR_TRANSACTIONAL | ATTR_CONTROL, producer_id=4)
            + batch_bytes(3, [b"keep too"]))
    aborted = (AbortedTransaction(4, 1),)
    committed = decode_fetched(answer(data, aborted=aborted), fetch_offset=0)
    assert offsets(committed.batches) == [0, 3]
    uncommitted = decode_fetched(answer(data, aborted=aborted), fetch_offset=0, read_committed=False)
    assert offsets(uncommitted.batches) == [0, 1, 3]


def test_records_from_batch_untyped_and_typed() -> None:
    data = batch_bytes(5, [b"v", None])
    [rb] = decode_fetched(answer(data), fetch_offset=0).batches
    assert records_from_batch("t", 0, rb) == [
        ConsumerRecord("t", 0, 5, 1_005, b"k5", b"v", (("h", b"5"),)),
        ConsumerRecord("t", 0, 6, 1_006, b"k6", None, (("h", b"6"),)),
    ]
    typed = typed_schema(pa.schema([("id", pa.int64()), ("name", pa.string())]))
    data = batch_bytes(0, [], schema=typed, typed_values=[{"id": 1, "name": "a"}, None])
    [rb] = decode_fetched(answer(data, schema=typed), fetch_offset=0).batches
    recs = records_from_batch("t", 0, rb)
    assert [r.value for r in recs] == [{"id": 1, "name": "a"}, None]
    assert recs[0].topic_partition == TopicPartition("t", 0)


def test_consumer_validates_options_and_assignment() -> None:
    with pytest.raises(ValueError, match="isolation_level"):
        Consumer("h:1", isolation_level="committed")
    with pytest.raises(ValueError, match="auto_offset_reset"):
        Consumer("h:1", auto_offset_reset="smallest")
    with Consumer("h:1") as consumer:
        with pytest.raises(ValueError, match="assign"):
            consumer.poll()
        consumer.assign([TopicPartition("t", 0)])
        assert consumer.assignment() == {TopicPartition("t", 0)}
        with pytest.raises(ValueError, match="not assigned"):
            consumer.seek(TopicPartition("t", 1), 0)
        with pytest.raises(TypeError):
            consumer.assign([("t", 0)])  # type: ignore[list-item]
        consumer.seek(TopicPartition("t", 0), 5)
        assert consumer.position(TopicPartition("t", 0)) == 5
    with pytest.raises(RuntimeError, match="closed"):
        consumer.poll()
