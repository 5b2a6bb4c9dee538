"""Removing records from a partition log: truncation, DeleteRecords, retention.

Part of :class:`logstore.storage.log.Log` (a mixin, split off by concept: what
leaves the log, as opposed to what enters it and what is read). The contracts of
the log module docstring hold here: mutations hold the log's lock, and the log
start offset file is replaced atomically after the records below it are durable.

Thread-safety: as :class:`~logstore.storage.log.Log`.
"""

from __future__ import annotations

import os
import threading

from logstore.errors import OffsetOutOfRangeError
from logstore.storage.config import LogConfig
from logstore.storage.fileutil import fsync_dir, write_atomically
from logstore.storage.leader_epoch import LeaderEpochCache
from logstore.storage.log_loader import LOG_START_OFFSET_FILE
from logstore.storage.retention import segments_past_retention
from logstore.storage.segment import Segment

__all__ = ["LogRemoval"]


class LogRemoval:
    """The record-removing half of :class:`~logstore.storage.log.Log` (which provides these attributes)."""

    directory: str
    recovery_point: int
    epochs: LeaderEpochCache
    _lock: threading.RLock
    _segments: list[Segment]
    _log_start_offset: int
    _config: LogConfig

    def _check_online(self) -> None:
        raise NotImplementedError

    def _now_ms(self) -> int:
        raise NotImplementedError

    def flush(self) -> None:
        raise NotImplementedError

    @property
    def log_end_offset(self) -> int:
        raise NotImplementedError

    @property
    def size_bytes(self) -> int:
        raise NotImplementedError

    def truncate_to(self, offset: int) -> None:
        """Remove every batch at or after ``offset`` (a follower diverging from its leader).

        Called by a follower truncating by leader epoch: what it removes was never
        acknowledged by the ISR (except after an unclean leader election), and
        consumers never read from a follower.
        """
        with self._lock:
            self._check_online()
            if offset >= self.log_end_offset:
                return
            if offset < self._log_start_offset:
                raise OffsetOutOfRangeError(
                    f"cannot truncate to {offset}: below log start offset {self._log_start_offset}"
                )
            keep = [s for s in self._segments if s.base_offset < offset] or [self._segments[0]]
            for seg in self._segments[len(keep):]:
                seg.delete()
            keep[-1].truncate_to(offset)
            self._segments = keep
            # A batch that spans ``offset`` is kept whole, so epochs end at the new LEO.
            self.epochs.truncate_from_end(self.log_end_offset)
            self.recovery_point = min(self.recovery_point, self.log_end_offset)
            self.flush()

    def truncate_fully_and_start_at(self, offset: int) -> None:
        """Delete every segment and start over, empty, at ``offset`` (a follower that fell
        behind its leader's log start offset: what it has is of no use any more)."""
        with self._lock:
            self._check_online()
            schema = self._segments[-1].schema
            for seg in self._segments:
                seg.delete()
            self._segments = [Segment.create(self.directory, offset, schema,
                                             index_interval_bytes=self._config.index_interval_bytes,
                                             created_ms=self._now_ms())]
            write_atomically(os.path.join(self.directory, LOG_START_OFFSET_FILE), f"{offset}\n".encode())
            self._log_start_offset = offset
            self.epochs.truncate_from_end(0)
            self.recovery_point = offset
            fsync_dir(self.directory)

    def delete_records_before(self, offset: int) -> int:
        """Advance the log start offset to ``offset`` (Kafka's DeleteRecords); return it.

        Whole segments below it are deleted; records below it in the first
        remaining segment stay on disk but are never served.
        """
        with self._lock:
            self._check_online()
            if offset > self.log_end_offset:
                raise OffsetOutOfRangeError(
                    f"cannot delete records before {offset}: log end offset is {self.log_end_offset}"
                )
            if offset > self._log_start_offset:
                self._set_log_start_offset(offset)
                doomed = [s for s in self._segments[:-1] if s.next_offset <= offset]
                self._delete_segments(doomed)
            return self._log_start_offset

    def enforce_retention(self) -> int:
        """Delete closed segments beyond ``retention.ms`` / ``retention.bytes``; return how many.

        Only when ``cleanup.policy`` includes ``delete``; which segments, see
        :mod:`logstore.storage.retention`. The active segment is never deleted.
        """
        with self._lock:
            self._check_online()
            cfg = self._config
            if not cfg.delete:
                return 0
            doomed = segments_past_retention(self._segments[:-1], cfg, now_ms=self._now_ms(),
                                             log_size_bytes=self.size_bytes)
            if doomed:
                new_start = self._segments[len(doomed)].base_offset
                self._set_log_start_offset(max(new_start, self._log_start_offset))
                self._delete_segments(doomed)
            return len(doomed)

    def _set_log_start_offset(self, offset: int) -> None:
        if offset > self.recovery_point:
            # Durable records first: a recovered log never ends below its log start offset.
            self.flush()
        write_atomically(os.path.join(self.directory, LOG_START_OFFSET_FILE), f"{offset}\n".encode())
        self._log_start_offset = offset
        self.epochs.truncate_from_start(offset)

    def _delete_segments(self, doomed: list[Segment]) -> None:
        if not doomed:
            return
        gone = {id(s) for s in doomed}
        self._segments = [s for s in self._segments if id(s) not in gone]
        for seg in doomed:
            seg.delete()
        fsync_dir(self.directory)
