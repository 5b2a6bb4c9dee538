"""The leader epoch cache of one partition: which epoch's leader wrote which offsets.

File ``leader-epoch-checkpoint``: one line ``<epoch> <start_offset>`` per entry,
epochs and start offsets strictly increasing. Entry ``(e, o)`` promises: the
first batch written with leader epoch ``e`` has base offset ``o``, and every
batch from ``o`` up to the next entry's start offset was written in epoch
``e``. Replication uses it to find where a follower's log diverges from the
leader's (``end_offset_for_epoch``). The file is replaced atomically on every
change, so after a crash it holds the old or the new entries.

Thread-safety: callers hold the owning log's lock for mutations.
"""

from __future__ import annotations

import os
from dataclasses import dataclass

from logstore.errors import CorruptRecordError
from logstore.storage.fileutil import read_text_or, write_atomically

__all__ = ["EpochEntry", "LeaderEpochCache", "LEADER_EPOCH_CHECKPOINT"]

LEADER_EPOCH_CHECKPOINT = "leader-epoch-checkpoint"


@dataclass(frozen=True, slots=True)
class EpochEntry:
    epoch: int
    start_offset: int


class LeaderEpochCache:
    def __init__(self, directory: str, *, load: bool = True) -> None:
        """The cache of ``directory``'s checkpoint (empty, the file unread, when not ``load``)."""
        self.path = os.path.join(directory, LEADER_EPOCH_CHECKPOINT)
        self._entries: list[EpochEntry] = []
        for n, line in enumerate(read_text_or(self.path, "").splitlines() if load else []):
            try:
                epoch, start = (int(x) for x in line.split())
            except ValueError:
                raise CorruptRecordError(f"{self.path}: line {n + 1} is malformed: {line!r}") from None
            self._entries.append(EpochEntry(epoch, start))

    @property
    def entries(self) -> list[EpochEntry]:
        return list(self._entries)

    @property
    def latest_epoch(self) -> int:
        return self._entries[-1].epoch if self._entries else -1

    def assign(self, epoch: int, start_offset: int) -> None:
        """Record that ``epoch`` starts at ``start_offset`` (no-op for the current epoch).

        A last entry that starts at ``start_offset`` too covers no offsets (its
        records were removed from the start of the log): it is replaced.
        """
        if epoch < 0 or (self._entries and epoch <= self._entries[-1].epoch):
            return
        if self._entries and start_offset < self._entries[-1].start_offset:
            raise ValueError(
                f"{self.path}: epoch {epoch} start offset {start_offset} is before "
                f"epoch {self._entries[-1].epoch}'s start {self._entries[-1].start_offset}"
            )
        if self._entries and start_offset == self._entries[-1].start_offset:
            self._entries.pop()
        self._entries.append(EpochEntry(epoch, start_offset))
        self._persist()

    def end_offset_for_epoch(self, epoch: int, log_end_offset: int) -> int:
        """The exclusive end offset of ``epoch``: the start of the next larger epoch, or the LEO."""
        for entry in self._entries:
            if entry.epoch > epoch:
                return entry.start_offset
        return log_end_offset

    def truncate_from_end(self, end_offset: int) -> None:
        """Forget epochs that start at or after ``end_offset`` (after a log truncation)."""
        kept = [e for e in self._entries if e.start_offset < end_offset]
        if kept != self._entries:
            self._entries = kept
            self._persist()

    def truncate_from_start(self, start_offset: int) -> None:
        """Drop epochs that end before ``start_offset``; clamp the first kept one to it."""
        kept: list[EpochEntry] = []
        for i, e in enumerate(self._entries):
            nxt = self._entries[i + 1].start_offset if i + 1 < len(self._entries) else None
            if nxt is not None and nxt <= start_offset:
                continue
            kept.append(EpochEntry(e.epoch, max(e.start_offset, start_offset)))
        if kept != self._entries:
            self._entries = kept
            self._persist()

    def _persist(self) -> None:
        text = "".join(f"{e.epoch} {e.start_offset}\n" for e in self._entries)
        write_atomically(self.path, text.encode())
