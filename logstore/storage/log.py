"""The partition log: an ordered set of segments in ``<data_dir>/<topic>-<partition>/``.

Offsets
-------
An *offset* is a record's permanent logical address; a *position* is a byte
location in a segment file. Offsets in a log strictly increase and are
never renumbered (gaps are allowed). End offsets are exclusive everywhere:

* ``log_start_offset`` — the first offset that may be read;
* ``log_end_offset`` (LEO) — the offset the next appended record gets;
* ``upper_bound`` of :meth:`Log.read` — the exclusive limit a reader may see
  (the broker passes the HWM or the LSO; a log never serves beyond it).

Files in the partition directory, besides the segments
(see :mod:`logstore.storage.segment`):

* ``log-start-offset`` — decimal log start offset, replaced atomically;
* ``leader-epoch-checkpoint`` — see :mod:`logstore.storage.leader_epoch`;
* ``clean-shutdown`` — present only while the log is closed cleanly; a log
  that opens without it recovers its active segment (truncating a torn or
  CRC-failing tail and rebuilding indexes);
* ``lost-offsets`` — offset ranges whose loss an operator accepted; reads
  starting inside one raise :class:`~logstore.errors.OffsetOutOfRangeError`.

Opening a log recovers it, repairs what loses no acknowledged record (logged)
and refuses the rest with :class:`~logstore.errors.CorruptRecordError` naming
the file: see :mod:`logstore.storage.log_loader`, "Damage and recovery".
``min_end_offset`` (the checkpointed high-water mark) and
``accept_data_loss`` of :meth:`Log.open` are explained there.

Durability: ``append(fsync=True)`` returns after the batch is fsynced.
Otherwise batches are fsynced when ``flush.messages`` records or
``flush.ms`` milliseconds have accumulated (checked on append and by
:meth:`maybe_flush`), when a segment rolls, and on close.
``recovery_point`` is the offset below which everything is fsynced.

Schemas: the log's schema is its newest segment's schema. A batch with the
same schema is appended; a compatible evolution (see
:func:`logstore.record.check_schema_evolution`) rolls a new segment whose
file carries the new schema; anything else raises
:class:`~logstore.errors.SchemaMismatchError` before any byte is written.

Errors: a CRC or structural failure found while reading, or an I/O error
while writing, marks the log *offline*; every later call raises
:class:`~logstore.errors.LogOfflineError` saying why, until the log is
reopened. Except a full disk (ENOSPC, EDQUOT): the append raises a retriable
``KAFKA_STORAGE_ERROR``, reads go on, and appends work again once space
returns, without a reopen (see :mod:`logstore.storage.disk_full`).

Thread-safety: one writer and many concurrent readers. Mutations hold the
log's lock; :meth:`read` works on a snapshot of the segment list and the LEO
and takes no lock.
"""

from __future__ import annotations

import bisect
import logging
import os
import threading
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass

import pyarrow as pa

from logstore.errors import (
    CorruptRecordError,
    InvalidTopicError,
    LogOfflineError,
    OffsetOutOfRangeError,
    RecordTooLargeError,
    StorageError,
)
from logstore.naming import parse_partition_dir_name
from logstore.record import (
    NO_LEADER_EPOCH,
    NO_PRODUCER_EPOCH,
    NO_PRODUCER_ID,
    NO_SEQUENCE,
    BatchHeader,
    EncodedBatch,
    check_schema_evolution,
    encode_batch,
)
from logstore.record_reader import StoredBatch
from logstore.storage.config import LogConfig
from logstore.storage.disk_full import DISK_FULL_ERRNOS, DiskFullGuard
from logstore.storage.file_cache import FileGoneError
from logstore.storage.fileutil import fsync_dir, write_atomically
from logstore.storage.leader_epoch import LeaderEpochCache
from logstore.storage.log_loader import (
    CLEAN_SHUTDOWN_FILE,
    LOG_START_OFFSET_FILE,
    LOST_OFFSETS_FILE,
    load_log_files,
    rebuild_leader_epochs,
)
from logstore.storage.log_read_result import LogReadResult
from logstore.storage.log_removal import LogRemoval
from logstore.storage.segment import Segment
from logstore.storage.segment_replacement import SegmentReplacement, SwapIncompleteError
from logstore.storage.validation import stored_as_appended, with_append_time

__all__ = ["Log", "AppendResult", "CLEAN_SHUTDOWN_FILE", "LOG_START_OFFSET_FILE", "LOST_OFFSETS_FILE"]

log = logging.getLogger("logstore.storage.log")


@dataclass(frozen=True, slots=True)
class AppendResult:
    """Where an appended batch went. ``last_offset`` is inclusive."""

    base_offset: int
    last_offset: int
    max_timestamp: int
    log_append_time_ms: int
    position: int
    segment_base_offset: int


class Log(LogRemoval):
    """A partition's append-only log; see the module docstring for its contract."""

    def __init__(self, directory: str, config: LogConfig, *, clock: Callable[[], float]) -> None:
        self.directory = directory
        self._config = config
        self._clock = clock
        self._lock = threading.RLock()
        self._segments: list[Segment] = []
        self._log_start_offset = 0
        self._offline_reason: str | None = None
        self._disk_full = DiskFullGuard(os.path.basename(directory))
        self._lost: list[tuple[int, int]] = []  # accepted losses: [start, end) offset ranges
        self._offline_schema: pa.Schema = pa.schema([])  # the schema of a log with no segments
        self._unflushed_records = 0
        self._last_flush_ms = self._now_ms()
        self.recovery_point = 0
        self.opened_clean = False  # whether the last open found the clean-shutdown marker
        self.epochs = LeaderEpochCache(directory, load=False)  # read by _load (not for an offline log)
        self._data_changed = threading.Condition(self._lock)

    # ------------------------------------------------------------------ open / close

    @classmethod
    def open(
        cls,
        directory: str,
        *,
        config: LogConfig,
        schema: pa.Schema,
        clock: Callable[[], float] = time.time,
        min_end_offset: int = 0,
        accept_data_loss: bool = False,
    ) -> Log:
        """Open (creating if needed) the log in ``directory``.

        ``min_end_offset`` is the partition's checkpointed high-water mark: a
        log that would end below it after recovery does not open
        (:class:`~logstore.storage.segment.RecoveryDataLossError`, nothing
        truncated) unless ``accept_data_loss``, which truncates, records the
        lost range and continues the offsets at ``min_end_offset`` (see
        :mod:`logstore.storage.log_loader`, "Damage and recovery").

        ``schema`` is used only when the log has no segment yet. Without the
        clean-shutdown marker the active segment is recovered; closed segments
        whose indexes are missing or inconsistent get them rebuilt, and a
        corrupt batch found then raises :class:`CorruptRecordError`. Leader
        epochs that start at or after the recovered LEO are forgotten. A log
        that would end below its log start offset does not open (unless
        ``accept_data_loss``: it then starts over, empty, at the log start offset).
        """
        os.makedirs(directory, exist_ok=True)
        opened = cls(directory, config, clock=clock)
        opened._load(schema, min_end_offset=min_end_offset, accept_data_loss=accept_data_loss)
        return opened

    def _load(self, schema: pa.Schema, *, min_end_offset: int = 0, accept_data_loss: bool = False) -> None:
        epochs_damage: str | None = None
        try:
            self.epochs = LeaderEpochCache(self.directory)
        except (CorruptRecordError, ValueError) as e:  # derived state: rebuilt from the batches below
            epochs_damage = getattr(e, "message", None) or f"{type(e).__name__}: {e}"
        loaded = load_log_files(
            self.directory, schema=schema, index_interval_bytes=self._config.index_interval_bytes,
            now_ms=self._now_ms(), min_end_offset=min_end_offset, accept_data_loss=accept_data_loss,
        )
        if epochs_damage is not None:
            self.epochs = rebuild_leader_epochs(self.directory, loaded.segments, epochs_damage)
        self._segments = loaded.segments
        self._log_start_offset = loaded.log_start_offset
        self._lost = loaded.lost
        # The checkpoint is written before the batches it describes are fsynced:
        # forget epochs that start at or after what recovery kept.
        self.epochs.truncate_from_end(self.log_end_offset)
        self.recovery_point = self.log_end_offset
        self.opened_clean = loaded.clean
        if loaded.clean:
            os.remove(os.path.join(self.directory, CLEAN_SHUTDOWN_FILE))
            fsync_dir(self.directory)

    def close(self) -> None:
        """Flush everything and write the clean-shutdown marker."""
        with self._lock:
            if self._offline_reason is None and self._disk_full.blocked is not None:
                try:
                    self._heal_disk_full(force=True)
                except StorageError as e:  # no clean-shutdown marker: the next open recovers
                    self._mark_offline(f"closed while the disk was full: {e.message}")
            if self._offline_reason is None:
                self.flush()
                write_atomically(os.path.join(self.directory, CLEAN_SHUTDOWN_FILE), b"")
            for seg in self._segments:
                seg.close()
            self._segments = []
            self._offline_reason = self._offline_reason or "the log is closed"

    def lost_range_at(self, offset: int) -> tuple[int, int] | None:
        """The accepted-loss range ``[start, end)`` holding ``offset``, or None."""
        for a, b in self._lost:
            if a <= offset < b:
                return a, b
        return None

    @property
    def lost_offsets(self) -> list[tuple[int, int]]:
        """Offset ranges ``[start, end)`` whose loss an operator accepted (``lost-offsets``)."""
        return list(self._lost)

    # ------------------------------------------------------------------ state

    def _now_ms(self) -> int:
        return int(self._clock() * 1000)

    @property
    def config(self) -> LogConfig:
        return self._config

    def update_config(self, config: LogConfig) -> None:
        with self._lock:
            self._config = config

    @property
    def schema(self) -> pa.Schema:
        segs = self._segments
        return segs[-1].schema if segs else self._offline_schema

    @classmethod
    def offline(cls, directory: str, *, config: LogConfig, schema: pa.Schema, reason: str,
                clock: Callable[[], float] = time.time) -> Log:
        """A log that could not be opened: no segments, offline with ``reason``; files untouched."""
        placeholder = cls(directory, config, clock=clock)
        placeholder._offline_schema = schema
        placeholder._mark_offline(reason)
        return placeholder

    @property
    def log_start_offset(self) -> int:
        return self._log_start_offset

    @property
    def log_end_offset(self) -> int:
        segs = self._segments
        return segs[-1].next_offset if segs else self._log_start_offset

    @property
    def segments(self) -> list[Segment]:
        """A snapshot of the segments, oldest first (the last one is active)."""
        return list(self._segments)

    @property
    def size_bytes(self) -> int:
        return sum(s.size for s in self._segments)

    @property
    def offline_reason(self) -> str | None:
        return self._offline_reason

    def _check_online(self) -> None:
        if self._offline_reason is not None:
            raise LogOfflineError(f"partition {os.path.basename(self.directory)} is offline: {self._offline_reason}")

    def _mark_offline(self, reason: str) -> None:
        """Refuse every later call with ``reason``; log the partition_offline event once."""
        if self._offline_reason is None:
            name = os.path.basename(self.directory)
            try:
                topic, partition = parse_partition_dir_name(name)
            except InvalidTopicError:
                topic, partition = name, -1
            log.error("partition %s is offline: %s", name, reason, extra={
                "event": "partition_offline", "topic": topic, "partition": partition, "reason": reason})
        self._offline_reason = reason

    @property
    def write_blocked_reason(self) -> str | None:
        """Why appends are refused after the disk filled, or None when they are not."""
        return self._disk_full.reason

    def _heal_disk_full(self, *, force: bool = False) -> None:
        """Reopen the active segment after a disk-full failure (see :mod:`~logstore.storage.disk_full`)."""
        try:
            segment = self._disk_full.heal(self._segments[-1], force=force,
                                           index_interval_bytes=self._config.index_interval_bytes)
        except (OSError, CorruptRecordError) as e:
            self._mark_offline(f"reopening after a failed write: {e}")
            raise StorageError(f"{self.directory}: reopening after a failed write: {e}") from e
        self._segments = [*self._segments[:-1], segment]
        self.epochs.truncate_from_end(self.log_end_offset)
        self.recovery_point = min(self.recovery_point, self.log_end_offset)

    # ------------------------------------------------------------------ append

    def append(self, batch: pa.RecordBatch, *, leader_epoch: int = NO_LEADER_EPOCH,
               producer_id: int = NO_PRODUCER_ID, producer_epoch: int = NO_PRODUCER_EPOCH,
               base_sequence: int = NO_SEQUENCE, attributes: int = 0, compression: str | None = None,
               fsync: bool = False) -> AppendResult:
        """Assign offsets to ``batch`` (LEO, LEO+1, ...), encode it and append it.

        Raises :class:`SchemaMismatchError` for an incompatible schema and
        :class:`RecordTooLargeError` when the encoded batch exceeds
        ``max.message.bytes``; in both cases nothing is written.
        """
        return self._append(lambda base, append_time: encode_batch(
            batch if append_time is None else with_append_time(batch, append_time), base_offset=base,
            leader_epoch=leader_epoch, producer_id=producer_id, producer_epoch=producer_epoch,
            base_sequence=base_sequence, attributes=attributes, compression=compression,
        ), batch.schema, fsync=fsync)

    def append_stored(self, stored: StoredBatch, batch: pa.RecordBatch, schema: pa.Schema, *,
                      leader_epoch: int = NO_LEADER_EPOCH, fsync: bool = False) -> AppendResult:
        """Append a producer's validated batch as it was sent, the broker's fields patched in
        place (:func:`logstore.storage.validation.assign_offsets`); one that cannot be patched
        (an older client's format, a compressed body) is re-encoded from ``batch``, its decoded
        form. ``schema`` is the schema of the stream it came in."""
        return self._append(lambda base, append_time: stored_as_appended(
            stored, batch, base_offset=base, leader_epoch=leader_epoch, log_append_time=append_time,
        ), schema, fsync=fsync)

    def _append(self, encode: Callable[[int, int | None], EncodedBatch], schema: pa.Schema, *,
                fsync: bool) -> AppendResult:
        """Append what ``encode(base_offset, log_append_time or None)`` returns, under the log lock."""
        with self._lock:
            now = self._before_write()
            evolved = check_schema_evolution(self.schema, schema)
            base = self.log_end_offset
            encoded = encode(base, now if self._config.message_timestamp_type == "LogAppendTime" else None)
            if encoded.size > self._config.max_message_bytes:
                raise RecordTooLargeError(
                    f"batch of {encoded.header.record_count} records is {encoded.size} bytes encoded; "
                    f"max.message.bytes is {self._config.max_message_bytes}"
                )
            position, active = self._write([encoded], now, schema if evolved else None, base, fsync=fsync)
            h = encoded.header
            return AppendResult(
                base_offset=h.base_offset, last_offset=h.last_offset, max_timestamp=h.max_timestamp,
                log_append_time_ms=now, position=position, segment_base_offset=active.base_offset,
            )

    def append_replica(self, schema: pa.Schema, batches: list[StoredBatch]) -> int:
        """Append a leader's batches byte for byte (a follower; checked by
        :func:`~logstore.storage.replica_append.verify_replica_batches`); return the new LEO.
        A ``schema`` other than the active segment's rolls a segment; fsync by the flush policy."""
        with self._lock:
            now = self._before_write()
            new_schema = None if schema.equals(self.schema, check_metadata=True) else schema
            encoded = [EncodedBatch(b.header, b"", (b.data,), b.size) for b in batches]
            self._write(encoded, now, new_schema, self.log_end_offset, fsync=False)
            return self.log_end_offset

    def assign_leader_epoch(self, epoch: int) -> None:
        """Record that leader epoch ``epoch`` starts at the LEO (a replica becoming leader)."""
        with self._lock:
            self._check_online()
            self.epochs.assign(epoch, self.log_end_offset)

    def _before_write(self) -> int:
        self._check_online()
        if self._disk_full.blocked is not None:
            self._heal_disk_full()
        return self._now_ms()

    def _write(self, batches: list[EncodedBatch], now: int, new_schema: pa.Schema | None, leo: int, *,
               fsync: bool) -> tuple[int, Segment]:
        """Write checked batches at the end, lock held (``leo``: the LEO before); flush by policy."""
        position, active = -1, self._segments[-1]
        try:
            for i, encoded in enumerate(batches):
                active = self._maybe_roll(encoded.size, now, new_schema if i == 0 else None,
                                          encoded.header.last_offset)
                position = active.append(encoded)
                self.epochs.assign(encoded.header.leader_epoch, encoded.header.base_offset)
                self._unflushed_records += encoded.header.record_count
            if (fsync or self._unflushed_records >= self._config.flush_messages
                    or now - self._last_flush_ms >= self._config.flush_ms):
                self.flush()
        except OSError as e:
            if e.errno in DISK_FULL_ERRNOS:
                raise self._disk_full.refuse(e, active=self._segments[-1], log_end_offset=leo) from e
            self._mark_offline(f"write failed: {e}")
            raise StorageError(f"{self.directory}: write failed: {e}") from e
        self._data_changed.notify_all()
        return position, active

    def _maybe_roll(self, batch_size: int, now_ms: int, new_schema: pa.Schema | None,
                    last_offset: int) -> Segment:
        active = self._segments[-1]
        empty = active.size == active.data_start
        if new_schema is not None and empty:
            # Nothing in the active segment yet: re-create it with the new schema.
            active.delete()
            replacement = Segment.create(
                self.directory, active.base_offset, new_schema,
                index_interval_bytes=self._config.index_interval_bytes, created_ms=now_ms,
            )
            self._segments = [*self._segments[:-1], replacement]
            return replacement
        if empty:
            return active
        needs_roll = (
            new_schema is not None
            or active.size + batch_size > self._config.segment_bytes
            or now_ms - active.created_ms >= self._config.segment_ms
            or max(self.log_end_offset, last_offset) - active.base_offset >= 2**31
        )
        return self.roll(new_schema) if needs_roll else active

    def roll(self, new_schema: pa.Schema | None = None) -> Segment:
        """Seal the active segment and start a new one at the LEO; return it."""
        with self._lock:
            self._before_write()
            active = self._segments[-1]
            if active.size == active.data_start and new_schema is None:
                return active
            active.seal()
            self.recovery_point = self.log_end_offset
            segment = Segment.create(
                self.directory, self.log_end_offset, new_schema or active.schema,
                index_interval_bytes=self._config.index_interval_bytes, created_ms=self._now_ms(),
            )
            self._segments = [*self._segments, segment]
            return segment

    def flush(self) -> None:
        """fsync the active segment (closed ones were fsynced when they rolled)."""
        with self._lock:
            self._check_online()
            self._segments[-1].flush()
            self._unflushed_records = 0
            self._last_flush_ms = self._now_ms()
            self.recovery_point = self.log_end_offset

    def maybe_flush(self) -> bool:
        """Flush if ``flush.ms`` has passed since the last flush with data pending."""
        with self._lock:
            if self._unflushed_records and self._now_ms() - self._last_flush_ms >= self._config.flush_ms:
                self.flush()
                return True
            return False

    def wait_for_data(self, offset: int, timeout_s: float) -> bool:
        """Block until the LEO exceeds ``offset`` or ``timeout_s`` passes; say whether it did."""
        deadline = time.monotonic() + timeout_s
        with self._data_changed:
            while self.log_end_offset <= offset:
                remaining = deadline - time.monotonic()
                if remaining <= 0:
                    return False
                self._data_changed.wait(remaining)
            return True

    # ------------------------------------------------------------------ read

    def read(
        self,
        start_offset: int,
        *,
        max_bytes: int,
        upper_bound: int | None = None,
        min_one_batch: bool = True,
    ) -> LogReadResult:
        """Read whole batches holding offsets in ``[start_offset, upper_bound)``.

        ``upper_bound`` defaults to the LEO and is clamped to it. Returns
        batches from a single segment (one schema), at most ``max_bytes``
        unless ``min_one_batch`` lets a single larger first batch through.
        Raises :class:`OffsetOutOfRangeError` if ``start_offset`` is below
        the log start offset or above the LEO; reading at the LEO returns
        nothing.
        """
        self._check_online()
        segments = self._segments
        log_start = self._log_start_offset
        leo = segments[-1].next_offset
        bound = leo if upper_bound is None else min(upper_bound, leo)
        if start_offset < log_start or start_offset > leo:
            raise OffsetOutOfRangeError(
                f"offset {start_offset} is out of range for partition "
                f"{os.path.basename(self.directory)}: log start offset {log_start}, "
                f"log end offset {leo}"
            )
        if self._lost:
            for a, b in self._lost:
                if a <= start_offset < b:
                    raise OffsetOutOfRangeError(
                        f"offsets {a}..{b - 1} of partition {os.path.basename(self.directory)} were "
                        f"lost (an operator accepted the loss); the log continues at {b}"
                    )
        empty = LogReadResult(
            start_offset, segments[-1].schema, [], memoryview(b""), start_offset,
            log_start, leo, bound,
        )
        if max_bytes < 0:
            raise ValueError(f"max_bytes must be >= 0, got {max_bytes}")
        if start_offset >= bound:
            return empty
        i = max(bisect.bisect_right([s.base_offset for s in segments], start_offset) - 1, 0)
        for seg in segments[i:]:
            if seg.base_offset >= bound:
                break
            try:
                got = seg.read(start_offset, max_bytes=max_bytes, upper_bound=bound,
                               min_one_batch=min_one_batch)
            except CorruptRecordError as e:
                self._mark_offline(e.message)
                raise
            except FileGoneError:
                if any(s is seg for s in self._segments):
                    raise
                # Deleted or replaced since this read took its snapshot (retention,
                # compaction) and its descriptor was closed: read the current list.
                return self.read(start_offset, max_bytes=max_bytes, upper_bound=upper_bound,
                                 min_one_batch=min_one_batch)
            if got.batches:
                return LogReadResult(
                    start_offset, got.schema, got.batches, got.data, got.next_offset,
                    log_start, leo, bound,
                )
        return empty

    def find_offset_for_timestamp(self, timestamp_ms: int) -> int | None:
        """The earliest offset whose record timestamp is ``>= timestamp_ms``.

        Returns None when no record in the log is that recent (Kafka's
        ListOffsets answers -1 then; callers usually fall back to the LEO).
        """
        self._check_online()
        start = self._log_start_offset
        for seg in self._segments:
            if seg.next_offset <= start:
                continue
            found = seg.find_offset_for_timestamp(timestamp_ms, start_offset=start)
            if found is not None:
                return found
        return None

    def batch_headers(self, from_offset: int) -> Iterator[BatchHeader]:
        """Headers of every batch holding offsets ``>= from_offset``, in offset order.

        Reads whole segments (headers are parsed, bodies are not decoded); used
        to rebuild derived state such as producer state after a restart.
        """
        self._check_online()
        for seg in self._segments:
            if seg.next_offset <= from_offset:
                continue
            for stored in seg.iter_batches():
                if stored.header.next_offset > from_offset:
                    yield stored.header

    # ------------------------------------------------------------------ compaction, deletion

    def replace_segments(self, replacement: SegmentReplacement, *, max_end_offset: int) -> list[Segment]:
        """Swap closed segments for the compacted ones ``replacement`` wrote; return the new ones.

        Atomic and crash-safe (protocol: :mod:`logstore.storage.segment_replacement`); appends
        and reads go on meanwhile (readers keep the segment list they started with).
        ``max_end_offset`` is the partition's last stable offset: the replaced segments
        must end at or below it. The replacement is released once the new list is in. Raises
        :class:`CompactionConflictError` (nothing changed) when the segments changed since
        the plan; an I/O failure after the commit point marks the log offline (a reopen
        completes the swap).
        """
        replacement.finish()
        with self._lock:
            self._check_online()
            try:
                first, end, new = replacement.commit(
                    self._segments, max_end_offset=max_end_offset,
                    index_interval_bytes=self._config.index_interval_bytes, created_ms=self._now_ms(),
                )
                self._segments = [*self._segments[:first], *new, *self._segments[end:]]
                return new
            except SwapIncompleteError as e:
                self._mark_offline(str(e))
                raise LogOfflineError(str(e)) from e
            finally:
                replacement.release()

    def delete(self) -> None:
        """Remove the whole partition directory (topic deletion)."""
        with self._lock:
            for seg in self._segments:
                seg.delete()
                seg.close()
            self._segments = []
            self._offline_reason = "the partition was deleted"
            for name in os.listdir(self.directory):
                os.remove(os.path.join(self.directory, name))
            os.rmdir(self.directory)
