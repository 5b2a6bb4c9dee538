"""The console's own samples: end offsets (for rates) and group lag (for charts), in memory.

The broker keeps no history, so the console samples it: every
``interval_s`` seconds (``--sample-interval``, default 2) a background task
asks the cluster (through :class:`logstore.client.admin.Admin`, in a worker
thread because the admin client blocks) for

* every topic's partitions (their high-water marks), and
* every consumer group's lag per partition (the leaders' high-water marks
  minus its committed offsets, see :mod:`.offsets`),

and appends one point to a bounded history (``history`` samples, default
300: ten minutes at 2 s). Nothing is persisted: a restarted console starts
with empty charts.

* **Rate** of a partition: the records appended per second between the
  oldest and the newest sample in the last ``rate_window_s`` (default 30 s),
  i.e. the slope of its high-water mark; None until two samples exist.
* **Lag** of a group: per partition, the high-water mark minus the committed
  offset (None where it committed nothing); a point holds the total and
  each partition's value.

A failed sample (broker down, a group deleted in between) is skipped and
remembered as :attr:`Sampler.last_error`, shown by the pages; the next
interval tries again.

Thread-safety: :meth:`Sampler.sample_once` runs on the event loop (its
blocking calls in a thread); readers run on the same loop, so no locks.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass, field

from logstore.cli.console.offsets import group_topics, lag_rows, leader_high_watermarks
from logstore.client.admin import Admin
from logstore.errors import LogstoreError
from logstore.types import PartitionLag, TopicPartition

__all__ = ["LagPoint", "Sampler"]

log = logging.getLogger("logstore.console")


@dataclass(frozen=True, slots=True)
class LagPoint:
    """One lag sample of a group: when (``time.time()`` seconds), the total and each partition's."""

    at_s: float
    total: int
    partitions: dict[TopicPartition, int] = field(default_factory=dict)


class Sampler:
    """Samples end offsets and group lag every ``interval_s``; see the module docstring."""

    def __init__(self, admin: Admin, *, interval_s: float = 2.0, history: int = 300,
                 rate_window_s: float = 30.0, clock: Callable[[], float] = time.time) -> None:
        if interval_s <= 0:
            raise ValueError(f"interval_s must be > 0, got {interval_s!r}")
        self.admin = admin
        self.interval_s = interval_s
        self.history = history
        self.rate_window_s = rate_window_s
        self._clock = clock
        self._ends: dict[TopicPartition, deque[tuple[float, int]]] = {}
        self._lag: dict[str, deque[LagPoint]] = {}
        self.samples = 0
        self.last_error: str | None = None
        self._task: asyncio.Task[None] | None = None

    # ------------------------------------------------------------------ sampling

    def record_ends(self, ends: dict[TopicPartition, int], at_s: float) -> None:
        """Add one end-offset sample; partitions that are gone are forgotten."""
        for tp in set(self._ends) - set(ends):
            del self._ends[tp]
        for tp, end in ends.items():
            self._ends.setdefault(tp, deque(maxlen=self.history)).append((at_s, end))

    def record_lag(self, group: str, rows: list[PartitionLag], at_s: float) -> None:
        """Add one lag sample of ``group`` (partitions without a committed offset are left out)."""
        parts = {r.topic_partition: r.lag for r in rows if r.lag is not None}
        point = LagPoint(at_s, sum(parts.values()), parts)
        self._lag.setdefault(group, deque(maxlen=self.history)).append(point)

    def _collect(self) -> tuple[dict[TopicPartition, int], dict[str, list[PartitionLag]]]:
        """The blocking part of a sample (runs in a worker thread): the leaders' high-water marks
        (:mod:`.offsets`: on a cluster, Metadata's are the answering replica's) and each group's lag
        against them."""
        topics = self.admin.describe_topics()
        ends = leader_high_watermarks(self.admin, (p.topic_partition for d in topics.values()
                                                   for p in d.partitions if p.error is None))
        lags: dict[str, list[PartitionLag]] = {}
        for g in self.admin.list_groups():
            try:
                desc = self.admin.describe_group(g.group_id)
            except LogstoreError as e:  # deleted since listed: skip it this time
                log.debug("console: lag of group %r not sampled: %s", g.group_id, e)
                continue
            tps = [p.topic_partition for name in group_topics(desc) if name in topics
                   for p in topics[name].partitions]
            lags[g.group_id] = lag_rows(desc, tps, ends)
        return ends, lags

    async def sample_once(self) -> None:
        """Take one sample now (the background task calls this every interval)."""
        try:
            ends, lags = await asyncio.to_thread(self._collect)
        except (LogstoreError, OSError) as e:
            self.last_error = f"{type(e).__name__}: {e}"
            return
        now = self._clock()
        self.record_ends(ends, now)
        for group in set(self._lag) - set(lags):
            del self._lag[group]
        for group, rows in lags.items():
            self.record_lag(group, rows, now)
        self.samples += 1
        self.last_error = None

    async def _run(self) -> None:
        while True:
            started = time.monotonic()
            await self.sample_once()
            await asyncio.sleep(max(0.0, self.interval_s - (time.monotonic() - started)))

    def start(self) -> None:
        """Start sampling in the background on the running loop."""
        if self._task is None:
            self._task = asyncio.get_running_loop().create_task(self._run(), name="console-sampler")

    async def stop(self) -> None:
        if self._task is not None:
            self._task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._task
            self._task = None

    # ------------------------------------------------------------------ reading

    def rate(self, tp: TopicPartition) -> float | None:
        """Records per second appended to ``tp`` over the last ``rate_window_s``; None before two
        samples."""
        points = self._ends.get(tp)
        if not points or len(points) < 2:
            return None
        newest_t, newest = points[-1]
        oldest_t, oldest = points[-2]
        for t, end in reversed(points):
            if newest_t - t > self.rate_window_s:
                break
            oldest_t, oldest = t, end
        if newest_t <= oldest_t:
            return None
        return max(0, newest - oldest) / (newest_t - oldest_t)

    def lag_history(self, group: str) -> list[LagPoint]:
        """The samples of ``group``'s lag, oldest first (empty before the first)."""
        return list(self._lag.get(group, ()))
