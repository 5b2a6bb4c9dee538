"""What :meth:`logstore.storage.log.Log.read` returns: whole stored batches from one
segment, plus the log's bounds at the time of the read.

Offsets and ends are as in :mod:`logstore.storage.log` (end offsets exclusive).
The batches are views of the bytes read from the segment file (``os.pread``,
not a memory map), so a result stays valid after that segment is closed,
deleted or replaced.

Thread-safety: an immutable value; :meth:`LogReadResult.decode` may be called
from any thread.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import pyarrow as pa

from logstore.record_reader import StoredBatch

__all__ = ["LogReadResult"]


@dataclass(frozen=True, slots=True)
class LogReadResult:
    """Batches read from one segment, plus the log's bounds at the time of the read.

    ``data`` is the stored bytes of ``batches`` back to back (serve them as
    they are); ``decode()`` turns them into Arrow record batches.
    ``next_offset`` is where the next read should start.
    """

    start_offset: int
    schema: pa.Schema
    batches: list[StoredBatch]
    data: memoryview
    next_offset: int
    log_start_offset: int
    log_end_offset: int
    upper_bound: int

    @property
    def record_count(self) -> int:
        return sum(b.header.record_count for b in self.batches)

    def decode(self, *, include_control: bool = False) -> list[pa.RecordBatch]:
        """Arrow batches of the records at offsets ``>= start_offset`` (zero-copy where possible)."""
        out: list[pa.RecordBatch] = []
        for b in self.batches:
            if b.header.is_control and not include_control:
                continue
            rb = b.decode(self.schema)
            if b.header.base_offset < self.start_offset:
                offsets = rb.column(0).to_numpy()
                rb = rb.slice(int(np.searchsorted(offsets, self.start_offset)))
            if rb.num_rows:
                out.append(rb)
        return out

    def to_table(self) -> pa.Table:
        return pa.Table.from_batches(self.decode(), schema=self.schema)
