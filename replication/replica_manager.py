"""What a broker in a cluster does with its replicas: lead, follow, serve followers.

The broker hands every new :class:`~replication.state.ClusterView` to
:meth:`ReplicaManager.apply`, which reconciles this broker's replicas with it:

* partitions of the view's topics with a replica here are created or opened
  as local *replicated* partitions (the coordinator topics ``__consumer_offsets``
  and ``__transaction_state`` too, once the broker created them in etcd; other
  internal ``__*`` topics are local to each broker and never in the view) (:meth:`~logstore.storage.log_manager.LogManager.ensure_partition`);
  replicas no longer hosted here are stopped and deleted, and so are the local
  copies of deleted topics;
* where the view names this broker leader at a new leader epoch, the partition
  becomes leader (:meth:`~logstore.storage.partition.Partition.become_leader`)
  and gets a :class:`~replication.leader.LeaderState` (HWM, ISR, acks=all);
* where another broker leads, the partition becomes a follower and is handed
  to the :class:`~replication.follower.LeaderFetcher` of that broker (one per
  leader broker), which truncates it by leader epoch and then fetches.

The broker calls the serving side: :meth:`ReplicaManager.leader_partition`
(Produce / consumer Fetch: the leader and epoch checks of KIP-320),
:meth:`~ReplicaManager.check_enough_replicas` and
:meth:`~ReplicaManager.wait_replicated` (acks=all),
:meth:`~ReplicaManager.replica_partition` (a follower's Fetch, the request with
``replica_id`` set, is served by the broker's data plane, the same path as a
consumer's: :mod:`logstore.broker.data_plane.fetch`; this records the follower's
progress), :meth:`~ReplicaManager.end_offsets_for_epochs`
(OffsetsForLeaderEpoch) and :meth:`~ReplicaManager.shrink_isr_if_lagging`
(every ~``replica_lag_time_max_ms / 4``; lag counts only while this broker runs).

Leader epoch checks (Kafka's ``checkCurrentLeaderEpoch``): a request's
``current_leader_epoch`` below this replica's gets ``FENCED_LEADER_EPOCH``,
above it ``UNKNOWN_LEADER_EPOCH`` (this broker has not seen the new view yet),
-1 skips the check; then a replica that does not lead answers
``NOT_LEADER_OR_FOLLOWER`` (``LEADER_NOT_AVAILABLE`` when nobody leads).

The ISR changes only through ``alter_isr`` — the caller's compare-and-swap in
the metadata store (Kafka's AlterPartition): ``None`` means the swap lost (a
newer state exists; a deposed leader's write fails that way) and the leader
waits for the next view.

Thread-safety: event loop only, except the append listener that leader
partitions call from I/O threads, which hops onto the loop.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from typing import Any

import pyarrow as pa

from logstore._proto import logstore_pb2 as pb
from logstore.errors import (
    FencedLeaderEpochError,
    LeaderNotAvailableError,
    LogstoreError,
    NotEnoughReplicasError,
    NotLeaderError,
    OffsetNotAvailableError,
    UnknownLeaderEpochError,
    UnknownTopicOrPartitionError,
)
from logstore.storage.log_manager import LogManager
from logstore.storage.partition import Partition
from replication.follower import LeaderFetcher
from replication.leader import LeaderState
from replication.links import LeaderLink
from replication.state import (
    NO_LEADER,
    BrokerRegistration,
    ClusterView,
    PartitionState,
    TopicRecord,
)

__all__ = ["ReplicaManager", "INTERNAL_TOPIC_PREFIX"]

log = logging.getLogger("logstore.replication.replica_manager")

INTERNAL_TOPIC_PREFIX = "__"
_MAX_WAIT_MS_CAP = 30_000
Key = tuple[str, int]


@dataclass(slots=True)
class _Replica:
    """A local replica and its role: ``leader`` while leading, ``fetcher_id`` (the leader
    broker) while following one; ``state`` the newest partition state applied."""

    partition: Partition
    state: PartitionState
    leader: LeaderState | None = None
    fetcher_id: int | None = None


class ReplicaManager:
    """This broker's replicas in a cluster; see the module docstring.

    ``run_io(fn, *args)`` runs disk work off the event loop; ``link_for`` opens a
    link to a leader broker; ``on_high_watermark(topic, partition)`` is called on
    the loop when a HWM moves, ``wake_fetches(topic, partition)`` after a leader's
    append and a role change (both wake the long polls waiting on the partition,
    :class:`~logstore.broker.data_plane.waiters.PartitionWaiters`). ``start_fetchers=False``
    runs no fetcher task: tests drive :meth:`replicate_once` step by step.
    """

    def __init__(self, node_id: int, manager: LogManager, *, run_io: Callable[..., Awaitable[Any]],
                 link_for: Callable[[BrokerRegistration], LeaderLink],
                 alter_isr: Callable[[PartitionState, tuple[int, ...]], Awaitable[PartitionState | None]],
                 on_high_watermark: Callable[[str, int], None],
                 wake_fetches: Callable[[str, int], None],
                 replica_lag_time_max_ms: int, replica_fetch_wait_max_ms: int,
                 clock: Callable[[], float] = time.monotonic, start_fetchers: bool = True) -> None:
        self.node_id = node_id
        self.manager = manager
        self._run_io = run_io
        self._link_for = link_for
        self._alter_isr = alter_isr
        self._on_high_watermark = on_high_watermark
        self._wake_fetches = wake_fetches
        self.replica_lag_time_max_ms = replica_lag_time_max_ms
        self.replica_fetch_wait_max_ms = replica_fetch_wait_max_ms
        self._clock = clock
        self._start_fetchers = start_fetchers
        self._replicas: dict[Key, _Replica] = {}
        self._fetchers: dict[int, tuple[str, LeaderFetcher]] = {}
        self._view: ClusterView | None = None
        self._topic_records: dict[str, TopicRecord] = {}  # as last recorded locally
        self._loop: asyncio.AbstractEventLoop | None = None
        self._apply_lock = asyncio.Lock()
        self._closed = False
        self._last_isr_check_ms: float | None = None

    def _now_ms(self) -> float:
        return self._clock() * 1000

    # ------------------------------------------------------------------ reconcile

    async def apply(self, view: ClusterView) -> None:
        """Make this broker's replicas what ``view`` says (see the module docstring)."""
        async with self._apply_lock:
            if self._closed:
                return
            self._loop = asyncio.get_running_loop()
            if self._view is not None and view.revision < self._view.revision:
                return  # an older view than one applied already
            self._view = view
            hosted = {key: s for key, s in view.partitions.items()
                      if self.node_id in s.replicas and key[0] in view.topics}
            for key in [k for k in self._replicas if k not in hosted]:
                await self._drop(key, delete=True)
            for info in self.manager.topics():
                if info.replicated and info.name not in view.topics:
                    log.info("broker %d: deleting the local replicas of deleted topic %s", self.node_id, info.name)
                    self._topic_records.pop(info.name, None)
                    await self._run_io(self.manager.delete_topic, info.name)
            broken: set[str] = set()
            for topic in sorted({key[0] for key in hosted}):
                try:
                    await self._ensure_topic(view, topic)
                except Exception as e:  # noqa: BLE001 - one bad topic must not stop the others
                    broken.add(topic)
                    log.error("broker %d: cannot record topic %s locally: %s", self.node_id, topic, e)
            for key, state in sorted(hosted.items()):
                if key[0] in broken:
                    continue
                try:
                    part = self._local(key) or await self._run_io(self.manager.ensure_partition, *key)
                    rep = self._replicas.get(key)
                    if rep is not None and rep.partition is not part:
                        await self._drop(key, delete=False)  # the topic was re-created
                        rep = None
                    if state.leader == self.node_id:
                        await self._lead(key, part, state, rep)
                    else:
                        await self._follow(key, part, state, rep, view)
                except Exception as e:  # noqa: BLE001 - one bad replica must not stop the others
                    log.error("broker %d: cannot take up %s-%d: %s", self.node_id, key[0], key[1],
                              getattr(e, "message", None) or f"{type(e).__name__}: {e}")
            for leader_id, (_, fetcher) in list(self._fetchers.items()):
                if not fetcher.partitions:
                    del self._fetchers[leader_id]
                    await fetcher.close()

    def _local(self, key: Key) -> Partition | None:
        """The local replica the manager holds already (no I/O), or None."""
        try:
            return self.manager.partition(*key)
        except LogstoreError:
            return None

    async def _ensure_topic(self, view: ClusterView, topic: str) -> None:
        record = view.topics[topic]
        if self._topic_records.get(topic) == record:
            return  # applied already: nothing to write
        value_schema = pa.ipc.read_schema(pa.py_buffer(record.value_schema)) if record.value_schema else None
        local = next((t for t in self.manager.topics() if t.name == topic), None)
        if local is not None and local.topic_id != record.topic_id:
            for key in [k for k in self._replicas if k[0] == topic]:
                await self._drop(key, delete=False)
        await self._run_io(lambda: self.manager.ensure_replicated_topic(
            topic, topic_id=record.topic_id, partitions=record.partitions, configs=record.configs,
            value_schema=value_schema, replication_factor=record.replication_factor))
        self._topic_records[topic] = record

    async def _lead(self, key: Key, part: Partition, state: PartitionState, rep: _Replica | None) -> None:
        min_isr = self.manager.topic(key[0]).config.min_insync_replicas
        if rep is not None and rep.leader is not None and rep.leader.leader_epoch == state.leader_epoch:
            rep.state = state
            rep.leader.min_insync_replicas = min_isr
            if rep.leader.set_state(state):
                self._hwm_moved(key)
            return
        self._stop_following(key, rep)
        await self._run_io(part.become_leader, state.leader_epoch)
        leader = LeaderState(part, state, node_id=self.node_id, min_insync_replicas=min_isr,
                             replica_lag_time_max_ms=self.replica_lag_time_max_ms, now_ms=self._now_ms())
        if rep is not None and rep.leader is not None:
            leader.take_waiters(rep.leader)  # re-elected at a newer epoch: pending acks carry on
        part.on_append = self._append_listener
        self._replicas[key] = _Replica(part, state, leader)
        log.info("broker %d: leading %s-%d at leader epoch %d, ISR %s, LEO %d", self.node_id, key[0], key[1],
                 state.leader_epoch, list(state.isr), part.log.log_end_offset,
                 extra={"event": "became_leader", "topic": key[0], "partition": key[1], "broker": self.node_id,
                        "leader_epoch": state.leader_epoch, "isr": list(state.isr),
                        "log_end_offset": part.log.log_end_offset})
        if leader.update_high_watermark():
            self._hwm_moved(key)
        self._wake_fetches(*key)

    async def _follow(self, key: Key, part: Partition, state: PartitionState, rep: _Replica | None,
                      view: ClusterView) -> None:
        broker = view.brokers.get(state.leader)
        if (rep is not None and rep.leader is None and rep.state.leader == state.leader
                and rep.state.leader_epoch == state.leader_epoch
                and (rep.fetcher_id is not None or broker is None)):
            rep.state = state
            self._set_throttle(key, rep, state)
            return
        if rep is not None and rep.leader is not None:
            rep.leader.stop()
            part.on_append = None
        self._stop_following(key, rep)
        await self._run_io(part.become_follower, state.leader_epoch)
        rep = self._replicas[key] = _Replica(part, state)
        if broker is not None:
            self._fetcher(broker).add(part, state.leader_epoch)
            rep.fetcher_id = broker.node_id
            self._set_throttle(key, rep, state)
            log.info("broker %d: following %s-%d from broker %d at leader epoch %d (LEO %d)", self.node_id,
                     key[0], key[1], broker.node_id, state.leader_epoch, part.log.log_end_offset,
                     extra={"event": "became_follower", "topic": key[0], "partition": key[1],
                            "broker": self.node_id, "leader": broker.node_id, "leader_epoch": state.leader_epoch,
                            "log_end_offset": part.log.log_end_offset})
        self._wake_fetches(*key)

    def _set_throttle(self, key: Key, rep: _Replica, state: PartitionState) -> None:
        """A replica this broker is adding by reassignment copies at the move's throttle."""
        known = self._fetchers.get(rep.fetcher_id) if rep.fetcher_id is not None else None
        if known is not None:
            known[1].set_throttle(key, state.throttle if self.node_id in state.adding else 0)

    def _fetcher(self, broker: BrokerRegistration) -> LeaderFetcher:
        known = self._fetchers.get(broker.node_id)
        if known is not None and known[0] == broker.address:
            return known[1]
        fetcher = LeaderFetcher(self.node_id, broker.node_id, self._link_for(broker), run_io=self._run_io,
                                on_high_watermark=self._on_high_watermark,
                                fetch_wait_max_ms=self.replica_fetch_wait_max_ms, clock=self._clock)
        if known is not None:  # the leader broker moved: same partitions, new link
            for fp in known[1].partitions.values():
                fetcher.add(fp.partition, fp.leader_epoch)
            old = known[1]
            asyncio.get_running_loop().create_task(old.close())
        self._fetchers[broker.node_id] = (broker.address, fetcher)
        if self._start_fetchers:
            fetcher.start()
        return fetcher

    def _stop_following(self, key: Key, rep: _Replica | None) -> None:
        if rep is not None and rep.fetcher_id is not None:
            known = self._fetchers.get(rep.fetcher_id)
            if known is not None:
                known[1].remove(key)
            rep.fetcher_id = None

    async def _drop(self, key: Key, *, delete: bool) -> None:
        rep = self._replicas.pop(key, None)
        if rep is not None:
            if rep.leader is not None:
                rep.leader.stop()
                rep.partition.on_append = None
            self._stop_following(key, rep)
            self._wake_fetches(*key)
        if delete:
            log.info("broker %d: removing its replica of %s-%d (no longer hosted here)", self.node_id, *key)
            await self._run_io(self.manager.remove_partition, *key)

    # ------------------------------------------------------------------ leader appends

    def _append_listener(self, part: Partition) -> None:
        """Called by a leader partition after an append, on any thread."""
        loop = self._loop
        if loop is not None and not loop.is_closed():
            loop.call_soon_threadsafe(self._leader_appended, part)

    def _leader_appended(self, part: Partition) -> None:
        key = (part.topic, part.partition)
        rep = self._replicas.get(key)
        if rep is None or rep.leader is None or rep.partition is not part:
            return
        if rep.leader.update_high_watermark():
            self._hwm_moved(key)
        self._wake_fetches(*key)

    def _hwm_moved(self, key: Key) -> None:
        try:
            self._on_high_watermark(*key)
        except Exception:
            log.exception("on_high_watermark failed for %s-%d", *key)

    # ------------------------------------------------------------------ serving the broker

    def _replica_for(self, topic: str, partition: int, current_leader_epoch: int) -> _Replica:
        """The local replica, after the epoch check; raises as the module docstring says."""
        rep = self._replicas.get((topic, partition))
        if rep is None:
            view = self._view
            state = view.partitions.get((topic, partition)) if view is not None else None
            if view is None or state is None or topic not in view.topics:
                raise UnknownTopicOrPartitionError(f"topic {topic!r} partition {partition} is not known to the cluster")
            if state.leader == NO_LEADER:
                raise LeaderNotAvailableError(f"{topic}-{partition} has no leader (no in-sync replica is alive)")
            raise NotLeaderError(f"broker {self.node_id} holds no replica of {topic}-{partition}; broker "
                                 f"{state.leader} leads it at epoch {state.leader_epoch}")
        epoch = rep.state.leader_epoch
        if 0 <= current_leader_epoch < epoch:
            raise FencedLeaderEpochError(
                f"{topic}-{partition}: leader epoch {current_leader_epoch} is stale, the current one is "
                f"{epoch}; refresh metadata")
        if current_leader_epoch > epoch:
            raise UnknownLeaderEpochError(
                f"{topic}-{partition}: leader epoch {current_leader_epoch} is newer than broker "
                f"{self.node_id}'s ({epoch}); it has not seen the new metadata yet, retry")
        return rep

    def _leader_replica(self, topic: str, partition: int, current_leader_epoch: int) -> tuple[_Replica, LeaderState]:
        rep = self._replica_for(topic, partition, current_leader_epoch)
        if rep.leader is None:
            if rep.state.leader == NO_LEADER:
                raise LeaderNotAvailableError(f"{topic}-{partition} has no leader (no in-sync replica is alive)")
            raise NotLeaderError(f"broker {self.node_id} is not the leader of {topic}-{partition}: broker "
                                 f"{rep.state.leader} is, at leader epoch {rep.state.leader_epoch}")
        return rep, rep.leader

    def leader_partition(self, topic: str, partition: int, current_leader_epoch: int = -1) -> Partition:
        """The partition, if this broker leads it (at ``current_leader_epoch``, unless -1)."""
        return self._leader_replica(topic, partition, current_leader_epoch)[0].partition

    def check_end_known(self, topic: str, partition: int) -> None:
        """Where the log ends for readers, asked of a new leader: refuse (retriable
        OFFSET_NOT_AVAILABLE) while its high-water mark is below the offset its leadership
        began at. Until its followers' fetches raise it, that HWM is the one it heard as a
        follower, older than what the previous leader may have told readers (KIP-207: listed
        end offsets never go backwards across a leader change)."""
        rep, leader = self._leader_replica(topic, partition, -1)
        if rep.partition.high_watermark < leader.epoch_start_offset:
            raise OffsetNotAvailableError(
                f"{topic}-{partition}: broker {self.node_id} became leader at offset "
                f"{leader.epoch_start_offset} and its high-water mark ({rep.partition.high_watermark}) "
                "has not reached it yet; retry")

    def leader_epochs(self, topic: str) -> dict[int, int]:
        """The partitions of ``topic`` this broker leads, with their leader epochs (the
        coordinators' leadership hook: :mod:`logstore.broker.coordinator_shards`)."""
        return {p: rep.state.leader_epoch for (t, p), rep in self._replicas.items()
                if t == topic and rep.leader is not None}

    def check_enough_replicas(self, topic: str, partition: int) -> None:
        """acks=all, before the append: refuse with NOT_ENOUGH_REPLICAS when the ISR is
        smaller than ``min.insync.replicas``."""
        _, leader = self._leader_replica(topic, partition, -1)
        if len(leader.isr) < leader.min_insync_replicas:
            raise NotEnoughReplicasError(
                f"{topic}-{partition} has {len(leader.isr)} in-sync replicas {list(leader.isr)}, fewer than "
                f"min.insync.replicas={leader.min_insync_replicas}; nothing was appended")

    async def wait_replicated(self, topic: str, partition: int, end_offset: int, timeout_s: float) -> None:
        """acks=all, after the append: wait until the ISR has everything below ``end_offset``."""
        _, leader = self._leader_replica(topic, partition, -1)
        await leader.wait_for(end_offset, timeout_s)

    def end_offsets_for_epochs(self, request: pb.OffsetsForLeaderEpochRequest) -> pb.OffsetsForLeaderEpochResponse:
        """OffsetsForLeaderEpoch, answered by the leader (KIP-101)."""
        out = []
        for p in request.partitions:
            result = pb.OffsetForLeaderEpochResult(topic=p.topic, partition=p.partition, leader_epoch=-1, end_offset=-1)
            try:
                rep, _ = self._leader_replica(p.topic, p.partition, p.current_leader_epoch)
                result.leader_epoch, result.end_offset = rep.partition.end_offset_for_epoch(p.leader_epoch)
            except LogstoreError as e:
                result.error.code, result.error.message = e.code, e.message
            out.append(result)
        return pb.OffsetsForLeaderEpochResponse(partitions=out)

    async def replica_partition(self, follower: int, topic: str, partition: int, fetch_offset: int,
                                current_leader_epoch: int, *, record: bool) -> Partition:
        """The partition a follower's fetch reads: this broker leads it and ``follower`` is one of
        its replicas (NOT_LEADER_OR_FOLLOWER, FENCED_LEADER_EPOCH, ... otherwise). With ``record``
        (a fetch's first round) ``fetch_offset`` is the follower's log end offset: the HWM may
        move and the follower may rejoin the ISR."""
        rep, leader = self._leader_replica(topic, partition, current_leader_epoch)
        part = rep.partition
        if follower not in rep.state.replicas:
            raise NotLeaderError(f"broker {follower} is not a replica of {topic}-{partition}")
        if record and fetch_offset <= part.log.log_end_offset:
            if leader.on_follower_fetch(follower, fetch_offset, self._now_ms()):
                self._hwm_moved((topic, partition))
            # A broker in a controlled shutdown stays out: the controller removed it
            # from the ISR, and adding it back would only undo that, view after view.
            shutting_down = self._view is not None and follower in self._view.shutting_down
            if not leader.alter_pending and not shutting_down and leader.expand_candidate(follower, self._now_ms()):
                await self._alter(rep, tuple(r for r in rep.state.replicas if r in rep.state.isr or r == follower))
        return part

    async def _alter(self, rep: _Replica, isr: tuple[int, ...]) -> None:
        """Change the ISR through the metadata store's compare-and-swap; take the result."""
        leader = rep.leader
        if leader is None or isr == leader.isr:
            return
        key = (leader.state.topic, leader.state.partition)
        leader.alter_pending = True
        try:
            result = await self._alter_isr(leader.state, isr)
        except Exception as e:  # noqa: BLE001 - the metadata store is down: retried later
            log.warning("broker %d: changing the ISR of %s-%d to %s failed: %s", self.node_id, *key, list(isr), e)
            result = None
        finally:
            leader.alter_pending = False
        if result is None:
            log.info("broker %d: the ISR change of %s-%d to %s lost its compare-and-swap; waiting for "
                     "new metadata", self.node_id, *key, list(isr))
            return
        if self._replicas.get(key) is rep and rep.leader is leader:
            log.info("broker %d: ISR of %s-%d is now %s", self.node_id, *key, list(result.isr),
                     extra={"event": "isr_changed", "topic": key[0], "partition": key[1], "isr": list(result.isr),
                            "previous_isr": list(leader.isr), "leader": self.node_id,
                            "leader_epoch": result.leader_epoch, "decided_by": "leader"})
            rep.state = result
            if leader.set_state(result):
                self._hwm_moved(key)

    async def shrink_isr_if_lagging(self) -> None:
        """Drop from the ISRs this broker leads the followers behind for more than
        ``replica_lag_time_max_ms`` (the broker calls it every ~quarter of that).

        Lag counts only while this broker runs: a check later than half that window after
        the previous one means the broker itself stood still (SIGSTOP, a VM or GC pause, a
        starved event loop), when its followers could not fetch either; the time beyond half
        the window is excused (:meth:`LeaderState.excuse`). Otherwise a leader waking from a
        pause would shrink its ISR to itself in its first check, and a SIGKILL right after
        would leave the partition with no leader to elect."""
        now = self._now_ms()
        stalled_ms = 0.0 if self._last_isr_check_ms is None else (
            now - self._last_isr_check_ms - self.replica_lag_time_max_ms / 2)
        self._last_isr_check_ms = now
        for rep in list(self._replicas.values()):
            leader = rep.leader
            if leader is not None and stalled_ms > 0:
                leader.excuse(stalled_ms)
            if leader is None or leader.alter_pending:
                continue
            lagging = leader.shrink_candidates(now)
            if lagging:
                log.info("broker %d: followers %s of %s-%d are more than %d ms behind", self.node_id, lagging,
                         rep.state.topic, rep.state.partition, self.replica_lag_time_max_ms)
                await self._alter(rep, tuple(r for r in leader.isr if r not in lagging))

    # ------------------------------------------------------------------ tests, describe, close

    async def replicate_once(self, *, max_wait_ms: int = 0) -> None:
        """One round of every fetcher (truncate, fetch), in order; for step-by-step tests."""
        for _, fetcher in list(self._fetchers.values()):
            await fetcher.run_once(max_wait_ms=max_wait_ms)

    def describe(self) -> list[dict[str, Any]]:
        """Per local replica: role, leader epoch, LEO, HWM, ISR and, on a leader, each follower's lag."""
        now = self._now_ms()
        out = []
        for (topic, p), rep in sorted(self._replicas.items()):
            part = rep.partition
            row: dict[str, Any] = {
                "topic": topic, "partition": p, "role": "leader" if rep.leader else "follower",
                "leader": rep.state.leader, "leader_epoch": rep.state.leader_epoch, "isr": list(rep.state.isr),
                "log_end_offset": part.log.log_end_offset, "high_watermark": part.high_watermark,
            }
            if rep.leader is not None:
                leo = part.log.log_end_offset
                row["followers"] = {
                    r: {"log_end_offset": f.leo, "lag_records": leo - f.leo if f.leo >= 0 else None,
                        "caught_up_ms_ago": round(now - f.last_caught_up_ms)}
                    for r, f in rep.leader.followers.items()
                }
            out.append(row)
        return out

    async def close(self) -> None:
        """Stop fetching and leading (pending acks=all produces fail with NOT_LEADER_OR_FOLLOWER)."""
        async with self._apply_lock:
            self._closed = True
            for rep in self._replicas.values():
                if rep.leader is not None:
                    rep.leader.stop()
                    rep.partition.on_append = None
            for key in self._replicas:
                self._wake_fetches(*key)
            fetchers = [f for _, f in self._fetchers.values()]
            self._fetchers.clear()
            self._replicas.clear()
        for fetcher in fetchers:
            await fetcher.close()
