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
  transactional batch names a producer id.

Errors: :class:`~logstore.errors.CorruptRecordError`,
:class:`~logstore.errors.RecordTooLargeError`,
:class:`~logstore.errors.SchemaMismatchError` or
:class:`~logstore.errors.InvalidRequestError`, the message starting with
``where``. The first failing check fails the whole stream: nothing of it
may be appended.

Thread-safety: a pure function of its arguments.
"""

from __future__ import annotations

from dataclasses import dataclass

import pyarrow as pa

from logstore.errors import CorruptRecordError, InvalidRequestError, RecordTooLargeError
from logstore.record import NO_PRODUCER_ID, check_schema_evolution, decode_schema
from logstore.record_reader import StoredBatch, decoded_body_size, iter_batches

__all__ = ["ValidatedRecords", "validate_records"]


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
        if batch.column(1).null_count:
            raise CorruptRecordError(f"{where}: timestamps must not be null")
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
