"""The wire codec of the zero-copy Produce and Fetch messages (protobuf wire format by hand).

Produce requests and Fetch answers carry the records: megabytes of stored
batch messages per partition. Through generated protobuf messages each
would be copied several times (into the message, into its serialization,
out of the parse, on attribute access); this codec copies them once or not
at all. The broker and :class:`~logstore.client.rpc.BrokerClient` register
their Produce and Fetch methods with these functions instead of protobuf's
(de)serializers:

* ``ProduceRequest``: written by the client with :func:`encode_produce_request`,
  read by the broker with :func:`parse_produce_request`;
* ``FetchResponse``: written by the broker with :func:`encode_fetch_response`,
  read by the client with :func:`decode_fetch_response`.

Contract, checked against protobuf in ``tests/broker/test_wire.py``: each encoder's
bytes parse with protobuf as the message they stand for (the
``ProduceRequest`` encoding is byte for byte ``SerializeToString``; a
``FetchPartitionResponse`` puts its ``records`` field last, which protobuf
accepts); each parser reads from any serialization what protobuf reads —
the last value of a singular field wins, unknown fields and known fields of
another wire type are skipped — and refuses what protobuf refuses
(truncation, bad varints, field number 0, invalid UTF-8 in a string, groups).
Parsed records are views of the input (``memoryview``), never copies.

Errors: the primitives raise :class:`MalformedMessageError` (a ``ValueError``);
:func:`parse_produce_request` turns it into :class:`~logstore.errors.InvalidRequestError`
(an untrusted request); :func:`decode_fetch_response` lets it (or protobuf's
``DecodeError``) through, for the client to report a malformed answer.

Thread-safety: pure functions over their arguments.
"""

from __future__ import annotations

from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from logstore._proto import logstore_pb2 as pb
from logstore.errors import InvalidRequestError
from logstore.types import TopicPartition

__all__ = [
    "MalformedMessageError",
    "RecordsArg",
    "ProducePartitionView",
    "ProduceRequestView",
    "encode_varint",
    "read_varint",
    "Field",
    "iter_fields",
    "encode_produce_request",
    "parse_produce_request",
    "encode_fetch_response",
    "decode_fetch_response",
    "FETCH_PADDING_FIELD",
]

# The records of one partition in a produce: bytes, or pieces to concatenate.
RecordsArg = bytes | Sequence[bytes | memoryview]

_VARINT = 0
_FIXED64 = 1
_LENGTH_DELIMITED = 2
_FIXED32 = 5


def _number(message: Any, field: str) -> int:
    return int(message.DESCRIPTOR.fields_by_name[field].number)


_PRODUCE_ACKS = _number(pb.ProduceRequest, "acks")
_PRODUCE_TIMEOUT_MS = _number(pb.ProduceRequest, "timeout_ms")
_PRODUCE_TRANSACTIONAL_ID = _number(pb.ProduceRequest, "transactional_id")
_PRODUCE_PARTITIONS = _number(pb.ProduceRequest, "partitions")
_PRODUCE_CORRELATION_ID = _number(pb.ProduceRequest, "correlation_id")
_PARTITION_TOPIC = _number(pb.ProducePartition, "topic")
_PARTITION_PARTITION = _number(pb.ProducePartition, "partition")
_PARTITION_RECORDS = _number(pb.ProducePartition, "records")
_PARTITION_LEADER_EPOCH = _number(pb.ProducePartition, "current_leader_epoch")
_FETCH_PARTITIONS = _number(pb.FetchResponse, "partitions")
_FETCH_RECORDS = _number(pb.FetchPartitionResponse, "records")


class MalformedMessageError(ValueError):
    """Bytes that are not a protobuf message (the reason is the message)."""


# --------------------------------------------------------------------------- primitives


def encode_varint(value: int) -> bytes:
    """Protobuf base-128 varint of ``value`` (negative int32/int64 as 64-bit two's complement)."""
    value &= 0xFFFFFFFFFFFFFFFF
    out = bytearray()
    while value > 0x7F:
        out.append((value & 0x7F) | 0x80)
        value >>= 7
    out.append(value)
    return bytes(out)


def read_varint(data: memoryview, pos: int) -> tuple[int, int]:
    """The base-128 varint at ``data[pos]`` (at most 10 bytes) and the position after it."""
    value = shift = 0
    for i in range(pos, min(pos + 10, len(data))):
        byte = data[i]
        value |= (byte & 0x7F) << shift
        if not byte & 0x80:
            return value, i + 1
        shift += 7
    raise MalformedMessageError("truncated or overlong varint")


@dataclass(frozen=True, slots=True)
class Field:
    """One field of a message: ``value`` is the int of a varint, a view of a length-delimited
    field's bytes, or None (fixed32/fixed64); ``data[start:end]`` is the whole field, key included."""

    number: int
    wire_type: int
    value: int | memoryview | None
    start: int
    end: int


def iter_fields(data: memoryview) -> Iterator[Field]:
    """Every field of the message ``data``, in order. Raises :class:`MalformedMessageError`."""
    pos, end = 0, len(data)
    while pos < end:
        start = pos
        key, pos = read_varint(data, pos)
        number, wire_type = key >> 3, key & 7
        if number == 0:
            raise MalformedMessageError("field number 0")
        value: int | memoryview | None = None
        if wire_type == _VARINT:
            value, pos = read_varint(data, pos)
        elif wire_type == _LENGTH_DELIMITED:
            size, pos = read_varint(data, pos)
            value = data[pos:pos + size]
            pos += size
        elif wire_type in (_FIXED64, _FIXED32):
            pos += 8 if wire_type == _FIXED64 else 4
        else:
            raise MalformedMessageError(f"wire type {wire_type}")
        if pos > end:
            raise MalformedMessageError("a field runs past the end")
        yield Field(number, wire_type, value, start, pos)


def _int32(value: int) -> int:
    """A varint as protobuf's int32: the low 32 bits, signed."""
    value &= 0xFFFFFFFF
    return value - (1 << 32) if value & 0x80000000 else value


def _int64(value: int) -> int:
    """A varint as protobuf's int64: the low 64 bits, signed."""
    value &= 0xFFFFFFFFFFFFFFFF
    return value - (1 << 64) if value & 0x8000000000000000 else value


def _text(view: memoryview) -> str:
    try:
        return str(view, "utf-8")
    except UnicodeDecodeError:
        raise MalformedMessageError("a string is not UTF-8") from None


def _length_delimited(number: int, pieces: Sequence[bytes | memoryview]) -> list[bytes | memoryview]:
    size = sum(len(p) for p in pieces)
    return [encode_varint(number << 3 | _LENGTH_DELIMITED), encode_varint(size), *pieces]


def _varint_field(number: int, value: int) -> tuple[bytes, bytes]:
    return encode_varint(number << 3 | _VARINT), encode_varint(value)


# --------------------------------------------------------------------------- Produce


@dataclass(frozen=True, slots=True)
class ProducePartitionView:
    """One ``ProducePartition`` of a request in wire form; ``records`` is a view of its bytes."""

    topic: str
    partition: int
    records: memoryview
    current_leader_epoch: int = -1  # -1: the request did not say (absent field)


@dataclass(frozen=True, slots=True)
class ProduceRequestView:
    """A ``ProduceRequest`` parsed by :func:`parse_produce_request`."""

    acks: int
    timeout_ms: int
    transactional_id: str
    partitions: tuple[ProducePartitionView, ...]
    correlation_id: int = 0  # ProduceStream: what the answer repeats (unary Produce: 0)


def encode_produce_request(
    partitions: Sequence[tuple[TopicPartition, RecordsArg]],
    *,
    acks: int,
    timeout_ms: int,
    transactional_id: str = "",
    leader_epochs: Mapping[TopicPartition, int] | None = None,
    correlation_id: int = 0,
) -> bytes:
    """A ``ProduceRequest`` in protobuf wire form, byte for byte what ``SerializeToString`` gives.

    ``leader_epochs`` gives a partition's ``current_leader_epoch`` (KIP-320 fencing);
    a partition not in it (or at -1) sends none. ``correlation_id`` (0: none) is a
    ProduceStream request's number, which its answer repeats.

    Built by hand so that the records (often megabytes) are copied once, by
    the final join, instead of into a message and again into its serialization.
    """
    out: list[bytes | memoryview] = []
    if acks:
        out += _varint_field(_PRODUCE_ACKS, acks)
    if timeout_ms:
        out += _varint_field(_PRODUCE_TIMEOUT_MS, timeout_ms)
    if transactional_id:
        out += _length_delimited(_PRODUCE_TRANSACTIONAL_ID, [transactional_id.encode()])
    for tp, records in partitions:
        pieces = [records] if isinstance(records, (bytes, bytearray, memoryview)) else list(records)
        sub: list[bytes | memoryview] = _length_delimited(_PARTITION_TOPIC, [tp.topic.encode()]) if tp.topic else []
        if tp.partition:
            sub += _varint_field(_PARTITION_PARTITION, tp.partition)
        sub += _length_delimited(_PARTITION_RECORDS, pieces) if sum(len(p) for p in pieces) else []
        epoch = -1 if leader_epochs is None else leader_epochs.get(tp, -1)
        if epoch >= 0:
            sub += _varint_field(_PARTITION_LEADER_EPOCH, epoch)
        out += _length_delimited(_PRODUCE_PARTITIONS, sub)
    if correlation_id:
        out += _varint_field(_PRODUCE_CORRELATION_ID, correlation_id)
    return b"".join(out)


def parse_produce_request(data: bytes, *, max_partitions: int | None = None) -> ProduceRequestView:
    """Parse a ``ProduceRequest`` in protobuf wire form without copying the records.

    Reads what protobuf reads: ``acks`` (1), ``timeout_ms`` (2), ``transactional_id``
    (3) and each ``partitions`` (4) entry's ``topic`` (1), ``partition`` (2) and
    ``records`` (3), and ``correlation_id`` (5); the last value of a repeated scalar wins, unknown fields and
    known fields of another wire type are skipped. Records are views of ``data``.
    Raises :class:`InvalidRequestError` for bytes protobuf would not parse
    (truncation, bad varints, field number 0, invalid UTF-8; groups are refused),
    and for more than ``max_partitions`` partition entries (None: no cap), as soon
    as the entry past the cap is reached, so a request of millions of entries
    costs ``max_partitions`` steps, not millions of objects.
    """
    try:
        return _parse_produce_request(memoryview(data), max_partitions)
    except MalformedMessageError as e:
        raise InvalidRequestError(f"Produce: malformed request ({e})") from None


def _parse_produce_request(data: memoryview, max_partitions: int | None = None) -> ProduceRequestView:
    acks = timeout_ms = correlation_id = 0
    transactional_id = ""
    partitions: list[ProducePartitionView] = []
    # Every field costs a step here, nested ones included: at most 16 per allowed
    # partition (a request repeating a singular field millions of times is refused as
    # promptly as one with millions of partitions).
    budget = _FieldBudget(max_partitions)
    for f in iter_fields(data):
        budget.spend()
        if isinstance(f.value, int):
            if f.number == _PRODUCE_ACKS:
                acks = _int32(f.value)
            elif f.number == _PRODUCE_TIMEOUT_MS:
                timeout_ms = _int32(f.value)
            elif f.number == _PRODUCE_CORRELATION_ID:
                correlation_id = _int64(f.value)
        elif isinstance(f.value, memoryview):
            if f.number == _PRODUCE_TRANSACTIONAL_ID:
                transactional_id = _text(f.value)
            elif f.number == _PRODUCE_PARTITIONS:
                if max_partitions is not None and len(partitions) >= max_partitions:
                    raise InvalidRequestError(
                        f"Produce: the request has more than {max_partitions} partition entries "
                        f"(max_request_entries = {max_partitions}); split it into smaller requests"
                    )
                partitions.append(_parse_produce_partition(f.value, budget))
    return ProduceRequestView(acks, timeout_ms, transactional_id, tuple(partitions), correlation_id)


class _FieldBudget:
    """The fields a produce parse may still read (16 per allowed partition; None: no cap)."""

    __slots__ = ("max_partitions", "left")

    def __init__(self, max_partitions: int | None) -> None:
        self.max_partitions = max_partitions
        self.left = -1 if max_partitions is None else 16 * max_partitions + 64

    def spend(self) -> None:
        if self.max_partitions is None:
            return
        self.left -= 1
        if self.left < 0:
            raise InvalidRequestError(
                f"Produce: the request has more than {16 * self.max_partitions + 64} fields (16 per "
                f"entry of max_request_entries = {self.max_partitions}); split it into smaller requests"
            )


def _parse_produce_partition(data: memoryview, budget: _FieldBudget | None = None) -> ProducePartitionView:
    topic, partition, records, epoch = "", 0, data[0:0], -1
    for f in iter_fields(data):
        if budget is not None:
            budget.spend()
        if isinstance(f.value, int):
            if f.number == _PARTITION_PARTITION:
                partition = _int32(f.value)
            elif f.number == _PARTITION_LEADER_EPOCH:
                epoch = _int32(f.value)
        elif isinstance(f.value, memoryview):
            if f.number == _PARTITION_TOPIC:
                topic = _text(f.value)
            elif f.number == _PARTITION_RECORDS:
                records = f.value
    return ProducePartitionView(topic, partition, records, epoch)


# --------------------------------------------------------------------------- Fetch


_PARTITIONS_KEY = encode_varint(_FETCH_PARTITIONS << 3 | _LENGTH_DELIMITED)
_RECORDS_KEY = encode_varint(_FETCH_RECORDS << 3 | _LENGTH_DELIMITED)


def encode_fetch_response(
    partitions: Sequence[tuple[pb.FetchPartitionResponse, bytes | memoryview]],
) -> bytes:
    """A ``FetchResponse`` in protobuf wire form: each partition's answer (without records)
    serialized, then its ``records`` field appended as they are.

    The records are copied once, by the final join. The result parses as the
    ``FetchResponse`` whose partitions carry those records (the records field comes
    last instead of in field-number order, which protobuf parsers accept).

    Each partition's records start at a multiple of 8 bytes from the start of the
    answer: a padding field (:data:`FETCH_PADDING_FIELD`, unknown to the schema, so
    every protobuf parser skips it) goes before the records field when they would not.
    A receiver holds the answer at an 8-aligned address (CPython's ``bytes`` does), so
    the Arrow batches decoded from the records are aligned without a copy
    (:func:`logstore.client.messages.aligned` copies only when they are not).
    """
    out: list[bytes | memoryview] = []
    pos = 0
    for resp, records in partitions:
        head = resp.SerializeToString()
        tail: list[bytes | memoryview] = (
            [_RECORDS_KEY, encode_varint(len(records))] if len(records) else []
        )
        framing = len(head) + sum(len(p) for p in tail)
        pad = b""
        if records:
            pad = _alignment_padding(pos + len(_PARTITIONS_KEY), framing, len(records))
        size = framing + len(pad) + len(records)
        entry = (_PARTITIONS_KEY, encode_varint(size), head, pad, *tail, *([records] if len(records) else []))
        out += entry
        pos += sum(len(p) for p in entry)
    return b"".join(out)


#: The field number of :func:`encode_fetch_response`'s padding in a ``FetchPartitionResponse``:
#: never to be used by the schema (a test checks it is not).
FETCH_PADDING_FIELD = 15
_PADDING_KEY = encode_varint(FETCH_PADDING_FIELD << 3 | _LENGTH_DELIMITED)


def _alignment_padding(at: int, framing: int, records: int) -> bytes:
    """The padding field (or none) that puts records at an 8-aligned position, for an entry
    whose length varint starts at ``at`` and that holds ``framing`` bytes of fields besides
    the records and the padding."""
    for n in range(-1, 24):
        pad = b"" if n < 0 else _PADDING_KEY + encode_varint(n) + bytes(n)
        size = framing + len(pad) + records
        if (at + len(encode_varint(size)) + framing + len(pad)) % 8 == 0:
            return pad
    raise AssertionError("no padding aligns the records")  # 16 consecutive lengths cover every residue


def decode_fetch_response(data: bytes) -> list[tuple[pb.FetchPartitionResponse, memoryview]]:
    """A ``FetchResponse`` in wire form as each partition's answer (without its records)
    and the records, a view of ``data``.

    Protobuf parses each partition's answer with its ``records`` field cut out
    (the last occurrence counts, as in protobuf). Raises :class:`MalformedMessageError`
    or protobuf's ``DecodeError`` for bytes that are not a ``FetchResponse``.
    """
    view = memoryview(data)
    out: list[tuple[pb.FetchPartitionResponse, memoryview]] = []
    for f in iter_fields(view):
        if f.number != _FETCH_PARTITIONS or not isinstance(f.value, memoryview):
            continue  # an unknown field
        entry = f.value
        records = view[0:0]
        kept: list[memoryview] = []
        for sub in iter_fields(entry):
            if sub.number == _FETCH_RECORDS and isinstance(sub.value, memoryview):
                records = sub.value
            elif sub.number != FETCH_PADDING_FIELD:
                kept.append(entry[sub.start:sub.end])
        out.append((pb.FetchPartitionResponse.FromString(b"".join(kept)), records))
    return out
