"""Sparse offset and time indexes of one segment.

Both are files of fixed-width little-endian entries, appended as batches are
appended to the segment (one entry per ``index.interval.bytes`` of segment
data, plus one for the first batch). Offsets in entries are *relative* to the
segment's base offset (u32), so a segment holds at most 2**32 offsets.

Offset index (``<base>.index``), 8 bytes per entry::

    u32 relative_offset | u32 position

  Entry ``(r, p)`` promises: the batch whose base offset is ``base + r``
  starts at byte ``p`` of the segment file. Entries strictly increase in
  both fields.

Time index (``<base>.timeindex``), 12 bytes per entry::

    i64 timestamp_ms | u32 relative_offset

  Entry ``(t, r)`` promises: every record in the batches of this segment
  whose base offset is ``<= base + r`` has a timestamp ``<= t``, and ``t`` is
  the largest timestamp among them. Entries strictly increase in ``t`` and do
  not decrease in ``r``. The segment appends a final entry when it is closed,
  so the last entry's ``t`` is the segment's largest timestamp.

Lookups binary-search in-memory copies of the entries (O(log n)); entries
are loaded from the file on first use. No descriptor is kept open: appended
entries are held in memory and written (one open, write, close) on
:meth:`flush` (with an fsync) and :meth:`close`, i.e. when the segment is
flushed, rolled or closed, so an index costs no descriptor between those.
Index files are not fsynced on every
append: after an unclean shutdown they are rebuilt from the segment
(see :mod:`logstore.storage.segment`); a file whose size is not a multiple of the
entry width, or whose entries do not increase, is reported by
:meth:`sanity_check` so the caller rebuilds it.

Thread-safety: one writer (append/truncate) and many concurrent readers
(lookups) are safe; appends grow the value array before the key array, so a
reader never finds a key without its value.
"""

from __future__ import annotations

import bisect
import contextlib
import os
import struct
from array import array
from dataclasses import dataclass

from logstore.errors import CorruptRecordError

__all__ = ["OffsetPosition", "TimestampOffset", "OffsetIndex", "TimeIndex"]


@dataclass(frozen=True, slots=True)
class OffsetPosition:
    """An absolute offset and the byte position of the batch starting there."""

    offset: int
    position: int


@dataclass(frozen=True, slots=True)
class TimestampOffset:
    """A timestamp (ms) and an absolute offset."""

    timestamp: int
    offset: int


class _IndexFile:
    """Fixed-width (key, value) entries, strictly increasing in key, with a file behind them."""

    _entry: struct.Struct
    _key_code: str
    _value_code: str

    def __init__(self, path: str, base_offset: int) -> None:
        self.path = path
        self.base_offset = base_offset
        self._keys: array[int] = array(self._key_code)
        self._values: array[int] = array(self._value_code)
        self._loaded = False
        # Entries [0, _persisted) are in the file; the rest only in memory until written.
        self._persisted = 0
        self._unsynced = False

    # -- loading and writing ------------------------------------------------

    def _ensure_loaded(self) -> None:
        if self._loaded:
            return
        raw = b""
        if os.path.exists(self.path):
            with open(self.path, "rb") as f:
                raw = f.read()
        width = self._entry.size
        usable = len(raw) - len(raw) % width
        keys, values = array(self._key_code), array(self._value_code)
        for k, v in self._entry.iter_unpack(raw[:usable]):
            keys.append(k)
            values.append(v)
        self._keys, self._values = keys, values
        self._torn_bytes = len(raw) - usable
        self._persisted = len(keys)
        self._loaded = True

    def _append_entry(self, key: int, value: int) -> None:
        self._ensure_loaded()
        self._values.append(value)
        self._keys.append(key)

    def _write_pending(self, *, fsync: bool) -> None:
        """Write the entries not yet in the file at their place (fsync it when asked)."""
        count = len(self._keys)
        if self._persisted < count:
            start = self._persisted
            data = b"".join(
                self._entry.pack(k, v) for k, v in zip(self._keys[start:count], self._values[start:count],
                                                       strict=True)
            )
            fd = os.open(self.path, os.O_WRONLY | os.O_CREAT, 0o644)
            try:
                os.pwrite(fd, data, start * self._entry.size)
                if fsync:
                    os.fsync(fd)
            finally:
                os.close(fd)
            self._persisted = count
            self._unsynced = not fsync
        elif fsync and self._unsynced:
            fd = os.open(self.path, os.O_RDONLY)
            try:
                os.fsync(fd)
            finally:
                os.close(fd)
            self._unsynced = False

    def sanity_check(self) -> None:
        """Raise :class:`CorruptRecordError` if the file is torn or its keys do not increase."""
        self._ensure_loaded()
        if self._torn_bytes:
            raise CorruptRecordError(
                f"{self.path}: size is not a multiple of {self._entry.size} "
                f"({self._torn_bytes} trailing bytes)"
            )
        keys = self._keys
        for i in range(1, len(keys)):
            if keys[i] <= keys[i - 1]:
                raise CorruptRecordError(
                    f"{self.path}: entry {i} key {keys[i]} does not exceed entry {i - 1} key {keys[i - 1]}"
                )

    def _truncate_entries(self, count: int) -> None:
        """Keep the first ``count`` entries, in memory and on disk."""
        self._ensure_loaded()
        if count >= len(self._keys):
            return
        del self._keys[count:]
        del self._values[count:]
        self._persisted = min(self._persisted, count)
        with open(self.path, "r+b" if os.path.exists(self.path) else "wb") as f:
            f.truncate(self._persisted * self._entry.size)

    def reset(self) -> None:
        """Drop every entry (before a rebuild)."""
        self._keys, self._values = array(self._key_code), array(self._value_code)
        self._torn_bytes = 0
        self._persisted = 0
        self._unsynced = False
        self._loaded = True
        with open(self.path, "wb"):
            pass

    def __len__(self) -> int:
        self._ensure_loaded()
        return len(self._keys)

    def flush(self) -> None:
        """Write the entries held in memory and fsync the file."""
        if self._loaded:
            self._write_pending(fsync=True)

    def close(self) -> None:
        """Write the entries held in memory (no fsync); the index stays usable."""
        if self._loaded:
            self._write_pending(fsync=False)

    def delete(self) -> None:
        """Remove the file; entries held in memory are dropped, never written."""
        self._persisted = len(self._keys)
        self._unsynced = False
        with contextlib.suppress(FileNotFoundError):
            os.remove(self.path)

    def rename(self, path: str) -> None:
        self.close()
        if os.path.exists(self.path):
            os.replace(self.path, path)
        self.path = path


class OffsetIndex(_IndexFile):
    """Relative offset → position; see the module docstring for the promise of an entry."""

    _entry = struct.Struct("<II")
    _key_code = "I"
    _value_code = "I"

    def append(self, offset: int, position: int) -> None:
        """Add the entry for the batch with base offset ``offset`` at byte ``position``."""
        rel = offset - self.base_offset
        if not 0 <= rel < 2**32 or not 0 <= position < 2**32:
            raise ValueError(f"{self.path}: entry ({offset}, {position}) out of u32 range")
        last = self.last_entry()
        if len(self) and (rel <= last.offset - self.base_offset or position <= last.position):
            raise ValueError(
                f"{self.path}: entry ({offset}, {position}) does not follow last entry "
                f"({last.offset}, {last.position})"
            )
        self._append_entry(rel, position)

    def lookup(self, offset: int) -> OffsetPosition:
        """The entry with the largest offset ``<= offset``.

        If there is none, returns ``(base_offset, 0)``: start at the beginning
        of the segment.
        """
        self._ensure_loaded()
        i = bisect.bisect_right(self._keys, offset - self.base_offset) - 1
        if i < 0:
            return OffsetPosition(self.base_offset, 0)
        return OffsetPosition(self.base_offset + self._keys[i], self._values[i])

    def last_entry(self) -> OffsetPosition:
        self._ensure_loaded()
        if not self._keys:
            return OffsetPosition(self.base_offset, 0)
        return OffsetPosition(self.base_offset + self._keys[-1], self._values[-1])

    def truncate_to(self, offset: int) -> None:
        """Remove every entry for batches at ``offset`` or later."""
        self._ensure_loaded()
        self._truncate_entries(bisect.bisect_left(self._keys, offset - self.base_offset))

    def entries(self) -> list[OffsetPosition]:
        self._ensure_loaded()
        return [OffsetPosition(self.base_offset + k, v) for k, v in zip(self._keys, self._values, strict=True)]


class TimeIndex(_IndexFile):
    """Timestamp → relative offset; see the module docstring for the promise of an entry."""

    _entry = struct.Struct("<qI")
    _key_code = "q"
    _value_code = "I"

    def maybe_append(self, timestamp: int, offset: int) -> bool:
        """Add ``(timestamp, offset)`` if ``timestamp`` exceeds the last entry's; say whether it did."""
        rel = offset - self.base_offset
        if not 0 <= rel < 2**32:
            raise ValueError(f"{self.path}: offset {offset} out of u32 range for base {self.base_offset}")
        self._ensure_loaded()
        if self._keys and timestamp <= self._keys[-1]:
            return False
        if self._values and rel < self._values[-1]:
            raise ValueError(f"{self.path}: offset {offset} goes back before the last entry")
        self._append_entry(timestamp, rel)
        return True

    def lookup_before(self, timestamp: int) -> TimestampOffset:
        """The entry with the largest timestamp ``< timestamp``.

        Every record at or before that entry's batch is older than
        ``timestamp``, so a search for the first record ``>= timestamp`` may
        start at that batch. If there is none, returns ``(-1, base_offset)``.
        """
        self._ensure_loaded()
        i = bisect.bisect_left(self._keys, timestamp) - 1
        if i < 0:
            return TimestampOffset(-1, self.base_offset)
        return TimestampOffset(self._keys[i], self.base_offset + self._values[i])

    def last_entry(self) -> TimestampOffset:
        self._ensure_loaded()
        if not self._keys:
            return TimestampOffset(-1, self.base_offset)
        return TimestampOffset(self._keys[-1], self.base_offset + self._values[-1])

    def truncate_to(self, offset: int) -> None:
        """Remove every entry that refers to a batch at ``offset`` or later."""
        self._ensure_loaded()
        rel = offset - self.base_offset
        keep = len(self._values)
        while keep and self._values[keep - 1] >= rel:
            keep -= 1
        self._truncate_entries(keep)

    def sanity_check(self) -> None:
        super().sanity_check()
        values = self._values
        for i in range(1, len(values)):
            if values[i] < values[i - 1]:
                raise CorruptRecordError(f"{self.path}: entry {i} offset goes backwards")

    def entries(self) -> list[TimestampOffset]:
        self._ensure_loaded()
        return [TimestampOffset(k, self.base_offset + v) for k, v in zip(self._keys, self._values, strict=True)]
