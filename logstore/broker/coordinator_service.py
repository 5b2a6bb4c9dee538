"""Coordinators that follow data: FindCoordinator and the replicated coordinator topics.

:class:`Coordinators` is a part the broker composes (its collaborators are constructor
arguments: the config, the :class:`~logstore.broker.membership.ClusterMembership`, the
broker's event loop and the :class:`~logstore.broker.rpc_gate.RpcGate`). A coordinator
(the group coordinator; the transaction coordinator once it registers) keeps its state
in an internal topic and registers its
:class:`~logstore.broker.coordinator_shards.CoordinatorShards` here with the topic's
shape (:meth:`Coordinators.register_coordinator`).

On a cluster (``metadata`` set):

* the coordinator topic is a replicated cluster topic in etcd, created on first
  need — the first FindCoordinator for one of its keys — with
  ``partitions`` partitions and replication factor
  ``min(replication_factor, live brokers)`` (Kafka's
  ``offsets.topic.replication.factor``; a cluster of one broker still gets its
  coordinator, with RF 1). It is replicated like any topic (followers copy its
  bytes); clients still cannot produce to or fetch from it (internal topics are
  for super users only, :mod:`logstore.broker.security.acl_service`);
* on every cluster view, each registered :class:`CoordinatorShards` hears which
  partitions of its topic this broker leads (:meth:`Coordinators.update`), and
  loads or unloads them;
* the coordinator's appends go to the local leader replica and, when durable,
  wait for the ISR (:class:`~logstore.broker.internal_log.InternalReplication`,
  implemented here; acks=all, bounded by :data:`REPLICATION_TIMEOUT_S`);
* FindCoordinator answers, per key, the broker leading partition
  ``crc32(key) % partitions`` (COORDINATOR_NOT_AVAILABLE while it has no live
  leader, or while the topic cannot be created).

On a single broker, and for a key type whose coordinator has not registered
(today the transaction coordinator keeps its state per broker), FindCoordinator
answers the broker itself with ``local`` set: the client keeps calling the
address it reached it by.

Thread-safety: handlers and :meth:`Coordinators.update` run on the event loop;
:meth:`internal_wait_replicated` is called from I/O threads and blocks one of
them, never the loop.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import zlib
from collections.abc import Awaitable, Callable, Iterable, Mapping
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, TypeVar

import grpc

from logstore._proto import logstore_pb2 as pb
from logstore.broker.coordinator_shards import CoordinatorShards
from logstore.broker.rpc_errors import error_to_pb
from logstore.errors import (
    CoordinatorNotAvailableError,
    FencedLeaderEpochError,
    InvalidRequestError,
    LeaderNotAvailableError,
    LogstoreError,
    NotCoordinatorError,
    NotLeaderError,
    TopicAlreadyExistsError,
    UnknownLeaderEpochError,
    UnknownTopicOrPartitionError,
)
from logstore.storage.log_manager import Partition

if TYPE_CHECKING:
    from logstore.broker.config import BrokerConfig
    from logstore.broker.membership import ClusterMembership
    from logstore.broker.rpc_gate import RpcGate
    from replication.state import BrokerRegistration, ClusterView

__all__ = ["Coordinators", "InternalTopicSpec", "TRANSACTION_STATE_TOPIC", "REPLICATION_TIMEOUT_S"]

log = logging.getLogger("logstore.broker.coordinators")
T = TypeVar("T")

TRANSACTION_STATE_TOPIC = "__transaction_state"
REPLICATION_TIMEOUT_S = 5.0  # Kafka's offsets.commit.timeout.ms
_CREATE_WAIT_S = 10.0
_KEY_TYPES = {pb.GROUP: ("GROUP", "__consumer_offsets"), pb.TRANSACTION: ("TRANSACTIONAL_ID", TRANSACTION_STATE_TOPIC)}
_NOT_LEADING = (NotLeaderError, LeaderNotAvailableError, FencedLeaderEpochError, UnknownLeaderEpochError,
                UnknownTopicOrPartitionError)


@dataclass(frozen=True, slots=True)
class InternalTopicSpec:
    """How a coordinator topic is created on a cluster."""

    partitions: int
    replication_factor: int
    configs: Mapping[str, str]


class Coordinators:
    """FindCoordinator and the coordinator topics; see the module docstring. ``loop()`` is the
    broker's event loop once it runs (an I/O thread waits for the ISR through it)."""

    def __init__(self, *, config: BrokerConfig, cluster: ClusterMembership,
                 loop: Callable[[], asyncio.AbstractEventLoop | None], gate: RpcGate) -> None:
        self.config = config
        self.cluster = cluster
        self._loop = loop
        self._gate = gate
        self.coordinator_shards: dict[str, CoordinatorShards] = {}
        self._internal_specs: dict[str, InternalTopicSpec] = {}
        self._creating: dict[str, asyncio.Task[None]] = {}

    def rpcs(self) -> dict[str, Callable[..., Awaitable[Any]]]:
        """The RPCs this part implements, by name."""
        return {"FindCoordinator": self.FindCoordinator}

    def register_coordinator(self, shards: CoordinatorShards, *, partitions: int, replication_factor: int,
                             configs: Mapping[str, str]) -> None:
        """Serve ``shards.topic``'s keys from the partitions this broker leads (a cluster only)."""
        self.coordinator_shards[shards.topic] = shards
        self._internal_specs[shards.topic] = InternalTopicSpec(partitions, replication_factor, dict(configs))
        if self.cluster.view is not None:
            self.update(self.cluster.view)

    def update(self, view: ClusterView, *, applied: bool = True) -> None:
        """Tell each coordinator which partitions of its topic this broker leads now (``applied``:
        the replica manager applied ``view``; before that, only the topics' partition counts)."""
        if self.cluster.replicas is None:
            return
        for topic, shards in self.coordinator_shards.items():
            record = view.topics.get(topic)
            count = None if record is None else record.partitions
            if applied:
                shards.update(count, self.cluster.replicas.leader_epochs(topic))
            else:
                shards.expect(count, {p for (t, p), state in view.partitions.items()
                                      if t == topic and state.leader == self.config.node_id})

    async def stop(self) -> None:
        for task in self._creating.values():
            task.cancel()
        for shards in self.coordinator_shards.values():
            await shards.close()

    # ------------------------------------------------------------------ InternalReplication

    def internal_partition_count(self, topic: str) -> int | None:
        view = self.cluster.view
        record = None if view is None else view.topics.get(topic)
        return None if record is None else record.partitions

    def internal_leader(self, topic: str, partition: int) -> Partition:
        assert self.cluster.replicas is not None
        try:
            return self.cluster.replicas.leader_partition(topic, partition)
        except _NOT_LEADING as e:
            raise NotCoordinatorError(f"broker {self.config.node_id} no longer leads {topic}-{partition}: "
                                      f"{e.message}") from None

    def internal_wait_replicated(self, topic: str, partition: int, end_offset: int) -> None:
        loop = self._loop()
        assert loop is not None
        future = asyncio.run_coroutine_threadsafe(self.internal_replicated(topic, partition, end_offset), loop)
        future.result(REPLICATION_TIMEOUT_S + 5)

    async def internal_replicated(self, topic: str, partition: int, end_offset: int) -> None:
        """acks=all for a coordinator's append (on the loop): the ISR has everything below
        ``end_offset``; NOT_COORDINATOR when the leadership ended first."""
        assert self.cluster.replicas is not None
        try:
            await self.cluster.replicas.wait_replicated(topic, partition, end_offset, REPLICATION_TIMEOUT_S)
        except _NOT_LEADING as e:
            raise NotCoordinatorError(f"broker {self.config.node_id} lost the leadership of {topic}-{partition} "
                                      f"before the write was replicated: {e.message}") from None

    # ------------------------------------------------------------------ the coordinator topics

    async def _ensure_internal_topic(self, topic: str) -> bool:
        """Create the coordinator topic in etcd if it does not exist; whether the view has it."""
        view = self.cluster.view
        if view is None or self.cluster.store is None:
            return False
        if topic in view.topics:
            return True
        task = self._creating.get(topic)
        if task is None or task.done():
            task = self._creating[topic] = asyncio.create_task(self._create_internal_topic(topic))
        with contextlib.suppress(LogstoreError, asyncio.TimeoutError):
            await asyncio.wait_for(asyncio.shield(task), _CREATE_WAIT_S)
        return self.cluster.view is not None and topic in self.cluster.view.topics

    async def _create_internal_topic(self, topic: str) -> None:
        from logstore.broker.cluster_topics import create_internal_topic

        assert self.cluster.store is not None and self.cluster.view is not None
        spec = self._internal_specs[topic]
        try:
            record = await create_internal_topic(self.cluster.store, self.cluster.view, topic, partitions=spec.partitions,
                                                 replication_factor=spec.replication_factor, configs=spec.configs)
            log.info("broker %d created the coordinator topic %s: %d partitions, replication factor %d",
                     self.config.node_id, topic, record.partitions, record.replication_factor)
        except TopicAlreadyExistsError:
            pass  # another broker was first
        except LogstoreError as e:
            log.warning("creating the coordinator topic %s failed: %s", topic, e.message)
            raise
        await self.cluster.wait_for_view(lambda v: topic in v.topics, _CREATE_WAIT_S)

    # ------------------------------------------------------------------ FindCoordinator

    async def FindCoordinator(self, request: pb.FindCoordinatorRequest,
                              context: grpc.aio.ServicerContext) -> pb.FindCoordinatorResponse:
        async def body() -> pb.FindCoordinatorResponse:
            principal = self._gate.principal(context)
            resource, topic = _KEY_TYPES.get(request.key_type, ("", ""))
            out = []
            allowed: list[str] = []
            for key in request.keys:
                try:
                    if not resource:
                        raise InvalidRequestError(f"unknown coordinator key type {request.key_type}; "
                                                  "use GROUP or TRANSACTION")
                    self._gate.check(principal, "DESCRIBE", resource, key)
                    allowed.append(key)
                    out.append(pb.Coordinator(key=key))
                except LogstoreError as e:
                    out.append(pb.Coordinator(key=key, error=error_to_pb(e)))
            if allowed:
                found = await self._find(topic, allowed)
                for item in out:
                    answer = found.get(item.key)
                    if answer is not None and not item.error.code:
                        item.CopyFrom(answer)
            return pb.FindCoordinatorResponse(coordinators=out)
        return await self._gate.guard("FindCoordinator", context, body)

    async def _find(self, topic: str, keys: Iterable[str]) -> dict[str, pb.Coordinator]:
        if self.cluster.store is None or topic not in self.coordinator_shards:
            me = self.cluster.registration
            return {k: pb.Coordinator(key=k, node_id=me.node_id, host=me.host, port=me.port, local=True)
                    for k in keys}
        return {k: pb.Coordinator(key=k, error=error_to_pb(found)) if isinstance(found, LogstoreError)
                else pb.Coordinator(key=k, node_id=found.node_id, host=found.host, port=found.port)
                for k, found in (await self.find_coordinators(topic, keys)).items()}

    async def find_coordinators(self, topic: str, keys: Iterable[str]) -> dict[str, BrokerRegistration | LogstoreError]:
        """Per key, the broker that coordinates it: the live leader of partition
        ``crc32(key) % partitions`` of the coordinator topic ``topic`` (created on first need),
        or COORDINATOR_NOT_AVAILABLE (retriable) while there is none. This broker on a single
        broker, and for a topic whose coordinator has not registered. What every front end's
        FindCoordinator answers (the Kafka listener gives the registration's Kafka address)."""
        keys = list(keys)
        if self.cluster.store is None or topic not in self.coordinator_shards:
            me = self.cluster.registration
            return dict.fromkeys(keys, me)
        if not await self._ensure_internal_topic(topic):
            error = CoordinatorNotAvailableError(f"the coordinator topic {topic} is being created; find the "
                                                 "coordinator again")
            return dict.fromkeys(keys, error)
        view = self.cluster.view
        assert view is not None
        n = view.topics[topic].partitions
        out: dict[str, BrokerRegistration | LogstoreError] = {}
        for key in keys:
            p = zlib.crc32(key.encode()) % n
            state = view.partitions.get((topic, p))
            leader = None if state is None else view.brokers.get(state.leader)
            out[key] = leader if leader is not None else CoordinatorNotAvailableError(
                f"{topic}-{p}, where {key!r} is coordinated, has no live leader; retry shortly")
        return out
