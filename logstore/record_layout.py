"""Where the parts of a stored batch message sit, and the CRC32C over them.

A stored batch is an Arrow IPC record batch message (:mod:`logstore.record`
specifies the format). This module reads the message's flatbuffer metadata in
place — a small flatbuffers reader, no body decoding — to find:

* the batch facts: format 2 keeps them in one fixed-width string under the
  custom metadata key :data:`FACTS_KEY`; format 1 (segments written before
  format 2) kept one decimal string per fact under ``logstore.*`` keys;
* the offset column's values buffer (the first column's buffer 1) in the body;
* the record count of the first column (its field node).

and defines the CRC of each format:

* **format 2** (:func:`crc_v2`): CRC32C over the whole message except the
  base offset and leader epoch digits of the facts and the CRC's own digits,
  with the offset column's values read *relative to the base offset*
  (``offset - base_offset``, int64 little-endian) — as Kafka's CRC leaves
  out base offset and leader epoch and covers offset deltas. The broker
  assigns a base offset by patching the digits and the offset values
  (:func:`logstore.storage.validation.assign_offsets`); the relative values
  do not change, so the producer's CRC stays valid without checksumming the
  payload again, while a damaged base offset or offset value is still
  caught. In a compressed body the offset buffer is compressed: its bytes
  are covered as they are (the broker re-encodes compressed batches).
* **format 1** (:func:`crc_v1`): CRC32C over the whole message with the ten
  CRC digits read as ``##########``, then the facts line.

Thread-safety: pure functions and immutable values.
"""

from __future__ import annotations

import struct
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass

import crc32c
import numpy as np
import pyarrow as pa

__all__ = [
    "FACTS_KEY",
    "FACTS_LENGTH",
    "FORMAT_VERSION",
    "BROKER_FACTS",
    "CRC_FACT",
    "MAX_TIMESTAMP_FACT",
    "FACT_FIELDS",
    "FACT_SLICES",
    "V1_CRC_KEY",
    "V1_CRC_PLACEHOLDER",
    "BatchLayout",
    "FlatTable",
    "locate",
    "crc_over",
    "crc_v2",
    "v2_ranges",
    "CrcRange",
    "crc_v1",
    "v1_crc_digits_at",
]

FORMAT_VERSION = 2
FACTS_KEY = "logstore.batch"
V1_CRC_KEY = "logstore.crc"
V1_CRC_PLACEHOLDER = b"##########"

# The format-2 facts string: fields of fixed width separated by one space. Signed
# fields carry their sign ("+0000000042"); the CRC is ten unsigned digits.
FACT_FIELDS: tuple[tuple[str, int], ...] = (
    ("version", 1),
    ("base_offset", 20),
    ("leader_epoch", 11),
    ("last_offset_delta", 11),
    ("record_count", 11),
    ("max_timestamp", 20),
    ("producer_id", 20),
    ("producer_epoch", 6),
    ("base_sequence", 11),
    ("attributes", 4),
    ("crc", 10),
)


def _slices() -> dict[str, slice]:
    out, at = {}, 0
    for name, width in FACT_FIELDS:
        out[name] = slice(at, at + width)
        at += width + 1
    return out


FACT_SLICES = _slices()
FACTS_LENGTH = FACT_SLICES["crc"].stop
# Ranges of the facts string outside the CRC: what the broker assigns on append.
BROKER_FACTS = slice(FACT_SLICES["base_offset"].start, FACT_SLICES["leader_epoch"].stop)
CRC_FACT = FACT_SLICES["crc"]
MAX_TIMESTAMP_FACT = FACT_SLICES["max_timestamp"]

_FACTS_KEY_BYTES = FACTS_KEY.encode()
_V1_CRC_KEY_BYTES = V1_CRC_KEY.encode()
_BUFFER = struct.Struct("<qq")  # Arrow Buffer: offset, length (in the body)
_NODE = struct.Struct("<qq")  # Arrow FieldNode: length, null_count


class FlatTable:
    """Just enough of a flatbuffers reader for Arrow's ``Message`` table."""

    __slots__ = ("buf", "pos", "vt", "vt_len")

    def __init__(self, buf: memoryview, pos: int) -> None:
        self.buf = buf
        self.pos = pos
        self.vt = pos - struct.unpack_from("<i", buf, pos)[0]
        self.vt_len = struct.unpack_from("<H", buf, self.vt)[0]

    @classmethod
    def root(cls, buf: memoryview) -> FlatTable:
        return cls(buf, struct.unpack_from("<I", buf, 0)[0])

    def _field(self, index: int) -> int:
        at = 4 + 2 * index
        if at >= self.vt_len:
            return 0
        off: int = struct.unpack_from("<H", self.buf, self.vt + at)[0]
        return self.pos + off if off else 0

    def scalar(self, index: int, fmt: str, default: int) -> int:
        at = self._field(index)
        return struct.unpack_from(fmt, self.buf, at)[0] if at else default

    def ref(self, index: int) -> int:
        at = self._field(index)
        return at + struct.unpack_from("<I", self.buf, at)[0] if at else 0

    def string(self, index: int) -> bytes:
        at = self.ref(index)
        if not at:
            return b""
        n = struct.unpack_from("<I", self.buf, at)[0]
        return bytes(self.buf[at + 4: at + 4 + n])

    def string_at(self, index: int) -> tuple[int, int]:
        """(position, length) of string field ``index`` in the buffer; (-1, 0) if absent."""
        at = self.ref(index)
        if not at:
            return -1, 0
        return at + 4, struct.unpack_from("<I", self.buf, at)[0]

    def table(self, index: int) -> FlatTable | None:
        at = self.ref(index)
        return FlatTable(self.buf, at) if at else None

    def structs(self, index: int, fmt: struct.Struct) -> list[tuple[int, ...]]:
        at = self.ref(index)
        if not at:
            return []
        n = struct.unpack_from("<I", self.buf, at)[0]
        return [fmt.unpack_from(self.buf, at + 4 + i * fmt.size) for i in range(n)]

    def tables(self, index: int) -> list[FlatTable]:
        at = self.ref(index)
        if not at:
            return []
        n = struct.unpack_from("<I", self.buf, at)[0]
        out = []
        for i in range(n):
            elem = at + 4 + 4 * i
            out.append(FlatTable(self.buf, elem + struct.unpack_from("<I", self.buf, elem)[0]))
        return out


@dataclass(frozen=True, slots=True)
class BatchLayout:
    """Positions inside one batch message (all relative to the message start).

    ``facts_at`` is where the format-2 facts string starts (-1 in a format-1
    message); ``offsets`` the ``[start, stop)`` of the offset column's values
    buffer; ``timestamps`` that of the timestamp column's values buffer;
    ``rows`` and ``offset_nulls`` the first column's field node.
    """

    facts_at: int
    offsets: tuple[int, int]
    timestamps: tuple[int, int]
    rows: int
    offset_nulls: int


def locate(head: memoryview, body_len: int) -> BatchLayout:
    """Read the positions of :class:`BatchLayout` from a message's ``head`` (its
    prefix and flatbuffer metadata, up to the body) and the body's length.

    Raises ``struct.error`` or ``IndexError`` on a malformed flatbuffer and
    ``ValueError`` when the record batch lacks the stored columns' buffers;
    callers turn these into :class:`~logstore.errors.CorruptRecordError`.
    """
    body_start = len(head)
    root = FlatTable.root(head[8:])
    facts_at = -1
    for kv in root.tables(4):
        if kv.string(0) == _FACTS_KEY_BYTES:
            at, n = kv.string_at(1)
            if n == FACTS_LENGTH:
                facts_at = 8 + at
            break
    rb = root.table(2)
    if rb is None:
        raise ValueError("the message has no record batch header")
    buffers = rb.structs(2, _BUFFER)
    nodes = rb.structs(1, _NODE)
    if len(buffers) < 4 or not nodes:
        raise ValueError("the record batch lacks the offset and timestamp buffers")

    def span(i: int) -> tuple[int, int]:
        offset, length = buffers[i]
        if offset < 0 or length < 0 or offset + length > body_len:
            raise ValueError(f"buffer {i} ({offset}, {length}) lies outside the {body_len}-byte body")
        return body_start + offset, body_start + offset + length

    return BatchLayout(facts_at=facts_at, offsets=span(1), timestamps=span(3),
                       rows=nodes[0][0], offset_nulls=nodes[0][1])


# A byte range [start, stop) of a message the CRC reads differently: left out (None), or
# replaced by what the function returns for the range's bytes.
CrcRange = tuple[int, int, "Callable[[bytes], bytes] | None"]


def crc_over(pieces: Iterable[bytes | memoryview | pa.Buffer], ranges: Sequence[CrcRange]) -> int:
    """CRC32C of the concatenation of ``pieces``, with each of ``ranges`` (sorted,
    disjoint positions in the concatenation) left out or replaced. Copies only
    the bytes of a replaced range."""
    crc = 0
    pos = 0
    todo = list(ranges)
    gathered: list[bytes] = []
    for piece in pieces:
        view = memoryview(piece)
        if view.ndim != 1 or view.itemsize != 1:
            view = view.cast("B")
        end = pos + len(view)
        at = pos
        while at < end:
            if todo and todo[0][0] <= at:
                start, stop, replace = todo[0]
                upto = min(stop, end)
                if replace is not None:
                    gathered.append(bytes(view[at - pos:upto - pos]))
                at = upto
                if at == stop:
                    todo.pop(0)
                    if replace is not None:
                        crc = crc32c.crc32c(replace(b"".join(gathered)), value=crc)
                        gathered = []
            else:
                upto = min(todo[0][0], end) if todo else end
                crc = crc32c.crc32c(view[at - pos:upto - pos], value=crc)
                at = upto
        pos = end
    return crc


def _relative_to(base_offset: int) -> Callable[[bytes], bytes]:
    def relative(raw: bytes) -> bytes:
        return (np.frombuffer(raw, dtype="<i8") - np.int64(base_offset)).astype("<i8").tobytes()
    return relative


def v2_ranges(layout: BatchLayout, *, base_offset: int, compressed: bool) -> list[CrcRange]:
    """The ranges :func:`crc_v2` reads differently, in order (the facts precede the body)."""
    f = layout.facts_at
    o0, o1 = layout.offsets
    return [(f + BROKER_FACTS.start, f + BROKER_FACTS.stop, None), (f + CRC_FACT.start, f + CRC_FACT.stop, None),
            (o0, o1, None if compressed else _relative_to(base_offset))]


def crc_v2(pieces: Iterable[bytes | memoryview | pa.Buffer], layout: BatchLayout, *, base_offset: int,
           compressed: bool) -> int:
    """The format-2 CRC of a message given as ``pieces``; see the module docstring."""
    crc = crc_over(pieces, v2_ranges(layout, base_offset=base_offset, compressed=compressed))
    return crc


def v1_crc_digits_at(message: memoryview, body_start: int) -> int:
    """Where a format-1 message's ten CRC digits start; -1 if absent."""
    meta = message[8:body_start]
    root = FlatTable.root(meta)
    for kv in root.tables(4):
        if kv.string(0) == _V1_CRC_KEY_BYTES:
            at, n = kv.string_at(1)
            return 8 + at if at >= 0 and n == len(V1_CRC_PLACEHOLDER) else -1
    return -1


def crc_v1(message: memoryview, crc_at: int, facts_line: bytes) -> int:
    """The format-1 CRC: the message with the CRC digits as ``##########``, then the facts line."""
    crc = crc32c.crc32c(message[:crc_at])
    crc = crc32c.crc32c(V1_CRC_PLACEHOLDER, value=crc)
    crc = crc32c.crc32c(message[crc_at + len(V1_CRC_PLACEHOLDER):], value=crc)
    return crc32c.crc32c(facts_line, value=crc)
