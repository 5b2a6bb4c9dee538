"""The topic administration RPCs of the broker: CreateTopics, CreatePartitions, DeleteTopics,
Metadata, DescribeConfigs, AlterConfigs, DeleteRecords (on the partition leader: the log start
offset moves up, never past the HWM).

:class:`TopicRpcs` is a handler the broker composes (its collaborators are constructor
arguments: the broker config, the log manager, the cluster membership, the bound port and the
cluster id a single broker's Metadata answers with, and the
:class:`~logstore.broker.rpc_gate.RpcGate`). On a single broker the handlers act on the local
:class:`~logstore.storage.log_manager.LogManager`; on a cluster (``metadata`` set) on the
topics in etcd (:mod:`logstore.broker.cluster_topics`), internal topics excepted: those stay
each broker's own.

Thread-safety: handlers run on the event loop; file work runs on the I/O pool.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from typing import TYPE_CHECKING, Any

import grpc

from logstore._proto import logstore_pb2 as pb
from logstore.broker import cluster_topics
from logstore.broker.config import BrokerConfig
from logstore.broker.membership import ClusterMembership, is_internal
from logstore.broker.rpc_errors import OK, error_to_pb, unexpected
from logstore.errors import (
    InternalTopicError,
    InvalidReplicationFactorError,
    InvalidRequestError,
    LogstoreError,
)
from logstore.record import encode_schema
from logstore.storage.log_manager import LogManager

if TYPE_CHECKING:
    from logstore.broker.rpc_gate import RpcGate
    from logstore.broker.security.principal import Principal

__all__ = ["TopicRpcs"]


class TopicRpcs:
    """Topic administration; see the module docstring. ``port()`` is the port the broker is
    bound to (known once it started), ``cluster_id`` the id a single broker's Metadata names
    (a cluster's answers name ``config.cluster_id``)."""

    def __init__(self, *, config: BrokerConfig, manager: LogManager, cluster: ClusterMembership,
                 port: Callable[[], int], cluster_id: str, gate: RpcGate) -> None:
        self._config = config
        self._manager = manager
        self._cluster = cluster
        self._port = port
        self._cluster_id = cluster_id
        self._gate = gate

    def rpcs(self) -> dict[str, Callable[..., Awaitable[Any]]]:
        """The RPCs this handler implements, by name."""
        return {"CreateTopics": self.CreateTopics, "CreatePartitions": self.CreatePartitions,
                "DeleteTopics": self.DeleteTopics, "Metadata": self.Metadata,
                "DescribeConfigs": self.DescribeConfigs, "AlterConfigs": self.AlterConfigs,
                "DeleteRecords": self.DeleteRecords}

    async def CreateTopics(self, request: pb.CreateTopicsRequest, context: grpc.aio.ServicerContext) -> pb.CreateTopicsResponse:
        async def body() -> pb.CreateTopicsResponse:
            principal = self._gate.principal(context)
            by_cluster = self._gate.allowed(principal, "CREATE", "CLUSTER", "kafka-cluster")
            results = []
            for topic in request.topics:
                if not ((by_cluster and not topic.name.startswith("__"))
                        or self._gate.allowed(principal, "CREATE", "TOPIC", topic.name)):
                    results.append(pb.TopicResult(name=topic.name, error=_denied(self._gate, principal, "CREATE", topic.name)))
                    continue
                results.append(pb.TopicResult(name=topic.name, error=await self._create_topic(topic, request.validate_only)))
            return pb.CreateTopicsResponse(results=results)
        return await self._gate.guard("CreateTopics", context, body)

    async def _create_topic(self, topic: pb.NewTopic, validate_only: bool) -> pb.Error:
        if topic.name.startswith("__"):  # reserved, with or without the authorizer, for everyone
            return error_to_pb(InternalTopicError(
                f"topic name {topic.name!r} is reserved: names starting with '__' are the broker's internal "
                "topics (__consumer_offsets, __transaction_state, ...), which only the broker creates"))
        if self._cluster.store is not None and not is_internal(topic.name):
            return await self._create_cluster_topic(topic, validate_only)
        try:
            value_schema = cluster_topics.request_value_schema(topic)
            if topic.replication_factor not in (0, 1):
                raise InvalidReplicationFactorError(
                    f"replication factor {topic.replication_factor} is not available: this broker is not part "
                    "of a cluster (start brokers with --metadata etcd://HOST:PORT)"
                )
            partitions = topic.partitions or self._config.num_partitions
            await self._gate.run_io(lambda: self._manager.create_topic(
                topic.name, partitions=partitions, configs=dict(topic.configs),
                value_schema=value_schema, validate_only=validate_only,
            ))
            return OK
        except LogstoreError as e:
            return error_to_pb(e)
        except Exception as e:  # noqa: BLE001
            return error_to_pb(unexpected(e, "CreateTopics"))

    async def _create_cluster_topic(self, topic: pb.NewTopic, validate_only: bool) -> pb.Error:
        assert self._cluster.store is not None and self._cluster.view is not None
        try:
            record = await cluster_topics.create_topic(
                self._cluster.store, self._cluster.view, topic, default_partitions=self._config.num_partitions,
                default_replication_factor=self._config.default_replication_factor,
                topic_defaults=self._config.topic_defaults, validate_only=validate_only)
            # Answer once this broker's view has it: a client's next call (metadata, produce)
            # here then finds the topic.
            if not validate_only:
                await self._cluster.wait_for_view(lambda v: record.name in v.topics)
            return OK
        except LogstoreError as e:
            return error_to_pb(e)
        except Exception as e:  # noqa: BLE001
            return error_to_pb(unexpected(e, "CreateTopics"))

    async def CreatePartitions(self, request: pb.CreatePartitionsRequest,
                               context: grpc.aio.ServicerContext) -> pb.CreatePartitionsResponse:
        async def body() -> pb.CreatePartitionsResponse:
            principal = self._gate.principal(context)
            results = []
            for t in request.topics:
                try:
                    self._gate.check(principal, "ALTER", "TOPIC", t.name)
                    if t.name.startswith("__"):  # a coordinator topic's count places its keys
                        raise InternalTopicError(f"topic {t.name!r} is internal; its partitions are the broker's")
                    if self._cluster.store is not None and self._cluster.view is not None:
                        await cluster_topics.add_partitions(self._cluster.store, self._cluster.view, t.name, t.count,
                                                            validate_only=request.validate_only)
                        if not request.validate_only:
                            await self._cluster.wait_for_view(lambda v, n=t.name, c=t.count: (  # type: ignore[misc]
                                n in v.topics and v.topics[n].partitions == c))
                    else:
                        await self._gate.run_io(lambda n=t.name, c=t.count: self._manager.add_partitions(
                            n, c, validate_only=request.validate_only))
                    results.append(pb.TopicResult(name=t.name, error=OK))
                except LogstoreError as e:
                    results.append(pb.TopicResult(name=t.name, error=error_to_pb(e)))
            return pb.CreatePartitionsResponse(results=results)
        return await self._gate.guard("CreatePartitions", context, body)

    async def DeleteTopics(self, request: pb.DeleteTopicsRequest, context: grpc.aio.ServicerContext) -> pb.DeleteTopicsResponse:
        async def body() -> pb.DeleteTopicsResponse:
            principal = self._gate.principal(context)
            results = []
            for name in request.names:
                try:
                    self._gate.check(principal, "DELETE", "TOPIC", name)
                    if name.startswith("__"):  # the broker's own state (group offsets, transactions)
                        raise InternalTopicError(
                            f"topic {name!r} is internal (names starting with '__' hold the broker's own "
                            "state) and cannot be deleted"
                        )
                    if self._cluster.store is not None:
                        await self._cluster.store.delete_topic(name)
                        await self._cluster.wait_for_view(lambda v, n=name: n not in v.topics)  # type: ignore[misc]
                    else:
                        await self._gate.run_io(self._manager.delete_topic, name)
                    err = OK
                except LogstoreError as e:
                    err = error_to_pb(e)
                results.append(pb.TopicResult(name=name, error=err))
            return pb.DeleteTopicsResponse(results=results)
        return await self._gate.guard("DeleteTopics", context, body)

    async def Metadata(self, request: pb.MetadataRequest, context: grpc.aio.ServicerContext) -> pb.MetadataResponse:
        async def body() -> pb.MetadataResponse:
            principal = self._gate.principal(context)
            view = self._cluster.view_to_describe()
            named = list(request.topics)
            if view is not None:
                return pb.MetadataResponse(
                    cluster_id=self._config.cluster_id, controller_id=view.controller_id,
                    brokers=[pb.BrokerInfo(node_id=b.node_id, host=b.host, port=b.port, rack=b.rack)
                             for b in sorted(view.brokers.values(), key=lambda b: b.node_id)],
                    topics=[cluster_topics.topic_metadata(view, n, self._manager)
                            if self._gate.allowed(principal, "DESCRIBE", "TOPIC", n) else _hidden(self._gate, principal, n)
                            for n in (named or sorted(view.topics))
                            if named or self._gate.allowed(principal, "DESCRIBE", "TOPIC", n)],
                )
            names = named or [t.name for t in self._manager.topics()
                              if self._gate.allowed(principal, "DESCRIBE", "TOPIC", t.name)]
            return pb.MetadataResponse(
                cluster_id=self._cluster_id,
                controller_id=self._config.node_id,
                brokers=[pb.BrokerInfo(node_id=self._config.node_id, host=self._config.host, port=self._port())],
                topics=[self._topic_metadata(n) if self._gate.allowed(principal, "DESCRIBE", "TOPIC", n)
                        else _hidden(self._gate, principal, n) for n in names],
            )
        return await self._gate.guard("Metadata", context, body)

    def _topic_metadata(self, name: str) -> pb.TopicMetadata:
        try:
            info = self._manager.topic(name)
            parts = []
            for part in self._manager.partitions_of(name):
                plog = part.log
                offline = plog.offline_reason
                parts.append(pb.PartitionMetadata(
                    partition=part.partition,
                    error=OK if offline is None else pb.Error(code="LOG_OFFLINE", message=offline),
                    leader=self._config.node_id, leader_epoch=part.leader_epoch,
                    replicas=[self._config.node_id], isr=[self._config.node_id],
                    log_start_offset=plog.log_start_offset, log_end_offset=plog.log_end_offset,
                    high_watermark=part.high_watermark, last_stable_offset=part.last_stable_offset,
                    size_bytes=plog.size_bytes if offline is None else 0,
                ))
            return pb.TopicMetadata(
                name=name, topic_id=info.topic_id, schema=encode_schema(info.schema),
                typed=info.typed, partitions=parts,
            )
        except LogstoreError as e:
            return pb.TopicMetadata(name=name, error=error_to_pb(e))

    async def DescribeConfigs(self, request: pb.DescribeConfigsRequest, context: grpc.aio.ServicerContext) -> pb.DescribeConfigsResponse:
        async def body() -> pb.DescribeConfigsResponse:
            principal = self._gate.principal(context)
            results = []
            for name in request.topics:
                try:
                    self._gate.check(principal, "DESCRIBE_CONFIGS", "TOPIC", name)
                    configs = (cluster_topics.describe_configs(self._cluster.view, name, self._config.topic_defaults)
                               if self._cluster.view is not None and not is_internal(name)
                               else self._manager.topic(name).describe_configs())
                    results.append(pb.TopicConfigs(name=name, configs=configs))
                except LogstoreError as e:
                    results.append(pb.TopicConfigs(name=name, error=error_to_pb(e)))
            return pb.DescribeConfigsResponse(results=results)
        return await self._gate.guard("DescribeConfigs", context, body)

    async def AlterConfigs(self, request: pb.AlterConfigsRequest, context: grpc.aio.ServicerContext) -> pb.AlterConfigsResponse:
        async def body() -> pb.AlterConfigsResponse:
            principal = self._gate.principal(context)
            results = []
            for alt in request.alterations:
                try:
                    self._gate.check(principal, "ALTER_CONFIGS", "TOPIC", alt.topic)
                    if self._cluster.store is not None and self._cluster.view is not None and not is_internal(alt.topic):
                        record = await cluster_topics.alter_configs(
                            self._cluster.store, self._cluster.view, alt, topic_defaults=self._config.topic_defaults,
                            validate_only=request.validate_only)
                        if not request.validate_only:  # answer once this broker applies it
                            await self._cluster.wait_for_view(lambda v, t=alt.topic, r=record: (  # type: ignore[misc]
                                t in v.topics and dict(v.topics[t].configs) == r.configs
                                and v.topics[t].value_schema == r.value_schema))
                        results.append(pb.TopicResult(name=alt.topic, error=OK))
                        continue
                    await self._gate.run_io(lambda a=alt: self._manager.alter_configs(
                        a.topic, set_configs=dict(a.set), delete_keys=list(a.delete),
                        validate_only=request.validate_only,
                    ))
                    err = OK
                except LogstoreError as e:
                    err = error_to_pb(e)
                results.append(pb.TopicResult(name=alt.topic, error=err))
            return pb.AlterConfigsResponse(results=results)
        return await self._gate.guard("AlterConfigs", context, body)

    async def DeleteRecords(self, request: pb.DeleteRecordsRequest, context: grpc.aio.ServicerContext) -> pb.DeleteRecordsResponse:
        async def body() -> pb.DeleteRecordsResponse:
            principal = self._gate.principal(context)
            out = []
            for p in request.partitions:
                resp = pb.DeleteRecordsPartitionResponse(topic=p.topic, partition=p.partition)
                try:
                    self._gate.check(principal, "DELETE", "TOPIC", p.topic)
                    part = self._cluster.leader(p.topic, p.partition)
                    offset = part.high_watermark if p.offset == -1 else p.offset
                    if offset < 0 or offset > part.high_watermark:
                        raise InvalidRequestError(
                            f"cannot delete records before {offset}: the high watermark is {part.high_watermark}"
                        )
                    resp.low_watermark = await self._gate.run_io(part.log.delete_records_before, offset)
                except LogstoreError as e:
                    resp.error.CopyFrom(error_to_pb(e))
                out.append(resp)
            return pb.DeleteRecordsResponse(partitions=out)
        return await self._gate.guard("DeleteRecords", context, body)


def _denied(gate: RpcGate, principal: Principal | None, operation: str, topic: str) -> pb.Error:
    """The TOPIC_AUTHORIZATION_FAILED answer of an item ``principal`` may not touch."""
    try:
        gate.check(principal, operation, "TOPIC", topic)
    except LogstoreError as e:
        return error_to_pb(e)
    return OK


def _hidden(gate: RpcGate, principal: Principal | None, topic: str) -> pb.TopicMetadata:
    """A named topic the caller may not describe: an error, and nothing about the topic."""
    return pb.TopicMetadata(name=topic, error=_denied(gate, principal, "DESCRIBE", topic))
