"""Topic administration on a cluster: topics live in etcd, not in one broker's data directory.

The single broker's topic RPCs act on its :class:`~logstore.storage.log_manager.LogManager`
(:mod:`logstore.broker.topic_service`); on a cluster the same RPCs go through these
functions, which read the applied :class:`~replication.state.ClusterView` and write
through the :class:`~replication.metadata_store.MetadataStore`:

* create: the request is validated as on a single broker (name, partition count,
  configs, schema), the replicas are placed over the live brokers
  (:func:`replication.placement.assign_replicas`, ``default_replication_factor``
  when the request gives none), and the topic with every partition's first state
  is written in one etcd transaction; each broker then opens its own replicas
  when the new view reaches it.
* metadata: brokers, controller, and per partition the leader, leader epoch,
  replicas, ISR and offline replicas; offsets and size where this broker holds a
  replica (the leader's figures are the current ones).
* configs: a topic's overrides live in its etcd record; effective values are
  those over the broker's topic defaults. A typed topic's schema lives there too
  and evolves as on a single broker (``schema`` in AlterConfigs).
* the same in plain values (:class:`ClusterTopicAdmin`), for the Kafka listener's admin
  APIs: a topic Kafka's AdminClient creates with a replication factor is placed and
  replicated exactly as one created over gRPC.
* coordinator topics (``__consumer_offsets``, ``__transaction_state``): created by
  the broker itself on first need (:func:`create_internal_topic`), with a
  replication factor of at most the live brokers.

Thread-safety: called on the event loop.
"""

from __future__ import annotations

import uuid
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, replace
from typing import TYPE_CHECKING

import pyarrow as pa

from logstore._proto import logstore_pb2 as pb
from logstore.broker.rpc_errors import OK, error_to_pb
from logstore.errors import (
    BrokerUnavailableError,
    InvalidConfigError,
    InvalidPartitionsError,
    LeaderNotAvailableError,
    LogstoreError,
    SchemaMismatchError,
    UnknownTopicOrPartitionError,
)
from logstore.naming import validate_topic_name
from logstore.record import check_schema_evolution, encode_schema, typed_schema, untyped_schema
from logstore.schema_text import format_schema, parse_schema
from logstore.storage.config import LogConfig, check_value_format
from logstore.storage.log_manager import MAX_PARTITIONS, SCHEMA_CONFIG, LogManager
from replication.state import NO_LEADER, ClusterView, TopicRecord

if TYPE_CHECKING:
    from logstore.broker.membership import ClusterMembership
    from replication.metadata_store import MetadataStore

__all__ = ["ClusterTopic", "ClusterTopicAdmin", "create_topic", "create_internal_topic", "add_partitions", "topic_metadata", "describe_configs", "alter_configs",
           "request_value_schema"]


def request_value_schema(topic: pb.NewTopic) -> pa.Schema | None:
    """A CreateTopics entry's ``value_schema`` (an Arrow IPC schema message; None when empty)."""
    if not topic.value_schema:
        return None
    try:
        schema = pa.ipc.read_schema(pa.py_buffer(topic.value_schema))
    except (pa.ArrowException, OSError) as e:
        raise SchemaMismatchError(f"value_schema is not an Arrow IPC schema message: {e}") from None
    _check_field_names(list(schema))
    return schema


def _check_field_names(fields: list[pa.Field], path: str = "") -> None:
    """Raise :class:`SchemaMismatchError` for a field name (at any depth) that is not UTF-8, as Arrow
    requires (pyarrow only finds out when the name is read, with a UnicodeDecodeError)."""
    for i, field in enumerate(fields):
        try:
            name = field.name
        except UnicodeDecodeError as e:
            raise SchemaMismatchError(
                f"value_schema: the name of field {path}#{i} is not UTF-8 ({e.reason} at byte {e.start}); "
                "Arrow field names must be UTF-8 text") from None
        children = [field.type.field(j) for j in range(field.type.num_fields)]
        if children:
            _check_field_names(children, f"{path}{name}.")


def _value_schema(topic: pb.NewTopic) -> tuple[pa.Schema | None, dict[str, str]]:
    overrides = dict(topic.configs)
    schema_text = overrides.pop(SCHEMA_CONFIG, None)
    value_schema = request_value_schema(topic)
    if schema_text:
        if value_schema is not None:
            raise InvalidConfigError("give the schema either as value_schema or as the schema config, not both")
        value_schema = parse_schema(schema_text)
    return value_schema, overrides


async def create_topic(store: MetadataStore, view: ClusterView, topic: pb.NewTopic, *,
                       default_partitions: int, default_replication_factor: int,
                       topic_defaults: LogConfig, validate_only: bool) -> TopicRecord:
    """Validate, place and (unless ``validate_only``) write a new topic; return its record."""
    value_schema, overrides = _value_schema(topic)
    return await _create(store, view, topic.name, partitions=topic.partitions or default_partitions,
                         replication_factor=topic.replication_factor or default_replication_factor,
                         overrides=overrides, value_schema=value_schema, topic_defaults=topic_defaults,
                         validate_only=validate_only)


async def _create(store: MetadataStore, view: ClusterView, name: str, *, partitions: int, replication_factor: int,
                  overrides: Mapping[str, str], value_schema: pa.Schema | None, topic_defaults: LogConfig,
                  validate_only: bool) -> TopicRecord:
    from replication.placement import assign_replicas

    validate_topic_name(name)
    if not 1 <= partitions <= MAX_PARTITIONS:
        raise InvalidPartitionsError(f"partition count must be between 1 and {MAX_PARTITIONS}, got {partitions}")
    LogConfig.from_properties(dict(overrides), base=topic_defaults)  # refuses bad keys and values
    check_value_format(overrides, typed=value_schema is not None, topic=name)
    live = [view.brokers[n] for n in sorted(view.brokers) if n not in view.shutting_down]
    assignment = assign_replicas(partitions, replication_factor, live)
    record = TopicRecord(
        name=name, topic_id=uuid.uuid4().hex, partitions=partitions,
        replication_factor=replication_factor, configs={k: str(v) for k, v in overrides.items()},
        value_schema=b"" if value_schema is None else value_schema.serialize().to_pybytes(),
    )
    if not validate_only:
        await store.create_topic(record, assignment)
    return record


async def create_internal_topic(store: MetadataStore, view: ClusterView, name: str, *, partitions: int,
                                replication_factor: int, configs: Mapping[str, str]) -> TopicRecord:
    """Create a coordinator topic: ``partitions`` partitions, replication factor
    ``min(replication_factor, live brokers)``; :class:`TopicAlreadyExistsError` if it exists."""
    from replication.placement import assign_replicas

    live = [view.brokers[n] for n in sorted(view.brokers) if n not in view.shutting_down]
    if not live:
        raise LeaderNotAvailableError(f"no live broker to place the coordinator topic {name} on")
    rf = max(1, min(replication_factor, len(live)))
    assignment = assign_replicas(partitions, rf, live)
    record = TopicRecord(name=name, topic_id=uuid.uuid4().hex, partitions=partitions, replication_factor=rf,
                         configs={k: str(v) for k, v in configs.items()}, value_schema=b"")
    await store.create_topic(record, assignment)
    return record


async def add_partitions(store: MetadataStore, view: ClusterView, name: str, count: int, *,
                         validate_only: bool) -> None:
    """Grow a cluster topic to ``count`` partitions, the new ones placed over the live brokers
    with the topic's replication factor."""
    from replication.placement import assign_replicas

    record = view.topics.get(name)
    if record is None:
        raise UnknownTopicOrPartitionError(f"unknown topic {name!r}")
    if not record.partitions < count <= MAX_PARTITIONS:
        raise InvalidPartitionsError(
            f"topic {name!r} has {record.partitions} partitions; the new count must be larger "
            f"(partitions cannot be removed) and at most {MAX_PARTITIONS}, got {count}")
    live = [view.brokers[n] for n in sorted(view.brokers) if n not in view.shutting_down]
    placed = assign_replicas(count - record.partitions, record.replication_factor, live)
    if not validate_only:
        await store.add_partitions(name, {record.partitions + p: r for p, r in placed.items()})


def stored_schema(record: TopicRecord) -> pa.Schema:
    """The schema a topic's segments store (untyped, or the typed value columns)."""
    if not record.value_schema:
        return untyped_schema()
    return typed_schema(pa.ipc.read_schema(pa.py_buffer(record.value_schema)))


def topic_metadata(view: ClusterView, name: str, manager: LogManager) -> pb.TopicMetadata:
    """A topic's metadata from the cluster view, with local offsets where a replica is here."""
    record = view.topics.get(name)
    if record is None:
        return pb.TopicMetadata(name=name, error=error_to_pb(
            UnknownTopicOrPartitionError(f"unknown topic {name!r}")))
    parts = []
    for state in view.partitions_of(name):
        error = OK
        if state.leader == NO_LEADER or state.leader not in view.brokers:
            error = error_to_pb(LeaderNotAvailableError(
                f"{name}-{state.partition} has no live leader (isr {list(state.isr)})"))
        meta = pb.PartitionMetadata(
            partition=state.partition, error=error, leader=state.leader, leader_epoch=state.leader_epoch,
            replicas=list(state.replicas), isr=list(state.isr),
            offline_replicas=[r for r in state.replicas if r not in view.brokers],
        )
        try:
            part = manager.partition(name, state.partition)
        except LogstoreError:
            part = None
        if part is not None and part.log.offline_reason is None:
            meta.log_start_offset = part.log.log_start_offset
            meta.log_end_offset = part.log.log_end_offset
            meta.high_watermark = part.high_watermark
            meta.last_stable_offset = part.last_stable_offset
            meta.size_bytes = part.log.size_bytes
        parts.append(meta)
    schema = stored_schema(record)
    return pb.TopicMetadata(name=name, topic_id=record.topic_id, schema=encode_schema(schema),
                            typed=bool(record.value_schema), partitions=parts)


def describe_configs(view: ClusterView, name: str, topic_defaults: LogConfig) -> dict[str, str]:
    record = view.topics.get(name)
    if record is None:
        raise UnknownTopicOrPartitionError(f"unknown topic {name!r}")
    return record_configs(record, topic_defaults)


def record_configs(record: TopicRecord, topic_defaults: LogConfig) -> dict[str, str]:
    """A topic's effective configs: its overrides over ``topic_defaults``, and its schema."""
    props = LogConfig.from_properties(dict(record.configs), base=topic_defaults).to_properties()
    props[SCHEMA_CONFIG] = (format_schema(pa.ipc.read_schema(pa.py_buffer(record.value_schema)))
                            if record.value_schema else "")
    return props


async def alter_configs(store: MetadataStore, view: ClusterView, alteration: pb.AlterConfigsRequest.Alteration, *,
                        topic_defaults: LogConfig, validate_only: bool) -> TopicRecord:
    """Write a topic's new overrides and, for ``schema``, its evolved value schema (unless
    ``validate_only``); return the record as written.

    The schema evolves by the single broker's rules (:func:`~logstore.record.check_schema_evolution`:
    new nullable columns only); each broker adopts it from the record
    (:meth:`~logstore.storage.log_manager.LogManager.ensure_replicated_topic`).
    """
    record = view.topics.get(alteration.topic)
    if record is None:
        raise UnknownTopicOrPartitionError(f"unknown topic {alteration.topic!r}")
    if SCHEMA_CONFIG in alteration.delete:
        raise InvalidConfigError("the schema of a topic cannot be removed")
    configs = dict(record.configs)
    configs.update(alteration.set)
    for key in alteration.delete:
        configs.pop(key, None)
    value_schema = record.value_schema
    schema_text = configs.pop(SCHEMA_CONFIG, None)
    if schema_text is not None:
        if not record.value_schema:
            raise InvalidConfigError(f"topic {alteration.topic!r} is untyped; its schema cannot be set")
        proposed = parse_schema(schema_text)
        check_schema_evolution(stored_schema(record), typed_schema(proposed))
        value_schema = proposed.serialize().to_pybytes()
    LogConfig.from_properties(configs, base=topic_defaults)
    check_value_format(configs, typed=bool(record.value_schema), topic=alteration.topic)
    if validate_only:
        return replace(record, configs=configs, value_schema=value_schema)
    return await store.alter_topic_configs(alteration.topic, configs, value_schema=value_schema,
                                           schema_from=record.value_schema)


@dataclass(frozen=True, slots=True)
class ClusterTopic:
    """A cluster topic as a front end describes it (what a single broker's
    :class:`~logstore.storage.topic_info.TopicInfo` says of its own topics)."""

    record: TopicRecord
    configs: Mapping[str, str]  # effective: the overrides over the broker's topic defaults

    @property
    def topic_id(self) -> str:
        return self.record.topic_id

    @property
    def partitions(self) -> int:
        return self.record.partitions

    @property
    def replication_factor(self) -> int:
        return self.record.replication_factor

    @property
    def overrides(self) -> Mapping[str, str]:
        return self.record.configs

    def describe_configs(self) -> dict[str, str]:
        return dict(self.configs)


class ClusterTopicAdmin:
    """Topic administration on a cluster in plain values, for a front end without protobuf
    (the Kafka listener's admin APIs): the same validation, placement and etcd writes as the
    topic RPCs above, and each change answered once this broker's view has it (so the
    client's next call here finds it). ``membership`` is the broker's
    :class:`~logstore.broker.membership.ClusterMembership` (joined: BROKER_NOT_AVAILABLE before)."""

    def __init__(self, membership: ClusterMembership, *, default_partitions: int, default_replication_factor: int,
                 topic_defaults: LogConfig) -> None:
        self._membership = membership
        self._default_partitions = default_partitions
        self._default_replication_factor = default_replication_factor
        self._topic_defaults = topic_defaults

    def _joined(self) -> tuple[MetadataStore, ClusterView]:
        store, view = self._membership.store, self._membership.view
        if store is None or view is None:
            raise BrokerUnavailableError(f"broker {self._membership.config.node_id} has not joined its cluster "
                                         "yet; retry shortly")
        return store, view

    async def create(self, name: str, *, partitions: int | None, replication_factor: int | None,
                     configs: Mapping[str, str], validate_only: bool) -> ClusterTopic:
        """Create ``name`` (None: the broker's ``num_partitions`` / ``default_replication_factor``);
        ``configs`` are its overrides, the typed topic's ``schema`` among them."""
        store, view = self._joined()
        overrides = dict(configs)
        schema_text = overrides.pop(SCHEMA_CONFIG, None)
        record = await _create(store, view, name, partitions=partitions or self._default_partitions,
                               replication_factor=replication_factor or self._default_replication_factor,
                               overrides=overrides, value_schema=parse_schema(schema_text) if schema_text else None,
                               topic_defaults=self._topic_defaults, validate_only=validate_only)
        if not validate_only:
            await self._membership.wait_for_view(lambda v: name in v.topics)
        return ClusterTopic(record, record_configs(record, self._topic_defaults))

    def describe(self, name: str) -> ClusterTopic:
        """UNKNOWN_TOPIC_OR_PARTITION when the cluster has no topic ``name``."""
        _, view = self._joined()
        record = view.topics.get(name)
        if record is None:
            raise UnknownTopicOrPartitionError(f"topic {name!r} does not exist")
        return ClusterTopic(record, record_configs(record, self._topic_defaults))

    async def delete(self, name: str) -> None:
        store, _ = self._joined()
        await store.delete_topic(name)
        await self._membership.wait_for_view(lambda v: name not in v.topics)

    async def add_partitions(self, name: str, count: int, *, validate_only: bool) -> None:
        store, view = self._joined()
        await add_partitions(store, view, name, count, validate_only=validate_only)
        if not validate_only:
            await self._membership.wait_for_view(lambda v: name in v.topics and v.topics[name].partitions == count)

    async def alter_configs(self, name: str, *, set_configs: Mapping[str, str], delete_keys: Iterable[str],
                            validate_only: bool) -> None:
        store, view = self._joined()
        alteration = pb.AlterConfigsRequest.Alteration(topic=name, set=dict(set_configs), delete=list(delete_keys))
        record = await alter_configs(store, view, alteration, topic_defaults=self._topic_defaults,
                                     validate_only=validate_only)
        if not validate_only:
            await self._membership.wait_for_view(lambda v: name in v.topics and dict(v.topics[name].configs) ==
                                                 record.configs and v.topics[name].value_schema == record.value_schema)
