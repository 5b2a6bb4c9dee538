"""The broker: the ``logstore.v1.Logstore`` gRPC service over a :class:`LogManager`.

Concurrency model: one asyncio event loop runs ``grpc.aio``; every disk
operation (append, read, fsync, topic changes) runs on a bounded thread
pool, so the loop never blocks and thousands of long-polling fetches cost a
future each, not a thread. A fetch that finds less than ``min_bytes`` waits
on per-partition futures that produce completes (or until ``max_wait_ms``).

Produce and Fetch are registered in wire form (:mod:`logstore.wire`): a
produce's records are views of the request, a fetch's records are copied
once into the answer.

Untrusted input: a produce's bytes are checked before anything is written:
the request size cap (gRPC refuses larger messages unread), then every
partition's records by :func:`logstore.storage.validation.validate_records`
(schema, framing, ``max.message.bytes``, CRC32C, decompressed size, full
Arrow validation). One bad partition in a request fails that partition only.
Every request's bytes are parsed by our handlers, not by gRPC's deserializers
(:mod:`logstore.broker.request_bounds`): bytes that are not the request message
get ``INVALID_REQUEST``, and a request whose lists hold more than
``max_request_entries`` entries is refused before any work.

The consumer group and transaction RPCs are mixins
(:mod:`logstore.broker.groups.service`, :mod:`logstore.broker.transactions.service`);
start-up and the command line are in :mod:`logstore.broker.server`. Operations: with
``metrics_port`` set, each Produce/Fetch partition bumps counters once
(:mod:`logstore.broker.metrics`; gauges are read at scrape time), and the standard
gRPC health service says whether the broker serves (:mod:`logstore.broker.health`).

Errors: item failures travel as ``Error(code, message)``; request failures
end the call with a gRPC status and ``logstore-error-code`` trailing
metadata. An unexpected exception is logged here with its traceback and
reaches the client as UNKNOWN_SERVER_ERROR with one sentence — never a
traceback.

Thread-safety: handlers run on the event loop; state they share lives in
the LogManager and the logs, which have their own locks.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
import weakref
from collections import defaultdict
from collections.abc import Awaitable, Callable
from concurrent.futures import ThreadPoolExecutor
from typing import Any, TypeVar

import grpc
import pyarrow as pa

from logstore._proto import logstore_pb2 as pb
from logstore._proto import logstore_pb2_grpc as pb_grpc
from logstore.broker import request_bounds
from logstore.broker.answers import error_to_pb, grpc_status, status_details, unexpected
from logstore.broker.appends import SequenceGate, append_valid, validate_and_append
from logstore.broker.cleaning_service import CleaningService
from logstore.broker.cluster_service import ClusterService
from logstore.broker.config import BrokerConfig
from logstore.broker.coordinator_service import CoordinatorService
from logstore.broker.group_commit import GroupCommit
from logstore.broker.groups.service import GroupService
from logstore.broker.health import BrokerHealth
from logstore.broker.metrics import BrokerMetrics
from logstore.broker.reassign_service import ReassignService
from logstore.broker.request_bounds import SERVICE, check_request, method_handlers, note_refused
from logstore.broker.security.acl_service import AclService, guard_cluster_rpcs
from logstore.broker.security.quotas import QuotaManager, throttled_handlers
from logstore.broker.security.scram_service import ScramService
from logstore.broker.security.service import SecurityService
from logstore.broker.security.tls import bind_listener
from logstore.broker.shutdown import ShutdownClock
from logstore.broker.topic_service import TopicService
from logstore.broker.transactions.service import TransactionService
from logstore.broker.txn_markers import MarkerService
from logstore.errors import (
    WIRE_CODE_KEY,
    InvalidRequestError,
    LogOfflineError,
    LogstoreError,
    OffsetOutOfRangeError,
    StorageError,
)
from logstore.record import BatchHeader, encode_schema
from logstore.storage import file_cache
from logstore.storage.log import Log
from logstore.storage.log_manager import LogManager, Partition
from logstore.storage.log_read_result import LogReadResult
from logstore.wire import (
    ProducePartitionView,
    ProduceRequestView,
    encode_fetch_response,
    parse_produce_request,
)

__all__ = ["Broker"]

log = logging.getLogger("logstore.broker")
T = TypeVar("T")

EARLIEST = -2
LATEST = -1
_MAX_WAIT_MS_CAP = 60_000
_INLINE_READ_BYTES = 1 << 20  # a woken fetch reads up to this much on the event loop


class Broker(SecurityService, ScramService, AclService, ClusterService, CoordinatorService, ReassignService,
             TopicService, CleaningService, TransactionService, MarkerService, GroupService,
             pb_grpc.LogstoreServicer):
    """The service implementation; create with :meth:`start`, end with :meth:`stop`."""

    def __init__(self, config: BrokerConfig) -> None:
        self.config = config
        pool = file_cache.configure(config.max_open_segment_files)
        log.info("segment file pool: %d descriptors (max_open_segment_files=%d, at most half of "
                 "RLIMIT_NOFILE)", pool, config.max_open_segment_files)
        self.manager = LogManager(config.data_dir, topic_defaults=config.topic_defaults,
                                  max_partitions=config.max_partitions_per_broker)
        self._loop: asyncio.AbstractEventLoop | None = None
        self._init_security()  # who calls (logstore.broker.security.service)
        self._init_scram()  # SCRAM sessions on a SASL listener (logstore.broker.security.scram_service)
        self._init_acls()  # what they may do (logstore.broker.security.acl_service)
        self._init_transactions()  # logstore.broker.transactions.service
        self._init_coordinators()  # FindCoordinator, coordinator topics (logstore.broker.coordinator_service)
        self._init_groups()  # consumer groups (logstore.broker.groups.service)
        self._init_cluster()  # cluster membership, when metadata is set (logstore.broker.cluster_service)
        self._io = ThreadPoolExecutor(max_workers=config.io_threads, thread_name_prefix="logstore-io")
        self._server: grpc.aio.Server | None = None
        self._waiters: dict[tuple[str, int], set[asyncio.Future[None]]] = defaultdict(set)
        self._group_commits: weakref.WeakKeyDictionary[Log, GroupCommit] = weakref.WeakKeyDictionary()
        self._sequence_gate = SequenceGate()
        self.admission = request_bounds.admission_for(config.max_request_entries)  # heavy calls (request_bounds)
        self._tasks: list[asyncio.Task[None]] = []
        self.port = config.port
        self.cluster_id = "logstore"
        self.metrics = BrokerMetrics(self) if config.metrics_port else None  # /metrics (logstore.broker.metrics)
        # Client quotas (logstore.broker.security.quotas): hooked around every handler when any is set.
        self.quotas = QuotaManager(config.quota_config(), on_throttle=self._throttled)
        self.health: BrokerHealth | None = None  # grpc.health.v1 (logstore.broker.health)

    # ------------------------------------------------------------------ lifecycle

    async def start(self) -> int:
        """Recover the logs, bind, start serving; return the bound port."""
        self._loop = asyncio.get_running_loop()
        await self._run(self.manager.startup)
        try:  # a start that fails here (e.g. PRODUCER_ID_FLOOR_UNKNOWN) closes the logs and the lock
            await self._run(_warm_up_arrow)
            await self._start_transactions(self if self.config.clustered else None)  # now, or shard by shard
            await self._start_groups(self if self.config.clustered else None)  # replay now, or shard by shard
            await self._load_acls()
        except BaseException:
            await self._run(self.manager.shutdown)
            raise
        server = grpc.aio.server(
            interceptors=self._authentication_interceptors(),  # a SASL listener's session check
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
        handlers = method_handlers(self, self.config.max_request_entries, skip=frozenset({"Produce", "Fetch"}),
                                   admission=self.admission)
        handlers["Produce"] = grpc.unary_unary_rpc_method_handler(
            self._produce_wire, response_serializer=pb.ProduceResponse.SerializeToString,
        )
        handlers["Fetch"] = grpc.unary_unary_rpc_method_handler(self._fetch_wire)
        guard_cluster_rpcs(self, handlers)  # the RPCs checked on the cluster resource alone
        if self.quotas.enabled:
            handlers = throttled_handlers(handlers, self.quotas, self.caller)
        server.add_registered_method_handlers(SERVICE, handlers)
        try:
            # TLS/mTLS when configured; the certificate's principal (logstore.broker.security.tls).
            self.port, self.tls_principal = bind_listener(server, self.config)
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
            await self._start_cluster()
            await self._follow_acls()
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
            asyncio.create_task(self._group_timer()),
        ]
        self._tasks += self._scram_tasks()  # SASL: failed-login reports, users deleted elsewhere
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
        await ShutdownClock(budget_s).step("the controlled shutdown", self._leave_cluster_leaderships())
        clock = ShutdownClock(budget_s)
        for task in self._tasks:
            task.cancel()
        self._begin_stop_groups()
        if self._server is not None:
            await clock.step("stopping the listener", self._server.stop(min(grace_s, clock.left())))
        for waiters in self._waiters.values():
            for fut in waiters:
                if not fut.done():
                    fut.set_result(None)
        # The groups' last metadata may wait for followers that are gone: bounded, and a wait
        # abandoned here ends when the replica manager closes (_stop_cluster) and fails it.
        await clock.step("writing the consumer groups' metadata", self._stop_groups(), limit_s=clock.left() / 2)
        await clock.step("closing the transaction marker channels", self._stop_transactions())
        await clock.step("the ACL watch", self._stop_acls())
        await clock.step("closing the coordinators", self._stop_coordinators())
        await self._stop_cluster(clock)
        await asyncio.to_thread(self.manager.shutdown)  # not on _io: its threads may be held above
        self._io.shutdown(wait=False, cancel_futures=True)  # a thread held by an abandoned step ends with it
        if self.metrics is not None:
            self.metrics.close()

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

    async def _guard(self, what: str, context: grpc.aio.ServicerContext, body: Callable[[], Awaitable[T]]) -> T:
        """Run a handler body; turn request-level failures into a status with a code."""
        try:
            return await body()
        except LogstoreError as e:
            exc: LogstoreError = e
        except Exception as e:  # noqa: BLE001 - the wire must never see a traceback
            exc = unexpected(e, what)
        if self.metrics is not None:
            self.metrics.error(what, exc.code)
        context.set_trailing_metadata(((WIRE_CODE_KEY, exc.code),))
        await context.abort(grpc_status(exc), status_details(exc.message))
        raise AssertionError("unreachable")  # context.abort raises

    # ------------------------------------------------------------------ topics

    # ------------------------------------------------------------------ produce

    async def _produce_wire(self, data: bytes, context: grpc.aio.ServicerContext) -> pb.ProduceResponse:
        """Produce with the request in wire form (see :func:`parse_produce_request`)."""
        started = time.perf_counter()

        async def body() -> pb.ProduceResponse:
            try:
                request = parse_produce_request(data, max_partitions=self.config.max_request_entries)
            except InvalidRequestError as e:
                note_refused("Produce", context, e)
                raise
            principal = self._principal(context)
            self._check_topics(principal, "WRITE", (p.topic for p in request.partitions))
            if request.transactional_id:
                self._check(principal, "WRITE", "TRANSACTIONAL_ID", request.transactional_id)
            async with self.admission.slot(str(context.peer()), len(request.partitions)):
                return await self._produce(request, self._producer_check(principal))
        try:
            return await self._guard("Produce", context, body)
        finally:
            if self.metrics is not None:
                self.metrics.produce_latency(time.perf_counter() - started)

    async def _produce(self, request: ProduceRequestView,
                       check_producer: Callable[[BatchHeader], None] | None = None) -> pb.ProduceResponse:
        if request.acks not in (-1, 0, 1):
            raise InvalidRequestError(f"acks must be -1 (all), 0 or 1, got {request.acks}")
        if len(request.partitions) == 1:  # the common case: no task to gather
            results = [await self._produce_partition(request.partitions[0], request, check_producer)]
        else:
            results = await request_bounds.gather_bounded(
                (self._produce_partition(p, request, check_producer) for p in request.partitions),
                request_bounds.FANOUT)
        return pb.ProduceResponse(partitions=results)

    async def _produce_partition(self, data: ProducePartitionView, request: ProduceRequestView,
                                 check_producer: Callable[[BatchHeader], None] | None = None,
                                 ) -> pb.ProducePartitionResponse:
        resp = pb.ProducePartitionResponse(topic=data.topic, partition=data.partition)
        try:
            part = self._leader(data.topic, data.partition, data.current_leader_epoch)
            replicated = self.replicas is not None and self._replicated(data.topic)
            if replicated and request.acks == -1:
                self.replicas.check_enough_replicas(data.topic, data.partition)  # type: ignore[union-attr]
            attempt = await self._run(lambda: validate_and_append(
                part, data.records, max_decompressed_bytes=self.config.max_decompressed_bytes,
                manager=self.manager, coordinator=self.coordinator, check_producer=check_producer))
            valid, appended, unverified = attempt
            try:
                if appended is None:
                    if unverified is not None:  # opens a transaction coordinated elsewhere: ask there
                        await self.txn_verifier.verify(request.transactional_id, unverified.producer_id,
                                                       unverified.producer_epoch, data.topic, data.partition)
                    # it may have overtaken the batches sent before it: wait for them
                    await self._sequence_gate.wait_turn(part, valid)
                    appended = await self._run(lambda: append_valid(
                        part, valid, manager=self.manager, coordinator=self.coordinator,
                        guard=None if unverified is None else unverified.guard))
            finally:
                self._sequence_gate.appended(data.topic, data.partition)
            base_offsets, append_time = appended
            if self.metrics is not None:
                self.metrics.produced(data.topic, data.partition, len(data.records), valid)
            end_offset = part.log.log_end_offset
            self._notify(data.topic, data.partition)
            if replicated and request.acks == -1:
                # Durability is the quorum: acknowledged once every in-sync replica has the
                # records (the HWM passed them); no fsync per ack (the flush policy applies).
                await self.replicas.wait_replicated(  # type: ignore[union-attr]
                    data.topic, data.partition, end_offset, max(request.timeout_ms, 1) / 1000)
            if request.acks == -1 and self._replica_count(data.topic, data.partition) == 1:
                # One replica: fsync before the ack, shared with the produces appended meanwhile
                # (logstore.broker.group_commit); the append itself did not fsync.
                try:
                    await self._group_commit(part.log).wait_durable(end_offset)
                except LogOfflineError as e:  # appended, then offline: not a definite LOG_OFFLINE
                    raise StorageError(f"{e.message} (after the records were appended)") from e
            resp.base_offsets.extend(base_offsets)
            resp.log_append_time_ms = append_time
            resp.log_start_offset = part.log.log_start_offset
        except LogstoreError as e:
            resp.error.CopyFrom(error_to_pb(e))
        except Exception as e:  # noqa: BLE001
            resp.error.CopyFrom(error_to_pb(unexpected(e, "Produce")))
        if resp.error.code and self.metrics is not None:
            self.metrics.error("Produce", resp.error.code)
        return resp

    def _group_commit(self, log_: Log) -> GroupCommit:
        """The flusher of ``log_`` (made on first use; forgotten with the log object)."""
        flusher = self._group_commits.get(log_)
        if flusher is None:
            flusher = self._group_commits[log_] = GroupCommit(log_, self._run)
        return flusher

    def _notify(self, topic: str, partition: int) -> None:
        waiters = self._waiters.pop((topic, partition), None)
        for fut in waiters or ():
            if not fut.done():
                fut.set_result(None)

    # ------------------------------------------------------------------ fetch

    async def _fetch_wire(self, data: bytes, context: grpc.aio.ServicerContext) -> bytes:
        """Fetch with the answer in wire form (see :func:`encode_fetch_response`); the request
        is parsed here, within ``max_request_entries`` (:func:`check_request`)."""
        started = time.perf_counter()

        async def body() -> list[tuple[pb.FetchPartitionResponse, memoryview]]:
            try:
                request = check_request("Fetch", data, pb.FetchRequest, self.config.max_request_entries)
            except InvalidRequestError as e:
                note_refused("Fetch", context, e)
                raise
            principal = self._principal(context)
            if request.HasField("replica_id"):
                self._check(principal, "CLUSTER_ACTION", "CLUSTER")
            else:
                self._check_topics(principal, "READ", (p.topic for p in request.partitions))
            weight = 0 if request.HasField("replica_id") else len(request.partitions)  # replicas: never held
            async with self.admission.slot(str(context.peer()), weight):
                responses = await self._fetch(request)
            if self.metrics is not None and not request.HasField("replica_id"):
                self.metrics.fetched(request, responses, time.perf_counter() - started)
            return responses
        return encode_fetch_response(await self._guard("Fetch", context, body))

    async def _fetch(self, request: pb.FetchRequest) -> list[tuple[pb.FetchPartitionResponse, memoryview]]:
        """Each partition's answer without its records, and the records (views of what was read)."""
        if request.HasField("replica_id"):  # a follower: replication/replica_manager.py answers
            return await self._require_cluster("a replica fetch").serve_replica_fetch(request)
        read_committed = request.isolation_level == pb.READ_COMMITTED
        max_wait_s = min(max(request.max_wait_ms, 0), _MAX_WAIT_MS_CAP) / 1000
        deadline = time.monotonic() + max_wait_s
        min_bytes = max(request.min_bytes, 0)
        # Kafka's fetch.max.bytes, within the broker's ceiling (see _read_all).
        ceiling = self.config.max_fetch_reply_bytes
        max_bytes = min(request.max_bytes, ceiling) if request.max_bytes > 0 else ceiling
        woken = False
        while True:
            # Register interest before reading, so an append between the
            # read and the wait still wakes us.
            loop = asyncio.get_running_loop()
            waiter: asyncio.Future[None] = loop.create_future()
            watched = self._watch(request, waiter)
            try:
                if woken:
                    responses = await self._read_fresh(request, read_committed, max_bytes)
                elif self._caught_up(request, watched) and max_wait_s > 0:
                    responses = []  # nothing to read yet: wait without a trip to the I/O pool
                else:
                    responses = await self._run(self._read_all, request, read_committed, max_bytes)
                total = sum(len(records) for _, records in responses)
                errors = any(r.error.code for r, _ in responses)
                remaining = deadline - time.monotonic()
                if responses and (total >= max(min_bytes, 1) or errors or remaining <= 0):
                    return responses
                if not request.partitions:
                    return responses
                if remaining > 0:
                    with contextlib.suppress(asyncio.TimeoutError):
                        await asyncio.wait_for(waiter, remaining)
                    woken = waiter.done() and not waiter.cancelled()
                if time.monotonic() >= deadline:
                    return await self._run(self._read_all, request, read_committed, max_bytes)
            finally:
                self._unwatch(watched, waiter)

    def _caught_up(self, request: pb.FetchRequest, watched: list[tuple[str, int]]) -> bool:
        """Whether every partition of ``request`` exists, is online and is read to its end.

        Then a read would find nothing (the HWM and the LSO never exceed the LEO), so the
        fetch waits for an append at once. Cheap enough for the event loop: no I/O.
        """
        if len(watched) != len(request.partitions):
            return False  # an unknown partition: its answer is an error, now
        for p in request.partitions:
            try:
                part = self._leader(p.topic, p.partition, p.current_leader_epoch)
            except LogstoreError:
                return False  # its answer is an error, now
            if part.log.offline_reason is not None or p.fetch_offset != part.high_watermark:
                return False
        return True

    async def _read_fresh(
        self, request: pb.FetchRequest, read_committed: bool, max_bytes: int
    ) -> list[tuple[pb.FetchPartitionResponse, memoryview]]:
        """The read after an append woke a fetch: on the event loop, when small.

        What a waiting fetch reads was appended just now (in the page cache), so up to
        ``_INLINE_READ_BYTES`` are read on the loop: a trip to the I/O pool and back
        costs more than the read, and it is most of a low-rate fetch's latency. Larger
        reads (a first batch above the cap) go to the pool as any other read.
        """
        cap = min(max_bytes, _INLINE_READ_BYTES)
        responses = self._read_all(request, read_committed, cap, on_loop=True)
        if any(len(records) for _, records in responses) or any(r.error.code for r, _ in responses):
            return responses
        readable = any(
            p.fetch_offset < (r.last_stable_offset if read_committed else r.high_watermark)
            for p, (r, _) in zip(request.partitions, responses, strict=True)
        )
        if not readable:  # woken, but nothing visible yet (an open transaction holds the LSO)
            return responses
        return await self._run(self._read_all, request, read_committed, max_bytes)

    def _watch(self, request: pb.FetchRequest, waiter: asyncio.Future[None]) -> list[tuple[str, int]]:
        """Register ``waiter`` for the request's partitions that exist; return their keys.

        Names of topics or partitions that do not exist get no entry: a flood of
        fetches naming unknown topics leaves no state behind (issue 14).
        """
        watched = []
        for p in request.partitions:
            key = (p.topic, p.partition)
            if key not in self._waiters:
                try:
                    self.manager.partition(p.topic, p.partition)
                except LogstoreError:
                    continue  # unknown: its answer is an error, and the fetch returns at once
            self._waiters[key].add(waiter)
            watched.append(key)
        return watched

    def _unwatch(self, watched: list[tuple[str, int]], waiter: asyncio.Future[None]) -> None:
        """Remove ``waiter``, and the entries it leaves empty."""
        for key in watched:
            waiters = self._waiters.get(key)
            if waiters is not None:
                waiters.discard(waiter)
                if not waiters:
                    del self._waiters[key]

    def _read_all(
        self, request: pb.FetchRequest, read_committed: bool, max_bytes: int, *,
        on_loop: bool = False,
    ) -> list[tuple[pb.FetchPartitionResponse, memoryview]]:
        """Each partition's answer and records, within ``max_bytes`` for the whole answer.

        As Kafka's fetch: partitions are served in request order until their records
        and schemas add up to ``max_bytes``; the first partition with data always
        gets its first batch, even when larger (so a consumer makes progress); the
        partitions after the budget is spent get their bounds and no records.

        ``on_loop`` (the event loop's small reads, :meth:`_read_fresh`): no batch above
        ``max_bytes``, and the aborted transactions are read without the partition's
        lock, which an append holds while it writes. That is safe: the list is only
        appended to or replaced whole, and an abort is in it before the LSO (read first)
        moves past the aborted records.
        """
        out: list[tuple[pb.FetchPartitionResponse, memoryview]] = []
        budget = max_bytes
        for p in request.partitions:
            resp = pb.FetchPartitionResponse(topic=p.topic, partition=p.partition, next_offset=p.fetch_offset)
            records = memoryview(b"")
            try:
                part = self._leader(p.topic, p.partition, p.current_leader_epoch)
                # Bounds first, so that an OFFSET_OUT_OF_RANGE answer still says where the log is.
                resp.high_watermark = part.high_watermark
                resp.last_stable_offset = part.last_stable_offset
                resp.log_start_offset = part.log.log_start_offset
                if budget <= 0:
                    out.append((resp, records))
                    continue
                # Room for the schema sent along: the log's newest schema, never smaller than an
                # older segment's (evolution only adds columns).
                room = budget - len(encode_schema(part.log.schema))
                limit = min(p.partition_max_bytes if p.partition_max_bytes > 0 else room, room)
                result: LogReadResult = part.log.read(
                    p.fetch_offset, max_bytes=max(limit, 0),
                    upper_bound=part.upper_bound(read_committed=read_committed),
                    min_one_batch=not on_loop and budget == max_bytes,
                )
                resp.log_start_offset = result.log_start_offset
                if result.batches:
                    resp.schema = encode_schema(result.schema)
                    records = result.data
                    resp.next_offset = result.next_offset
                    budget -= len(result.data) + len(resp.schema)
                    if read_committed:
                        start, end = result.batches[0].header.base_offset, result.next_offset
                        aborted = (part.producers.aborted_between(start, end) if on_loop
                                   else part.aborted_transactions(start, end))
                        resp.aborted_transactions.extend(
                            pb.AbortedTransaction(producer_id=a.producer_id, first_offset=a.first_offset)
                            for a in aborted
                        )
            except LogstoreError as e:
                resp.error.CopyFrom(error_to_pb(e))
                if isinstance(e, OffsetOutOfRangeError):
                    # Inside offsets an operator accepted to lose: next_offset says where the log goes on.
                    gap = part.log.lost_range_at(p.fetch_offset)
                    if gap is not None:
                        resp.next_offset = gap[1]
            except Exception as e:  # noqa: BLE001
                resp.error.CopyFrom(error_to_pb(unexpected(e, "Fetch")))
            out.append((resp, records))
        return out

    # ------------------------------------------------------------------ offsets

    async def ListOffsets(self, request: pb.ListOffsetsRequest, context: grpc.aio.ServicerContext) -> pb.ListOffsetsResponse:
        async def body() -> pb.ListOffsetsResponse:
            principal = self._principal(context)
            read_committed = request.isolation_level == pb.READ_COMMITTED
            out = []
            for p in request.partitions:
                resp = pb.ListOffsetsPartitionResponse(topic=p.topic, partition=p.partition, timestamp=-1)
                try:
                    self._check(principal, "DESCRIBE", "TOPIC", p.topic)
                    part = self._leader(p.topic, p.partition)
                    if p.timestamp != EARLIEST:
                        self._check_end_known(p.topic, p.partition)
                    bound = part.upper_bound(read_committed=read_committed)
                    if p.timestamp == EARLIEST:
                        resp.offset = part.log.log_start_offset
                    elif p.timestamp == LATEST:
                        resp.offset = bound
                    elif p.timestamp < 0:
                        raise InvalidRequestError(
                            f"timestamp must be -2 (earliest), -1 (latest) or >= 0, got {p.timestamp}"
                        )
                    else:
                        found = await self._run(part.log.find_offset_for_timestamp, p.timestamp)
                        if found is not None and found < bound:
                            resp.offset = found
                            resp.timestamp = await self._run(_timestamp_at, part, found, bound)
                        else:
                            resp.offset = -1
                except LogstoreError as e:
                    resp.error.CopyFrom(error_to_pb(e))
                out.append(resp)
            return pb.ListOffsetsResponse(partitions=out)
        return await self._guard("ListOffsets", context, body)

    async def OffsetsForLeaderEpoch(self, request: pb.OffsetsForLeaderEpochRequest,
                                    context: grpc.aio.ServicerContext) -> pb.OffsetsForLeaderEpochResponse:
        async def body() -> pb.OffsetsForLeaderEpochResponse:
            return self._require_cluster("OffsetsForLeaderEpoch").end_offsets_for_epochs(request)
        return await self._guard("OffsetsForLeaderEpoch", context, body)


def _warm_up_arrow() -> None:
    """Load now what pyarrow loads on first use: its pandas shim, which the first ``to_numpy`` or
    ``pa.array`` of a process imports (0.3-0.6 s). Paid at start-up, not by the first produce a
    broker validates, e.g. as a partition's new leader in a fail-over (measured by
    benchmarks/bench_replication.py: fail-over 2.0 s instead of 2.4-2.6 s)."""
    pa.array([0], pa.int64()).to_numpy()


def _timestamp_at(part: Partition, offset: int, bound: int) -> int:
    """The timestamp (ms) of the record at ``offset`` (which must exist below ``bound``)."""
    for batch in part.log.read(offset, max_bytes=1, upper_bound=bound).decode():
        return int(batch.column(1).cast(pa.int64())[0].as_py())
    return -1
