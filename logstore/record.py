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

Batch facts (format 2)
----------------------
The flatbuffer's ``custom_metadata`` carries the batch facts as one ASCII
string of fixed width under the key ``logstore.batch``
(:data:`logstore.record_layout.FACT_FIELDS`): the format version ``2``, then
base offset, leader epoch, last offset delta, record count, max timestamp,
producer id / epoch / base sequence, attributes (bit flags:
:data:`ATTR_TRANSACTIONAL`, :data:`ATTR_CONTROL`, :data:`ATTR_ABORT_MARKER` — set on
a control batch that aborts, clear on one that commits — and the body
compression in bits 4-5) and the CRC, separated by single spaces. Signed
fields are zero-padded with their sign (``+00000000000000000042``).

Fixed widths let the broker store a producer's batch as it was sent and
patch in place only what it owns: the base offset and leader epoch digits,
the offset column's values (``base_offset + i``: the producer writes
``0..n-1``), and — on LogAppendTime topics only — the timestamps and max
timestamp. Any Arrow reader (``pyarrow.ipc.open_stream`` on a segment) sees
absolute offsets.

CRC
---
The CRC is CRC32C (Castagnoli) over the whole message except the base offset
and leader epoch digits and its own ten digits, with the offset column's
values read relative to the base offset
(:func:`logstore.record_layout.crc_v2`): like Kafka's CRC, which leaves out
base offset and leader epoch and covers offset deltas, it survives the
broker's patches unchanged while covering every byte the producer wrote —
the records, their layout (lengths, null counts, buffer positions), the
producer's facts — and the offsets. A LogAppendTime topic rewrites
timestamps, which the CRC covers: its broker computes the CRC again. It is verified on append, on recovery, by brokers
when they serve a batch, and by consumers.

Format 1 (segments written before format 2, read but no longer written) kept
each fact as a decimal string under its own ``logstore.*`` key
(:data:`FACT_KEYS`) and a CRC over the whole message followed by a facts line;
readers accept both (:mod:`logstore.record_reader`).

Offsets inside a batch strictly increase; gaps are allowed (compaction keeps
the survivors' offsets), so the next offset after a batch is
``base_offset + last_offset_delta + 1``, never ``base_offset + record_count``.

This module writes batches and schema messages (and reads schema messages);
stored batch messages are read back, zero-copy, by :mod:`logstore.record_reader`.

Thread-safety: pure functions and immutable values.
"""

from __future__ import annotations

import dataclasses
import struct
import threading
from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np
import pyarrow as pa

from logstore.errors import CorruptRecordError, InvalidTimestampError, SchemaMismatchError
from logstore.record_layout import (
    FACT_FIELDS,
    FACT_SLICES,
    FACTS_KEY,
    FACTS_LENGTH,
    FORMAT_VERSION,
    crc_v2,
    locate,
)

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
    "untyped_schema",
    "typed_schema",
    "is_typed_schema",
    "value_schema_of",
    "check_schema_evolution",
    "build_batch",
    "encode_batch",
    "encode_schema",
    "with_producer",
    "decode_schema",
    "MESSAGE_PREFIX_BYTES",
    "MESSAGE_PREFIX",
    "CONTINUATION_MARKER",
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

# Format 1's keys, one per fact (read, no longer written; see the module docstring).
FACT_KEYS = (
    "logstore.base_offset",
    "logstore.last_offset_delta",
    "logstore.record_count",
    "logstore.max_timestamp",
    "logstore.leader_epoch",
    "logstore.producer_id",
    "logstore.producer_epoch",
    "logstore.base_sequence",
    "logstore.attributes",
)
# A message starts with MESSAGE_PREFIX: CONTINUATION_MARKER, then the metadata length.
CONTINUATION_MARKER = 0xFFFFFFFF
MESSAGE_PREFIX_BYTES = 8
MESSAGE_PREFIX = struct.Struct("<Ii")
_SCHEMA_VERSION_KEY = b"logstore.format"
_FIXED_FIELDS = ("offset", "timestamp", "key", "value", "headers")
_FACT_SEPARATORS = tuple(FACT_SLICES[name].stop for name, _ in FACT_FIELDS[:-1])


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

    def with_crc(self, crc: int) -> BatchHeader:
        return dataclasses.replace(self, crc=crc)

    def facts(self, *, crc: int | None = None) -> bytes:
        """The format-2 facts string (see the module docstring); ``crc`` defaults to this header's."""
        values = (
            FORMAT_VERSION, self.base_offset, self.leader_epoch, self.last_offset_delta,
            self.record_count, self.max_timestamp, self.producer_id, self.producer_epoch,
            self.base_sequence, self.attributes,
        )
        fields = [b"%d" % FORMAT_VERSION] + [
            b"%+0*d" % (width, value) for (_, width), value in zip(FACT_FIELDS[1:-1], values[1:], strict=True)
        ]
        fields.append(b"%010d" % (self.crc if crc is None else crc))
        out = b" ".join(fields)
        if len(out) != FACTS_LENGTH:
            raise ValueError(f"batch facts out of range: {self}")
        return out

    @classmethod
    def from_facts(cls, facts: bytes, *, where: str) -> BatchHeader:
        """Parse a format-2 facts string."""
        try:
            if len(facts) != FACTS_LENGTH or facts[:1] != b"%d" % FORMAT_VERSION:
                raise ValueError(f"{len(facts)} bytes, version {facts[:1]!r}")
            if any(facts[i] != 0x20 for i in _FACT_SEPARATORS):
                raise ValueError("fields are not separated by single spaces")
            sl = FACT_SLICES
            return cls(
                base_offset=int(facts[sl["base_offset"]]), last_offset_delta=int(facts[sl["last_offset_delta"]]),
                record_count=int(facts[sl["record_count"]]), max_timestamp=int(facts[sl["max_timestamp"]]),
                leader_epoch=int(facts[sl["leader_epoch"]]), producer_id=int(facts[sl["producer_id"]]),
                producer_epoch=int(facts[sl["producer_epoch"]]), base_sequence=int(facts[sl["base_sequence"]]),
                attributes=int(facts[sl["attributes"]]), crc=int(facts[sl["crc"]]),
            )
        except ValueError as e:
            raise CorruptRecordError(f"{where}: batch facts are malformed ({e})") from None

    def facts_line(self) -> bytes:
        """The facts as format 1's CRC covered them (format-1 batches only)."""
        return (
            f"{self.base_offset},{self.last_offset_delta},{self.record_count},"
            f"{self.max_timestamp},{self.leader_epoch},{self.producer_id},"
            f"{self.producer_epoch},{self.base_sequence},{self.attributes}"
        ).encode()

    @classmethod
    def from_v1_metadata(cls, md: dict[bytes, bytes], *, where: str) -> BatchHeader:
        """Parse the facts of a format-1 batch (one ``logstore.*`` key per fact)."""
        try:
            vals = [int(md[k.encode()]) for k in FACT_KEYS]
            crc = int(md[b"logstore.crc"])
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


class _BatchWriter:
    """An Arrow IPC stream writer kept open for one schema and compression, whose batch
    messages are taken from its sink one at a time.

    Opening a stream writes the schema message; a writer kept open writes only the batch
    message for each batch, the same bytes a new stream's batch message would be: the sink
    starts each batch at position 0, as the batch message of a new stream starts at the end
    of a schema message, a multiple of 8 (the alignment the writer pads to). This saves
    about a third of the CPU of encoding a small batch (a producer's one-record batches).
    """

    __slots__ = ("schema", "compression", "_sink", "_writer")

    def __init__(self, schema: pa.Schema, compression: str | None) -> None:
        self.schema = schema
        self.compression = compression
        self._sink = _PieceSink()
        self._writer = pa.ipc.new_stream(self._sink, schema, options=pa.ipc.IpcWriteOptions(compression=compression))
        # The schema message goes out with the stream's first batch: send it now, with an empty one.
        self._writer.write_batch(pa.RecordBatch.from_pylist([], schema=schema))

    def write(self, batch: pa.RecordBatch, metadata: dict[str, str]) -> tuple[list[bytes | pa.Buffer], int]:
        """The pieces of ``batch``'s IPC message (prefix, metadata, body) and their total size."""
        sink = self._sink
        sink.pieces, sink.size = [], 0
        self._writer.write_batch(batch, custom_metadata=metadata)
        return sink.pieces, sink.size


_WRITERS = threading.local()
_WRITERS_PER_THREAD = 8


def _batch_writer(schema: pa.Schema, compression: str | None) -> _BatchWriter:
    """This thread's open writer for ``schema`` and ``compression`` (the last few are kept)."""
    writers: list[_BatchWriter] | None = getattr(_WRITERS, "writers", None)
    if writers is None:
        writers = _WRITERS.writers = []
    for i, w in enumerate(writers):
        if w.compression == compression and (w.schema is schema or w.schema.equals(schema, check_metadata=True)):
            if i:
                writers.insert(0, writers.pop(i))
            return w
    w = _BatchWriter(schema, compression)
    writers.insert(0, w)
    del writers[_WRITERS_PER_THREAD:]
    return w


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
    header.facts()  # every fact fits its width (raises ValueError otherwise)
    message, message_size = _batch_writer(stored.schema, compression).write(
        stored, {FACTS_KEY: header.facts(crc=0).decode()})
    prefix, _ = _split_pieces(message, MESSAGE_PREFIX_BYTES)
    head_len = MESSAGE_PREFIX_BYTES + MESSAGE_PREFIX.unpack(b"".join(prefix))[1]
    head_pieces, body_pieces = _split_pieces(message, head_len)
    head = bytearray(b"".join(head_pieces))
    body_size = message_size - head_len
    layout = locate(memoryview(head), body_size)
    if layout.facts_at < 0:
        raise AssertionError("the batch facts must be in the batch metadata")
    crc = crc_v2([head, *body_pieces], layout, base_offset=base_offset, compressed=compression is not None)
    header = header.with_crc(crc)
    head[layout.facts_at:layout.facts_at + FACTS_LENGTH] = header.facts()
    return EncodedBatch(header=header, head=bytes(head), body_pieces=tuple(body_pieces), body_size=body_size)


def with_producer(
    batch: EncodedBatch, *, producer_id: int, producer_epoch: int, base_sequence: int
) -> EncodedBatch:
    """``batch`` with another producer id, epoch and base sequence, its CRC computed again.

    The body pieces are shared, not copied (one CRC pass over them). A producer that
    restarts its sequence numbers under a new epoch (Kafka's KIP-360) re-stamps the
    batches it had numbered but not yet had appended.
    """
    header = dataclasses.replace(batch.header, producer_id=producer_id, producer_epoch=producer_epoch,
                                 base_sequence=base_sequence, crc=0)
    head = bytearray(batch.head)
    layout = locate(memoryview(head), batch.body_size)
    if layout.facts_at < 0:
        raise AssertionError("the batch facts must be in the batch metadata")
    facts = slice(layout.facts_at, layout.facts_at + FACTS_LENGTH)
    head[facts] = header.facts()
    crc = crc_v2([head, *batch.body_pieces], layout, base_offset=header.base_offset,
                 compressed=header.compression is not None)
    header = header.with_crc(crc)
    head[facts] = header.facts()
    return EncodedBatch(header=header, head=bytes(head), body_pieces=batch.body_pieces, body_size=batch.body_size)


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
    marker, meta_len = MESSAGE_PREFIX.unpack_from(data, 0)
    if marker != CONTINUATION_MARKER or meta_len <= 0 or MESSAGE_PREFIX_BYTES + meta_len > len(data):
        raise CorruptRecordError(f"{where}: no valid schema message at the start")
    size = MESSAGE_PREFIX_BYTES + meta_len
    try:
        schema = pa.ipc.read_schema(pa.py_buffer(bytes(data[:size])))
        _check_stored_shape(schema)  # decodes the field names: UnicodeDecodeError if damaged
    except (pa.ArrowException, OSError, ValueError) as e:
        raise CorruptRecordError(f"{where}: schema message does not parse: {e}") from None
    return schema, size
