"""What of a partition the log cleaner may compact, and how dirty it is: the facts
``DescribeCleaning`` reports and the compaction planner steers by.

Which records survive a compaction is decided outside the broker (the Spark
job in ``compaction/``); the broker reports each partition's cleanable range
(:func:`cleaning_state`) and accepts replacement segments for it
(:mod:`logstore.storage.segment_replacement`). The *first dirty offset* comes
from the cleaner checkpoint (:mod:`logstore.storage.cleaner_checkpoint`),
which every successful swap advances.

Thread-safety: :func:`cleaning_state` reads a snapshot of the log's segment
list and takes no lock.
"""

from __future__ import annotations

import os
from dataclasses import dataclass

from logstore.errors import LogOfflineError
from logstore.storage.cleaner_checkpoint import read_cleaner_checkpoint
from logstore.storage.log import Log
from logstore.storage.segment import Segment
from logstore.storage.segment_replacement import SegmentSummary, replacement_in_progress

__all__ = ["CleaningState", "cleaning_state"]


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
