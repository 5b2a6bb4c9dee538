"""A cluster of replica managers in one process, driven step by step (no etcd, no sockets).

Each node is a real :class:`~logstore.storage.log_manager.LogManager` on its own
temp data directory and a real :class:`~replication.replica_manager.ReplicaManager`,
whose followers' fetches are served as a broker serves them: by the data plane's fetch
path (:class:`ReplicaServing`); nodes reach each other through an :class:`~replication.links.InProcessNetwork`
(whose links a test can cut). The cluster's metadata is a hand-made
:class:`~replication.state.ClusterView` that the test changes (the controller's
part: create a topic, elect a leader); ``alter_isr`` is a compare-and-swap on
that view's revisions, as the etcd store does it. Fetchers run only when the
test says (:meth:`StepCluster.replicate`), so every scenario is deterministic.
"""

from __future__ import annotations

import asyncio
import dataclasses
import time
from collections.abc import Iterable
from typing import Any

import grpc
import pyarrow as pa

from logstore._proto import logstore_pb2 as pb
from logstore.broker.data_plane import FetchParams, PartitionRead
from logstore.broker.data_plane.fetch import FetchPath
from logstore.broker.data_plane.waiters import PartitionWaiters
from logstore.broker.data_plane_pb import fetch_params_from_pb, reads_to_pb
from logstore.record import build_batch, encode_batch, encode_schema, untyped_schema
from logstore.storage.config import LogConfig
from logstore.storage.log_manager import LogManager
from logstore.storage.partition import Partition
from logstore.storage.validation import validate_records
from logstore.wire import encode_fetch_response
from replication.links import FetchAnswer, GrpcLeaderLink, InProcessLink, InProcessNetwork
from replication.replica_manager import ReplicaManager
from replication.state import (
    NO_LEADER,
    BrokerRegistration,
    ClusterView,
    PartitionState,
    TopicRecord,
)

SCHEMA = untyped_schema()
LAG_MS = 2_000


async def run_io(fn: Any, *args: Any) -> Any:
    return await asyncio.get_running_loop().run_in_executor(None, fn, *args)


class FakeClock:
    """Monotonic seconds, moved by hand (ISR lag decisions)."""

    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now

    def advance_ms(self, ms: float) -> None:
        self.now += ms / 1000


def producer_records(values: Iterable[bytes], *, producer_id: int = -1, producer_epoch: int = -1,
                     base_sequence: int = -1, transactional: bool = False) -> bytes:
    """A producer's request records: the schema message, then one batch of ``values``."""
    values = list(values)
    batch = build_batch(SCHEMA, values=values, timestamps_ms=[1_000 + i for i in range(len(values))])
    encoded = encode_batch(batch, base_offset=0, producer_id=producer_id, producer_epoch=producer_epoch,
                           base_sequence=base_sequence, attributes=1 if transactional else 0)
    return encode_schema(SCHEMA) + encoded.to_bytes()


def append_records(part: Partition, data: bytes) -> tuple[int, int]:
    """Validate and append a producer's records as the broker does; (base offset, end offset)."""
    valid = validate_records(data, log_schema=part.log.schema, max_message_bytes=1 << 20,
                             max_decompressed_bytes=1 << 24, where="test produce")
    base = -1
    for stored, batch in valid.batches:
        b, _ = part.append(stored, batch, valid.schema, fsync=False)
        base = b if base < 0 else base
    return base, part.log.log_end_offset


class ReplicaServing:
    """A node's leader side, wired as :class:`~logstore.broker.service.Broker` wires it: a follower's
    Fetch goes through the data plane's fetch path (the consumers' path too), which asks ``rm``
    for the partition and records the follower's progress; ``waiters`` is woken by ``rm``."""

    def __init__(self, manager: LogManager, waiters: PartitionWaiters) -> None:
        self.manager = manager
        self.waiters = waiters
        self.rm: ReplicaManager | None = None

    def attach(self, rm: ReplicaManager) -> None:
        self.rm = rm
        self.fetches = FetchPath(
            waiters=self.waiters, leader=rm.leader_partition,
            replica_partition=lambda f, t, p, o, e, first: rm.replica_partition(f, t, p, o, e, record=first),
            exists=self.manager.hosts,
            run_io=run_io, max_reply_bytes=64 << 20)

    async def fetch(self, params: FetchParams) -> list[PartitionRead]:
        return await self.fetches.fetch_records(params)

    async def serve_replica_fetch(self, request: pb.FetchRequest) -> FetchAnswer:
        return reads_to_pb(await self.fetches.fetch_records(fetch_params_from_pb(request)))

    def end_offsets_for_epochs(self, request: pb.OffsetsForLeaderEpochRequest) -> pb.OffsetsForLeaderEpochResponse:
        assert self.rm is not None
        return self.rm.end_offsets_for_epochs(request)


async def serve_replica_rpcs(serving: ReplicaServing) -> tuple[grpc.aio.Server, int]:
    """A gRPC server on a free loopback port answering replica Fetch and OffsetsForLeaderEpoch
    with ``serving`` at the broker's method paths (Fetch's answer in wire form, as the broker's)."""

    async def fetch(data: bytes, context: grpc.aio.ServicerContext) -> bytes:
        return encode_fetch_response(await serving.serve_replica_fetch(pb.FetchRequest.FromString(data)))

    async def epochs(request: pb.OffsetsForLeaderEpochRequest,
                     context: grpc.aio.ServicerContext) -> pb.OffsetsForLeaderEpochResponse:
        return serving.end_offsets_for_epochs(request)

    server = grpc.aio.server()
    server.add_generic_rpc_handlers((grpc.method_handlers_generic_handler("logstore.v1.Logstore", {
        "Fetch": grpc.unary_unary_rpc_method_handler(fetch),
        "OffsetsForLeaderEpoch": grpc.unary_unary_rpc_method_handler(
            epochs, request_deserializer=pb.OffsetsForLeaderEpochRequest.FromString,
            response_serializer=pb.OffsetsForLeaderEpochResponse.SerializeToString),
    }),))
    port = server.add_insecure_port("127.0.0.1:0")
    await server.start()
    return server, port


class CountingLink:
    """An in-process link that remembers the OffsetsForLeaderEpoch requests sent through it."""

    def __init__(self, link: InProcessLink) -> None:
        self.link = link
        self.epoch_requests: list[pb.OffsetsForLeaderEpochRequest] = []

    async def fetch(self, request: pb.FetchRequest) -> FetchAnswer:
        return await self.link.fetch(request)

    async def offsets_for_leader_epoch(
        self, request: pb.OffsetsForLeaderEpochRequest
    ) -> pb.OffsetsForLeaderEpochResponse:
        self.epoch_requests.append(request)
        return await self.link.offsets_for_leader_epoch(request)

    async def close(self) -> None:
        await self.link.close()


class Node:
    def __init__(self, cluster: StepCluster, node_id: int) -> None:
        self.cluster = cluster
        self.node_id = node_id
        self.data_dir = str(cluster.tmp_path / f"node{node_id}")
        self.manager: LogManager | None = None
        self.rm: ReplicaManager | None = None
        self.serving: ReplicaServing | None = None
        self.server: grpc.aio.Server | None = None

    async def start(self) -> None:
        self.manager = LogManager(self.data_dir, topic_defaults=LogConfig())
        await run_io(self.manager.startup)
        c = self.cluster
        link_for: Any = (
            (lambda broker: GrpcLeaderLink(broker.address)) if c.live
            else (lambda broker: c.record_link(c.network.link(self.node_id, broker.node_id)))
        )
        waiters = PartitionWaiters()

        def hwm_moved(topic: str, p: int) -> None:
            c.hwm_events.append((self.node_id, topic, p))
            waiters.wake(topic, p)
        self.serving = ReplicaServing(self.manager, waiters)
        self.rm = ReplicaManager(
            self.node_id, self.manager, run_io=run_io, link_for=link_for,
            alter_isr=c.alter_isr, on_high_watermark=hwm_moved, wake_fetches=waiters.wake,
            replica_lag_time_max_ms=LAG_MS, replica_fetch_wait_max_ms=500 if c.live else 0,
            clock=time.monotonic if c.live else c.clock, start_fetchers=c.live,
        )
        self.serving.attach(self.rm)
        c.network.register(self.node_id, self.serving)
        if c.live:
            self.server, port = await serve_replica_rpcs(self.serving)
            brokers = {**c.view.brokers, self.node_id: BrokerRegistration(self.node_id, "127.0.0.1", port)}
            c.view = dataclasses.replace(c.view, brokers=brokers)
        await self.rm.apply(c.view)

    async def stop(self) -> None:
        """A clean stop (the files stay; :meth:`start` opens them again)."""
        assert self.rm is not None and self.manager is not None
        self.cluster.network.unregister(self.node_id)
        if self.server is not None:
            await self.server.stop(0)
            self.server = None
        await self.rm.close()
        await run_io(self.manager.shutdown)
        self.rm = self.manager = None
        self.serving = None

    @property
    def running(self) -> bool:
        return self.rm is not None

    def partition(self, topic: str, p: int = 0) -> Partition:
        assert self.manager is not None
        return self.manager.partition(topic, p)


class StepCluster:
    """``live``: fetcher tasks run by themselves over gRPC links (real time) instead of
    being stepped over in-process links."""

    def __init__(self, tmp_path: Any, n: int = 3, *, live: bool = False) -> None:
        self.tmp_path = tmp_path
        self.live = live
        self.clock = FakeClock()
        self.network = InProcessNetwork()
        self.hwm_events: list[tuple[int, str, int]] = []
        self.revision = 1
        brokers = {i: BrokerRegistration(i, "127.0.0.1", 9000 + i) for i in range(1, n + 1)}
        self.view = ClusterView(revision=1, brokers=brokers, topics={}, partitions={})
        self.nodes = {i: Node(self, i) for i in brokers}
        self.alter_calls: list[tuple[int, tuple[int, ...]]] = []
        self.links: list[CountingLink] = []

    def record_link(self, link: InProcessLink) -> CountingLink:
        counting = CountingLink(link)
        self.links.append(counting)
        return counting

    def epoch_requests(self, source: int) -> list[pb.OffsetsForLeaderEpochRequest]:
        """The OffsetsForLeaderEpoch requests node ``source`` sent, in order."""
        return [r for link in self.links if link.link.source == source for r in link.epoch_requests]

    async def start(self) -> None:
        for node in self.nodes.values():
            await node.start()

    async def close(self) -> None:
        for node in self.nodes.values():
            if node.running:
                await node.stop()

    def rm(self, node_id: int) -> ReplicaManager:
        rm = self.nodes[node_id].rm
        assert rm is not None
        return rm

    def serving(self, node_id: int) -> ReplicaServing:
        serving = self.nodes[node_id].serving
        assert serving is not None
        return serving

    # ------------------------------------------------------------------ the controller's part

    def _bump(self) -> int:
        self.revision += 1
        return self.revision

    def _set_state(self, state: PartitionState) -> PartitionState:
        state = dataclasses.replace(state, revision=self._bump())
        parts = dict(self.view.partitions)
        parts[(state.topic, state.partition)] = state
        self.view = dataclasses.replace(self.view, partitions=parts, revision=self.revision)
        return state

    async def apply(self, *node_ids: int) -> None:
        """Send the current view to ``node_ids`` (default: every running node)."""
        for i in node_ids or tuple(self.nodes):
            if self.nodes[i].running:
                await self.rm(i).apply(self.view)

    async def create_topic(self, name: str, *, replicas: tuple[int, ...] = (1, 2, 3), min_isr: int = 2,
                           partitions: int = 1) -> None:
        record = TopicRecord(name, f"id-{name}", partitions, len(replicas),
                             {"min.insync.replicas": str(min_isr)})
        self.view = dataclasses.replace(self.view, topics={**self.view.topics, name: record})
        for p in range(partitions):
            self._set_state(PartitionState(name, p, replicas, replicas[0], 0, replicas))
        await self.apply()

    def state(self, topic: str, p: int = 0) -> PartitionState:
        return self.view.partitions[(topic, p)]

    async def elect(self, topic: str, leader: int, *, isr: tuple[int, ...] | None = None, p: int = 0,
                    apply_to: tuple[int, ...] = ()) -> PartitionState:
        """The controller elects ``leader`` (leader epoch + 1); the view goes to ``apply_to``
        (default: every running node)."""
        current = self.state(topic, p)
        new = self._set_state(current.with_leader(leader, current.isr if isr is None else isr))
        await self.apply(*apply_to)
        return new

    async def offline(self, topic: str, p: int = 0) -> None:
        current = self.state(topic, p)
        self._set_state(dataclasses.replace(current.with_leader(NO_LEADER, current.isr)))
        await self.apply()

    async def alter_isr(self, state: PartitionState, isr: tuple[int, ...]) -> PartitionState | None:
        """AlterPartition as a compare-and-swap on the view (the etcd store's job)."""
        self.alter_calls.append((state.leader, isr))
        current = self.state(state.topic, state.partition)
        if current.revision != state.revision:
            return None
        return self._set_state(state.with_isr(isr))

    # ------------------------------------------------------------------ data

    async def produce(self, node_id: int, topic: str, values: Iterable[bytes], *, p: int = 0, acks: int = -1,
                      epoch: int = -1, timeout_s: float = 5.0, replicate: bool = True,
                      **producer: Any) -> int:
        """Produce through ``node_id`` as the broker does; for acks=all run replication rounds
        until acknowledged (when ``replicate``). Returns the base offset."""
        rm = self.rm(node_id)
        part = rm.leader_partition(topic, p, epoch)
        if acks == -1:
            rm.check_enough_replicas(topic, p)
        base, end = await run_io(append_records, part, producer_records(values, **producer))
        if acks != -1:
            return int(base)
        waiting = asyncio.ensure_future(rm.wait_replicated(topic, p, end, timeout_s))
        for _ in range(10):
            if waiting.done() or not replicate:
                break
            await self.replicate()
        await waiting
        return int(base)

    async def replicate(self, rounds: int = 1, *, nodes: tuple[int, ...] = ()) -> None:
        """Every running node's fetchers do ``rounds`` rounds (truncate, fetch)."""
        for _ in range(rounds):
            for i in nodes or tuple(self.nodes):
                if self.nodes[i].running:
                    await self.rm(i).replicate_once()
            await asyncio.sleep(0)

    def batches(self, node_id: int, topic: str, p: int = 0, *, below: int | None = None) -> list[bytes]:
        """The stored batch messages of a replica (below offset ``below``), as bytes."""
        part = self.nodes[node_id].partition(topic, p)
        out = []
        for seg in part.log.segments:
            for b in seg.iter_batches():
                if below is None or b.header.base_offset < below:
                    out.append(bytes(b.data))
        return out

    def values(self, node_id: int, topic: str, p: int = 0) -> list[tuple[int, bytes]]:
        """(offset, value) of every record in a replica's log."""
        part = self.nodes[node_id].partition(topic, p)
        out: list[tuple[int, bytes]] = []
        offset = part.log.log_start_offset
        while offset < part.log.log_end_offset:
            got = part.log.read(offset, max_bytes=1 << 20)
            for batch in got.decode(include_control=True):
                out.extend(zip(batch.column(0).to_pylist(), batch.column("value").to_pylist(), strict=True))
            offset = got.next_offset
        return out

    def assert_identical_below_hwm(self, topic: str, p: int = 0, *, nodes: tuple[int, ...] = ()) -> int:
        """Every running replica (or ``nodes``) holds the same batch bytes below the leader's HWM."""
        leader = self.state(topic, p).leader
        hwm = self.nodes[leader].partition(topic, p).high_watermark
        reference = self.batches(leader, topic, p, below=hwm)
        for i in nodes or tuple(self.nodes):
            if self.nodes[i].running:
                assert self.batches(i, topic, p, below=hwm) == reference, f"node {i} differs below HWM {hwm}"
        return hwm


def values_of(data: list[tuple[int, bytes]]) -> list[bytes]:
    return [v for _, v in data]


def as_table(batches: list[pa.RecordBatch]) -> pa.Table:
    return pa.Table.from_batches(batches)
