"""The reassignment and leader-election calls of the admin client, Kafka's shape.

:class:`~logstore.client.admin.Admin` exposes them as ``alter_partition_reassignments``,
``list_partition_reassignments`` and ``elect_leaders``. They need a cluster (a single broker
answers INVALID_REQUEST) and ALTER / DESCRIBE on the cluster resource.

Progress: any broker lists the running moves from the cluster's metadata, but only a
partition's leader knows how far its new replicas are; entries the first broker could not
measure are asked of their leaders (one more call per leader).

Each function is handed the client's :class:`~logstore.client.transport.Transport`
(``BrokerClient.transport``): it sends its calls through it.

Thread-safety: the functions are as thread-safe as the transport they are given.
"""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass

from logstore._proto import logstore_pb2 as pb
from logstore.client.error_mapping import about, error_from_item
from logstore.client.transport import Transport
from logstore.errors import LogstoreError
from logstore.types import TopicPartition

__all__ = ["PartitionReassignment", "alter_partition_reassignments", "list_partition_reassignments",
           "elect_leaders", "ELECTION_TYPES"]

ELECTION_TYPES = {"preferred": pb.PREFERRED, "unclean": pb.UNCLEAN}


@dataclass(frozen=True, slots=True)
class PartitionReassignment:
    """A running move: ``replicas`` is old ∪ target; ``bytes_copied`` is the slowest adding
    replica's (-1 with ``bytes_total``: the leader could not be asked); ``throttle`` bytes/s."""

    topic: str
    partition: int
    replicas: tuple[int, ...]
    adding: tuple[int, ...]
    removing: tuple[int, ...]
    target: tuple[int, ...]
    leader: int
    bytes_total: int
    bytes_copied: int
    throttle: int

    @property
    def fraction(self) -> float:
        """How much of the data the slowest new replica has (1.0 when nothing is to copy)."""
        if self.bytes_total <= 0:
            return 1.0 if self.bytes_total == 0 else 0.0
        return min(1.0, max(0.0, self.bytes_copied / self.bytes_total))


def alter_partition_reassignments(transport: Transport, plan: Mapping[TopicPartition, Sequence[int] | None],
                                  throttle_bytes_per_sec: int = 0) -> None:
    """Start (or, with None or an empty list, cancel) moves; raise the first partition's error
    (the others are still applied)."""
    items = [pb.ReassignablePartition(topic=tp.topic, partition=tp.partition, replicas=list(r or ()))
             for tp, r in plan.items()]
    r = transport.call("AlterPartitionReassignments", pb.AlterPartitionReassignmentsRequest(
        partitions=items, throttle_bytes_per_sec=throttle_bytes_per_sec), timeout_s=transport.deadline_s(None))
    for res in r.results:
        e = error_from_item(res.error)
        if e is not None:
            raise about(e, f"{res.topic}-{res.partition}")


def _entry(e: pb.OngoingReassignment, throttle: int) -> PartitionReassignment:
    known = e.progress_known
    return PartitionReassignment(e.topic, e.partition, tuple(e.replicas), tuple(e.adding_replicas),
                                 tuple(e.removing_replicas), tuple(e.target_replicas), e.leader,
                                 e.bytes_total if known else -1, e.bytes_copied if known else -1, throttle)


def list_partition_reassignments(transport: Transport, topics: Iterable[str] | None = None
                                 ) -> dict[TopicPartition, PartitionReassignment]:
    """The running moves (of ``topics``; None = all), with the leaders' progress."""
    request = pb.ListPartitionReassignmentsRequest(topics=list(topics or ()))
    timeout_s = transport.deadline_s(None)
    r = transport.call("ListPartitionReassignments", request, timeout_s=timeout_s)
    e = error_from_item(r.error)
    if e is not None:
        raise e
    entries = {TopicPartition(x.topic, x.partition): x for x in r.reassignments}
    unknown = defaultdict(list)
    for x in entries.values():
        if not x.progress_known and x.leader >= 0:
            unknown[x.leader].append(x)
    if unknown:
        md = transport.call("Metadata", pb.MetadataRequest(topics=[]), timeout_s=timeout_s)
        transport.router.learn(md)
        addresses = {b.node_id: f"{b.host}:{b.port}" for b in md.brokers}
        for leader, xs in unknown.items():
            if leader not in addresses:
                continue
            try:
                theirs = transport.call("ListPartitionReassignments", pb.ListPartitionReassignmentsRequest(
                    topics=sorted({x.topic for x in xs})), timeout_s=timeout_s,
                    conn=transport.router.connection(addresses[leader]))
            except LogstoreError:
                continue  # progress stays unknown; the list itself is right
            for y in theirs.reassignments:
                tp = TopicPartition(y.topic, y.partition)
                if y.progress_known and tp in entries:
                    entries[tp] = y
    return {tp: _entry(x, r.throttle_bytes_per_sec) for tp, x in sorted(entries.items(), key=lambda kv: (
        kv[0].topic, kv[0].partition))}


def elect_leaders(transport: Transport, election_type: str = "preferred",
                  partitions: Iterable[TopicPartition] | None = None) -> dict[TopicPartition, LogstoreError | None]:
    """Elect leaders (``"preferred"`` or ``"unclean"``) for ``partitions`` (None = every
    partition); each partition's outcome: None (elected) or its error, e.g.
    :class:`ElectionNotNeededError`, :class:`PreferredLeaderNotAvailableError`."""
    if election_type not in ELECTION_TYPES:
        raise ValueError(f"election_type must be one of {sorted(ELECTION_TYPES)}, not {election_type!r}")
    refs = [pb.TopicPartitionRef(topic=tp.topic, partition=tp.partition) for tp in partitions or ()]
    r = transport.call("ElectLeaders", pb.ElectLeadersRequest(election_type=ELECTION_TYPES[election_type],
                                                            partitions=refs), timeout_s=transport.deadline_s(None))
    return {TopicPartition(x.topic, x.partition): error_from_item(x.error) for x in r.results}
