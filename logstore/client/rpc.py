"""The one place that talks gRPC: :class:`BrokerClient`, a typed connection to a broker.

Every RPC of ``logstore/_proto/logstore.proto`` has one typed method here;
:class:`~logstore.client.producer.Producer`, :class:`~logstore.client.consumer.Consumer`,
:class:`~logstore.client.admin.Admin` and the Spark connectors build on them and
never touch protobuf or grpc themselves.

Errors are mapped in one place, at this boundary:

* an item-level ``Error`` with a non-empty code (one topic or partition of a
  request failed) becomes :func:`logstore.errors.error_for_code` of it. Methods
  whose callers need per-item outcomes return those errors next to the items
  (``ProducedPartition.error``, ``FetchedPartition.error``, ...); the others
  raise the first one.
* a failed call (:class:`grpc.RpcError`) becomes the error named by the
  ``logstore-error-code`` trailing metadata when the broker set it, else by
  its gRPC status: UNAVAILABLE → :class:`BrokerUnavailableError`,
  DEADLINE_EXCEEDED → :class:`RequestTimedOutError`, INVALID_ARGUMENT →
  :class:`InvalidRequestError`, RESOURCE_EXHAUSTED → :class:`RecordTooLargeError`,
  anything else → :class:`UnknownServerError`. The message names the RPC, the
  broker address and the status.

Every call has a deadline: ``request_timeout_ms`` (per client, overridable
per call); a fetch gets its long-poll wait on top.

Thread-safety: a :class:`BrokerClient` is safe to share between threads (the
underlying gRPC channel is). It pickles as its bootstrap address and options:
unpickling opens a new channel, so Spark tasks get their own connections.
"""

from __future__ import annotations

import concurrent.futures
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any, TypeVar

import grpc
from google.protobuf.message import DecodeError

from logstore._proto import logstore_pb2 as pb
from logstore._proto import logstore_pb2_grpc as pb_grpc
from logstore.defaults import default_bootstrap
from logstore.errors import (
    WIRE_CODE_KEY,
    BrokerUnavailableError,
    InvalidRequestError,
    LogstoreError,
    RecordTooLargeError,
    RequestTimedOutError,
    UnknownServerError,
    error_for_code,
)
from logstore.record import decode_schema, value_schema_of
from logstore.types import (
    GroupDescription,
    GroupListing,
    ListedOffset,
    MemberDescription,
    NewTopic,
    OffsetAndMetadata,
    PartitionInfo,
    TopicDescription,
    TopicPartition,
    TxnRef,
)
from logstore.wire import RecordsArg, decode_fetch_response, encode_produce_request

__all__ = [
    "BrokerClient",
    "BrokerInfo",
    "ClusterMetadata",
    "ProducedPartition",
    "FetchRequestPartition",
    "FetchedPartition",
    "AbortedTransaction",
    "ConfigAlteration",
    "ISOLATION_LEVELS",
    "EARLIEST_TIMESTAMP",
    "LATEST_TIMESTAMP",
    "MAX_MESSAGE_BYTES",
    "DEFAULT_REQUEST_TIMEOUT_MS",
    "fetched_partitions",
    "error_from_item",
    "error_from_rpc",
    "raise_for_errors",
    "about",
    "CleanableSegment",
    "PartitionCleaning",
    "TopicCleaning",
    "ReplacedSegments",
    "RpcFuture",
    "GroupHeartbeat",
]

# gRPC message size limit on both directions; the broker caps requests itself.
MAX_MESSAGE_BYTES = 256 << 20
DEFAULT_REQUEST_TIMEOUT_MS = 30_000
# ListOffsets sentinels (the proto's conventions).
EARLIEST_TIMESTAMP = -2
LATEST_TIMESTAMP = -1
ISOLATION_LEVELS: dict[str, pb.IsolationLevel] = {
    "read_uncommitted": pb.READ_UNCOMMITTED,
    "read_committed": pb.READ_COMMITTED,
}

_STATUS_ERRORS: dict[grpc.StatusCode, type[LogstoreError]] = {
    grpc.StatusCode.UNAVAILABLE: BrokerUnavailableError,
    grpc.StatusCode.DEADLINE_EXCEEDED: RequestTimedOutError,
    grpc.StatusCode.INVALID_ARGUMENT: InvalidRequestError,
    grpc.StatusCode.RESOURCE_EXHAUSTED: RecordTooLargeError,
}

_T = TypeVar("_T")


# --------------------------------------------------------------------------- error mapping


def error_from_item(error: pb.Error | None) -> LogstoreError | None:
    """The error an item-level ``Error`` reports, or None when its code is empty (success)."""
    if error is None or not error.code:
        return None
    return error_for_code(error.code, error.message or error.code)


def error_from_rpc(exc: grpc.RpcError, *, rpc: str, target: str) -> LogstoreError:
    """Map a failed gRPC call to the logstore error it stands for (see the module docstring)."""
    code = None
    details = ""
    status: grpc.StatusCode | None = None
    if isinstance(exc, grpc.Call):
        try:
            for key, value in exc.trailing_metadata() or ():
                if key == WIRE_CODE_KEY:
                    code = value.decode() if isinstance(value, bytes) else str(value)
        except Exception:  # a call that never reached the broker may lack metadata
            code = None
        details = exc.details() or ""
        status = exc.code()
    status_name = status.name if status is not None else "UNKNOWN"
    if code:
        return error_for_code(code, details or f"{rpc} failed on broker {target}")
    cls = _STATUS_ERRORS.get(status, UnknownServerError) if status is not None else UnknownServerError
    if cls is BrokerUnavailableError:
        what = f"broker {target} is unavailable ({rpc}: {details or status_name})"
    elif cls is RequestTimedOutError:
        what = f"{rpc} to broker {target} timed out ({details or status_name})"
    else:
        what = f"{rpc} to broker {target} failed with gRPC status {status_name}: {details}"
    return cls(what)


def about(error: LogstoreError, item: object) -> LogstoreError:
    """A copy of ``error`` (same class and code) whose message starts with the ``item`` it is about."""
    return type(error)(f"{item}: {error.message}")


def raise_for_errors(errors: Iterable[tuple[str, LogstoreError | None]]) -> None:
    """Raise the first error of ``(item name, error)`` pairs, its message prefixed by the item."""
    for name, err in errors:
        if err is not None:
            raise about(err, name) from None


# --------------------------------------------------------------------------- results


class RpcFuture(concurrent.futures.Future[_T]):
    """The future of a call started without blocking; :meth:`cancel_call` abandons the call
    (the future then fails with :class:`BrokerUnavailableError` "was cancelled" unless the
    answer arrived first)."""

    _call: Any = None

    def cancel_call(self) -> None:
        if self._call is not None and not self.done():
            self._call.cancel()


@dataclass(frozen=True, slots=True)
class GroupHeartbeat:
    """The answer to a consumer group heartbeat: the member's epoch and every partition it
    may consume now (see :meth:`BrokerClient.group_heartbeat_async`)."""

    member_id: str
    member_epoch: int
    heartbeat_interval_ms: int
    session_timeout_ms: int
    assignment: frozenset[TopicPartition]


@dataclass(frozen=True, slots=True)
class BrokerInfo:
    node_id: int
    host: str
    port: int


@dataclass(frozen=True, slots=True)
class ClusterMetadata:
    """A Metadata answer: the brokers, described topics and per-topic errors."""

    cluster_id: str
    controller_id: int
    brokers: tuple[BrokerInfo, ...]
    topics: Mapping[str, TopicDescription]
    topic_errors: Mapping[str, LogstoreError]


@dataclass(frozen=True, slots=True)
class ProducedPartition:
    """The broker's answer for one partition of a Produce request.

    ``base_offsets`` has one entry per batch sent, in request order; record i
    of a batch has offset ``base_offset + i``. ``log_append_time_ms`` is -1
    unless the topic stamps records with the broker's append time.
    """

    topic: str
    partition: int
    error: LogstoreError | None
    base_offsets: tuple[int, ...]
    log_append_time_ms: int
    log_start_offset: int


@dataclass(frozen=True, slots=True)
class FetchRequestPartition:
    """One partition to fetch from ``offset``, at most ``max_bytes`` of batches."""

    topic_partition: TopicPartition
    offset: int
    max_bytes: int
    current_leader_epoch: int = -1


@dataclass(frozen=True, slots=True)
class AbortedTransaction:
    producer_id: int
    first_offset: int


@dataclass(frozen=True, slots=True)
class FetchedPartition:
    """The broker's answer for one partition of a Fetch request.

    ``schema`` is the Arrow schema message of the segment the batches come
    from, ``records`` the stored batch messages back to back (see
    :func:`logstore.record.iter_batches`; a view of the broker's answer, not a
    copy); the first batch may start before the fetch offset. ``next_offset`` is where the next fetch should start.
    """

    topic: str
    partition: int
    error: LogstoreError | None
    high_watermark: int
    last_stable_offset: int
    log_start_offset: int
    schema: bytes
    records: bytes | memoryview
    aborted_transactions: tuple[AbortedTransaction, ...]
    next_offset: int

    @property
    def topic_partition(self) -> TopicPartition:
        return TopicPartition(self.topic, self.partition)


@dataclass(frozen=True, slots=True)
class ConfigAlteration:
    """Config changes for one topic: keys to ``set`` and keys to ``delete`` (reset to default)."""

    set: Mapping[str, str]
    delete: tuple[str, ...] = ()


@dataclass(frozen=True, slots=True)
class CleanableSegment:
    """A closed segment as the cleaner sees it; ``(base_offset, next_offset, size_bytes)``
    is its identity for :meth:`BrokerClient.replace_segments`. ``next_offset`` is exclusive."""

    base_offset: int
    next_offset: int
    size_bytes: int
    max_timestamp: int = -1


@dataclass(frozen=True, slots=True)
class PartitionCleaning:
    """A partition's cleaning state (see :class:`logstore.storage.segment_replacement.CleaningState`).

    Records below ``cleanable_end_offset`` may be compacted (it is a segment
    base offset, at most the active segment's and the LSO); ``segments`` are
    the closed segments below it; ``dirty_ratio`` is ``dirty_bytes / (clean_bytes
    + dirty_bytes)`` where clean segments lie wholly below ``first_dirty_offset``
    (the cleaner checkpoint). ``in_progress``: a compaction is swapping segments now.
    """

    topic: str
    partition: int
    error: LogstoreError | None
    log_start_offset: int
    log_end_offset: int
    last_stable_offset: int
    active_segment_base: int
    first_dirty_offset: int
    cleanable_end_offset: int
    clean_bytes: int
    dirty_bytes: int
    dirty_ratio: float
    segments: tuple[CleanableSegment, ...]
    in_progress: bool

    @property
    def topic_partition(self) -> TopicPartition:
        return TopicPartition(self.topic, self.partition)


@dataclass(frozen=True, slots=True)
class TopicCleaning:
    """A topic's compaction configs and the cleaning state of each partition."""

    name: str
    cleanup_policy: str
    min_cleanable_dirty_ratio: float
    delete_retention_ms: int
    min_compaction_lag_ms: int
    segment_bytes: int
    partitions: tuple[PartitionCleaning, ...]

    @property
    def compact(self) -> bool:
        return "compact" in self.cleanup_policy


@dataclass(frozen=True, slots=True)
class ReplacedSegments:
    """The answer of a successful :meth:`BrokerClient.replace_segments`."""

    new_base_offsets: tuple[int, ...]
    bytes_before: int
    bytes_after: int
    batches: int
    records: int
    cleaner_checkpoint: int


# --------------------------------------------------------------------------- the client


def _rebuild_client(bootstrap: str, request_timeout_ms: int) -> BrokerClient:
    return BrokerClient(bootstrap, request_timeout_ms=request_timeout_ms)


class BrokerClient:
    """A connection to one broker with a typed method per RPC.

    ``bootstrap`` is ``"host:port"`` (default :func:`logstore.defaults.default_bootstrap`:
    ``$LOGSTORE_BOOTSTRAP`` or ``127.0.0.1:9392``). The channel connects lazily;
    a broker that is down surfaces as :class:`BrokerUnavailableError` on the
    first call. Use :meth:`close` (or ``with``) to release the channel.

    Thread-safe; picklable (see the module docstring).
    """

    def __init__(
        self,
        bootstrap: str | None = None,
        *,
        request_timeout_ms: int = DEFAULT_REQUEST_TIMEOUT_MS,
    ) -> None:
        target = bootstrap or default_bootstrap()
        if not isinstance(target, str) or ":" not in target:
            raise ValueError(f"bootstrap must be 'host:port', got {target!r}")
        if request_timeout_ms <= 0:
            raise ValueError(f"request_timeout_ms must be positive, got {request_timeout_ms}")
        self._bootstrap = target
        self._request_timeout_ms = int(request_timeout_ms)
        self._channel = grpc.insecure_channel(
            target,
            options=[
                ("grpc.max_send_message_length", MAX_MESSAGE_BYTES),
                ("grpc.max_receive_message_length", MAX_MESSAGE_BYTES),
                # Brokers are addressed directly; never route through an HTTP proxy.
                ("grpc.enable_http_proxy", 0),
            ],
        )
        self._stub = pb_grpc.LogstoreStub(self._channel)
        # Produce takes a request already in wire form (see encode_produce_request):
        # the records are copied once into it instead of three times.
        self._produce_raw = self._channel.unary_unary(
            "/logstore.v1.Logstore/Produce",
            request_serializer=None,
            response_deserializer=pb.ProduceResponse.FromString,
        )
        # Fetch answers arrive in wire form (see fetched_partitions): the records
        # stay views of the answer instead of two copies (parse, attribute access).
        self._fetch_raw = self._channel.unary_unary(
            "/logstore.v1.Logstore/Fetch",
            request_serializer=pb.FetchRequest.SerializeToString,
            response_deserializer=None,
        )
        self._closed = False

    @classmethod
    def from_bootstrap(cls, bootstrap: str) -> BrokerClient:
        """A client for ``bootstrap`` with default options (what a Spark task calls)."""
        return cls(bootstrap)

    @property
    def bootstrap(self) -> str:
        return self._bootstrap

    @property
    def request_timeout_ms(self) -> int:
        return self._request_timeout_ms

    @property
    def closed(self) -> bool:
        return self._closed

    def __reduce__(self) -> tuple[Callable[..., BrokerClient], tuple[str, int]]:
        return (_rebuild_client, (self._bootstrap, self._request_timeout_ms))

    def __repr__(self) -> str:
        return f"BrokerClient({self._bootstrap!r})"

    def close(self) -> None:
        """Close the channel; calls in flight fail. Idempotent."""
        if not self._closed:
            self._closed = True
            self._channel.close()

    def __enter__(self) -> BrokerClient:
        return self

    def __exit__(self, *exc_info: object) -> None:
        self.close()

    # ------------------------------------------------------------------ plumbing

    def _deadline_s(self, timeout_ms: int | None, extra_ms: int = 0) -> float:
        return ((timeout_ms if timeout_ms is not None else self._request_timeout_ms) + extra_ms) / 1000

    def _call(self, rpc: str, request: Any, *, timeout_s: float, method: Any = None) -> Any:
        if self._closed:
            raise RuntimeError(f"{rpc}: the client for {self._bootstrap} is closed")
        method = method or getattr(self._stub, rpc)
        try:
            return method(request, timeout=timeout_s)
        except grpc.RpcError as e:
            raise error_from_rpc(e, rpc=rpc, target=self._bootstrap) from None

    def _call_future(
        self, rpc: str, request: Any, *, timeout_s: float, convert: Callable[[Any], _T],
        method: Any = None,
    ) -> concurrent.futures.Future[_T]:
        """Start ``rpc`` without blocking; the future holds ``convert(response)`` or the mapped error."""
        if self._closed:
            raise RuntimeError(f"{rpc}: the client for {self._bootstrap} is closed")
        out: RpcFuture[_T] = RpcFuture()
        out.set_running_or_notify_cancel()
        call = (method or getattr(self._stub, rpc)).future(request, timeout=timeout_s)
        out._call = call

        def done(f: grpc.Future) -> None:
            try:
                response = f.result()
            except grpc.RpcError as e:
                out.set_exception(error_from_rpc(e, rpc=rpc, target=self._bootstrap))
                return
            except grpc.FutureCancelledError:
                out.set_exception(BrokerUnavailableError(f"{rpc} to {self._bootstrap} was cancelled"))
                return
            try:
                out.set_result(convert(response))
            except BaseException as e:  # a malformed answer must still complete the future
                out.set_exception(e)

        call.add_done_callback(done)
        return out

    # ------------------------------------------------------------------ topics

    def create_topics(
        self, topics: Sequence[NewTopic], *, validate_only: bool = False,
        timeout_ms: int | None = None,
    ) -> dict[str, LogstoreError | None]:
        """Create ``topics``; return each name's error (None = created or, with validate_only, valid)."""
        request = pb.CreateTopicsRequest(
            topics=[
                pb.NewTopic(
                    name=t.name,
                    partitions=t.num_partitions,
                    replication_factor=t.replication_factor,
                    configs={str(k): str(v) for k, v in t.configs.items()},
                    value_schema=(
                        t.value_schema.serialize().to_pybytes() if t.value_schema is not None else b""
                    ),
                )
                for t in topics
            ],
            validate_only=validate_only,
        )
        response = self._call("CreateTopics", request, timeout_s=self._deadline_s(timeout_ms))
        return {r.name: error_from_item(r.error) for r in response.results}

    def delete_topics(
        self, names: Sequence[str], *, timeout_ms: int | None = None
    ) -> dict[str, LogstoreError | None]:
        """Delete topics; return each name's error (None = deleted)."""
        response = self._call(
            "DeleteTopics", pb.DeleteTopicsRequest(names=list(names)),
            timeout_s=self._deadline_s(timeout_ms),
        )
        return {r.name: error_from_item(r.error) for r in response.results}

    def metadata(
        self, topics: Sequence[str] | None = None, *, timeout_ms: int | None = None
    ) -> ClusterMetadata:
        """Describe ``topics`` (None or empty = every topic).

        A topic the broker could not describe (e.g. unknown) is in
        ``topic_errors`` instead of ``topics``.
        """
        response = self._call(
            "Metadata", pb.MetadataRequest(topics=list(topics or ())),
            timeout_s=self._deadline_s(timeout_ms),
        )
        described: dict[str, TopicDescription] = {}
        errors: dict[str, LogstoreError] = {}
        for t in response.topics:
            err = error_from_item(t.error)
            if err is not None:
                errors[t.name] = err
                continue
            schema, _ = decode_schema(t.schema, where=f"metadata of topic {t.name!r}")
            partitions = tuple(
                sorted(
                    (
                        PartitionInfo(
                            topic=t.name,
                            partition=p.partition,
                            leader=p.leader,
                            leader_epoch=p.leader_epoch,
                            replicas=tuple(p.replicas),
                            isr=tuple(p.isr),
                            log_start_offset=p.log_start_offset,
                            log_end_offset=p.log_end_offset,
                            high_watermark=p.high_watermark,
                            last_stable_offset=p.last_stable_offset,
                            size_bytes=p.size_bytes,
                            error=error_from_item(p.error),
                        )
                        for p in t.partitions
                    ),
                    key=lambda p: p.partition,
                )
            )
            described[t.name] = TopicDescription(
                name=t.name,
                topic_id=t.topic_id,
                schema=schema,
                value_schema=value_schema_of(schema),
                partitions=partitions,
            )
        return ClusterMetadata(
            cluster_id=response.cluster_id,
            controller_id=response.controller_id,
            brokers=tuple(BrokerInfo(b.node_id, b.host, b.port) for b in response.brokers),
            topics=described,
            topic_errors=errors,
        )

    def describe_configs(
        self, topics: Sequence[str], *, timeout_ms: int | None = None
    ) -> dict[str, dict[str, str] | LogstoreError]:
        """Each topic's effective configs (Kafka names, string values), or its error."""
        response = self._call(
            "DescribeConfigs", pb.DescribeConfigsRequest(topics=list(topics)),
            timeout_s=self._deadline_s(timeout_ms),
        )
        out: dict[str, dict[str, str] | LogstoreError] = {}
        for r in response.results:
            err = error_from_item(r.error)
            out[r.name] = err if err is not None else dict(r.configs)
        return out

    def alter_configs(
        self, alterations: Mapping[str, ConfigAlteration], *, validate_only: bool = False,
        timeout_ms: int | None = None,
    ) -> dict[str, LogstoreError | None]:
        """Apply config changes per topic; return each topic's error (None = applied)."""
        request = pb.AlterConfigsRequest(
            alterations=[
                pb.AlterConfigsRequest.Alteration(
                    topic=topic,
                    set={str(k): str(v) for k, v in a.set.items()},
                    delete=list(a.delete),
                )
                for topic, a in alterations.items()
            ],
            validate_only=validate_only,
        )
        response = self._call("AlterConfigs", request, timeout_s=self._deadline_s(timeout_ms))
        return {r.name: error_from_item(r.error) for r in response.results}

    # ------------------------------------------------------------------ produce

    def produce_async(
        self,
        partitions: Sequence[tuple[TopicPartition, RecordsArg]],
        *,
        acks: int,
        timeout_ms: int | None = None,
        transactional_id: str = "",
    ) -> concurrent.futures.Future[list[ProducedPartition]]:
        """Send a Produce request without blocking.

        Each item is a partition and a complete Arrow IPC stream (stored
        schema message + batch messages), as bytes or as a sequence of
        bytes-like pieces to be concatenated. The future holds one
        :class:`ProducedPartition` per item (item errors inside), or raises
        the mapped error when the whole call failed. The broker gets
        ``timeout_ms`` to satisfy ``acks``; the call's deadline adds
        ``request_timeout_ms`` to that.
        """
        wait_ms = self._request_timeout_ms if timeout_ms is None else timeout_ms
        request = encode_produce_request(
            partitions, acks=acks, timeout_ms=wait_ms, transactional_id=transactional_id
        )
        return self._call_future(
            "Produce", request, timeout_s=self._deadline_s(wait_ms, self._request_timeout_ms),
            convert=_produce_results, method=self._produce_raw,
        )

    def produce(
        self,
        partitions: Sequence[tuple[TopicPartition, RecordsArg]],
        *,
        acks: int,
        timeout_ms: int | None = None,
    ) -> list[ProducedPartition]:
        """Blocking form of :meth:`produce_async`."""
        return self.produce_async(partitions, acks=acks, timeout_ms=timeout_ms).result()

    # ------------------------------------------------------------------ fetch

    def fetch(
        self,
        partitions: Sequence[FetchRequestPartition],
        *,
        max_wait_ms: int,
        min_bytes: int = 1,
        max_bytes: int = 64 << 20,
        isolation_level: str = "read_committed",
        timeout_ms: int | None = None,
    ) -> list[FetchedPartition]:
        """Fetch stored batches (long poll: the broker answers once ``min_bytes``
        are available or ``max_wait_ms`` passed).

        Returns one :class:`FetchedPartition` per partition in the answer, with
        item errors (e.g. OFFSET_OUT_OF_RANGE) inside. The call's deadline is
        ``max_wait_ms`` plus ``timeout_ms`` (default ``request_timeout_ms``).
        """
        request = _fetch_request(partitions, max_wait_ms=max_wait_ms, min_bytes=min_bytes,
                                 max_bytes=max_bytes, isolation_level=isolation_level)
        response = self._call(
            "Fetch", request, timeout_s=self._deadline_s(timeout_ms, max(0, max_wait_ms)),
            method=self._fetch_raw,
        )
        return self._fetched(response)

    def fetch_async(
        self,
        partitions: Sequence[FetchRequestPartition],
        *,
        max_wait_ms: int,
        min_bytes: int = 1,
        max_bytes: int = 64 << 20,
        isolation_level: str = "read_committed",
        timeout_ms: int | None = None,
    ) -> RpcFuture[list[FetchedPartition]]:
        """:meth:`fetch` without blocking; ``cancel_call()`` on the future abandons the long poll."""
        request = _fetch_request(partitions, max_wait_ms=max_wait_ms, min_bytes=min_bytes,
                                 max_bytes=max_bytes, isolation_level=isolation_level)
        future = self._call_future(
            "Fetch", request, timeout_s=self._deadline_s(timeout_ms, max(0, max_wait_ms)),
            convert=self._fetched, method=self._fetch_raw,
        )
        assert isinstance(future, RpcFuture)
        return future

    def _fetched(self, response: bytes) -> list[FetchedPartition]:
        try:
            return fetched_partitions(response)
        except (ValueError, DecodeError) as e:
            raise UnknownServerError(f"Fetch: the answer of broker {self._bootstrap} is malformed: {e}") from None

    # ------------------------------------------------------------------ consumer groups

    def group_heartbeat_async(
        self,
        group_id: str,
        *,
        member_id: str,
        member_epoch: int,
        subscribed_topics: Sequence[str],
        owned: Iterable[TopicPartition],
        instance_id: str = "",
        assignor: str = "",
        rebalance_timeout_ms: int = 300_000,
        max_wait_ms: int = 0,
        request_seq: int = 0,
        client_id: str = "",
        timeout_ms: int | None = None,
    ) -> RpcFuture[GroupHeartbeat]:
        """Send a consumer group heartbeat (see ``ConsumerGroupHeartbeatRequest`` in the proto).

        Epoch 0 joins, -1 leaves, -2 leaves for now (a static member). The
        broker holds the answer of an in-sync member up to ``max_wait_ms`` (a
        long poll); ``cancel_call()`` abandons it. The future raises the mapped
        error, e.g. :class:`UnknownMemberIdError` or :class:`FencedMemberEpochError`
        (rejoin), :class:`FencedInstanceIdError` (a newer process took over).
        """
        by_topic: dict[str, list[int]] = {}
        for tp in owned:
            by_topic.setdefault(tp.topic, []).append(tp.partition)
        request = pb.ConsumerGroupHeartbeatRequest(
            group_id=group_id, member_id=member_id, member_epoch=member_epoch, instance_id=instance_id,
            rebalance_timeout_ms=rebalance_timeout_ms, subscribed_topics=list(subscribed_topics),
            server_assignor=assignor, max_wait_ms=max_wait_ms, request_seq=request_seq, client_id=client_id,
            owned_partitions=[pb.TopicPartitions(topic=t, partitions=sorted(ps)) for t, ps in sorted(by_topic.items())],
        )

        def convert(r: Any) -> GroupHeartbeat:
            _raise_item(r.error)
            return GroupHeartbeat(
                member_id=r.member_id, member_epoch=r.member_epoch,
                heartbeat_interval_ms=r.heartbeat_interval_ms, session_timeout_ms=r.session_timeout_ms,
                assignment=frozenset(TopicPartition(a.topic, p) for a in r.assignment for p in a.partitions),
            )

        future = self._call_future("ConsumerGroupHeartbeat", request,
                                   timeout_s=self._deadline_s(timeout_ms, max(0, max_wait_ms)), convert=convert)
        assert isinstance(future, RpcFuture)
        return future

    def commit_offsets(
        self,
        group_id: str,
        offsets: Mapping[TopicPartition, int | OffsetAndMetadata],
        *,
        member_id: str = "",
        member_epoch: int = -1,
        timeout_ms: int | None = None,
    ) -> None:
        """Commit offsets of ``group_id`` (all or nothing); raise the first error.

        A member names itself (``member_id``, ``member_epoch``); a commit from
        outside the group (no member id) is refused with :class:`NonEmptyGroupError`
        while the group has members.
        """
        request = pb.OffsetCommitRequest(group_id=group_id, member_id=member_id, member_epoch=member_epoch)
        for tp, value in offsets.items():
            o = value if isinstance(value, OffsetAndMetadata) else OffsetAndMetadata(int(value))
            request.partitions.add(topic=tp.topic, partition=tp.partition, offset=o.offset, metadata=o.metadata)
        r = self._call("OffsetCommit", request, timeout_s=self._deadline_s(timeout_ms))
        _raise_item(r.error)
        raise_for_errors((f"{p.topic}-{p.partition}", error_from_item(p.error)) for p in r.partitions)

    def fetch_committed_offsets(
        self, group_id: str, partitions: Iterable[TopicPartition] | None = None, *,
        timeout_ms: int | None = None,
    ) -> dict[TopicPartition, OffsetAndMetadata | None]:
        """The committed offsets of ``group_id`` (None where nothing is committed);
        ``partitions`` None = every partition with a committed offset."""
        by_topic: dict[str, list[int]] = {}
        for tp in partitions or ():
            by_topic.setdefault(tp.topic, []).append(tp.partition)
        r = self._call("OffsetFetch", pb.OffsetFetchRequest(group_id=group_id, partitions=[
            pb.TopicPartitions(topic=t, partitions=ps) for t, ps in by_topic.items()]),
            timeout_s=self._deadline_s(timeout_ms))
        _raise_item(r.error)
        return {
            TopicPartition(c.topic, c.partition):
                OffsetAndMetadata(c.offset, c.metadata, c.commit_timestamp_ms) if c.offset >= 0 else None
            for c in r.offsets
        }

    def list_groups(self, *, timeout_ms: int | None = None) -> list[GroupListing]:
        """Every consumer group the broker knows (with members or committed offsets)."""
        r = self._call("ListGroups", pb.ListGroupsRequest(), timeout_s=self._deadline_s(timeout_ms))
        return [GroupListing(g.group_id, g.state, g.members, g.assignor) for g in r.groups]

    def describe_groups(
        self, group_ids: Sequence[str], *, timeout_ms: int | None = None
    ) -> dict[str, GroupDescription | LogstoreError]:
        """Describe groups: members, assignments, committed offsets (or each group's error)."""
        r = self._call("DescribeGroups", pb.DescribeGroupsRequest(group_ids=list(group_ids)),
                       timeout_s=self._deadline_s(timeout_ms))
        out: dict[str, GroupDescription | LogstoreError] = {}
        for g in r.groups:
            err = error_from_item(g.error)
            if err is not None:
                out[g.group_id] = err
                continue
            out[g.group_id] = GroupDescription(
                group_id=g.group_id, state=g.state, group_epoch=g.group_epoch,
                assignment_epoch=g.assignment_epoch, assignor=g.assignor,
                members=tuple(MemberDescription(
                    member_id=m.member_id, instance_id=m.instance_id, client_id=m.client_id,
                    client_host=m.client_host, member_epoch=m.member_epoch,
                    subscribed_topics=tuple(m.subscribed_topics), assignment=_tps(m.assignment),
                    pending_revocation=_tps(m.pending_revocation), target_assignment=_tps(m.target_assignment),
                    assignor=m.server_assignor, left=m.left,
                ) for m in g.members),
                offsets={TopicPartition(c.topic, c.partition): OffsetAndMetadata(c.offset, c.metadata,
                                                                                  c.commit_timestamp_ms)
                         for c in g.offsets},
            )
        return out

    def delete_groups(
        self, group_ids: Sequence[str], *, timeout_ms: int | None = None
    ) -> dict[str, LogstoreError | None]:
        """Delete empty groups and their committed offsets; return each group's error (None = deleted)."""
        r = self._call("DeleteGroups", pb.DeleteGroupsRequest(group_ids=list(group_ids)),
                       timeout_s=self._deadline_s(timeout_ms))
        return {g.group_id: error_from_item(g.error) for g in r.results}

    # ------------------------------------------------------------------ offsets

    def list_offsets(
        self,
        timestamps: Mapping[TopicPartition, int],
        *,
        isolation_level: str = "read_uncommitted",
        timeout_ms: int | None = None,
    ) -> dict[TopicPartition, ListedOffset | LogstoreError]:
        """Look up offsets: timestamp -2 = earliest, -1 = latest, else the first
        offset whose record timestamp is ``>=`` it (``ListedOffset.offset`` None if none).
        """
        request = pb.ListOffsetsRequest(
            isolation_level=_isolation(isolation_level),
            partitions=[
                pb.ListOffsetsPartition(topic=tp.topic, partition=tp.partition, timestamp=ts)
                for tp, ts in timestamps.items()
            ],
        )
        response = self._call("ListOffsets", request, timeout_s=self._deadline_s(timeout_ms))
        out: dict[TopicPartition, ListedOffset | LogstoreError] = {}
        for r in response.partitions:
            tp = TopicPartition(r.topic, r.partition)
            err = error_from_item(r.error)
            out[tp] = err if err is not None else ListedOffset(
                offset=r.offset if r.offset >= 0 else None, timestamp_ms=r.timestamp
            )
        return out

    def delete_records(
        self, before: Mapping[TopicPartition, int], *, timeout_ms: int | None = None
    ) -> dict[TopicPartition, int | LogstoreError]:
        """Delete records below each offset (-1 = the HWM); return the new log start offsets."""
        request = pb.DeleteRecordsRequest(
            partitions=[
                pb.DeleteRecordsPartition(topic=tp.topic, partition=tp.partition, offset=offset)
                for tp, offset in before.items()
            ]
        )
        response = self._call("DeleteRecords", request, timeout_s=self._deadline_s(timeout_ms))
        out: dict[TopicPartition, int | LogstoreError] = {}
        for r in response.partitions:
            err = error_from_item(r.error)
            out[TopicPartition(r.topic, r.partition)] = err if err is not None else r.low_watermark
        return out

    # ------------------------------------------------------------------ compaction

    # ------------------------------------------------------------------ transactions

    def init_producer_id(
        self, transactional_id: str = "", *, transaction_timeout_ms: int = 60_000,
        timeout_ms: int | None = None,
    ) -> tuple[int, int]:
        """A producer id and epoch (empty ``transactional_id``: an idempotent producer).

        For a transactional id this fences any earlier producer with the same id
        and aborts its open transaction.
        """
        r = self._call("InitProducerId", pb.InitProducerIdRequest(
            transactional_id=transactional_id, transaction_timeout_ms=transaction_timeout_ms,
        ), timeout_s=self._deadline_s(timeout_ms))
        _raise_item(r.error)
        return r.producer_id, r.producer_epoch

    def add_partitions_to_txn(
        self, ref: TxnRef, partitions: Iterable[TopicPartition], *, timeout_ms: int | None = None
    ) -> int:
        """Add partitions to the open (or a new) transaction of ``ref``; return its number."""
        r = self._call("AddPartitionsToTxn", pb.AddPartitionsToTxnRequest(
            transactional_id=ref.transactional_id, producer_id=ref.producer_id,
            producer_epoch=ref.producer_epoch,
            partitions=[pb.TopicPartitionRef(topic=tp.topic, partition=tp.partition) for tp in partitions],
        ), timeout_s=self._deadline_s(timeout_ms))
        _raise_item(r.error)
        return r.txn_number

    def end_txn(self, ref: TxnRef, *, commit: bool, timeout_ms: int | None = None) -> None:
        """Commit or abort transaction ``ref.txn_number`` (idempotent for a retried request)."""
        r = self._call("EndTxn", pb.EndTxnRequest(
            transactional_id=ref.transactional_id, producer_id=ref.producer_id,
            producer_epoch=ref.producer_epoch, txn_number=ref.txn_number, commit=commit,
        ), timeout_s=self._deadline_s(timeout_ms))
        _raise_item(r.error)

    def end_txn_group(
        self, group_id: str, batch_id: int, txns: Iterable[TxnRef], *, abort_prefix: str,
        commit: bool, timeout_ms: int | None = None,
    ) -> tuple[bool, int]:
        """End a transaction group's batch; return (committed now?, last committed batch id)."""
        r = self._call("EndTxnGroup", pb.EndTxnGroupRequest(
            group_id=group_id, batch_id=batch_id, abort_prefix=abort_prefix, commit=commit,
            txns=[pb.TxnRef(transactional_id=t.transactional_id, producer_id=t.producer_id,
                            producer_epoch=t.producer_epoch, txn_number=t.txn_number) for t in txns],
        ), timeout_s=self._deadline_s(timeout_ms))
        _raise_item(r.error)
        return r.committed, r.last_committed_batch_id

    def last_committed_batch(self, group_id: str, *, timeout_ms: int | None = None) -> int:
        """The last batch id committed by transaction group ``group_id`` (-1 if none)."""
        r = self._call("DescribeTxnGroup", pb.DescribeTxnGroupRequest(group_id=group_id),
                       timeout_s=self._deadline_s(timeout_ms))
        _raise_item(r.error)
        return r.last_committed_batch_id

    def describe_cleaning(
        self, topics: Sequence[str] | None = None, *, now_ms: int | None = None,
        timeout_ms: int | None = None,
    ) -> dict[str, TopicCleaning | LogstoreError]:
        """Cleaning state of ``topics`` (None or empty = every topic whose cleanup.policy
        includes compact), or each topic's error. ``now_ms`` is the clock for
        ``min.compaction.lag.ms`` (default: the broker's). A partition that could
        not be described carries its error in ``PartitionCleaning.error``."""
        response = self._call(
            "DescribeCleaning", pb.DescribeCleaningRequest(topics=list(topics or ()), now_ms=now_ms or 0),
            timeout_s=self._deadline_s(timeout_ms),
        )
        out: dict[str, TopicCleaning | LogstoreError] = {}
        for t in response.topics:
            err = error_from_item(t.error)
            if err is not None:
                out[t.name] = err
                continue
            out[t.name] = TopicCleaning(
                name=t.name, cleanup_policy=t.cleanup_policy,
                min_cleanable_dirty_ratio=t.min_cleanable_dirty_ratio,
                delete_retention_ms=t.delete_retention_ms, min_compaction_lag_ms=t.min_compaction_lag_ms,
                segment_bytes=t.segment_bytes,
                partitions=tuple(
                    PartitionCleaning(
                        topic=t.name, partition=p.partition, error=error_from_item(p.error),
                        log_start_offset=p.log_start_offset, log_end_offset=p.log_end_offset,
                        last_stable_offset=p.last_stable_offset, active_segment_base=p.active_segment_base,
                        first_dirty_offset=p.first_dirty_offset, cleanable_end_offset=p.cleanable_end_offset,
                        clean_bytes=p.clean_bytes, dirty_bytes=p.dirty_bytes, dirty_ratio=p.dirty_ratio,
                        segments=tuple(
                            CleanableSegment(s.base_offset, s.next_offset, s.size_bytes, s.max_timestamp)
                            for s in p.segments
                        ),
                        in_progress=p.in_progress,
                    )
                    for p in sorted(t.partitions, key=lambda p: p.partition)
                ),
            )
        return out

    def replace_segments(
        self,
        tp: TopicPartition,
        *,
        segments: Sequence[CleanableSegment],
        end_offset: int,
        chunks: Iterable[tuple[bytes, bytes]],
        cleaner_checkpoint: int = -1,
        timeout_ms: int = 600_000,
    ) -> ReplacedSegments:
        """Replace the consecutive closed ``segments`` of ``tp`` (ending where the segment
        at ``end_offset`` starts) with a compacted copy, atomically.

        ``chunks`` yields ``(schema_message, records)`` pairs streamed to the broker
        as they are produced: a stored schema message (empty = unchanged) and
        whole stored batch messages in offset order, with their original offsets
        and CRCs. Raises :class:`CompactionConflictError` (retriable; nothing
        changed) when the segments changed meanwhile or another compaction of the
        partition runs, other errors as mapped; an exception raised by ``chunks``
        cancels the call (the broker discards what it got) and is re-raised.
        """
        failure: list[BaseException] = []

        def requests() -> Iterable[pb.ReplaceSegmentsRequest]:
            yield pb.ReplaceSegmentsRequest(begin=pb.ReplaceSegmentsBegin(
                topic=tp.topic, partition=tp.partition, end_offset=end_offset,
                cleaner_checkpoint=cleaner_checkpoint,
                segments=[pb.CleanableSegment(base_offset=s.base_offset, next_offset=s.next_offset,
                                              size_bytes=s.size_bytes, max_timestamp=s.max_timestamp)
                          for s in segments],
            ))
            try:
                for schema, records in chunks:
                    yield pb.ReplaceSegmentsRequest(chunk=pb.ReplacementChunk(schema=schema, records=records))
            except BaseException as e:
                failure.append(e)
                raise

        try:
            r = self._call("ReplaceSegments", requests(), timeout_s=self._deadline_s(timeout_ms))
        except LogstoreError:
            if failure:
                raise failure[0] from None
            raise
        return ReplacedSegments(
            new_base_offsets=tuple(r.new_base_offsets), bytes_before=r.bytes_before,
            bytes_after=r.bytes_after, batches=r.batches, records=r.records,
            cleaner_checkpoint=r.cleaner_checkpoint,
        )


def _raise_item(error: pb.Error) -> None:
    err = error_from_item(error)
    if err is not None:
        raise err


def _fetch_request(
    partitions: Sequence[FetchRequestPartition], *, max_wait_ms: int, min_bytes: int, max_bytes: int,
    isolation_level: str,
) -> pb.FetchRequest:
    return pb.FetchRequest(
        max_wait_ms=max_wait_ms,
        min_bytes=min_bytes,
        max_bytes=max_bytes,
        isolation_level=_isolation(isolation_level),
        partitions=[
            pb.FetchPartition(
                topic=p.topic_partition.topic,
                partition=p.topic_partition.partition,
                fetch_offset=p.offset,
                partition_max_bytes=p.max_bytes,
                current_leader_epoch=p.current_leader_epoch,
            )
            for p in partitions
        ],
    )


def fetched_partitions(data: bytes) -> list[FetchedPartition]:
    """A ``FetchResponse`` in wire form (see :func:`logstore.wire.decode_fetch_response`) as
    :class:`FetchedPartition` objects; their records are views of ``data``."""
    return [
        FetchedPartition(
            topic=r.topic,
            partition=r.partition,
            error=error_from_item(r.error),
            high_watermark=r.high_watermark,
            last_stable_offset=r.last_stable_offset,
            log_start_offset=r.log_start_offset,
            schema=r.schema,
            records=records,
            aborted_transactions=tuple(
                AbortedTransaction(a.producer_id, a.first_offset) for a in r.aborted_transactions
            ),
            next_offset=r.next_offset,
        )
        for r, records in decode_fetch_response(data)
    ]


def _tps(items: Iterable[Any]) -> frozenset[TopicPartition]:
    return frozenset(TopicPartition(i.topic, p) for i in items for p in i.partitions)


def _isolation(level: str) -> pb.IsolationLevel:
    try:
        return ISOLATION_LEVELS[level]
    except KeyError:
        raise ValueError(
            f"isolation_level must be one of {sorted(ISOLATION_LEVELS)}, got {level!r}"
        ) from None


def _produce_results(response: Any) -> list[ProducedPartition]:
    return [
        ProducedPartition(
            topic=r.topic,
            partition=r.partition,
            error=error_from_item(r.error),
            base_offsets=tuple(r.base_offsets),
            log_append_time_ms=r.log_append_time_ms,
            log_start_offset=r.log_start_offset,
        )
        for r in response.partitions
    ]
