"""Broker-side support of the log cleaner: cleaning state (dirty ratio), the cleaner
checkpoint, and the atomic swap of closed segments for compacted ones.

Which records survive a compaction is decided outside the broker (the Spark job
in ``compaction/``). The broker only accepts *replacement segments* for a run of
closed segments, checks every byte of them, and swaps them in atomically; the
gRPC layer (``DescribeCleaning`` / ``ReplaceSegments``) wraps this module, which
knows nothing of gRPC.

Files in a partition directory
------------------------------
``cleaner-offset-checkpoint``
    The *first dirty offset* as a decimal line, replaced atomically by every
    successful swap: the segments wholly below it have been compacted.
    Absent (or unreadable) = nothing was compacted yet. It only steers *when*
    to compact (the dirty ratio); losing it never loses data.
``<base>.arrow.cleaned``, ``<base>.index.cleaned``, ``<base>.timeindex.cleaned``
    A replacement segment being written: same formats as a segment
    (:mod:`logstore.storage.segment`, :mod:`logstore.storage.index`). Never part of the log.
``<base>.arrow.swap``, ``<base>.index.swap``, ``<base>.timeindex.swap``
    A complete, fsynced replacement segment, renamed from ``.cleaned`` just
    before the commit point.
``swap-manifest``
    The commit record of one swap, JSON written atomically::

        {"version": 1, "replaced": [base offsets of the replaced segments],
         "segments": [base offsets of the replacement segments], "checkpoint": 1234}

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

The first replacement segment has the first replaced segment's base offset,
so the log start offset never moves; later ones are named by their first
batch. A replacement segment holds at most ``segment.bytes`` (a single larger
batch gets a segment of its own) and one schema; several small replaced
segments are merged. Offsets never change: a replacement holds a subset of the
replaced records at their original offsets, in their original order, each
batch with a valid CRC (gaps appear; nothing is renumbered).

Crash behaviour
---------------
:func:`recover_interrupted_swap` runs when a log opens, before its segments are
listed. With a ``swap-manifest`` it repeats step 5 (each step is idempotent,
so a crash during recovery is recovered the same way); without one it deletes
every ``.cleaned`` and ``.swap`` file: the swap did not commit and the
replaced segments were never touched. A crash at any moment therefore leaves
either all the old or all the new segments, never a mix. In a running broker,
a failure after the commit point marks the log offline (reopening completes
the swap); a failure before it only discards the replacement.

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
the next one. :func:`cleaning_state` reads a snapshot and takes no lock.
"""

from __future__ import annotations

import contextlib
import json
import logging
import os
import threading
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING

import numpy as np
import pyarrow as pa

from logstore.errors import (
    CompactionConflictError,
    CorruptRecordError,
    InvalidRequestError,
    LogOfflineError,
    StorageError,
)
from logstore.record import StoredBatch, decode_schema, encode_schema, iter_batches
from logstore.storage.fileutil import fsync_dir, read_text_or, write_atomically
from logstore.storage.index import OffsetIndex, TimeIndex
from logstore.storage.segment import (
    INDEX_SUFFIX,
    SEGMENT_SUFFIX,
    TIMEINDEX_SUFFIX,
    Segment,
    segment_file_name,
)

if TYPE_CHECKING:
    from logstore.storage.log import Log

__all__ = [
    "CLEANER_CHECKPOINT_FILE",
    "SWAP_MANIFEST_FILE",
    "CLEANED_SUFFIX",
    "SWAP_SUFFIX",
    "SegmentSummary",
    "CleaningState",
    "SegmentReplacement",
    "SwapIncompleteError",
    "cleaning_state",
    "read_cleaner_checkpoint",
    "write_cleaner_checkpoint",
    "recover_interrupted_swap",
    "replacement_in_progress",
    "set_swap_hook",
]

log = logging.getLogger("logstore.storage.segment_replacement")

CLEANER_CHECKPOINT_FILE = "cleaner-offset-checkpoint"
SWAP_MANIFEST_FILE = "swap-manifest"
CLEANED_SUFFIX = ".cleaned"
SWAP_SUFFIX = ".swap"
_MANIFEST_VERSION = 1
# A segment's files; the data file last, so it is renamed after its indexes.
_SEGMENT_FILES = (INDEX_SUFFIX, TIMEINDEX_SUFFIX, SEGMENT_SUFFIX)
# As the log rolls: keep relative offsets well inside the index's u32.
_MAX_OFFSETS_PER_SEGMENT = 2**31


# --------------------------------------------------------------------------- test hook

SwapHook = Callable[[str], None]
_swap_hook: SwapHook | None = None


def set_swap_hook(hook: SwapHook | None) -> SwapHook | None:
    """Install ``hook`` (called with a step name at every step of a swap and of its
    recovery, e.g. ``"manifest-written"``); return the previous one.

    For crash tests only: a hook that raises, or calls ``os._exit``, simulates a
    failure or a crash right after that step.
    """
    global _swap_hook
    previous, _swap_hook = _swap_hook, hook
    return previous


def _step(name: str) -> None:
    if _swap_hook is not None:
        _swap_hook(name)


# --------------------------------------------------------------------------- checkpoint


def read_cleaner_checkpoint(directory: str) -> int | None:
    """The first dirty offset recorded in ``directory``, or None when there is none."""
    text = read_text_or(os.path.join(directory, CLEANER_CHECKPOINT_FILE), "").strip()
    if not text:
        return None
    try:
        return int(text)
    except ValueError:
        log.warning("%s: ignoring an unreadable cleaner checkpoint %r", directory, text[:40])
        return None


def write_cleaner_checkpoint(directory: str, offset: int) -> None:
    """Record ``offset`` as the first dirty offset, atomically (temp file, fsync, rename)."""
    write_atomically(os.path.join(directory, CLEANER_CHECKPOINT_FILE), f"{offset}\n".encode())


# --------------------------------------------------------------------------- cleaning state


@dataclass(frozen=True, slots=True)
class SegmentSummary:
    """A closed segment as the cleaner sees it. ``(base_offset, next_offset,
    size_bytes)`` is its identity: a swap planned against it is refused once
    any of them changed."""

    base_offset: int
    next_offset: int
    size_bytes: int
    max_timestamp: int = -1

    @classmethod
    def of(cls, segment: Segment) -> SegmentSummary:
        return cls(segment.base_offset, segment.next_offset, segment.size, segment.max_timestamp)

    def matches(self, segment: Segment) -> bool:
        return (segment.base_offset, segment.next_offset, segment.size) == (
            self.base_offset, self.next_offset, self.size_bytes
        )


@dataclass(frozen=True, slots=True)
class CleaningState:
    """What the cleaner needs to know about one partition (offsets exclusive at the end).

    * ``cleanable_end_offset`` — records below it may be compacted. It is the
      base offset of the first segment that may not be: the active segment,
      or an earlier one that holds records at or above the last stable offset
      or younger than ``min.compaction.lag.ms`` (by its largest timestamp);
    * ``segments`` — the closed segments below ``cleanable_end_offset``, oldest
      first: exactly what a compaction replaces;
    * ``first_dirty_offset`` — the cleaner checkpoint, clamped to the log;
      segments wholly below it are *clean* (``clean_bytes``), the other
      cleanable ones *dirty* (``dirty_bytes``);
    * ``in_progress`` — a replacement is being written right now.
    """

    log_start_offset: int
    log_end_offset: int
    last_stable_offset: int
    active_segment_base: int
    first_dirty_offset: int
    cleanable_end_offset: int
    clean_bytes: int
    dirty_bytes: int
    segments: tuple[SegmentSummary, ...]
    in_progress: bool

    @property
    def dirty_ratio(self) -> float:
        """``dirty_bytes / (clean_bytes + dirty_bytes)``; 0.0 when nothing is cleanable."""
        total = self.clean_bytes + self.dirty_bytes
        return self.dirty_bytes / total if total else 0.0


def cleaning_state(log: Log, *, last_stable_offset: int, now_ms: int) -> CleaningState:
    """The :class:`CleaningState` of ``log`` now (``now_ms`` is the clock for
    ``min.compaction.lag.ms``; ``last_stable_offset`` is the partition's LSO).

    Raises :class:`LogOfflineError` for an offline log.
    """
    if log.offline_reason is not None:
        raise LogOfflineError(f"partition {os.path.basename(log.directory)} is offline: {log.offline_reason}")
    segments = log.segments
    config = log.config
    horizon = now_ms - config.min_compaction_lag_ms
    cleanable: list[Segment] = []
    for seg in segments[:-1]:
        if seg.next_offset > last_stable_offset:
            break
        if config.min_compaction_lag_ms > 0 and seg.max_timestamp > horizon:
            break
        cleanable.append(seg)
    cleanable_end = segments[len(cleanable)].base_offset
    log_start = log.log_start_offset
    log_end = segments[-1].next_offset
    checkpoint = read_cleaner_checkpoint(log.directory)
    first_dirty = min(max(checkpoint or 0, log_start, segments[0].base_offset), log_end)
    clean = sum(s.size for s in cleanable if s.next_offset <= first_dirty)
    dirty = sum(s.size for s in cleanable if s.next_offset > first_dirty)
    return CleaningState(
        log_start_offset=log_start,
        log_end_offset=log_end,
        last_stable_offset=last_stable_offset,
        active_segment_base=segments[-1].base_offset,
        first_dirty_offset=first_dirty,
        cleanable_end_offset=cleanable_end,
        clean_bytes=clean,
        dirty_bytes=dirty,
        segments=tuple(SegmentSummary.of(s) for s in cleanable),
        in_progress=replacement_in_progress(log.directory),
    )


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
        for suffix in _SEGMENT_FILES:
            os.replace(self.path(suffix, from_suffix), self.path(suffix, to_suffix))

    def remove_files(self) -> None:
        for state in (CLEANED_SUFFIX, SWAP_SUFFIX):
            for suffix in _SEGMENT_FILES:
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


def _locate(segments: Sequence[Segment], replaced: Sequence[SegmentSummary], end_offset: int,
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
        if not want.matches(seg):
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
    :meth:`finish` → :meth:`commit` (through :meth:`Log.replace_segments`);
    :meth:`abort` at any point discards everything written (a no-op after a
    commit). Every error of :meth:`add` leaves the replacement unusable:
    abort it.
    """

    def __init__(self, log: Log, replaced: tuple[SegmentSummary, ...], end_offset: int,
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
        self._state = "open"  # open → finished → committed | aborted; failed after an add error
        self._schema: pa.Schema | None = None
        self._writers: list[_ReplacementSegment] = []
        self._next_offset = replaced[0].base_offset
        self.batches = 0
        self.records = 0

    # ------------------------------------------------------------------ begin

    @classmethod
    def begin(cls, log: Log, *, replaced: Sequence[SegmentSummary], end_offset: int,
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
            _remove_leftovers(log.directory)
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
                _step("cleaned-written")
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
                    _step(f"swap-renamed:{writer.base_offset}")
                fsync_dir(self.directory)
                _step("swap-renamed")
            except OSError as e:
                self._discard_locked()
                raise StorageError(f"{self._where}: preparing the swap failed: {e}") from e
            except BaseException:
                self._discard_locked()
                raise
            manifest = {
                "version": _MANIFEST_VERSION,
                "replaced": [s.base_offset for s in self.replaced],
                "segments": self.new_base_offsets,
                "checkpoint": self.checkpoint,
            }
            self._state = "committed"
            try:
                write_atomically(os.path.join(self.directory, SWAP_MANIFEST_FILE),
                                 json.dumps(manifest).encode())
                _step("manifest-written")
                _roll_forward(self.directory, manifest)
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
            finally:
                self._release()
            for old in segments[first:end]:
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
            self._release()

    def _release(self) -> None:
        with _active_lock:
            _active.discard(self._key)


# --------------------------------------------------------------------------- recovery


def _remove_leftovers(directory: str) -> list[str]:
    """Delete ``.cleaned`` and ``.swap`` files (an uncommitted swap's); return their names."""
    names = sorted(n for n in os.listdir(directory) if n.endswith((CLEANED_SUFFIX, SWAP_SUFFIX)))
    for name in names:
        with contextlib.suppress(FileNotFoundError):
            os.remove(os.path.join(directory, name))
    if names:
        fsync_dir(directory)
    return names


def _roll_forward(directory: str, manifest: dict[str, object]) -> None:
    """Step 5 of the swap protocol, idempotent: what remains to do after the commit point."""
    replaced = [int(b) for b in manifest["replaced"]]  # type: ignore[attr-defined]
    segments = [int(b) for b in manifest["segments"]]  # type: ignore[attr-defined]
    checkpoint = manifest.get("checkpoint")
    new = set(segments)
    for base in replaced:
        if base in new:
            continue
        for suffix in _SEGMENT_FILES:
            with contextlib.suppress(FileNotFoundError):
                os.remove(os.path.join(directory, segment_file_name(base, suffix)))
        _step(f"old-deleted:{base}")
    for base in segments:
        for suffix in _SEGMENT_FILES:
            final = os.path.join(directory, segment_file_name(base, suffix))
            if os.path.exists(final + SWAP_SUFFIX):
                os.replace(final + SWAP_SUFFIX, final)
        if not os.path.exists(os.path.join(directory, segment_file_name(base))):
            raise CorruptRecordError(
                f"{directory}: {SWAP_MANIFEST_FILE} names replacement segment {base}, but neither "
                f"{segment_file_name(base)}{SWAP_SUFFIX} nor {segment_file_name(base)} exists"
            )
        _step(f"final-renamed:{base}")
    fsync_dir(directory)
    _step("renamed")
    if checkpoint is not None:
        write_cleaner_checkpoint(directory, int(checkpoint))  # type: ignore[call-overload]
        _step("checkpoint-written")
    os.remove(os.path.join(directory, SWAP_MANIFEST_FILE))
    fsync_dir(directory)
    _step("manifest-removed")


def recover_interrupted_swap(directory: str) -> str | None:
    """Finish or roll back a swap a crash interrupted in ``directory`` (see the module
    docstring); return ``"completed"``, ``"rolled back"`` or None (nothing to do).

    Raises :class:`CorruptRecordError` when ``swap-manifest`` is unreadable or
    names a replacement segment that is missing (neither can happen without
    outside damage: the manifest is written atomically after its files).
    """
    path = os.path.join(directory, SWAP_MANIFEST_FILE)
    text = read_text_or(path, "")
    if text:
        try:
            manifest = json.loads(text)
            if manifest.get("version") != _MANIFEST_VERSION:
                raise ValueError(f"unknown version {manifest.get('version')!r}")
            [int(b) for b in manifest["replaced"]]
            [int(b) for b in manifest["segments"]]
        except (ValueError, KeyError, TypeError, AttributeError) as e:
            raise CorruptRecordError(f"{path}: unreadable swap manifest ({e})") from None
        log.warning("%s: completing a segment swap interrupted by a crash (segments %s replace %s)",
                    directory, manifest["segments"], manifest["replaced"])
        _roll_forward(directory, manifest)
        return "completed"
    removed = _remove_leftovers(directory)
    if removed:
        log.warning("%s: discarded the files of an uncommitted segment swap: %s", directory, removed)
        return "rolled back"
    return None
