"""The consumer groups of the broker: a thin adapter over :mod:`logstore.broker.groups.coordinator`.

:class:`ConsumerGroups` is a part the broker composes (:class:`logstore.broker.service.Broker`
builds it with its collaborators as constructor arguments and registers its RPCs). It owns the
:class:`~logstore.broker.groups.coordinator.GroupCoordinator`, translates protobuf to
its values and back, and does the asynchronous parts the coordinator leaves
to its caller:

* heartbeats are handled on the event loop, in memory (the coordinator takes
  only its lock, never a disk): a member that is in sync is answered when its
  assignment changes or after ``max_wait_ms`` (at most the heartbeat interval),
  whichever comes first — a long poll, so a rebalance reaches every member
  within a round trip instead of a heartbeat interval;
* a timer task (every :data:`TICK_S`) evicts expired members and wakes the
  held heartbeats of the members a change affects;
* commits and deletions run on the I/O pool (they fsync); group metadata is
  written behind, on the I/O pool, by one flush at a time.

Committed offsets and group metadata are records of the internal compacted
topic ``__consumer_offsets`` (:class:`TopicGroupLog`), created on first use
with ``offsets_topic_num_partitions`` partitions; a group's records all go to
partition ``crc32(group id) % partitions``. A transaction's offsets are a
transactional batch there, pending until the transaction's marker lands on that
partition: the marker writer (:class:`~logstore.broker.txn_markers.MarkerRpcs`)
calls :meth:`ConsumerGroups.marker_written`, which applies or drops them.

Which groups this broker coordinates (:class:`~logstore.broker.coordinator_shards.CoordinatorShards`,
:attr:`ConsumerGroups.shards`): on a single broker, every group (the whole log is
replayed at start-up); on a cluster, ``__consumer_offsets`` is a replicated
cluster topic and the broker coordinates the groups of the partitions it leads,
loaded when it becomes their leader (:class:`GroupShardState`). Every group RPC
first checks that here is the group's coordinator (NOT_COORDINATOR,
COORDINATOR_LOAD_IN_PROGRESS, COORDINATOR_NOT_AVAILABLE otherwise: the client
finds the coordinator again and retries); ListGroups lists the groups
coordinated here (a cluster's client asks every broker).

Thread-safety: handlers and the timer run on the event loop; the coordinator has its own locks.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import zlib
from collections import defaultdict
from collections.abc import Awaitable, Callable, Iterable, Iterator, Mapping, Sequence
from typing import TYPE_CHECKING, Any

import grpc

from logstore._proto import logstore_pb2 as pb
from logstore.broker.coordinator_shards import CoordinatorShards, RegisterCoordinator
from logstore.broker.groups.coordinator import GroupCoordinator
from logstore.broker.groups.model import (
    GroupConfig,
    GroupSnapshot,
    Heartbeat,
    HeartbeatOutcome,
    MemberAssignment,
    MemberKey,
)
from logstore.broker.groups.records import (
    GroupLog,
    GroupLogEntry,
    GroupRecord,
    ReplicaPosition,
    TxnMarker,
    TxnRecord,
)
from logstore.broker.internal_log import (
    InternalEntry,
    InternalRecord,
    InternalReplication,
    InternalTopicLog,
    TransactionHold,
)
from logstore.broker.rpc_errors import error_to_pb
from logstore.errors import InvalidConfigError, LogstoreError
from logstore.storage.log_manager import LogManager
from logstore.types import TopicPartition

if TYPE_CHECKING:
    from logstore.broker.config import BrokerConfig
    from logstore.broker.membership import ClusterMembership
    from logstore.broker.rpc_gate import RpcGate

__all__ = ["ConsumerGroups", "GroupShardState", "TopicGroupLog", "OFFSETS_TOPIC", "TICK_S"]

log = logging.getLogger("logstore.broker")

OFFSETS_TOPIC = "__consumer_offsets"
TICK_S = 0.1


def tps_to_pb(tps: Iterable[TopicPartition]) -> list[pb.TopicPartitions]:
    by_topic: dict[str, list[int]] = defaultdict(list)
    for tp in tps:
        by_topic[tp.topic].append(tp.partition)
    return [pb.TopicPartitions(topic=t, partitions=sorted(ps)) for t, ps in sorted(by_topic.items())]


def tps_from_pb(items: Iterable[pb.TopicPartitions]) -> frozenset[TopicPartition]:
    return frozenset(TopicPartition(i.topic, p) for i in items for p in i.partitions)


def _peer_host(peer: str) -> str:
    """``ipv4:127.0.0.1:5000`` / ``ipv6:[::1]:5000`` → the address without the port."""
    _, _, rest = peer.partition(":")
    host = rest.rsplit(":", 1)[0] if ":" in rest else rest
    return host.strip("[]")


class TopicGroupLog(GroupLog):
    """Group records as records of ``__consumer_offsets`` (key and JSON value; a null value is a
    tombstone), kept by :class:`~logstore.broker.internal_log.InternalTopicLog`.

    Thread-safety: appends go through the partition logs, which have their own locks.
    """

    def __init__(self, manager: LogManager, *, partitions: int) -> None:
        self.internal = InternalTopicLog(manager, OFFSETS_TOPIC, partitions=partitions,
                                         configs=OFFSETS_TOPIC_CONFIGS)

    def append(self, records: Sequence[GroupRecord], *, fsync: bool) -> None:
        self.internal.append([InternalRecord(r.group_id, r.key, r.value) for r in records], fsync=fsync)

    def append_pending(self, records: Sequence[GroupRecord], *, fsync: bool) -> tuple[ReplicaPosition, ...]:
        return self.internal.append_pending([InternalRecord(r.group_id, r.key, r.value) for r in records],
                                            fsync=fsync)

    def wait_durable(self, positions: Sequence[ReplicaPosition]) -> None:
        self.internal.wait_replicated(positions)

    def hold_transaction(self, group_id: str, producer_id: int) -> TransactionHold:
        return self.internal.hold_transaction(group_id, producer_id)

    def release_transaction(self, hold: object) -> None:
        if isinstance(hold, TransactionHold):
            self.internal.release_transaction(hold)

    def append_transactional(self, records: Sequence[GroupRecord], *, producer_id: int, producer_epoch: int,
                             hold: object = None) -> tuple[ReplicaPosition, ...]:
        return self.internal.append_transactional(
            [InternalRecord(r.group_id, r.key, r.value) for r in records], producer_id=producer_id,
            producer_epoch=producer_epoch, hold=hold if isinstance(hold, TransactionHold) else None)

    def read_all(self) -> Iterator[GroupLogEntry]:
        for partition, entry in self.internal.read_all_entries():
            yield _group_log_entry(partition, entry)

    def read_partition(self, partition: int) -> Iterator[GroupLogEntry]:
        for entry in self.internal.read_partition_entries(partition):
            yield _group_log_entry(partition, entry)


def _group_log_entry(partition: int, entry: InternalEntry) -> GroupLogEntry:
    if entry.marker is not None:
        return TxnMarker(entry.producer_id, entry.marker, partition)
    assert entry.key is not None  # records of the group log always have a key
    if entry.producer_id >= 0:
        return TxnRecord(entry.key, entry.value, entry.producer_id, partition)
    return entry.key, entry.value


OFFSETS_TOPIC_CONFIGS = {"cleanup.policy": "compact"}


class GroupShardState:
    """The group coordinator as a :class:`~logstore.broker.coordinator_shards.ShardedState`:
    a partition of ``__consumer_offsets`` loads and unloads the groups hashed to it."""

    topic = OFFSETS_TOPIC

    def __init__(self, groups: GroupCoordinator, group_log: TopicGroupLog,
                 partition_count: Callable[[], int]) -> None:
        self._groups = groups
        self._log = group_log
        self._partition_count = partition_count

    def owned_by(self, partition: int) -> Callable[[str], bool]:
        """Which group ids ``partition`` of the log holds."""
        n = self._partition_count()
        return lambda group_id: zlib.crc32(group_id.encode()) % n == partition

    def load_partition(self, partition: int, leader_epoch: int) -> None:
        count = self._groups.load_groups(self._log.read_partition(partition), owns=self.owned_by(partition))
        log.info("loaded %d consumer groups from %s-%d (leader epoch %d)", count, OFFSETS_TOPIC, partition,
                 leader_epoch)

    def unload_partition(self, partition: int) -> None:
        self._groups.unload_groups(self.owned_by(partition))


class ConsumerGroups:
    """The consumer groups of the broker: the group coordinator, its log and shards, its timer
    and the group RPCs; see the module docstring.

    Collaborators: the broker's ``config`` and log ``manager`` (``__consumer_offsets`` is one of
    its topics); ``cluster``, where topics and partitions are (a subscription's partition counts,
    a commit's partitions); ``register_coordinator``, which serves the shards of
    ``__consumer_offsets`` on a cluster (:class:`~logstore.broker.coordinator_shards.RegisterCoordinator`);
    ``internal_replicated(topic, partition, end_offset)``, acks=all for a commit on a cluster
    (on the loop; NOT_COORDINATOR when the leadership ended first); the ``gate`` every handler
    runs through, whose ``run_io`` also runs the coordinator's file work.

    The broker calls :meth:`start` before it serves, runs :meth:`run_timer` as a task,
    calls :meth:`begin_stop` before it stops its listener and :meth:`stop` after.
    """

    def __init__(self, config: BrokerConfig, manager: LogManager, *, cluster: ClusterMembership,
                 register_coordinator: RegisterCoordinator,
                 internal_replicated: Callable[[str, int, int], Awaitable[None]], gate: RpcGate) -> None:
        if config.offsets_topic_num_partitions < 1:
            raise InvalidConfigError(
                f"offsets_topic_num_partitions must be >= 1, got {config.offsets_topic_num_partitions}"
            )
        self._config = config
        self._cluster = cluster
        self._register_coordinator = register_coordinator
        self._internal_replicated = internal_replicated
        self._gate = gate
        self.group_log = TopicGroupLog(manager, partitions=config.offsets_topic_num_partitions)
        self.coordinator = GroupCoordinator(
            GroupConfig(session_timeout_ms=config.group_session_timeout_ms,
                        heartbeat_interval_ms=config.group_heartbeat_interval_ms,
                        default_assignor=config.group_assignor),
            log=self.group_log,
            topic_partitions=cluster.topic_partition_count,
        )
        self._shard_state = GroupShardState(self.coordinator, self.group_log, self.group_log.internal.partition_count)
        self.shards = CoordinatorShards(
            self._shard_state,
            run_io=gate.run_io, node_id=config.node_id,
            on_resign=lambda partition: self._wake_all_members())  # held heartbeats: NOT_COORDINATOR now
        self._member_waiters: dict[MemberKey, set[asyncio.Future[None]]] = defaultdict(set)
        self._flush: asyncio.Task[None] | None = None
        self._stopping = False

    def rpcs(self) -> dict[str, Callable[..., Awaitable[Any]]]:
        """The RPCs this part implements, by name."""
        return {"ConsumerGroupHeartbeat": self.ConsumerGroupHeartbeat, "OffsetCommit": self.OffsetCommit,
                "OffsetFetch": self.OffsetFetch, "ListGroups": self.ListGroups,
                "DescribeGroups": self.DescribeGroups, "DeleteGroups": self.DeleteGroups}

    async def start(self, cluster: InternalReplication | None) -> None:
        """Single broker: replay every group now. Cluster: ``__consumer_offsets`` is a cluster
        topic; groups load shard by shard as this broker leads their partitions."""
        if cluster is not None:
            self.group_log.internal.use_cluster(cluster)
            self._register_coordinator(self.shards, partitions=self._config.offsets_topic_num_partitions,
                                       replication_factor=self._config.offsets_topic_replication_factor,
                                       configs=OFFSETS_TOPIC_CONFIGS)
            return
        await self._gate.run_io(self.coordinator.startup)
        self.shards.serve_everything(self._config.offsets_topic_num_partitions)

    # ------------------------------------------------------------------ transactions

    def offsets_partition(self, group_id: str) -> tuple[str, int]:
        """The partition of ``__consumer_offsets`` holding ``group_id``'s records: what
        AddOffsetsToTxn adds to a transaction (its marker ends the transaction's offsets)."""
        return OFFSETS_TOPIC, self.group_log.internal.partition_of(group_id)

    def marker_written(self, topic: str, partition: int, producer_id: int, commit: bool) -> None:
        """A transaction marker landed on a partition this broker leads (the marker writer's
        hook, any thread): on ``__consumer_offsets``, the pending offsets of ``producer_id`` in
        that partition's groups are applied (COMMIT) or dropped (ABORT)."""
        if topic != OFFSETS_TOPIC:
            return
        applied = self.coordinator.complete_transaction(producer_id, commit=commit,
                                                        owns=self._shard_state.owned_by(partition))
        log.debug("%s marker of producer %d on %s-%d: %d transactional offsets applied",
                  "COMMIT" if commit else "ABORT", producer_id, topic, partition, applied)

    # ------------------------------------------------------------------ background

    async def run_timer(self) -> None:
        """Every :data:`TICK_S`: evict expired members, wake the heartbeats a change affects,
        write dirty group metadata behind. Runs until cancelled."""
        while True:
            await asyncio.sleep(TICK_S)
            try:
                self._wake_members(self.coordinator.tick())
                self._maybe_flush()
            except Exception:
                log.exception("consumer group timer failed")

    def heartbeat_now(self, hb: Heartbeat) -> HeartbeatOutcome:
        """One heartbeat answered at once, for a front end whose members are not held (Kafka's
        listener: its clients heartbeat every interval): the group's shard checked, the
        coordinator's outcome, the members it changed woken and the groups' metadata flushed."""
        self.shards.check(hb.group_id)
        outcome = self.coordinator.heartbeat(hb)
        self._wake_members(outcome.changed)
        self._maybe_flush()
        return outcome

    def _wake_members(self, keys: Iterable[MemberKey]) -> None:
        for key in keys:
            for fut in self._member_waiters.pop(key, ()):
                if not fut.done():
                    fut.set_result(None)

    def _wake_all_members(self) -> None:
        self._wake_members(list(self._member_waiters))

    def _maybe_flush(self) -> None:
        if (self._flush is None or self._flush.done()) and self.coordinator.has_dirty_groups():
            self._flush = asyncio.create_task(self._flush_metadata())

    async def _flush_metadata(self) -> None:
        try:
            await self._gate.run_io(self.coordinator.flush_metadata)
        except LogstoreError as e:  # e.g. NOT_COORDINATOR while a shard moves away: its groups unload
            log.warning("writing consumer group metadata to %s failed (%s); will retry", OFFSETS_TOPIC, e.message)
        except Exception:
            log.exception("writing consumer group metadata to %s failed; will retry", OFFSETS_TOPIC)

    def begin_stop(self) -> None:
        """Answer held heartbeats now and hold no more (the server is about to stop)."""
        self._stopping = True
        self._wake_all_members()

    async def stop(self) -> None:
        """Write the last group metadata (after the server stopped)."""
        self._wake_all_members()
        try:
            await self._gate.run_io(self.coordinator.flush_metadata)
        except LogstoreError as e:  # on a cluster the leaderships may have moved already
            log.warning("writing consumer group metadata at shutdown failed: %s", e.message)
        except Exception:
            log.exception("writing consumer group metadata at shutdown failed")

    # ------------------------------------------------------------------ heartbeats

    async def ConsumerGroupHeartbeat(self, request: pb.ConsumerGroupHeartbeatRequest,
                                     context: grpc.aio.ServicerContext) -> pb.ConsumerGroupHeartbeatResponse:
        async def body() -> pb.ConsumerGroupHeartbeatResponse:
            principal = self._gate.principal(context)
            self._gate.check(principal, "READ", "GROUP", request.group_id)
            # A subscription only matches topics the member may DESCRIBE (issue 22): a hidden topic
            # is treated as one that does not exist, so guessed names reveal nothing.
            subscribed = tuple(t for t in request.subscribed_topics
                               if self._gate.allowed(principal, "DESCRIBE", "TOPIC", t))
            try:
                self.shards.check(request.group_id)
            except LogstoreError as e:
                return pb.ConsumerGroupHeartbeatResponse(error=error_to_pb(e), member_id=request.member_id,
                                                         member_epoch=-1)
            hb = Heartbeat(
                group_id=request.group_id, member_id=request.member_id, member_epoch=request.member_epoch,
                instance_id=request.instance_id, subscribed_topics=subscribed,
                assignor=request.server_assignor, owned=tps_from_pb(request.owned_partitions),
                rebalance_timeout_ms=request.rebalance_timeout_ms or 300_000,
                request_seq=request.request_seq, client_id=request.client_id,
                client_host=_peer_host(context.peer() or ""),
            )
            try:
                outcome = self.coordinator.heartbeat(hb)
            except LogstoreError as e:
                return pb.ConsumerGroupHeartbeatResponse(error=error_to_pb(e), member_id=request.member_id,
                                                         member_epoch=-1)
            self._wake_members(outcome.changed)
            self._maybe_flush()
            state = outcome.state
            if state is None:  # left
                return pb.ConsumerGroupHeartbeatResponse(member_id=request.member_id,
                                                         member_epoch=request.member_epoch)
            wait_ms = min(max(request.max_wait_ms, 0), self.coordinator.config.heartbeat_interval_ms)
            if outcome.in_sync and wait_ms > 0 and not self._stopping:
                key = (state.group_id, state.member_id)
                waiter: asyncio.Future[None] = asyncio.get_running_loop().create_future()
                self._member_waiters[key].add(waiter)
                try:
                    with contextlib.suppress(asyncio.TimeoutError):
                        await asyncio.wait_for(waiter, wait_ms / 1000)
                finally:
                    waiters = self._member_waiters.get(key)
                    if waiters is not None:
                        waiters.discard(waiter)
                        if not waiters:
                            del self._member_waiters[key]
                try:
                    self.shards.check(state.group_id)  # moved away meanwhile: not UNKNOWN_MEMBER_ID
                    state = self.coordinator.member_state(state.group_id, state.member_id)
                except LogstoreError as e:
                    return pb.ConsumerGroupHeartbeatResponse(error=error_to_pb(e), member_id=request.member_id,
                                                             member_epoch=-1)
            return _heartbeat_response(state)
        return await self._gate.guard("ConsumerGroupHeartbeat", context, body)

    # ------------------------------------------------------------------ offsets

    async def OffsetCommit(self, request: pb.OffsetCommitRequest,
                           context: grpc.aio.ServicerContext) -> pb.OffsetCommitResponse:
        async def body() -> pb.OffsetCommitResponse:
            principal = self._gate.principal(context)
            self._gate.check(principal, "READ", "GROUP", request.group_id)
            self._gate.check_topics(principal, "READ", (p.topic for p in request.partitions))
            resp = pb.OffsetCommitResponse()
            try:
                self.shards.check(request.group_id)
            except LogstoreError as e:
                resp.error.CopyFrom(error_to_pb(e))
                return resp
            offsets: dict[TopicPartition, tuple[int, str]] = {}
            failed = False
            for p in request.partitions:
                item = resp.partitions.add(topic=p.topic, partition=p.partition)
                try:
                    self._cluster.check_partition_known(p.topic, p.partition)
                except LogstoreError as e:
                    item.error.CopyFrom(error_to_pb(e))
                    failed = True
                offsets[TopicPartition(p.topic, p.partition)] = (p.offset, p.metadata)
            if failed:
                return resp
            try:
                await self.commit_offsets(request.group_id, request.member_id, request.member_epoch, offsets)
            except LogstoreError as e:
                resp.error.CopyFrom(error_to_pb(e))
            return resp
        return await self._gate.guard("OffsetCommit", context, body)

    async def commit_offsets(self, group_id: str, member_id: str, member_epoch: int,
                             offsets: Mapping[TopicPartition, tuple[int, str]]) -> None:
        """Commit ``offsets`` of ``group_id`` durably (the gRPC and the Kafka OffsetCommit): appended
        on the I/O pool, then, on a cluster, the in-sync replicas awaited here on the loop, not on
        an I/O thread (a burst of commits must not starve the follower fetches they wait for)."""
        pending = await self._gate.run_io(self.coordinator.append_commit, group_id, member_id, member_epoch, offsets)
        if pending is not None:
            for topic, partition, end_offset in pending.positions:
                await self._internal_replicated(topic, partition, end_offset)
            if not self.shards.resigned(group_id):  # else: durable, loaded elsewhere
                self.coordinator.apply_commit(pending)

    async def OffsetFetch(self, request: pb.OffsetFetchRequest,
                          context: grpc.aio.ServicerContext) -> pb.OffsetFetchResponse:
        async def body() -> pb.OffsetFetchResponse:
            principal = self._gate.principal(context)
            self._gate.check(principal, "DESCRIBE", "GROUP", request.group_id)
            wanted = sorted(tps_from_pb(request.partitions)) or None
            try:
                self.shards.check(request.group_id)
                found = self.coordinator.fetch_offsets(request.group_id, wanted)
            except LogstoreError as e:
                return pb.OffsetFetchResponse(error=error_to_pb(e))
            resp = pb.OffsetFetchResponse()
            reader = self._gate.allowed(principal, "READ", "GROUP", request.group_id)  # may see member ids
            for tp in wanted if wanted is not None else sorted(found):
                if not self._gate.allowed(principal, "DESCRIBE", "TOPIC", tp.topic):
                    continue  # as Kafka: the offsets of topics the caller may not describe are left out
                c = found.get(tp)
                if c is None:
                    resp.offsets.add(topic=tp.topic, partition=tp.partition, offset=-1, member_epoch=-1,
                                     commit_timestamp_ms=-1)
                else:
                    resp.offsets.add(topic=tp.topic, partition=tp.partition, offset=c.offset,
                                     metadata=c.metadata, commit_timestamp_ms=c.commit_timestamp_ms,
                                     member_id=c.member_id if reader else "", member_epoch=c.member_epoch)
            return resp
        return await self._gate.guard("OffsetFetch", context, body)

    # ------------------------------------------------------------------ administration

    async def ListGroups(self, request: pb.ListGroupsRequest,
                         context: grpc.aio.ServicerContext) -> pb.ListGroupsResponse:
        async def body() -> pb.ListGroupsResponse:
            principal = self._gate.principal(context)
            every = self._gate.allowed(principal, "DESCRIBE", "CLUSTER", "kafka-cluster")
            return pb.ListGroupsResponse(groups=[
                pb.GroupListing(group_id=g.group_id, state=g.state, members=g.members, assignor=g.assignor)
                for g in self.coordinator.list_groups()
                if self.shards.serves(g.group_id)
                and (every or self._gate.allowed(principal, "DESCRIBE", "GROUP", g.group_id))
            ])
        return await self._gate.guard("ListGroups", context, body)

    async def DescribeGroups(self, request: pb.DescribeGroupsRequest,
                             context: grpc.aio.ServicerContext) -> pb.DescribeGroupsResponse:
        async def body() -> pb.DescribeGroupsResponse:
            principal = self._gate.principal(context)
            out = []
            for group_id in request.group_ids:
                try:
                    self._gate.check(principal, "DESCRIBE", "GROUP", group_id)
                    self.shards.check(group_id)
                    described = _group_description(self.coordinator.describe_group(group_id))
                    if not self._gate.allowed(principal, "READ", "GROUP", group_id):
                        _hide_member_ids(described)  # they are no use to a caller that cannot act as a member
                    out.append(described)
                except LogstoreError as e:
                    out.append(pb.GroupDescription(group_id=group_id, error=error_to_pb(e)))
            return pb.DescribeGroupsResponse(groups=out)
        return await self._gate.guard("DescribeGroups", context, body)

    async def DeleteGroups(self, request: pb.DeleteGroupsRequest,
                           context: grpc.aio.ServicerContext) -> pb.DeleteGroupsResponse:
        async def body() -> pb.DeleteGroupsResponse:
            principal = self._gate.principal(context)
            results = []
            for group_id in request.group_ids:
                try:
                    self._gate.check(principal, "DELETE", "GROUP", group_id)
                    self.shards.check(group_id)
                    pending = await self._gate.run_io(self.coordinator.delete_group, group_id)
                    try:  # on the loop, as a commit's wait: an I/O thread never waits for replicas
                        for topic, partition, end_offset in pending.positions:
                            await self._internal_replicated(topic, partition, end_offset)
                    except BaseException:
                        self.coordinator.undo_delete(pending)
                        raise
                    results.append(pb.GroupResult(group_id=group_id))
                except LogstoreError as e:
                    results.append(pb.GroupResult(group_id=group_id, error=error_to_pb(e)))
            return pb.DeleteGroupsResponse(results=results)
        return await self._gate.guard("DeleteGroups", context, body)


def _heartbeat_response(state: MemberAssignment) -> pb.ConsumerGroupHeartbeatResponse:
    return pb.ConsumerGroupHeartbeatResponse(
        member_id=state.member_id, member_epoch=state.member_epoch,
        heartbeat_interval_ms=state.heartbeat_interval_ms, session_timeout_ms=state.session_timeout_ms,
        assignment=tps_to_pb(state.assignment),
    )


def _group_description(g: GroupSnapshot) -> pb.GroupDescription:
    return pb.GroupDescription(
        group_id=g.group_id, state=g.state, group_epoch=g.group_epoch, assignment_epoch=g.assignment_epoch,
        assignor=g.assignor,
        members=[pb.GroupMember(
            member_id=m.member_id, instance_id=m.instance_id, client_id=m.client_id, client_host=m.client_host,
            member_epoch=m.member_epoch, subscribed_topics=list(m.subscribed_topics), server_assignor=m.assignor,
            assignment=tps_to_pb(m.assigned), pending_revocation=tps_to_pb(m.revoking),
            target_assignment=tps_to_pb(m.target), left=m.left,
        ) for m in g.members],
        offsets=[pb.CommittedOffset(topic=tp.topic, partition=tp.partition, offset=c.offset, metadata=c.metadata,
                                    commit_timestamp_ms=c.commit_timestamp_ms, member_id=c.member_id,
                                    member_epoch=c.member_epoch)
                 for tp, c in sorted(g.offsets.items())],
    )


def _hide_member_ids(description: pb.GroupDescription) -> None:
    for m in description.members:
        m.member_id = ""
    for c in description.offsets:
        c.member_id = ""
