"""What of a partition the log cleaner may compact, and how dirty it is: the facts
``DescribeCleaning`` reports and the compaction planner steers by
(:class:`logstore.cleaning.CleaningState`).

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

from logstore.cleaning import CleaningState
from logstore.errors import LogOfflineError
from logstore.storage.cleaner_checkpoint import read_cleaner_checkpoint
from logstore.storage.log import Log
from logstore.storage.segment import Segment
from logstore.storage.segment_replacement import replacement_in_progress, segment_summary

__all__ = ["cleaning_state"]


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
        segments=tuple(segment_summary(s) for s in cleanable),
        in_progress=replacement_in_progress(log.directory),
    )
