"""The broker assembled: the one place that builds its parts, serves them over gRPC, and
starts and stops them.

:class:`Broker` builds the object graph from a :class:`~logstore.broker.config.BrokerConfig`;
every part gets its collaborators in its constructor and none imports another handler:

* the storage: the :class:`~logstore.storage.log_manager.LogManager` and one I/O thread pool;
* where partitions are led: :class:`~logstore.broker.membership.ClusterMembership` (joins a
  cluster when ``metadata`` is set; a single broker and a cluster are the same graph, the
  membership answering "every partition is local" for the first);
* who calls and what they may do: :class:`~logstore.broker.security.callers.Callers`,
  :class:`~logstore.broker.security.authorization.Authorization`, and the
  :class:`~logstore.broker.rpc_gate.BrokerGate` every handler is given (errors to statuses,
  the checks, the I/O pool);
* the coordinators: :class:`~logstore.broker.coordinator_service.Coordinators` (FindCoordinator,
  the coordinator topics), :class:`~logstore.broker.transactions.service.Transactions`,
  :class:`~logstore.broker.groups.service.ConsumerGroups`;
* the data plane (:class:`~logstore.broker.data_plane.DataPlane`: appends and reads for
  consumers and followers alike, no gRPC in it);
* the RPC handlers, one class per area: :class:`~logstore.broker.data_rpcs.DataRpcs`,
  topics, reassignments, compaction, markers, SCRAM, ACLs, plus the coordinators' own.

Concurrency model: one asyncio event loop runs ``grpc.aio``; every disk operation (append,
read, fsync, topic changes) runs on the bounded thread pool, so the loop never blocks and
thousands of long-polling fetches cost a future each, not a thread.

Untrusted input: every request's bytes are parsed by our handlers, not by gRPC's
deserializers (:mod:`logstore.broker.request_bounds`): bytes that are not the request
message get ``INVALID_REQUEST``, a request whose lists hold more than
``max_request_entries`` entries is refused before any work, and every RPC of the service
must have a handler (the start fails otherwise). A produce's records are checked before
anything is written (:func:`logstore.storage.validation.validate_records`).

Operations: with ``metrics_port`` set the metrics serve ``/metrics``
(:mod:`logstore.broker.metrics`); the standard gRPC health service says whether the broker
serves (:mod:`logstore.broker.health`); start-up and the command line are in
:mod:`logstore.broker.server`.

Errors: item failures travel as ``Error(code, message)``; request failures end the call with
a gRPC status and ``logstore-error-code`` trailing metadata (:mod:`logstore.broker.rpc_errors`).
An unexpected exception is logged with its traceback and reaches the client as
UNKNOWN_SERVER_ERROR with one sentence, never a traceback.

Thread-safety: handlers run on the event loop; state they share lives in the LogManager and
the logs, which have their own locks.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Awaitable, Callable
from concurrent.futures import ThreadPoolExecutor
from typing import TYPE_CHECKING, Any, TypeVar

import grpc
import pyarrow as pa

from logstore._proto import logstore_pb2 as pb
from logstore._proto import logstore_pb2_grpc as pb_grpc
from logstore.broker import request_bounds
from logstore.broker.cleaning_service import CleaningRpcs
from logstore.broker.config import BrokerConfig, kafka_listener_address
from logstore.broker.coordinator_service import Coordinators
from logstore.broker.data_plane import DataPlane
from logstore.broker.data_rpcs import DataRpcs
from logstore.broker.groups.service import ConsumerGroups
from logstore.broker.health import BrokerHealth
from logstore.broker.membership import ClusterMembership
from logstore.broker.metrics import BrokerMetrics, timed_handlers
from logstore.broker.peers import etcd_credentials, leader_links
from logstore.broker.reassign_service import ReassignRpcs
from logstore.broker.request_bounds import SERVICE, method_handlers
from logstore.broker.rpc_gate import BrokerGate
from logstore.broker.security.acl_service import AclRpcs, guard_cluster_rpcs
from logstore.broker.security.authorization import Authorization
from logstore.broker.security.callers import Callers
from logstore.broker.security.quotas import QuotaManager, throttled_handlers
from logstore.broker.security.scram_exchange import ScramExchanges
from logstore.broker.security.scram_service import ScramRpcs, cluster_credentials, local_credentials
from logstore.broker.security.tls import bind_listener, check_address_free
from logstore.broker.shutdown import ShutdownClock
from logstore.broker.topic_service import TopicRpcs
from logstore.broker.transactions.service import Transactions
from logstore.broker.txn_markers import MarkerRpcs
from logstore.storage import file_cache
from logstore.storage.log_manager import LogManager

if TYPE_CHECKING:
    from logstore.broker.kafka import KafkaListener
    from replication.metadata_store import MetadataStore

__all__ = ["Broker"]

log = logging.getLogger("logstore.broker")
T = TypeVar("T")

# Registered in wire form, not through method_handlers (ProduceStream: a stream of Produce requests).
_WIRE_RPCS = frozenset({"Produce", "ProduceStream", "Fetch"})


class Broker(pb_grpc.LogstoreServicer):
    """The broker assembled (see the module docstring); create with :meth:`start`, end with
    :meth:`stop`. The generated servicer it extends only names the service for gRPC: every
    RPC is a composed handler's."""

    def __init__(self, config: BrokerConfig) -> None:
        self.config = config
        pool = file_cache.configure(config.max_open_segment_files)
        log.info("segment file pool: %d descriptors (max_open_segment_files=%d, at most half of "
                 "RLIMIT_NOFILE)", pool, config.max_open_segment_files)
        self.manager = LogManager(config.data_dir, topic_defaults=config.topic_defaults,
                                  max_partitions=config.max_partitions_per_broker)
        self._loop: asyncio.AbstractEventLoop | None = None
        self._io = ThreadPoolExecutor(max_workers=config.io_threads, thread_name_prefix="logstore-io")
        # Where partitions are led; joins the cluster when metadata is set (logstore.broker.membership).
        self.cluster = ClusterMembership(
            config, self.manager, run_io=self._run, port=lambda: self.port, link_for=leader_links(config),
            etcd_credentials=etcd_credentials(config),
            wake=lambda topic, p: self.data_plane.wake(topic, p),
            on_view=lambda view, applied: self.coordinators.update(view, applied=applied),
            kafka_address=lambda: self._kafka_advertised() if self.kafka is not None else None)
        # RPC handlers composed from their collaborators (issue 23).
        self.callers = Callers(config)  # who calls (logstore.broker.security.callers)
        # What they may do (logstore.broker.security.authorization).
        self.authorization = Authorization(config, caller=self.callers.caller, run_io=self._run,
                                           transactional_id_of=lambda pid: self.coordinator.transactional_id_of(pid))
        self.gate = gate = BrokerGate(authorization=self.authorization, run_io=self._run, on_error=self._count_error)
        # SCRAM users: in the data dir, or in etcd where other brokers change them too.
        def store() -> MetadataStore | None:
            return self.cluster.store
        credentials = cluster_credentials(store) if config.clustered else local_credentials(config.data_dir, self._run)
        # The SCRAM server both listeners log in through (logstore.broker.security.scram_exchange).
        self.scram_exchanges = ScramExchanges(config=config, credentials=credentials)
        self.scram = ScramRpcs(  # logstore.broker.security.scram_service
            config=config, sessions=self.callers.sessions, exchanges=self.scram_exchanges, credentials=credentials,
            shared_store=store if config.clustered else None, guard=gate)
        self.acls = AclRpcs(authorization=self.authorization, guard=gate)  # logstore.broker.security.acl_service
        # FindCoordinator and the coordinator topics (logstore.broker.coordinator_service).
        self.coordinators = Coordinators(config=config, cluster=self.cluster, loop=lambda: self._loop, gate=gate)
        self.cleaning = CleaningRpcs(manager=self.manager, placement=self.cluster, io=self._io, gate=gate)
        self.markers = MarkerRpcs(placement=self.cluster, wake=lambda topic, p: self.data_plane.wake(topic, p),
                                  loop=lambda: self._loop, gate=gate,
                                  written=lambda topic, p, pid, commit: self.consumer_groups.marker_written(
                                      topic, p, pid, commit))  # a transaction's offsets: applied or dropped
        self.cluster_id = "logstore"  # a single broker's, in its Metadata answers
        self.topics = TopicRpcs(config=config, manager=self.manager, cluster=self.cluster,
                                port=lambda: self.port, cluster_id=self.cluster_id, gate=gate)
        self.reassignments = ReassignRpcs(cluster=self.cluster, gate=gate)
        self.transactions = Transactions(  # logstore.broker.transactions.service
            config, self.manager, cluster=self.cluster, markers=self.markers,
            register_coordinator=self.coordinators.register_coordinator, loop=lambda: self._loop,
            authorization=self.authorization, gate=gate)
        # What the data plane is built from below, and the metrics read.
        self.coordinator, self.txn_verifier = self.transactions.coordinator, self.transactions.verifier
        self.consumer_groups = ConsumerGroups(  # logstore.broker.groups.service
            config, self.manager, cluster=self.cluster, register_coordinator=self.coordinators.register_coordinator,
            internal_replicated=self.coordinators.internal_replicated, gate=gate)
        self.groups = self.consumer_groups.coordinator  # what the metrics read
        self._server: grpc.aio.Server | None = None
        self.admission = request_bounds.admission_for(config.max_request_entries)  # heavy calls (request_bounds)
        self._tasks: list[asyncio.Task[None]] = []
        self.port = config.port
        self.metrics = BrokerMetrics(self) if config.metrics_port else None  # /metrics (logstore.broker.metrics)
        # Client quotas (logstore.broker.security.quotas): hooked around every handler when any is set.
        self.quotas = QuotaManager(config.quota_config(), on_throttle=self._throttled)
        self.health: BrokerHealth | None = None  # grpc.health.v1 (logstore.broker.health)
        # Appends and reads, for clients and followers alike (logstore.broker.data_plane).
        self.data_plane = DataPlane(
            manager=self.manager, run_io=self._run, placement=self.cluster, coordinator=self.coordinator,
            txn_verifier=self.txn_verifier, max_decompressed_bytes=config.max_decompressed_bytes,
            max_fetch_reply_bytes=config.max_fetch_reply_bytes,
            on_appended=None if self.metrics is None else self.metrics.produced)
        # Produce, Fetch, ListOffsets, OffsetsForLeaderEpoch over it (logstore.broker.data_rpcs).
        self.data_rpcs = DataRpcs(data_plane=self.data_plane, cluster=self.cluster,
                                  producer_check=self.authorization.producer_check, admission=self.admission,
                                  metrics=self.metrics, max_request_entries=config.max_request_entries, gate=gate)
        # Kafka's wire protocol on the same data plane, when kafka_listener is set (logstore.broker.kafka).
        self.kafka: KafkaListener | None = None
        if config.kafka_listener:
            self.kafka = self._kafka_listener(config)

    # ------------------------------------------------------------------ lifecycle

    async def start(self) -> int:
        """Recover the logs, bind, start serving; return the bound port."""
        self._loop = asyncio.get_running_loop()
        check_address_free(self.config.host, self.config.port)  # before any file is touched
        if self.metrics is not None:  # and the metrics port: not after recovery, joining the cluster
            check_address_free(self.config.host, self.config.metrics_port, what="serve metrics on",
                               option="metrics_port")
        if self.config.kafka_listener:
            check_address_free(*kafka_listener_address(self.config))
        await self._run(self.manager.startup)
        try:  # a start that fails here (e.g. PRODUCER_ID_FLOOR_UNKNOWN) closes the logs and the lock
            await self._run(_warm_up_arrow)
            internal = self.coordinators if self.config.clustered else None  # the coordinator topics' replication
            await self.transactions.start(internal)  # now, or shard by shard
            await self.consumer_groups.start(internal)  # replay now, or shard by shard
            if internal is None:
                await self.authorization.load()  # a cluster's ACLs follow etcd once it joined
        except BaseException:
            await self._run(self.manager.shutdown)
            raise
        server = grpc.aio.server(
            interceptors=self.scram.interceptors(),  # a SASL listener's session check
            maximum_concurrent_rpcs=request_bounds.MAX_CONCURRENT_RPCS,  # and heavy calls: Admission (request_bounds)
            options=[
                ("grpc.max_receive_message_length", self.config.max_request_bytes),
                ("grpc.max_send_message_length", max(self.config.max_request_bytes, 256 << 20)),
                ("grpc.so_reuseport", 0),
            ],
        )
        pb_grpc.add_LogstoreServicer_to_server(self, server)
        self.health = BrokerHealth(server)
        await self.health.set_serving(False)  # until started (and joined, on a cluster)
        # Produce takes its request and Fetch gives its answer in wire form (registered
        # handlers take precedence over the servicer's, which does not implement these
        # two): records are views of the request's bytes, and a fetch's records are copied
        # once into the answer, instead of the copies protobuf makes (parse, attribute
        # access, message construction, serialization).
        # Every other method takes its request's bytes and parses them in the handler
        # (logstore.broker.request_bounds): undecodable bytes get INVALID_REQUEST, not
        # gRPC's UNKNOWN, and every request's lists are capped by max_request_entries.
        handlers = method_handlers(self._rpc_implementations(), self.config.max_request_entries,
                                   skip=_WIRE_RPCS, admission=self.admission)
        handlers["Produce"] = grpc.unary_unary_rpc_method_handler(
            self.data_rpcs.produce_wire, response_serializer=pb.ProduceResponse.SerializeToString,
        )
        handlers["Fetch"] = grpc.unary_unary_rpc_method_handler(self.data_rpcs.fetch_wire)
        # Quotas hold and throttle per call: with quotas on, the stream is refused (UNIMPLEMENTED)
        # and clients produce with unary calls (issue 24).
        handlers["ProduceStream"] = grpc.stream_stream_rpc_method_handler(
            _refuse_stream if self.quotas.enabled else self.data_rpcs.produce_stream,
            response_serializer=pb.ProduceResponse.SerializeToString)
        guard_cluster_rpcs(self.authorization, handlers)  # the RPCs checked on the cluster resource alone
        if self.metrics is not None:  # every request's latency (a quota's hold after it is not included)
            handlers = timed_handlers(handlers, self.metrics)
        if self.quotas.enabled:
            handlers = throttled_handlers(handlers, self.quotas, self.callers.caller)
        server.add_registered_method_handlers(SERVICE, handlers)
        try:
            # TLS/mTLS when configured; the certificate's principal (logstore.broker.security.tls).
            self.port, self.callers.tls_principal = bind_listener(server, self.config)
        except RuntimeError as e:  # grpc raises RuntimeError when the address is taken
            self.port = 0
            reason = str(e)
        else:
            reason = "the address is not available"
        if self.port == 0:
            await self._run(self.manager.shutdown)
            raise OSError(f"cannot listen on {self.config.host}:{self.config.port}: {reason}")
        await server.start()
        self._server = server
        try:
            if self.kafka is not None:
                await self.kafka.start()
            await self.cluster.start()
            await self.authorization.follow(self.cluster.store)
            if self.metrics is not None:
                self.metrics.serve(self.config.host, self.config.metrics_port)
        except BaseException:
            await self.stop(grace_s=0)
            raise
        self._tasks = [
            asyncio.create_task(self._every(self.config.retention_check_interval_ms, self.manager.run_retention)),
            asyncio.create_task(self._every(self.config.flush_check_interval_ms, self.manager.flush_due)),
            asyncio.create_task(self._every(self.config.hwm_checkpoint_interval_ms,
                                            self.manager.checkpoint_high_watermarks)),
            asyncio.create_task(self._every(1_000, self.coordinator.abort_expired)),
            asyncio.create_task(self._every(250, self.coordinator.retry_markers)),  # markers elsewhere
            asyncio.create_task(self._every(30_000, self.manager.snapshot_producer_states)),
            asyncio.create_task(self.consumer_groups.run_timer()),
        ]
        self._tasks += self.scram.tasks()  # SASL: failed-login reports, users deleted elsewhere
        await self.health.set_serving(True)
        log.info("broker %d serving on %s:%d, data in %s", self.config.node_id,
                 self.config.host, self.port, self.manager.data_dir)
        return self.port

    async def stop(self, grace_s: float = 2.0) -> None:
        """Stop accepting calls, let running ones finish, close logs cleanly.

        Bounded whatever etcd and the other brokers do: the controlled shutdown (a cluster
        broker's leaderships moving away) takes at most ``controlled_shutdown_timeout_ms``,
        and the steps that close the listener, the coordinators and the cluster membership
        share one more such budget; a step out of time is logged and abandoned
        (:class:`~logstore.broker.shutdown.ShutdownClock`). Closing the local logs, last,
        always runs: it waits on nothing but this broker's disk."""
        budget_s = self.config.controlled_shutdown_timeout_ms / 1000
        if self.health is not None:
            await self.health.set_serving(False)
        await ShutdownClock(budget_s).step("the controlled shutdown", self.cluster.leave_leaderships())
        clock = ShutdownClock(budget_s)
        for task in self._tasks:
            task.cancel()
        self.consumer_groups.begin_stop()
        if self.kafka is not None:
            await clock.step("stopping the Kafka listener", self.kafka.stop())
        self.data_rpcs.close_streams()  # produce streams end once answered: they never end by themselves
        if self._server is not None:
            await clock.step("stopping the listener", self._server.stop(min(grace_s, clock.left())))
        self.data_plane.close()  # waiting fetches answer now
        # The groups' last metadata may wait for followers that are gone: bounded, and a wait
        # abandoned here ends when the replica manager closes (ClusterMembership.stop) and fails it.
        await clock.step("writing the consumer groups' metadata", self.consumer_groups.stop(), limit_s=clock.left() / 2)
        await clock.step("closing the transaction marker channels", self.transactions.stop())
        await clock.step("the ACL watch", self.authorization.stop())
        await clock.step("closing the coordinators", self.coordinators.stop())
        await self.cluster.stop(clock)
        await asyncio.to_thread(self.manager.shutdown)  # not on _io: its threads may be held above
        self._io.shutdown(wait=False, cancel_futures=True)  # a thread held by an abandoned step ends with it
        if self.metrics is not None:
            self.metrics.close()

    def _kafka_listener(self, config: BrokerConfig) -> KafkaListener:
        """The Kafka listener of ``kafka_listener`` (imported here: kio needs Python 3.11): the same
        data plane, coordinators, authorizer, SCRAM users and quotas as the gRPC listener."""
        from logstore.broker.cluster_topics import ClusterTopicAdmin
        from logstore.broker.kafka import (
            KafkaAclApis,
            KafkaAdminApis,
            KafkaApis,
            KafkaClassicGroupApis,
            KafkaCluster,
            KafkaGroupAdminApis,
            KafkaGroupApis,
            KafkaListener,
            KafkaThrottling,
            KafkaTxnApis,
            ListenerSecurity,
        )

        host, port = kafka_listener_address(config)
        # The cluster as Kafka clients see it: brokers at their Kafka listeners, leaders, coordinators.
        cluster = KafkaCluster(
            membership=self.cluster, manager=self.manager, node_id=config.node_id,
            cluster_id=config.cluster_id if config.clustered else self.cluster_id,
            advertised=self._kafka_advertised, find_coordinators=self.coordinators.find_coordinators,
            coordinator_checks={self.consumer_groups.shards.topic: self.consumer_groups.shards.check},
            clustered=config.clustered)
        cluster_topics = (ClusterTopicAdmin(self.cluster, default_partitions=config.num_partitions,
                                            default_replication_factor=config.default_replication_factor,
                                            topic_defaults=config.topic_defaults)
                          if config.clustered else None)
        authorization = self.authorization  # the same ACLs, checked for each connection's principal
        groups = KafkaGroupApis(coordinator=self.groups, heartbeat=self.consumer_groups.heartbeat_now,
                                manager=self.manager, cluster=cluster, commit=self.consumer_groups.commit_offsets,
                                authorization=authorization)
        apis = KafkaApis(manager=self.manager, data_plane=self.data_plane, placement=self.cluster, cluster=cluster,
                         txns=KafkaTxnApis(coordinator=self.coordinator, groups=self.groups,
                                           offsets_partition=self.consumer_groups.offsets_partition,
                                           cluster=cluster, authorization=authorization, run_io=self._run,
                                           verify=self.txn_verifier.verify if config.clustered else None),
                         groups=groups, group_admin=KafkaGroupAdminApis(coordinator=self.groups,
                                                                        authorization=authorization, run_io=self._run),
                         classic_groups=KafkaClassicGroupApis(heartbeat=self.consumer_groups.heartbeat_now,
                                                              authorization=authorization),
                         admin=KafkaAdminApis(manager=self.manager, placement=self.cluster, cluster=cluster,
                                              cluster_topics=cluster_topics, default_partitions=config.num_partitions,
                                              authorization=authorization, run_io=self._run),
                         acls=KafkaAclApis(authorization=authorization), authorization=authorization, max_decompressed_bytes=config.max_decompressed_bytes,
                         max_request_entries=config.max_request_entries, run_io=self._run, sasl=config.sasl)
        # The broker's security_protocol and TLS keys; SCRAM logins through the gRPC listener's SCRAM server.
        return KafkaListener(apis=apis, host=host, port=port, max_request_bytes=config.max_request_bytes,
                             security=ListenerSecurity.of(config, self.scram_exchanges),
                             throttling=KafkaThrottling(self.quotas) if self.quotas.enabled else None)

    def _kafka_advertised(self) -> tuple[str, int]:
        """Where Kafka clients reach this broker's Kafka listener (once it is bound)."""
        return _advertised_host(kafka_listener_address(self.config)[0], self.config), self.kafka_port

    @property
    def kafka_port(self) -> int:
        """The Kafka listener's port once bound (0: there is none)."""
        return 0 if self.kafka is None else self.kafka.port

    def _rpc_implementations(self) -> dict[str, Callable[..., Awaitable[Any]]]:
        """Each RPC's implementation, from the composed handlers' tables; Produce and Fetch are
        registered in wire form (:meth:`start`). An RPC of the service that no handler lists is
        a wiring mistake: it fails the start, never a client's call."""
        composed = {**self.cleaning.rpcs(), **self.markers.rpcs(), **self.scram.rpcs(), **self.acls.rpcs(),
                    **self.coordinators.rpcs(), **self.topics.rpcs(), **self.reassignments.rpcs(),
                    **self.transactions.rpcs(), **self.consumer_groups.rpcs(), **self.data_rpcs.rpcs()}
        names = [m.name for m in pb.DESCRIPTOR.services_by_name["Logstore"].methods if m.name not in _WIRE_RPCS]
        missing = [name for name in names if name not in composed]
        if missing:
            raise RuntimeError(f"RPCs of the service without a handler: {', '.join(missing)}")
        return {name: composed[name] for name in names}

    def _throttled(self, principal: str, quota: str, throttle_ms: int) -> None:
        if self.metrics is not None:
            self.metrics.throttled(principal, quota, throttle_ms)

    async def _every(self, interval_ms: int, fn: Callable[[], Any]) -> None:
        while True:
            await asyncio.sleep(interval_ms / 1000)
            try:
                await self._run(fn)
            except Exception:
                log.exception("background task %s failed", getattr(fn, "__name__", fn))

    async def _run(self, fn: Callable[..., T], *args: Any) -> T:
        return await asyncio.get_running_loop().run_in_executor(self._io, fn, *args)

    def _count_error(self, what: str, code: str) -> None:
        if self.metrics is not None:
            self.metrics.error(what, code)


async def _refuse_stream(_requests: Any, context: grpc.aio.ServicerContext) -> None:
    await context.abort(grpc.StatusCode.UNIMPLEMENTED,
                        "this broker enforces client quotas per call: produce with unary Produce calls")


def _advertised_host(host: str, config: BrokerConfig) -> str:
    """Where Kafka clients reach the listener bound on ``host``: itself, unless a wildcard
    (then the host of ``advertised_address``, else the broker's ``host``)."""
    if host not in ("0.0.0.0", "::", ""):
        return host
    if config.advertised_address:
        return config.advertised_address.rsplit(":", 1)[0]
    return config.host


def _warm_up_arrow() -> None:
    """Load now what pyarrow loads on first use: its pandas shim, which the first ``to_numpy`` or
    ``pa.array`` of a process imports (0.3-0.6 s). Paid at start-up, not by the first produce a
    broker validates, e.g. as a partition's new leader in a fail-over (measured by
    benchmarks/bench_replication.py: fail-over 2.0 s instead of 2.4-2.6 s)."""
    pa.array([0], pa.int64()).to_numpy()
