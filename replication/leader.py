"""The leader's side of one replicated partition: follower progress, HWM, ISR changes, acks=all.

Kafka's model (KIP-101/320, DESIGN.md §4b):

* every follower fetch says the follower's LEO (its ``fetch_offset``: a follower
  truncates by leader epoch before it fetches, so everything below it equals the
  leader's log); :meth:`LeaderState.on_follower_fetch` records it and when the
  follower was last *caught up*: at a fetch that asked for the leader's LEO, or
  at the previous fetch when this one asks for at least the LEO the leader had then;
* the **HWM** is the smallest LEO over the ISR, the leader included, and never
  goes back (:meth:`Partition.update_high_watermark`). A follower whose LEO is
  not known yet (a fresh leadership) holds it where it is;
* **ISR shrink** candidates: ISR followers not caught up for more than
  ``replica_lag_time_max_ms``; **ISR expand** candidates: replicas outside the
  ISR whose LEO reached the HWM and the start of the current leader epoch (so
  they hold everything this leader acknowledged). The replica manager changes
  the ISR only through the metadata store's compare-and-swap and feeds the
  result back with :meth:`LeaderState.set_state`;
* **acks=all**: :meth:`LeaderState.wait_for` resolves when the HWM reaches the
  produce's end offset with the ISR at least ``min.insync.replicas`` large;
  it fails with ``NOT_ENOUGH_REPLICAS_AFTER_APPEND`` when the ISR shrinks below
  that meanwhile, ``REQUEST_TIMED_OUT`` on timeout, and ``NOT_LEADER_OR_FOLLOWER``
  when the leadership ends (:meth:`LeaderState.stop`).

Deterministic and I/O-free: time is passed in (``now_ms``), the partition's HWM
is the only state outside this object it moves.

Thread-safety: event loop only (the replica manager hops leader appends onto the loop).
"""

from __future__ import annotations

import asyncio
import contextlib
from dataclasses import dataclass

from logstore.errors import (
    NotEnoughReplicasAfterAppendError,
    NotLeaderError,
    RequestTimedOutError,
)
from logstore.storage.partition import Partition
from replication.state import PartitionState

__all__ = ["FollowerProgress", "LeaderState"]


@dataclass(slots=True)
class FollowerProgress:
    """What the leader knows of one follower: its LEO (-1: unknown since this leadership
    began), when it last fetched and was last caught up (ms), and the leader's LEO at its
    last fetch."""

    leo: int = -1
    last_fetch_ms: float = 0.0
    last_caught_up_ms: float = 0.0
    leader_leo_at_last_fetch: int = -1


class LeaderState:
    """The leader's replication state of one partition; see the module docstring."""

    def __init__(self, partition: Partition, state: PartitionState, *, node_id: int,
                 min_insync_replicas: int, replica_lag_time_max_ms: int, now_ms: float) -> None:
        self.partition = partition
        self.node_id = node_id
        self.state = state
        self.min_insync_replicas = min_insync_replicas
        self.replica_lag_time_max_ms = replica_lag_time_max_ms
        # The LEO when this leadership began: a follower holds this leader's acknowledged
        # records once its LEO reaches it (and the HWM).
        self.epoch_start_offset = partition.log.log_end_offset
        self.followers = {r: FollowerProgress(last_caught_up_ms=now_ms) for r in state.replicas if r != node_id}
        self.alter_pending = False
        self._waiters: list[tuple[int, asyncio.Future[None]]] = []
        self._stopped = False

    @property
    def isr(self) -> tuple[int, ...]:
        return self.state.isr

    @property
    def leader_epoch(self) -> int:
        return self.state.leader_epoch

    # ------------------------------------------------------------------ progress

    def on_follower_fetch(self, node: int, fetch_offset: int, now_ms: float) -> bool:
        """Record a follower fetch from ``fetch_offset`` (its LEO); return whether the HWM moved."""
        progress = self.followers.get(node)
        if progress is None:
            return False
        leader_leo = self.partition.log.log_end_offset
        if fetch_offset >= leader_leo:
            progress.last_caught_up_ms = now_ms
        elif fetch_offset >= progress.leader_leo_at_last_fetch >= 0:
            progress.last_caught_up_ms = max(progress.last_caught_up_ms, progress.last_fetch_ms)
        progress.leo = min(fetch_offset, leader_leo)
        progress.last_fetch_ms = now_ms
        progress.leader_leo_at_last_fetch = leader_leo
        return self.update_high_watermark()

    def update_high_watermark(self) -> bool:
        """HWM = min LEO over the ISR (the leader's own included); resolve acks=all waiters."""
        leos = [self.partition.log.log_end_offset]
        for r in self.isr:
            if r != self.node_id:
                progress = self.followers.get(r)
                leos.append(progress.leo if progress is not None else -1)
        moved = min(leos) >= 0 and self.partition.update_high_watermark(min(leos))
        self._settle_waiters()
        return moved

    def shrink_candidates(self, now_ms: float) -> list[int]:
        """ISR followers not caught up for more than ``replica_lag_time_max_ms``."""
        return [r for r in self.isr if r != self.node_id and r in self.followers
                and now_ms - self.followers[r].last_caught_up_ms > self.replica_lag_time_max_ms]

    def excuse(self, stalled_ms: float) -> None:
        """This broker stood still for ``stalled_ms``: its followers could not fetch meanwhile,
        so that time does not count towards their lag."""
        for progress in self.followers.values():
            progress.last_caught_up_ms += stalled_ms

    def expand_candidate(self, node: int, now_ms: float) -> bool:
        """Whether ``node``, outside the ISR, now holds everything the ISR acknowledged. If so it
        counts as caught up as of ``now_ms``: its last caught-up time may be from before it fell
        behind (it caught up to the HWM, not yet to where the leader was at its previous fetch),
        and would shrink it out of the ISR again at the next check, right after it rejoined."""
        progress = self.followers.get(node)
        if progress is None or node in self.isr:
            return False
        if progress.leo >= self.partition.high_watermark and progress.leo >= self.epoch_start_offset:
            progress.last_caught_up_ms = max(progress.last_caught_up_ms, now_ms)
            return True
        return False

    def set_state(self, state: PartitionState) -> bool:
        """Take a newer state of the same leadership (an ISR change); ignore an older one.
        Return whether the HWM moved."""
        if state.leader_epoch != self.state.leader_epoch or state.partition_epoch < self.state.partition_epoch:
            return False
        for r in state.replicas:
            if r != self.node_id and r not in self.followers:
                self.followers[r] = FollowerProgress()
        self.state = state
        if len(state.isr) < self.min_insync_replicas:
            self._fail_waiters(NotEnoughReplicasAfterAppendError(
                f"the ISR of {state.topic}-{state.partition} shrank to {list(state.isr)}, below "
                f"min.insync.replicas={self.min_insync_replicas}, before the records were replicated"))
        return self.update_high_watermark()

    # ------------------------------------------------------------------ acks=all

    async def wait_for(self, end_offset: int, timeout_s: float) -> None:
        """Return once the HWM reaches ``end_offset`` (exclusive end of the produce) with enough
        in-sync replicas; raise as the module docstring says."""
        if self._stopped:
            raise NotLeaderError(f"{self._name()}: the leadership ended before the records were replicated")
        fut: asyncio.Future[None] = asyncio.get_running_loop().create_future()
        self._waiters.append((end_offset, fut))
        self._settle_waiters()
        try:
            await asyncio.wait_for(asyncio.shield(fut), timeout_s)
        except asyncio.TimeoutError:
            raise RequestTimedOutError(
                f"{self._name()}: the ISR {list(self.isr)} did not replicate up to offset {end_offset} "
                f"within {timeout_s * 1000:.0f} ms (high-water mark {self.partition.high_watermark})"
            ) from None
        finally:
            self._waiters = [(o, f) for o, f in self._waiters if f is not fut]
            if not fut.done():
                fut.cancel()

    def take_waiters(self, previous: LeaderState) -> None:
        """Carry the pending acks=all produces of ``previous`` (this broker's leadership at an
        older epoch, re-elected) over to this one."""
        self._waiters.extend(previous._waiters)
        previous._waiters = []
        self._settle_waiters()

    def _settle_waiters(self) -> None:
        hwm = self.partition.high_watermark
        keep = []
        for end, fut in self._waiters:
            if fut.done():
                continue
            if hwm >= end:
                if len(self.isr) >= self.min_insync_replicas:
                    fut.set_result(None)
                else:
                    fut.set_exception(NotEnoughReplicasAfterAppendError(
                        f"{self._name()}: the records are on the ISR {list(self.isr)}, fewer than "
                        f"min.insync.replicas={self.min_insync_replicas}"))
                continue
            keep.append((end, fut))
        self._waiters = keep

    def _fail_waiters(self, exc: Exception) -> None:
        for _, fut in self._waiters:
            if not fut.done():
                fut.set_exception(exc)
                # Mark retrieved: a waiter that timed out meanwhile no longer awaits it.
                with contextlib.suppress(BaseException):
                    fut.exception()
        self._waiters = []

    def stop(self) -> None:
        """The leadership ended: pending acks=all produces fail with NOT_LEADER_OR_FOLLOWER."""
        self._stopped = True
        self._fail_waiters(NotLeaderError(
            f"{self._name()}: this broker stopped leading it before the records were replicated; "
            "the producer retries on the new leader"))

    def _name(self) -> str:
        return f"{self.state.topic}-{self.state.partition}"
