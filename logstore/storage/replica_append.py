"""Checking a leader's batches before a follower stores them byte for byte.

A follower appends what its leader's Fetch answer carries: the schema message
of the segment the records come from, then stored batch messages exactly as
they are on the leader's disk (DESIGN.md §4b: replicas are byte-identical).
Nothing is re-encoded, so nothing the follower stores can differ from the
leader's copy — but bytes that crossed a network are verified first, as Kafka's
follower validates fetched batches:

* the schema message decodes and has the stored columns;
* every batch parses (framing, Arrow metadata, facts) and its CRC32C matches;
* the first batch starts at or after the follower's LEO (gaps are allowed:
  compaction leaves them on the leader) and every next batch starts at or
  after the previous batch's next offset;
* the records are whole batches (a cut-off tail is refused, not trimmed).

Any failure raises :class:`~logstore.errors.CorruptRecordError` naming the
partition and the batch, and the caller writes nothing of the answer.

Thread-safety: pure functions.
"""

from __future__ import annotations

import pyarrow as pa

from logstore.errors import CorruptRecordError
from logstore.record import decode_schema
from logstore.record_reader import StoredBatch, iter_batches

__all__ = ["verify_replica_batches"]


def verify_replica_batches(schema_message: bytes | memoryview, records: memoryview, *,
                           log_end_offset: int, where: str) -> tuple[pa.Schema, list[StoredBatch]]:
    """The schema and the parsed batches of a leader's answer, checked as the module says.

    ``log_end_offset`` is the follower's LEO; ``where`` names the partition in errors.
    """
    schema, size = decode_schema(schema_message, where=f"{where}: schema from the leader")
    if size != len(schema_message):
        raise CorruptRecordError(
            f"{where}: the leader's schema message has {len(schema_message) - size} trailing bytes"
        )
    batches: list[StoredBatch] = []
    next_offset = log_end_offset
    for batch in iter_batches(records, where=f"{where}: records from the leader"):
        batch.verify_crc(where=f"{where}: records from the leader")
        h = batch.header
        if h.base_offset < next_offset:
            raise CorruptRecordError(
                f"{where}: the leader's batch at offset {h.base_offset} (position {batch.position} of the "
                f"answer) does not follow offset {next_offset - 1}: offsets must increase past the LEO"
            )
        batches.append(batch)
        next_offset = h.next_offset
    return schema, batches
