"""The broker as a member of a cluster: etcd registration, the controller, replica roles.

:class:`ClusterMembership` is a part the broker composes (:class:`logstore.broker.service.Broker`
builds it and hands it to the data plane and the handlers that ask where a partition is
led). With ``metadata`` unset (the single embedded broker) it joins nothing and every
partition is local. With ``metadata = "etcd://HOST:PORT"`` the broker, at start:

1. connects to etcd (:class:`replication.metadata_store.MetadataStore`) and
   registers itself under a lease of ``broker_session_timeout_ms`` (liveness), with
   its gRPC address and, when ``kafka_listener`` is set, its Kafka listener's address
   (what Kafka clients get in Metadata and FindCoordinator answers);
2. campaigns to be the active controller (:class:`replication.controller.Controller`:
   one broker at a time; it elects partition leaders when brokers die);
3. follows the cluster's metadata: every new :class:`~replication.state.ClusterView`
   goes to the replica manager (:class:`replication.replica_manager.ReplicaManager`),
   which opens the local replicas and leads or follows each partition.

Produce, fetch and offsets then act only on partitions this broker leads, at the
leader epoch the client knows (:meth:`ClusterMembership.leader`); the topic RPCs
change the metadata in etcd (:mod:`logstore.broker.topic_service`).

Shutdown (SIGTERM) is controlled: the broker asks the controller to move its
leaderships to other in-sync replicas and waits for that (at most
``controlled_shutdown_timeout_ms``) before it stops serving, so producers see a
retried NOT_LEADER_OR_FOLLOWER at most.

Coordinator topics (``__consumer_offsets``, ``__transaction_state``) are cluster
topics like any other, created by the broker on first need and followed by the
coordinators of the partitions this broker leads (:mod:`logstore.broker.coordinator_service`,
told after every view). Other internal ``__*`` topics stay local to each broker
(:func:`is_internal`).

Thread-safety: everything here runs on the broker's event loop.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Awaitable, Callable
from typing import TYPE_CHECKING, Any

from logstore.broker.config import BrokerConfig
from logstore.broker.shutdown import ShutdownClock
from logstore.errors import (
    BrokerUnavailableError,
    InvalidRequestError,
    LogstoreError,
    NotLeaderError,
    UnknownTopicOrPartitionError,
)
from logstore.storage.log_manager import LogManager, Partition
from replication.state import BrokerRegistration, ClusterView

if TYPE_CHECKING:  # imported when a cluster starts: a single broker never loads etcd's client
    import grpc

    from replication.controller import Controller
    from replication.links import LeaderLink
    from replication.metadata_store import MetadataStore
    from replication.replica_manager import ReplicaManager

__all__ = ["ClusterMembership", "is_internal", "COORDINATOR_TOPICS"]

log = logging.getLogger("logstore.broker")


# How long a starting broker asks an etcd that does not answer (starting, restarting, or slow on a
# loaded machine) before it gives up: Kafka's zookeeper.connection.timeout.ms is 18 s.
METADATA_CONNECT_WAIT_S = 30.0

# Internal topics replicated over the cluster: the coordinators' state, which must outlive a broker.
COORDINATOR_TOPICS = frozenset({"__consumer_offsets", "__transaction_state"})


def is_internal(topic: str) -> bool:
    """Internal topics local to each broker (its own state; on a cluster they stay local to it).
    The coordinator topics (:data:`COORDINATOR_TOPICS`) are cluster topics, not these."""
    return topic.startswith("__") and topic not in COORDINATOR_TOPICS


class ClusterMembership:
    """This broker as a member of its cluster, or alone; see the module docstring.

    The broker builds one and hands it to the parts that ask where a partition lives:
    ``leader`` and the checks below answer for a single broker too (every partition is
    local). Collaborators: the config and the log manager; ``run_io`` runs file work on the
    broker's I/O pool; ``port()`` is the port the broker's listener bound; ``link_for`` makes
    a follower's link to a partition's leader and ``etcd_credentials`` are the etcd client's
    (:mod:`logstore.broker.peers`); ``wake(topic, partition)`` wakes the partition's waiting fetches (HWM moves, role
    changes); ``on_view(view, applied)`` hears every cluster view, before (``applied``
    False) and after the replica manager applied it (the coordinators' shards);
    ``kafka_address()`` is where Kafka clients reach this broker's Kafka listener, bound
    before the broker joins (None: it has none), published with its registration.
    """

    def __init__(self, config: BrokerConfig, manager: LogManager, *, run_io: Callable[..., Awaitable[Any]],
                 port: Callable[[], int], link_for: Callable[[BrokerRegistration], LeaderLink],
                 etcd_credentials: grpc.ChannelCredentials | None, wake: Callable[[str, int], None],
                 on_view: Callable[[ClusterView, bool], None],
                 kafka_address: Callable[[], tuple[str, int] | None] = lambda: None) -> None:
        self.config = config
        self.manager = manager
        self._run_io = run_io
        self._link_for = link_for
        self._etcd_credentials = etcd_credentials
        self._wake = wake
        self._on_view = on_view
        self._port = port
        self._kafka_address = kafka_address
        self.store: MetadataStore | None = None
        self.replicas: ReplicaManager | None = None
        self.controller: Controller | None = None
        self.view: ClusterView | None = None
        self._loop: asyncio.AbstractEventLoop | None = None
        self._view_seen = asyncio.Event()
        self._tasks: list[asyncio.Task[Any]] = []

    # ------------------------------------------------------------------ lifecycle

    @property
    def registration(self) -> BrokerRegistration:
        host, _, port = (self.config.advertised_address or f"{self.config.host}:{self._port()}").rpartition(":")
        kafka_host, kafka_port = self._kafka_address() or ("", 0)
        return BrokerRegistration(self.config.node_id, host, int(port), self.config.rack, kafka_host, kafka_port)

    async def start(self) -> None:
        """Join the cluster (a no-op for a single broker); return once the first view is applied."""
        self._loop = asyncio.get_running_loop()
        if not self.config.clustered:
            return
        from replication.controller import Controller
        from replication.metadata_store import MetadataStore
        from replication.replica_manager import ReplicaManager

        self.store = await MetadataStore.connect(self.config.metadata, cluster_id=self.config.cluster_id,
                                                 wait_s=METADATA_CONNECT_WAIT_S, credentials=self._etcd_credentials)
        self.replicas = ReplicaManager(
            self.config.node_id, self.manager, run_io=self._run_io, link_for=self._link_for,
            alter_isr=self.store.alter_isr, on_high_watermark=self._wake, wake_fetches=self._wake,
            replica_lag_time_max_ms=self.config.replica_lag_time_max_ms,
            replica_fetch_wait_max_ms=self.config.replica_fetch_wait_max_ms,
        )
        await self.store.register_broker(
            self.registration, session_timeout_ms=self.config.broker_session_timeout_ms,
            on_session_lost=lambda: log.warning("broker %d lost its etcd session; registering again",
                                                self.config.node_id),
        )
        self.controller = Controller(
            self.store, self.config.node_id,
            unclean_default=self.config.topic_defaults.unclean_leader_election_enable)
        self._tasks = [
            asyncio.create_task(self.controller.run()),
            asyncio.create_task(self._follow_views()),
            asyncio.create_task(self._check_isr()),
        ]
        await asyncio.wait_for(self._view_seen.wait(), timeout=30)
        reg = self.registration
        log.info("broker %d joined cluster %r at %s%s (metadata %s)", self.config.node_id,
                 self.config.cluster_id, reg.address,
                 f", kafka listener {reg.kafka_host}:{reg.kafka_port}" if reg.has_kafka_listener else "",
                 self.config.metadata)

    def producer_id_block(self, count: int) -> int:
        """A block of ``count`` cluster-unique producer ids from etcd, its first id (the transaction
        coordinator calls it on the I/O pool); BROKER_NOT_AVAILABLE before the broker joined."""
        if self._loop is None or self.store is None:
            raise BrokerUnavailableError("the broker has not joined its cluster yet; retry shortly")
        future = asyncio.run_coroutine_threadsafe(self.store.allocate_producer_ids(count), self._loop)
        return future.result(timeout=30)

    async def _check_isr(self) -> None:
        """The leaders' lag check, four times per ``replica_lag_time_max_ms``."""
        assert self.replicas is not None
        while True:
            await asyncio.sleep(max(self.config.replica_lag_time_max_ms // 4, 100) / 1000)
            try:
                await self.replicas.shrink_isr_if_lagging()
            except Exception:
                log.exception("the ISR check failed")

    async def _follow_views(self) -> None:
        assert self.store is not None and self.replicas is not None
        async for view in self.store.watch_view():
            self.view = view
            self._on_view(view, False)  # a new coordinator topic's partition count
            try:
                await self.replicas.apply(view)
            except Exception:
                log.exception("applying cluster metadata at revision %d failed", view.revision)
            try:
                self._on_view(view, True)  # the coordinator shards led here (coordinator_service)
            except Exception:
                log.exception("updating the coordinators at revision %d failed", view.revision)
            self._view_seen.set()

    async def leave_leaderships(self) -> None:
        """Controlled shutdown: ask for this broker's leaderships to move; wait (bounded)."""
        if self.store is None:
            return
        from replication.controller import leaderships_to_move

        me = self.config.node_id
        try:
            await self.store.request_controlled_shutdown(me)
        except LogstoreError as e:
            log.warning("controlled shutdown request failed (%s); stopping anyway", e)
            return
        deadline = time.monotonic() + self.config.controlled_shutdown_timeout_ms / 1000
        while time.monotonic() < deadline:
            view = self.view
            if view is None or not leaderships_to_move(view, me):
                return
            await asyncio.sleep(0.05)
        log.warning("controlled shutdown: leaderships still here after %d ms; stopping anyway",
                    self.config.controlled_shutdown_timeout_ms)

    async def stop(self, clock: ShutdownClock) -> None:
        """Leave the cluster: the local parts always (the replica manager closes first, which
        fails the acks=all and coordinator waits still pending), the etcd calls within what is
        left of ``clock`` (when they are abandoned, the session's lease ends it all anyway)."""
        for task in self._tasks:
            task.cancel()
        await clock.step("the cluster tasks", asyncio.gather(*self._tasks, return_exceptions=True))
        if self.replicas is not None:
            await clock.step("closing the replicas", self.replicas.close())
        if self.controller is not None:
            await clock.step("resigning the controller role", self.controller.stop())
        if self.store is not None:
            await clock.step("deregistering from etcd", self.store.deregister())
            await clock.step("closing the etcd client", self.store.close())

    # ------------------------------------------------------------------ partitions

    def is_controller(self) -> bool:
        """Whether this broker is the active controller; a single broker is its own (as a
        combined-mode KRaft node: an ActiveControllerCount alert sums to 1 on it too)."""
        if not self.config.clustered:
            return True
        return self.controller is not None and self.controller.active

    def view_to_describe(self) -> ClusterView | None:
        """The cluster's map for a Metadata answer: None on a single broker (its own logs are the
        map); BROKER_NOT_AVAILABLE from a cluster broker that has not joined yet (its own files
        are no map of the cluster)."""
        if self.view is None and self.config.clustered:
            raise BrokerUnavailableError(f"broker {self.config.node_id} has not joined its cluster yet; "
                                         "ask another broker")
        return self.view

    def leader(self, topic: str, partition: int, current_leader_epoch: int = -1) -> Partition:
        """The partition to produce to or read from: on a cluster, only where this broker leads it
        (NOT_LEADER_OR_FOLLOWER, FENCED_LEADER_EPOCH, UNKNOWN_LEADER_EPOCH otherwise). A cluster
        broker leads nothing until it has joined: its listeners serve from before that (a
        restarted former leader's own files would otherwise take reads and writes meant for the
        new leader)."""
        if is_internal(topic) or not self.config.clustered:
            return self.manager.partition(topic, partition)
        if self.replicas is None:
            raise NotLeaderError(f"{topic}-{partition}: broker {self.config.node_id} has not joined its cluster "
                                 "yet; ask the partition's leader")
        return self.replicas.leader_partition(topic, partition, current_leader_epoch)

    def check_end_known(self, topic: str, partition: int) -> None:
        """Refuse to list end offsets while a new leader's HWM is not known (a cluster only)."""
        if self.replicas is not None and not is_internal(topic):
            self.replicas.check_end_known(topic, partition)

    def check_partition_known(self, topic: str, partition: int) -> None:
        """Raise unless the partition exists (anywhere in the cluster)."""
        if self.view is None or is_internal(topic):
            self.manager.partition(topic, partition)
            return
        if (topic, partition) not in self.view.partitions:
            raise UnknownTopicOrPartitionError(f"unknown topic or partition {topic}-{partition}")

    def topic_partition_count(self, topic: str) -> int | None:
        if self.view is not None and not is_internal(topic):
            record = self.view.topics.get(topic)
            return None if record is None else record.partitions
        try:
            return self.manager.topic(topic).partitions
        except LogstoreError:
            return None

    def replicated(self, topic: str) -> bool:
        """Whether acks=all on ``topic`` waits for followers (a cluster topic, not internal)."""
        return self.replicas is not None and not is_internal(topic)

    def replica_count(self, topic: str, partition: int) -> int:
        """How many replicas ``topic-partition`` has (1 on a single broker and for internal topics)."""
        view = self.view
        state = None if view is None or is_internal(topic) else view.partitions.get((topic, partition))
        return 1 if state is None else len(state.replicas)

    def require_cluster(self, what: str) -> ReplicaManager:
        if self.replicas is None:
            raise InvalidRequestError(f"{what}: this broker is not part of a cluster (no metadata configured)")
        return self.replicas

    async def wait_for_view(self, ready: Callable[[ClusterView], bool], timeout_s: float = 10.0) -> bool:
        """Wait until the applied view satisfies ``ready`` (e.g. a topic just created appears)."""
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            if self.view is not None and ready(self.view):
                return True
            await asyncio.sleep(0.02)
        return False
