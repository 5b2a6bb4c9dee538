"""Validation of a producer's records before they are appended (Kafka's ``LogValidator``).

A produce carries, per partition, untrusted bytes: an Arrow IPC stream of
one stored schema message followed by stored batch messages (see
:mod:`logstore.record` and :mod:`logstore.record_reader`).
:func:`validate_records` checks every byte of it before anything is
written, so a partition's log never holds a batch that a reader cannot
decode:

* the stream is not empty and starts with a schema message whose schema is
  the log's or a compatible evolution of it
  (:func:`~logstore.record.check_schema_evolution`);
* each batch message is well framed, at most ``max.message.bytes`` long, and
  its CRC32C matches;
* the batches' decompressed size, summed from the compressed buffers' length
  prefixes *before* decompressing anything, stays within the broker's
  ``max_decompressed_bytes`` (a small request cannot inflate to gigabytes);
* each batch decodes with the stream's schema and passes Arrow's full
  validation, holds as many rows as its header says, and has no null
  timestamp;
* there is at least one batch;
* no batch is a control batch (only the broker writes markers), and a
  transactional batch names a producer id;
* its max timestamp is the largest of its timestamps (the time index
  trusts it).

:func:`assign_offsets` then turns a valid batch into what is stored, the
way Kafka's validator assigns offsets to an uncompressed batch: the
producer's bytes as they were sent, with only the broker's fields patched
(base offset, leader epoch, the offset column's values; timestamps on a
LogAppendTime topic). The batch is not decoded or encoded again.

Errors: :class:`~logstore.errors.CorruptRecordError`,
:class:`~logstore.errors.RecordTooLargeError`,
:class:`~logstore.errors.SchemaMismatchError` or
:class:`~logstore.errors.InvalidRequestError`, the message starting with
``where``. The first failing check fails the whole stream: nothing of it
may be appended.

Thread-safety: pure functions of their arguments.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from logstore.errors import CorruptRecordError, InvalidRequestError, RecordTooLargeError
from logstore.record import (
    ATTR_TRANSACTIONAL,
    NO_PRODUCER_ID,
    TIMESTAMP_TYPE,
    EncodedBatch,
    check_schema_evolution,
    decode_schema,
    encode_batch,
)
from logstore.record_layout import FACTS_LENGTH, crc_v2
from logstore.record_reader import StoredBatch, decoded_body_size, iter_batches

__all__ = ["ValidatedRecords", "validate_records", "assign_offsets", "stored_as_appended", "with_append_time"]


@dataclass(frozen=True, slots=True)
class ValidatedRecords:
    """A producer's records that passed :func:`validate_records`.

    ``schema`` is the stream's schema (the log's, or a compatible evolution
    of it); ``batches`` pairs each stored batch (its header as the producer
    sent it) with its decoded Arrow batch, in stream order.
    """

    schema: pa.Schema
    batches: tuple[tuple[StoredBatch, pa.RecordBatch], ...]


def validate_records(
    records: bytes | memoryview,
    *,
    log_schema: pa.Schema,
    max_message_bytes: int,
    max_decompressed_bytes: int,
    where: str,
) -> ValidatedRecords:
    """Check a producer's records for a log whose schema is ``log_schema``; see the module docstring."""
    data = memoryview(records)
    if not data:
        raise CorruptRecordError(f"{where}: no records")
    schema, schema_size = decode_schema(data, where=where)
    check_schema_evolution(log_schema, schema)
    batches: list[tuple[StoredBatch, pa.RecordBatch]] = []
    inflated = 0
    for stored in iter_batches(data, start=schema_size, where=where):
        if stored.size > max_message_bytes:
            raise RecordTooLargeError(
                f"{where}: a batch of {stored.size} bytes exceeds max.message.bytes {max_message_bytes}"
            )
        stored.verify_crc(where=where)
        inflated += decoded_body_size(stored)
        if inflated > max_decompressed_bytes:
            raise RecordTooLargeError(
                f"{where}: batches would decompress to more than {max_decompressed_bytes} bytes"
            )
        batch = stored.decode(schema, validate=True)
        if batch.num_rows != stored.header.record_count:
            raise CorruptRecordError(
                f"{where}: batch says {stored.header.record_count} records but holds {batch.num_rows}"
            )
        if stored.version == 2:  # stored as sent: its offsets must be what the broker will patch
            _check_offsets(stored, batch, where)
        timestamps = batch.column(1)
        if timestamps.null_count:
            raise CorruptRecordError(f"{where}: timestamps must not be null")
        if pc.max(timestamps.view(pa.int64())).as_py() != stored.header.max_timestamp:
            raise CorruptRecordError(
                f"{where}: the batch says its max timestamp is {stored.header.max_timestamp}, "
                "which is not the largest of its timestamps"
            )
        batches.append((stored, batch))
    if not batches:
        raise CorruptRecordError(f"{where}: the stream holds a schema but no batch")
    for stored, _ in batches:
        h = stored.header
        if h.is_control:
            raise InvalidRequestError(f"{where}: clients cannot write control batches")
        if h.is_transactional and h.producer_id == NO_PRODUCER_ID:
            raise InvalidRequestError("a transactional batch needs a producer id")
    return ValidatedRecords(schema, tuple(batches))


def _check_offsets(stored: StoredBatch, batch: pa.RecordBatch, where: str) -> None:
    h = stored.header
    offsets = batch.column(0)
    n = batch.num_rows
    if (offsets.null_count or h.last_offset_delta != n - 1
            or not np.array_equal(offsets.to_numpy() - h.base_offset, np.arange(n))):
        raise CorruptRecordError(
            f"{where}: a produced batch's offsets must be its base offset + 0, 1, ... {n - 1}, without gaps"
        )


def assign_offsets(stored: StoredBatch, *, base_offset: int, leader_epoch: int,
                   log_append_time: int | None = None) -> EncodedBatch | None:
    """The valid producer batch ``stored`` as it is stored at ``base_offset``, without copying its body.

    Patched: the base offset and leader epoch digits of the facts, and the
    offset column's values (``base_offset + i``) given as a new piece in
    place of the producer's (:func:`validate_records` checked they are its
    base offset ``+ i``). The digits lie outside the CRC and the offsets
    enter it relative to the base offset, so the CRC stays the producer's.
    With ``log_append_time`` (a LogAppendTime topic) the timestamps and max
    timestamp become that time as well, and the CRC is computed again (it
    covers them).

    Returns None when the batch cannot be stored as sent — a format-1 batch
    from an older client, a compressed body (its offsets are compressed), a
    batch whose offsets have gaps, or attribute bits the broker would
    clear —: the caller re-encodes it.
    """
    h = stored.header
    if stored.version != 2 or h.attributes & ~ATTR_TRANSACTIONAL or h.last_offset_delta != h.record_count - 1:
        return None
    layout = stored.layout()
    n = h.record_count
    (o0, o1), (t0, t1) = layout.offsets, layout.timestamps
    if layout.rows != n or layout.offset_nulls or o1 - o0 != 8 * n or t1 - t0 != 8 * n or not o1 <= t0:
        return None
    data = stored.data
    head = bytearray(data[:stored.body_start])
    f = layout.facts_at
    header = dataclasses.replace(h, base_offset=base_offset, leader_epoch=leader_epoch)
    pieces: list[bytes | memoryview] = [data[stored.body_start:o0], np.arange(base_offset, base_offset + n, dtype="<i8").data]
    if log_append_time is None:
        pieces.append(data[o1:])
    else:
        header = dataclasses.replace(header, max_timestamp=log_append_time)
        pieces += [data[o1:t0], np.full(n, log_append_time, dtype="<i8").data, data[t1:]]
        head[f:f + FACTS_LENGTH] = header.facts()
        header = header.with_crc(crc_v2([head, *pieces], layout, base_offset=base_offset, compressed=False))
    head[f:f + FACTS_LENGTH] = header.facts()
    return EncodedBatch(header=header, head=bytes(head), body_pieces=tuple(pieces),
                        body_size=len(data) - stored.body_start)


def stored_as_appended(stored: StoredBatch, batch: pa.RecordBatch, *, base_offset: int, leader_epoch: int,
                       log_append_time: int | None) -> EncodedBatch:
    """What is stored for the valid producer batch ``stored`` (``batch`` decoded): the sent bytes
    patched by :func:`assign_offsets`, or, when they cannot be, ``batch`` encoded again."""
    patched = assign_offsets(stored, base_offset=base_offset, leader_epoch=leader_epoch,
                             log_append_time=log_append_time)
    if patched is not None:
        return patched
    h = stored.header
    return encode_batch(
        batch if log_append_time is None else with_append_time(batch, log_append_time), base_offset=base_offset,
        leader_epoch=leader_epoch, producer_id=h.producer_id, producer_epoch=h.producer_epoch,
        base_sequence=h.base_sequence, attributes=h.attributes & ATTR_TRANSACTIONAL, compression=h.compression,
    )


def with_append_time(batch: pa.RecordBatch, now_ms: int) -> pa.RecordBatch:
    """``batch`` with every timestamp set to ``now_ms`` (a LogAppendTime topic)."""
    columns = batch.columns
    columns[1] = pa.array(np.full(batch.num_rows, now_ms, dtype=np.int64)).cast(TIMESTAMP_TYPE)
    return pa.RecordBatch.from_arrays(columns, schema=batch.schema)
