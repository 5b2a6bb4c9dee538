"""The Kafka APIs this broker serves, on the same data plane as the gRPC front end.

:class:`KafkaApis` is Kafka's ``KafkaApis`` in small: it takes a request kio decoded and
answers it with the response of the same version, calling the data plane
(:class:`~logstore.broker.data_plane.DataPlane`) and the log manager, its collaborators
given in its constructor. The APIs and versions served (:data:`SUPPORTED`) are exactly
what ApiVersions advertises; an API not listed is absent, never half-answered:

=============  ========  =====================================================
API (key)      versions  notes
=============  ========  =====================================================
Produce (0)    3-9       RecordBatch v2, acks 0/1/-1, gzip/snappy/lz4/zstd
Fetch (1)      4-12      read_uncommitted and read_committed; no fetch sessions
                         (a session is never created: session id 0)
ListOffsets    1-6       earliest (-2), latest (-1), by timestamp
(2)
Metadata (3)   1-12      the brokers with a Kafka listener, each partition's
                         leader, replicas and ISR (:mod:`.cluster`); no
                         auto-creation
ApiVersions    0-3
(18)
=============  ========  =====================================================

plus, on a SASL listener, SaslHandshake (17) v0-1 and SaslAuthenticate (36) v0-2, which the
listener answers itself (:mod:`.sasl`: they change the connection, not the data).

and, parts given to the constructor, producer ids and transactions
(:mod:`logstore.broker.kafka.txn_apis`); the consumer groups' APIs: committed offsets and
KIP-848 membership (:mod:`logstore.broker.kafka.group_apis`), the classic protocol
(:mod:`logstore.broker.kafka.classic_group_apis`), the groups' admin APIs
(:mod:`logstore.broker.kafka.group_admin_apis`); the admin APIs of topics, configs
and the cluster (:mod:`logstore.broker.kafka.admin_apis`); and of ACLs
(:mod:`logstore.broker.kafka.acl_apis`).

Records: a produced batch becomes one logstore batch, a stored batch one Kafka batch
(:mod:`logstore.broker.kafka.record_batch`); converting runs on the I/O pool. A typed topic
(an Arrow schema for its values) is read by Kafka consumers as one JSON object per value
(:mod:`logstore.broker.kafka.json_values`); produce to it decodes each JSON value into its
columns when its ``value.format`` is ``json`` (:mod:`logstore.broker.kafka.json_produce`: a
value that does not fit refuses the partition's records with INVALID_RECORD (87) and a
KIP-467 record error per bad value), and is refused per partition with
UNSUPPORTED_FOR_MESSAGE_FORMAT (43) and a message saying so otherwise. Errors are per
partition, as Kafka's codes (:mod:`.error_codes`).

Each response is built for its request's version from the fields that version has
(:func:`_build`): one handler per API, not one per version.

Authorization: every handler is given the request's :class:`~.request_context.RequestContext`
and asks the broker's :class:`~logstore.broker.security.authorization.Authorization` what
Kafka's ``KafkaApis`` asks its authorizer, answering a refusal with Kafka's
``*_AUTHORIZATION_FAILED`` code per partition, topic, group or request as Kafka does
(with the authorizer off every check passes). Here: Produce needs WRITE on each topic
(TOPIC_AUTHORIZATION_FAILED for its partitions) and WRITE on the transactional id it names
(TRANSACTIONAL_ID_AUTHORIZATION_FAILED for every partition), and its batches with a
producer id pass :meth:`~logstore.broker.security.authorization.Authorization.producer_check`
(a producer id is not a credential: CLUSTER_AUTHORIZATION_FAILED); Fetch needs READ and
ListOffsets DESCRIBE on each topic; Metadata leaves the topics the caller may not DESCRIBE
out of a listing of all topics and answers a named one TOPIC_AUTHORIZATION_FAILED, whether
it exists or not. Internal topics (``__*``) are for super users only.

Thread-safety: event loop only; conversions and reads run on ``run_io``.
"""

from __future__ import annotations

import dataclasses
import datetime
import logging
import uuid
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from kio.index import load_response_schema
from kio.schema.errors import ErrorCode

from logstore.broker.data_plane.offsets import EARLIEST, offset_for_timestamp
from logstore.broker.data_plane.params import FetchParams, FetchPartition, Isolation, PartitionRead
from logstore.broker.kafka.acl_apis import ACL_APIS, KafkaAclApis
from logstore.broker.kafka.admin_apis import ADMIN_APIS, KafkaAdminApis
from logstore.broker.kafka.classic_group_apis import CLASSIC_GROUP_APIS, KafkaClassicGroupApis
from logstore.broker.kafka.error_codes import kafka_error_code
from logstore.broker.kafka.group_admin_apis import GROUP_ADMIN_APIS, KafkaGroupAdminApis
from logstore.broker.kafka.group_apis import GROUP_APIS, KafkaGroupApis
from logstore.broker.kafka.json_produce import RecordsRefused, json_stored_records
from logstore.broker.kafka.messages import (
    NO_THROTTLE,
    ZERO_UUID,
    build,
    nested,
    response_of,
    topic_uuid,
)
from logstore.broker.kafka.record_batch import decode_batches, to_kafka_batches, to_stored_records
from logstore.broker.kafka.request_context import RequestContext
from logstore.broker.kafka.sasl import SASL_APIS
from logstore.broker.kafka.txn_apis import TXN_APIS, KafkaTxnApis
from logstore.errors import InvalidRequestError, LogstoreError
from logstore.record import decode_schema
from logstore.record_reader import iter_batches

if TYPE_CHECKING:
    from logstore.broker.data_plane import DataPlane
    from logstore.broker.kafka.cluster import KafkaCluster
    from logstore.broker.placement import Placement
    from logstore.broker.security.authorization import Authorization
    from logstore.storage.log_manager import LogManager
    from logstore.storage.topic_info import TopicInfo

__all__ = ["API_VERSIONS_KEY", "KafkaApis", "SUPPORTED"]

log = logging.getLogger("logstore.broker.kafka")

PRODUCE, FETCH, LIST_OFFSETS, METADATA, API_VERSIONS_KEY = 0, 1, 2, 3, 18
# API key -> (min version, max version): what ApiVersions advertises, and all that is served.
SUPPORTED: dict[int, tuple[int, int]] = {
    PRODUCE: (3, 9),
    FETCH: (4, 12),
    LIST_OFFSETS: (1, 6),
    METADATA: (1, 12),
    API_VERSIONS_KEY: (0, 3),
    **TXN_APIS,  # InitProducerId, AddPartitionsToTxn, EndTxn (.txn_apis)
    **GROUP_APIS,  # OffsetCommit, OffsetFetch, FindCoordinator, ConsumerGroupHeartbeat (.group_apis)
    **CLASSIC_GROUP_APIS,  # JoinGroup, SyncGroup, Heartbeat, LeaveGroup (.classic_group_apis)
    **GROUP_ADMIN_APIS,  # ListGroups, DescribeGroups, DeleteGroups (.group_admin_apis)
    **ADMIN_APIS,  # CreateTopics, DeleteTopics, CreatePartitions, configs, DeleteRecords, ... (.admin_apis)
    **ACL_APIS,  # DescribeAcls, CreateAcls, DeleteAcls (.acl_apis)
}
# A produce's records up to this size are converted on the event loop (~50-100 us), larger
# ones on the I/O pool: a Kafka producer with linger.ms=0 sends one record per request, and
# the listener serves a connection's requests one at a time, so each hop is paid per record.
_INLINE_CONVERT_BYTES = 4096
_NO_VALUE_FORMAT = ("is typed (an Arrow schema for its values) and has no value.format: set value.format=json "
                    "(logstore topics alter {topic} --config value.format=json) for Kafka producers to send "
                    "JSON objects of its columns, or produce with logstore's own Producer")


@dataclass(frozen=True, slots=True)
class _Records:
    """A Kafka produce's records for one partition, converted: what the data plane appends."""

    topic: str
    partition: int
    records: bytes
    current_leader_epoch: int = -1


class KafkaApis:
    """Answers Kafka requests; see the module docstring.

    ``cluster`` is the cluster as Kafka clients see it (brokers, leaders; :mod:`.cluster`);
    ``txns``, ``groups``, ``classic_groups``, ``group_admin``, ``admin`` and ``acls`` answer the other APIs (see the
    module docstring); ``authorization`` answers the ACL checks; ``run_io`` runs a call on the
    broker's I/O pool. ``sasl``: the listener authenticates with SASL, so ApiVersions
    advertises SaslHandshake and SaslAuthenticate too (:attr:`versions`).
    """

    def __init__(self, *, manager: LogManager, data_plane: DataPlane, placement: Placement, cluster: KafkaCluster,
                 txns: KafkaTxnApis, groups: KafkaGroupApis, classic_groups: KafkaClassicGroupApis,
                 group_admin: KafkaGroupAdminApis, admin: KafkaAdminApis, acls: KafkaAclApis,
                 authorization: Authorization,
                 max_decompressed_bytes: int, max_request_entries: int, run_io: Callable[..., Awaitable[Any]],
                 sasl: bool = False) -> None:
        # API key -> (min version, max version): what ApiVersions advertises and the listener serves.
        self.versions: dict[int, tuple[int, int]] = {**SUPPORTED, **SASL_APIS} if sasl else dict(SUPPORTED)
        self._authorization = authorization
        self._max_request_entries = max_request_entries
        self._manager = manager
        self._data_plane = data_plane
        self._placement = placement
        self._cluster = cluster
        self._max_decompressed_bytes = max_decompressed_bytes
        self._run_io = run_io
        self._handlers: dict[int, Callable[[Any, RequestContext], Awaitable[Any]]] = {
            PRODUCE: self._produce, FETCH: self._fetch, LIST_OFFSETS: self._list_offsets,
            METADATA: self._metadata, API_VERSIONS_KEY: self._api_versions,
            **txns.handlers(), **groups.handlers(), **classic_groups.handlers(),
            **group_admin.handlers(), **admin.handlers(), **acls.handlers(),
        }

    async def handle(self, request: Any, context: RequestContext) -> Any:
        """The response to ``request`` (a kio request of a supported version, but SaslHandshake
        and SaslAuthenticate: the listener's) from ``context``'s caller, or None (acks=0).
        A request whose lists hold more than ``max_request_entries`` entries, counted together,
        raises :class:`InvalidRequestError` before any work (the listener closes its connection)."""
        entries = _count_entries(request, self._max_request_entries)
        if entries > self._max_request_entries:
            raise InvalidRequestError(f"API key {request.__api_key__} with more than {self._max_request_entries} "
                                      "entries in its lists (max_request_entries)")
        return await self._handlers[request.__api_key__](request, context)

    # ------------------------------------------------------------------ ApiVersions

    def _api_keys(self, response_type: Any) -> tuple[Any, ...]:
        entry = nested(response_type, "ApiVersion")
        return tuple(entry(api_key=key, min_version=low, max_version=high)
                     for key, (low, high) in sorted(self.versions.items()))

    async def _api_versions(self, request: Any, context: RequestContext) -> Any:
        response_type = response_of(request)
        return build(response_type, error_code=ErrorCode.none, api_keys=self._api_keys(response_type),
                      throttle_time=NO_THROTTLE)

    def unsupported_api_versions(self) -> Any:
        """ApiVersions v0 saying UNSUPPORTED_VERSION, for a client that asked in a newer version."""
        response_type = load_response_schema(API_VERSIONS_KEY, 0)
        return build(response_type, error_code=ErrorCode.unsupported_version,
                      api_keys=self._api_keys(response_type))

    # ------------------------------------------------------------------ Metadata

    async def _metadata(self, request: Any, context: RequestContext) -> Any:
        response_type = response_of(request)
        topic_type, partition_type = nested(response_type, "MetadataResponseTopic"), nested(
            response_type, "MetadataResponsePartition")
        cluster = self._cluster
        by_id = cluster.topic_ids()
        principal = context.principal
        # All topics: those the caller may not describe are left out, as Kafka does.
        names: list[str | uuid.UUID] = (
            [n for n in cluster.topic_names() if self._authorization.allowed(principal, "DESCRIBE", "TOPIC", n)]
            if request.topics is None
            else [t.name if t.name is not None
                  else by_id.get(t.topic_id.hex, t.topic_id) if getattr(t, "topic_id", None) is not None
                  else ZERO_UUID for t in request.topics])  # v10+: by id; neither: no topic
        no_name = None if request.__version__ >= 12 else ""  # nullable from v12
        topics = []
        for t, name in zip(request.topics if request.topics is not None else [None] * len(names), names,
                           strict=True):
            if not isinstance(name, str):  # an id this broker does not know (or none at all)
                topics.append(build(topic_type, error_code=ErrorCode.unknown_topic_id, name=no_name,
                                    topic_id=name, partitions=()))
                continue
            if not self._authorization.allowed(principal, "DESCRIBE", "TOPIC", name):
                by_name = t is None or t.name is not None  # named by id: Kafka answers with the id, not the name
                topics.append(build(topic_type, error_code=ErrorCode.topic_authorization_failed,
                                    name=name if by_name else no_name,
                                    topic_id=ZERO_UUID if by_name else t.topic_id, is_internal=False, partitions=()))
                continue
            try:
                layout = cluster.topic(name)
                partitions = tuple(
                    build(partition_type, error_code=kafka_error_code(part.error), partition_index=part.partition,
                          leader_id=part.leader, leader_epoch=part.leader_epoch, replica_nodes=part.replicas,
                          isr_nodes=part.isr, offline_replicas=part.offline)
                    for part in layout.partitions)
                topics.append(build(topic_type, error_code=ErrorCode.none, name=name,
                                     topic_id=topic_uuid(layout.topic_id), is_internal=name.startswith("__"),
                                     partitions=partitions))
            except LogstoreError as e:
                topics.append(build(topic_type, error_code=kafka_error_code(e), name=name, topic_id=ZERO_UUID,
                                     partitions=()))
        broker_type = nested(response_type, "MetadataResponseBroker")
        brokers = tuple(build(broker_type, node_id=b.node_id, host=b.host, port=b.port, rack=b.rack)
                        for b in cluster.brokers())
        return build(response_type, throttle_time=NO_THROTTLE, brokers=brokers, cluster_id=cluster.cluster_id,
                      controller_id=cluster.controller_id(), topics=tuple(topics))

    # ------------------------------------------------------------------ Produce

    async def _produce(self, request: Any, context: RequestContext) -> Any:
        response_type = response_of(request)
        acks = int(request.acks)
        timeout_ms = int(request.timeout.total_seconds() * 1000)
        answers: dict[tuple[str, int], tuple[ErrorCode, str | None, int, int, int]] = {}
        record_errors: dict[tuple[str, int], tuple[tuple[int, str], ...]] = {}  # KIP-467, of refused values
        appends: list[_Records] = []
        authz, principal = self._authorization, context.principal
        refusal = (None if not request.transactional_id
                   or authz.allowed(principal, "WRITE", "TRANSACTIONAL_ID", request.transactional_id)
                   else (ErrorCode.transactional_id_authorization_failed,
                         f"not authorized to WRITE transactional id {request.transactional_id!r}"))
        for topic in request.topic_data:
            topic_refusal = refusal or (
                None if authz.allowed(principal, "WRITE", "TOPIC", topic.name)
                else (ErrorCode.topic_authorization_failed, f"not authorized to WRITE topic {topic.name!r}"))
            for data in topic.partition_data:
                key = (topic.name, int(data.index))
                if topic_refusal is not None:
                    answers[key] = (*topic_refusal, -1, -1, -1)
                    continue
                try:
                    typed = self._typed(topic.name)
                    if typed is not None and typed.config.value_format != "json":
                        answers[key] = (ErrorCode.unsupported_for_message_format,
                                        f"topic {topic.name!r} " + _NO_VALUE_FORMAT.format(topic=topic.name),
                                        -1, -1, -1)
                        continue
                    if data.records is None:
                        raise InvalidRequestError(f"{topic.name}-{data.index}: no records")
                    if len(data.records) <= _INLINE_CONVERT_BYTES:  # no trip to the I/O pool for a few records
                        records = self._convert_produced(topic.name, int(data.index), data.records, typed)
                    else:
                        records = await self._run_io(self._convert_produced, topic.name, int(data.index),
                                                     data.records, typed)
                    appends.append(_Records(topic.name, int(data.index), records))
                except RecordsRefused as e:
                    answers[key] = (kafka_error_code(e), e.message, -1, -1, -1)
                    record_errors[key] = e.record_errors
                except LogstoreError as e:
                    answers[key] = (kafka_error_code(e), e.message, -1, -1, -1)
        if appends:
            try:
                results = await self._data_plane.append_records(
                    appends, acks=acks, timeout_ms=timeout_ms, transactional_id=request.transactional_id or "",
                    check_producer=authz.producer_check(principal))
            except InvalidRequestError as e:  # acks out of range: every partition says so
                code = ErrorCode.invalid_required_acks if "acks" in e.message else kafka_error_code(e)
                results = []
                for a in appends:
                    answers[(a.topic, a.partition)] = (code, e.message, -1, -1, -1)
            for result in results:
                answers[(result.topic, result.partition)] = (
                    kafka_error_code(result.error), None if result.error is None else result.error.message,
                    result.base_offsets[0] if result.base_offsets else -1, result.log_append_time_ms,
                    result.log_start_offset if result.error is None else -1)
        if acks == 0:
            return None
        topic_type = nested(response_type, "TopicProduceResponse")
        partition_type = nested(response_type, "PartitionProduceResponse")
        record_error_type = nested(response_type, "BatchIndexAndErrorMessage") if request.__version__ >= 8 else None
        responses = []
        for topic in request.topic_data:
            parts = []
            for data in topic.partition_data:
                code, message, base_offset, append_time, log_start = answers[(topic.name, int(data.index))]
                parts.append(build(
                    partition_type, index=data.index, error_code=code, base_offset=base_offset,
                    log_append_time=None if append_time < 0 else datetime.datetime.fromtimestamp(
                        append_time / 1000, datetime.timezone.utc),
                    log_start_offset=log_start, error_message=message,
                    record_errors=tuple(record_error_type(batch_index=i, batch_index_error_message=why)
                                        for i, why in record_errors.get((topic.name, int(data.index)), ()))
                    if record_error_type is not None else ()))
            responses.append(build(topic_type, name=topic.name, partition_responses=tuple(parts)))
        return build(response_type, responses=tuple(responses), throttle_time=NO_THROTTLE)

    def _typed(self, topic: str) -> TopicInfo | None:
        """``topic`` if it is typed (None when untyped or when it does not exist: the data plane
        says so)."""
        try:
            info = self._manager.topic(topic)
        except LogstoreError:
            return None
        return info if info.typed else None

    def _log_append_time(self, topic: str) -> bool:
        """Whether ``topic``'s timestamps are the broker's (message.timestamp.type LogAppendTime)."""
        try:
            return self._manager.topic(topic).config.message_timestamp_type == "LogAppendTime"
        except LogstoreError:
            return False

    def _convert_produced(self, topic: str, partition: int, data: bytes, typed: TopicInfo | None) -> bytes:
        """A produce's records for one partition as logstore's; a ``typed`` topic's values
        decoded from JSON into its columns (:mod:`.json_produce`)."""
        where = f"{topic}-{partition}"
        batches = decode_batches(data, max_decompressed_bytes=self._max_decompressed_bytes, where=where)
        if typed is not None:
            return json_stored_records(batches, typed.schema, where=where)
        return to_stored_records(batches)

    # ------------------------------------------------------------------ Fetch

    async def _fetch(self, request: Any, context: RequestContext) -> Any:
        response_type = response_of(request)
        isolation = Isolation.READ_COMMITTED if request.isolation_level == 1 else Isolation.READ_UNCOMMITTED
        refused = {t.topic for t in request.topics
                   if not self._authorization.allowed(context.principal, "READ", "TOPIC", t.topic)}
        wanted = [(topic.topic, p) for topic in request.topics for p in topic.partitions if topic.topic not in refused]
        params = FetchParams(
            partitions=tuple(FetchPartition(t, int(p.partition), int(p.fetch_offset), max_bytes=int(p.partition_max_bytes),
                                            current_leader_epoch=int(getattr(p, "current_leader_epoch", -1)))
                             for t, p in wanted),
            max_wait_s=max(request.max_wait.total_seconds(), 0.0), min_bytes=max(int(request.min_bytes), 0),
            max_bytes=max(int(request.max_bytes), 0), isolation=isolation)
        reads = iter(await self._data_plane.fetch_records(params) if params.partitions else [])
        topic_type, partition_type = nested(response_type, "FetchableTopicResponse"), nested(
            response_type, "PartitionData")
        aborted_type = nested(response_type, "AbortedTransaction")
        responses = []
        for topic in request.topics:
            parts = []
            for p in topic.partitions:
                if topic.topic in refused:
                    parts.append(build(partition_type, partition_index=p.partition,
                                       error_code=ErrorCode.topic_authorization_failed, high_watermark=-1,
                                       last_stable_offset=-1, log_start_offset=-1, aborted_transactions=None,
                                       preferred_read_replica=-1, records=b""))
                    continue
                read: PartitionRead = next(reads)
                error, records = read.error, b""
                if error is None and len(read.records):
                    try:
                        records = await self._run_io(_to_kafka, read.schema, read.records,
                                                     f"{read.topic}-{read.partition}", self._log_append_time(read.topic))
                    except LogstoreError as e:
                        error = e
                aborted = (tuple(aborted_type(producer_id=a.producer_id, first_offset=a.first_offset)
                                 for a in read.aborted) if isolation is Isolation.READ_COMMITTED else None)
                parts.append(build(
                    partition_type, partition_index=p.partition, error_code=kafka_error_code(error),
                    high_watermark=read.high_watermark if error is None else -1,
                    last_stable_offset=read.last_stable_offset if error is None else -1,
                    log_start_offset=read.log_start_offset if error is None else -1,
                    aborted_transactions=aborted if error is None else None, preferred_read_replica=-1,
                    records=records))
            responses.append(build(topic_type, topic=topic.topic, partitions=tuple(parts)))
        return build(response_type, throttle_time=NO_THROTTLE, error_code=ErrorCode.none, session_id=0,
                      responses=tuple(responses))

    # ------------------------------------------------------------------ ListOffsets

    async def _list_offsets(self, request: Any, context: RequestContext) -> Any:
        response_type = response_of(request)
        read_committed = getattr(request, "isolation_level", 0) == 1
        topic_type = nested(response_type, "ListOffsetsTopicResponse")
        partition_type = nested(response_type, "ListOffsetsPartitionResponse")
        topics = []
        for topic in request.topics:
            parts = []
            for p in topic.partitions:
                try:
                    self._authorization.check(context.principal, "DESCRIBE", "TOPIC", topic.name)
                    if p.timestamp < EARLIEST:
                        raise InvalidRequestError(f"timestamp {p.timestamp}: only -2 (earliest), -1 (latest) and "
                                                  "timestamps (ms) are served")
                    part = self._placement.leader(topic.name, int(p.partition_index),
                                                  int(getattr(p, "current_leader_epoch", -1)))
                    offset, timestamp = await offset_for_timestamp(part, int(p.timestamp),
                                                                   read_committed=read_committed, run_io=self._run_io)
                    parts.append(build(partition_type, partition_index=p.partition_index, error_code=ErrorCode.none,
                                        timestamp=timestamp, offset=offset, leader_epoch=part.leader_epoch))
                except LogstoreError as e:
                    code = (ErrorCode.unsupported_version if isinstance(e, InvalidRequestError)
                            else kafka_error_code(e))
                    parts.append(build(partition_type, partition_index=p.partition_index, error_code=code,
                                        timestamp=-1, offset=-1, leader_epoch=-1))
            topics.append(build(topic_type, name=topic.name, partitions=tuple(parts)))
        return build(response_type, throttle_time=NO_THROTTLE, topics=tuple(topics))


def _count_entries(entity: Any, limit: int) -> int:
    """The entries of every list in ``entity`` and its nested entities (stops counting past ``limit``)."""
    total = 0
    for f in dataclasses.fields(entity):
        value = getattr(entity, f.name)
        if isinstance(value, tuple):
            total += len(value)
            for item in value:
                if total > limit:
                    return total
                if dataclasses.is_dataclass(item):
                    total += _count_entries(item, limit - total)
    return total


def _to_kafka(schema_message: bytes, records: memoryview, where: str, log_append_time: bool) -> bytes:
    """Stored batch messages (what a fetch read) as Kafka record batches."""
    schema, _ = decode_schema(schema_message, where=where)
    return to_kafka_batches([(stored, stored.decode(schema)) for stored in iter_batches(records, where=where)],
                            log_append_time=log_append_time)
