"""A partition's cleaning state: what the log cleaner may compact and how dirty it is.

Declared once, for every side: the broker computes a :class:`CleaningState` from its log
(:func:`logstore.storage.cleanable.cleaning_state`), ``DescribeCleaning`` carries it
(``PartitionCleaning`` in the protocol), the client hands it back with the partition it
belongs to (:class:`logstore.client.results.PartitionCleaning`), and the compaction
planner steers by it. A :class:`CleanableSegment` is a closed segment as the cleaner sees
it; ``(base_offset, next_offset, size_bytes)`` is its identity, so a swap planned against
it is refused once any of them changed.

Thread-safety: immutable values.
"""

from __future__ import annotations

from dataclasses import dataclass

__all__ = ["CleanableSegment", "CleaningState"]


@dataclass(frozen=True, slots=True)
class CleanableSegment:
    """A closed segment: its first offset, the offset after its last (exclusive), its size
    and the largest timestamp in it (-1: unknown)."""

    base_offset: int
    next_offset: int
    size_bytes: int
    max_timestamp: int = -1


@dataclass(frozen=True, slots=True)
class CleaningState:
    """What the cleaner needs to know about one partition (offsets exclusive at the end).

    * ``cleanable_end_offset`` — records below it may be compacted. It is the base offset
      of the first segment that may not be: the active segment, or an earlier one that
      holds records at or above the last stable offset or younger than
      ``min.compaction.lag.ms`` (by its largest timestamp);
    * ``segments`` — the closed segments below ``cleanable_end_offset``, oldest first:
      exactly what a compaction replaces;
    * ``first_dirty_offset`` — the cleaner checkpoint, clamped to the log; segments
      wholly below it are *clean* (``clean_bytes``), the other cleanable ones *dirty*
      (``dirty_bytes``);
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
    segments: tuple[CleanableSegment, ...]
    in_progress: bool

    @property
    def dirty_ratio(self) -> float:
        """``dirty_bytes / (clean_bytes + dirty_bytes)``; 0.0 when nothing is cleanable."""
        total = self.clean_bytes + self.dirty_bytes
        return self.dirty_bytes / total if total else 0.0
