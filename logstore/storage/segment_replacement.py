"""Broker-side support of the log cleaner: replacement segments for a run of closed
segments, checked byte by byte and swapped in atomically.

Which records survive a compaction is decided outside the broker (the Spark job
in ``compaction/``). The broker only accepts *replacement segments* for a run of
closed segments, checks every byte of them, and swaps them in atomically; the
gRPC layer (``DescribeCleaning`` / ``ReplaceSegments``) wraps this module, which
knows nothing of gRPC. What may be replaced is :mod:`logstore.storage.cleanable`'s
to say; the swap's files, its commit point and crash recovery are
:mod:`logstore.storage.segment_swap`'s. This module works on a partition
directory and a segment list (:class:`ReplaceableLog`), not on the log itself.

Swap protocol
-------------
1. :meth:`SegmentReplacement.add` writes the replacement segments as
   ``.cleaned`` files while the batches arrive; :meth:`SegmentReplacement.finish`
   seals them (final time-index entry) and fsyncs files and directory. The log
   is not locked meanwhile: appends and reads go on.
2. Under the log's lock (:meth:`SegmentReplacement.commit`, called by
   :meth:`logstore.storage.log.Log.replace_segments`): the replaced segments must
   still be exactly the ones the replacement was planned against (same base
   offset, next offset and size, consecutive, closed, followed by a segment
   starting at the expected end offset) and end at or below the last stable
   offset; otherwise :class:`~logstore.errors.CompactionConflictError` and
   nothing changes.
3. Every ``.cleaned`` file is renamed to ``.swap``; the directory is fsynced.
4. ``swap-manifest`` is written atomically: **the commit point**.
5. Roll forward: the replaced segments' files whose base offset is not a
   replacement's are deleted; every ``.swap`` file is renamed over its final
   name (replacing the replaced segment of the same base offset); fsync the
   directory; write the cleaner checkpoint; remove ``swap-manifest``; fsync.
6. The log's segment list is replaced in memory (one list assignment).

(Steps 4 and 5, the file formats and recovery: :mod:`logstore.storage.segment_swap`.)

The first replacement segment has the first replaced segment's base offset,
so the log start offset never moves; later ones are named by their first
batch. A replacement segment holds at most ``segment.bytes`` (a single larger
batch gets a segment of its own) and one schema; several small replaced
segments are merged. Offsets never change: a replacement holds a subset of the
replaced records at their original offsets, in their original order, each
batch with a valid CRC (gaps appear; nothing is renumbered).

Crash behaviour
---------------
A crash at any moment leaves either all the old or all the new segments,
never a mix (:func:`logstore.storage.segment_swap.recover_interrupted_swap`
runs when a log opens). In a running broker, a failure after the commit point
marks the log offline (reopening completes the swap); a failure before it
only discards the replacement.

Readers
-------
:meth:`~logstore.storage.log.Log.read` works on a snapshot of the segment list. A reader
that took the old list keeps reading the replaced segments through their open
file descriptors (a deleted or renamed-over file stays readable) and their
indexes, which are loaded in memory before any file is replaced; so no read
ever mixes old and new segments.

Thread-safety: a :class:`SegmentReplacement` is fed from one thread at a time
and may be aborted from any thread (it has its own lock). At most one
replacement per partition directory exists in a process at a time (a second
:meth:`SegmentReplacement.begin` raises :class:`CompactionConflictError`); it is
released by commit or abort, so a failed or abandoned compaction never blocks
the next one.
"""

from __future__ import annotations

import contextlib
import os
import threading
from collections.abc import Sequence
from typing import Protocol

import numpy as np
import pyarrow as pa

from logstore.cleaning import CleanableSegment
from logstore.errors import (
    CompactionConflictError,
    CorruptRecordError,
    InvalidRequestError,
    StorageError,
)
from logstore.record import decode_schema, encode_schema
from logstore.record_reader import StoredBatch, iter_batches
from logstore.storage.config import LogConfig
from logstore.storage.fileutil import fsync_dir
from logstore.storage.index import OffsetIndex, TimeIndex
from logstore.storage.segment import (
    INDEX_SUFFIX,
    SEGMENT_SUFFIX,
    TIMEINDEX_SUFFIX,
    Segment,
    segment_file_name,
)
from logstore.storage.segment_swap import (
    CLEANED_SUFFIX,
    SEGMENT_FILE_SUFFIXES,
    SWAP_MANIFEST_FILE,
    SWAP_SUFFIX,
    commit_swap,
    remove_leftovers,
    run_swap_hook,
)

__all__ = [
    "ReplaceableLog",
    "segment_summary",
    "SegmentReplacement",
    "SwapIncompleteError",
    "replacement_in_progress",
]

# As the log rolls: keep relative offsets well inside the index's u32.
_MAX_OFFSETS_PER_SEGMENT = 2**31


# --------------------------------------------------------------------------- what is replaced


class ReplaceableLog(Protocol):
    """What a replacement reads of the log whose segments it replaces
    (:class:`logstore.storage.log.Log` is one)."""

    @property
    def directory(self) -> str: ...

    @property
    def config(self) -> LogConfig: ...

    @property
    def offline_reason(self) -> str | None: ...

    @property
    def segments(self) -> list[Segment]: ...


def segment_summary(segment: Segment) -> CleanableSegment:
    """``segment`` as the cleaner sees it (:class:`logstore.cleaning.CleanableSegment`)."""
    return CleanableSegment(segment.base_offset, segment.next_offset, segment.size, segment.max_timestamp)


def _same_segment(summary: CleanableSegment, segment: Segment) -> bool:
    """Whether ``segment`` is still the one ``summary`` was taken of (its identity)."""
    return (segment.base_offset, segment.next_offset, segment.size) == (
        summary.base_offset, summary.next_offset, summary.size_bytes)


# --------------------------------------------------------------------------- one replacement segment


class _ReplacementSegment:
    """One replacement segment being written as ``.cleaned`` files (segment and index formats)."""

    def __init__(self, directory: str, base_offset: int, schema: pa.Schema,
                 *, index_interval_bytes: int) -> None:
        self.directory = directory
        self.base_offset = base_offset
        self.schema = schema
        self.index_interval_bytes = index_interval_bytes
        self.data_path = self.path(SEGMENT_SUFFIX, CLEANED_SUFFIX)
        self._fd: int | None = os.open(self.data_path, os.O_RDWR | os.O_CREAT | os.O_TRUNC, 0o644)
        head = encode_schema(schema)
        self._write(head, 0)
        self.size = len(head)
        self.offset_index = OffsetIndex(self.path(INDEX_SUFFIX, CLEANED_SUFFIX), base_offset)
        self.time_index = TimeIndex(self.path(TIMEINDEX_SUFFIX, CLEANED_SUFFIX), base_offset)
        self.offset_index.reset()
        self.time_index.reset()
        self.batches = 0
        self.max_timestamp = -1
        self._last_batch_offset = -1
        self._bytes_since_index_entry = 0

    def path(self, file_suffix: str, state_suffix: str = "") -> str:
        return os.path.join(self.directory, segment_file_name(self.base_offset, file_suffix) + state_suffix)

    def _write(self, data: bytes | memoryview, position: int) -> None:
        assert self._fd is not None
        written = os.pwrite(self._fd, data, position)
        if written != len(data):
            raise OSError(f"{self.data_path}: short write ({written} of {len(data)} bytes)")

    def append(self, batch: StoredBatch) -> None:
        """Write ``batch`` at the end and index it as :class:`Segment` does."""
        h = batch.header
        position = self.size
        self._write(batch.data, position)
        if self._last_batch_offset < 0 or self._bytes_since_index_entry >= self.index_interval_bytes:
            self.offset_index.append(h.base_offset, position)
            self.time_index.maybe_append(max(self.max_timestamp, h.max_timestamp), h.base_offset)
            self._bytes_since_index_entry = 0
        self._bytes_since_index_entry += batch.size
        self._last_batch_offset = h.base_offset
        self.max_timestamp = max(self.max_timestamp, h.max_timestamp)
        self.size = position + batch.size
        self.batches += 1

    def seal(self) -> None:
        """Final time-index entry (as :meth:`Segment.seal`); fsync and close every file."""
        if self._last_batch_offset >= 0:
            self.time_index.maybe_append(self.max_timestamp, self._last_batch_offset)
        assert self._fd is not None
        os.fsync(self._fd)
        self.offset_index.flush()
        self.time_index.flush()
        self.close()

    def close(self) -> None:
        self.offset_index.close()
        self.time_index.close()
        if self._fd is not None:
            os.close(self._fd)
            self._fd = None

    def rename(self, from_suffix: str, to_suffix: str) -> None:
        for suffix in SEGMENT_FILE_SUFFIXES:
            os.replace(self.path(suffix, from_suffix), self.path(suffix, to_suffix))

    def remove_files(self) -> None:
        for state in (CLEANED_SUFFIX, SWAP_SUFFIX):
            for suffix in SEGMENT_FILE_SUFFIXES:
                with contextlib.suppress(FileNotFoundError):
                    os.remove(self.path(suffix, state))


# --------------------------------------------------------------------------- the replacement


class SwapIncompleteError(Exception):
    """A swap failed after its commit point; reopening the log completes it."""


_active_lock = threading.Lock()
_active: set[str] = set()


def replacement_in_progress(directory: str) -> bool:
    """Whether a :class:`SegmentReplacement` of the log in ``directory`` is open in this process."""
    with _active_lock:
        return os.path.realpath(directory) in _active


def _locate(segments: Sequence[Segment], replaced: Sequence[CleanableSegment], end_offset: int,
            *, where: str) -> tuple[int, int]:
    """Indexes ``[first, end)`` of ``replaced`` in ``segments``; raise CompactionConflictError
    unless they are there unchanged, consecutive, closed and followed by ``end_offset``."""
    bases = [s.base_offset for s in segments]
    try:
        first = bases.index(replaced[0].base_offset)
    except ValueError:
        raise CompactionConflictError(
            f"{where}: segment {replaced[0].base_offset} is no longer in the log "
            "(deleted by retention or replaced by another compaction); plan again"
        ) from None
    end = first + len(replaced)
    if end >= len(segments):
        raise CompactionConflictError(
            f"{where}: the segments to replace reach the active segment {segments[-1].base_offset} "
            "(the log was truncated?); plan again"
        )
    for want, seg in zip(replaced, segments[first:end], strict=True):
        if not _same_segment(want, seg):
            raise CompactionConflictError(
                f"{where}: segment {want.base_offset} changed since the compaction was planned "
                f"(planned: offsets up to {want.next_offset}, {want.size_bytes} bytes; now: segment "
                f"{seg.base_offset}, offsets up to {seg.next_offset}, {seg.size} bytes); plan again"
            )
    if segments[end].base_offset != end_offset:
        raise CompactionConflictError(
            f"{where}: the segment after the replaced ones starts at {segments[end].base_offset}, "
            f"not at the planned end offset {end_offset}; plan again"
        )
    return first, end


class SegmentReplacement:
    """Replacement segments for a run of closed segments of one log; see the module docstring.

    Life cycle: :meth:`begin` → :meth:`add` (any number of times) →
    :meth:`finish` → :meth:`commit` (through :meth:`logstore.storage.log.Log.replace_segments`);
    :meth:`abort` at any point discards everything written (a no-op after a
    commit). Every error of :meth:`add` leaves the replacement unusable:
    abort it.
    """

    def __init__(self, log: ReplaceableLog, replaced: tuple[CleanableSegment, ...], end_offset: int,
                 checkpoint: int, schemas: list[pa.Schema], key: str) -> None:
        self.directory = log.directory
        self.replaced = replaced
        self.end_offset = end_offset
        self.checkpoint = checkpoint
        self._where = f"compaction of {os.path.basename(log.directory)}"
        self._segment_bytes = log.config.segment_bytes
        self._index_interval_bytes = log.config.index_interval_bytes
        self._schemas = schemas
        self._key = key
        self._lock = threading.Lock()
        self._released = False
        self._state = "open"  # open → finished → committed | aborted; failed after an add error
        self._schema: pa.Schema | None = None
        self._writers: list[_ReplacementSegment] = []
        self._next_offset = replaced[0].base_offset
        self.batches = 0
        self.records = 0

    # ------------------------------------------------------------------ begin

    @classmethod
    def begin(cls, log: ReplaceableLog, *, replaced: Sequence[CleanableSegment], end_offset: int,
              checkpoint: int | None = None) -> SegmentReplacement:
        """Start replacing the consecutive closed segments ``replaced`` (oldest first),
        which end where the segment with base offset ``end_offset`` starts.

        ``checkpoint`` is the first dirty offset recorded on success (default
        ``end_offset``). Raises :class:`InvalidRequestError` for malformed
        arguments and :class:`CompactionConflictError` when the segments are
        not (or no longer) in the log as described, or when another
        replacement of this log is open.
        """
        where = f"compaction of {os.path.basename(log.directory)}"
        replaced = tuple(replaced)
        if not replaced:
            raise InvalidRequestError(f"{where}: name at least one segment to replace")
        bases = [s.base_offset for s in replaced]
        if any(b >= a for b, a in zip(bases, bases[1:], strict=False)):
            raise InvalidRequestError(f"{where}: replaced segments must be in increasing offset order, got {bases}")
        if end_offset <= bases[-1]:
            raise InvalidRequestError(f"{where}: end offset {end_offset} must follow the last replaced segment {bases[-1]}")
        checkpoint = end_offset if checkpoint is None or checkpoint < 0 else checkpoint
        key = os.path.realpath(log.directory)
        with _active_lock:
            if key in _active:
                raise CompactionConflictError(f"{where}: another compaction of this partition is in progress")
            _active.add(key)
        try:
            if log.offline_reason is not None:
                raise StorageError(f"{where}: the partition is offline: {log.offline_reason}")
            if os.path.exists(os.path.join(log.directory, SWAP_MANIFEST_FILE)):
                raise StorageError(f"{where}: an interrupted segment swap awaits recovery; reopen the partition")
            segments = log.segments
            first, end = _locate(segments, replaced, end_offset, where=where)
            schemas = [s.schema for s in segments[first:end]]
            remove_leftovers(log.directory)
            return cls(log, replaced, end_offset, checkpoint, schemas, key)
        except BaseException:
            with _active_lock:
                _active.discard(key)
            raise

    # ------------------------------------------------------------------ add

    def add(self, schema_message: bytes | memoryview = b"", records: bytes | memoryview = b"") -> None:
        """Accept more of the replacement: an optional stored schema message (it applies
        to these and later batches and must be a replaced segment's schema), then whole
        stored batch messages in offset order.

        Every batch is checked before it is written: framing, CRC32C, full Arrow
        validation against the schema, record count, an offset column that
        matches the header and increases, non-null timestamps, offsets inside
        the replaced range and above the previous batch. Raises
        :class:`CorruptRecordError`, :class:`InvalidRequestError` or
        :class:`SchemaMismatchError` naming the batch.
        """
        with self._lock:
            if self._state != "open":
                raise InvalidRequestError(f"{self._where}: the replacement is {self._state}")
            try:
                if schema_message:
                    self._schema = self._accept_schema(schema_message)
                if records:
                    if self._schema is None:
                        raise InvalidRequestError(f"{self._where}: the first chunk must carry the schema")
                    for stored in iter_batches(memoryview(records), where=self._where):
                        self._check_batch(stored, self._schema)
                        self._writer_for(stored).append(stored)
                        self._next_offset = stored.header.next_offset
                        self.batches += 1
                        self.records += stored.header.record_count
            except BaseException:
                self._state = "failed"
                raise

    def _accept_schema(self, message: bytes | memoryview) -> pa.Schema:
        schema, _ = decode_schema(message, where=self._where)
        for known in self._schemas:
            if known.equals(schema, check_metadata=False):
                return known
        raise InvalidRequestError(
            f"{self._where}: schema {schema.to_string(show_schema_metadata=False)!r} is not the "
            "schema of any replaced segment"
        )

    def _check_batch(self, stored: StoredBatch, schema: pa.Schema) -> None:
        h = stored.header
        at = f"{self._where}: batch at offset {h.base_offset}"
        stored.verify_crc(where=self._where)
        if h.base_offset < self._next_offset:
            raise InvalidRequestError(
                f"{at} does not follow the previous batch (next offset {self._next_offset}): "
                "offsets must increase and stay at or above the first replaced segment"
            )
        if h.next_offset > self.end_offset:
            raise InvalidRequestError(
                f"{at} ends at {h.next_offset}, beyond the replaced range "
                f"[{self.replaced[0].base_offset}, {self.end_offset})"
            )
        batch = stored.decode(schema, validate=True)
        if batch.num_rows != h.record_count:
            raise CorruptRecordError(f"{at} says {h.record_count} records but holds {batch.num_rows}")
        offsets = batch.column(0).to_numpy()
        if (offsets[0] != h.base_offset or offsets[-1] != h.last_offset
                or (len(offsets) > 1 and bool(np.any(np.diff(offsets) <= 0)))):
            raise CorruptRecordError(
                f"{at}: its offset column does not match the header (must start at "
                f"{h.base_offset}, end at {h.last_offset} and increase)"
            )
        if batch.column(1).null_count:
            raise CorruptRecordError(f"{at}: timestamps must not be null")

    def _writer_for(self, stored: StoredBatch) -> _ReplacementSegment:
        assert self._schema is not None
        h = stored.header
        current = self._writers[-1] if self._writers else None
        if current is not None and not (
            current.schema is not self._schema
            or current.size + stored.size > self._segment_bytes
            or h.last_offset - current.base_offset >= _MAX_OFFSETS_PER_SEGMENT
        ):
            return current
        base = self.replaced[0].base_offset if current is None else h.base_offset
        return self._new_writer(base, self._schema)

    def _new_writer(self, base_offset: int, schema: pa.Schema) -> _ReplacementSegment:
        writer = _ReplacementSegment(self.directory, base_offset, schema,
                                     index_interval_bytes=self._index_interval_bytes)
        self._writers.append(writer)
        return writer

    # ------------------------------------------------------------------ finish / commit / abort

    @property
    def size_bytes(self) -> int:
        """Bytes of the replacement segments written so far."""
        return sum(w.size for w in self._writers)

    @property
    def new_base_offsets(self) -> list[int]:
        return [w.base_offset for w in self._writers]

    def finish(self) -> None:
        """Seal every replacement segment and fsync it and the directory (no log lock needed).

        An empty replacement (every record removed) becomes one empty segment
        at the first replaced base offset, so the log start offset stays put.
        """
        with self._lock:
            if self._state != "open":
                raise InvalidRequestError(f"{self._where}: the replacement is {self._state}")
            try:
                if not self._writers:
                    self._new_writer(self.replaced[0].base_offset, self._schema or self._schemas[0])
                for writer in self._writers:
                    writer.seal()
                fsync_dir(self.directory)
                run_swap_hook("cleaned-written")
            except BaseException:
                self._state = "failed"
                raise
            self._state = "finished"

    def commit(self, segments: Sequence[Segment], *, max_end_offset: int, index_interval_bytes: int,
               created_ms: int) -> tuple[int, int, list[Segment]]:
        """Swap the replacement in (steps 2-5 of the module docstring); the caller holds
        the log's lock and installs the result (step 6).

        ``segments`` is the log's current segment list; returns ``(first, end,
        new)``: ``segments[first:end]`` are replaced by ``new``. Raises
        :class:`CompactionConflictError` or :class:`StorageError` before the
        commit point (the replacement is discarded, the log untouched) and
        :class:`SwapIncompleteError` after it.
        """
        with self._lock:
            if self._state != "finished":
                raise InvalidRequestError(f"{self._where}: the replacement is {self._state}, not finished")
            try:
                first, end = _locate(segments, self.replaced, self.end_offset, where=self._where)
                if self.replaced[-1].next_offset > max_end_offset:
                    raise CompactionConflictError(
                        f"{self._where}: the replaced segments end at {self.replaced[-1].next_offset}, "
                        f"above the last stable offset {max_end_offset}; plan again"
                    )
                for old in segments[first:end]:
                    # Loaded now, so a reader of the old list never loads a new index file.
                    len(old.offset_index)
                    len(old.time_index)
                for writer in self._writers:
                    writer.rename(CLEANED_SUFFIX, SWAP_SUFFIX)
                    run_swap_hook(f"swap-renamed:{writer.base_offset}")
                fsync_dir(self.directory)
                run_swap_hook("swap-renamed")
            except OSError as e:
                self._discard_locked()
                raise StorageError(f"{self._where}: preparing the swap failed: {e}") from e
            except BaseException:
                self._discard_locked()
                raise
            self._state = "committed"
            try:
                commit_swap(self.directory, replaced=[s.base_offset for s in self.replaced],
                            segments=self.new_base_offsets, checkpoint=self.checkpoint)
                new = []
                for base in self.new_base_offsets:
                    seg = Segment.open(self.directory, base, index_interval_bytes=index_interval_bytes,
                                       created_ms=created_ms)
                    seg.load()
                    new.append(seg)
            except Exception as e:
                raise SwapIncompleteError(
                    f"{self._where}: the segment swap failed after its commit point ({e}); "
                    "reopening the partition completes it"
                ) from e
            # Still "in progress" for describe_cleaning until the log has installed the new
            # segments: the caller calls release() then (else a reader could see the
            # replacement done while the log still serves the old list).
            for old in segments[first:end]:
                old.detach()
                old.offset_index.close()
                old.time_index.close()
            return first, end, new

    def abort(self) -> None:
        """Discard whatever was written (idempotent; a no-op after a commit)."""
        with self._lock:
            if self._state in ("committed", "aborted"):
                return
            self._discard_locked()

    def _discard_locked(self) -> None:
        self._state = "aborted"
        try:
            for writer in self._writers:
                writer.close()
                writer.remove_files()
            with contextlib.suppress(OSError):
                fsync_dir(self.directory)
        finally:
            self.release()

    def release(self) -> None:
        """End this replacement's hold on its log (idempotent): after a commit, once the log
        has installed the new segments; otherwise done by :meth:`abort` and failures."""
        with _active_lock:
            if not self._released:
                self._released = True
                _active.discard(self._key)
