"""The reassignment and leader-election RPCs: AlterPartitionReassignments,
ListPartitionReassignments, ElectLeaders.

:class:`ReassignRpcs` is a handler the broker composes (its collaborators are constructor
arguments: the cluster membership and the :class:`~logstore.broker.rpc_gate.RpcGate`). Any broker
of a cluster answers: each handler turns the request into partition states
(:mod:`replication.reassignment`) written to etcd by a compare-and-swap on the partition's
revision (retried a few times when a leader's ISR change raced in); the controller and the
replica managers do the rest (copy, ISR, leadership, deletion of the old copies). The handler
answers once its own view has the written state, so a ``list`` right after sees it. A single
broker has no replicas to move: INVALID_REQUEST ("needs a cluster").

Authorization: the three RPCs are cluster operations (ALTER / DESCRIBE on the cluster),
checked before the handler by ``guard_cluster_rpcs``.

Progress (ListPartitionReassignments): the partition's leader knows its log's size and each
follower's log end offset; it reports ``bytes_total`` = its log's bytes and ``bytes_copied``
= the bytes up to the slowest adding replica's log end offset (proportional to the records,
segment sizes being what they are). Other brokers answer ``progress_known`` false and
``leader``: the admin client asks the leader (:meth:`logstore.client.admin.Admin.list_partition_reassignments`).

Thread-safety: handlers run on the event loop.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from typing import TYPE_CHECKING, Any

import grpc

from logstore._proto import logstore_pb2 as pb
from logstore.broker.rpc_errors import OK, error_to_pb
from logstore.errors import (
    InvalidRequestError,
    LogstoreError,
    MetadataStoreError,
    UnknownTopicOrPartitionError,
)
from replication.reassignment import elect_preferred, elect_unclean, start_reassignment
from replication.state import ClusterView, PartitionState

if TYPE_CHECKING:
    from logstore.broker.membership import ClusterMembership
    from logstore.broker.rpc_gate import RpcGate
    from replication.metadata_store import MetadataStore

__all__ = ["ReassignRpcs"]

_CAS_ATTEMPTS = 5


class ReassignRpcs:
    """Partition reassignment and leader elections; see the module docstring."""

    def __init__(self, *, cluster: ClusterMembership, gate: RpcGate) -> None:
        self._cluster = cluster
        self._gate = gate

    def rpcs(self) -> dict[str, Callable[..., Awaitable[Any]]]:
        """The RPCs this handler implements, by name."""
        return {"AlterPartitionReassignments": self.AlterPartitionReassignments,
                "ListPartitionReassignments": self.ListPartitionReassignments,
                "ElectLeaders": self.ElectLeaders}

    def _cluster_store(self, what: str) -> MetadataStore:
        if self._cluster.store is None or self._cluster.view is None:
            raise InvalidRequestError(f"{what} needs a cluster: this broker runs alone (no metadata configured)")
        return self._cluster.store

    async def _change_partition(self, topic: str, partition: int,
                                change: Callable[[PartitionState, ClusterView], PartitionState]) -> PartitionState:
        """Apply ``change`` to the partition as this broker's view has it and write it by CAS; on
        a lost race (the view was behind, or a leader's ISR change raced in) read etcd's newest
        view and try again. Returns the written state."""
        store = self._cluster_store("this request")
        for attempt in range(_CAS_ATTEMPTS):
            view = self._cluster.view if attempt == 0 and self._cluster.view is not None else await store.view()
            state = view.partitions.get((topic, partition))
            if state is None:
                raise UnknownTopicOrPartitionError(f"unknown partition {topic}-{partition}")
            new = change(state, view)
            if await store.put_partition(new, expected_revision=state.revision):
                return new
        raise MetadataStoreError(f"{topic}-{partition} kept changing under the request; try again")

    async def _await_written(self, written: list[PartitionState]) -> None:
        def seen(v: ClusterView) -> bool:
            return all((s := v.partitions.get((w.topic, w.partition))) is not None
                       and s.partition_epoch >= w.partition_epoch for w in written)
        if written:
            await self._cluster.wait_for_view(seen)

    async def AlterPartitionReassignments(self, request: pb.AlterPartitionReassignmentsRequest,
                                          context: grpc.aio.ServicerContext) -> pb.AlterPartitionReassignmentsResponse:
        async def body() -> pb.AlterPartitionReassignmentsResponse:
            self._cluster_store("AlterPartitionReassignments")
            results, written = [], []
            for item in request.partitions:
                def change(s: PartitionState, v: ClusterView, item: Any = item) -> PartitionState:
                    return start_reassignment(s, list(item.replicas), brokers=v.brokers,
                                              throttle=request.throttle_bytes_per_sec)
                try:
                    written.append(await self._change_partition(item.topic, item.partition, change))
                    err = OK
                except LogstoreError as e:
                    err = error_to_pb(e)
                results.append(pb.TopicPartitionError(topic=item.topic, partition=item.partition, error=err))
            await self._await_written(written)
            return pb.AlterPartitionReassignmentsResponse(results=results)
        return await self._gate.guard("AlterPartitionReassignments", context, body)

    async def ListPartitionReassignments(self, request: pb.ListPartitionReassignmentsRequest,
                                         context: grpc.aio.ServicerContext) -> pb.ListPartitionReassignmentsResponse:
        async def body() -> pb.ListPartitionReassignmentsResponse:
            self._cluster_store("ListPartitionReassignments")
            view = self._cluster.view
            assert view is not None
            wanted = set(request.topics)
            led = {(r["topic"], r["partition"]): r for r in (self._cluster.replicas.describe() if self._cluster.replicas else [])
                   if r["role"] == "leader"}
            out, throttle = [], 0
            for key, s in sorted(view.partitions.items()):
                if not s.reassigning or (wanted and s.topic not in wanted):
                    continue
                throttle = max(throttle, s.throttle)
                entry = pb.OngoingReassignment(
                    topic=s.topic, partition=s.partition, replicas=s.replicas, adding_replicas=s.adding,
                    removing_replicas=s.removing, target_replicas=s.target, leader=s.leader)
                row = led.get(key)
                if row is not None:
                    entry.bytes_total, entry.bytes_copied = self._progress(s, row)
                    entry.progress_known = True
                out.append(entry)
            return pb.ListPartitionReassignmentsResponse(reassignments=out, throttle_bytes_per_sec=throttle)
        return await self._gate.guard("ListPartitionReassignments", context, body)

    def _progress(self, state: PartitionState, row: dict[str, Any]) -> tuple[int, int]:
        """(bytes_total, bytes_copied of the slowest adding replica) from the leader's own replica."""
        assert self._cluster.replicas is not None
        size = self._cluster.replicas.manager.partition(state.topic, state.partition).log.size_bytes
        leo = int(row["log_end_offset"])
        followers = row.get("followers", {})
        copied = [int(followers[r]["log_end_offset"]) if r in followers else 0 for r in state.adding]
        slowest = max(min(copied), 0) if copied else leo
        return size, (size if leo <= 0 else size * min(slowest, leo) // leo)

    async def ElectLeaders(self, request: pb.ElectLeadersRequest,
                           context: grpc.aio.ServicerContext) -> pb.ElectLeadersResponse:
        async def body() -> pb.ElectLeadersResponse:
            self._cluster_store("ElectLeaders")
            view = self._cluster.view
            assert view is not None
            keys = ([(p.topic, p.partition) for p in request.partitions] if request.partitions
                    else sorted(view.partitions))
            unclean = request.election_type == pb.UNCLEAN

            def change(s: PartitionState, v: ClusterView) -> PartitionState:
                if unclean:
                    return elect_unclean(s, alive=v.brokers)
                return elect_preferred(s, alive=v.brokers, shutting_down=v.shutting_down)

            results, written = [], []
            for topic, partition in keys:
                try:
                    written.append(await self._change_partition(topic, partition, change))
                    err = OK
                except LogstoreError as e:
                    err = error_to_pb(e)
                results.append(pb.TopicPartitionError(topic=topic, partition=partition, error=err))
            await self._await_written(written)
            return pb.ElectLeadersResponse(results=results)
        return await self._gate.guard("ElectLeaders", context, body)
