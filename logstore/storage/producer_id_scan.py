"""The largest producer id in a partition directory that cannot be opened, read off its files.

The single broker never hands out a producer id a partition holds
(:mod:`logstore.broker.transactions.producer_id_block`). An online partition
says so from its producer state
(:attr:`~logstore.storage.producer_state.ProducerStateManager.max_producer_id`);
for an offline one (damaged files, or a topic whose metadata file is missing)
:func:`max_producer_id_on_disk` reads the producer-state snapshot and the batch
headers of every segment (headers only: no CRC check, nothing written). A torn
tail ends a segment's scan (such a batch was never acknowledged); anything else
that stops the scan before a segment's end makes the answer incomplete, and the
reason is returned.

Thread-safety: reads files only; safe to call on a directory no log has open.
"""

from __future__ import annotations

import mmap
import os

from logstore.errors import CorruptRecordError, SchemaMismatchError
from logstore.producer_id_layout import counter_of
from logstore.record import NO_PRODUCER_ID, decode_schema
from logstore.record_reader import IncompleteBatchError, parse_batch_at
from logstore.storage.producer_state import ProducerStateManager
from logstore.storage.segment import SEGMENT_SUFFIX

__all__ = ["max_producer_id_on_disk"]

_SCHEMA_HEAD_BYTES = 64 * 1024
_WINDOW_BYTES = 64 * 1024


def max_producer_id_on_disk(directory: str) -> tuple[int, str | None]:
    """The largest producer id ``directory``'s snapshot or batches hold (-1: none), and why the
    answer is incomplete (None: every segment was read to its end)."""
    state = ProducerStateManager(directory)
    state.load_snapshot(log_end_offset=2**63 - 1)
    best = state.max_producer_id
    for name in sorted(os.listdir(directory)):
        if not name.endswith(SEGMENT_SUFFIX):
            continue
        path = os.path.join(directory, name)
        found, problem = _scan_segment(path)
        best = max(best, found)
        if problem is not None:
            return best, problem
    return best, None


def _scan_segment(path: str) -> tuple[int, str | None]:
    best = NO_PRODUCER_ID
    with open(path, "rb") as f:
        size = os.fstat(f.fileno()).st_size
        if size == 0:
            return best, None
        with mmap.mmap(f.fileno(), 0, access=mmap.ACCESS_READ) as mapped:
            try:
                _, pos = decode_schema(mapped[:_SCHEMA_HEAD_BYTES], where=path)
            except (CorruptRecordError, SchemaMismatchError) as e:
                return best, e.message
            window = _WINDOW_BYTES
            while pos < size:
                chunk = memoryview(mapped[pos:pos + window])  # a copy: the map stays closable
                try:
                    batch = parse_batch_at(chunk, 0, where=path, base_position=pos)
                except IncompleteBatchError as e:
                    if pos + len(chunk) >= size:
                        break  # a torn tail: never acknowledged
                    window = max(e.needed, 2 * window)
                    continue
                except CorruptRecordError as e:
                    return best, e.message
                best = max(best, counter_of(batch.header.producer_id))
                pos += batch.size
                window = _WINDOW_BYTES
    return best, None
