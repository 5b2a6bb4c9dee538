"""Reading stored batch messages, zero-copy: framing, the batch facts, CRC32C
verification, decoding, and the decompressed size of a body.

The byte layout and the CRC are specified in :mod:`logstore.record` (which
writes them); this module reads them back without copying or decoding the
body: the Arrow ``Message`` flatbuffer is read in place
(:mod:`logstore.record_layout`), so scanning a segment (to read, recover or index it)
parses each batch's facts without decoding its body. Both formats are read:
format 2 and format 1 (segments written before format 2). Clients and
storage both read batches through it; a :class:`StoredBatch` is a view of the bytes
it was parsed from.

Parsing does not check the CRC (:meth:`StoredBatch.verify_crc` does); a
message cut short (a torn tail, a short read) raises
:class:`IncompleteBatchError`, any other malformed message
:class:`~logstore.errors.CorruptRecordError`.

Thread-safety: pure functions and immutable values.
"""

from __future__ import annotations

import struct
from collections.abc import Callable, Iterator
from dataclasses import dataclass

import pyarrow as pa

from logstore.errors import CorruptRecordError
from logstore.record import CONTINUATION_MARKER, MESSAGE_PREFIX, MESSAGE_PREFIX_BYTES, BatchHeader
from logstore.record_layout import (
    FACTS_KEY,
    BatchLayout,
    FlatTable,
    crc_v1,
    crc_v2,
    locate,
    v1_crc_digits_at,
)

__all__ = [
    "StoredBatch",
    "IncompleteBatchError",
    "parse_batch_at",
    "iter_batches",
    "decoded_body_size",
]

_FACTS_KEY_BYTES = FACTS_KEY.encode()
# Arrow's MessageHeader union tag of a record batch.
_HEADER_RECORD_BATCH = 3


def _parse_message_metadata(meta: memoryview) -> tuple[int, int, dict[bytes, bytes]]:
    """(header type, body length, custom metadata) of an Arrow ``Message`` flatbuffer."""
    root = FlatTable.root(meta)
    header_type = root.scalar(1, "<B", 0)
    body_len = root.scalar(3, "<q", 0)
    custom = {kv.string(0): kv.string(1) for kv in root.tables(4)}
    return header_type, body_len, custom


@dataclass(frozen=True, slots=True)
class StoredBatch:
    """One stored batch message: its facts, where it sits, and its bytes.

    ``data`` is the whole message (zero-copy view of what was read);
    ``position`` is its byte position in the segment file it came from;
    ``version`` its format (2, or 1 for batches written before format 2).
    """

    header: BatchHeader
    position: int
    data: memoryview
    body_start: int
    version: int = 2

    def layout(self) -> BatchLayout:
        """Where the facts and the offset and timestamp buffers sit (:func:`logstore.record_layout.locate`)."""
        try:
            return locate(self.data[:self.body_start], len(self.data) - self.body_start)
        except (struct.error, IndexError, ValueError) as e:
            raise CorruptRecordError(
                f"batch at offset {self.header.base_offset} (position {self.position}): "
                f"malformed record batch metadata: {e}"
            ) from None

    @property
    def size(self) -> int:
        return len(self.data)

    def verify_crc(self, *, where: str = "batch") -> None:
        """Raise :class:`CorruptRecordError` if the CRC32C does not match."""
        data = self.data
        if self.version == 2:
            layout = self.layout()
            try:
                crc = crc_v2([data], layout, base_offset=self.header.base_offset,
                             compressed=self.header.compression is not None)
            except ValueError as e:  # an offset buffer that is no whole number of int64s
                raise CorruptRecordError(
                    f"{where}: the batch at offset {self.header.base_offset} (position {self.position}) "
                    f"has a malformed offset column: {e}"
                ) from None
        else:
            try:
                at = v1_crc_digits_at(data, self.body_start)
            except (struct.error, IndexError):
                at = -1
            if at < 0:
                raise CorruptRecordError(
                    f"{where}: the batch at offset {self.header.base_offset} (position "
                    f"{self.position}) has no well-formed CRC in its metadata"
                )
            crc = crc_v1(data, at, self.header.facts_line())
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
    marker, meta_len = MESSAGE_PREFIX.unpack_from(data, pos)
    if marker != CONTINUATION_MARKER or meta_len <= 0 or meta_len % 8:
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
    facts = custom.get(_FACTS_KEY_BYTES)
    if facts is not None:
        header, version = BatchHeader.from_facts(facts, where=f"{where} position {at}"), 2
    else:
        header, version = BatchHeader.from_v1_metadata(custom, where=f"{where} position {at}"), 1
    if header.record_count <= 0 or header.last_offset_delta < header.record_count - 1:
        raise CorruptRecordError(
            f"{where}: batch at position {at} has impossible counts "
            f"(record_count {header.record_count}, last_offset_delta {header.last_offset_delta})"
        )
    return StoredBatch(header=header, position=at, data=data[pos:msg_end], body_start=meta_end - pos,
                       version=version)


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
        root = FlatTable.root(meta)
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
