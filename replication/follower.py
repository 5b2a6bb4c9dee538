"""The follower's side: one fetcher per leader broker, truncating by leader epoch, then fetching.

A broker follows many partitions led by the same broker; one
:class:`LeaderFetcher` (one asyncio task, one :class:`~replication.links.LeaderLink`)
serves all of them, as Kafka's replica fetcher thread does. Each round:

1. **Truncate by leader epoch** (KIP-101, KIP-279) the partitions that just
   started following (a new leader or a new leader epoch, or after an
   answer that says the log diverged): ask the leader
   ``OffsetsForLeaderEpoch(my latest epoch)``; the answer ``(e, end)`` is the
   largest epoch ``<= mine`` the leader has and where it ends there. If this
   log has epoch ``e`` too, truncate to ``min(end, my end of e)`` — done. If it
   does not (the leader's ``e`` is older than anything here past it), truncate to
   my end of ``e``'s floor epoch and ask again with the now latest epoch: the
   exchange repeats until it converges (KIP-279: fast leader fail-overs leave
   several epochs to walk back). Never by the HWM alone — the one exception is a
   leader or a log with no epochs at all (``(-1, -1)``, or an empty epoch
   cache), where Kafka's fallback applies: truncate to this replica's HWM.
2. **Fetch** the others: a ``FetchRequest`` with ``replica_id`` = this node,
   each partition's ``fetch_offset`` = its LEO and ``current_leader_epoch``,
   ``max_wait_ms`` = ``replica_fetch_wait_max_ms`` (the leader long-polls).
   The answer's batches are appended as they are
   (:meth:`~logstore.storage.partition.Partition.append_replica`, off the event
   loop through ``run_io``) and the HWM set to ``min(leader's HWM, own LEO)``.

**Replication throttle** (a reassignment's ``--throttle``): a partition this broker is *adding*
(a new replica catching up) fetches at most ``throttle`` bytes/s, a token bucket per
partition (:meth:`LeaderFetcher.set_throttle`): each fetch asks for no more than the bucket
holds, the bytes received are taken from it (it may go into debt by one batch), and while it is
in debt the partition sits out rounds, the others fetching as usual. The throttle is on the
follower's side because the follower knows which of its partitions are catching up (in-sync
replicas of the same leader are never slowed, so acks=all produces are not), and it needs no
state on the leader, whose serving path stays as it is; the leader's cost is bounded by what
the followers ask.

Errors in an answer park that partition for a back-off (100 ms doubling to 1 s)
and then retry: ``FENCED_LEADER_EPOCH`` and ``NOT_LEADER_OR_FOLLOWER`` mostly mean
new metadata is on its way (the replica manager then re-adds the partition with
the new epoch), ``UNKNOWN_LEADER_EPOCH`` that the leader has not seen it yet.
``OFFSET_OUT_OF_RANGE`` above the leader's log start means the logs diverged:
truncate by epoch again; below it (retention deleted what this replica still
needs), the log starts over, empty, at the leader's log start offset. A broken link backs the whole fetcher off the same way.

For deterministic tests :meth:`LeaderFetcher.run_once` does one round (no
task); :meth:`LeaderFetcher.start` runs rounds in a task until :meth:`close`.

Thread-safety: event loop only; disk work goes through ``run_io``.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from typing import Any

from logstore._proto import logstore_pb2 as pb
from logstore.errors import LogstoreError
from logstore.storage.partition import UNDEFINED_OFFSET, Partition
from replication.links import LeaderLink, LinkError

__all__ = ["FollowedPartition", "LeaderFetcher", "BACKOFF_MIN_S", "BACKOFF_MAX_S"]

log = logging.getLogger("logstore.replication.follower")

BACKOFF_MIN_S = 0.1
BACKOFF_MAX_S = 1.0
_MAX_TRUNCATION_ROUNDS = 64
_BURST_S = 0.2  # a throttled partition's bucket holds at most this many seconds of its rate

RunIo = Callable[..., Awaitable[Any]]


@dataclass(slots=True)
class FollowedPartition:
    """A partition this broker follows from the fetcher's leader, at ``leader_epoch``."""

    partition: Partition
    leader_epoch: int
    needs_truncation: bool = True
    parked_until: float = 0.0
    backoff_s: float = BACKOFF_MIN_S
    restart_at: int = -1  # the leader's log start offset, when this log fell behind it
    tokens: float = 0.0  # the throttle's bucket (bytes), refilled at the rate since tokens_at
    tokens_at: float = 0.0

    @property
    def key(self) -> tuple[str, int]:
        return self.partition.topic, self.partition.partition

    def park(self, now: float) -> None:
        self.parked_until = now + self.backoff_s
        self.backoff_s = min(self.backoff_s * 2, BACKOFF_MAX_S)

    def ready(self, now: float) -> bool:
        return now >= self.parked_until


class LeaderFetcher:
    """Fetches every partition this broker follows from one leader broker; see the module docstring."""

    def __init__(self, node_id: int, leader_id: int, link: LeaderLink, *, run_io: RunIo,
                 on_high_watermark: Callable[[str, int], None], fetch_wait_max_ms: int,
                 fetch_max_bytes: int = 16 << 20, partition_max_bytes: int = 4 << 20,
                 clock: Callable[[], float] = time.monotonic) -> None:
        self.node_id = node_id
        self.leader_id = leader_id
        self.link = link
        self._run_io = run_io
        self._on_high_watermark = on_high_watermark
        self._fetch_wait_max_ms = fetch_wait_max_ms
        self._fetch_max_bytes = fetch_max_bytes
        self._partition_max_bytes = partition_max_bytes
        self._clock = clock
        self.partitions: dict[tuple[str, int], FollowedPartition] = {}
        self._changed = asyncio.Event()
        self._task: asyncio.Task[None] | None = None
        self._link_backoff_s = BACKOFF_MIN_S
        self._throttles: dict[tuple[str, int], int] = {}

    # ------------------------------------------------------------------ membership

    def set_throttle(self, key: tuple[str, int], bytes_per_s: int) -> None:
        """Fetch ``key`` at most ``bytes_per_s`` (0: unthrottled); see the module docstring."""
        if bytes_per_s > 0:
            if self._throttles.get(key) != bytes_per_s:
                fp = self.partitions.get(key)
                if fp is not None:
                    fp.tokens, fp.tokens_at = 0.0, self._clock()
            self._throttles[key] = bytes_per_s
        else:
            self._throttles.pop(key, None)

    def _allowance(self, fp: FollowedPartition, now: float) -> int:
        """The bytes ``fp`` may fetch now (the partition maximum when unthrottled); 0 parks it
        until the bucket is out of debt."""
        rate = self._throttles.get(fp.key, 0)
        if rate <= 0:
            return self._partition_max_bytes
        if fp.tokens_at == 0.0:
            fp.tokens_at = now
        fp.tokens = min(fp.tokens + rate * (now - fp.tokens_at), rate * _BURST_S)
        fp.tokens_at = now
        if fp.tokens < 1:
            fp.parked_until = now + (1 - fp.tokens) / rate
            return 0
        return int(min(fp.tokens, self._partition_max_bytes))

    def add(self, partition: Partition, leader_epoch: int) -> None:
        """Follow ``partition`` at ``leader_epoch`` (again): it truncates by epoch first."""
        key = (partition.topic, partition.partition)
        self.partitions[key] = FollowedPartition(partition, leader_epoch)
        self._changed.set()

    def remove(self, key: tuple[str, int]) -> None:
        self.partitions.pop(key, None)
        self._throttles.pop(key, None)

    def _current(self, fp: FollowedPartition) -> bool:
        """Whether ``fp`` is still followed as it was when a request about it was sent."""
        return self.partitions.get(fp.key) is fp

    # ------------------------------------------------------------------ task

    def start(self) -> None:
        if self._task is None:
            self._task = asyncio.create_task(self._run(), name=f"fetcher-{self.node_id}-from-{self.leader_id}")

    async def _run(self) -> None:
        while True:
            try:
                worked = await self.run_once()
                self._link_backoff_s = BACKOFF_MIN_S
            except LinkError as e:
                log.info("broker %d: fetching from leader %d: %s; retrying in %.1f s", self.node_id,
                         self.leader_id, e, self._link_backoff_s)
                await asyncio.sleep(self._link_backoff_s)
                self._link_backoff_s = min(self._link_backoff_s * 2, BACKOFF_MAX_S)
                continue
            except Exception:
                log.exception("broker %d: fetcher from leader %d failed; retrying", self.node_id, self.leader_id)
                await asyncio.sleep(BACKOFF_MAX_S)
                continue
            if not worked:
                self._changed.clear()
                parked = [fp.parked_until for fp in self.partitions.values()]
                wait = max(min(parked) - self._clock(), 0.0) if parked else BACKOFF_MAX_S
                with contextlib.suppress(asyncio.TimeoutError):
                    await asyncio.wait_for(self._changed.wait(), min(wait, BACKOFF_MAX_S) or 0.01)

    async def close(self) -> None:
        if self._task is not None:
            self._task.cancel()
            with contextlib.suppress(asyncio.CancelledError, Exception):
                await self._task
            self._task = None
        await self.link.close()

    # ------------------------------------------------------------------ one round

    async def run_once(self, *, max_wait_ms: int | None = None) -> bool:
        """Truncate what needs it, then one fetch; return whether any partition was ready.
        Raises :class:`LinkError` when the leader cannot be reached."""
        now = self._clock()
        ready = [fp for fp in self.partitions.values() if fp.ready(now)]
        if not ready:
            return False
        for fp in ready:
            if fp.restart_at >= 0:
                log.info("broker %d: %s-%d fell behind the leader's log start offset %d: starting over there",
                         self.node_id, fp.key[0], fp.key[1], fp.restart_at)
                restart_at, fp.restart_at = fp.restart_at, -1
                try:
                    await self._run_io(fp.partition.truncate_fully_and_start_at, restart_at)
                except LogstoreError as e:
                    self._on_error(fp, e.code, e.message)
        truncating = [fp for fp in ready if fp.needs_truncation]
        if truncating:
            await self.truncate(truncating)
        now = self._clock()
        allowed = {fp.key: self._allowance(fp, now) for fp in ready
                   if not fp.needs_truncation and self._current(fp) and fp.ready(now)}
        fetching = [fp for fp in ready if allowed.get(fp.key, 0) > 0]
        if fetching:
            await self.fetch(fetching, max_wait_ms=self._fetch_wait_max_ms if max_wait_ms is None else max_wait_ms,
                             max_bytes=allowed)
        return bool(fetching) or len(allowed) < len(ready)

    async def truncate(self, partitions: list[FollowedPartition]) -> None:
        """Truncate ``partitions`` by leader epoch until each converges (or is parked)."""
        pending = list(partitions)
        for _ in range(_MAX_TRUNCATION_ROUNDS):
            if not pending:
                return
            asks: list[FollowedPartition] = []
            for fp in pending:
                if fp.partition.log.epochs.latest_epoch < 0:
                    # No epochs here: an empty log has nothing to truncate; else Kafka's fallback.
                    try:
                        await self._truncate(fp, fp.partition.high_watermark)
                    except LogstoreError as e:
                        self._on_error(fp, e.code, e.message)
                        continue
                    fp.needs_truncation = False
                else:
                    asks.append(fp)
            if not asks:
                return
            request = pb.OffsetsForLeaderEpochRequest(replica_id=self.node_id, partitions=[
                pb.OffsetForLeaderEpochPartition(
                    topic=fp.partition.topic, partition=fp.partition.partition,
                    current_leader_epoch=fp.leader_epoch, leader_epoch=fp.partition.log.epochs.latest_epoch)
                for fp in asks
            ])
            answer = await self.link.offsets_for_leader_epoch(request)
            by_key = {(r.topic, r.partition): r for r in answer.partitions}
            pending = []
            for fp in asks:
                result = by_key.get(fp.key)
                if not self._current(fp):
                    continue
                if result is None or result.error.code:
                    self._on_error(fp, result.error.code if result else "NO_ANSWER",
                                   result.error.message if result else "the leader did not answer")
                    continue
                try:
                    converged = await self._apply_epoch_answer(fp, result.leader_epoch, result.end_offset)
                except LogstoreError as e:  # became leader meanwhile, or the log went offline
                    self._on_error(fp, e.code, e.message)
                    continue
                if converged:
                    fp.needs_truncation = False
                else:
                    pending.append(fp)
        for fp in pending:
            log.warning("broker %d: %s-%d did not converge after %d epoch lookups; retrying later",
                        self.node_id, fp.key[0], fp.key[1], _MAX_TRUNCATION_ROUNDS)
            fp.park(self._clock())

    async def _apply_epoch_answer(self, fp: FollowedPartition, leader_epoch: int, end_offset: int) -> bool:
        """Truncate for the leader's answer ``(leader_epoch, end_offset)``; return whether converged."""
        part = fp.partition
        if end_offset == UNDEFINED_OFFSET:
            # The leader has no epoch at or below ours: Kafka's fallback, the HWM.
            await self._truncate(fp, part.high_watermark)
            return True
        my_epoch, my_end = part.end_offset_for_epoch(leader_epoch)
        if my_epoch == leader_epoch:
            await self._truncate(fp, min(end_offset, my_end))
            return True
        # Our floor of the leader's epoch is older: drop what follows it here, ask again.
        await self._truncate(fp, min(my_end, part.log.log_end_offset))
        return False

    async def _truncate(self, fp: FollowedPartition, offset: int) -> None:
        part = fp.partition
        if offset < part.log.log_end_offset:
            log.info("broker %d: truncating %s-%d from %d to %d (leader epoch %d)", self.node_id, part.topic,
                     part.partition, part.log.log_end_offset, offset, fp.leader_epoch)
            await self._run_io(part.truncate_to, max(offset, part.log.log_start_offset))

    async def fetch(self, partitions: list[FollowedPartition], *, max_wait_ms: int,
                    max_bytes: dict[tuple[str, int], int] | None = None) -> None:
        """One replica fetch of ``partitions`` (at most ``max_bytes[key]`` each, when given);
        append the answers."""
        request = pb.FetchRequest(
            replica_id=self.node_id, max_wait_ms=max_wait_ms, min_bytes=1, max_bytes=self._fetch_max_bytes,
            partitions=[pb.FetchPartition(topic=fp.partition.topic, partition=fp.partition.partition,
                                          fetch_offset=fp.partition.log.log_end_offset,
                                          partition_max_bytes=(max_bytes or {}).get(
                                              fp.key, self._partition_max_bytes),
                                          current_leader_epoch=fp.leader_epoch) for fp in partitions],
        )
        sent = {fp.key: (fp, p.fetch_offset) for fp, p in zip(partitions, request.partitions, strict=True)}
        answer = await self.link.fetch(request)
        for resp, records in answer:
            entry = sent.get((resp.topic, resp.partition))
            if entry is None or not self._current(entry[0]):
                continue  # no longer followed (new metadata came meanwhile)
            fp, fetch_offset = entry
            if resp.error.code:
                self._on_error(fp, resp.error.code, resp.error.message, leader_log_start=resp.log_start_offset,
                               fetch_offset=fetch_offset)
                continue
            part = fp.partition
            try:
                if len(records):
                    if part.log.log_end_offset != fetch_offset:
                        continue  # truncated meanwhile: the next round fetches from the new LEO
                    await self._run_io(part.append_replica, resp.schema, records)
            except LogstoreError as e:
                log.warning("broker %d: cannot append the leader's batches of %s-%d: %s", self.node_id,
                            part.topic, part.partition, e.message)
                fp.park(self._clock())
                continue
            fp.backoff_s = BACKOFF_MIN_S
            if fp.key in self._throttles:
                fp.tokens -= len(records)
            if part.update_high_watermark(min(resp.high_watermark, part.log.log_end_offset)):
                self._on_high_watermark(part.topic, part.partition)

    def _on_error(self, fp: FollowedPartition, code: str, message: str, *, leader_log_start: int = 0,
                  fetch_offset: int = 0) -> None:
        log.info("broker %d: %s-%d from leader %d: %s: %s", self.node_id, fp.key[0], fp.key[1], self.leader_id,
                 code, message)
        if code == "OFFSET_OUT_OF_RANGE" and fetch_offset >= leader_log_start:
            fp.needs_truncation = True  # above the leader's LEO: the logs diverged
        elif code == "OFFSET_OUT_OF_RANGE":
            fp.restart_at = leader_log_start  # behind the leader's log start: start over there
            return
        fp.park(self._clock())
