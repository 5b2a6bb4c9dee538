"""The transaction RPCs of the broker: a thin adapter over :mod:`logstore.broker.transactions.coordinator`.

:class:`TransactionService` is a mixin of :class:`logstore.broker.service.Broker`. It
owns the :class:`~logstore.broker.transactions.coordinator.TransactionCoordinator`
(its state in ``__transaction_state``, see
:mod:`logstore.broker.transactions.state_log`), gives it the marker writer
(one fsynced COMMIT/ABORT marker per partition, then the partition's waiting
fetches are woken; on a cluster on each partition's leader, see
:mod:`logstore.broker.txn_markers`), and translates the transaction RPCs (InitProducerId,
AddPartitionsToTxn, EndTxn, EndTxnGroup, DescribeTxnGroup) between protobuf
and coordinator calls. Coordinator calls that write run on the I/O pool.

Errors: a coordinator's :class:`~logstore.errors.LogstoreError` is the
answer's ``error``; anything else fails the call (the broker's ``_guard``).

Thread-safety: handlers run on the event loop; the marker writer runs on the
I/O pool (the coordinator's caller) and wakes fetches through the loop.
"""

from __future__ import annotations

import asyncio
import functools
from collections.abc import Awaitable, Callable, Iterable, Mapping
from typing import TYPE_CHECKING, Any, TypeVar

import grpc

from logstore._proto import logstore_pb2 as pb
from logstore.broker.answers import error_to_pb
from logstore.broker.coordinator_shards import CoordinatorShards
from logstore.broker.internal_log import InternalReplication
from logstore.broker.security.tls import client_credentials
from logstore.broker.transactions.coordinator import TransactionCoordinator, TxnRef
from logstore.broker.transactions.state_log import TopicTxnStateLog
from logstore.broker.transactions.verifier import TxnVerifier
from logstore.broker.txn_markers import MarkerRpcs, MarkerSender
from logstore.errors import LogstoreError
from logstore.naming import validate_transactional_id
from logstore.storage.log_manager import LogManager

if TYPE_CHECKING:
    from logstore.broker.config import BrokerConfig
    from logstore.broker.membership import ClusterMembership
    from logstore.broker.security.principal import Principal
    from replication.link_auth import LinkSession

__all__ = ["TransactionService"]

T = TypeVar("T")


# A peer broker that restarts answers again within a second: retry its connection at most 1 s
# apart (gRPC's default backoff grows to 120 s, and a leader's transaction check and the
# coordinator's markers wait on this channel), on a subchannel of this channel's own.
_PEER_CHANNEL_OPTIONS = [
    ("grpc.initial_reconnect_backoff_ms", 100),
    ("grpc.min_reconnect_backoff_ms", 100),
    ("grpc.max_reconnect_backoff_ms", 1000),
    ("grpc.use_local_subchannel_pool", 1),
]


class TransactionService:
    """The transaction RPCs (mixed into the broker); see the module docstring."""

    if TYPE_CHECKING:
        manager: LogManager
        config: BrokerConfig
        _loop: asyncio.AbstractEventLoop | None
        cluster: ClusterMembership

        async def _run(self, fn: Callable[..., T], *args: Any) -> T: ...
        def register_coordinator(self, shards: CoordinatorShards, *, partitions: int, replication_factor: int,
                                 configs: Mapping[str, str]) -> None: ...

        async def _guard(self, what: str, context: grpc.aio.ServicerContext,
                         body: Callable[[], Awaitable[T]]) -> T: ...


        markers: MarkerRpcs

        def _principal(self, context: Any) -> Principal | None: ...
        def _check(self, principal: Principal | None, operation: str, resource_type: str, name: str = ...) -> None: ...
        def _check_topics(self, principal: Principal | None, operation: str, topics: Iterable[str]) -> None: ...
        def _allowed(self, principal: Principal | None, operation: str, resource_type: str, name: str) -> bool: ...
        def _allowed_some_topic(self, principal: Principal | None, operation: str) -> bool: ...
        def _issue_producer_id(self, producer_id: int, principal: Principal | None) -> int: ...
        def _check_prefix(self, principal: Principal | None, operation: str, resource_type: str,
                          prefix: str) -> None: ...

    def _init_transactions(self) -> None:
        self.txn_state = TopicTxnStateLog(self.manager, partitions=self.config.transaction_state_num_partitions)
        self.coordinator = TransactionCoordinator(
            self.config.data_dir, write_markers=self._write_markers, state=self.txn_state,
        )
        self.coordinator.coordinated_elsewhere = self.config.clustered
        # Which transactional ids this broker coordinates: the __transaction_state partitions it leads.
        self.txn_shards = CoordinatorShards(self.coordinator, run_io=self._run, node_id=self.config.node_id)
        self._marker_sender: MarkerSender | None = None
        self._peer_channels: dict[int, tuple[str, grpc.aio.Channel, LinkSession | None]] = {}
        # A partition leader's question to the coordinator of another broker (KIP-890).
        self.txn_verifier = TxnVerifier(self.config.node_id, coordinator=self.coordinator,
                                        view=lambda: self.cluster.view, partition_of=self.txn_state.partition_of,
                                        channel_for=self._peer_channel, run_io=self._run)

    async def _start_transactions(self, cluster: InternalReplication | None) -> None:
        """Single broker: load every state partition now. Cluster: ``__transaction_state`` is a
        replicated cluster topic; its partitions load as this broker comes to lead them, so a
        transaction coordinator moves with that leadership (and finishes what the log decided)."""
        if cluster is None:
            self.coordinator.producer_id_floor = self.manager.producer_id_floor  # never reissue an id
            await self._run(self.coordinator.startup)
            return
        await self._run(functools.partial(self.coordinator.startup, load=False))
        self.txn_state.use_cluster(cluster)
        self.register_coordinator(self.txn_shards, partitions=self.config.transaction_state_num_partitions,
                                  replication_factor=self.config.offsets_topic_replication_factor,
                                  configs={"cleanup.policy": "compact"})

    async def _stop_transactions(self) -> None:
        """Close the channels the marker sender opened to other brokers."""
        channels, self._peer_channels = self._peer_channels, {}
        for _, channel, _ in channels.values():
            await channel.close()

    def _sender(self) -> MarkerSender | None:
        """The cluster's marker sender, once the broker has joined (None before: markers wait)."""
        if self._marker_sender is None and self.cluster.replicas is not None and self._loop is not None:
            self._marker_sender = MarkerSender(
                self.config.node_id, view=lambda: self.cluster.view,
                local=lambda t, p, pid, epoch, commit: self.markers.append_marker_here(
                    self.cluster.leader(t, p), pid, epoch, commit),
                replicated=lambda t, p: self.markers.marker_replicated(t, p, 2.0),
                channel_for=self._peer_channel, loop=self._loop)
        return self._marker_sender

    def _peer_channel(self, node_id: int) -> tuple[grpc.aio.Channel, LinkSession | None] | None:
        """A channel to broker ``node_id`` made as the replication links make theirs (TLS with the
        peers' CA and this broker's certificate; a SCRAM session of the inter-broker user on a SASL
        cluster), kept until the broker's address changes. Event loop only."""
        view = self.cluster.view
        broker = None if view is None else view.brokers.get(node_id)
        if broker is None:
            return None
        address = self.config.peer_address_overrides().get(node_id, broker.address)
        known = self._peer_channels.get(node_id)
        if known is not None and known[0] == address:
            return known[1], known[2]
        if known is not None:
            asyncio.ensure_future(known[1].close())
        session = None
        if self.config.sasl:
            from replication.link_auth import LinkCredentials, LinkSession

            session = LinkSession(LinkCredentials(self.config.sasl_inter_broker_mechanism,
                                                  self.config.sasl_inter_broker_username,
                                                  self.config.sasl_inter_broker_password))
        credentials = (client_credentials(self.config.peer_ca, self.config.tls_cert, self.config.tls_key)
                       if self.config.tls else None)
        channel = (grpc.aio.secure_channel(address, credentials, options=_PEER_CHANNEL_OPTIONS)
                   if credentials is not None else grpc.aio.insecure_channel(address, options=_PEER_CHANNEL_OPTIONS))
        self._peer_channels[node_id] = (address, channel, session)
        return channel, session

    def _transactional_id_of(self, producer_id: int) -> str | None:
        """The transactional id of ``producer_id`` (for the authorizer's producer check)."""
        return self.coordinator.transactional_id_of(producer_id)

    def _write_markers(self, partitions: Iterable[tuple[str, int]], producer_id: int, producer_epoch: int,
                       commit: bool) -> list[tuple[str, int]]:
        """The coordinator's marker writer; returns the partitions whose marker did not land.

        A single broker: one fsynced marker per partition, then wake fetches. A cluster: on
        each partition's leader, wherever it is (:class:`~logstore.broker.txn_markers.MarkerSender`);
        before the broker has joined, none lands (the coordinator retries them later)."""
        if self.config.clustered:
            sender = self._sender()
            return list(partitions) if sender is None else sender.write(partitions, producer_id, producer_epoch,
                                                                         commit)
        for topic, partition in partitions:
            try:
                part = self.cluster.leader(topic, partition)
            except LogstoreError:
                continue  # the topic was deleted while the transaction was open
            self.markers.append_marker_here(part, producer_id, producer_epoch, commit)
        return []

    async def InitProducerId(self, request: pb.InitProducerIdRequest, context: grpc.aio.ServicerContext) -> pb.InitProducerIdResponse:
        async def body() -> pb.InitProducerIdResponse:
            principal = self._principal(context)
            if request.transactional_id:
                validate_transactional_id(request.transactional_id)
                self._check(principal, "WRITE", "TRANSACTIONAL_ID", request.transactional_id)
            elif not (self._allowed(principal, "IDEMPOTENT_WRITE", "CLUSTER", "kafka-cluster")
                      or self._allowed_some_topic(principal, "WRITE")):
                self._check(principal, "IDEMPOTENT_WRITE", "CLUSTER")
            try:
                current = ((request.producer_id, request.producer_epoch)
                           if request.HasField("producer_id") and request.HasField("producer_epoch") else None)
                pid, epoch = await self._run(lambda: self.coordinator.init_producer_id(
                    request.transactional_id, timeout_ms=request.transaction_timeout_ms or 60_000,
                    current=current))
            except LogstoreError as e:
                return pb.InitProducerIdResponse(error=error_to_pb(e), producer_id=-1, producer_epoch=-1)
            if not request.transactional_id:
                pid = self._issue_producer_id(pid, principal)
            return pb.InitProducerIdResponse(producer_id=pid, producer_epoch=epoch)
        return await self._guard("InitProducerId", context, body)

    async def AddPartitionsToTxn(self, request: pb.AddPartitionsToTxnRequest, context: grpc.aio.ServicerContext) -> pb.AddPartitionsToTxnResponse:
        async def body() -> pb.AddPartitionsToTxnResponse:
            principal = self._principal(context)
            if request.verify_only:  # a partition leader's question (verifier.py): brokers only
                self._check(principal, "CLUSTER_ACTION", "CLUSTER")
                try:
                    await self._run(lambda: self.coordinator.verify_member(
                        request.transactional_id, request.producer_id, request.producer_epoch,
                        [(p.topic, p.partition) for p in request.partitions]))
                except LogstoreError as e:
                    return pb.AddPartitionsToTxnResponse(error=error_to_pb(e))
                return pb.AddPartitionsToTxnResponse()
            self._check(principal, "WRITE", "TRANSACTIONAL_ID", request.transactional_id)
            self._check_topics(principal, "WRITE", (p.topic for p in request.partitions))
            try:
                for p in request.partitions:
                    self.cluster.check_partition_known(p.topic, p.partition)  # must exist
                number = await self._run(lambda: self.coordinator.add_partitions(
                    request.transactional_id, request.producer_id, request.producer_epoch,
                    [(p.topic, p.partition) for p in request.partitions]))
            except LogstoreError as e:
                return pb.AddPartitionsToTxnResponse(error=error_to_pb(e))
            return pb.AddPartitionsToTxnResponse(txn_number=number)
        return await self._guard("AddPartitionsToTxn", context, body)

    async def EndTxn(self, request: pb.EndTxnRequest, context: grpc.aio.ServicerContext) -> pb.EndTxnResponse:
        async def body() -> pb.EndTxnResponse:
            self._check(self._principal(context), "WRITE", "TRANSACTIONAL_ID", request.transactional_id)
            try:
                await self._run(lambda: self.coordinator.end_txn(
                    request.transactional_id, request.producer_id, request.producer_epoch,
                    request.txn_number, commit=request.commit))
            except LogstoreError as e:
                return pb.EndTxnResponse(error=error_to_pb(e))
            return pb.EndTxnResponse()
        return await self._guard("EndTxn", context, body)

    async def EndTxnGroup(self, request: pb.EndTxnGroupRequest, context: grpc.aio.ServicerContext) -> pb.EndTxnGroupResponse:
        async def body() -> pb.EndTxnGroupResponse:
            principal = self._principal(context)
            validate_transactional_id(request.group_id)
            for txn_id in dict.fromkeys([request.group_id, *(t.transactional_id for t in request.txns)]):
                self._check(principal, "WRITE", "TRANSACTIONAL_ID", txn_id)
            if request.abort_prefix:
                self._check_prefix(principal, "WRITE", "TRANSACTIONAL_ID", request.abort_prefix)
            refs = [TxnRef(t.transactional_id, t.producer_id, t.producer_epoch, t.txn_number) for t in request.txns]
            try:
                committed = await self._run(lambda: self.coordinator.end_group(
                    request.group_id, request.batch_id, refs, abort_prefix=request.abort_prefix,
                    commit=request.commit))
            except LogstoreError as e:
                return pb.EndTxnGroupResponse(error=error_to_pb(e), last_committed_batch_id=-1)
            return pb.EndTxnGroupResponse(
                committed=committed,
                last_committed_batch_id=self.coordinator.last_committed_batch(request.group_id))
        return await self._guard("EndTxnGroup", context, body)

    async def DescribeTxnGroup(self, request: pb.DescribeTxnGroupRequest, context: grpc.aio.ServicerContext) -> pb.DescribeTxnGroupResponse:
        async def body() -> pb.DescribeTxnGroupResponse:
            self._check(self._principal(context), "DESCRIBE", "TRANSACTIONAL_ID", request.group_id)
            try:
                last = self.coordinator.last_committed_batch(request.group_id)
            except LogstoreError as e:  # not its coordinator (any more)
                return pb.DescribeTxnGroupResponse(error=error_to_pb(e), last_committed_batch_id=-1)
            return pb.DescribeTxnGroupResponse(last_committed_batch_id=last)
        return await self._guard("DescribeTxnGroup", context, body)
