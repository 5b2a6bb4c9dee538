"""Kafka's RecordBatch v2 (magic 2) to and from logstore's stored batches.

Byte layout of one batch (big-endian; Kafka's ``DefaultRecordBatch``)::

    offset  size  field
         0     8  base offset
         8     4  batch length (bytes after this field)
        12     4  partition leader epoch
        16     1  magic (2)
        17     4  CRC32C of bytes [21, 12 + batch length)
        21     2  attributes: bits 0-2 compression (0 none, 1 gzip, 2 snappy, 3 lz4,
                  4 zstd), bit 3 timestamp type, bit 4 transactional, bit 5 control
        23     4  last offset delta
        27     8  base timestamp (ms)
        35     8  max timestamp (ms)
        43     8  producer id
        51     2  producer epoch
        53     4  base sequence
        57     4  record count
        61     .  records, compressed as a whole by the codec of the attributes

and of one record (varints are zigzag, as protobuf's ``sint``)::

    varint length, int8 attributes, varlong timestamp delta, varint offset delta,
    varint key length (-1: null) + key, varint value length (-1: null) + value,
    varint header count, then per header: varint key length + UTF-8 key,
    varint value length (-1: null) + value

A produce's batches become one logstore batch each (:func:`to_stored_records`): keys,
values, timestamps and headers as sent, the producer id, epoch and base sequence kept (so
idempotence and transactions work as for logstore's own producer), offsets assigned by
the log. A fetch's stored batches become one Kafka batch each (:func:`to_kafka_batches`):
base offset, leader epoch, producer facts and offset deltas (gaps kept) from the stored
batch, uncompressed; a transaction marker becomes Kafka's control record (key: version 0,
type 0 abort / 1 commit; value: version 0, the coordinator epoch).

Not kio's record-batch reader: it truncates timestamps to whole seconds and reads no
compressed batch. A batch's records are read and written as columns
(:mod:`.record_vectors`) unless some record has headers; then they are read and written one
at a time here, with kio's varint readers.

Errors: bytes that are not valid batches raise :class:`~logstore.errors.CorruptRecordError`
(CRC, framing, magic, record lengths); a batch inflating past ``max_decompressed_bytes``
raises :class:`~logstore.errors.RecordTooLargeError`.

Thread-safety: pure functions.
"""

from __future__ import annotations

import functools
import gzip
import struct
import zlib
from dataclasses import dataclass

import pyarrow as pa
import pyarrow.compute as pc
from crc32c import crc32c
from kio.serial.errors import DecodeError
from kio.serial.readers import read_signed_varint, read_signed_varlong

from logstore.broker.kafka.json_values import json_values
from logstore.broker.kafka.record_vectors import read_records, write_records
from logstore.errors import CorruptRecordError, RecordTooLargeError
from logstore.record import (
    ATTR_TRANSACTIONAL,
    HEADERS_TYPE,
    build_batch,
    encode_batch,
    encode_schema,
    untyped_schema,
)
from logstore.record_reader import StoredBatch

__all__ = ["KafkaBatch", "decode_batches", "to_stored_records", "to_kafka_batches", "COMPRESSION_CODECS"]

_HEAD = struct.Struct(">qiibIhiqqqhii")
HEAD_BYTES = _HEAD.size  # 61, Kafka's RECORD_BATCH_OVERHEAD
_CRC_FROM = 21
_MAGIC = 2
_CODEC_MASK = 0x07
_KAFKA_LOG_APPEND_TIME = 0x08
_KAFKA_TRANSACTIONAL = 0x10
_KAFKA_CONTROL = 0x20
COMPRESSION_CODECS = {0: None, 1: "gzip", 2: "snappy", 3: "lz4", 4: "zstd"}
_XERIAL_MAGIC = b"\x82SNAPPY\x00"


@dataclass(frozen=True, slots=True)
class KafkaBatch:
    """One produced batch, its records decoded as columns (``headers`` None when no record has
    any; else Arrow's list of header structs, null for a record without)."""

    producer_id: int
    producer_epoch: int
    base_sequence: int
    transactional: bool
    control: bool
    timestamps_ms: pa.Int64Array
    keys: pa.BinaryArray
    values: pa.BinaryArray
    headers: pa.ListArray | None


def decode_batches(data: bytes | memoryview, *, max_decompressed_bytes: int, where: str) -> list[KafkaBatch]:
    """Every batch of a produce's records for one partition; see the module docstring."""
    view = memoryview(data)
    out: list[KafkaBatch] = []
    pos, budget = 0, max_decompressed_bytes
    while pos < len(view):
        if len(view) - pos < HEAD_BYTES:
            raise CorruptRecordError(f"{where}: a record batch is truncated ({len(view) - pos} bytes left)")
        (_, length, _, magic, crc, attributes, last_delta, base_ts, _, pid, epoch, seq,
         count) = _HEAD.unpack_from(view, pos)
        end = pos + 12 + length
        if magic != _MAGIC:
            raise CorruptRecordError(f"{where}: record batch magic {magic}; only v2 (magic 2) batches are accepted")
        if length < HEAD_BYTES - 12 or end > len(view):
            raise CorruptRecordError(f"{where}: record batch length {length} does not fit the request")
        if crc32c(view[pos + _CRC_FROM:end]) != crc:
            raise CorruptRecordError(f"{where}: record batch CRC32C mismatch")
        if count < 1 or count > length:
            raise CorruptRecordError(f"{where}: record batch holds {count} records")
        body = view[pos + HEAD_BYTES:end]
        codec = attributes & _CODEC_MASK
        if codec:
            body = memoryview(_decompress(codec, body, budget, where))
            budget -= len(body)
        out.append(_decode_records(body, count, last_delta, base_ts, pid, epoch, seq, attributes, where))
        pos = end
    if not out:
        raise CorruptRecordError(f"{where}: no record batch")
    return out


def _decompress(codec: int, body: memoryview, budget: int, where: str) -> bytes:
    name = COMPRESSION_CODECS.get(codec)
    try:
        if name == "gzip":  # bounded as it inflates
            inflater = zlib.decompressobj(16 + zlib.MAX_WBITS)
            out = inflater.decompress(body, budget + 1)
        elif name == "snappy":
            out = _snappy(body)
        elif name == "lz4":
            import cramjam
            out = bytes(cramjam.lz4.decompress(body))
        elif name == "zstd":
            import cramjam
            out = bytes(cramjam.zstd.decompress(body))
        else:
            raise CorruptRecordError(f"{where}: unknown compression codec {codec}")
    except (zlib.error, gzip.BadGzipFile, ValueError, OSError) as e:
        raise CorruptRecordError(f"{where}: {name} records do not decompress: {e}") from None
    except Exception as e:  # cramjam raises its own DecompressionError
        if type(e).__name__ != "DecompressionError":
            raise
        raise CorruptRecordError(f"{where}: {name} records do not decompress: {e}") from None
    if len(out) > budget:
        raise RecordTooLargeError(
            f"{where}: the records inflate past the broker's max_decompressed_bytes ({budget} bytes left)")
    return out


def _snappy(body: memoryview) -> bytes:
    """Raw snappy, or Java's xerial framing (magic, version, compat, then length-prefixed blocks)."""
    import cramjam
    if bytes(body[:8]) != _XERIAL_MAGIC:
        return bytes(cramjam.snappy.decompress_raw(body))
    pos, parts = 16, []
    while pos < len(body):
        if pos + 4 > len(body):
            raise ValueError("truncated xerial snappy block length")
        (n,) = struct.unpack_from(">i", body, pos)
        if n < 0 or pos + 4 + n > len(body):
            raise ValueError("xerial snappy block overruns the batch")
        parts.append(bytes(cramjam.snappy.decompress_raw(body[pos + 4:pos + 4 + n])))
        pos += 4 + n
    return b"".join(parts)


def _bytes(view: memoryview, pos: int, where: str) -> tuple[bytes | None, int]:
    n, size = read_signed_varint(view, pos)
    pos += size
    if n < 0:
        if n != -1:
            raise CorruptRecordError(f"{where}: negative length {n} in a record")
        return None, pos
    if pos + n > len(view):
        raise CorruptRecordError(f"{where}: a record field overruns its batch")
    return bytes(view[pos:pos + n]), pos + n


def _decode_records(body: memoryview, count: int, last_delta: int, base_ts: int, pid: int, epoch: int,
                    seq: int, attributes: int, where: str) -> KafkaBatch:
    if last_delta != count - 1:
        raise CorruptRecordError(f"{where}: the records do not fill their batch as its header says")
    batch = functools.partial(KafkaBatch, producer_id=pid, producer_epoch=epoch, base_sequence=seq,
                              transactional=bool(attributes & _KAFKA_TRANSACTIONAL),
                              control=bool(attributes & _KAFKA_CONTROL))
    columns = read_records(body, count, where)
    if columns is not None:  # no headers: read as columns (record_vectors)
        return batch(timestamps_ms=pa.array(columns.timestamp_deltas + base_ts, pa.int64()), keys=columns.keys,
                     values=columns.values, headers=None)
    keys, values, timestamps, headers = _decode_one_by_one(body, count, base_ts, where)
    return batch(timestamps_ms=pa.array(timestamps, pa.int64()), keys=pa.array(keys, pa.binary()),
                 values=pa.array(values, pa.binary()),
                 headers=pa.array(headers, HEADERS_TYPE) if any(headers) else None)


def _decode_one_by_one(body: memoryview, count: int, base_ts: int, where: str) -> tuple[
        list[bytes | None], list[bytes | None], list[int], list[list[dict[str, object]] | None]]:
    """The records of a batch in which some record has headers, read one at a time."""
    timestamps: list[int] = []
    keys: list[bytes | None] = []
    values: list[bytes | None] = []
    headers: list[list[dict[str, object]] | None] = []
    pos = 0
    try:
        for i in range(count):
            length, size = read_signed_varint(body, pos)
            pos += size
            end = pos + length
            if length < 0 or end > len(body):
                raise CorruptRecordError(f"{where}: record {i} length {length} overruns its batch")
            pos += 1  # record attributes: unused
            ts_delta, size = read_signed_varlong(body, pos)
            pos += size
            offset_delta, size = read_signed_varint(body, pos)
            pos += size
            if offset_delta != i:
                raise CorruptRecordError(f"{where}: record {i} has offset delta {offset_delta}; a producer's "
                                         "deltas are 0, 1, 2, ...")
            key, pos = _bytes(body, pos, where)
            value, pos = _bytes(body, pos, where)
            n_headers, size = read_signed_varint(body, pos)
            pos += size
            if n_headers < 0 or n_headers > end - pos:
                raise CorruptRecordError(f"{where}: record {i} has {n_headers} headers")
            record_headers: list[dict[str, object]] = []
            for _ in range(n_headers):
                h_key, pos = _bytes(body, pos, where)
                h_value, pos = _bytes(body, pos, where)
                if h_key is None:
                    raise CorruptRecordError(f"{where}: record {i} has a header with a null key")
                record_headers.append({"key": h_key.decode(), "value": h_value})
            if pos != end:
                raise CorruptRecordError(f"{where}: record {i} is {length} bytes long but its fields are not")
            timestamps.append(base_ts + ts_delta)
            keys.append(key)
            values.append(value)
            headers.append(record_headers or None)
    except UnicodeDecodeError:
        raise CorruptRecordError(f"{where}: a record header key is not UTF-8") from None
    except (ValueError, IndexError, DecodeError) as e:  # kio's varint readers on a truncated body
        raise CorruptRecordError(f"{where}: a record does not parse ({e})") from None
    if pos != len(body):
        raise CorruptRecordError(f"{where}: the records do not fill their batch as its header says")
    return keys, values, timestamps, headers


def to_stored_records(batches: list[KafkaBatch], *, schema: pa.Schema | None = None,
                      values: list[pa.Array] | None = None) -> bytes:
    """The batches as a logstore produce's records: the schema message, then one stored
    batch each (offsets 0..n-1, for the log to assign). A control batch raises
    :class:`CorruptRecordError` (only the broker writes markers). By default the schema is
    the untyped one and the values are the bytes sent; a typed topic's records give its
    stored ``schema`` and each batch's ``values`` decoded into it (:mod:`.json_produce`)."""
    schema = untyped_schema() if schema is None else schema
    pieces = [encode_schema(schema)]
    for i, batch in enumerate(batches):
        if batch.control:
            raise CorruptRecordError("a producer may not write control batches (only the broker writes markers)")
        stored = build_batch(schema, values=batch.values if values is None else values[i],
                             timestamps_ms=batch.timestamps_ms, keys=batch.keys, headers=batch.headers)
        pieces.append(encode_batch(
            stored, base_offset=0, producer_id=batch.producer_id, producer_epoch=batch.producer_epoch,
            base_sequence=batch.base_sequence, attributes=ATTR_TRANSACTIONAL if batch.transactional else 0,
        ).to_bytes())
    return b"".join(pieces)


# --------------------------------------------------------------------------- fetch


def _zigzag(value: int, out: bytearray) -> None:
    value = (value << 1) ^ (value >> 63)
    value &= 0xFFFFFFFFFFFFFFFF
    while value > 0x7F:
        out.append((value & 0x7F) | 0x80)
        value >>= 7
    out.append(value)


def _put_bytes(value: bytes | None, out: bytearray) -> None:
    if value is None:
        _zigzag(-1, out)
    else:
        _zigzag(len(value), out)
        out += value


def to_kafka_batches(batches: list[tuple[StoredBatch, pa.RecordBatch]], *, log_append_time: bool = False) -> bytes:
    """Stored batches (each with its decoded records) as Kafka RecordBatch v2 bytes; with
    ``log_append_time`` (a LogAppendTime topic) their timestamp type says so. A typed topic's
    values become JSON objects (:mod:`.json_values`). Records without headers are written as
    columns (:func:`.record_vectors.write_records`), the others one at a time."""
    out = bytearray()
    for stored, records in batches:
        header = stored.header
        offsets = records.column(0).to_numpy()
        timestamps = records.column(1).cast(pa.int64()).to_numpy()
        base_ts = int(timestamps[0])
        body: bytes | bytearray
        if header.is_control:  # a transaction marker: Kafka's control record
            body = _records_one_by_one(
                offsets.tolist(), timestamps.tolist(), header.base_offset, base_ts,
                [struct.pack(">hh", 0, 0 if header.is_abort_marker else 1)],
                [struct.pack(">hi", 0, max(header.base_sequence, 0))], [None])
        else:
            keys, value_column, headers = records.column(2), records.column(3), records.column(4)
            values = (pa.array(json_values(value_column), pa.binary()) if pa.types.is_struct(value_column.type)
                      else value_column)  # a typed topic's values as JSON
            if headers.null_count == len(headers) or not pc.sum(pc.list_value_length(headers)).as_py():
                body = write_records(offsets - header.base_offset, timestamps - base_ts, keys, values)
            else:
                body = _records_one_by_one(offsets.tolist(), timestamps.tolist(), header.base_offset, base_ts,
                                           keys.to_pylist(), values.to_pylist(), headers.to_pylist())
        attributes = ((_KAFKA_TRANSACTIONAL if header.is_transactional else 0)
                      | (_KAFKA_CONTROL if header.is_control else 0)
                      | (_KAFKA_LOG_APPEND_TIME if log_append_time else 0))
        head = struct.pack(">hiqqqhii", attributes, header.last_offset_delta, base_ts, header.max_timestamp,
                           header.producer_id, header.producer_epoch, header.base_sequence, len(offsets))
        out += struct.pack(">qiibI", header.base_offset, len(head) + len(body) + 9, header.leader_epoch, _MAGIC,
                           crc32c(body, value=crc32c(head)))
        out += head
        out += body
    return bytes(out)


def _records_one_by_one(offsets: list[int], timestamps: list[int], base_offset: int, base_ts: int,
                        keys: list[bytes | None], values: list[bytes | None],
                        headers: list[list[dict[str, object]] | None]) -> bytearray:
    """Records (with headers, or a control record) as a batch body, one at a time."""
    body = bytearray()
    for offset, ts, key, value, record_headers in zip(offsets, timestamps, keys, values, headers, strict=True):
        record = bytearray(b"\x00")
        _zigzag(ts - base_ts, record)
        _zigzag(offset - base_offset, record)
        _put_bytes(key, record)
        _put_bytes(value, record)
        _zigzag(len(record_headers or ()), record)
        for h in record_headers or ():
            _put_bytes(str(h["key"]).encode(), record)
            _put_bytes(h["value"], record)  # type: ignore[arg-type]
        _zigzag(len(record), body)
        body += record
    return body
