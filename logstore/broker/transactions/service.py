"""The transactions of the broker: a thin adapter over :mod:`logstore.broker.transactions.coordinator`.

:class:`Transactions` is a part the broker composes (:class:`logstore.broker.service.Broker`
builds it with its collaborators as constructor arguments and registers its RPCs). It
owns the :class:`~logstore.broker.transactions.coordinator.TransactionCoordinator`
(its state in ``__transaction_state``, see
:mod:`logstore.broker.transactions.state_log`) and the partition leaders' verifier
(:mod:`logstore.broker.transactions.verifier`), which the broker hands to its data plane;
gives the coordinator the marker writer
(one fsynced COMMIT/ABORT marker per partition, then the partition's waiting
fetches are woken; on a cluster on each partition's leader, see
:mod:`logstore.broker.txn_markers`), and translates the transaction RPCs (InitProducerId,
AddPartitionsToTxn, EndTxn, EndTxnGroup, DescribeTxnGroup) between protobuf
and coordinator calls. Coordinator calls that write run on the I/O pool.

Errors: a coordinator's :class:`~logstore.errors.LogstoreError` is the
answer's ``error``; anything else fails the call (the gate's ``guard``).

Thread-safety: handlers run on the event loop; the marker writer runs on the
I/O pool (the coordinator's caller) and wakes fetches through the loop.
"""

from __future__ import annotations

import asyncio
import functools
from collections.abc import Awaitable, Callable, Iterable
from typing import TYPE_CHECKING, Any

import grpc

from logstore._proto import logstore_pb2 as pb
from logstore.broker.coordinator_shards import CoordinatorShards, RegisterCoordinator
from logstore.broker.internal_log import InternalReplication
from logstore.broker.peers import peer_credentials, peer_session
from logstore.broker.rpc_errors import error_to_pb
from logstore.broker.transactions.coordinator import TransactionCoordinator, TxnRef
from logstore.broker.transactions.state_log import TopicTxnStateLog
from logstore.broker.transactions.verifier import TxnVerifier
from logstore.broker.txn_markers import MarkerRpcs, MarkerSender
from logstore.defaults import RECONNECT_OPTIONS
from logstore.errors import LogstoreError
from logstore.naming import validate_transactional_id
from logstore.storage.log_manager import LogManager

if TYPE_CHECKING:
    from logstore.broker.config import BrokerConfig
    from logstore.broker.membership import ClusterMembership
    from logstore.broker.rpc_gate import RpcGate
    from logstore.broker.security.authorization import Authorization
    from replication.link_auth import LinkSession

__all__ = ["Transactions"]


# A peer broker that restarts answers again within a second: retry its connection at most 1 s
# apart (gRPC's default backoff grows to 120 s, and a leader's transaction check and the
# coordinator's markers wait on this channel), on a subchannel of this channel's own.
_PEER_CHANNEL_OPTIONS = [
    *RECONNECT_OPTIONS,
    ("grpc.use_local_subchannel_pool", 1),
]


class Transactions:
    """The transactions of the broker: the transaction coordinator, its state log, shards and
    marker writer, the partition leaders' verifier, and the transaction RPCs; see the module
    docstring.

    Collaborators: the broker's ``config`` and log ``manager`` (``__transaction_state`` is one
    of its topics); ``cluster``, where partitions are led and who the other brokers are (on a
    cluster, also where blocks of producer ids come from); ``markers``, the leader's side of a
    marker (:class:`~logstore.broker.txn_markers.MarkerRpcs`); ``register_coordinator``, which
    serves the shards of ``__transaction_state`` on a cluster
    (:class:`~logstore.broker.coordinator_shards.RegisterCoordinator`); ``loop()``, the broker's
    event loop once it started (None before); ``authorization``
    (:class:`~logstore.broker.security.authorization.Authorization`) for the checks the gate
    does not make: some topic writable, a prefixed transactional id, and the producer id to
    hand an idempotent producer; the ``gate`` every handler runs through, whose ``run_io`` also runs
    the coordinator's file work.

    The broker calls :meth:`start` before it serves and :meth:`stop` when it stops.
    """

    def __init__(self, config: BrokerConfig, manager: LogManager, *, cluster: ClusterMembership,
                 markers: MarkerRpcs, register_coordinator: RegisterCoordinator,
                 loop: Callable[[], asyncio.AbstractEventLoop | None],
                 authorization: Authorization, gate: RpcGate) -> None:
        self._config = config
        self._manager = manager
        self._cluster = cluster
        self._markers = markers
        self._register_coordinator = register_coordinator
        self._loop = loop
        self._authorization = authorization
        self._gate = gate
        self.txn_state = TopicTxnStateLog(manager, partitions=config.transaction_state_num_partitions)
        self.coordinator = TransactionCoordinator(
            config.data_dir, write_markers=self._write_markers, state=self.txn_state,
        )
        # Which transactional ids this broker coordinates: the __transaction_state partitions it leads.
        self.shards = CoordinatorShards(self.coordinator, run_io=gate.run_io, node_id=config.node_id)
        self._marker_sender: MarkerSender | None = None
        self._markers_on_leaders = False  # a cluster's markers go to each partition's leader (start)
        self._peer_channels: dict[int, tuple[str, grpc.aio.Channel, LinkSession | None]] = {}
        # A partition leader's question to the coordinator of another broker (KIP-890).
        self.verifier = TxnVerifier(config.node_id, coordinator=self.coordinator,
                                    view=lambda: cluster.view, partition_of=self.txn_state.partition_of,
                                    channel_for=self._peer_channel, run_io=gate.run_io)

    def rpcs(self) -> dict[str, Callable[..., Awaitable[Any]]]:
        """The RPCs this part implements, by name."""
        return {"InitProducerId": self.InitProducerId, "AddPartitionsToTxn": self.AddPartitionsToTxn,
                "EndTxn": self.EndTxn, "EndTxnGroup": self.EndTxnGroup, "DescribeTxnGroup": self.DescribeTxnGroup}

    async def start(self, cluster: InternalReplication | None) -> None:
        """Single broker: load every state partition now. Cluster: ``__transaction_state`` is a
        replicated cluster topic; its partitions load as this broker comes to lead them, so a
        transaction coordinator moves with that leadership (and finishes what the log decided)."""
        if cluster is None:
            self.coordinator.producer_id_floor = self._manager.producer_id_floor  # never reissue an id
            await self._gate.run_io(self.coordinator.startup)
            return
        # Other brokers coordinate transactions too: producer ids come in blocks unique across
        # the cluster, and markers go to each partition's leader, wherever it is.
        self.coordinator.coordinated_elsewhere = True
        self.coordinator.pid_blocks = self._cluster.producer_id_block
        self._markers_on_leaders = True
        await self._gate.run_io(functools.partial(self.coordinator.startup, load=False))
        self.txn_state.use_cluster(cluster)
        self._register_coordinator(self.shards, partitions=self._config.transaction_state_num_partitions,
                                   replication_factor=self._config.offsets_topic_replication_factor,
                                   configs={"cleanup.policy": "compact"})

    async def stop(self) -> None:
        """Close the channels the marker sender opened to other brokers."""
        channels, self._peer_channels = self._peer_channels, {}
        for _, channel, _ in channels.values():
            await channel.close()

    def _sender(self) -> MarkerSender | None:
        """The cluster's marker sender, once the broker has joined (None before: markers wait)."""
        loop = self._loop()
        if self._marker_sender is None and self._cluster.replicas is not None and loop is not None:
            self._marker_sender = MarkerSender(
                self._config.node_id, view=lambda: self._cluster.view,
                local=lambda t, p, pid, epoch, commit, coordinator_epoch: self._markers.append_marker_here(
                    self._cluster.leader(t, p), pid, epoch, commit, coordinator_epoch),
                replicated=lambda t, p: self._markers.marker_replicated(t, p, 2.0),
                channel_for=self._peer_channel, loop=loop)
        return self._marker_sender

    def _peer_channel(self, node_id: int) -> tuple[grpc.aio.Channel, LinkSession | None] | None:
        """A channel to broker ``node_id`` made as the replication links make theirs (TLS with the
        peers' CA and this broker's certificate; a SCRAM session of the inter-broker user on a SASL
        cluster), kept until the broker's address changes. Event loop only."""
        view = self._cluster.view
        broker = None if view is None else view.brokers.get(node_id)
        if broker is None:
            return None
        address = self._config.peer_address_overrides().get(node_id, broker.address)
        known = self._peer_channels.get(node_id)
        if known is not None and known[0] == address:
            return known[1], known[2]
        if known is not None:
            asyncio.ensure_future(known[1].close())
        session, credentials = peer_session(self._config), peer_credentials(self._config)
        channel = (grpc.aio.secure_channel(address, credentials, options=_PEER_CHANNEL_OPTIONS)
                   if credentials is not None else grpc.aio.insecure_channel(address, options=_PEER_CHANNEL_OPTIONS))
        self._peer_channels[node_id] = (address, channel, session)
        return channel, session

    def _write_markers(self, partitions: Iterable[tuple[str, int]], producer_id: int, producer_epoch: int,
                       commit: bool, coordinator_epoch: int) -> list[tuple[str, int]]:
        """The coordinator's marker writer; returns the partitions whose marker did not land.

        A single broker: one fsynced marker per partition, then wake fetches. A cluster: on
        each partition's leader, wherever it is (:class:`~logstore.broker.txn_markers.MarkerSender`);
        before the broker has joined, none lands (the coordinator retries them later)."""
        if self._markers_on_leaders:
            sender = self._sender()
            return list(partitions) if sender is None else sender.write(partitions, producer_id, producer_epoch,
                                                                         commit, coordinator_epoch)
        for topic, partition in partitions:
            try:
                part = self._cluster.leader(topic, partition)
            except LogstoreError:
                continue  # the topic was deleted while the transaction was open
            self._markers.append_marker_here(part, producer_id, producer_epoch, commit, coordinator_epoch)
        return []

    async def InitProducerId(self, request: pb.InitProducerIdRequest, context: grpc.aio.ServicerContext) -> pb.InitProducerIdResponse:
        async def body() -> pb.InitProducerIdResponse:
            principal = self._gate.principal(context)
            if request.transactional_id:
                validate_transactional_id(request.transactional_id)
                self._gate.check(principal, "WRITE", "TRANSACTIONAL_ID", request.transactional_id)
            elif not (self._gate.allowed(principal, "IDEMPOTENT_WRITE", "CLUSTER", "kafka-cluster")
                      or self._authorization.allowed_some_topic(principal, "WRITE")):
                self._gate.check(principal, "IDEMPOTENT_WRITE", "CLUSTER")
            try:
                current = ((request.producer_id, request.producer_epoch)
                           if request.HasField("producer_id") and request.HasField("producer_epoch") else None)
                pid, epoch = await self._gate.run_io(lambda: self.coordinator.init_producer_id(
                    request.transactional_id, timeout_ms=request.transaction_timeout_ms or 60_000,
                    current=current))
            except LogstoreError as e:
                return pb.InitProducerIdResponse(error=error_to_pb(e), producer_id=-1, producer_epoch=-1)
            if not request.transactional_id:
                pid = self._authorization.issue_producer_id(pid, principal)
            return pb.InitProducerIdResponse(producer_id=pid, producer_epoch=epoch)
        return await self._gate.guard("InitProducerId", context, body)

    async def AddPartitionsToTxn(self, request: pb.AddPartitionsToTxnRequest, context: grpc.aio.ServicerContext) -> pb.AddPartitionsToTxnResponse:
        async def body() -> pb.AddPartitionsToTxnResponse:
            principal = self._gate.principal(context)
            if request.verify_only:  # a partition leader's question (verifier.py): brokers only
                self._gate.check(principal, "CLUSTER_ACTION", "CLUSTER")
                try:
                    await self._gate.run_io(lambda: self.coordinator.verify_member(
                        request.transactional_id, request.producer_id, request.producer_epoch,
                        [(p.topic, p.partition) for p in request.partitions]))
                except LogstoreError as e:
                    return pb.AddPartitionsToTxnResponse(error=error_to_pb(e))
                return pb.AddPartitionsToTxnResponse()
            self._gate.check(principal, "WRITE", "TRANSACTIONAL_ID", request.transactional_id)
            self._gate.check_topics(principal, "WRITE", (p.topic for p in request.partitions))
            try:
                for p in request.partitions:
                    self._cluster.check_partition_known(p.topic, p.partition)  # must exist
                number = await self._gate.run_io(lambda: self.coordinator.add_partitions(
                    request.transactional_id, request.producer_id, request.producer_epoch,
                    [(p.topic, p.partition) for p in request.partitions]))
            except LogstoreError as e:
                return pb.AddPartitionsToTxnResponse(error=error_to_pb(e))
            return pb.AddPartitionsToTxnResponse(txn_number=number)
        return await self._gate.guard("AddPartitionsToTxn", context, body)

    async def EndTxn(self, request: pb.EndTxnRequest, context: grpc.aio.ServicerContext) -> pb.EndTxnResponse:
        async def body() -> pb.EndTxnResponse:
            self._gate.check(self._gate.principal(context), "WRITE", "TRANSACTIONAL_ID", request.transactional_id)
            try:
                await self._gate.run_io(lambda: self.coordinator.end_txn(
                    request.transactional_id, request.producer_id, request.producer_epoch,
                    request.txn_number, commit=request.commit))
            except LogstoreError as e:
                return pb.EndTxnResponse(error=error_to_pb(e))
            return pb.EndTxnResponse()
        return await self._gate.guard("EndTxn", context, body)

    async def EndTxnGroup(self, request: pb.EndTxnGroupRequest, context: grpc.aio.ServicerContext) -> pb.EndTxnGroupResponse:
        async def body() -> pb.EndTxnGroupResponse:
            principal = self._gate.principal(context)
            validate_transactional_id(request.group_id)
            for txn_id in dict.fromkeys([request.group_id, *(t.transactional_id for t in request.txns)]):
                self._gate.check(principal, "WRITE", "TRANSACTIONAL_ID", txn_id)
            if request.abort_prefix:
                self._authorization.check_prefix(principal, "WRITE", "TRANSACTIONAL_ID", request.abort_prefix)
            refs = [TxnRef(t.transactional_id, t.producer_id, t.producer_epoch, t.txn_number) for t in request.txns]
            try:
                committed = await self._gate.run_io(lambda: self.coordinator.end_group(
                    request.group_id, request.batch_id, refs, abort_prefix=request.abort_prefix,
                    commit=request.commit))
            except LogstoreError as e:
                return pb.EndTxnGroupResponse(error=error_to_pb(e), last_committed_batch_id=-1)
            return pb.EndTxnGroupResponse(
                committed=committed,
                last_committed_batch_id=self.coordinator.last_committed_batch(request.group_id))
        return await self._gate.guard("EndTxnGroup", context, body)

    async def DescribeTxnGroup(self, request: pb.DescribeTxnGroupRequest, context: grpc.aio.ServicerContext) -> pb.DescribeTxnGroupResponse:
        async def body() -> pb.DescribeTxnGroupResponse:
            self._gate.check(self._gate.principal(context), "DESCRIBE", "TRANSACTIONAL_ID", request.group_id)
            try:
                last = self.coordinator.last_committed_batch(request.group_id)
            except LogstoreError as e:  # not its coordinator (any more)
                return pb.DescribeTxnGroupResponse(error=error_to_pb(e), last_committed_batch_id=-1)
            return pb.DescribeTxnGroupResponse(last_committed_batch_id=last)
        return await self._gate.guard("DescribeTxnGroup", context, body)
