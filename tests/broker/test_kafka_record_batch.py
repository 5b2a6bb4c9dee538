"""Kafka's RecordBatch v2 codec (logstore.broker.kafka.record_batch) against kio's own.

kio writes the batches we decode and reads (CRC and layout checked) the batches we
encode, so the codec is checked against an implementation that is not ours; compressed
batches are built from kio's by compressing their records section as Kafka's clients do.
"""

from __future__ import annotations

import datetime
import gzip
import io
import struct

import pyarrow as pa
import pytest

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
    assert first.keys == [None, b"k1", b"k2", None, b"k4"]
    assert first.values == [b"v0", None, b"v2", b"v3", b"v4"]
    assert first.timestamps_ms == [int(_T0.timestamp() * 1000) + 1000 * i for i in range(5)]
    assert first.headers == [None, [{"key": "h", "value": b"1"}], None, [{"key": "h", "value": b"3"}], None]
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
        (40 + i, k, v) for i, (k, v) in enumerate(zip(produced[0].keys, produced[0].values, strict=True))]
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
