"""One log segment: an Arrow IPC stream file plus its offset and time indexes.

Files, named by the segment's base offset as 20 zero-padded digits::

    00000000000000000000.arrow      schema message, then batch messages (no EOS marker;
                                    pyarrow.ipc.open_stream reads it as it is)
    00000000000000000000.index      see logstore.storage.index.OffsetIndex
    00000000000000000000.timeindex  see logstore.storage.index.TimeIndex

Invariants (checked on append and on recovery, with the file path in the
message): the file starts with one schema message; every batch's base offset
is >= the previous batch's next offset (gaps allowed) and >= the segment's
base offset; every batch's CRC32C matches; ``size`` is the end of the last
complete batch.

Only the active segment is appended to. Bytes are written with ``pwritev``
at ``size`` and ``size`` moves only after the write returns, so a reader that
reads no further than ``size`` sees only whole batches.

Crash behaviour: after an unclean shutdown the active segment is scanned by
:meth:`Segment.recover`, which truncates the file at the first incomplete,
malformed or CRC-failing batch and rebuilds both indexes; what it cut off is
described by ``truncated_tail`` (a :class:`TailTruncation`, for the log line
the partition log writes). Given ``min_end_offset`` (the partition's
checkpointed high-water mark), recovery that would keep less than that
truncates nothing and raises :class:`RecoveryDataLossError`: acknowledged
records would be lost, and their offsets handed out again (see
:mod:`logstore.storage.log`). A closed segment
was fsynced when it was rolled; if its indexes are missing or fail their
sanity check they are rebuilt, and a bad batch found while rebuilding raises
:class:`~logstore.errors.CorruptRecordError` (never silently skipped).

Descriptors: a segment does not own a descriptor. Its file is a
:class:`~logstore.storage.file_cache.CachedFile` of the process-wide pool
(:mod:`logstore.storage.file_cache`): opened on first use, pinned for the
length of each read or write, closed least-recently-used when the pool is
full. A reader holding a deleted or replaced segment keeps reading it while
its descriptor is open; once the pool has closed it, the read raises
:class:`~logstore.storage.file_cache.FileGoneError` (the log then retries
on its current segment list).

Thread-safety: one writer (append, truncate, recover, close) and many
concurrent readers (read, find_offset_for_timestamp).
"""

from __future__ import annotations

import contextlib
import os
import time
import weakref
from dataclasses import dataclass

import numpy as np
import pyarrow as pa

from logstore.errors import CorruptRecordError, SchemaMismatchError
from logstore.record import BatchHeader, EncodedBatch, decode_schema, encode_schema
from logstore.record_reader import IncompleteBatchError, StoredBatch, parse_batch_at
from logstore.storage.file_cache import default_cache
from logstore.storage.fileutil import fsync_dir
from logstore.storage.index import OffsetIndex, TimeIndex

__all__ = [
    "Segment", "SegmentRead", "segment_file_name", "SEGMENT_SUFFIX", "TailTruncation",
    "RecoveryDataLossError",
]

SEGMENT_SUFFIX = ".arrow"
INDEX_SUFFIX = ".index"
TIMEINDEX_SUFFIX = ".timeindex"
# A read from the index position covers at most this much more than asked
# before it looks further, so small fetches stay one pread.
_READ_SLACK_BYTES = 64 * 1024


try:
    _IOV_MAX = max(16, os.sysconf("SC_IOV_MAX"))
except (AttributeError, ValueError, OSError):
    _IOV_MAX = 1024


def _pwritev_all(fd: int, pieces: list[bytes | memoryview | pa.Buffer], position: int) -> int:
    """``os.pwritev`` of ``pieces`` at ``position``, at most IOV_MAX at a time; bytes written."""
    written = 0
    for i in range(0, len(pieces), _IOV_MAX):
        chunk = pieces[i:i + _IOV_MAX]
        n = os.pwritev(fd, chunk, position + written)
        written += n
        if n != sum(len(p) for p in chunk):
            break  # short write: the caller reports it
    return written


def _pwrite_rest(
    fd: int, pieces: list[bytes | memoryview | pa.Buffer], position: int, written: int,
) -> int:
    """After a short write of ``written`` bytes, write the rest of ``pieces``; bytes written.

    Raises the OSError the kernel reports (ENOSPC when the disk is full).
    """
    rest = memoryview(b"".join(memoryview(p) for p in pieces))[written:]
    done = 0
    while done < len(rest):
        n = os.pwrite(fd, rest[done:], position + written + done)
        if n == 0:
            break
        done += n
    return done


def segment_file_name(base_offset: int, suffix: str = SEGMENT_SUFFIX) -> str:
    return f"{base_offset:020d}{suffix}"


@dataclass(frozen=True, slots=True)
class SegmentRead:
    """Whole batches read from one segment, in offset order.

    ``data`` is the stored bytes of exactly those batches, back to back, as
    they sit in the file (zero-copy views of one read); ``batches`` are
    their parsed headers with views into ``data``.
    """

    segment_base_offset: int
    schema: pa.Schema
    batches: list[StoredBatch]
    data: memoryview

    @property
    def next_offset(self) -> int:
        return self.batches[-1].header.next_offset if self.batches else -1


class RecoveryDataLossError(CorruptRecordError):
    """Recovery would truncate a segment below the partition's checkpointed high-water mark.

    Nothing was truncated; ``kept_end_offset`` is where the readable data ends
    and ``min_end_offset`` the checkpointed high-water mark.
    """

    def __init__(self, message: str, *, kept_end_offset: int = -1, min_end_offset: int = -1) -> None:
        super().__init__(message)
        self.kept_end_offset = kept_end_offset
        self.min_end_offset = min_end_offset


@dataclass(frozen=True, slots=True)
class TailTruncation:
    """What :meth:`Segment.recover` cut off the end of a segment file.

    ``first_offset`` is the segment's next offset after the cut;
    ``batches`` the batches whose headers could still be parsed in the cut
    bytes (the first may be the damaged one) and ``end_offset`` the exclusive
    end of the last of them (``first_offset`` when none parsed).
    """

    position: int
    bytes: int
    batches: int
    first_offset: int
    end_offset: int
    reason: str


_MARKER_BYTES = b"\xff\xff\xff\xff"  # CONTINUATION_MARKER as it starts every message


def _valid_batch_after(data: memoryview, position: int, *, min_offset: int, where: str) -> StoredBatch | None:
    """The first whole batch with a good CRC that starts after ``position`` (found by its
    continuation marker, so a batch whose length bytes are damaged is stepped over) and holds
    offsets at or above ``min_offset``; None when there is none."""
    raw = bytes(data)
    at = raw.find(_MARKER_BYTES, position + 1)
    while at >= 0:
        try:
            batch = parse_batch_at(data, at, where=where)
            batch.verify_crc(where=where)
            if batch.header.base_offset >= min_offset:
                return batch
        except CorruptRecordError:
            pass
        at = raw.find(_MARKER_BYTES, at + 1)
    return None


def _count_tail(data: memoryview, position: int, *, where: str) -> tuple[int, int]:
    """Batches whose headers parse from ``position`` on (CRC not checked), and their end offset."""
    count, end = 0, -1
    while position < len(data):
        try:
            batch = parse_batch_at(data, position, where=where)
        except CorruptRecordError:
            break
        count += 1
        end = max(end, batch.header.next_offset)
        position += batch.size
    return count, end


class Segment:
    """A segment file and its indexes; see the module docstring."""

    def __init__(
        self,
        directory: str,
        base_offset: int,
        *,
        schema: pa.Schema,
        schema_size: int,
        fd: int,
        index_interval_bytes: int,
        created_ms: int | None = None,
    ) -> None:
        self.directory = directory
        self.base_offset = base_offset
        self.schema = schema
        self.data_start = schema_size
        self.index_interval_bytes = index_interval_bytes
        self.path = os.path.join(directory, segment_file_name(base_offset))
        self.offset_index = OffsetIndex(
            os.path.join(directory, segment_file_name(base_offset, INDEX_SUFFIX)), base_offset
        )
        self.time_index = TimeIndex(
            os.path.join(directory, segment_file_name(base_offset, TIMEINDEX_SUFFIX)), base_offset
        )
        # ``fd`` (open on the file) is handed to the pool, which may close it at any time.
        self._file = default_cache().file(self.path, fd)
        self._closer = weakref.finalize(self, self._file.close)
        self.size = schema_size
        self.next_offset = base_offset
        self.max_timestamp = -1
        # When this segment object started, for roll by segment.ms: the owner's clock.
        self.created_ms = int(time.time() * 1000) if created_ms is None else created_ms
        self._bytes_since_index_entry = 0
        self._last_batch_offset = -1
        self.truncated_tail: TailTruncation | None = None

    # ------------------------------------------------------------------ open / create

    @classmethod
    def create(
        cls, directory: str, base_offset: int, schema: pa.Schema, *, index_interval_bytes: int,
        created_ms: int | None = None,
    ) -> Segment:
        """Create an empty segment whose file holds only ``schema``; fsyncs file and directory.

        ``created_ms`` (default: the wall clock) is the start of the segment's age.
        """
        path = os.path.join(directory, segment_file_name(base_offset))
        fd = os.open(path, os.O_RDWR | os.O_CREAT | os.O_EXCL, 0o644)
        try:
            head = encode_schema(schema)
            os.pwrite(fd, head, 0)
            os.fsync(fd)
        except BaseException:
            os.close(fd)
            raise
        fsync_dir(directory)
        seg = cls(
            directory, base_offset, schema=schema, schema_size=len(head), fd=fd,
            index_interval_bytes=index_interval_bytes, created_ms=created_ms,
        )
        seg.offset_index.reset()
        seg.time_index.reset()
        return seg

    @classmethod
    def open(
        cls, directory: str, base_offset: int, *, index_interval_bytes: int,
        created_ms: int | None = None,
    ) -> Segment:
        """Open an existing segment, trusting its indexes (call :meth:`recover` or
        :meth:`load` next to establish ``size`` and ``next_offset``). Its age
        starts at ``created_ms`` (default: the wall clock)."""
        path = os.path.join(directory, segment_file_name(base_offset))
        fd = os.open(path, os.O_RDWR)
        try:
            head = os.pread(fd, 64 * 1024, 0)
            schema, schema_size = decode_schema(head, where=path)
        except SchemaMismatchError as e:
            os.close(fd)
            raise CorruptRecordError(f"{path}: not a segment schema: {e.message}") from None
        except BaseException:
            os.close(fd)
            raise
        return cls(
            directory, base_offset, schema=schema, schema_size=schema_size, fd=fd,
            index_interval_bytes=index_interval_bytes, created_ms=created_ms,
        )

    def load(self) -> None:
        """Establish size, next offset and max timestamp after a clean shutdown.

        Trusts the indexes if they pass their sanity checks, point inside
        the file and are both non-empty when the file holds batches; otherwise
        rebuilds them with a full scan (raising on any corrupt batch, as for a
        closed segment).
        """
        with self._file as fd:
            file_size = os.fstat(fd).st_size
        try:
            self.offset_index.sanity_check()
            self.time_index.sanity_check()
            last = self.offset_index.last_entry()
            if last.position >= file_size or (len(self.offset_index) == 0 and file_size > self.data_start):
                raise CorruptRecordError(f"{self.offset_index.path}: does not match the segment file")
            if len(self.time_index) == 0 and file_size > self.data_start:
                # The first batch always gets a time index entry: without one, the
                # segment's max timestamp (retention, offset-for-time) would be wrong.
                raise CorruptRecordError(f"{self.time_index.path}: no entries for a non-empty segment")
            batches = self._scan_from(last.position if len(self.offset_index) else self.data_start,
                                      file_size)
            if batches:
                tail = batches[-1]
                self.size = tail.position + tail.size
                self.next_offset = tail.header.next_offset
                self._last_batch_offset = tail.header.base_offset
                self._bytes_since_index_entry = self.size - last.position
            self.max_timestamp = max(
                [self.time_index.last_entry().timestamp, *(b.header.max_timestamp for b in batches)]
            )
            if self.size != file_size:
                raise CorruptRecordError(
                    f"{self.path}: {file_size - self.size} bytes after the last batch"
                )
            if self.time_index.last_entry().offset > self._last_batch_offset >= 0:
                raise CorruptRecordError(f"{self.time_index.path}: points past the last batch")
        except CorruptRecordError:
            self.rebuild(truncate_tail=False)

    def recover(self, *, min_end_offset: int = 0, only_unfinished_writes: bool = False) -> int:
        """Validate every batch, truncate at the first bad one, rebuild the indexes.

        Returns the number of bytes truncated (described by ``truncated_tail``).
        Used for the active segment after an unclean shutdown. If the cut
        would leave the segment ending below ``min_end_offset``, nothing is
        truncated and :class:`RecoveryDataLossError` is raised.

        With ``only_unfinished_writes`` the cut must also be provably the
        tail of writes that never finished: when a whole batch with a good
        CRC follows the bad one, the bad batch was written in full before it
        (a flipped byte, not a torn write), so the records cut off may have
        been acknowledged even above ``min_end_offset`` (the checkpoint lags
        the high-water mark): :class:`RecoveryDataLossError`, nothing truncated.
        """
        return self.rebuild(truncate_tail=True, min_end_offset=min_end_offset,
                            only_unfinished_writes=only_unfinished_writes)

    def rebuild(self, *, truncate_tail: bool, min_end_offset: int = 0, only_unfinished_writes: bool = False) -> int:
        """Scan the whole file and rebuild both indexes (fsynced before returning).

        With ``truncate_tail`` an incomplete or corrupt tail is cut off (unless
        that leaves less than ``min_end_offset`` or, with
        ``only_unfinished_writes``, a valid batch follows the bad one: see
        :meth:`recover`) and the number of bytes removed returned; without
        it, any bad batch raises :class:`CorruptRecordError`.
        """
        with self._file as fd:
            file_size = os.fstat(fd).st_size
            data = memoryview(os.pread(fd, file_size, 0)) if file_size else memoryview(b"")
        self.offset_index.reset()
        self.time_index.reset()
        self.size = self.data_start
        self.next_offset = self.base_offset
        self.max_timestamp = -1
        self._bytes_since_index_entry = 0
        self._last_batch_offset = -1
        pos = self.data_start
        try:
            while pos < file_size:
                batch = parse_batch_at(data, pos, where=self.path)
                batch.verify_crc(where=self.path)
                self._check_follows(batch.header.base_offset)
                self._track(batch.header, pos, batch.size)
                pos += batch.size
        except CorruptRecordError as e:
            if not truncate_tail:
                raise CorruptRecordError(f"corrupt closed segment: {e.message}") from None
            batches, end = _count_tail(data, pos, where=self.path)
            lost_end = max(end, min_end_offset)
            if self.next_offset < min_end_offset:
                raise RecoveryDataLossError(
                    f"recovery would truncate {self.path} at position {pos} ({file_size - pos} bytes, "
                    f"{batches} readable batch headers) and lose offsets {self.next_offset}..{lost_end - 1} "
                    f"below the checkpointed high-water mark {min_end_offset}: {e.message}",
                    kept_end_offset=self.next_offset, min_end_offset=min_end_offset,
                ) from None
            follows = (_valid_batch_after(data, pos, min_offset=self.next_offset, where=self.path)
                       if only_unfinished_writes else None)
            if follows is not None:
                raise RecoveryDataLossError(
                    f"recovery would truncate {self.path} at position {pos} and lose offsets "
                    f"{self.next_offset}..{max(end, follows.header.next_offset) - 1}: the batch there is "
                    f"damaged ({e.message}), but a whole batch with a good CRC follows at position "
                    f"{follows.position} (offsets {follows.header.base_offset}.."
                    f"{follows.header.next_offset - 1}), so this is not a write a crash cut short and "
                    "those records may have been acknowledged; their offsets are not reused",
                    kept_end_offset=self.next_offset, min_end_offset=max(end, follows.header.next_offset),
                ) from None
            self.truncated_tail = TailTruncation(
                position=pos, bytes=file_size - pos, batches=batches, first_offset=self.next_offset,
                end_offset=max(end, self.next_offset), reason=e.message,
            )
            with self._file as fd:
                os.ftruncate(fd, pos)
                os.fsync(fd)
        self.offset_index.flush()
        self.time_index.flush()
        return file_size - pos

    # ------------------------------------------------------------------ writing

    def _check_follows(self, base_offset: int) -> None:
        if base_offset < self.next_offset or base_offset < self.base_offset:
            raise CorruptRecordError(
                f"{self.path}: batch base offset {base_offset} does not follow next offset "
                f"{self.next_offset}"
            )
        if base_offset - self.base_offset >= 2**32:
            raise CorruptRecordError(f"{self.path}: offset {base_offset} beyond the segment's u32 range")

    def _track(self, header: BatchHeader, position: int, size: int) -> None:
        """Account for a batch now stored at ``position``: sizes, offsets, indexes."""
        if self._last_batch_offset < 0 or self._bytes_since_index_entry >= self.index_interval_bytes:
            self.offset_index.append(header.base_offset, position)
            self.time_index.maybe_append(max(self.max_timestamp, header.max_timestamp), header.base_offset)
            self._bytes_since_index_entry = 0
        self._bytes_since_index_entry += size
        self._last_batch_offset = header.base_offset
        self.max_timestamp = max(self.max_timestamp, header.max_timestamp)
        self.size = position + size
        self.next_offset = header.next_offset

    def append(self, batch: EncodedBatch) -> int:
        """Write ``batch`` at the end of the file; return its position."""
        self._check_follows(batch.header.base_offset)
        position = self.size
        if position + batch.size >= 2**32:
            raise ValueError(f"{self.path}: segment would exceed 4 GiB")
        with self._file as fd:
            written = _pwritev_all(fd, [batch.head, *batch.body_pieces], position)
            if written != batch.size:
                # Short writes on regular files mean the disk is full or failing: write
                # the rest, which either succeeds or raises the real error (ENOSPC, ...).
                written += _pwrite_rest(fd, [batch.head, *batch.body_pieces], position, written)
        if written != batch.size:
            raise OSError(f"{self.path}: short write ({written} of {batch.size} bytes)")
        self._track(batch.header, position, batch.size)
        return position

    def flush(self) -> None:
        """fsync the segment file and both indexes."""
        with self._file as fd:
            os.fsync(fd)
        self.offset_index.flush()
        self.time_index.flush()

    def seal(self) -> None:
        """Close the segment for appends (on roll): final time index entry, fsync everything."""
        if self._last_batch_offset >= 0:
            self.time_index.maybe_append(self.max_timestamp, self._last_batch_offset)
        self.flush()
        self.offset_index.close()
        self.time_index.close()

    def truncate_to(self, offset: int) -> None:
        """Remove every batch whose base offset is ``>= offset``.

        A batch that starts below ``offset`` and ends at or above it is kept
        whole (truncation points are batch boundaries in practice).
        """
        keep: list[StoredBatch] = [
            b for b in self._scan_from(self.data_start, self.size) if b.header.base_offset < offset
        ]
        new_size = keep[-1].position + keep[-1].size if keep else self.data_start
        with self._file as fd:
            os.ftruncate(fd, new_size)
        self.offset_index.truncate_to(offset)
        self.time_index.truncate_to(offset)
        self.size = new_size
        self.next_offset = keep[-1].header.next_offset if keep else self.base_offset
        self.max_timestamp = max((b.header.max_timestamp for b in keep), default=-1)
        self._last_batch_offset = keep[-1].header.base_offset if keep else -1
        last_entry = self.offset_index.last_entry()
        self._bytes_since_index_entry = (
            new_size - last_entry.position if len(self.offset_index) else 0
        )

    def close(self) -> None:
        """Release the file descriptor (now, or when the last reader unpins it) and index files."""
        self.offset_index.close()
        self.time_index.close()
        self._closer()

    def detach(self) -> None:
        """The file at :attr:`path` is no longer this segment's (deleted, or replaced by a
        compaction swap): readers keep the descriptor while the pool has it open, and get
        :class:`~logstore.storage.file_cache.FileGoneError` after, never another file's bytes."""
        self._file.mark_gone()

    def delete(self) -> None:
        """Remove the files. Readers holding this object keep reading until they drop it."""
        self.detach()
        for path in (self.path, self.offset_index.path, self.time_index.path):
            with contextlib.suppress(FileNotFoundError):
                os.remove(path)
        # Not close(): that would write entries held in memory to a new file at the old path.
        self.offset_index.delete()
        self.time_index.delete()

    # ------------------------------------------------------------------ reading

    def _pread(self, position: int, length: int) -> memoryview:
        with self._file as fd:
            return memoryview(os.pread(fd, length, position))

    def _scan_from(self, position: int, end: int) -> list[StoredBatch]:
        """Parse every batch from ``position`` to ``end`` (headers only; no CRC check)."""
        if end <= position:
            return []
        data = self._pread(position, end - position)
        out: list[StoredBatch] = []
        pos = 0
        while pos < len(data):
            b = parse_batch_at(data, pos, where=self.path, base_position=position)
            out.append(b)
            pos += b.size
        return out

    def read(
        self,
        start_offset: int,
        *,
        max_bytes: int,
        upper_bound: int,
        min_one_batch: bool = True,
        verify_crc: bool = True,
    ) -> SegmentRead:
        """Read whole batches that hold offsets ``>= start_offset``.

        Stops before the first batch that reaches ``upper_bound`` (exclusive:
        only batches whose next offset is ``<= upper_bound`` are returned)
        and before exceeding ``max_bytes`` — except that with
        ``min_one_batch`` the first batch is returned even if it is larger.
        The first batch may start before ``start_offset`` (a batch is never
        split). CRCs are verified unless ``verify_crc`` is false. A batch
        that fails its CRC, or is malformed or runs past ``size``, raises
        :class:`CorruptRecordError`.
        """
        size = self.size  # snapshot: bytes below it are complete batches
        start = max(self.offset_index.lookup(start_offset).position, self.data_start)
        if start >= size:
            return SegmentRead(self.base_offset, self.schema, [], memoryview(b""))
        length = min(size - start, max_bytes + self.index_interval_bytes + _READ_SLACK_BYTES)
        data = self._pread(start, length)
        pos = 0
        first = -1
        batches: list[StoredBatch] = []
        while start + pos < size:
            try:
                b = parse_batch_at(data, pos, where=self.path, base_position=start)
            except IncompleteBatchError as e:
                if start + len(data) >= size:
                    # Everything below ``size`` is whole batches, so a batch that claims
                    # to run past it has a corrupt length; reading again would not help.
                    raise CorruptRecordError(
                        f"{self.path}: batch at position {start + pos} runs past the end of "
                        f"the segment's data at {size}: {e.message}"
                    ) from None
                need = max(e.needed, 64 * 1024)
                if batches and (start + pos - batches[0].position) + need > max_bytes:
                    break
                data = self._pread(start, min(size - start, pos + need + _READ_SLACK_BYTES))
                continue
            h = b.header
            if h.next_offset <= start_offset:
                pos += b.size
                continue
            if h.next_offset > upper_bound:
                break
            if first < 0:
                first = pos
            used = pos + b.size - first
            if used > max_bytes and not (min_one_batch and not batches):
                break
            if verify_crc:
                b.verify_crc(where=self.path)
            batches.append(b)
            pos += b.size
        if not batches:
            return SegmentRead(self.base_offset, self.schema, [], memoryview(b""))
        region = data[first:pos]
        return SegmentRead(self.base_offset, self.schema, batches, region)

    def find_offset_for_timestamp(self, timestamp: int, *, start_offset: int) -> int | None:
        """The first offset ``>= start_offset`` whose record timestamp is ``>= timestamp``.

        Returns None when no record in this segment qualifies.
        """
        if self.max_timestamp < timestamp:
            return None
        entry = self.time_index.lookup_before(timestamp)
        from_offset = max(entry.offset, start_offset)
        position = max(self.offset_index.lookup(from_offset).position, self.data_start)
        for b in self._scan_from(position, self.size):
            h = b.header
            if h.next_offset <= start_offset or h.max_timestamp < timestamp:
                continue
            batch = b.decode(self.schema)
            offsets = batch.column(0).to_numpy()
            stamps = batch.column(1).cast(pa.int64()).to_numpy()
            hit = np.nonzero((stamps >= timestamp) & (offsets >= start_offset))[0]
            if len(hit):
                return int(offsets[hit[0]])
        return None

    def iter_batches(self) -> list[StoredBatch]:
        """Every batch in the file (headers parsed, CRC not checked)."""
        return self._scan_from(self.data_start, self.size)

    def __repr__(self) -> str:
        return f"Segment({self.path!r}, next_offset={self.next_offset}, size={self.size})"
