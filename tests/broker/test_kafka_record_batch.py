"""Kafka's RecordBatch v2 codec (logstore.broker.kafka.record_batch) against kio's own.

kio writes the batches we decode and reads (CRC and layout checked) the batches we
encode, so the codec is checked against an implementation that is not ours; compressed
batches are built from kio's by compressing their records section as Kafka's clients do.
"""

from __future__ import annotations

import contextlib
import datetime
import gzip
import io
import struct

import pyarrow as pa
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

pytest.importorskip("kio", reason="the Kafka listener needs kio (Python 3.11+)")
cramjam = pytest.importorskip("cramjam")

from crc32c import crc32c  # noqa: E402
from kio.records.readers import read_batch  # noqa: E402
from kio.records.schema import NewRecordBatch, Record, RecordHeader  # noqa: E402
from kio.records.writers import write_batch  # noqa: E402

from logstore.broker.kafka.record_batch import decode_batches, to_kafka_batches, to_stored_records  # noqa: E402
from logstore.errors import CorruptRecordError, RecordTooLargeError  # noqa: E402
from logstore.record import build_batch, encode_batch, untyped_schema  # noqa: E402
from logstore.record_reader import iter_batches  # noqa: E402

_T0 = datetime.datetime(2026, 1, 1, tzinfo=datetime.timezone.utc)


def _kio_batch(n: int, *, producer_id: int = -1, attributes: int = 0) -> bytes:
    records = tuple(Record(attributes=0, timestamp=_T0 + datetime.timedelta(seconds=i), offset=i,
                           key=b"k%d" % i if i % 3 else None, value=b"v%d" % i if i != 1 else None,
                           headers=(RecordHeader(key=b"h", value=b"%d" % i),) if i % 2 else ())
                    for i in range(n))
    buffer = io.BytesIO()
    write_batch(buffer, NewRecordBatch(producer_id=producer_id, producer_epoch=0, base_sequence=0,
                                       records=records, attributes=attributes))
    return buffer.getvalue()


def _compressed(batch: bytes, codec: int, compress: object) -> bytes:
    """``batch`` with its records section compressed by ``compress`` and codec ``codec`` set."""
    head = bytearray(batch[:61])
    body = bytes(compress(batch[61:]))  # type: ignore[operator]
    attributes = struct.unpack_from(">h", head, 21)[0] | codec
    struct.pack_into(">h", head, 21, attributes)
    struct.pack_into(">i", head, 8, 61 - 12 + len(body))
    after_crc = bytes(head[21:]) + body
    struct.pack_into(">I", head, 17, crc32c(after_crc))
    return bytes(head) + body


@pytest.mark.timeout(30)
def test_batches_kio_writes_decode_to_their_records() -> None:
    data = _kio_batch(5) + _kio_batch(2, producer_id=7)
    first, second = decode_batches(data, max_decompressed_bytes=1 << 20, where="t-0")
    assert first.keys.to_pylist() == [None, b"k1", b"k2", None, b"k4"]
    assert first.values.to_pylist() == [b"v0", None, b"v2", b"v3", b"v4"]
    assert first.timestamps_ms.to_pylist() == [int(_T0.timestamp() * 1000) + 1000 * i for i in range(5)]
    assert first.headers is not None
    assert first.headers.to_pylist() == [None, [{"key": "h", "value": b"1"}], None,
                                         [{"key": "h", "value": b"3"}], None]
    assert (second.producer_id, len(second.values)) == (7, 2)


@pytest.mark.timeout(30)
@pytest.mark.parametrize("codec, compress", [
    (1, gzip.compress),
    (2, cramjam.snappy.compress_raw),
    (3, cramjam.lz4.compress),
    (4, cramjam.zstd.compress),
])
def test_compressed_batches_decode_like_uncompressed_ones(codec: int, compress: object) -> None:
    plain = _kio_batch(4)
    expected = decode_batches(plain, max_decompressed_bytes=1 << 20, where="t-0")
    assert decode_batches(_compressed(plain, codec, compress), max_decompressed_bytes=1 << 20,
                          where="t-0") == expected


@pytest.mark.timeout(30)
def test_snappy_in_javas_xerial_framing_decodes() -> None:
    plain = _kio_batch(4)

    def xerial(body: bytes) -> bytes:
        block = bytes(cramjam.snappy.compress_raw(body))
        return b"\x82SNAPPY\x00" + struct.pack(">ii", 1, 1) + struct.pack(">i", len(block)) + block
    assert decode_batches(_compressed(plain, 2, xerial), max_decompressed_bytes=1 << 20, where="t-0") == \
        decode_batches(plain, max_decompressed_bytes=1 << 20, where="t-0")


@pytest.mark.timeout(30)
def test_a_batch_inflating_past_the_bound_is_refused_before_it_is_all_inflated() -> None:
    bomb = _compressed(_kio_batch(50), 1, gzip.compress)
    with pytest.raises(RecordTooLargeError, match="max_decompressed_bytes"):
        decode_batches(bomb, max_decompressed_bytes=100, where="t-0")


@pytest.mark.timeout(30)
@pytest.mark.parametrize("damage", ["crc", "magic", "truncated", "empty"])
def test_damaged_batches_are_corrupt_records(damage: str) -> None:
    data = bytearray(_kio_batch(3))
    if damage == "crc":
        data[-1] ^= 0xFF
    elif damage == "magic":
        data[16] = 1
    elif damage == "truncated":
        del data[-5:]
    else:
        data = bytearray()
    with pytest.raises(CorruptRecordError):
        decode_batches(bytes(data), max_decompressed_bytes=1 << 20, where="t-0")


@pytest.mark.timeout(30)
def test_stored_batches_encode_as_kafka_batches_kio_reads() -> None:
    produced = decode_batches(_kio_batch(5), max_decompressed_bytes=1 << 20, where="t-0")
    stored_stream = to_stored_records(produced)
    schema = untyped_schema()
    # What the log would hold: the producer's batch with offsets assigned from 40.
    [stored] = list(iter_batches(memoryview(stored_stream), start=len(schema.serialize())))
    records = stored.decode(schema)
    appended = encode_batch(records, base_offset=40, leader_epoch=3).to_bytes()
    [at_40] = list(iter_batches(memoryview(appended)))
    kafka = to_kafka_batches([(at_40, at_40.decode(schema))])
    batch, size = read_batch(kafka, 0)
    assert size == len(kafka)
    assert (batch.base_offset, batch.partition_leader_epoch, batch.last_offset_delta) == (40, 3, 4)
    assert [(r.offset, r.key, r.value) for r in batch.records] == [
        (40 + i, k, v) for i, (k, v) in enumerate(zip(produced[0].keys.to_pylist(), produced[0].values.to_pylist(),
                                                       strict=True))]
    assert [tuple((h.key, h.value) for h in r.headers) for r in batch.records] == [
        ((b"h", b"%d" % i),) if i % 2 else () for i in range(5)]


@pytest.mark.timeout(30)
def test_offset_gaps_of_a_compacted_batch_are_kept() -> None:
    schema = untyped_schema()
    records = build_batch(schema, values=pa.array([b"a", b"b"], pa.binary()), timestamps_ms=[1, 2])
    import numpy as np
    stored = encode_batch(records, base_offset=10, offsets=np.array([10, 13], dtype=np.int64)).to_bytes()
    [batch] = list(iter_batches(memoryview(stored)))
    kafka, _ = read_batch(to_kafka_batches([(batch, batch.decode(schema))]), 0)
    assert [r.offset for r in kafka.records] == [10, 13] and kafka.last_offset_delta == 3


# Batches without headers are read and written as columns (record_vectors); kio is the reference.

_MAYBE_BYTES = st.one_of(st.none(), st.binary(max_size=300))
_RECORDS = st.lists(st.tuples(_MAYBE_BYTES, _MAYBE_BYTES, st.integers(-(2**40), 2**40)), min_size=1, max_size=40)


def _kio_plain(records: list[tuple[bytes | None, bytes | None, int]]) -> bytes:
    """A batch of ``records`` (key, value, timestamp delta in ms), no headers, written by kio."""
    buffer = io.BytesIO()
    write_batch(buffer, NewRecordBatch(producer_id=-1, producer_epoch=0, base_sequence=0, attributes=0, records=tuple(
        Record(attributes=0, timestamp=_T0 + datetime.timedelta(milliseconds=ts), offset=i, key=k, value=v, headers=())
        for i, (k, v, ts) in enumerate(records))))
    return buffer.getvalue()


@pytest.mark.timeout(120)
@settings(max_examples=60, deadline=None)
@given(_RECORDS)
def test_batches_without_headers_read_and_write_as_kio_does(records: list[tuple[bytes | None, bytes | None, int]]) -> None:
    data = _kio_plain(records)
    [produced] = decode_batches(data, max_decompressed_bytes=1 << 24, where="t-0")
    assert produced.headers is None
    assert produced.keys.to_pylist() == [k for k, _, _ in records]
    assert produced.values.to_pylist() == [v for _, v, _ in records]
    # kio's timestamps are its base timestamp (the first record's) plus each delta
    base = int(_T0.timestamp() * 1000) + records[0][2]
    assert produced.timestamps_ms.to_pylist() == [base + ts - records[0][2] for _, _, ts in records]
    schema = untyped_schema()
    [stored] = list(iter_batches(memoryview(to_stored_records([produced])), start=len(schema.serialize())))
    appended = encode_batch(stored.decode(schema), base_offset=7).to_bytes()
    [at_7] = list(iter_batches(memoryview(appended)))
    kafka = to_kafka_batches([(at_7, at_7.decode(schema))])
    batch, size = read_batch(kafka, 0)
    assert size == len(kafka)
    assert [(r.offset, r.key, r.value, r.headers) for r in batch.records] == [
        (7 + i, k, v, ()) for i, (k, v, _) in enumerate(records)]
    # The same bytes as the one-record-at-a-time writer would have produced: kio's own.
    assert kafka[61:] == data[61:]


def _with_body(batch: bytes, body: bytes, count: int | None = None) -> bytes:
    """``batch`` with its records section replaced (length, count and CRC made consistent)."""
    head = bytearray(batch[:61])
    struct.pack_into(">i", head, 8, 61 - 12 + len(body))
    if count is not None:
        struct.pack_into(">i", head, 57, count)
        struct.pack_into(">i", head, 23, count - 1)
    struct.pack_into(">I", head, 17, crc32c(bytes(head[21:]) + body))
    return bytes(head) + body


@pytest.mark.timeout(60)
@pytest.mark.parametrize("body, why", [
    (b"\x10\x00\x00\x02\x02a\x02b\x00", "offset delta"),  # the only record says offset delta 1
    (b"\x10\x00\x00\x00\x7fa\x02b\x00", "length -64"),  # a key length of -64
    (b"\x10\x00\x00\x00\x10a\x02b\x00", "overrun"),  # a key of 8 bytes in a record of 8
    (b"\x12\x00\x00\x00\x02a\x02b\x00\x00", "fields are not"),  # one byte left over in the record
    (b"\x7e\x00\x00\x00\x02a\x02b\x00", "overruns its batch"),  # a record longer than the batch
    (b"\x16\x00" + b"\xff" * 10, "varint"),  # a timestamp delta that never ends
    (b"\x0a\x00\xff\xff\xff\xff", "overrun"),  # one that ends past its record
])
def test_damaged_records_without_headers_are_corrupt_records(body: bytes, why: str) -> None:
    data = _with_body(_kio_plain([(b"a", b"b", 0)]), body, count=1)
    with pytest.raises(CorruptRecordError, match=why):
        decode_batches(data, max_decompressed_bytes=1 << 20, where="t-0")


@pytest.mark.timeout(120)
@settings(max_examples=200, deadline=None)
@given(_RECORDS, st.lists(st.tuples(st.integers(0, 10_000), st.integers(0, 255)), min_size=1, max_size=4))
def test_damaged_bodies_decode_or_are_corrupt_never_anything_else(
        records: list[tuple[bytes | None, bytes | None, int]], flips: list[tuple[int, int]]) -> None:
    data = _kio_plain(records)
    body = bytearray(data[61:])
    for at, byte in flips:
        body[at % len(body)] = byte
    with contextlib.suppress(CorruptRecordError):
        decode_batches(_with_body(data, bytes(body)), max_decompressed_bytes=1 << 24, where="t-0")
