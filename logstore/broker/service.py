"""The broker: the ``logstore.v1.Logstore`` gRPC service over a :class:`LogManager`.

Concurrency model: one asyncio event loop runs ``grpc.aio``; every disk
operation (append, read, fsync, topic changes) runs on a bounded thread
pool, so the loop never blocks and thousands of long-polling fetches cost a
future each, not a thread. A fetch that finds less than ``min_bytes`` waits
on per-partition futures that produce completes (or until ``max_wait_ms``).

Untrusted input: a produce's bytes are checked before anything is written:
the request size cap (gRPC refuses larger messages unread), the schema
message, every batch's framing, size (``max.message.bytes``), CRC32C,
decompressed size (summed from the compressed buffers' length prefixes,
before decompressing) and full Arrow validation. One bad partition in a
request fails that partition only.

Errors: item failures travel as ``Error(code, message)``; request failures
end the call with a gRPC status and ``logstore-error-code`` trailing
metadata. An unexpected exception is logged here with its traceback and
reaches the client as UNKNOWN_SERVER_ERROR with one sentence — never a
traceback.

Thread-safety: handlers run on the event loop; state they share lives in
the LogManager and the logs, which have their own locks.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import logging
import os
import signal
import sys
import time
from collections import defaultdict
from collections.abc import Awaitable, Callable, Iterator, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from typing import Any, TypeVar

import grpc
import pyarrow as pa

from logstore._proto import logstore_pb2 as pb
from logstore._proto import logstore_pb2_grpc as pb_grpc
from logstore.broker.config import BrokerConfig, load_broker_config
from logstore.broker.groups.service import GroupService
from logstore.broker.transactions.coordinator import (
    SINK_COMMITS_TOPIC,
    DecisionLog,
    GroupDecision,
    TransactionCoordinator,
    TxnRef,
)
from logstore.errors import (
    WIRE_CODE_KEY,
    CorruptRecordError,
    InvalidRequestError,
    LogstoreError,
    RecordTooLargeError,
    SchemaMismatchError,
    UnknownServerError,
)
from logstore.record import (
    NO_PRODUCER_ID,
    build_batch,
    check_schema_evolution,
    decode_schema,
    encode_schema,
)
from logstore.record_reader import StoredBatch, decoded_body_size, iter_batches
from logstore.storage.cleanable import cleaning_state
from logstore.storage.log_manager import LogManager, Partition
from logstore.storage.log_read_result import LogReadResult
from logstore.storage.segment_replacement import SegmentReplacement, SegmentSummary

__all__ = [
    "Broker", "serve", "main", "parse_produce_request", "ProduceRequestView", "ProducePartitionView",
    "encode_fetch_response",
]

log = logging.getLogger("logstore.broker")
T = TypeVar("T")

EARLIEST = -2
LATEST = -1
_MAX_WAIT_MS_CAP = 60_000
_OK = pb.Error()


def _error(exc: LogstoreError) -> pb.Error:
    return pb.Error(code=exc.code, message=exc.message)


def _unexpected(exc: BaseException, what: str) -> LogstoreError:
    log.exception("unexpected failure in %s", what)
    return UnknownServerError(f"internal error in {what}: {type(exc).__name__}: {exc}")


class Broker(GroupService, pb_grpc.LogstoreServicer):
    """The service implementation; create with :meth:`start`, end with :meth:`stop`."""

    def __init__(self, config: BrokerConfig) -> None:
        self.config = config
        self.manager = LogManager(config.data_dir, topic_defaults=config.topic_defaults)
        self.coordinator = TransactionCoordinator(
            config.data_dir, write_markers=self._write_markers, decisions=_TopicDecisionLog(self.manager)
        )
        self._init_groups()  # consumer groups (logstore.broker.groups.service)
        self._loop: asyncio.AbstractEventLoop | None = None
        self._io = ThreadPoolExecutor(max_workers=config.io_threads, thread_name_prefix="logstore-io")
        self._server: grpc.aio.Server | None = None
        self._waiters: dict[tuple[str, int], set[asyncio.Future[None]]] = defaultdict(set)
        self._tasks: list[asyncio.Task[None]] = []
        self.port = config.port
        self.cluster_id = "logstore"

    # ------------------------------------------------------------------ lifecycle

    async def start(self) -> int:
        """Recover the logs, bind, start serving; return the bound port."""
        self._loop = asyncio.get_running_loop()
        await self._run(self.manager.startup)
        await self._run(self.coordinator.startup)
        await self._run(self.groups.startup)
        server = grpc.aio.server(
            options=[
                ("grpc.max_receive_message_length", self.config.max_request_bytes),
                ("grpc.max_send_message_length", max(self.config.max_request_bytes, 256 << 20)),
                ("grpc.so_reuseport", 0),
            ],
        )
        pb_grpc.add_LogstoreServicer_to_server(self, server)
        # Produce takes its request and Fetch gives its answer in wire form (registered
        # handlers take precedence): records are views of the request's bytes, and a
        # fetch's records are copied once into the answer, instead of the copies
        # protobuf makes (parse, attribute access, message construction, serialization).
        server.add_registered_method_handlers("logstore.v1.Logstore", {
            "Produce": grpc.unary_unary_rpc_method_handler(
                self._produce_wire, response_serializer=pb.ProduceResponse.SerializeToString,
            ),
            "Fetch": grpc.unary_unary_rpc_method_handler(
                self._fetch_wire, request_deserializer=pb.FetchRequest.FromString,
            ),
        })
        try:
            self.port = server.add_insecure_port(f"{self.config.host}:{self.config.port}")
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
        self._tasks = [
            asyncio.create_task(self._every(self.config.retention_check_interval_ms, self.manager.run_retention)),
            asyncio.create_task(self._every(self.config.flush_check_interval_ms, self.manager.flush_due)),
            asyncio.create_task(self._every(1_000, self.coordinator.abort_expired)),
            asyncio.create_task(self._every(30_000, self.manager.snapshot_producer_states)),
            asyncio.create_task(self._group_timer()),
        ]
        log.info("broker %d serving on %s:%d, data in %s", self.config.node_id,
                 self.config.host, self.port, self.manager.data_dir)
        return self.port

    async def stop(self, grace_s: float = 2.0) -> None:
        """Stop accepting calls, let running ones finish, close logs cleanly."""
        for task in self._tasks:
            task.cancel()
        self._begin_stop_groups()
        if self._server is not None:
            await self._server.stop(grace_s)
        for waiters in self._waiters.values():
            for fut in waiters:
                if not fut.done():
                    fut.set_result(None)
        await self._stop_groups()
        await self._run(self.manager.shutdown)
        self._io.shutdown(wait=True)

    async def wait_for_termination(self) -> None:
        if self._server is not None:
            await self._server.wait_for_termination()

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
            exc = _unexpected(e, what)
        status = (
            grpc.StatusCode.INVALID_ARGUMENT if isinstance(exc, InvalidRequestError)
            else grpc.StatusCode.RESOURCE_EXHAUSTED if isinstance(exc, RecordTooLargeError)
            else grpc.StatusCode.INTERNAL
        )
        context.set_trailing_metadata(((WIRE_CODE_KEY, exc.code),))
        await context.abort(status, exc.message)
        raise AssertionError("unreachable")  # context.abort raises

    # ------------------------------------------------------------------ topics

    async def CreateTopics(self, request: pb.CreateTopicsRequest, context: grpc.aio.ServicerContext) -> pb.CreateTopicsResponse:
        async def body() -> pb.CreateTopicsResponse:
            results = []
            for topic in request.topics:
                results.append(pb.TopicResult(name=topic.name, error=await self._create_topic(topic, request.validate_only)))
            return pb.CreateTopicsResponse(results=results)
        return await self._guard("CreateTopics", context, body)

    async def _create_topic(self, topic: pb.NewTopic, validate_only: bool) -> pb.Error:
        try:
            value_schema = None
            if topic.value_schema:
                try:
                    value_schema = pa.ipc.read_schema(pa.py_buffer(topic.value_schema))
                except (pa.ArrowException, OSError) as e:
                    raise SchemaMismatchError(f"value_schema is not an Arrow IPC schema message: {e}") from None
            if topic.replication_factor not in (0, 1):
                raise InvalidRequestError(
                    f"replication factor {topic.replication_factor} is not available: this cluster has one broker"
                )
            partitions = topic.partitions or self.config.num_partitions
            await self._run(lambda: self.manager.create_topic(
                topic.name, partitions=partitions, configs=dict(topic.configs),
                value_schema=value_schema, validate_only=validate_only,
            ))
            return _OK
        except LogstoreError as e:
            return _error(e)
        except Exception as e:  # noqa: BLE001
            return _error(_unexpected(e, "CreateTopics"))

    async def DeleteTopics(self, request: pb.DeleteTopicsRequest, context: grpc.aio.ServicerContext) -> pb.DeleteTopicsResponse:
        async def body() -> pb.DeleteTopicsResponse:
            results = []
            for name in request.names:
                try:
                    await self._run(self.manager.delete_topic, name)
                    err = _OK
                except LogstoreError as e:
                    err = _error(e)
                results.append(pb.TopicResult(name=name, error=err))
            return pb.DeleteTopicsResponse(results=results)
        return await self._guard("DeleteTopics", context, body)

    async def Metadata(self, request: pb.MetadataRequest, context: grpc.aio.ServicerContext) -> pb.MetadataResponse:
        async def body() -> pb.MetadataResponse:
            names = list(request.topics) or [t.name for t in self.manager.topics()]
            return pb.MetadataResponse(
                cluster_id=self.cluster_id,
                controller_id=self.config.node_id,
                brokers=[pb.BrokerInfo(node_id=self.config.node_id, host=self.config.host, port=self.port)],
                topics=[self._topic_metadata(n) for n in names],
            )
        return await self._guard("Metadata", context, body)

    def _topic_metadata(self, name: str) -> pb.TopicMetadata:
        try:
            info = self.manager.topic(name)
            parts = []
            for part in self.manager.partitions_of(name):
                plog = part.log
                offline = plog.offline_reason
                parts.append(pb.PartitionMetadata(
                    partition=part.partition,
                    error=_OK if offline is None else pb.Error(code="LOG_OFFLINE", message=offline),
                    leader=self.config.node_id, leader_epoch=part.leader_epoch,
                    replicas=[self.config.node_id], isr=[self.config.node_id],
                    log_start_offset=plog.log_start_offset, log_end_offset=plog.log_end_offset,
                    high_watermark=part.high_watermark, last_stable_offset=part.last_stable_offset,
                    size_bytes=plog.size_bytes if offline is None else 0,
                ))
            return pb.TopicMetadata(
                name=name, topic_id=info.topic_id, schema=encode_schema(info.schema),
                typed=info.typed, partitions=parts,
            )
        except LogstoreError as e:
            return pb.TopicMetadata(name=name, error=_error(e))

    async def DescribeConfigs(self, request: pb.DescribeConfigsRequest, context: grpc.aio.ServicerContext) -> pb.DescribeConfigsResponse:
        async def body() -> pb.DescribeConfigsResponse:
            results = []
            for name in request.topics:
                try:
                    configs = self.manager.topic(name).describe_configs()
                    results.append(pb.TopicConfigs(name=name, configs=configs))
                except LogstoreError as e:
                    results.append(pb.TopicConfigs(name=name, error=_error(e)))
            return pb.DescribeConfigsResponse(results=results)
        return await self._guard("DescribeConfigs", context, body)

    async def AlterConfigs(self, request: pb.AlterConfigsRequest, context: grpc.aio.ServicerContext) -> pb.AlterConfigsResponse:
        async def body() -> pb.AlterConfigsResponse:
            results = []
            for alt in request.alterations:
                try:
                    await self._run(lambda a=alt: self.manager.alter_configs(
                        a.topic, set_configs=dict(a.set), delete_keys=list(a.delete),
                        validate_only=request.validate_only,
                    ))
                    err = _OK
                except LogstoreError as e:
                    err = _error(e)
                results.append(pb.TopicResult(name=alt.topic, error=err))
            return pb.AlterConfigsResponse(results=results)
        return await self._guard("AlterConfigs", context, body)

    # ------------------------------------------------------------------ produce

    async def Produce(self, request: pb.ProduceRequest, context: grpc.aio.ServicerContext) -> pb.ProduceResponse:
        return await self._guard("Produce", context, lambda: self._produce(request))

    async def _produce_wire(self, data: bytes, context: grpc.aio.ServicerContext) -> pb.ProduceResponse:
        """Produce with the request in wire form (see :func:`parse_produce_request`)."""
        return await self._guard("Produce", context, lambda: self._produce(parse_produce_request(data)))

    async def _produce(self, request: pb.ProduceRequest | ProduceRequestView) -> pb.ProduceResponse:
        if request.acks not in (-1, 0, 1):
            raise InvalidRequestError(f"acks must be -1 (all), 0 or 1, got {request.acks}")
        fsync = request.acks == -1
        results = await asyncio.gather(*(self._produce_partition(p, fsync) for p in request.partitions))
        return pb.ProduceResponse(partitions=results)

    async def _produce_partition(
        self, data: pb.ProducePartition | ProducePartitionView, fsync: bool
    ) -> pb.ProducePartitionResponse:
        resp = pb.ProducePartitionResponse(topic=data.topic, partition=data.partition)
        try:
            part = self.manager.partition(data.topic, data.partition)
            base_offsets, append_time = await self._run(self._append, part, data.records, fsync)
            resp.base_offsets.extend(base_offsets)
            resp.log_append_time_ms = append_time
            resp.log_start_offset = part.log.log_start_offset
            self._notify(data.topic, data.partition)
        except LogstoreError as e:
            resp.error.CopyFrom(_error(e))
        except Exception as e:  # noqa: BLE001
            resp.error.CopyFrom(_error(_unexpected(e, "Produce")))
        return resp

    def _validate_produce(self, part: Partition, records: bytes | memoryview) -> tuple[pa.Schema, list[tuple[StoredBatch, pa.RecordBatch]]]:
        """Check every byte of an untrusted produce before anything is written."""
        config = part.log.config
        where = f"produce to {part.topic}-{part.partition}"
        data = memoryview(records)
        if not data:
            raise CorruptRecordError(f"{where}: no records")
        schema, schema_size = decode_schema(data, where=where)
        check_schema_evolution(part.log.schema, schema)
        batches: list[tuple[StoredBatch, pa.RecordBatch]] = []
        inflated = 0
        for stored in iter_batches(data, start=schema_size, where=where):
            if stored.size > config.max_message_bytes:
                raise RecordTooLargeError(
                    f"{where}: a batch of {stored.size} bytes exceeds max.message.bytes "
                    f"{config.max_message_bytes}"
                )
            stored.verify_crc(where=where)
            inflated += decoded_body_size(stored)
            if inflated > self.config.max_decompressed_bytes:
                raise RecordTooLargeError(
                    f"{where}: batches would decompress to more than {self.config.max_decompressed_bytes} bytes"
                )
            batch = stored.decode(schema, validate=True)
            if batch.num_rows != stored.header.record_count:
                raise CorruptRecordError(
                    f"{where}: batch says {stored.header.record_count} records but holds {batch.num_rows}"
                )
            if batch.column(1).null_count:
                raise CorruptRecordError(f"{where}: timestamps must not be null")
            batches.append((stored, batch))
        if not batches:
            raise CorruptRecordError(f"{where}: the stream holds a schema but no batch")
        return schema, batches

    def _append(self, part: Partition, records: bytes | memoryview, fsync: bool) -> tuple[list[int], int]:
        schema, batches = self._validate_produce(part, records)
        base_offsets = []
        append_time = -1
        for i, (stored, batch) in enumerate(batches):
            h = stored.header
            if h.is_control:
                raise InvalidRequestError(
                    f"produce to {part.topic}-{part.partition}: clients cannot write control batches"
                )
            if h.is_transactional:
                if h.producer_id == NO_PRODUCER_ID:
                    raise InvalidRequestError("a transactional batch needs a producer id")
                self.coordinator.verify_partition(h.producer_id, h.producer_epoch, (part.topic, part.partition))
            base, when = part.append(batch, h, fsync=fsync and i == len(batches) - 1)
            base_offsets.append(base)
            # Like Kafka: the append time is reported only for LogAppendTime topics.
            append_time = when if part.log.config.message_timestamp_type == "LogAppendTime" else -1
        if not schema.equals(self.manager.topic(part.topic).schema, check_metadata=False):
            self.manager.note_schema(part.topic, schema)
        return base_offsets, append_time

    def _write_markers(self, partitions: Any, producer_id: int, producer_epoch: int, commit: bool) -> None:
        """The coordinator's marker writer: one fsynced marker per partition, then wake fetches."""
        for topic, partition in partitions:
            try:
                part = self.manager.partition(topic, partition)
            except LogstoreError:
                continue  # the topic was deleted while the transaction was open
            part.append_marker(producer_id, producer_epoch, commit=commit)
            if self._loop is not None:
                self._loop.call_soon_threadsafe(self._notify, topic, partition)

    def _notify(self, topic: str, partition: int) -> None:
        waiters = self._waiters.pop((topic, partition), None)
        for fut in waiters or ():
            if not fut.done():
                fut.set_result(None)

    # ------------------------------------------------------------------ fetch

    async def Fetch(self, request: pb.FetchRequest, context: grpc.aio.ServicerContext) -> pb.FetchResponse:
        parts = await self._guard("Fetch", context, lambda: self._fetch(request))
        answer = pb.FetchResponse()
        for resp, records in parts:
            if records:
                resp.records = bytes(records)
            answer.partitions.append(resp)
        return answer

    async def _fetch_wire(self, request: pb.FetchRequest, context: grpc.aio.ServicerContext) -> bytes:
        """Fetch with the answer in wire form (see :func:`encode_fetch_response`)."""
        return encode_fetch_response(await self._guard("Fetch", context, lambda: self._fetch(request)))

    async def _fetch(self, request: pb.FetchRequest) -> list[tuple[pb.FetchPartitionResponse, memoryview]]:
        """Each partition's answer without its records, and the records (views of what was read)."""
        read_committed = request.isolation_level == pb.READ_COMMITTED
        max_wait_s = min(max(request.max_wait_ms, 0), _MAX_WAIT_MS_CAP) / 1000
        deadline = time.monotonic() + max_wait_s
        min_bytes = max(request.min_bytes, 0)
        max_bytes = request.max_bytes if request.max_bytes > 0 else 64 << 20
        while True:
            # Register interest before reading, so an append between the
            # read and the wait still wakes us.
            loop = asyncio.get_running_loop()
            waiter: asyncio.Future[None] = loop.create_future()
            for p in request.partitions:
                self._waiters[(p.topic, p.partition)].add(waiter)
            try:
                responses = await self._run(self._read_all, request, read_committed, max_bytes)
                total = sum(len(records) for _, records in responses)
                errors = any(r.error.code for r, _ in responses)
                remaining = deadline - time.monotonic()
                if total >= max(min_bytes, 1) or errors or remaining <= 0 or not request.partitions:
                    return responses
                with contextlib.suppress(asyncio.TimeoutError):
                    await asyncio.wait_for(waiter, remaining)
                if time.monotonic() >= deadline:
                    return await self._run(self._read_all, request, read_committed, max_bytes)
            finally:
                for p in request.partitions:
                    self._waiters.get((p.topic, p.partition), set()).discard(waiter)

    def _read_all(
        self, request: pb.FetchRequest, read_committed: bool, max_bytes: int
    ) -> list[tuple[pb.FetchPartitionResponse, memoryview]]:
        out: list[tuple[pb.FetchPartitionResponse, memoryview]] = []
        budget = max_bytes
        for p in request.partitions:
            resp = pb.FetchPartitionResponse(topic=p.topic, partition=p.partition, next_offset=p.fetch_offset)
            records = memoryview(b"")
            try:
                part = self.manager.partition(p.topic, p.partition)
                # Bounds first, so that an OFFSET_OUT_OF_RANGE answer still says where the log is.
                resp.high_watermark = part.high_watermark
                resp.last_stable_offset = part.last_stable_offset
                resp.log_start_offset = part.log.log_start_offset
                limit = min(p.partition_max_bytes if p.partition_max_bytes > 0 else budget, budget)
                result: LogReadResult = part.log.read(
                    p.fetch_offset, max_bytes=max(limit, 0),
                    upper_bound=part.upper_bound(read_committed=read_committed),
                    min_one_batch=budget == max_bytes,
                )
                resp.log_start_offset = result.log_start_offset
                if result.batches:
                    resp.schema = encode_schema(result.schema)
                    records = result.data
                    resp.next_offset = result.next_offset
                    budget -= len(result.data)
                    if read_committed:
                        resp.aborted_transactions.extend(
                            pb.AbortedTransaction(producer_id=a.producer_id, first_offset=a.first_offset)
                            for a in part.aborted_transactions(result.batches[0].header.base_offset,
                                                               result.next_offset)
                        )
            except LogstoreError as e:
                resp.error.CopyFrom(_error(e))
            except Exception as e:  # noqa: BLE001
                resp.error.CopyFrom(_error(_unexpected(e, "Fetch")))
            out.append((resp, records))
        return out

    # ------------------------------------------------------------------ offsets

    async def ListOffsets(self, request: pb.ListOffsetsRequest, context: grpc.aio.ServicerContext) -> pb.ListOffsetsResponse:
        async def body() -> pb.ListOffsetsResponse:
            read_committed = request.isolation_level == pb.READ_COMMITTED
            out = []
            for p in request.partitions:
                resp = pb.ListOffsetsPartitionResponse(topic=p.topic, partition=p.partition, timestamp=-1)
                try:
                    part = self.manager.partition(p.topic, p.partition)
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
                    resp.error.CopyFrom(_error(e))
                out.append(resp)
            return pb.ListOffsetsResponse(partitions=out)
        return await self._guard("ListOffsets", context, body)

    async def DeleteRecords(self, request: pb.DeleteRecordsRequest, context: grpc.aio.ServicerContext) -> pb.DeleteRecordsResponse:
        async def body() -> pb.DeleteRecordsResponse:
            out = []
            for p in request.partitions:
                resp = pb.DeleteRecordsPartitionResponse(topic=p.topic, partition=p.partition)
                try:
                    part = self.manager.partition(p.topic, p.partition)
                    offset = part.high_watermark if p.offset == -1 else p.offset
                    if offset < 0 or offset > part.high_watermark:
                        raise InvalidRequestError(
                            f"cannot delete records before {offset}: the high watermark is {part.high_watermark}"
                        )
                    resp.low_watermark = await self._run(part.log.delete_records_before, offset)
                except LogstoreError as e:
                    resp.error.CopyFrom(_error(e))
                out.append(resp)
            return pb.DeleteRecordsResponse(partitions=out)
        return await self._guard("DeleteRecords", context, body)

    # ------------------------------------------------------------------ compaction

    async def DescribeCleaning(self, request: pb.DescribeCleaningRequest, context: grpc.aio.ServicerContext) -> pb.DescribeCleaningResponse:
        """Per-partition cleaning state (logstore.storage.segment_replacement.CleaningState) of the named topics,
        or of every topic whose cleanup.policy includes compact."""
        async def body() -> pb.DescribeCleaningResponse:
            now_ms = request.now_ms or int(time.time() * 1000)
            names = list(request.topics) or [t.name for t in self.manager.topics() if t.config.compact]
            return pb.DescribeCleaningResponse(
                topics=[await self._run(self._topic_cleaning, name, now_ms) for name in names]
            )
        return await self._guard("DescribeCleaning", context, body)

    def _topic_cleaning(self, name: str, now_ms: int) -> pb.TopicCleaning:
        try:
            info = self.manager.topic(name)
            parts = self.manager.partitions_of(name)
        except LogstoreError as e:
            return pb.TopicCleaning(name=name, error=_error(e))
        cfg = info.config
        out = pb.TopicCleaning(
            name=name, cleanup_policy=cfg.cleanup_policy, min_cleanable_dirty_ratio=cfg.min_cleanable_dirty_ratio,
            delete_retention_ms=cfg.delete_retention_ms, min_compaction_lag_ms=cfg.min_compaction_lag_ms,
            segment_bytes=cfg.segment_bytes,
        )
        for part in parts:
            try:
                s = cleaning_state(part.log, last_stable_offset=part.last_stable_offset, now_ms=now_ms)
            except LogstoreError as e:
                out.partitions.append(pb.PartitionCleaning(partition=part.partition, error=_error(e)))
                continue
            out.partitions.append(pb.PartitionCleaning(
                partition=part.partition, log_start_offset=s.log_start_offset, log_end_offset=s.log_end_offset,
                last_stable_offset=s.last_stable_offset, active_segment_base=s.active_segment_base,
                first_dirty_offset=s.first_dirty_offset, cleanable_end_offset=s.cleanable_end_offset,
                clean_bytes=s.clean_bytes, dirty_bytes=s.dirty_bytes, dirty_ratio=s.dirty_ratio,
                segments=[pb.CleanableSegment(base_offset=g.base_offset, next_offset=g.next_offset,
                                              size_bytes=g.size_bytes, max_timestamp=g.max_timestamp)
                          for g in s.segments],
                in_progress=s.in_progress,
            ))
        return out

    async def ReplaceSegments(self, request_iterator: Any, context: grpc.aio.ServicerContext) -> pb.ReplaceSegmentsResponse:
        """Client-streaming swap of closed segments for compacted ones (logstore.storage.segment_replacement).

        A stream that ends early, a failed check or a cancelled call discards
        what was written; only a complete, valid replacement of unchanged
        segments is swapped in.
        """
        async def body() -> pb.ReplaceSegmentsResponse:
            requests = request_iterator.__aiter__()
            try:
                first = await requests.__anext__()
            except StopAsyncIteration:
                raise InvalidRequestError("ReplaceSegments: empty stream; the first message must be begin") from None
            if first.WhichOneof("part") != "begin":
                raise InvalidRequestError("ReplaceSegments: the first message must be begin")
            begin = first.begin
            part = self.manager.partition(begin.topic, begin.partition)
            config = part.log.config
            if not config.compact:
                raise InvalidRequestError(
                    f"topic {begin.topic!r} has cleanup.policy={config.cleanup_policy}; only topics whose "
                    "cleanup.policy includes compact can be compacted"
                )
            replaced = [SegmentSummary(s.base_offset, s.next_offset, s.size_bytes, s.max_timestamp)
                        for s in begin.segments]
            replacement = await self._run(lambda: SegmentReplacement.begin(
                part.log, replaced=replaced, end_offset=begin.end_offset, checkpoint=begin.cleaner_checkpoint,
            ))
            try:
                async for message in requests:
                    if message.WhichOneof("part") != "chunk":
                        raise InvalidRequestError("ReplaceSegments: only the first message may be begin")
                    await self._run(replacement.add, message.chunk.schema, message.chunk.records)
                new = await self._run(lambda: part.log.replace_segments(
                    replacement, max_end_offset=part.last_stable_offset))
            finally:
                # Submitted at once, so it runs even when this call was cancelled.
                await asyncio.get_running_loop().run_in_executor(self._io, replacement.abort)
            before = sum(s.size_bytes for s in replaced)
            after = sum(s.size for s in new)
            log.info("compacted %s-%d: %d segments, %d bytes -> %d segments, %d bytes (%d records)",
                     begin.topic, begin.partition, len(replaced), before, len(new), after, replacement.records)
            return pb.ReplaceSegmentsResponse(
                new_base_offsets=[s.base_offset for s in new], bytes_before=before, bytes_after=after,
                batches=replacement.batches, records=replacement.records,
                cleaner_checkpoint=replacement.checkpoint,
            )
        return await self._guard("ReplaceSegments", context, body)


    # ------------------------------------------------------------------ transactions

    async def InitProducerId(self, request: pb.InitProducerIdRequest, context: grpc.aio.ServicerContext) -> pb.InitProducerIdResponse:
        async def body() -> pb.InitProducerIdResponse:
            try:
                pid, epoch = await self._run(lambda: self.coordinator.init_producer_id(
                    request.transactional_id, timeout_ms=request.transaction_timeout_ms or 60_000))
            except LogstoreError as e:
                return pb.InitProducerIdResponse(error=_error(e), producer_id=-1, producer_epoch=-1)
            return pb.InitProducerIdResponse(producer_id=pid, producer_epoch=epoch)
        return await self._guard("InitProducerId", context, body)

    async def AddPartitionsToTxn(self, request: pb.AddPartitionsToTxnRequest, context: grpc.aio.ServicerContext) -> pb.AddPartitionsToTxnResponse:
        async def body() -> pb.AddPartitionsToTxnResponse:
            try:
                for p in request.partitions:
                    self.manager.partition(p.topic, p.partition)  # must exist
                number = await self._run(lambda: self.coordinator.add_partitions(
                    request.transactional_id, request.producer_id, request.producer_epoch,
                    [(p.topic, p.partition) for p in request.partitions]))
            except LogstoreError as e:
                return pb.AddPartitionsToTxnResponse(error=_error(e))
            return pb.AddPartitionsToTxnResponse(txn_number=number)
        return await self._guard("AddPartitionsToTxn", context, body)

    async def EndTxn(self, request: pb.EndTxnRequest, context: grpc.aio.ServicerContext) -> pb.EndTxnResponse:
        async def body() -> pb.EndTxnResponse:
            try:
                await self._run(lambda: self.coordinator.end_txn(
                    request.transactional_id, request.producer_id, request.producer_epoch,
                    request.txn_number, commit=request.commit))
            except LogstoreError as e:
                return pb.EndTxnResponse(error=_error(e))
            return pb.EndTxnResponse()
        return await self._guard("EndTxn", context, body)

    async def EndTxnGroup(self, request: pb.EndTxnGroupRequest, context: grpc.aio.ServicerContext) -> pb.EndTxnGroupResponse:
        async def body() -> pb.EndTxnGroupResponse:
            refs = [TxnRef(t.transactional_id, t.producer_id, t.producer_epoch, t.txn_number) for t in request.txns]
            try:
                committed = await self._run(lambda: self.coordinator.end_group(
                    request.group_id, request.batch_id, refs, abort_prefix=request.abort_prefix,
                    commit=request.commit))
            except LogstoreError as e:
                return pb.EndTxnGroupResponse(error=_error(e), last_committed_batch_id=-1)
            return pb.EndTxnGroupResponse(
                committed=committed,
                last_committed_batch_id=self.coordinator.last_committed_batch(request.group_id))
        return await self._guard("EndTxnGroup", context, body)

    async def DescribeTxnGroup(self, request: pb.DescribeTxnGroupRequest, context: grpc.aio.ServicerContext) -> pb.DescribeTxnGroupResponse:
        async def body() -> pb.DescribeTxnGroupResponse:
            return pb.DescribeTxnGroupResponse(
                last_committed_batch_id=self.coordinator.last_committed_batch(request.group_id))
        return await self._guard("DescribeTxnGroup", context, body)


def _timestamp_at(part: Partition, offset: int, bound: int) -> int:
    """The timestamp (ms) of the record at ``offset`` (which must exist below ``bound``)."""
    for batch in part.log.read(offset, max_bytes=1, upper_bound=bound).decode():
        return int(batch.column(1).cast(pa.int64())[0].as_py())
    return -1


class _TopicDecisionLog(DecisionLog):
    """Group decisions as records of the internal topic ``__sink_commits`` (key = group id)."""

    def __init__(self, manager: LogManager) -> None:
        self._manager = manager

    def _partition(self) -> Partition:
        try:
            return self._manager.partition(SINK_COMMITS_TOPIC, 0)
        except LogstoreError:
            self._manager.create_topic(SINK_COMMITS_TOPIC, partitions=1, configs={"retention.ms": "-1"},
                                       value_schema=None)
            return self._manager.partition(SINK_COMMITS_TOPIC, 0)

    def append(self, decision: GroupDecision) -> None:
        part = self._partition()
        batch = build_batch(part.log.schema, values=[decision.to_json()], keys=[decision.group_id.encode()],
                            timestamps_ms=[int(time.time() * 1000)])
        part.log.append(batch, leader_epoch=part.leader_epoch, fsync=True)

    def read_all(self) -> list[GroupDecision]:
        part = self._partition()
        out: list[GroupDecision] = []
        offset = part.log.log_start_offset
        while offset < part.log.log_end_offset:
            result = part.log.read(offset, max_bytes=8 << 20)
            if not result.batches:
                break
            for rb in result.decode():
                out.extend(GroupDecision.from_json(v) for v in rb.column("value").to_pylist())
            offset = result.next_offset
        return out


# ---------------------------------------------------------------------- Produce in wire form


@dataclass(frozen=True, slots=True)
class ProducePartitionView:
    """One ``ProducePartition`` of a request in wire form; ``records`` is a view of its bytes."""

    topic: str
    partition: int
    records: memoryview


@dataclass(frozen=True, slots=True)
class ProduceRequestView:
    """A ``ProduceRequest`` parsed by :func:`parse_produce_request`."""

    acks: int
    timeout_ms: int
    transactional_id: str
    partitions: tuple[ProducePartitionView, ...]


def _varint(data: memoryview, pos: int) -> tuple[int, int]:
    """The base-128 varint at ``data[pos]`` (at most 10 bytes) and the position after it."""
    value = shift = 0
    for i in range(pos, min(pos + 10, len(data))):
        byte = data[i]
        value |= (byte & 0x7F) << shift
        if not byte & 0x80:
            return value, i + 1
        shift += 7
    raise InvalidRequestError("Produce: malformed request (truncated or overlong varint)")


def _int32(value: int) -> int:
    """A varint as protobuf's int32: the low 32 bits, signed."""
    value &= 0xFFFFFFFF
    return value - (1 << 32) if value & 0x80000000 else value


def _fields(data: memoryview) -> Iterator[tuple[int, int, int | memoryview]]:
    """``(field number, wire type, value)`` of every field of a message: varints as ints,
    length-delimited fields as views; fixed32/fixed64 fields are skipped."""
    pos, end = 0, len(data)
    while pos < end:
        key, pos = _varint(data, pos)
        number, wire_type = key >> 3, key & 7
        if number == 0:
            raise InvalidRequestError("Produce: malformed request (field number 0)")
        if wire_type == 0:
            value, pos = _varint(data, pos)
            yield number, wire_type, value
        elif wire_type == 2:
            size, pos = _varint(data, pos)
            if pos + size > end:
                raise InvalidRequestError("Produce: malformed request (a field runs past the end)")
            yield number, wire_type, data[pos:pos + size]
            pos += size
        elif wire_type in (1, 5):
            pos += 8 if wire_type == 1 else 4
            if pos > end:
                raise InvalidRequestError("Produce: malformed request (a field runs past the end)")
        else:
            raise InvalidRequestError(f"Produce: malformed request (wire type {wire_type})")


def _text(view: memoryview) -> str:
    try:
        return str(view, "utf-8")
    except UnicodeDecodeError:
        raise InvalidRequestError("Produce: malformed request (a string is not UTF-8)") from None


def _encode_varint(value: int) -> bytes:
    out = bytearray()
    while value > 0x7F:
        out.append((value & 0x7F) | 0x80)
        value >>= 7
    out.append(value)
    return bytes(out)


_RECORDS_KEY = _encode_varint(pb.FetchPartitionResponse.DESCRIPTOR.fields_by_name["records"].number << 3 | 2)
_PARTITIONS_KEY = _encode_varint(pb.FetchResponse.DESCRIPTOR.fields_by_name["partitions"].number << 3 | 2)


def encode_fetch_response(
    partitions: Sequence[tuple[pb.FetchPartitionResponse, bytes | memoryview]],
) -> bytes:
    """A ``FetchResponse`` in protobuf wire form: each partition's answer (without records)
    serialized, then its ``records`` field appended as they are.

    The records are copied once, by the final join. The result parses as the
    ``FetchResponse`` whose partitions carry those records (the records field comes
    last instead of in field-number order, which protobuf parsers accept).
    """
    out: list[bytes | memoryview] = []
    for resp, records in partitions:
        head = resp.SerializeToString()
        tail: list[bytes | memoryview] = [_RECORDS_KEY, _encode_varint(len(records)), records] if len(records) else []
        out += (_PARTITIONS_KEY, _encode_varint(len(head) + sum(len(p) for p in tail)), head, *tail)
    return b"".join(out)


def parse_produce_request(data: bytes) -> ProduceRequestView:
    """Parse a ``ProduceRequest`` in protobuf wire form without copying the records.

    Reads what protobuf reads: ``acks`` (1), ``timeout_ms`` (2), ``transactional_id``
    (3) and each ``partitions`` (4) entry's ``topic`` (1), ``partition`` (2) and
    ``records`` (3); the last value of a repeated scalar wins, unknown fields and
    known fields of another wire type are skipped. Records are views of ``data``.
    Raises :class:`InvalidRequestError` for bytes protobuf would not parse
    (truncation, bad varints, field number 0, invalid UTF-8; groups are refused).
    """
    acks = timeout_ms = 0
    transactional_id = ""
    partitions: list[ProducePartitionView] = []
    for number, wire_type, value in _fields(memoryview(data)):
        if wire_type == 0 and number in (1, 2):
            assert isinstance(value, int)
            if number == 1:
                acks = _int32(value)
            else:
                timeout_ms = _int32(value)
        elif wire_type == 2 and number == 3:
            assert isinstance(value, memoryview)
            transactional_id = _text(value)
        elif wire_type == 2 and number == 4:
            assert isinstance(value, memoryview)
            topic, partition, records = "", 0, memoryview(b"")
            for sub_number, sub_type, sub_value in _fields(value):
                if sub_type == 0 and sub_number == 2:
                    assert isinstance(sub_value, int)
                    partition = _int32(sub_value)
                elif sub_type == 2 and sub_number in (1, 3):
                    assert isinstance(sub_value, memoryview)
                    if sub_number == 1:
                        topic = _text(sub_value)
                    else:
                        records = sub_value
            partitions.append(ProducePartitionView(topic, partition, records))
    return ProduceRequestView(acks, timeout_ms, transactional_id, tuple(partitions))


# ---------------------------------------------------------------------- running


async def serve(config: BrokerConfig, *, ready: Callable[[int], None] | None = None,
                stop_event: asyncio.Event | None = None) -> None:
    """Run a broker until ``stop_event`` is set (or SIGTERM/SIGINT when it is None)."""
    broker = Broker(config)
    port = await broker.start()
    if ready is not None:
        ready(port)
    stop = stop_event or asyncio.Event()
    if stop_event is None:
        loop = asyncio.get_running_loop()
        for sig in (signal.SIGTERM, signal.SIGINT):
            loop.add_signal_handler(sig, stop.set)
    await stop.wait()
    log.info("shutting down")
    await broker.stop()


def main(argv: list[str] | None = None) -> int:
    """``python -m logstore.broker``: the same as ``logstore broker start``."""
    parser = argparse.ArgumentParser(prog="logstore-broker")
    parser.add_argument("--config", default=None)
    parser.add_argument("--data-dir", default=None)
    parser.add_argument("--host", default=None)
    parser.add_argument("--port", type=int, default=None)
    args = parser.parse_args(argv)
    return run_broker(args.config, data_dir=args.data_dir, host=args.host, port=args.port)


def run_broker(config_path: str | None, *, data_dir: str | None = None, host: str | None = None,
               port: int | None = None, extra: dict[str, Any] | None = None) -> int:
    """Start a broker in the foreground; print ``listening on HOST:PORT`` once bound."""
    logging.basicConfig(level=os.environ.get("LOGSTORE_LOG_LEVEL", "INFO"),
                        format="%(asctime)s %(levelname)s %(name)s: %(message)s", stream=sys.stderr)
    try:
        config = load_broker_config(
            config_path, overrides={"data_dir": data_dir, "host": host, "port": port, **(extra or {})}
        )
    except LogstoreError as e:
        print(f"error: {e}", file=sys.stderr)
        return 2

    def ready(bound: int) -> None:
        print(f"listening on {config.host}:{bound}", flush=True)

    try:
        asyncio.run(serve(config, ready=ready))
    except LogstoreError as e:
        print(f"error: {e}", file=sys.stderr)
        return 1
    except OSError as e:
        print(f"error: [BROKER_START_FAILED] cannot start the broker: {e}", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
