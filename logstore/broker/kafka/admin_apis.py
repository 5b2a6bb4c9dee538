"""The Kafka admin APIs of topics and the cluster: what ``AdminClient``, ``kafka-topics.sh``,
``kafka-configs.sh``, ``kafka-delete-records.sh`` and Kafka Connect's start-up call.

They act exactly as the gRPC admin RPCs do: on a single broker on its
:class:`~logstore.storage.log_manager.LogManager`, on a cluster on the topics in etcd
(:class:`~logstore.broker.cluster_topics.ClusterTopicAdmin`: placed over the live brokers
and replicated). A topic created here is an ordinary logstore topic, and the other way round.

==========================  ========  ===================================================
API (key)                   versions  notes
==========================  ========  ===================================================
CreateTopics (19)           2-7       -1 partitions: the broker's ``num_partitions``;
                                      replication factor -1: the broker's
                                      ``default_replication_factor`` (1 on a single
                                      broker, which serves no other); configs such as
                                      ``min.insync.replicas`` as given; manual
                                      assignments are refused (INVALID_REQUEST)
DeleteTopics (20)           1-6       by name; by topic id (v6) too
DeleteRecords (21)          0-2       offset -1: the high watermark
DescribeConfigs (32)        1-4       TOPIC resources; a topic's own overrides have
                                      source TOPIC_CONFIG (1), the rest DEFAULT_CONFIG
                                      (5); other resource types: INVALID_REQUEST
CreatePartitions (37)       0-3       grows a topic; manual assignments refused
IncrementalAlterConfigs     0-1       TOPIC resources; SET, DELETE, and APPEND /
(44)                                  SUBTRACT on the list config ``cleanup.policy``
DescribeCluster (60)        0-1       the brokers with a Kafka listener, the cluster id
                                      and the controller (:mod:`.cluster`)
==========================  ========  ===================================================

Names starting with ``__`` are the broker's own topics, as on the gRPC side: they cannot
be created, deleted or grown. Errors are per topic (or resource, or partition), with
Kafka's codes (:mod:`.error_codes`) and our message.

Authorization, as Kafka's, per topic (or resource, or partition) with
TOPIC_AUTHORIZATION_FAILED: CreateTopics needs CREATE on the cluster or on the topic (and
DESCRIBE_CONFIGS on it for v5+'s configs in the answer, else its ``topic_config_error_code``
says so); DeleteTopics and DeleteRecords DELETE on the topic; CreatePartitions ALTER;
DescribeConfigs DESCRIBE_CONFIGS; IncrementalAlterConfigs ALTER_CONFIGS. DescribeCluster
needs nothing (as Kafka's).

Thread-safety: event loop only; file work runs on ``run_io``.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from typing import TYPE_CHECKING, Any

from kio.schema.errors import ErrorCode

from logstore.broker.cluster_topics import ClusterTopic, ClusterTopicAdmin
from logstore.broker.kafka.error_codes import kafka_error_code
from logstore.broker.kafka.messages import (
    NO_THROTTLE,
    ZERO_UUID,
    answer_each,
    build,
    nested,
    response_of,
    topic_uuid,
)
from logstore.broker.kafka.request_context import RequestContext
from logstore.broker.security.acls import CLUSTER_NAME
from logstore.errors import (
    InternalTopicError,
    InvalidConfigError,
    InvalidReplicationFactorError,
    InvalidRequestError,
    LogstoreError,
    OffsetOutOfRangeError,
)

if TYPE_CHECKING:
    from logstore.broker.kafka.cluster import KafkaCluster
    from logstore.broker.placement import Placement
    from logstore.broker.security.authorization import Authorization
    from logstore.storage.log_manager import LogManager
    from logstore.storage.topic_info import TopicInfo

__all__ = ["ADMIN_APIS", "KafkaAdminApis"]

CREATE_TOPICS, DELETE_TOPICS, DELETE_RECORDS, DESCRIBE_CONFIGS = 19, 20, 21, 32
CREATE_PARTITIONS, INCREMENTAL_ALTER_CONFIGS, DESCRIBE_CLUSTER = 37, 44, 60
ADMIN_APIS: dict[int, tuple[int, int]] = {
    CREATE_TOPICS: (2, 7), DELETE_TOPICS: (1, 6), DELETE_RECORDS: (0, 2), DESCRIBE_CONFIGS: (1, 4),
    CREATE_PARTITIONS: (0, 3), INCREMENTAL_ALTER_CONFIGS: (0, 1), DESCRIBE_CLUSTER: (0, 1),
}
TOPIC_RESOURCE = 2  # Kafka's ConfigResource.Type.TOPIC
SOURCE_TOPIC_CONFIG, SOURCE_DEFAULT_CONFIG = 1, 5  # Kafka's ConfigSource
SET, DELETE, APPEND, SUBTRACT = 0, 1, 2, 3  # IncrementalAlterConfigs' config_operation
LIST_CONFIGS = frozenset({"cleanup.policy"})  # the configs whose value is a comma-separated list


class KafkaAdminApis:
    """Answers the admin APIs of :data:`ADMIN_APIS`; see the module docstring.

    ``default_partitions`` is the broker's ``num_partitions``; ``cluster`` the cluster as
    Kafka clients see it (DescribeCluster); ``cluster_topics`` the topics of a cluster
    (None: a single broker, whose topics are ``manager``'s); ``authorization`` answers the
    ACL checks.
    """

    def __init__(self, *, manager: LogManager, placement: Placement, cluster: KafkaCluster,
                 cluster_topics: ClusterTopicAdmin | None, default_partitions: int, authorization: Authorization,
                 run_io: Callable[..., Awaitable[Any]]) -> None:
        self._manager = manager
        self._authorization = authorization
        self._placement = placement
        self._cluster = cluster
        self._cluster_topics = cluster_topics
        self._default_partitions = default_partitions
        self._run_io = run_io

    def _topic(self, name: str) -> TopicInfo | ClusterTopic:
        """``name``'s identity and configs, from the cluster or the log manager."""
        return self._cluster_topics.describe(name) if self._cluster_topics is not None else self._manager.topic(name)

    def handlers(self) -> dict[int, Callable[[Any, RequestContext], Awaitable[Any]]]:
        return {CREATE_TOPICS: self._create_topics, DELETE_TOPICS: self._delete_topics,
                DELETE_RECORDS: self._delete_records, DESCRIBE_CONFIGS: self._describe_configs,
                CREATE_PARTITIONS: self._create_partitions,
                INCREMENTAL_ALTER_CONFIGS: self._incremental_alter_configs,
                DESCRIBE_CLUSTER: self._describe_cluster}

    # ------------------------------------------------------------------ topics

    async def _create_topics(self, request: Any, context: RequestContext) -> Any:
        response_type = response_of(request)
        result_type = nested(response_type, "CreatableTopicResult")
        config_type = _nested_or_none(response_type, "CreatableTopicConfigs")  # v5+
        authz, principal = self._authorization, context.principal
        any_topic = authz.allowed(principal, "CREATE", "CLUSTER", CLUSTER_NAME)

        async def create(topic: Any) -> Any:
            if not any_topic:
                authz.check(principal, "CREATE", "TOPIC", topic.name)
            _refuse_internal(topic.name, "created")
            if topic.assignments:
                raise InvalidRequestError("manual replica assignments are not served: give a partition "
                                          "count (the broker places partitions)")
            replication_factor = int(topic.replication_factor)
            if replication_factor == 0 or replication_factor < -1:
                raise InvalidReplicationFactorError(f"replication factor {replication_factor}: give -1 (the "
                                                    "broker's default) or at least 1")
            partitions = self._default_partitions if topic.num_partitions == -1 else int(topic.num_partitions)
            configs = {c.name: c.value for c in topic.configs if c.value is not None}
            info: TopicInfo | ClusterTopic
            if self._cluster_topics is not None:
                info = await self._cluster_topics.create(
                    topic.name, partitions=partitions, configs=configs, validate_only=request.validate_only,
                    replication_factor=None if replication_factor == -1 else replication_factor)
            else:
                if replication_factor not in (-1, 1):
                    raise InvalidReplicationFactorError(
                        f"replication factor {replication_factor} is not available: this broker is not part of a "
                        "cluster (start brokers with --metadata etcd://HOST:PORT)")
                info = await self._run_io(lambda: self._manager.create_topic(
                    topic.name, partitions=partitions, configs=configs, value_schema=None,
                    validate_only=request.validate_only))
            configs_shown = authz.allowed(principal, "DESCRIBE_CONFIGS", "TOPIC", topic.name)
            return build(
                result_type, name=topic.name, topic_id=topic_uuid(info.topic_id), error_code=ErrorCode.none,
                error_message=None, num_partitions=info.partitions,
                topic_config_error_code=ErrorCode.none if configs_shown else ErrorCode.topic_authorization_failed,
                replication_factor=info.replication_factor if isinstance(info, ClusterTopic) else 1,
                configs=None if config_type is None else () if not configs_shown else tuple(
                    build(config_type, name=k, value=v, read_only=False, is_sensitive=False,
                          config_source=SOURCE_TOPIC_CONFIG if k in info.overrides else SOURCE_DEFAULT_CONFIG)
                    for k, v in sorted(info.describe_configs().items())))

        def refused(topic: Any, e: LogstoreError) -> Any:
            return build(result_type, name=topic.name, topic_id=ZERO_UUID, error_code=kafka_error_code(e),
                         error_message=e.message, topic_config_error_code=ErrorCode.none, num_partitions=-1,
                         replication_factor=-1, configs=None)
        return build(response_type, throttle_time=NO_THROTTLE,
                     topics=await answer_each(request.topics, create, refused))

    async def _delete_topics(self, request: Any, context: RequestContext) -> Any:
        response_type = response_of(request)
        result_type = nested(response_type, "DeletableTopicResult")
        by_id = {topic_uuid(topic_id): name for topic_id, name in self._cluster.topic_ids().items()}
        # v6 names topics by name or id; older versions by name only
        wanted = ([(t.name, t.topic_id) for t in request.topics] if hasattr(request, "topics")
                  else [(n, ZERO_UUID) for n in request.topic_names])

        async def delete(named: tuple[str | None, Any]) -> Any:
            name, topic_id = named
            if name is None and topic_id not in by_id:
                return build(result_type, name=None, topic_id=topic_id, error_code=ErrorCode.unknown_topic_id,
                             error_message=f"no topic has the id {topic_id}")
            name = name if name is not None else by_id[topic_id]
            self._authorization.check(context.principal, "DELETE", "TOPIC", name)
            _refuse_internal(name, "deleted")
            info = self._topic(name)
            if self._cluster_topics is not None:
                await self._cluster_topics.delete(name)
            else:
                await self._run_io(self._manager.delete_topic, name)
            return build(result_type, name=name, topic_id=topic_uuid(info.topic_id), error_code=ErrorCode.none,
                         error_message=None)

        def refused(named: tuple[str | None, Any], e: LogstoreError) -> Any:
            return build(result_type, name=named[0], topic_id=named[1], error_code=kafka_error_code(e),
                         error_message=e.message)
        return build(response_type, throttle_time=NO_THROTTLE, responses=await answer_each(wanted, delete, refused))

    async def _create_partitions(self, request: Any, context: RequestContext) -> Any:
        response_type = response_of(request)
        result_type = nested(response_type, "CreatePartitionsTopicResult")

        async def grow(topic: Any) -> Any:
            self._authorization.check(context.principal, "ALTER", "TOPIC", topic.name)
            _refuse_internal(topic.name, "grown")
            if topic.assignments:
                raise InvalidRequestError("manual replica assignments are not served: give only the new count")
            if self._cluster_topics is not None:
                await self._cluster_topics.add_partitions(topic.name, int(topic.count),
                                                          validate_only=request.validate_only)
            else:
                await self._run_io(lambda: self._manager.add_partitions(topic.name, int(topic.count),
                                                                        validate_only=request.validate_only))
            return build(result_type, name=topic.name, error_code=ErrorCode.none, error_message=None)

        def refused(topic: Any, e: LogstoreError) -> Any:
            return build(result_type, name=topic.name, error_code=kafka_error_code(e), error_message=e.message)
        return build(response_type, throttle_time=NO_THROTTLE,
                     results=await answer_each(request.topics, grow, refused))

    async def _delete_records(self, request: Any, context: RequestContext) -> Any:
        response_type = response_of(request)
        topic_type = nested(response_type, "DeleteRecordsTopicResult")
        partition_type = nested(response_type, "DeleteRecordsPartitionResult")
        topics = []
        for topic in request.topics:
            async def trim(p: Any, name: str = topic.name) -> Any:
                self._authorization.check(context.principal, "DELETE", "TOPIC", name)
                part = self._placement.leader(name, int(p.partition_index))
                offset = part.high_watermark if p.offset == -1 else int(p.offset)
                if offset < 0 or offset > part.high_watermark:
                    raise OffsetOutOfRangeError(
                        f"cannot delete records before {offset}: the high watermark is {part.high_watermark}")
                low = await self._run_io(part.log.delete_records_before, offset)
                return build(partition_type, partition_index=p.partition_index, low_watermark=low,
                             error_code=ErrorCode.none)

            def refused(p: Any, e: LogstoreError) -> Any:
                return build(partition_type, partition_index=p.partition_index, low_watermark=-1,
                             error_code=kafka_error_code(e))
            topics.append(build(topic_type, name=topic.name,
                                partitions=await answer_each(topic.partitions, trim, refused)))
        return build(response_type, throttle_time=NO_THROTTLE, topics=tuple(topics))

    # ------------------------------------------------------------------ configs

    async def _describe_configs(self, request: Any, context: RequestContext) -> Any:
        response_type = response_of(request)
        result_type = nested(response_type, "DescribeConfigsResult")
        entry_type = nested(response_type, "DescribeConfigsResourceResult")

        async def describe(resource: Any) -> Any:
            _check_topic_resource(resource)
            self._authorization.check(context.principal, "DESCRIBE_CONFIGS", "TOPIC", resource.resource_name)
            info = self._topic(resource.resource_name)
            wanted = None if resource.configuration_keys is None else set(resource.configuration_keys)
            entries = tuple(
                build(entry_type, name=k, value=v, read_only=False,
                      config_source=SOURCE_TOPIC_CONFIG if k in info.overrides else SOURCE_DEFAULT_CONFIG,
                      is_default=k not in info.overrides, is_sensitive=False, synonyms=(), config_type=0,
                      documentation=None)
                for k, v in sorted(info.describe_configs().items()) if wanted is None or k in wanted)
            return build(result_type, error_code=ErrorCode.none, error_message=None,
                         resource_type=resource.resource_type, resource_name=resource.resource_name,
                         configs=entries)

        def refused(resource: Any, e: LogstoreError) -> Any:
            return build(result_type, error_code=kafka_error_code(e), error_message=e.message,
                         resource_type=resource.resource_type, resource_name=resource.resource_name, configs=())
        return build(response_type, throttle_time=NO_THROTTLE,
                     results=await answer_each(request.resources, describe, refused))

    async def _incremental_alter_configs(self, request: Any, context: RequestContext) -> Any:
        response_type = response_of(request)
        result_type = nested(response_type, "AlterConfigsResourceResponse")

        async def alter(resource: Any) -> Any:
            _check_topic_resource(resource)
            self._authorization.check(context.principal, "ALTER_CONFIGS", "TOPIC", resource.resource_name)
            name = resource.resource_name
            current = self._topic(name).describe_configs()
            set_configs: dict[str, str] = {}
            delete_keys: list[str] = []
            for c in resource.configs:
                if c.config_operation == SET:
                    set_configs[c.name] = c.value or ""
                elif c.config_operation == DELETE:
                    delete_keys.append(c.name)
                elif c.config_operation in (APPEND, SUBTRACT):
                    set_configs[c.name] = _list_change(c.name, set_configs.get(c.name, current.get(c.name, "")),
                                                       c.value or "", append=c.config_operation == APPEND)
                else:
                    raise InvalidRequestError(f"config operation {c.config_operation} is not one of "
                                              "SET (0), DELETE (1), APPEND (2), SUBTRACT (3)")
            if self._cluster_topics is not None:
                await self._cluster_topics.alter_configs(name, set_configs=set_configs, delete_keys=delete_keys,
                                                         validate_only=request.validate_only)
            else:
                await self._run_io(lambda: self._manager.alter_configs(
                    name, set_configs=set_configs, delete_keys=delete_keys, validate_only=request.validate_only))
            return build(result_type, error_code=ErrorCode.none, error_message=None,
                         resource_type=resource.resource_type, resource_name=name)

        def refused(resource: Any, e: LogstoreError) -> Any:
            return build(result_type, error_code=kafka_error_code(e), error_message=e.message,
                         resource_type=resource.resource_type, resource_name=resource.resource_name)
        return build(response_type, throttle_time=NO_THROTTLE,
                     responses=await answer_each(request.resources, alter, refused))

    # ------------------------------------------------------------------ cluster

    async def _describe_cluster(self, request: Any, context: RequestContext) -> Any:
        response_type = response_of(request)
        broker_type = nested(response_type, "DescribeClusterBroker")
        brokers = tuple(build(broker_type, broker_id=b.node_id, host=b.host, port=b.port, rack=b.rack,
                              is_fenced=False) for b in self._cluster.brokers())
        return build(response_type, throttle_time=NO_THROTTLE, error_code=ErrorCode.none, error_message=None,
                     endpoint_type=getattr(request, "endpoint_type", 1), cluster_id=self._cluster.cluster_id,
                     controller_id=self._cluster.controller_id(), brokers=brokers,
                     cluster_authorized_operations=-2147483648)


def _nested_or_none(response_type: Any, name: str) -> Any:
    """The entity ``name`` of ``response_type``'s version, or None when that version has none."""
    try:
        return nested(response_type, name)
    except AttributeError:
        return None


def _refuse_internal(name: str, done: str) -> None:
    if name.startswith("__"):
        raise InternalTopicError(f"topic {name!r} is internal (names starting with '__' hold the broker's own "
                                 f"state) and cannot be {done}")


def _check_topic_resource(resource: Any) -> None:
    if resource.resource_type != TOPIC_RESOURCE:
        raise InvalidRequestError(f"resource type {resource.resource_type}: only topic configs (type "
                                  f"{TOPIC_RESOURCE}) are served; a broker's settings are in its broker.toml")


def _list_change(name: str, current: str, items: str, *, append: bool) -> str:
    """``current`` (a comma-separated list) with ``items`` appended or subtracted."""
    if name not in LIST_CONFIGS:
        raise InvalidConfigError(f"{name!r} is not a list config: APPEND and SUBTRACT apply to "
                                 f"{', '.join(sorted(LIST_CONFIGS))} only")
    values = [v for v in current.split(",") if v]
    change = [v.strip() for v in items.split(",") if v.strip()]
    if append:
        return ",".join(values + [v for v in change if v not in values])
    return ",".join(v for v in values if v not in change)
