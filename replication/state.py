"""The cluster's metadata as values: what etcd holds, what the controller decides, what brokers act on.

These are the shared nouns of replication (DESIGN.md §4b). The etcd-backed
store (:mod:`replication.metadata_store`) reads and writes them as JSON under
``/logstore/<cluster>/``; the controller (:mod:`replication.controller`)
changes partition states; each broker's replica manager
(:mod:`replication.replica_manager`) turns a :class:`ClusterView` into
"lead this partition at epoch e" or "follow broker b".

* :class:`BrokerRegistration` — a live broker (its key lives as long as its lease): its gRPC
  address, rack and, when it has one, its Kafka listener's address.
* :class:`TopicRecord` — a topic: id, partition count, replication factor, configs, schema.
* :class:`PartitionState` — replicas, leader, leader epoch, ISR, partition epoch. The
  leader epoch changes with every leadership change; the partition epoch with every
  change at all (ISR included). ``revision`` is the etcd mod revision the state was read
  at: every write is a compare-and-swap on it, so a stale writer (a deposed controller,
  a deposed leader changing its ISR) fails instead of overwriting newer state. While the
  partition is being moved (:mod:`replication.reassignment`) it also names the replicas being
  ``adding`` and ``removing`` (``replicas`` is then old ∪ target) and the replication
  ``throttle`` (bytes/s, 0 = none) the adding replicas copy at.
* :class:`ClusterView` — one consistent snapshot of all of the above at an etcd revision.

Thread-safety: every class is immutable.
"""

from __future__ import annotations

import base64
import json
from collections.abc import Mapping
from dataclasses import dataclass, field, replace
from typing import Any

__all__ = ["NO_LEADER", "BrokerRegistration", "TopicRecord", "PartitionState", "ClusterView"]

NO_LEADER = -1


@dataclass(frozen=True, slots=True)
class BrokerRegistration:
    """A broker as it registered: where clients and followers reach it (``host:port``, its
    gRPC listener), its rack, and where Kafka clients reach its Kafka listener
    (``kafka_host:kafka_port``; port 0: it has none). The JSON names the Kafka listener only
    when there is one, so a registration without one reads and writes as before it existed."""

    node_id: int
    host: str
    port: int
    rack: str = ""
    kafka_host: str = ""
    kafka_port: int = 0

    @property
    def address(self) -> str:
        return f"{self.host}:{self.port}"

    @property
    def has_kafka_listener(self) -> bool:
        return self.kafka_port > 0

    def to_json(self) -> bytes:
        d: dict[str, Any] = {"node_id": self.node_id, "host": self.host, "port": self.port, "rack": self.rack}
        if self.has_kafka_listener:
            d.update(kafka_host=self.kafka_host, kafka_port=self.kafka_port)
        return json.dumps(d).encode()

    @classmethod
    def from_json(cls, data: bytes) -> BrokerRegistration:
        d = json.loads(data)
        return cls(int(d["node_id"]), str(d["host"]), int(d["port"]), str(d.get("rack") or ""),
                   str(d.get("kafka_host") or ""), int(d.get("kafka_port") or 0))


@dataclass(frozen=True, slots=True)
class TopicRecord:
    """A topic as the cluster knows it. ``value_schema`` is the Arrow IPC schema message of a
    typed topic's value columns (empty: untyped); ``configs`` are the topic's own overrides."""

    name: str
    topic_id: str
    partitions: int
    replication_factor: int
    configs: Mapping[str, str] = field(default_factory=dict)
    value_schema: bytes = b""

    def to_json(self) -> bytes:
        return json.dumps({
            "name": self.name, "topic_id": self.topic_id, "partitions": self.partitions,
            "replication_factor": self.replication_factor, "configs": dict(self.configs),
            "value_schema": base64.b64encode(self.value_schema).decode(),
        }).encode()

    @classmethod
    def from_json(cls, data: bytes) -> TopicRecord:
        d = json.loads(data)
        return cls(str(d["name"]), str(d["topic_id"]), int(d["partitions"]), int(d["replication_factor"]),
                   {str(k): str(v) for k, v in d.get("configs", {}).items()},
                   base64.b64decode(d.get("value_schema", "")))


@dataclass(frozen=True, slots=True)
class PartitionState:
    """One partition's replication state. ``leader`` is :data:`NO_LEADER` when no eligible
    replica is alive (the partition is offline); ``revision`` is the etcd mod revision it was
    read at (0: not read from etcd). ``adding`` / ``removing`` are non-empty only while a
    reassignment runs: the target is ``replicas`` without ``removing``, in order."""

    topic: str
    partition: int
    replicas: tuple[int, ...]
    leader: int
    leader_epoch: int
    isr: tuple[int, ...]
    partition_epoch: int = 0
    revision: int = 0
    adding: tuple[int, ...] = ()
    removing: tuple[int, ...] = ()
    throttle: int = 0

    @property
    def reassigning(self) -> bool:
        return bool(self.adding or self.removing)

    @property
    def target(self) -> tuple[int, ...]:
        """The replicas once the reassignment completes (``replicas`` when none runs)."""
        return tuple(r for r in self.replicas if r not in self.removing)

    @property
    def original(self) -> tuple[int, ...]:
        """The replicas before the reassignment (what a cancellation goes back to)."""
        return tuple(r for r in self.replicas if r not in self.adding)

    def to_json(self) -> bytes:
        d: dict[str, Any] = {
            "replicas": list(self.replicas), "leader": self.leader, "leader_epoch": self.leader_epoch,
            "isr": list(self.isr), "partition_epoch": self.partition_epoch,
        }
        if self.reassigning:  # absent otherwise: states written before reassignment existed read the same
            d.update(adding=list(self.adding), removing=list(self.removing), throttle=self.throttle)
        return json.dumps(d).encode()

    @classmethod
    def from_json(cls, topic: str, partition: int, data: bytes, *, revision: int = 0) -> PartitionState:
        d: dict[str, Any] = json.loads(data)
        return cls(topic, partition, tuple(int(r) for r in d["replicas"]), int(d["leader"]),
                   int(d["leader_epoch"]), tuple(int(r) for r in d["isr"]), int(d.get("partition_epoch", 0)),
                   revision, tuple(int(r) for r in d.get("adding", ())),
                   tuple(int(r) for r in d.get("removing", ())), int(d.get("throttle", 0)))

    def with_isr(self, isr: tuple[int, ...]) -> PartitionState:
        """The next state with ``isr`` (same leader and leader epoch, partition epoch + 1)."""
        return replace(self, isr=isr, partition_epoch=self.partition_epoch + 1, revision=0)

    def with_leader(self, leader: int, isr: tuple[int, ...]) -> PartitionState:
        """The next state led by ``leader`` (leader epoch + 1, partition epoch + 1)."""
        return replace(self, leader=leader, isr=isr, leader_epoch=self.leader_epoch + 1,
                       partition_epoch=self.partition_epoch + 1, revision=0)


@dataclass(frozen=True, slots=True)
class ClusterView:
    """Everything the cluster's metadata says, at etcd revision ``revision``.

    ``shutting_down`` are brokers that asked for a controlled shutdown (the controller
    moves their leaderships away); ``controller_id`` is -1 while no controller is elected.
    """

    revision: int
    brokers: Mapping[int, BrokerRegistration]
    topics: Mapping[str, TopicRecord]
    partitions: Mapping[tuple[str, int], PartitionState]
    controller_id: int = -1
    controller_epoch: int = 0
    shutting_down: frozenset[int] = frozenset()

    def partitions_of(self, topic: str) -> list[PartitionState]:
        return sorted((s for (t, _), s in self.partitions.items() if t == topic), key=lambda s: s.partition)

    def hosted_by(self, node_id: int) -> list[PartitionState]:
        """The partitions with a replica on ``node_id``."""
        return [s for s in self.partitions.values() if node_id in s.replicas]
