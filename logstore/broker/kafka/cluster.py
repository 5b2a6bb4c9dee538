"""The cluster as Kafka clients see it: brokers at their Kafka listeners, the controller, each
topic's partitions (leader, leader epoch, replicas, ISR) and the coordinator of a key.

What Metadata, DescribeCluster and FindCoordinator answer from, so a Kafka client routes
produce and fetch to partition leaders and group and transaction calls to coordinators:

* **a single broker** (no ``metadata``): this broker, at its Kafka listener, is the only
  broker, the controller, the leader and only replica of every partition of its log
  manager, and the coordinator of every key;
* **a cluster**: the applied cluster view (:class:`~replication.state.ClusterView`). The
  brokers are the live brokers that registered a Kafka listener, at its address (each
  broker publishes it with its registration, :mod:`logstore.broker.membership`); the
  controller is the cluster's; a partition's leader, epoch, replicas and ISR are the
  view's. A partition whose leader is dead, or has no Kafka listener a client could reach,
  is answered with leader -1 and LEADER_NOT_AVAILABLE (Kafka clients refresh their
  metadata and retry). A key's coordinator is the leader of its shard of the coordinator
  topic (``find_coordinators``: the same lookup as the gRPC FindCoordinator);
  COORDINATOR_NOT_AVAILABLE while that leader has no Kafka listener. Before the broker has
  joined (its listener serves from the start) the cluster has no topics yet: a named topic
  gets LEADER_NOT_AVAILABLE and the broker lists only itself.

A broker that does not lead a partition refuses its Produce and Fetch with
NOT_LEADER_OR_FOLLOWER (the data plane does), and one that does not coordinate a key
refuses its calls with NOT_COORDINATOR or COORDINATOR_LOAD_IN_PROGRESS
(:meth:`KafkaCluster.check_coordinator`): Kafka clients then find the leader or the
coordinator again.

Thread-safety: event loop only.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable, Iterable, Mapping
from dataclasses import dataclass
from typing import TYPE_CHECKING

from logstore.errors import (
    CoordinatorNotAvailableError,
    LeaderNotAvailableError,
    LogOfflineError,
    LogstoreError,
    UnknownTopicOrPartitionError,
)

if TYPE_CHECKING:
    from logstore.broker.membership import ClusterMembership
    from logstore.storage.log_manager import LogManager
    from replication.state import BrokerRegistration, ClusterView

__all__ = ["GROUPS_TOPIC", "TRANSACTIONS_TOPIC", "KafkaBroker", "KafkaCluster", "PartitionLayout", "TopicLayout"]

GROUPS_TOPIC, TRANSACTIONS_TOPIC = "__consumer_offsets", "__transaction_state"  # the coordinator topics
NO_LEADER = -1

# A coordinator topic's key -> the coordinator serving it, or the error saying why none does.
FindCoordinators = Callable[[str, Iterable[str]], Awaitable[Mapping[str, "BrokerRegistration | LogstoreError"]]]


@dataclass(frozen=True, slots=True)
class KafkaBroker:
    """A broker as Kafka clients reach it: its node id and its Kafka listener's address."""

    node_id: int
    host: str
    port: int
    rack: str | None = None


@dataclass(frozen=True, slots=True)
class PartitionLayout:
    """One partition as Metadata describes it. ``leader`` is -1 when no reachable broker leads
    it, and ``error`` then says why (LEADER_NOT_AVAILABLE); ``offline`` are the replicas on
    brokers that are not alive."""

    partition: int
    leader: int
    leader_epoch: int
    replicas: tuple[int, ...]
    isr: tuple[int, ...]
    offline: tuple[int, ...] = ()
    error: LogstoreError | None = None


@dataclass(frozen=True, slots=True)
class TopicLayout:
    """A topic as Metadata describes it: its id (32 hex digits) and its partitions, in order."""

    name: str
    topic_id: str
    partitions: tuple[PartitionLayout, ...]


class KafkaCluster:
    """The cluster as Kafka clients see it; see the module docstring.

    Collaborators: ``membership`` (where partitions are led, the cluster view), ``manager``
    (a single broker's topics), ``advertised()`` (this broker's Kafka listener, as clients
    reach it), ``find_coordinators(topic, keys)`` (each key's coordinator, from the
    coordinator topic ``topic``) and ``coordinator_checks`` (per coordinator topic, the check
    that this broker serves a key: raises NOT_COORDINATOR, COORDINATOR_LOAD_IN_PROGRESS or
    COORDINATOR_NOT_AVAILABLE). ``clustered``, chosen by the assembly: a broker of a cluster
    (answers from the cluster view) or a single broker (answers from ``manager``).
    """

    def __init__(self, *, membership: ClusterMembership, manager: LogManager, node_id: int, cluster_id: str,
                 advertised: Callable[[], tuple[str, int]], find_coordinators: FindCoordinators,
                 coordinator_checks: Mapping[str, Callable[[str], object]], clustered: bool) -> None:
        self._membership = membership
        self.clustered = clustered
        self._manager = manager
        self.node_id = node_id
        self.cluster_id = cluster_id
        self._advertised = advertised
        self._find_coordinators = find_coordinators
        self._coordinator_checks = dict(coordinator_checks)

    def _view(self) -> ClusterView | None:
        return self._membership.view if self.clustered else None

    def me(self) -> KafkaBroker:
        host, port = self._advertised()
        return KafkaBroker(self.node_id, host, port, self._membership.config.rack or None)

    # ------------------------------------------------------------------ brokers

    def brokers(self) -> tuple[KafkaBroker, ...]:
        """The brokers Kafka clients may call, by node id."""
        view = self._view()
        if view is None:
            return (self.me(),)
        return tuple(_kafka_broker(b) for _, b in sorted(view.brokers.items()) if b.has_kafka_listener)

    def controller_id(self) -> int:
        """The active controller's node id (-1 while a cluster has none)."""
        if not self.clustered:
            return self.node_id
        view = self._view()
        return NO_LEADER if view is None else view.controller_id

    # ------------------------------------------------------------------ topics

    def topic_names(self) -> list[str]:
        """Every topic, sorted (a cluster's that has not joined yet: none)."""
        if not self.clustered:
            return [t.name for t in self._manager.topics()]
        view = self._view()
        return [] if view is None else sorted(view.topics)

    def topic_ids(self) -> dict[str, str]:
        """Topic id (32 hex digits) -> name, for requests naming topics by id."""
        if not self.clustered:
            return {t.topic_id: t.name for t in self._manager.topics()}
        view = self._view()
        return {} if view is None else {t.topic_id: t.name for t in view.topics.values()}

    def topic(self, name: str) -> TopicLayout:
        """``name``'s layout; UNKNOWN_TOPIC_OR_PARTITION when there is no such topic."""
        if not self.clustered:
            return self._local_topic(name)
        view = self._view()
        if view is None:
            raise LeaderNotAvailableError(f"broker {self.node_id} has not joined its cluster yet; retry shortly")
        record = view.topics.get(name)
        if record is None:
            raise UnknownTopicOrPartitionError(f"topic {name!r} does not exist")
        return TopicLayout(name, record.topic_id, tuple(_partition(view, s.partition, s.leader, s.leader_epoch,
                                                                   s.replicas, s.isr)
                                                        for s in view.partitions_of(name)))

    def _local_topic(self, name: str) -> TopicLayout:
        info = self._manager.topic(name)
        me = (self.node_id,)
        return TopicLayout(name, info.topic_id, tuple(
            PartitionLayout(part.partition, self.node_id, part.leader_epoch, me, me,
                            error=None if part.log.offline_reason is None else LogOfflineError(part.log.offline_reason))
            for part in sorted(self._manager.partitions_of(name), key=lambda p: p.partition)))

    def check_partition(self, topic: str, partition: int) -> None:
        """Raise UNKNOWN_TOPIC_OR_PARTITION unless ``topic-partition`` exists in the cluster
        (wherever it is led: a coordinator commits offsets of partitions led elsewhere)."""
        self._membership.check_partition_known(topic, partition)

    # ------------------------------------------------------------------ coordinators

    async def coordinator(self, topic: str, key: str) -> KafkaBroker:
        """The broker coordinating ``key`` (a group id with :data:`GROUPS_TOPIC`, a transactional
        id with :data:`TRANSACTIONS_TOPIC`); raises COORDINATOR_NOT_AVAILABLE while none does."""
        if not self.clustered:
            return self.me()
        found = (await self._find_coordinators(topic, [key]))[key]
        if isinstance(found, LogstoreError):
            raise found
        if not found.has_kafka_listener:
            raise CoordinatorNotAvailableError(
                f"broker {found.node_id} coordinates {key!r} but has no Kafka listener (kafka_listener); "
                "give every broker of the cluster one")
        return _kafka_broker(found)

    def check_coordinator(self, topic: str, key: str) -> None:
        """Raise unless this broker serves ``key``'s state now (NOT_COORDINATOR,
        COORDINATOR_LOAD_IN_PROGRESS, COORDINATOR_NOT_AVAILABLE: the client finds it again)."""
        check = self._coordinator_checks.get(topic)
        if check is not None:
            check(key)


def _kafka_broker(reg: BrokerRegistration) -> KafkaBroker:
    return KafkaBroker(reg.node_id, reg.kafka_host, reg.kafka_port, reg.rack or None)


def _partition(view: ClusterView, partition: int, leader: int, leader_epoch: int, replicas: tuple[int, ...],
               isr: tuple[int, ...]) -> PartitionLayout:
    """A partition of the cluster view, its leader -1 unless it is alive with a Kafka listener."""
    offline = tuple(r for r in replicas if r not in view.brokers)
    registration = view.brokers.get(leader)
    if registration is None or not registration.has_kafka_listener:
        why = ("no in-sync replica is alive" if registration is None
               else f"its leader, broker {leader}, has no Kafka listener")
        return PartitionLayout(partition, NO_LEADER, leader_epoch, replicas, isr, offline,
                               LeaderNotAvailableError(f"partition {partition} has no leader Kafka clients can "
                                                       f"reach: {why}"))
    return PartitionLayout(partition, leader, leader_epoch, replicas, isr, offline)
