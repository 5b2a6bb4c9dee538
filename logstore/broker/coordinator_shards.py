"""Which coordinator keys this broker serves: the shards of an internal topic it leads.

Kafka's rule (DESIGN.md §4b): the coordinator of a key (a group id, a
transactional id) is the leader of partition ``crc32(key) % partitions`` of
the coordinator's internal topic (``__consumer_offsets``,
``__transaction_state``). That partition's log *is* the coordinator's state
for every key hashed to it — a *shard*. :class:`CoordinatorShards` tracks the
shards of one topic on this broker and drives a :class:`ShardedState` (the
group coordinator, the transaction coordinator):

* the broker tells it, on every new cluster view, which partitions of the
  topic it leads and at which leader epoch (:meth:`CoordinatorShards.update`);
* a partition led here at a new leader epoch is *loaded*: the state replays
  that partition's log on the I/O pool (:meth:`ShardedState.load_partition`);
  meanwhile its keys get ``COORDINATOR_LOAD_IN_PROGRESS``; a load that fails is
  tried again every :data:`RETRY_LOAD_S` while the partition is still led here;
* a partition the newest view says is led here, before the replica manager
  applied it, also answers ``COORDINATOR_LOAD_IN_PROGRESS`` (:meth:`CoordinatorShards.expect`);
* a partition no longer led here is *unloaded* (:meth:`ShardedState.unload_partition`,
  its keys forgotten); its keys get ``NOT_COORDINATOR``, as do the keys of
  every partition another broker leads;
* before the topic exists (its partition count unknown) every key gets
  ``COORDINATOR_NOT_AVAILABLE``.

:meth:`CoordinatorShards.check` is what the coordinator RPCs call first: it
raises one of those three errors, or returns the key's partition.

On a single broker (:meth:`CoordinatorShards.serve_everything`) the broker is
the coordinator of every key: the state was replayed at start-up as a whole
and :meth:`~CoordinatorShards.check` never refuses.

Loads and unloads of one partition run one at a time, in the order asked; a
partition unloaded while it was loading is unloaded again when the load ends,
so a stale load never leaves keys behind.

Thread-safety: :meth:`update` runs on the event loop; :meth:`check`,
:meth:`partition_for` and :meth:`loaded_epoch` only read dictionaries and may be
called from any thread.
"""

from __future__ import annotations

import asyncio
import logging
import time
import zlib
from collections.abc import Awaitable, Callable, Mapping
from typing import Any, Protocol

from logstore.errors import (
    CoordinatorLoadInProgressError,
    CoordinatorNotAvailableError,
    NotCoordinatorError,
)

__all__ = ["ShardedState", "CoordinatorShards", "RegisterCoordinator", "partition_for", "RETRY_LOAD_S"]

log = logging.getLogger("logstore.broker.coordinators")

RETRY_LOAD_S = 1.0


class ShardedState(Protocol):
    """A coordinator whose state is sharded over the partitions of ``topic``."""

    topic: str  # "__consumer_offsets" / "__transaction_state"

    def load_partition(self, partition: int, leader_epoch: int) -> None:
        """Replay ``partition``'s log into memory (blocking; runs on the I/O pool)."""

    def unload_partition(self, partition: int) -> None:
        """Forget every key of ``partition`` (this broker no longer coordinates them)."""


class RegisterCoordinator(Protocol):
    """How a coordinator asks the broker to serve its shards on a cluster: the broker creates
    ``shards.topic`` on first need with this shape and tells ``shards`` after every view which
    of its partitions it leads (:meth:`CoordinatorShards.update`)."""

    def __call__(self, shards: CoordinatorShards, *, partitions: int, replication_factor: int,
                 configs: Mapping[str, str]) -> None: ...


def partition_for(key: str, partitions: int) -> int:
    """The partition of the coordinator topic that holds ``key``'s state."""
    return zlib.crc32(key.encode()) % partitions


class CoordinatorShards:
    """The shards of ``state.topic`` this broker coordinates; see the module docstring.

    ``run_io(fn, *args)`` runs blocking work on the broker's I/O pool; ``node_id``
    names this broker in the errors; ``on_resign(partition)`` is called (on the loop) when
    this broker stops coordinating a partition, e.g. to answer the requests it holds.
    """

    def __init__(self, state: ShardedState, *, run_io: Callable[..., Awaitable[Any]],
                 node_id: int = 0, on_resign: Callable[[int], None] = lambda partition: None) -> None:
        self.state = state
        self.topic = state.topic
        self.node_id = node_id
        self._run_io = run_io
        self._on_resign = on_resign
        self.partitions: int | None = None
        self._everything = False
        self._loaded: dict[int, int] = {}  # partition -> leader epoch loaded at
        self._loading: dict[int, int] = {}  # partition -> leader epoch being loaded
        self._expected: set[int] = set()  # led in a view not applied yet
        self._locks: dict[int, asyncio.Lock] = {}
        self._tasks: set[asyncio.Task[None]] = set()
        self.load_times_ms: dict[int, float] = {}  # the last load of each partition (for logs and tests)

    # ------------------------------------------------------------------ queries

    def serve_everything(self, partitions: int) -> None:
        """Single broker: every key is coordinated here (the state was replayed at start-up)."""
        self._everything = True
        self.partitions = partitions

    def partition_for(self, key: str) -> int:
        """``crc32(key) % partitions``; COORDINATOR_NOT_AVAILABLE while the topic does not exist."""
        n = self.partitions
        if not n:
            raise CoordinatorNotAvailableError(
                f"the coordinator topic {self.topic} does not exist yet; find the coordinator again")
        return partition_for(key, n)

    def check(self, key: str) -> int:
        """The key's partition, if its state is loaded here; else raise NOT_COORDINATOR,
        COORDINATOR_LOAD_IN_PROGRESS or COORDINATOR_NOT_AVAILABLE (all retriable)."""
        if self._everything:
            return partition_for(key, self.partitions or 1)
        p = self.partition_for(key)
        if p in self._loaded:
            return p
        if p in self._loading or p in self._expected:
            raise CoordinatorLoadInProgressError(
                f"broker {self.node_id} is loading {self.topic}-{p}, the state of {key!r}; retry shortly")
        raise NotCoordinatorError(
            f"broker {self.node_id} is not the coordinator of {key!r} (it does not lead {self.topic}-{p}); "
            "find the coordinator again")

    def serves(self, key: str) -> bool:
        """Whether ``key``'s state is loaded here (:meth:`check` without the error)."""
        try:
            self.check(key)
        except (NotCoordinatorError, CoordinatorLoadInProgressError, CoordinatorNotAvailableError):
            return False
        return True

    def resigned(self, key: str) -> bool:
        """Whether this broker neither holds nor loads ``key``'s state (its partition is led
        elsewhere, or the topic is gone)."""
        if self._everything:
            return False
        n = self.partitions
        if not n:
            return True
        p = partition_for(key, n)
        return p not in self._loaded and p not in self._loading and p not in self._expected

    def loaded_epoch(self, partition: int) -> int | None:
        """The leader epoch ``partition`` was loaded at (None: not loaded here)."""
        return self._loaded.get(partition)

    def loaded_partitions(self) -> dict[int, int]:
        return dict(self._loaded)

    # ------------------------------------------------------------------ leadership

    def expect(self, partitions: int | None, led: set[int]) -> None:
        """A new view names this broker leader of ``led`` (not applied yet): their keys get
        COORDINATOR_LOAD_IN_PROGRESS, not NOT_COORDINATOR, until :meth:`update` comes."""
        if partitions is not None:
            self.partitions = partitions
        self._expected = {p for p in led if p not in self._loaded}

    def update(self, partitions: int | None, leaderships: Mapping[int, int]) -> None:
        """The topic's partition count (None: no such topic yet) and the partitions this broker
        leads, with their leader epochs: load what is new, unload what is gone."""
        self.partitions = partitions
        self._expected = set()
        wanted = {p: e for p, e in leaderships.items() if partitions is not None and p < partitions}
        for p, epoch in sorted(wanted.items()):
            if self._loaded.get(p) == epoch or self._loading.get(p) == epoch:
                continue
            self._loaded.pop(p, None)
            self._loading[p] = epoch
            self._spawn(self._load(p, epoch))
        for p in sorted((set(self._loaded) | set(self._loading)) - set(wanted)):
            self._loaded.pop(p, None)
            self._loading.pop(p, None)
            log.info("broker %d: no longer the coordinator of %s-%d; unloading it", self.node_id, self.topic, p,
                     extra={"event": "coordinator_unloaded", "topic": self.topic, "partition": p})
            self._spawn(self._unload(p))
            self._on_resign(p)

    def _spawn(self, coro: Awaitable[None]) -> None:
        task: asyncio.Task[None] = asyncio.ensure_future(coro)
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)

    def _lock(self, p: int) -> asyncio.Lock:
        lock = self._locks.get(p)
        if lock is None:
            lock = self._locks[p] = asyncio.Lock()
        return lock

    async def _load(self, p: int, epoch: int) -> None:
        while True:
            async with self._lock(p):
                if self._loading.get(p) != epoch:
                    return  # superseded (a newer epoch, or no longer led here) before it started
                started = time.monotonic()
                try:
                    await self._run_io(self.state.load_partition, p, epoch)
                except Exception:
                    log.exception("broker %d: loading %s-%d at leader epoch %d failed; retrying in %.0f s",
                                  self.node_id, self.topic, p, epoch, RETRY_LOAD_S)
                else:
                    if self._loading.get(p) == epoch:
                        del self._loading[p]
                        self._loaded[p] = epoch
                        took_ms = (time.monotonic() - started) * 1000
                        self.load_times_ms[p] = took_ms
                        log.info("broker %d: coordinator of %s-%d at leader epoch %d (loaded in %.0f ms)",
                                 self.node_id, self.topic, p, epoch, took_ms,
                                 extra={"event": "coordinator_loaded", "topic": self.topic, "partition": p,
                                        "leader_epoch": epoch, "took_ms": round(took_ms)})
                    elif p not in self._loading:  # resigned while loading: forget what was loaded
                        await self._run_io(self.state.unload_partition, p)
                    return
            await asyncio.sleep(RETRY_LOAD_S)

    async def _unload(self, p: int) -> None:
        async with self._lock(p):
            if p in self._loading or p in self._loaded:
                return  # led here again meanwhile: the new load replays from scratch
            try:
                await self._run_io(self.state.unload_partition, p)
            except Exception:
                log.exception("broker %d: unloading %s-%d failed", self.node_id, self.topic, p)

    async def close(self) -> None:
        for task in list(self._tasks):
            task.cancel()
        await asyncio.gather(*self._tasks, return_exceptions=True)
