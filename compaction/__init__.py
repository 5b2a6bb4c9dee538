"""Log compaction as a Spark job: keep the latest record per key of compacted topics.

Layered as Kafka's cleaner is: :mod:`compaction.planner` (what to clean, and
the survivor rules), :mod:`compaction.cleaner` (how: the compacted batches,
streamed to the broker's atomic segment swap), :mod:`compaction.job` (when and
where: the Spark run, :func:`run_compaction`). :mod:`compaction.scan` reads a
partition range as stored batches for both. The broker side of the swap is
:mod:`logstore.storage.segment_replacement`.
"""

from __future__ import annotations

from compaction.cleaner import PartitionResult, clean_partition
from compaction.job import CompactionSummary, main, run_compaction
from compaction.planner import (
    PartitionPlan,
    Skipped,
    Survivors,
    cleanable_partitions,
    plan_cleaning,
    reference_survivors,
)

__all__ = [
    "CompactionSummary",
    "PartitionPlan",
    "PartitionResult",
    "Skipped",
    "Survivors",
    "cleanable_partitions",
    "clean_partition",
    "main",
    "plan_cleaning",
    "reference_survivors",
    "run_compaction",
]
