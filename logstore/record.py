"""The record batch format: one logstore batch = one Arrow IPC record batch message.

Stored schema
-------------
Every stored batch has these columns, in this order::

    offset     int64, not null            the record's offset (absolute, not relative)
    timestamp  timestamp[ms, UTC], not null
    key        binary                     null for keyless records
    value      binary | struct<...>       binary for untyped topics, a struct of the
                                          topic's value columns for typed topics;
                                          a null value is a tombstone
    headers    list<struct<key: string, value: binary>>

A typed topic's value struct carries the Arrow schema the topic was created
with, stored natively (columnar). A segment read by any Arrow tool is
therefore self-describing.

Message layout (Arrow IPC encapsulated message, as written by pyarrow)::

    0xFFFFFFFF | int32 metadata_len | flatbuffer Message (+pad to 8) | body (bodyLength bytes)

The flatbuffer's ``custom_metadata`` carries the batch facts as decimal
strings under the ``logstore.*`` keys of :data:`FACT_KEYS`:
base offset, last offset delta, record count, max timestamp, partition
leader epoch, producer id / epoch / base sequence, attributes (bit flags:
:data:`ATTR_TRANSACTIONAL`, :data:`ATTR_CONTROL`, :data:`ATTR_ABORT_MARKER` — set on
a control batch that aborts, clear on one that commits — and the body compression in
bits 4-5), and ``logstore.crc``.

CRC
---
``logstore.crc`` is CRC32C (Castagnoli) over the whole message -- prefix,
flatbuffer metadata and body, with the CRC's own ten digits read as
``##########`` -- followed by the ASCII facts line ``"<base_offset>,
<last_offset_delta>,<record_count>,<max_timestamp>,<leader_epoch>,
<producer_id>,<producer_epoch>,<base_sequence>,<attributes>"``. It therefore
detects corruption of the records, of their layout (the lengths, null
counts and buffer positions in the metadata) *and* of the batch facts. It
is verified on append, on recovery, by brokers when they serve a batch, and
by consumers.

Offsets inside a batch strictly increase; gaps are allowed (compaction keeps
the survivors' offsets), so the next offset after a batch is
``base_offset + last_offset_delta + 1``, never ``base_offset + record_count``.

Thread-safety: pure functions and immutable values.
"""

from __future__ import annotations

import struct
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass

import crc32c
import numpy as np
import pyarrow as pa

from logstore.errors import CorruptRecordError, InvalidTimestampError, SchemaMismatchError

__all__ = [
    "TIMESTAMP_TYPE",
    "HEADERS_TYPE",
    "ATTR_TRANSACTIONAL",
    "ATTR_CONTROL",
    "ATTR_ABORT_MARKER",
    "NO_PRODUCER_ID",
    "NO_PRODUCER_EPOCH",
    "NO_SEQUENCE",
    "NO_LEADER_EPOCH",
    "FACT_KEYS",
    "BatchHeader",
    "EncodedBatch",
    "StoredBatch",
    "untyped_schema",
    "typed_schema",
    "is_typed_schema",
    "value_schema_of",
    "check_schema_evolution",
    "build_batch",
    "encode_batch",
    "encode_schema",
    "decode_schema",
    "parse_batch_at",
    "iter_batches",
    "MESSAGE_PREFIX_BYTES",
    "IncompleteBatchError",
    "decoded_body_size",
]

TIMESTAMP_TYPE = pa.timestamp("ms", tz="UTC")
HEADERS_TYPE = pa.list_(pa.struct([pa.field("key", pa.string()), pa.field("value", pa.binary())]))

ATTR_TRANSACTIONAL = 0x01
ATTR_CONTROL = 0x02
# On a control batch (a transaction marker): set = ABORT, clear = COMMIT.
ATTR_ABORT_MARKER = 0x04
_COMPRESSION_SHIFT = 4
_COMPRESSION_CODES = {None: 0, "lz4": 1, "zstd": 2}
_COMPRESSION_NAMES = {v: k for k, v in _COMPRESSION_CODES.items()}

NO_PRODUCER_ID = -1
NO_PRODUCER_EPOCH = -1
NO_SEQUENCE = -1
NO_LEADER_EPOCH = -1

FACT_KEYS = (
    "logstore.base_offset",
    "logstore.last_offset_delta",
    "logstore.record_count",
    "logstore.max_timestamp",
    "logstore.storage.leader_epoch",
    "logstore.producer_id",
    "logstore.producer_epoch",
    "logstore.base_sequence",
    "logstore.attributes",
)
_CRC_KEY = "logstore.crc"
_CRC_KEY_BYTES = _CRC_KEY.encode()
# Stand-in for the CRC while the message is serialized; patched in place after.
_CRC_PLACEHOLDER = b"##########"
_CONTINUATION = 0xFFFFFFFF
MESSAGE_PREFIX_BYTES = 8
_PREFIX = struct.Struct("<Ii")
_SCHEMA_VERSION_KEY = b"logstore.format"
_FIXED_FIELDS = ("offset", "timestamp", "key", "value", "headers")
# Arrow's MessageHeader union tags.
_HEADER_SCHEMA = 1
_HEADER_RECORD_BATCH = 3


# --------------------------------------------------------------------------- schemas


def _schema(value_type: pa.DataType) -> pa.Schema:
    return pa.schema(
        [
            pa.field("offset", pa.int64(), nullable=False),
            pa.field("timestamp", TIMESTAMP_TYPE, nullable=False),
            pa.field("key", pa.binary()),
            pa.field("value", value_type),
            pa.field("headers", HEADERS_TYPE),
        ],
        metadata={_SCHEMA_VERSION_KEY: b"1"},
    )


def untyped_schema() -> pa.Schema:
    """The stored schema of an untyped topic: key and value are opaque bytes."""
    return _schema(pa.binary())


def typed_schema(value_schema: pa.Schema) -> pa.Schema:
    """The stored schema of a typed topic whose values have ``value_schema``."""
    if len(value_schema) == 0:
        raise SchemaMismatchError("a typed topic needs at least one value column")
    names = value_schema.names
    if len(set(names)) != len(names):
        raise SchemaMismatchError(f"value column names must be unique, got {names}")
    return _schema(pa.struct(list(value_schema)))


def is_typed_schema(schema: pa.Schema) -> bool:
    return pa.types.is_struct(schema.field("value").type)


def value_schema_of(schema: pa.Schema) -> pa.Schema | None:
    """The value columns of a typed stored schema, or None for an untyped one."""
    value_type = schema.field("value").type
    if not pa.types.is_struct(value_type):
        return None
    return pa.schema([value_type.field(i) for i in range(value_type.num_fields)])


def _check_stored_shape(schema: pa.Schema) -> None:
    """Raise :class:`SchemaMismatchError` unless ``schema`` has the stored columns and types."""
    if tuple(schema.names) != _FIXED_FIELDS:
        raise SchemaMismatchError(
            f"a batch must have columns {list(_FIXED_FIELDS)} in that order, got {schema.names}"
        )
    reference = untyped_schema()
    for name in ("offset", "timestamp", "key", "headers"):
        want, got = reference.field(name), schema.field(name)
        if not got.equals(want):
            raise SchemaMismatchError(
                f"column {name!r} must be {want.type}{'' if want.nullable else ' not null'}, "
                f"got {got.type}{'' if got.nullable else ' not null'}"
            )
    value_type = schema.field("value").type
    if not (pa.types.is_binary(value_type) or pa.types.is_struct(value_type)):
        raise SchemaMismatchError(
            f"column 'value' must be binary or a struct of value columns, got {value_type}"
        )


def check_schema_evolution(current: pa.Schema, proposed: pa.Schema) -> bool:
    """Decide whether batches of ``proposed`` may follow batches of ``current``.

    Returns False when the schemas are equal (no evolution), True when
    ``proposed`` is a compatible evolution (the typed value struct gains
    nullable fields at its end, nothing else changes), and raises
    :class:`SchemaMismatchError` saying what differs otherwise.
    """
    if proposed.equals(current, check_metadata=False):
        return False  # ``current`` is a stored schema already
    _check_stored_shape(proposed)
    for name in ("offset", "timestamp", "key", "headers"):
        if not proposed.field(name).equals(current.field(name)):
            raise SchemaMismatchError(
                f"column {name!r} has type {proposed.field(name).type}, "
                f"the topic stores {current.field(name).type}"
            )
    old_v, new_v = current.field("value").type, proposed.field("value").type
    if not (pa.types.is_struct(old_v) and pa.types.is_struct(new_v)):
        raise SchemaMismatchError(
            f"value type {new_v} does not match the topic's value type {old_v}"
        )
    old_fields = [old_v.field(i) for i in range(old_v.num_fields)]
    new_fields = [new_v.field(i) for i in range(new_v.num_fields)]
    if len(new_fields) < len(old_fields) or any(
        not a.equals(b) for a, b in zip(old_fields, new_fields, strict=False)
    ):
        raise SchemaMismatchError(
            "incompatible schema change: existing value columns must keep their names, "
            f"types and order; topic has {old_v}, batch has {new_v}"
        )
    added = new_fields[len(old_fields):]
    not_nullable = [f.name for f in added if not f.nullable]
    if not_nullable:
        raise SchemaMismatchError(
            f"added value columns must be nullable; {not_nullable} are not"
        )
    return True


def build_batch(
    schema: pa.Schema,
    *,
    values: pa.Array | Sequence[object],
    timestamps_ms: pa.Array | Sequence[int] | np.ndarray,
    keys: pa.Array | Sequence[bytes | None] | None = None,
    headers: pa.Array | Sequence[object] | None = None,
) -> pa.RecordBatch:
    """Assemble a batch of ``schema`` with placeholder offsets ``0..n-1``.

    ``encode_batch`` replaces the offsets; producers use this to build what
    they send, tests to build what they append.
    """
    n = len(values)
    value_arr = values if isinstance(values, pa.Array) else pa.array(values, schema.field("value").type)
    ts = timestamps_ms if isinstance(timestamps_ms, pa.Array) else pa.array(np.asarray(timestamps_ms, dtype=np.int64))
    if ts.type != TIMESTAMP_TYPE:
        ts = ts.cast(TIMESTAMP_TYPE)
    key_arr = (
        pa.nulls(n, pa.binary()) if keys is None
        else keys if isinstance(keys, pa.Array) else pa.array(keys, pa.binary())
    )
    header_arr = (
        pa.nulls(n, HEADERS_TYPE) if headers is None
        else headers if isinstance(headers, pa.Array) else pa.array(headers, HEADERS_TYPE)
    )
    offsets = pa.array(np.arange(n, dtype=np.int64))
    return pa.RecordBatch.from_arrays([offsets, ts, key_arr, value_arr, header_arr], schema=schema)


# --------------------------------------------------------------------------- batch facts


@dataclass(frozen=True, slots=True)
class BatchHeader:
    """The facts of one stored batch (see the module docstring for their encoding)."""

    base_offset: int
    last_offset_delta: int
    record_count: int
    max_timestamp: int
    leader_epoch: int = NO_LEADER_EPOCH
    producer_id: int = NO_PRODUCER_ID
    producer_epoch: int = NO_PRODUCER_EPOCH
    base_sequence: int = NO_SEQUENCE
    attributes: int = 0
    crc: int = 0

    @property
    def last_offset(self) -> int:
        return self.base_offset + self.last_offset_delta

    @property
    def next_offset(self) -> int:
        """The offset after this batch's last record (exclusive end)."""
        return self.base_offset + self.last_offset_delta + 1

    @property
    def is_transactional(self) -> bool:
        return bool(self.attributes & ATTR_TRANSACTIONAL)

    @property
    def is_control(self) -> bool:
        return bool(self.attributes & ATTR_CONTROL)

    @property
    def is_abort_marker(self) -> bool:
        return self.is_control and bool(self.attributes & ATTR_ABORT_MARKER)

    @property
    def compression(self) -> str | None:
        return _COMPRESSION_NAMES.get((self.attributes >> _COMPRESSION_SHIFT) & 0x3)

    def facts_line(self) -> bytes:
        return (
            f"{self.base_offset},{self.last_offset_delta},{self.record_count},"
            f"{self.max_timestamp},{self.leader_epoch},{self.producer_id},"
            f"{self.producer_epoch},{self.base_sequence},{self.attributes}"
        ).encode()

    def custom_metadata(self) -> dict[str, str]:
        values = (
            self.base_offset, self.last_offset_delta, self.record_count, self.max_timestamp,
            self.leader_epoch, self.producer_id, self.producer_epoch, self.base_sequence,
            self.attributes,
        )
        md = {k: str(v) for k, v in zip(FACT_KEYS, values, strict=True)}
        md[_CRC_KEY] = _CRC_PLACEHOLDER.decode()
        return md

    @classmethod
    def from_custom_metadata(cls, md: dict[bytes, bytes], *, where: str) -> BatchHeader:
        try:
            vals = [int(md[k.encode()]) for k in FACT_KEYS]
            crc = int(md[_CRC_KEY.encode()])
        except (KeyError, ValueError) as e:
            raise CorruptRecordError(f"{where}: batch metadata is missing or malformed ({e})") from None
        base, delta, count, max_ts, epoch, pid, p_epoch, sequence, attributes = vals
        return cls(base, delta, count, max_ts, epoch, pid, p_epoch, sequence, attributes, crc=crc)


@dataclass(frozen=True, slots=True)
class EncodedBatch:
    """A batch serialized for storage: ``head`` (prefix + metadata) then its body.

    The body is ``body_pieces``: the batch's Arrow buffers and their padding
    as Arrow's IPC writer hands them out -- for an uncompressed batch,
    zero-copy views of the input batch's memory. Writing ``head`` and the
    pieces back to back (``os.pwritev``) stores the message without copying
    the body; ``body`` and ``to_bytes()`` join them (one copy).
    """

    header: BatchHeader
    head: bytes
    body_pieces: tuple[bytes | memoryview | pa.Buffer, ...]
    body_size: int

    @property
    def size(self) -> int:
        return len(self.head) + self.body_size

    @property
    def body(self) -> memoryview:
        return memoryview(b"".join(self.body_pieces))

    def to_bytes(self) -> bytes:
        return b"".join((self.head, *self.body_pieces))


class _PieceSink:
    """A write-only stream for ``pyarrow.ipc`` that keeps the pieces it is given.

    Arrow passes a batch's body buffers as ``pyarrow.Buffer`` objects (views of
    the batch's memory, or of the compressed copies) and the rest as small
    ``bytes``, so nothing is copied into one contiguous stream.
    """

    __slots__ = ("pieces", "size", "closed")

    def __init__(self) -> None:
        self.pieces: list[bytes | pa.Buffer] = []
        self.size = 0
        self.closed = False

    def write(self, data: bytes | pa.Buffer) -> int:
        self.pieces.append(data)
        self.size += len(data)
        return len(data)

    def flush(self) -> None:
        pass

    def close(self) -> None:
        self.closed = True

    def tell(self) -> int:
        return self.size


def _split_pieces(
    pieces: list[bytes | memoryview | pa.Buffer], at: int
) -> tuple[list[bytes | memoryview | pa.Buffer], list[bytes | memoryview | pa.Buffer]]:
    """The pieces holding bytes ``[0, at)`` and those holding the rest (one piece may be sliced)."""
    pos = 0
    for i, piece in enumerate(pieces):
        n = len(piece)
        if pos + n > at:
            cut = at - pos
            if not cut:
                return pieces[:i], pieces[i:]
            view = memoryview(piece)
            return [*pieces[:i], view[:cut]], [view[cut:], *pieces[i + 1:]]
        pos += n
    return pieces, []


def _attributes(attributes: int, compression: str | None) -> int:
    if compression not in _COMPRESSION_CODES:
        raise ValueError(f"unknown compression {compression!r}; use lz4, zstd or None")
    return (attributes & 0x0F) | (_COMPRESSION_CODES[compression] << _COMPRESSION_SHIFT)


def encode_batch(
    batch: pa.RecordBatch,
    *,
    base_offset: int,
    offsets: np.ndarray | None = None,
    leader_epoch: int = NO_LEADER_EPOCH,
    producer_id: int = NO_PRODUCER_ID,
    producer_epoch: int = NO_PRODUCER_EPOCH,
    base_sequence: int = NO_SEQUENCE,
    attributes: int = 0,
    compression: str | None = None,
) -> EncodedBatch:
    """Serialize ``batch`` as a stored message with offsets assigned.

    Offsets become ``base_offset, base_offset+1, ...`` unless ``offsets``
    (strictly increasing, first == base_offset) preserves existing ones.
    The batch must have the stored columns (see :func:`untyped_schema`);
    a null timestamp raises :class:`InvalidTimestampError`.
    """
    n = batch.num_rows
    if n == 0:
        raise CorruptRecordError("a batch must contain at least one record")
    nulls = batch.column(1).null_count
    if nulls:
        raise InvalidTimestampError(
            f"{nulls} of {n} records have a null timestamp; every record needs one"
        )
    if offsets is None:
        offsets = np.arange(base_offset, base_offset + n, dtype=np.int64)
    elif len(offsets) != n or offsets[0] != base_offset or (n > 1 and np.any(np.diff(offsets) <= 0)):
        raise ValueError("offsets must have one entry per record, start at base_offset and increase")
    columns = batch.columns
    columns[0] = pa.array(offsets, pa.int64())
    stored = pa.RecordBatch.from_arrays(columns, schema=batch.schema)
    # Timestamps have no nulls (checked above): view them as int64 without a copy.
    max_ts = stored.column(1).view(pa.int64()).to_numpy().max()
    header = BatchHeader(
        base_offset=base_offset,
        last_offset_delta=int(offsets[-1]) - base_offset,
        record_count=n,
        max_timestamp=int(max_ts),
        leader_epoch=leader_epoch,
        producer_id=producer_id,
        producer_epoch=producer_epoch,
        base_sequence=base_sequence,
        attributes=_attributes(attributes, compression),
    )
    sink = _PieceSink()
    options = pa.ipc.IpcWriteOptions(compression=compression)
    writer = pa.ipc.new_stream(sink, stored.schema, options=options)
    writer.write_batch(stored, custom_metadata=header.custom_metadata())
    pieces, message_end = list(sink.pieces), sink.size
    writer.close()  # appends the end-of-stream marker to the sink, after ``pieces``
    # The stream is the schema message (prefix + metadata, no body), then the batch message.
    prefix, _ = _split_pieces(pieces, MESSAGE_PREFIX_BYTES)
    schema_end = MESSAGE_PREFIX_BYTES + _PREFIX.unpack(b"".join(prefix))[1]
    _, message = _split_pieces(pieces, schema_end)
    prefix, _ = _split_pieces(message, MESSAGE_PREFIX_BYTES)
    head_len = MESSAGE_PREFIX_BYTES + _PREFIX.unpack(b"".join(prefix))[1]
    head_pieces, body_pieces = _split_pieces(message, head_len)
    head = bytearray(b"".join(head_pieces))
    at = head.find(_CRC_PLACEHOLDER)
    if at < 0 or head.find(_CRC_PLACEHOLDER, at + 1) >= 0:
        raise AssertionError("CRC placeholder must occur exactly once in the batch metadata")
    crc = crc32c.crc32c(head)
    for piece in body_pieces:
        crc = crc32c.crc32c(piece, value=crc)
    crc = crc32c.crc32c(header.facts_line(), value=crc)
    head[at:at + len(_CRC_PLACEHOLDER)] = b"%010d" % crc
    return EncodedBatch(
        header=_with_crc(header, crc), head=bytes(head), body_pieces=tuple(body_pieces),
        body_size=message_end - schema_end - head_len,
    )


def _with_crc(header: BatchHeader, crc: int) -> BatchHeader:
    return BatchHeader(
        header.base_offset, header.last_offset_delta, header.record_count, header.max_timestamp,
        header.leader_epoch, header.producer_id, header.producer_epoch, header.base_sequence,
        header.attributes, crc=crc,
    )


def encode_schema(schema: pa.Schema) -> bytes:
    """The Arrow IPC schema message that starts every segment file."""
    return schema.serialize().to_pybytes()


def decode_schema(data: bytes | memoryview, *, where: str = "schema") -> tuple[pa.Schema, int]:
    """Read the schema message at the start of ``data``; return it and its size in bytes.

    Raises :class:`CorruptRecordError` if the bytes are not a schema message and
    :class:`SchemaMismatchError` if the schema lacks the stored columns and types.
    """
    if len(data) < MESSAGE_PREFIX_BYTES:
        raise CorruptRecordError(f"{where}: schema message is truncated ({len(data)} bytes)")
    marker, meta_len = _PREFIX.unpack_from(data, 0)
    if marker != _CONTINUATION or meta_len <= 0 or MESSAGE_PREFIX_BYTES + meta_len > len(data):
        raise CorruptRecordError(f"{where}: no valid schema message at the start")
    size = MESSAGE_PREFIX_BYTES + meta_len
    try:
        schema = pa.ipc.read_schema(pa.py_buffer(bytes(data[:size])))
        _check_stored_shape(schema)  # decodes the field names: UnicodeDecodeError if damaged
    except (pa.ArrowException, OSError, ValueError) as e:
        raise CorruptRecordError(f"{where}: schema message does not parse: {e}") from None
    return schema, size


# --------------------------------------------------------------------------- parsing


class _FlatTable:
    """Just enough of a flatbuffers reader for Arrow's ``Message`` table."""

    __slots__ = ("buf", "pos", "vt", "vt_len")

    def __init__(self, buf: memoryview, pos: int) -> None:
        self.buf = buf
        self.pos = pos
        self.vt = pos - struct.unpack_from("<i", buf, pos)[0]
        self.vt_len = struct.unpack_from("<H", buf, self.vt)[0]

    def _field(self, index: int) -> int:
        at = 4 + 2 * index
        if at >= self.vt_len:
            return 0
        off: int = struct.unpack_from("<H", self.buf, self.vt + at)[0]
        return self.pos + off if off else 0

    def scalar(self, index: int, fmt: str, default: int) -> int:
        at = self._field(index)
        return struct.unpack_from(fmt, self.buf, at)[0] if at else default

    def _ref(self, index: int) -> int:
        at = self._field(index)
        return at + struct.unpack_from("<I", self.buf, at)[0] if at else 0

    def string(self, index: int) -> bytes:
        at = self._ref(index)
        if not at:
            return b""
        n = struct.unpack_from("<I", self.buf, at)[0]
        return bytes(self.buf[at + 4: at + 4 + n])

    def table(self, index: int) -> _FlatTable | None:
        at = self._ref(index)
        return _FlatTable(self.buf, at) if at else None

    def structs(self, index: int, fmt: struct.Struct) -> list[tuple[int, ...]]:
        at = self._ref(index)
        if not at:
            return []
        n = struct.unpack_from("<I", self.buf, at)[0]
        return [fmt.unpack_from(self.buf, at + 4 + i * fmt.size) for i in range(n)]

    def tables(self, index: int) -> list[_FlatTable]:
        at = self._ref(index)
        if not at:
            return []
        n = struct.unpack_from("<I", self.buf, at)[0]
        out = []
        for i in range(n):
            elem = at + 4 + 4 * i
            out.append(_FlatTable(self.buf, elem + struct.unpack_from("<I", self.buf, elem)[0]))
        return out


def _crc_digits_at(meta: memoryview) -> int:
    """Where in ``meta`` (an Arrow ``Message`` flatbuffer) the ten CRC digits start; -1 if absent."""
    root = _FlatTable(meta, struct.unpack_from("<I", meta, 0)[0])
    for kv in root.tables(4):
        if kv.string(0) == _CRC_KEY_BYTES:
            at = kv._ref(1)
            if at and struct.unpack_from("<I", meta, at)[0] == len(_CRC_PLACEHOLDER):
                return at + 4
            return -1
    return -1


def _parse_message_metadata(meta: memoryview) -> tuple[int, int, dict[bytes, bytes]]:
    """(header type, body length, custom metadata) of an Arrow ``Message`` flatbuffer."""
    root = _FlatTable(meta, struct.unpack_from("<I", meta, 0)[0])
    header_type = root.scalar(1, "<B", 0)
    body_len = root.scalar(3, "<q", 0)
    custom = {kv.string(0): kv.string(1) for kv in root.tables(4)}
    return header_type, body_len, custom


@dataclass(frozen=True, slots=True)
class StoredBatch:
    """One stored batch message: its facts, where it sits, and its bytes.

    ``data`` is the whole message (zero-copy view of what was read);
    ``position`` is its byte position in the segment file it came from.
    """

    header: BatchHeader
    position: int
    data: memoryview
    body_start: int

    @property
    def size(self) -> int:
        return len(self.data)

    def verify_crc(self, *, where: str = "batch") -> None:
        """Raise :class:`CorruptRecordError` if the CRC32C does not match."""
        data = self.data
        try:
            at = _crc_digits_at(data[MESSAGE_PREFIX_BYTES: self.body_start])
        except (struct.error, IndexError):
            at = -1
        if at < 0:
            raise CorruptRecordError(
                f"{where}: the batch at offset {self.header.base_offset} (position "
                f"{self.position}) has no well-formed CRC in its metadata"
            )
        at += MESSAGE_PREFIX_BYTES
        crc = crc32c.crc32c(data[:at])
        crc = crc32c.crc32c(_CRC_PLACEHOLDER, value=crc)
        crc = crc32c.crc32c(data[at + len(_CRC_PLACEHOLDER):], value=crc)
        crc = crc32c.crc32c(self.header.facts_line(), value=crc)
        if crc != self.header.crc:
            raise CorruptRecordError(
                f"{where}: CRC32C mismatch for the batch at offset {self.header.base_offset} "
                f"(position {self.position}): stored {self.header.crc}, computed {crc}"
            )

    def decode(self, schema: pa.Schema, *, validate: bool = False) -> pa.RecordBatch:
        """The Arrow record batch (zero-copy for uncompressed bodies)."""
        try:
            message = pa.ipc.read_message(pa.py_buffer(self.data))
            batch = pa.ipc.read_record_batch(message, schema)
            if validate:
                batch.validate(full=True)
        except (pa.ArrowException, OSError, ValueError) as e:
            raise CorruptRecordError(
                f"batch at offset {self.header.base_offset} does not decode with the "
                f"segment schema: {e}"
            ) from None
        return batch


class IncompleteBatchError(CorruptRecordError):
    """The bytes end before the batch message does (a torn tail, or a short read).

    ``needed`` is the number of bytes from the batch's start that the message
    needs, when the header says it (else 0).
    """

    def __init__(self, message: str, *, needed: int = 0) -> None:
        super().__init__(message)
        self.needed = needed

    def __reduce__(self) -> tuple[Callable[..., IncompleteBatchError], tuple[str, int]]:  # type: ignore[override]
        return (_rebuild_incomplete, (self.message, self.needed))


def _rebuild_incomplete(message: str, needed: int) -> IncompleteBatchError:
    return IncompleteBatchError(message, needed=needed)


def parse_batch_at(data: memoryview, pos: int, *, where: str = "segment",
                   base_position: int = 0) -> StoredBatch:
    """Parse the batch message that starts at ``data[pos]``.

    ``base_position`` is the file position of ``data[0]``: the batch and
    error messages report file positions. Raises :class:`CorruptRecordError`
    if the bytes there are not a complete, well-formed batch message (a torn
    tail is reported the same way; callers that recover decide what to do
    with it). Does not check the CRC.
    """
    end = len(data)
    at = base_position + pos
    if pos + MESSAGE_PREFIX_BYTES > end:
        raise IncompleteBatchError(f"{where}: truncated batch prefix at position {at}")
    marker, meta_len = _PREFIX.unpack_from(data, pos)
    if marker != _CONTINUATION or meta_len <= 0 or meta_len % 8:
        raise CorruptRecordError(
            f"{where}: no batch message at position {at} (marker {marker:#x}, metadata length {meta_len})"
        )
    meta_end = pos + MESSAGE_PREFIX_BYTES + meta_len
    if meta_end > end:
        raise IncompleteBatchError(
            f"{where}: truncated batch metadata at position {at}", needed=meta_end - pos
        )
    try:
        header_type, body_len, custom = _parse_message_metadata(data[pos + MESSAGE_PREFIX_BYTES: meta_end])
    except (struct.error, IndexError) as e:
        raise CorruptRecordError(f"{where}: malformed batch metadata at position {at}: {e}") from None
    if header_type != _HEADER_RECORD_BATCH or body_len < 0:
        raise CorruptRecordError(
            f"{where}: message at position {at} is not a record batch (type {header_type})"
        )
    msg_end = meta_end + body_len
    if msg_end > end:
        raise IncompleteBatchError(
            f"{where}: truncated batch body at position {at} (needs {msg_end - pos} bytes, "
            f"{end - pos} present)",
            needed=msg_end - pos,
        )
    header = BatchHeader.from_custom_metadata(custom, where=f"{where} position {at}")
    if header.record_count <= 0 or header.last_offset_delta < header.record_count - 1:
        raise CorruptRecordError(
            f"{where}: batch at position {at} has impossible counts "
            f"(record_count {header.record_count}, last_offset_delta {header.last_offset_delta})"
        )
    return StoredBatch(header=header, position=at, data=data[pos:msg_end], body_start=meta_end - pos)


def iter_batches(data: memoryview, *, start: int = 0, base_position: int = 0,
                 where: str = "segment") -> Iterator[StoredBatch]:
    """Parse consecutive batch messages from ``data[start:]`` until its end.

    ``base_position`` is the file position of ``data[0]``; yielded batches
    report file positions. Raises :class:`CorruptRecordError` at the first
    message that is incomplete or malformed.
    """
    pos = start
    end = len(data)
    while pos < end:
        batch = parse_batch_at(data, pos, where=where, base_position=base_position)
        yield batch
        pos += batch.size


_BUFFER = struct.Struct("<qq")


def decoded_body_size(batch: StoredBatch) -> int:
    """How many bytes the batch's buffers occupy once decompressed.

    For an uncompressed body this is the body length. For a compressed body
    each buffer starts with its uncompressed length (int64, -1 = stored
    uncompressed), which is summed *without* decompressing anything, so a
    broker can refuse a small request that would inflate to gigabytes.
    Raises :class:`CorruptRecordError` when the layout is inconsistent.
    """
    body = batch.data[batch.body_start:]
    if batch.header.compression is None:
        return len(body)
    meta = batch.data[MESSAGE_PREFIX_BYTES: batch.body_start]
    try:
        root = _FlatTable(meta, struct.unpack_from("<I", meta, 0)[0])
        rb = root.table(2)
        if rb is None:
            raise CorruptRecordError("record batch message has no header")
        total = 0
        for offset, length in rb.structs(2, _BUFFER):
            if offset < 0 or length < 0 or offset + length > len(body):
                raise CorruptRecordError(
                    f"batch at offset {batch.header.base_offset}: buffer ({offset}, {length}) "
                    f"lies outside the {len(body)}-byte body"
                )
            if length == 0:
                continue
            if length < 8:
                raise CorruptRecordError(
                    f"batch at offset {batch.header.base_offset}: compressed buffer shorter than its length prefix"
                )
            raw = struct.unpack_from("<q", body, offset)[0]
            total += length - 8 if raw == -1 else raw
            if raw < -1:
                raise CorruptRecordError(
                    f"batch at offset {batch.header.base_offset}: negative uncompressed length {raw}"
                )
        return total
    except (struct.error, IndexError) as e:
        raise CorruptRecordError(f"malformed record batch metadata: {e}") from None
