"""The data RPCs of the gRPC front end: Produce (and ProduceStream), Fetch, ListOffsets, OffsetsForLeaderEpoch.

:class:`DataRpcs` is a handler the broker composes (its collaborators are constructor
arguments: the data plane, the cluster membership, the producer check of the authorizer,
the admission of heavy calls, the metrics and the :class:`~logstore.broker.rpc_gate.RpcGate`).
It authorizes and admits a request, converts protobuf to the data plane's values and back
(:mod:`logstore.broker.data_plane_pb`) and calls the data plane: a follower's Fetch goes
through the same call as a consumer's. A topic the caller may not write (Produce) or read
(a consumer's Fetch) is refused in its partitions' answers, as Kafka does: the other
partitions of the request are served.

Produce and Fetch are registered in wire form (:mod:`logstore.wire`: :meth:`DataRpcs.produce_wire`
takes the request's bytes, so a produce's records are views of them; :meth:`DataRpcs.fetch_wire`
gives the answer's bytes, a fetch's records copied once into it); the broker registers them
itself, the other two through :meth:`DataRpcs.rpcs`. :meth:`DataRpcs.produce_stream` serves
the same produce requests pipelined over one long-lived stream
(:mod:`logstore.broker.request_streams`), each request exactly as a unary Produce.

Thread-safety: handlers run on the event loop; reads of the log run on the I/O pool.
"""

from __future__ import annotations

import dataclasses
import time
from collections.abc import AsyncIterator, Awaitable, Callable, Iterable
from typing import TYPE_CHECKING, Any

import grpc

from logstore._proto import logstore_pb2 as pb
from logstore.broker.data_plane import DataPlane
from logstore.broker.data_plane.offsets import EARLIEST, LATEST, offset_for_timestamp
from logstore.broker.data_plane.params import PartitionAppend, PartitionRead
from logstore.broker.data_plane_pb import appends_to_pb, fetch_params_from_pb, reads_to_pb
from logstore.broker.request_bounds import Admission, check_request, note_refused
from logstore.broker.request_streams import RequestStreams
from logstore.broker.rpc_errors import error_to_pb
from logstore.errors import InvalidRequestError, LogstoreError
from logstore.record import BatchHeader
from logstore.wire import ProduceRequestView, encode_fetch_response, parse_produce_request

if TYPE_CHECKING:
    from logstore.broker.membership import ClusterMembership
    from logstore.broker.metrics import BrokerMetrics
    from logstore.broker.rpc_gate import RpcGate
    from logstore.broker.security.principal import Principal

__all__ = ["DataRpcs", "EARLIEST", "LATEST"]


class DataRpcs:
    """The data RPCs; see the module docstring. ``producer_check(principal)`` is what a
    produce's batches with a producer id must pass (None: nothing, the authorizer is off);
    ``max_request_entries`` caps a request's lists before any work."""

    def __init__(self, *, data_plane: DataPlane, cluster: ClusterMembership,
                 producer_check: Callable[[Principal | None], Callable[[BatchHeader], None] | None],
                 admission: Admission, metrics: BrokerMetrics | None, max_request_entries: int,
                 gate: RpcGate) -> None:
        self._data_plane = data_plane
        self._cluster = cluster
        self._producer_check = producer_check
        self._admission = admission
        self._metrics = metrics
        self._max_request_entries = max_request_entries
        self._gate = gate
        self._streams = RequestStreams()  # the open ProduceStream calls
        # A streamed produce is timed as a unary one (the stream itself is not a request).
        self._observe_produce = None if metrics is None else metrics.latency_observer("Produce")

    def close_streams(self) -> None:
        """End the open ProduceStream calls once their requests read are answered (the broker
        stops: see :class:`~logstore.broker.request_streams.RequestStreams`)."""
        self._streams.close()

    def rpcs(self) -> dict[str, Callable[..., Awaitable[Any]]]:
        """The RPCs registered the usual way (Produce and Fetch are registered in wire form)."""
        return {"ListOffsets": self.ListOffsets, "OffsetsForLeaderEpoch": self.OffsetsForLeaderEpoch}

    # ------------------------------------------------------------------ produce

    async def produce_wire(self, data: bytes, context: grpc.aio.ServicerContext) -> pb.ProduceResponse:
        """Produce with the request in wire form (see :func:`parse_produce_request`)."""

        async def body() -> pb.ProduceResponse:
            return await self._produce_admitted(self._parse_produce(data, context), context)
        return await self._gate.guard("Produce", context, body)

    async def produce_stream(self, requests: AsyncIterator[bytes], context: grpc.aio.ServicerContext) -> None:
        """ProduceStream: the requests of one stream, each served as a unary Produce is (parsed
        within the same bounds, authorized, admitted) and answered by its correlation id as soon
        as it is done (:class:`~logstore.broker.request_streams.RequestStreams`). A request's
        failure is its answer's ``error``; a request that cannot be parsed ends the stream."""

        async def serve(request: ProduceRequestView) -> pb.ProduceResponse:
            started = time.perf_counter()
            outcome = await self._gate.settle("Produce", lambda: self._produce_admitted(request, context))
            if self._observe_produce is not None:
                self._observe_produce(time.perf_counter() - started)
            response = (pb.ProduceResponse(error=error_to_pb(outcome)) if isinstance(outcome, LogstoreError)
                        else outcome)
            response.correlation_id = request.correlation_id
            return response

        async def body() -> None:
            await self._streams.serve(requests, context, parse=lambda data: self._parse_produce(data, context),
                                      serve=serve)
        await self._gate.guard("ProduceStream", context, body)

    def _parse_produce(self, data: bytes, context: grpc.aio.ServicerContext) -> ProduceRequestView:
        try:
            return parse_produce_request(data, max_partitions=self._max_request_entries)
        except InvalidRequestError as e:
            note_refused("Produce", context, e)
            raise

    async def _produce_admitted(self, request: ProduceRequestView,
                                context: grpc.aio.ServicerContext) -> pb.ProduceResponse:
        """``request`` authorized and admitted, then appended."""
        principal = self._gate.principal(context)
        refused = self._refused_topics(principal, "WRITE", (p.topic for p in request.partitions))
        if request.transactional_id:
            self._gate.check(principal, "WRITE", "TRANSACTIONAL_ID", request.transactional_id)
        async with self._admission.slot(str(context.peer()), len(request.partitions)):
            return await self._produce(request, self._producer_check(principal), refused)

    async def _produce(self, request: ProduceRequestView,
                       check_producer: Callable[[BatchHeader], None] | None = None,
                       refused: dict[str, LogstoreError] | None = None) -> pb.ProduceResponse:
        allowed = [p for p in request.partitions if not refused or p.topic not in refused]
        appended = iter(await self._data_plane.append_records(
            allowed, acks=request.acks, timeout_ms=request.timeout_ms,
            transactional_id=request.transactional_id, check_producer=check_producer))
        appends = [PartitionAppend(p.topic, p.partition, error=refused[p.topic])
                   if refused and p.topic in refused else next(appended) for p in request.partitions]
        if self._metrics is not None:
            for a in appends:
                if a.error is not None:
                    self._metrics.error("Produce", a.error.code)
        return appends_to_pb(appends)

    # ------------------------------------------------------------------ fetch

    async def fetch_wire(self, data: bytes, context: grpc.aio.ServicerContext) -> bytes:
        """Fetch with the answer in wire form (see :func:`encode_fetch_response`); the request
        is parsed here, within ``max_request_entries`` (:func:`check_request`)."""
        started = time.perf_counter()
        follower = False  # a replica's fetch (FetchFollower), known once the request is parsed

        async def body() -> list[tuple[pb.FetchPartitionResponse, memoryview]]:
            nonlocal follower
            try:
                request = check_request("Fetch", data, pb.FetchRequest, self._max_request_entries)
            except InvalidRequestError as e:
                note_refused("Fetch", context, e)
                raise
            follower = request.HasField("replica_id")
            principal = self._gate.principal(context)
            refused: dict[str, LogstoreError] = {}
            if follower:
                self._gate.check(principal, "CLUSTER_ACTION", "CLUSTER")
            else:
                refused = self._refused_topics(principal, "READ", (p.topic for p in request.partitions))
            weight = 0 if follower else len(request.partitions)  # replicas: never held
            async with self._admission.slot(str(context.peer()), weight):
                responses = await self._fetch(request, refused)
            if self._metrics is not None and not follower:
                self._metrics.fetched(request, responses)
            return responses
        try:
            return encode_fetch_response(await self._gate.guard("Fetch", context, body))
        finally:  # the other RPCs are timed around their handlers (metrics.timed_handlers)
            if self._metrics is not None:
                self._metrics.fetch_latency(time.perf_counter() - started, follower=follower)

    async def _fetch(self, request: pb.FetchRequest, refused: dict[str, LogstoreError] | None = None,
                     ) -> list[tuple[pb.FetchPartitionResponse, memoryview]]:
        """Each partition's answer without its records, and the records (views of what was read):
        a consumer's fetch and a follower's through the same data-plane call. The partitions
        of ``refused`` topics are answered with the topic's error and not read."""
        if request.HasField("replica_id"):
            self._cluster.require_cluster("a replica fetch")
        params = fetch_params_from_pb(request)
        if not refused:
            return reads_to_pb(await self._data_plane.fetch_records(params))
        allowed = tuple(p for p in params.partitions if p.topic not in refused)
        read = iter(await self._data_plane.fetch_records(dataclasses.replace(params, partitions=allowed))
                    if allowed else [])
        return reads_to_pb([PartitionRead(p.topic, p.partition, p.offset, error=refused[p.topic])
                            if p.topic in refused else next(read) for p in params.partitions])

    def _refused_topics(self, principal: Principal | None, operation: str,
                        topics: Iterable[str]) -> dict[str, LogstoreError]:
        """The topics ``principal`` may not ``operation``, each with the error its partitions answer."""
        refused: dict[str, LogstoreError] = {}
        for topic in dict.fromkeys(topics):
            try:
                self._gate.check(principal, operation, "TOPIC", topic)
            except LogstoreError as e:
                refused[topic] = e
        return refused

    # ------------------------------------------------------------------ offsets

    async def ListOffsets(self, request: pb.ListOffsetsRequest, context: grpc.aio.ServicerContext) -> pb.ListOffsetsResponse:
        async def body() -> pb.ListOffsetsResponse:
            principal = self._gate.principal(context)
            read_committed = request.isolation_level == pb.READ_COMMITTED
            out = []
            for p in request.partitions:
                resp = pb.ListOffsetsPartitionResponse(topic=p.topic, partition=p.partition, timestamp=-1)
                try:
                    self._gate.check(principal, "DESCRIBE", "TOPIC", p.topic)
                    part = self._cluster.leader(p.topic, p.partition)
                    if p.timestamp != EARLIEST:
                        self._cluster.check_end_known(p.topic, p.partition)
                    resp.offset, found_at = await offset_for_timestamp(
                        part, p.timestamp, read_committed=read_committed, run_io=self._gate.run_io)
                    if found_at >= 0:
                        resp.timestamp = found_at
                except LogstoreError as e:
                    resp.error.CopyFrom(error_to_pb(e))
                out.append(resp)
            return pb.ListOffsetsResponse(partitions=out)
        return await self._gate.guard("ListOffsets", context, body)

    async def OffsetsForLeaderEpoch(self, request: pb.OffsetsForLeaderEpochRequest,
                                    context: grpc.aio.ServicerContext) -> pb.OffsetsForLeaderEpochResponse:
        async def body() -> pb.OffsetsForLeaderEpochResponse:
            return self._cluster.require_cluster("OffsetsForLeaderEpoch").end_offsets_for_epochs(request)
        return await self._gate.guard("OffsetsForLeaderEpoch", context, body)

