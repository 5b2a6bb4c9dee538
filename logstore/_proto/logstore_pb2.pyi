from google.protobuf.internal import containers as _containers
from google.protobuf.internal import enum_type_wrapper as _enum_type_wrapper
from google.protobuf import descriptor as _descriptor
from google.protobuf import message as _message
from collections.abc import Iterable as _Iterable, Mapping as _Mapping
from typing import ClassVar as _ClassVar, Optional as _Optional, Union as _Union

DESCRIPTOR: _descriptor.FileDescriptor

class IsolationLevel(int, metaclass=_enum_type_wrapper.EnumTypeWrapper):
    __slots__ = ()
    READ_UNCOMMITTED: _ClassVar[IsolationLevel]
    READ_COMMITTED: _ClassVar[IsolationLevel]

class CoordinatorType(int, metaclass=_enum_type_wrapper.EnumTypeWrapper):
    __slots__ = ()
    GROUP: _ClassVar[CoordinatorType]
    TRANSACTION: _ClassVar[CoordinatorType]

class ElectionType(int, metaclass=_enum_type_wrapper.EnumTypeWrapper):
    __slots__ = ()
    PREFERRED: _ClassVar[ElectionType]
    UNCLEAN: _ClassVar[ElectionType]
READ_UNCOMMITTED: IsolationLevel
READ_COMMITTED: IsolationLevel
GROUP: CoordinatorType
TRANSACTION: CoordinatorType
PREFERRED: ElectionType
UNCLEAN: ElectionType

class Error(_message.Message):
    __slots__ = ("code", "message")
    CODE_FIELD_NUMBER: _ClassVar[int]
    MESSAGE_FIELD_NUMBER: _ClassVar[int]
    code: str
    message: str
    def __init__(self, code: _Optional[str] = ..., message: _Optional[str] = ...) -> None: ...

class NewTopic(_message.Message):
    __slots__ = ("name", "partitions", "replication_factor", "configs", "value_schema")
    class ConfigsEntry(_message.Message):
        __slots__ = ("key", "value")
        KEY_FIELD_NUMBER: _ClassVar[int]
        VALUE_FIELD_NUMBER: _ClassVar[int]
        key: str
        value: str
        def __init__(self, key: _Optional[str] = ..., value: _Optional[str] = ...) -> None: ...
    NAME_FIELD_NUMBER: _ClassVar[int]
    PARTITIONS_FIELD_NUMBER: _ClassVar[int]
    REPLICATION_FACTOR_FIELD_NUMBER: _ClassVar[int]
    CONFIGS_FIELD_NUMBER: _ClassVar[int]
    VALUE_SCHEMA_FIELD_NUMBER: _ClassVar[int]
    name: str
    partitions: int
    replication_factor: int
    configs: _containers.ScalarMap[str, str]
    value_schema: bytes
    def __init__(self, name: _Optional[str] = ..., partitions: _Optional[int] = ..., replication_factor: _Optional[int] = ..., configs: _Optional[_Mapping[str, str]] = ..., value_schema: _Optional[bytes] = ...) -> None: ...

class CreateTopicsRequest(_message.Message):
    __slots__ = ("topics", "validate_only")
    TOPICS_FIELD_NUMBER: _ClassVar[int]
    VALIDATE_ONLY_FIELD_NUMBER: _ClassVar[int]
    topics: _containers.RepeatedCompositeFieldContainer[NewTopic]
    validate_only: bool
    def __init__(self, topics: _Optional[_Iterable[_Union[NewTopic, _Mapping]]] = ..., validate_only: _Optional[bool] = ...) -> None: ...

class TopicResult(_message.Message):
    __slots__ = ("name", "error")
    NAME_FIELD_NUMBER: _ClassVar[int]
    ERROR_FIELD_NUMBER: _ClassVar[int]
    name: str
    error: Error
    def __init__(self, name: _Optional[str] = ..., error: _Optional[_Union[Error, _Mapping]] = ...) -> None: ...

class CreateTopicsResponse(_message.Message):
    __slots__ = ("results",)
    RESULTS_FIELD_NUMBER: _ClassVar[int]
    results: _containers.RepeatedCompositeFieldContainer[TopicResult]
    def __init__(self, results: _Optional[_Iterable[_Union[TopicResult, _Mapping]]] = ...) -> None: ...

class DeleteTopicsRequest(_message.Message):
    __slots__ = ("names",)
    NAMES_FIELD_NUMBER: _ClassVar[int]
    names: _containers.RepeatedScalarFieldContainer[str]
    def __init__(self, names: _Optional[_Iterable[str]] = ...) -> None: ...

class DeleteTopicsResponse(_message.Message):
    __slots__ = ("results",)
    RESULTS_FIELD_NUMBER: _ClassVar[int]
    results: _containers.RepeatedCompositeFieldContainer[TopicResult]
    def __init__(self, results: _Optional[_Iterable[_Union[TopicResult, _Mapping]]] = ...) -> None: ...

class CreatePartitionsRequest(_message.Message):
    __slots__ = ("topics", "validate_only")
    class Topic(_message.Message):
        __slots__ = ("name", "count")
        NAME_FIELD_NUMBER: _ClassVar[int]
        COUNT_FIELD_NUMBER: _ClassVar[int]
        name: str
        count: int
        def __init__(self, name: _Optional[str] = ..., count: _Optional[int] = ...) -> None: ...
    TOPICS_FIELD_NUMBER: _ClassVar[int]
    VALIDATE_ONLY_FIELD_NUMBER: _ClassVar[int]
    topics: _containers.RepeatedCompositeFieldContainer[CreatePartitionsRequest.Topic]
    validate_only: bool
    def __init__(self, topics: _Optional[_Iterable[_Union[CreatePartitionsRequest.Topic, _Mapping]]] = ..., validate_only: _Optional[bool] = ...) -> None: ...

class CreatePartitionsResponse(_message.Message):
    __slots__ = ("results",)
    RESULTS_FIELD_NUMBER: _ClassVar[int]
    results: _containers.RepeatedCompositeFieldContainer[TopicResult]
    def __init__(self, results: _Optional[_Iterable[_Union[TopicResult, _Mapping]]] = ...) -> None: ...

class MetadataRequest(_message.Message):
    __slots__ = ("topics",)
    TOPICS_FIELD_NUMBER: _ClassVar[int]
    topics: _containers.RepeatedScalarFieldContainer[str]
    def __init__(self, topics: _Optional[_Iterable[str]] = ...) -> None: ...

class BrokerInfo(_message.Message):
    __slots__ = ("node_id", "host", "port", "rack")
    NODE_ID_FIELD_NUMBER: _ClassVar[int]
    HOST_FIELD_NUMBER: _ClassVar[int]
    PORT_FIELD_NUMBER: _ClassVar[int]
    RACK_FIELD_NUMBER: _ClassVar[int]
    node_id: int
    host: str
    port: int
    rack: str
    def __init__(self, node_id: _Optional[int] = ..., host: _Optional[str] = ..., port: _Optional[int] = ..., rack: _Optional[str] = ...) -> None: ...

class PartitionMetadata(_message.Message):
    __slots__ = ("partition", "error", "leader", "leader_epoch", "replicas", "isr", "log_start_offset", "log_end_offset", "high_watermark", "last_stable_offset", "size_bytes", "offline_replicas")
    PARTITION_FIELD_NUMBER: _ClassVar[int]
    ERROR_FIELD_NUMBER: _ClassVar[int]
    LEADER_FIELD_NUMBER: _ClassVar[int]
    LEADER_EPOCH_FIELD_NUMBER: _ClassVar[int]
    REPLICAS_FIELD_NUMBER: _ClassVar[int]
    ISR_FIELD_NUMBER: _ClassVar[int]
    LOG_START_OFFSET_FIELD_NUMBER: _ClassVar[int]
    LOG_END_OFFSET_FIELD_NUMBER: _ClassVar[int]
    HIGH_WATERMARK_FIELD_NUMBER: _ClassVar[int]
    LAST_STABLE_OFFSET_FIELD_NUMBER: _ClassVar[int]
    SIZE_BYTES_FIELD_NUMBER: _ClassVar[int]
    OFFLINE_REPLICAS_FIELD_NUMBER: _ClassVar[int]
    partition: int
    error: Error
    leader: int
    leader_epoch: int
    replicas: _containers.RepeatedScalarFieldContainer[int]
    isr: _containers.RepeatedScalarFieldContainer[int]
    log_start_offset: int
    log_end_offset: int
    high_watermark: int
    last_stable_offset: int
    size_bytes: int
    offline_replicas: _containers.RepeatedScalarFieldContainer[int]
    def __init__(self, partition: _Optional[int] = ..., error: _Optional[_Union[Error, _Mapping]] = ..., leader: _Optional[int] = ..., leader_epoch: _Optional[int] = ..., replicas: _Optional[_Iterable[int]] = ..., isr: _Optional[_Iterable[int]] = ..., log_start_offset: _Optional[int] = ..., log_end_offset: _Optional[int] = ..., high_watermark: _Optional[int] = ..., last_stable_offset: _Optional[int] = ..., size_bytes: _Optional[int] = ..., offline_replicas: _Optional[_Iterable[int]] = ...) -> None: ...

class TopicMetadata(_message.Message):
    __slots__ = ("name", "error", "topic_id", "schema", "typed", "partitions")
    NAME_FIELD_NUMBER: _ClassVar[int]
    ERROR_FIELD_NUMBER: _ClassVar[int]
    TOPIC_ID_FIELD_NUMBER: _ClassVar[int]
    SCHEMA_FIELD_NUMBER: _ClassVar[int]
    TYPED_FIELD_NUMBER: _ClassVar[int]
    PARTITIONS_FIELD_NUMBER: _ClassVar[int]
    name: str
    error: Error
    topic_id: str
    schema: bytes
    typed: bool
    partitions: _containers.RepeatedCompositeFieldContainer[PartitionMetadata]
    def __init__(self, name: _Optional[str] = ..., error: _Optional[_Union[Error, _Mapping]] = ..., topic_id: _Optional[str] = ..., schema: _Optional[bytes] = ..., typed: _Optional[bool] = ..., partitions: _Optional[_Iterable[_Union[PartitionMetadata, _Mapping]]] = ...) -> None: ...

class MetadataResponse(_message.Message):
    __slots__ = ("cluster_id", "controller_id", "brokers", "topics")
    CLUSTER_ID_FIELD_NUMBER: _ClassVar[int]
    CONTROLLER_ID_FIELD_NUMBER: _ClassVar[int]
    BROKERS_FIELD_NUMBER: _ClassVar[int]
    TOPICS_FIELD_NUMBER: _ClassVar[int]
    cluster_id: str
    controller_id: int
    brokers: _containers.RepeatedCompositeFieldContainer[BrokerInfo]
    topics: _containers.RepeatedCompositeFieldContainer[TopicMetadata]
    def __init__(self, cluster_id: _Optional[str] = ..., controller_id: _Optional[int] = ..., brokers: _Optional[_Iterable[_Union[BrokerInfo, _Mapping]]] = ..., topics: _Optional[_Iterable[_Union[TopicMetadata, _Mapping]]] = ...) -> None: ...

class DescribeConfigsRequest(_message.Message):
    __slots__ = ("topics",)
    TOPICS_FIELD_NUMBER: _ClassVar[int]
    topics: _containers.RepeatedScalarFieldContainer[str]
    def __init__(self, topics: _Optional[_Iterable[str]] = ...) -> None: ...

class TopicConfigs(_message.Message):
    __slots__ = ("name", "error", "configs")
    class ConfigsEntry(_message.Message):
        __slots__ = ("key", "value")
        KEY_FIELD_NUMBER: _ClassVar[int]
        VALUE_FIELD_NUMBER: _ClassVar[int]
        key: str
        value: str
        def __init__(self, key: _Optional[str] = ..., value: _Optional[str] = ...) -> None: ...
    NAME_FIELD_NUMBER: _ClassVar[int]
    ERROR_FIELD_NUMBER: _ClassVar[int]
    CONFIGS_FIELD_NUMBER: _ClassVar[int]
    name: str
    error: Error
    configs: _containers.ScalarMap[str, str]
    def __init__(self, name: _Optional[str] = ..., error: _Optional[_Union[Error, _Mapping]] = ..., configs: _Optional[_Mapping[str, str]] = ...) -> None: ...

class DescribeConfigsResponse(_message.Message):
    __slots__ = ("results",)
    RESULTS_FIELD_NUMBER: _ClassVar[int]
    results: _containers.RepeatedCompositeFieldContainer[TopicConfigs]
    def __init__(self, results: _Optional[_Iterable[_Union[TopicConfigs, _Mapping]]] = ...) -> None: ...

class AlterConfigsRequest(_message.Message):
    __slots__ = ("alterations", "validate_only")
    class Alteration(_message.Message):
        __slots__ = ("topic", "set", "delete")
        class SetEntry(_message.Message):
            __slots__ = ("key", "value")
            KEY_FIELD_NUMBER: _ClassVar[int]
            VALUE_FIELD_NUMBER: _ClassVar[int]
            key: str
            value: str
            def __init__(self, key: _Optional[str] = ..., value: _Optional[str] = ...) -> None: ...
        TOPIC_FIELD_NUMBER: _ClassVar[int]
        SET_FIELD_NUMBER: _ClassVar[int]
        DELETE_FIELD_NUMBER: _ClassVar[int]
        topic: str
        set: _containers.ScalarMap[str, str]
        delete: _containers.RepeatedScalarFieldContainer[str]
        def __init__(self, topic: _Optional[str] = ..., set: _Optional[_Mapping[str, str]] = ..., delete: _Optional[_Iterable[str]] = ...) -> None: ...
    ALTERATIONS_FIELD_NUMBER: _ClassVar[int]
    VALIDATE_ONLY_FIELD_NUMBER: _ClassVar[int]
    alterations: _containers.RepeatedCompositeFieldContainer[AlterConfigsRequest.Alteration]
    validate_only: bool
    def __init__(self, alterations: _Optional[_Iterable[_Union[AlterConfigsRequest.Alteration, _Mapping]]] = ..., validate_only: _Optional[bool] = ...) -> None: ...

class AlterConfigsResponse(_message.Message):
    __slots__ = ("results",)
    RESULTS_FIELD_NUMBER: _ClassVar[int]
    results: _containers.RepeatedCompositeFieldContainer[TopicResult]
    def __init__(self, results: _Optional[_Iterable[_Union[TopicResult, _Mapping]]] = ...) -> None: ...

class ProducePartition(_message.Message):
    __slots__ = ("topic", "partition", "records", "current_leader_epoch")
    TOPIC_FIELD_NUMBER: _ClassVar[int]
    PARTITION_FIELD_NUMBER: _ClassVar[int]
    RECORDS_FIELD_NUMBER: _ClassVar[int]
    CURRENT_LEADER_EPOCH_FIELD_NUMBER: _ClassVar[int]
    topic: str
    partition: int
    records: bytes
    current_leader_epoch: int
    def __init__(self, topic: _Optional[str] = ..., partition: _Optional[int] = ..., records: _Optional[bytes] = ..., current_leader_epoch: _Optional[int] = ...) -> None: ...

class ProduceRequest(_message.Message):
    __slots__ = ("acks", "timeout_ms", "transactional_id", "partitions", "correlation_id")
    ACKS_FIELD_NUMBER: _ClassVar[int]
    TIMEOUT_MS_FIELD_NUMBER: _ClassVar[int]
    TRANSACTIONAL_ID_FIELD_NUMBER: _ClassVar[int]
    PARTITIONS_FIELD_NUMBER: _ClassVar[int]
    CORRELATION_ID_FIELD_NUMBER: _ClassVar[int]
    acks: int
    timeout_ms: int
    transactional_id: str
    partitions: _containers.RepeatedCompositeFieldContainer[ProducePartition]
    correlation_id: int
    def __init__(self, acks: _Optional[int] = ..., timeout_ms: _Optional[int] = ..., transactional_id: _Optional[str] = ..., partitions: _Optional[_Iterable[_Union[ProducePartition, _Mapping]]] = ..., correlation_id: _Optional[int] = ...) -> None: ...

class ProducePartitionResponse(_message.Message):
    __slots__ = ("topic", "partition", "error", "base_offsets", "log_append_time_ms", "log_start_offset")
    TOPIC_FIELD_NUMBER: _ClassVar[int]
    PARTITION_FIELD_NUMBER: _ClassVar[int]
    ERROR_FIELD_NUMBER: _ClassVar[int]
    BASE_OFFSETS_FIELD_NUMBER: _ClassVar[int]
    LOG_APPEND_TIME_MS_FIELD_NUMBER: _ClassVar[int]
    LOG_START_OFFSET_FIELD_NUMBER: _ClassVar[int]
    topic: str
    partition: int
    error: Error
    base_offsets: _containers.RepeatedScalarFieldContainer[int]
    log_append_time_ms: int
    log_start_offset: int
    def __init__(self, topic: _Optional[str] = ..., partition: _Optional[int] = ..., error: _Optional[_Union[Error, _Mapping]] = ..., base_offsets: _Optional[_Iterable[int]] = ..., log_append_time_ms: _Optional[int] = ..., log_start_offset: _Optional[int] = ...) -> None: ...

class ProduceResponse(_message.Message):
    __slots__ = ("partitions", "correlation_id", "error")
    PARTITIONS_FIELD_NUMBER: _ClassVar[int]
    CORRELATION_ID_FIELD_NUMBER: _ClassVar[int]
    ERROR_FIELD_NUMBER: _ClassVar[int]
    partitions: _containers.RepeatedCompositeFieldContainer[ProducePartitionResponse]
    correlation_id: int
    error: Error
    def __init__(self, partitions: _Optional[_Iterable[_Union[ProducePartitionResponse, _Mapping]]] = ..., correlation_id: _Optional[int] = ..., error: _Optional[_Union[Error, _Mapping]] = ...) -> None: ...

class FetchPartition(_message.Message):
    __slots__ = ("topic", "partition", "fetch_offset", "partition_max_bytes", "current_leader_epoch")
    TOPIC_FIELD_NUMBER: _ClassVar[int]
    PARTITION_FIELD_NUMBER: _ClassVar[int]
    FETCH_OFFSET_FIELD_NUMBER: _ClassVar[int]
    PARTITION_MAX_BYTES_FIELD_NUMBER: _ClassVar[int]
    CURRENT_LEADER_EPOCH_FIELD_NUMBER: _ClassVar[int]
    topic: str
    partition: int
    fetch_offset: int
    partition_max_bytes: int
    current_leader_epoch: int
    def __init__(self, topic: _Optional[str] = ..., partition: _Optional[int] = ..., fetch_offset: _Optional[int] = ..., partition_max_bytes: _Optional[int] = ..., current_leader_epoch: _Optional[int] = ...) -> None: ...

class FetchRequest(_message.Message):
    __slots__ = ("max_wait_ms", "min_bytes", "max_bytes", "isolation_level", "partitions", "replica_id")
    MAX_WAIT_MS_FIELD_NUMBER: _ClassVar[int]
    MIN_BYTES_FIELD_NUMBER: _ClassVar[int]
    MAX_BYTES_FIELD_NUMBER: _ClassVar[int]
    ISOLATION_LEVEL_FIELD_NUMBER: _ClassVar[int]
    PARTITIONS_FIELD_NUMBER: _ClassVar[int]
    REPLICA_ID_FIELD_NUMBER: _ClassVar[int]
    max_wait_ms: int
    min_bytes: int
    max_bytes: int
    isolation_level: IsolationLevel
    partitions: _containers.RepeatedCompositeFieldContainer[FetchPartition]
    replica_id: int
    def __init__(self, max_wait_ms: _Optional[int] = ..., min_bytes: _Optional[int] = ..., max_bytes: _Optional[int] = ..., isolation_level: _Optional[_Union[IsolationLevel, str]] = ..., partitions: _Optional[_Iterable[_Union[FetchPartition, _Mapping]]] = ..., replica_id: _Optional[int] = ...) -> None: ...

class AbortedTransaction(_message.Message):
    __slots__ = ("producer_id", "first_offset")
    PRODUCER_ID_FIELD_NUMBER: _ClassVar[int]
    FIRST_OFFSET_FIELD_NUMBER: _ClassVar[int]
    producer_id: int
    first_offset: int
    def __init__(self, producer_id: _Optional[int] = ..., first_offset: _Optional[int] = ...) -> None: ...

class FetchPartitionResponse(_message.Message):
    __slots__ = ("topic", "partition", "error", "high_watermark", "last_stable_offset", "log_start_offset", "schema", "records", "aborted_transactions", "next_offset")
    TOPIC_FIELD_NUMBER: _ClassVar[int]
    PARTITION_FIELD_NUMBER: _ClassVar[int]
    ERROR_FIELD_NUMBER: _ClassVar[int]
    HIGH_WATERMARK_FIELD_NUMBER: _ClassVar[int]
    LAST_STABLE_OFFSET_FIELD_NUMBER: _ClassVar[int]
    LOG_START_OFFSET_FIELD_NUMBER: _ClassVar[int]
    SCHEMA_FIELD_NUMBER: _ClassVar[int]
    RECORDS_FIELD_NUMBER: _ClassVar[int]
    ABORTED_TRANSACTIONS_FIELD_NUMBER: _ClassVar[int]
    NEXT_OFFSET_FIELD_NUMBER: _ClassVar[int]
    topic: str
    partition: int
    error: Error
    high_watermark: int
    last_stable_offset: int
    log_start_offset: int
    schema: bytes
    records: bytes
    aborted_transactions: _containers.RepeatedCompositeFieldContainer[AbortedTransaction]
    next_offset: int
    def __init__(self, topic: _Optional[str] = ..., partition: _Optional[int] = ..., error: _Optional[_Union[Error, _Mapping]] = ..., high_watermark: _Optional[int] = ..., last_stable_offset: _Optional[int] = ..., log_start_offset: _Optional[int] = ..., schema: _Optional[bytes] = ..., records: _Optional[bytes] = ..., aborted_transactions: _Optional[_Iterable[_Union[AbortedTransaction, _Mapping]]] = ..., next_offset: _Optional[int] = ...) -> None: ...

class FetchResponse(_message.Message):
    __slots__ = ("partitions",)
    PARTITIONS_FIELD_NUMBER: _ClassVar[int]
    partitions: _containers.RepeatedCompositeFieldContainer[FetchPartitionResponse]
    def __init__(self, partitions: _Optional[_Iterable[_Union[FetchPartitionResponse, _Mapping]]] = ...) -> None: ...

class OffsetForLeaderEpochPartition(_message.Message):
    __slots__ = ("topic", "partition", "current_leader_epoch", "leader_epoch")
    TOPIC_FIELD_NUMBER: _ClassVar[int]
    PARTITION_FIELD_NUMBER: _ClassVar[int]
    CURRENT_LEADER_EPOCH_FIELD_NUMBER: _ClassVar[int]
    LEADER_EPOCH_FIELD_NUMBER: _ClassVar[int]
    topic: str
    partition: int
    current_leader_epoch: int
    leader_epoch: int
    def __init__(self, topic: _Optional[str] = ..., partition: _Optional[int] = ..., current_leader_epoch: _Optional[int] = ..., leader_epoch: _Optional[int] = ...) -> None: ...

class OffsetsForLeaderEpochRequest(_message.Message):
    __slots__ = ("replica_id", "partitions")
    REPLICA_ID_FIELD_NUMBER: _ClassVar[int]
    PARTITIONS_FIELD_NUMBER: _ClassVar[int]
    replica_id: int
    partitions: _containers.RepeatedCompositeFieldContainer[OffsetForLeaderEpochPartition]
    def __init__(self, replica_id: _Optional[int] = ..., partitions: _Optional[_Iterable[_Union[OffsetForLeaderEpochPartition, _Mapping]]] = ...) -> None: ...

class OffsetForLeaderEpochResult(_message.Message):
    __slots__ = ("topic", "partition", "error", "leader_epoch", "end_offset")
    TOPIC_FIELD_NUMBER: _ClassVar[int]
    PARTITION_FIELD_NUMBER: _ClassVar[int]
    ERROR_FIELD_NUMBER: _ClassVar[int]
    LEADER_EPOCH_FIELD_NUMBER: _ClassVar[int]
    END_OFFSET_FIELD_NUMBER: _ClassVar[int]
    topic: str
    partition: int
    error: Error
    leader_epoch: int
    end_offset: int
    def __init__(self, topic: _Optional[str] = ..., partition: _Optional[int] = ..., error: _Optional[_Union[Error, _Mapping]] = ..., leader_epoch: _Optional[int] = ..., end_offset: _Optional[int] = ...) -> None: ...

class OffsetsForLeaderEpochResponse(_message.Message):
    __slots__ = ("partitions",)
    PARTITIONS_FIELD_NUMBER: _ClassVar[int]
    partitions: _containers.RepeatedCompositeFieldContainer[OffsetForLeaderEpochResult]
    def __init__(self, partitions: _Optional[_Iterable[_Union[OffsetForLeaderEpochResult, _Mapping]]] = ...) -> None: ...

class ListOffsetsPartition(_message.Message):
    __slots__ = ("topic", "partition", "timestamp")
    TOPIC_FIELD_NUMBER: _ClassVar[int]
    PARTITION_FIELD_NUMBER: _ClassVar[int]
    TIMESTAMP_FIELD_NUMBER: _ClassVar[int]
    topic: str
    partition: int
    timestamp: int
    def __init__(self, topic: _Optional[str] = ..., partition: _Optional[int] = ..., timestamp: _Optional[int] = ...) -> None: ...

class ListOffsetsRequest(_message.Message):
    __slots__ = ("isolation_level", "partitions")
    ISOLATION_LEVEL_FIELD_NUMBER: _ClassVar[int]
    PARTITIONS_FIELD_NUMBER: _ClassVar[int]
    isolation_level: IsolationLevel
    partitions: _containers.RepeatedCompositeFieldContainer[ListOffsetsPartition]
    def __init__(self, isolation_level: _Optional[_Union[IsolationLevel, str]] = ..., partitions: _Optional[_Iterable[_Union[ListOffsetsPartition, _Mapping]]] = ...) -> None: ...

class ListOffsetsPartitionResponse(_message.Message):
    __slots__ = ("topic", "partition", "error", "offset", "timestamp")
    TOPIC_FIELD_NUMBER: _ClassVar[int]
    PARTITION_FIELD_NUMBER: _ClassVar[int]
    ERROR_FIELD_NUMBER: _ClassVar[int]
    OFFSET_FIELD_NUMBER: _ClassVar[int]
    TIMESTAMP_FIELD_NUMBER: _ClassVar[int]
    topic: str
    partition: int
    error: Error
    offset: int
    timestamp: int
    def __init__(self, topic: _Optional[str] = ..., partition: _Optional[int] = ..., error: _Optional[_Union[Error, _Mapping]] = ..., offset: _Optional[int] = ..., timestamp: _Optional[int] = ...) -> None: ...

class ListOffsetsResponse(_message.Message):
    __slots__ = ("partitions",)
    PARTITIONS_FIELD_NUMBER: _ClassVar[int]
    partitions: _containers.RepeatedCompositeFieldContainer[ListOffsetsPartitionResponse]
    def __init__(self, partitions: _Optional[_Iterable[_Union[ListOffsetsPartitionResponse, _Mapping]]] = ...) -> None: ...

class DeleteRecordsPartition(_message.Message):
    __slots__ = ("topic", "partition", "offset")
    TOPIC_FIELD_NUMBER: _ClassVar[int]
    PARTITION_FIELD_NUMBER: _ClassVar[int]
    OFFSET_FIELD_NUMBER: _ClassVar[int]
    topic: str
    partition: int
    offset: int
    def __init__(self, topic: _Optional[str] = ..., partition: _Optional[int] = ..., offset: _Optional[int] = ...) -> None: ...

class DeleteRecordsRequest(_message.Message):
    __slots__ = ("partitions",)
    PARTITIONS_FIELD_NUMBER: _ClassVar[int]
    partitions: _containers.RepeatedCompositeFieldContainer[DeleteRecordsPartition]
    def __init__(self, partitions: _Optional[_Iterable[_Union[DeleteRecordsPartition, _Mapping]]] = ...) -> None: ...

class DeleteRecordsPartitionResponse(_message.Message):
    __slots__ = ("topic", "partition", "error", "low_watermark")
    TOPIC_FIELD_NUMBER: _ClassVar[int]
    PARTITION_FIELD_NUMBER: _ClassVar[int]
    ERROR_FIELD_NUMBER: _ClassVar[int]
    LOW_WATERMARK_FIELD_NUMBER: _ClassVar[int]
    topic: str
    partition: int
    error: Error
    low_watermark: int
    def __init__(self, topic: _Optional[str] = ..., partition: _Optional[int] = ..., error: _Optional[_Union[Error, _Mapping]] = ..., low_watermark: _Optional[int] = ...) -> None: ...

class DeleteRecordsResponse(_message.Message):
    __slots__ = ("partitions",)
    PARTITIONS_FIELD_NUMBER: _ClassVar[int]
    partitions: _containers.RepeatedCompositeFieldContainer[DeleteRecordsPartitionResponse]
    def __init__(self, partitions: _Optional[_Iterable[_Union[DeleteRecordsPartitionResponse, _Mapping]]] = ...) -> None: ...

class DescribeCleaningRequest(_message.Message):
    __slots__ = ("topics", "now_ms")
    TOPICS_FIELD_NUMBER: _ClassVar[int]
    NOW_MS_FIELD_NUMBER: _ClassVar[int]
    topics: _containers.RepeatedScalarFieldContainer[str]
    now_ms: int
    def __init__(self, topics: _Optional[_Iterable[str]] = ..., now_ms: _Optional[int] = ...) -> None: ...

class CleanableSegment(_message.Message):
    __slots__ = ("base_offset", "next_offset", "size_bytes", "max_timestamp")
    BASE_OFFSET_FIELD_NUMBER: _ClassVar[int]
    NEXT_OFFSET_FIELD_NUMBER: _ClassVar[int]
    SIZE_BYTES_FIELD_NUMBER: _ClassVar[int]
    MAX_TIMESTAMP_FIELD_NUMBER: _ClassVar[int]
    base_offset: int
    next_offset: int
    size_bytes: int
    max_timestamp: int
    def __init__(self, base_offset: _Optional[int] = ..., next_offset: _Optional[int] = ..., size_bytes: _Optional[int] = ..., max_timestamp: _Optional[int] = ...) -> None: ...

class PartitionCleaning(_message.Message):
    __slots__ = ("partition", "error", "log_start_offset", "log_end_offset", "last_stable_offset", "active_segment_base", "first_dirty_offset", "cleanable_end_offset", "clean_bytes", "dirty_bytes", "dirty_ratio", "segments", "in_progress")
    PARTITION_FIELD_NUMBER: _ClassVar[int]
    ERROR_FIELD_NUMBER: _ClassVar[int]
    LOG_START_OFFSET_FIELD_NUMBER: _ClassVar[int]
    LOG_END_OFFSET_FIELD_NUMBER: _ClassVar[int]
    LAST_STABLE_OFFSET_FIELD_NUMBER: _ClassVar[int]
    ACTIVE_SEGMENT_BASE_FIELD_NUMBER: _ClassVar[int]
    FIRST_DIRTY_OFFSET_FIELD_NUMBER: _ClassVar[int]
    CLEANABLE_END_OFFSET_FIELD_NUMBER: _ClassVar[int]
    CLEAN_BYTES_FIELD_NUMBER: _ClassVar[int]
    DIRTY_BYTES_FIELD_NUMBER: _ClassVar[int]
    DIRTY_RATIO_FIELD_NUMBER: _ClassVar[int]
    SEGMENTS_FIELD_NUMBER: _ClassVar[int]
    IN_PROGRESS_FIELD_NUMBER: _ClassVar[int]
    partition: int
    error: Error
    log_start_offset: int
    log_end_offset: int
    last_stable_offset: int
    active_segment_base: int
    first_dirty_offset: int
    cleanable_end_offset: int
    clean_bytes: int
    dirty_bytes: int
    dirty_ratio: float
    segments: _containers.RepeatedCompositeFieldContainer[CleanableSegment]
    in_progress: bool
    def __init__(self, partition: _Optional[int] = ..., error: _Optional[_Union[Error, _Mapping]] = ..., log_start_offset: _Optional[int] = ..., log_end_offset: _Optional[int] = ..., last_stable_offset: _Optional[int] = ..., active_segment_base: _Optional[int] = ..., first_dirty_offset: _Optional[int] = ..., cleanable_end_offset: _Optional[int] = ..., clean_bytes: _Optional[int] = ..., dirty_bytes: _Optional[int] = ..., dirty_ratio: _Optional[float] = ..., segments: _Optional[_Iterable[_Union[CleanableSegment, _Mapping]]] = ..., in_progress: _Optional[bool] = ...) -> None: ...

class TopicCleaning(_message.Message):
    __slots__ = ("name", "error", "cleanup_policy", "min_cleanable_dirty_ratio", "delete_retention_ms", "min_compaction_lag_ms", "segment_bytes", "partitions")
    NAME_FIELD_NUMBER: _ClassVar[int]
    ERROR_FIELD_NUMBER: _ClassVar[int]
    CLEANUP_POLICY_FIELD_NUMBER: _ClassVar[int]
    MIN_CLEANABLE_DIRTY_RATIO_FIELD_NUMBER: _ClassVar[int]
    DELETE_RETENTION_MS_FIELD_NUMBER: _ClassVar[int]
    MIN_COMPACTION_LAG_MS_FIELD_NUMBER: _ClassVar[int]
    SEGMENT_BYTES_FIELD_NUMBER: _ClassVar[int]
    PARTITIONS_FIELD_NUMBER: _ClassVar[int]
    name: str
    error: Error
    cleanup_policy: str
    min_cleanable_dirty_ratio: float
    delete_retention_ms: int
    min_compaction_lag_ms: int
    segment_bytes: int
    partitions: _containers.RepeatedCompositeFieldContainer[PartitionCleaning]
    def __init__(self, name: _Optional[str] = ..., error: _Optional[_Union[Error, _Mapping]] = ..., cleanup_policy: _Optional[str] = ..., min_cleanable_dirty_ratio: _Optional[float] = ..., delete_retention_ms: _Optional[int] = ..., min_compaction_lag_ms: _Optional[int] = ..., segment_bytes: _Optional[int] = ..., partitions: _Optional[_Iterable[_Union[PartitionCleaning, _Mapping]]] = ...) -> None: ...

class DescribeCleaningResponse(_message.Message):
    __slots__ = ("topics",)
    TOPICS_FIELD_NUMBER: _ClassVar[int]
    topics: _containers.RepeatedCompositeFieldContainer[TopicCleaning]
    def __init__(self, topics: _Optional[_Iterable[_Union[TopicCleaning, _Mapping]]] = ...) -> None: ...

class ReplaceSegmentsBegin(_message.Message):
    __slots__ = ("topic", "partition", "segments", "end_offset", "cleaner_checkpoint", "follower")
    TOPIC_FIELD_NUMBER: _ClassVar[int]
    PARTITION_FIELD_NUMBER: _ClassVar[int]
    SEGMENTS_FIELD_NUMBER: _ClassVar[int]
    END_OFFSET_FIELD_NUMBER: _ClassVar[int]
    CLEANER_CHECKPOINT_FIELD_NUMBER: _ClassVar[int]
    FOLLOWER_FIELD_NUMBER: _ClassVar[int]
    topic: str
    partition: int
    segments: _containers.RepeatedCompositeFieldContainer[CleanableSegment]
    end_offset: int
    cleaner_checkpoint: int
    follower: bool
    def __init__(self, topic: _Optional[str] = ..., partition: _Optional[int] = ..., segments: _Optional[_Iterable[_Union[CleanableSegment, _Mapping]]] = ..., end_offset: _Optional[int] = ..., cleaner_checkpoint: _Optional[int] = ..., follower: _Optional[bool] = ...) -> None: ...

class ReplacementChunk(_message.Message):
    __slots__ = ("schema", "records")
    SCHEMA_FIELD_NUMBER: _ClassVar[int]
    RECORDS_FIELD_NUMBER: _ClassVar[int]
    schema: bytes
    records: bytes
    def __init__(self, schema: _Optional[bytes] = ..., records: _Optional[bytes] = ...) -> None: ...

class ReplaceSegmentsEnd(_message.Message):
    __slots__ = ("chunks",)
    CHUNKS_FIELD_NUMBER: _ClassVar[int]
    chunks: int
    def __init__(self, chunks: _Optional[int] = ...) -> None: ...

class ReplaceSegmentsRequest(_message.Message):
    __slots__ = ("begin", "chunk", "end")
    BEGIN_FIELD_NUMBER: _ClassVar[int]
    CHUNK_FIELD_NUMBER: _ClassVar[int]
    END_FIELD_NUMBER: _ClassVar[int]
    begin: ReplaceSegmentsBegin
    chunk: ReplacementChunk
    end: ReplaceSegmentsEnd
    def __init__(self, begin: _Optional[_Union[ReplaceSegmentsBegin, _Mapping]] = ..., chunk: _Optional[_Union[ReplacementChunk, _Mapping]] = ..., end: _Optional[_Union[ReplaceSegmentsEnd, _Mapping]] = ...) -> None: ...

class ReplaceSegmentsResponse(_message.Message):
    __slots__ = ("new_base_offsets", "bytes_before", "bytes_after", "batches", "records", "cleaner_checkpoint")
    NEW_BASE_OFFSETS_FIELD_NUMBER: _ClassVar[int]
    BYTES_BEFORE_FIELD_NUMBER: _ClassVar[int]
    BYTES_AFTER_FIELD_NUMBER: _ClassVar[int]
    BATCHES_FIELD_NUMBER: _ClassVar[int]
    RECORDS_FIELD_NUMBER: _ClassVar[int]
    CLEANER_CHECKPOINT_FIELD_NUMBER: _ClassVar[int]
    new_base_offsets: _containers.RepeatedScalarFieldContainer[int]
    bytes_before: int
    bytes_after: int
    batches: int
    records: int
    cleaner_checkpoint: int
    def __init__(self, new_base_offsets: _Optional[_Iterable[int]] = ..., bytes_before: _Optional[int] = ..., bytes_after: _Optional[int] = ..., batches: _Optional[int] = ..., records: _Optional[int] = ..., cleaner_checkpoint: _Optional[int] = ...) -> None: ...

class InitProducerIdRequest(_message.Message):
    __slots__ = ("transactional_id", "transaction_timeout_ms", "producer_id", "producer_epoch")
    TRANSACTIONAL_ID_FIELD_NUMBER: _ClassVar[int]
    TRANSACTION_TIMEOUT_MS_FIELD_NUMBER: _ClassVar[int]
    PRODUCER_ID_FIELD_NUMBER: _ClassVar[int]
    PRODUCER_EPOCH_FIELD_NUMBER: _ClassVar[int]
    transactional_id: str
    transaction_timeout_ms: int
    producer_id: int
    producer_epoch: int
    def __init__(self, transactional_id: _Optional[str] = ..., transaction_timeout_ms: _Optional[int] = ..., producer_id: _Optional[int] = ..., producer_epoch: _Optional[int] = ...) -> None: ...

class InitProducerIdResponse(_message.Message):
    __slots__ = ("error", "producer_id", "producer_epoch")
    ERROR_FIELD_NUMBER: _ClassVar[int]
    PRODUCER_ID_FIELD_NUMBER: _ClassVar[int]
    PRODUCER_EPOCH_FIELD_NUMBER: _ClassVar[int]
    error: Error
    producer_id: int
    producer_epoch: int
    def __init__(self, error: _Optional[_Union[Error, _Mapping]] = ..., producer_id: _Optional[int] = ..., producer_epoch: _Optional[int] = ...) -> None: ...

class TopicPartitionRef(_message.Message):
    __slots__ = ("topic", "partition")
    TOPIC_FIELD_NUMBER: _ClassVar[int]
    PARTITION_FIELD_NUMBER: _ClassVar[int]
    topic: str
    partition: int
    def __init__(self, topic: _Optional[str] = ..., partition: _Optional[int] = ...) -> None: ...

class AddPartitionsToTxnRequest(_message.Message):
    __slots__ = ("transactional_id", "producer_id", "producer_epoch", "partitions", "verify_only")
    TRANSACTIONAL_ID_FIELD_NUMBER: _ClassVar[int]
    PRODUCER_ID_FIELD_NUMBER: _ClassVar[int]
    PRODUCER_EPOCH_FIELD_NUMBER: _ClassVar[int]
    PARTITIONS_FIELD_NUMBER: _ClassVar[int]
    VERIFY_ONLY_FIELD_NUMBER: _ClassVar[int]
    transactional_id: str
    producer_id: int
    producer_epoch: int
    partitions: _containers.RepeatedCompositeFieldContainer[TopicPartitionRef]
    verify_only: bool
    def __init__(self, transactional_id: _Optional[str] = ..., producer_id: _Optional[int] = ..., producer_epoch: _Optional[int] = ..., partitions: _Optional[_Iterable[_Union[TopicPartitionRef, _Mapping]]] = ..., verify_only: _Optional[bool] = ...) -> None: ...

class AddPartitionsToTxnResponse(_message.Message):
    __slots__ = ("error", "txn_number")
    ERROR_FIELD_NUMBER: _ClassVar[int]
    TXN_NUMBER_FIELD_NUMBER: _ClassVar[int]
    error: Error
    txn_number: int
    def __init__(self, error: _Optional[_Union[Error, _Mapping]] = ..., txn_number: _Optional[int] = ...) -> None: ...

class EndTxnRequest(_message.Message):
    __slots__ = ("transactional_id", "producer_id", "producer_epoch", "txn_number", "commit")
    TRANSACTIONAL_ID_FIELD_NUMBER: _ClassVar[int]
    PRODUCER_ID_FIELD_NUMBER: _ClassVar[int]
    PRODUCER_EPOCH_FIELD_NUMBER: _ClassVar[int]
    TXN_NUMBER_FIELD_NUMBER: _ClassVar[int]
    COMMIT_FIELD_NUMBER: _ClassVar[int]
    transactional_id: str
    producer_id: int
    producer_epoch: int
    txn_number: int
    commit: bool
    def __init__(self, transactional_id: _Optional[str] = ..., producer_id: _Optional[int] = ..., producer_epoch: _Optional[int] = ..., txn_number: _Optional[int] = ..., commit: _Optional[bool] = ...) -> None: ...

class EndTxnResponse(_message.Message):
    __slots__ = ("error",)
    ERROR_FIELD_NUMBER: _ClassVar[int]
    error: Error
    def __init__(self, error: _Optional[_Union[Error, _Mapping]] = ...) -> None: ...

class TxnRef(_message.Message):
    __slots__ = ("transactional_id", "producer_id", "producer_epoch", "txn_number")
    TRANSACTIONAL_ID_FIELD_NUMBER: _ClassVar[int]
    PRODUCER_ID_FIELD_NUMBER: _ClassVar[int]
    PRODUCER_EPOCH_FIELD_NUMBER: _ClassVar[int]
    TXN_NUMBER_FIELD_NUMBER: _ClassVar[int]
    transactional_id: str
    producer_id: int
    producer_epoch: int
    txn_number: int
    def __init__(self, transactional_id: _Optional[str] = ..., producer_id: _Optional[int] = ..., producer_epoch: _Optional[int] = ..., txn_number: _Optional[int] = ...) -> None: ...

class EndTxnGroupRequest(_message.Message):
    __slots__ = ("group_id", "batch_id", "txns", "abort_prefix", "commit")
    GROUP_ID_FIELD_NUMBER: _ClassVar[int]
    BATCH_ID_FIELD_NUMBER: _ClassVar[int]
    TXNS_FIELD_NUMBER: _ClassVar[int]
    ABORT_PREFIX_FIELD_NUMBER: _ClassVar[int]
    COMMIT_FIELD_NUMBER: _ClassVar[int]
    group_id: str
    batch_id: int
    txns: _containers.RepeatedCompositeFieldContainer[TxnRef]
    abort_prefix: str
    commit: bool
    def __init__(self, group_id: _Optional[str] = ..., batch_id: _Optional[int] = ..., txns: _Optional[_Iterable[_Union[TxnRef, _Mapping]]] = ..., abort_prefix: _Optional[str] = ..., commit: _Optional[bool] = ...) -> None: ...

class EndTxnGroupResponse(_message.Message):
    __slots__ = ("error", "committed", "last_committed_batch_id")
    ERROR_FIELD_NUMBER: _ClassVar[int]
    COMMITTED_FIELD_NUMBER: _ClassVar[int]
    LAST_COMMITTED_BATCH_ID_FIELD_NUMBER: _ClassVar[int]
    error: Error
    committed: bool
    last_committed_batch_id: int
    def __init__(self, error: _Optional[_Union[Error, _Mapping]] = ..., committed: _Optional[bool] = ..., last_committed_batch_id: _Optional[int] = ...) -> None: ...

class DescribeTxnGroupRequest(_message.Message):
    __slots__ = ("group_id",)
    GROUP_ID_FIELD_NUMBER: _ClassVar[int]
    group_id: str
    def __init__(self, group_id: _Optional[str] = ...) -> None: ...

class DescribeTxnGroupResponse(_message.Message):
    __slots__ = ("error", "last_committed_batch_id")
    ERROR_FIELD_NUMBER: _ClassVar[int]
    LAST_COMMITTED_BATCH_ID_FIELD_NUMBER: _ClassVar[int]
    error: Error
    last_committed_batch_id: int
    def __init__(self, error: _Optional[_Union[Error, _Mapping]] = ..., last_committed_batch_id: _Optional[int] = ...) -> None: ...

class TopicPartitions(_message.Message):
    __slots__ = ("topic", "partitions")
    TOPIC_FIELD_NUMBER: _ClassVar[int]
    PARTITIONS_FIELD_NUMBER: _ClassVar[int]
    topic: str
    partitions: _containers.RepeatedScalarFieldContainer[int]
    def __init__(self, topic: _Optional[str] = ..., partitions: _Optional[_Iterable[int]] = ...) -> None: ...

class ConsumerGroupHeartbeatRequest(_message.Message):
    __slots__ = ("group_id", "member_id", "member_epoch", "instance_id", "rebalance_timeout_ms", "subscribed_topics", "server_assignor", "owned_partitions", "max_wait_ms", "request_seq", "client_id")
    GROUP_ID_FIELD_NUMBER: _ClassVar[int]
    MEMBER_ID_FIELD_NUMBER: _ClassVar[int]
    MEMBER_EPOCH_FIELD_NUMBER: _ClassVar[int]
    INSTANCE_ID_FIELD_NUMBER: _ClassVar[int]
    REBALANCE_TIMEOUT_MS_FIELD_NUMBER: _ClassVar[int]
    SUBSCRIBED_TOPICS_FIELD_NUMBER: _ClassVar[int]
    SERVER_ASSIGNOR_FIELD_NUMBER: _ClassVar[int]
    OWNED_PARTITIONS_FIELD_NUMBER: _ClassVar[int]
    MAX_WAIT_MS_FIELD_NUMBER: _ClassVar[int]
    REQUEST_SEQ_FIELD_NUMBER: _ClassVar[int]
    CLIENT_ID_FIELD_NUMBER: _ClassVar[int]
    group_id: str
    member_id: str
    member_epoch: int
    instance_id: str
    rebalance_timeout_ms: int
    subscribed_topics: _containers.RepeatedScalarFieldContainer[str]
    server_assignor: str
    owned_partitions: _containers.RepeatedCompositeFieldContainer[TopicPartitions]
    max_wait_ms: int
    request_seq: int
    client_id: str
    def __init__(self, group_id: _Optional[str] = ..., member_id: _Optional[str] = ..., member_epoch: _Optional[int] = ..., instance_id: _Optional[str] = ..., rebalance_timeout_ms: _Optional[int] = ..., subscribed_topics: _Optional[_Iterable[str]] = ..., server_assignor: _Optional[str] = ..., owned_partitions: _Optional[_Iterable[_Union[TopicPartitions, _Mapping]]] = ..., max_wait_ms: _Optional[int] = ..., request_seq: _Optional[int] = ..., client_id: _Optional[str] = ...) -> None: ...

class ConsumerGroupHeartbeatResponse(_message.Message):
    __slots__ = ("error", "member_id", "member_epoch", "heartbeat_interval_ms", "session_timeout_ms", "assignment")
    ERROR_FIELD_NUMBER: _ClassVar[int]
    MEMBER_ID_FIELD_NUMBER: _ClassVar[int]
    MEMBER_EPOCH_FIELD_NUMBER: _ClassVar[int]
    HEARTBEAT_INTERVAL_MS_FIELD_NUMBER: _ClassVar[int]
    SESSION_TIMEOUT_MS_FIELD_NUMBER: _ClassVar[int]
    ASSIGNMENT_FIELD_NUMBER: _ClassVar[int]
    error: Error
    member_id: str
    member_epoch: int
    heartbeat_interval_ms: int
    session_timeout_ms: int
    assignment: _containers.RepeatedCompositeFieldContainer[TopicPartitions]
    def __init__(self, error: _Optional[_Union[Error, _Mapping]] = ..., member_id: _Optional[str] = ..., member_epoch: _Optional[int] = ..., heartbeat_interval_ms: _Optional[int] = ..., session_timeout_ms: _Optional[int] = ..., assignment: _Optional[_Iterable[_Union[TopicPartitions, _Mapping]]] = ...) -> None: ...

class OffsetCommitPartition(_message.Message):
    __slots__ = ("topic", "partition", "offset", "metadata")
    TOPIC_FIELD_NUMBER: _ClassVar[int]
    PARTITION_FIELD_NUMBER: _ClassVar[int]
    OFFSET_FIELD_NUMBER: _ClassVar[int]
    METADATA_FIELD_NUMBER: _ClassVar[int]
    topic: str
    partition: int
    offset: int
    metadata: str
    def __init__(self, topic: _Optional[str] = ..., partition: _Optional[int] = ..., offset: _Optional[int] = ..., metadata: _Optional[str] = ...) -> None: ...

class OffsetCommitRequest(_message.Message):
    __slots__ = ("group_id", "member_id", "member_epoch", "partitions")
    GROUP_ID_FIELD_NUMBER: _ClassVar[int]
    MEMBER_ID_FIELD_NUMBER: _ClassVar[int]
    MEMBER_EPOCH_FIELD_NUMBER: _ClassVar[int]
    PARTITIONS_FIELD_NUMBER: _ClassVar[int]
    group_id: str
    member_id: str
    member_epoch: int
    partitions: _containers.RepeatedCompositeFieldContainer[OffsetCommitPartition]
    def __init__(self, group_id: _Optional[str] = ..., member_id: _Optional[str] = ..., member_epoch: _Optional[int] = ..., partitions: _Optional[_Iterable[_Union[OffsetCommitPartition, _Mapping]]] = ...) -> None: ...

class OffsetCommitPartitionResponse(_message.Message):
    __slots__ = ("topic", "partition", "error")
    TOPIC_FIELD_NUMBER: _ClassVar[int]
    PARTITION_FIELD_NUMBER: _ClassVar[int]
    ERROR_FIELD_NUMBER: _ClassVar[int]
    topic: str
    partition: int
    error: Error
    def __init__(self, topic: _Optional[str] = ..., partition: _Optional[int] = ..., error: _Optional[_Union[Error, _Mapping]] = ...) -> None: ...

class OffsetCommitResponse(_message.Message):
    __slots__ = ("error", "partitions")
    ERROR_FIELD_NUMBER: _ClassVar[int]
    PARTITIONS_FIELD_NUMBER: _ClassVar[int]
    error: Error
    partitions: _containers.RepeatedCompositeFieldContainer[OffsetCommitPartitionResponse]
    def __init__(self, error: _Optional[_Union[Error, _Mapping]] = ..., partitions: _Optional[_Iterable[_Union[OffsetCommitPartitionResponse, _Mapping]]] = ...) -> None: ...

class OffsetFetchRequest(_message.Message):
    __slots__ = ("group_id", "partitions")
    GROUP_ID_FIELD_NUMBER: _ClassVar[int]
    PARTITIONS_FIELD_NUMBER: _ClassVar[int]
    group_id: str
    partitions: _containers.RepeatedCompositeFieldContainer[TopicPartitions]
    def __init__(self, group_id: _Optional[str] = ..., partitions: _Optional[_Iterable[_Union[TopicPartitions, _Mapping]]] = ...) -> None: ...

class CommittedOffset(_message.Message):
    __slots__ = ("topic", "partition", "offset", "metadata", "commit_timestamp_ms", "member_id", "member_epoch")
    TOPIC_FIELD_NUMBER: _ClassVar[int]
    PARTITION_FIELD_NUMBER: _ClassVar[int]
    OFFSET_FIELD_NUMBER: _ClassVar[int]
    METADATA_FIELD_NUMBER: _ClassVar[int]
    COMMIT_TIMESTAMP_MS_FIELD_NUMBER: _ClassVar[int]
    MEMBER_ID_FIELD_NUMBER: _ClassVar[int]
    MEMBER_EPOCH_FIELD_NUMBER: _ClassVar[int]
    topic: str
    partition: int
    offset: int
    metadata: str
    commit_timestamp_ms: int
    member_id: str
    member_epoch: int
    def __init__(self, topic: _Optional[str] = ..., partition: _Optional[int] = ..., offset: _Optional[int] = ..., metadata: _Optional[str] = ..., commit_timestamp_ms: _Optional[int] = ..., member_id: _Optional[str] = ..., member_epoch: _Optional[int] = ...) -> None: ...

class OffsetFetchResponse(_message.Message):
    __slots__ = ("error", "offsets")
    ERROR_FIELD_NUMBER: _ClassVar[int]
    OFFSETS_FIELD_NUMBER: _ClassVar[int]
    error: Error
    offsets: _containers.RepeatedCompositeFieldContainer[CommittedOffset]
    def __init__(self, error: _Optional[_Union[Error, _Mapping]] = ..., offsets: _Optional[_Iterable[_Union[CommittedOffset, _Mapping]]] = ...) -> None: ...

class ListGroupsRequest(_message.Message):
    __slots__ = ()
    def __init__(self) -> None: ...

class GroupListing(_message.Message):
    __slots__ = ("group_id", "state", "members", "assignor")
    GROUP_ID_FIELD_NUMBER: _ClassVar[int]
    STATE_FIELD_NUMBER: _ClassVar[int]
    MEMBERS_FIELD_NUMBER: _ClassVar[int]
    ASSIGNOR_FIELD_NUMBER: _ClassVar[int]
    group_id: str
    state: str
    members: int
    assignor: str
    def __init__(self, group_id: _Optional[str] = ..., state: _Optional[str] = ..., members: _Optional[int] = ..., assignor: _Optional[str] = ...) -> None: ...

class ListGroupsResponse(_message.Message):
    __slots__ = ("groups",)
    GROUPS_FIELD_NUMBER: _ClassVar[int]
    groups: _containers.RepeatedCompositeFieldContainer[GroupListing]
    def __init__(self, groups: _Optional[_Iterable[_Union[GroupListing, _Mapping]]] = ...) -> None: ...

class DescribeGroupsRequest(_message.Message):
    __slots__ = ("group_ids",)
    GROUP_IDS_FIELD_NUMBER: _ClassVar[int]
    group_ids: _containers.RepeatedScalarFieldContainer[str]
    def __init__(self, group_ids: _Optional[_Iterable[str]] = ...) -> None: ...

class GroupMember(_message.Message):
    __slots__ = ("member_id", "instance_id", "client_id", "client_host", "member_epoch", "subscribed_topics", "server_assignor", "assignment", "pending_revocation", "target_assignment", "left")
    MEMBER_ID_FIELD_NUMBER: _ClassVar[int]
    INSTANCE_ID_FIELD_NUMBER: _ClassVar[int]
    CLIENT_ID_FIELD_NUMBER: _ClassVar[int]
    CLIENT_HOST_FIELD_NUMBER: _ClassVar[int]
    MEMBER_EPOCH_FIELD_NUMBER: _ClassVar[int]
    SUBSCRIBED_TOPICS_FIELD_NUMBER: _ClassVar[int]
    SERVER_ASSIGNOR_FIELD_NUMBER: _ClassVar[int]
    ASSIGNMENT_FIELD_NUMBER: _ClassVar[int]
    PENDING_REVOCATION_FIELD_NUMBER: _ClassVar[int]
    TARGET_ASSIGNMENT_FIELD_NUMBER: _ClassVar[int]
    LEFT_FIELD_NUMBER: _ClassVar[int]
    member_id: str
    instance_id: str
    client_id: str
    client_host: str
    member_epoch: int
    subscribed_topics: _containers.RepeatedScalarFieldContainer[str]
    server_assignor: str
    assignment: _containers.RepeatedCompositeFieldContainer[TopicPartitions]
    pending_revocation: _containers.RepeatedCompositeFieldContainer[TopicPartitions]
    target_assignment: _containers.RepeatedCompositeFieldContainer[TopicPartitions]
    left: bool
    def __init__(self, member_id: _Optional[str] = ..., instance_id: _Optional[str] = ..., client_id: _Optional[str] = ..., client_host: _Optional[str] = ..., member_epoch: _Optional[int] = ..., subscribed_topics: _Optional[_Iterable[str]] = ..., server_assignor: _Optional[str] = ..., assignment: _Optional[_Iterable[_Union[TopicPartitions, _Mapping]]] = ..., pending_revocation: _Optional[_Iterable[_Union[TopicPartitions, _Mapping]]] = ..., target_assignment: _Optional[_Iterable[_Union[TopicPartitions, _Mapping]]] = ..., left: _Optional[bool] = ...) -> None: ...

class GroupDescription(_message.Message):
    __slots__ = ("group_id", "error", "state", "group_epoch", "assignment_epoch", "assignor", "members", "offsets")
    GROUP_ID_FIELD_NUMBER: _ClassVar[int]
    ERROR_FIELD_NUMBER: _ClassVar[int]
    STATE_FIELD_NUMBER: _ClassVar[int]
    GROUP_EPOCH_FIELD_NUMBER: _ClassVar[int]
    ASSIGNMENT_EPOCH_FIELD_NUMBER: _ClassVar[int]
    ASSIGNOR_FIELD_NUMBER: _ClassVar[int]
    MEMBERS_FIELD_NUMBER: _ClassVar[int]
    OFFSETS_FIELD_NUMBER: _ClassVar[int]
    group_id: str
    error: Error
    state: str
    group_epoch: int
    assignment_epoch: int
    assignor: str
    members: _containers.RepeatedCompositeFieldContainer[GroupMember]
    offsets: _containers.RepeatedCompositeFieldContainer[CommittedOffset]
    def __init__(self, group_id: _Optional[str] = ..., error: _Optional[_Union[Error, _Mapping]] = ..., state: _Optional[str] = ..., group_epoch: _Optional[int] = ..., assignment_epoch: _Optional[int] = ..., assignor: _Optional[str] = ..., members: _Optional[_Iterable[_Union[GroupMember, _Mapping]]] = ..., offsets: _Optional[_Iterable[_Union[CommittedOffset, _Mapping]]] = ...) -> None: ...

class DescribeGroupsResponse(_message.Message):
    __slots__ = ("groups",)
    GROUPS_FIELD_NUMBER: _ClassVar[int]
    groups: _containers.RepeatedCompositeFieldContainer[GroupDescription]
    def __init__(self, groups: _Optional[_Iterable[_Union[GroupDescription, _Mapping]]] = ...) -> None: ...

class DeleteGroupsRequest(_message.Message):
    __slots__ = ("group_ids",)
    GROUP_IDS_FIELD_NUMBER: _ClassVar[int]
    group_ids: _containers.RepeatedScalarFieldContainer[str]
    def __init__(self, group_ids: _Optional[_Iterable[str]] = ...) -> None: ...

class GroupResult(_message.Message):
    __slots__ = ("group_id", "error")
    GROUP_ID_FIELD_NUMBER: _ClassVar[int]
    ERROR_FIELD_NUMBER: _ClassVar[int]
    group_id: str
    error: Error
    def __init__(self, group_id: _Optional[str] = ..., error: _Optional[_Union[Error, _Mapping]] = ...) -> None: ...

class DeleteGroupsResponse(_message.Message):
    __slots__ = ("results",)
    RESULTS_FIELD_NUMBER: _ClassVar[int]
    results: _containers.RepeatedCompositeFieldContainer[GroupResult]
    def __init__(self, results: _Optional[_Iterable[_Union[GroupResult, _Mapping]]] = ...) -> None: ...

class SaslAuthenticateRequest(_message.Message):
    __slots__ = ("mechanism", "auth_bytes", "exchange_id")
    MECHANISM_FIELD_NUMBER: _ClassVar[int]
    AUTH_BYTES_FIELD_NUMBER: _ClassVar[int]
    EXCHANGE_ID_FIELD_NUMBER: _ClassVar[int]
    mechanism: str
    auth_bytes: bytes
    exchange_id: str
    def __init__(self, mechanism: _Optional[str] = ..., auth_bytes: _Optional[bytes] = ..., exchange_id: _Optional[str] = ...) -> None: ...

class SaslAuthenticateResponse(_message.Message):
    __slots__ = ("error", "auth_bytes", "exchange_id", "complete", "session_token", "session_lifetime_ms", "principal")
    ERROR_FIELD_NUMBER: _ClassVar[int]
    AUTH_BYTES_FIELD_NUMBER: _ClassVar[int]
    EXCHANGE_ID_FIELD_NUMBER: _ClassVar[int]
    COMPLETE_FIELD_NUMBER: _ClassVar[int]
    SESSION_TOKEN_FIELD_NUMBER: _ClassVar[int]
    SESSION_LIFETIME_MS_FIELD_NUMBER: _ClassVar[int]
    PRINCIPAL_FIELD_NUMBER: _ClassVar[int]
    error: Error
    auth_bytes: bytes
    exchange_id: str
    complete: bool
    session_token: str
    session_lifetime_ms: int
    principal: str
    def __init__(self, error: _Optional[_Union[Error, _Mapping]] = ..., auth_bytes: _Optional[bytes] = ..., exchange_id: _Optional[str] = ..., complete: _Optional[bool] = ..., session_token: _Optional[str] = ..., session_lifetime_ms: _Optional[int] = ..., principal: _Optional[str] = ...) -> None: ...

class ScramCredentialUpsertion(_message.Message):
    __slots__ = ("user", "mechanism", "iterations", "salt", "salted_password")
    USER_FIELD_NUMBER: _ClassVar[int]
    MECHANISM_FIELD_NUMBER: _ClassVar[int]
    ITERATIONS_FIELD_NUMBER: _ClassVar[int]
    SALT_FIELD_NUMBER: _ClassVar[int]
    SALTED_PASSWORD_FIELD_NUMBER: _ClassVar[int]
    user: str
    mechanism: str
    iterations: int
    salt: bytes
    salted_password: bytes
    def __init__(self, user: _Optional[str] = ..., mechanism: _Optional[str] = ..., iterations: _Optional[int] = ..., salt: _Optional[bytes] = ..., salted_password: _Optional[bytes] = ...) -> None: ...

class ScramCredentialDeletion(_message.Message):
    __slots__ = ("user", "mechanism")
    USER_FIELD_NUMBER: _ClassVar[int]
    MECHANISM_FIELD_NUMBER: _ClassVar[int]
    user: str
    mechanism: str
    def __init__(self, user: _Optional[str] = ..., mechanism: _Optional[str] = ...) -> None: ...

class AlterUserScramCredentialsRequest(_message.Message):
    __slots__ = ("upsertions", "deletions")
    UPSERTIONS_FIELD_NUMBER: _ClassVar[int]
    DELETIONS_FIELD_NUMBER: _ClassVar[int]
    upsertions: _containers.RepeatedCompositeFieldContainer[ScramCredentialUpsertion]
    deletions: _containers.RepeatedCompositeFieldContainer[ScramCredentialDeletion]
    def __init__(self, upsertions: _Optional[_Iterable[_Union[ScramCredentialUpsertion, _Mapping]]] = ..., deletions: _Optional[_Iterable[_Union[ScramCredentialDeletion, _Mapping]]] = ...) -> None: ...

class AlterUserScramCredentialsResult(_message.Message):
    __slots__ = ("user", "error")
    USER_FIELD_NUMBER: _ClassVar[int]
    ERROR_FIELD_NUMBER: _ClassVar[int]
    user: str
    error: Error
    def __init__(self, user: _Optional[str] = ..., error: _Optional[_Union[Error, _Mapping]] = ...) -> None: ...

class AlterUserScramCredentialsResponse(_message.Message):
    __slots__ = ("results",)
    RESULTS_FIELD_NUMBER: _ClassVar[int]
    results: _containers.RepeatedCompositeFieldContainer[AlterUserScramCredentialsResult]
    def __init__(self, results: _Optional[_Iterable[_Union[AlterUserScramCredentialsResult, _Mapping]]] = ...) -> None: ...

class DescribeUserScramCredentialsRequest(_message.Message):
    __slots__ = ("users",)
    USERS_FIELD_NUMBER: _ClassVar[int]
    users: _containers.RepeatedScalarFieldContainer[str]
    def __init__(self, users: _Optional[_Iterable[str]] = ...) -> None: ...

class ScramCredentialInfo(_message.Message):
    __slots__ = ("mechanism", "iterations")
    MECHANISM_FIELD_NUMBER: _ClassVar[int]
    ITERATIONS_FIELD_NUMBER: _ClassVar[int]
    mechanism: str
    iterations: int
    def __init__(self, mechanism: _Optional[str] = ..., iterations: _Optional[int] = ...) -> None: ...

class DescribeUserScramCredentialsResult(_message.Message):
    __slots__ = ("user", "error", "credentials")
    USER_FIELD_NUMBER: _ClassVar[int]
    ERROR_FIELD_NUMBER: _ClassVar[int]
    CREDENTIALS_FIELD_NUMBER: _ClassVar[int]
    user: str
    error: Error
    credentials: _containers.RepeatedCompositeFieldContainer[ScramCredentialInfo]
    def __init__(self, user: _Optional[str] = ..., error: _Optional[_Union[Error, _Mapping]] = ..., credentials: _Optional[_Iterable[_Union[ScramCredentialInfo, _Mapping]]] = ...) -> None: ...

class DescribeUserScramCredentialsResponse(_message.Message):
    __slots__ = ("error", "results")
    ERROR_FIELD_NUMBER: _ClassVar[int]
    RESULTS_FIELD_NUMBER: _ClassVar[int]
    error: Error
    results: _containers.RepeatedCompositeFieldContainer[DescribeUserScramCredentialsResult]
    def __init__(self, error: _Optional[_Union[Error, _Mapping]] = ..., results: _Optional[_Iterable[_Union[DescribeUserScramCredentialsResult, _Mapping]]] = ...) -> None: ...

class AclBinding(_message.Message):
    __slots__ = ("resource_type", "resource_name", "pattern_type", "principal", "host", "operation", "permission_type")
    RESOURCE_TYPE_FIELD_NUMBER: _ClassVar[int]
    RESOURCE_NAME_FIELD_NUMBER: _ClassVar[int]
    PATTERN_TYPE_FIELD_NUMBER: _ClassVar[int]
    PRINCIPAL_FIELD_NUMBER: _ClassVar[int]
    HOST_FIELD_NUMBER: _ClassVar[int]
    OPERATION_FIELD_NUMBER: _ClassVar[int]
    PERMISSION_TYPE_FIELD_NUMBER: _ClassVar[int]
    resource_type: str
    resource_name: str
    pattern_type: str
    principal: str
    host: str
    operation: str
    permission_type: str
    def __init__(self, resource_type: _Optional[str] = ..., resource_name: _Optional[str] = ..., pattern_type: _Optional[str] = ..., principal: _Optional[str] = ..., host: _Optional[str] = ..., operation: _Optional[str] = ..., permission_type: _Optional[str] = ...) -> None: ...

class CreateAclsRequest(_message.Message):
    __slots__ = ("creations",)
    CREATIONS_FIELD_NUMBER: _ClassVar[int]
    creations: _containers.RepeatedCompositeFieldContainer[AclBinding]
    def __init__(self, creations: _Optional[_Iterable[_Union[AclBinding, _Mapping]]] = ...) -> None: ...

class CreateAclsResponse(_message.Message):
    __slots__ = ("results",)
    RESULTS_FIELD_NUMBER: _ClassVar[int]
    results: _containers.RepeatedCompositeFieldContainer[Error]
    def __init__(self, results: _Optional[_Iterable[_Union[Error, _Mapping]]] = ...) -> None: ...

class DescribeAclsRequest(_message.Message):
    __slots__ = ("filter",)
    FILTER_FIELD_NUMBER: _ClassVar[int]
    filter: AclBinding
    def __init__(self, filter: _Optional[_Union[AclBinding, _Mapping]] = ...) -> None: ...

class DescribeAclsResponse(_message.Message):
    __slots__ = ("error", "acls")
    ERROR_FIELD_NUMBER: _ClassVar[int]
    ACLS_FIELD_NUMBER: _ClassVar[int]
    error: Error
    acls: _containers.RepeatedCompositeFieldContainer[AclBinding]
    def __init__(self, error: _Optional[_Union[Error, _Mapping]] = ..., acls: _Optional[_Iterable[_Union[AclBinding, _Mapping]]] = ...) -> None: ...

class DeleteAclsRequest(_message.Message):
    __slots__ = ("filters",)
    FILTERS_FIELD_NUMBER: _ClassVar[int]
    filters: _containers.RepeatedCompositeFieldContainer[AclBinding]
    def __init__(self, filters: _Optional[_Iterable[_Union[AclBinding, _Mapping]]] = ...) -> None: ...

class DeleteAclsFilterResult(_message.Message):
    __slots__ = ("error", "deleted")
    ERROR_FIELD_NUMBER: _ClassVar[int]
    DELETED_FIELD_NUMBER: _ClassVar[int]
    error: Error
    deleted: _containers.RepeatedCompositeFieldContainer[AclBinding]
    def __init__(self, error: _Optional[_Union[Error, _Mapping]] = ..., deleted: _Optional[_Iterable[_Union[AclBinding, _Mapping]]] = ...) -> None: ...

class DeleteAclsResponse(_message.Message):
    __slots__ = ("results",)
    RESULTS_FIELD_NUMBER: _ClassVar[int]
    results: _containers.RepeatedCompositeFieldContainer[DeleteAclsFilterResult]
    def __init__(self, results: _Optional[_Iterable[_Union[DeleteAclsFilterResult, _Mapping]]] = ...) -> None: ...

class FindCoordinatorRequest(_message.Message):
    __slots__ = ("key_type", "keys")
    KEY_TYPE_FIELD_NUMBER: _ClassVar[int]
    KEYS_FIELD_NUMBER: _ClassVar[int]
    key_type: CoordinatorType
    keys: _containers.RepeatedScalarFieldContainer[str]
    def __init__(self, key_type: _Optional[_Union[CoordinatorType, str]] = ..., keys: _Optional[_Iterable[str]] = ...) -> None: ...

class Coordinator(_message.Message):
    __slots__ = ("key", "error", "node_id", "host", "port", "local")
    KEY_FIELD_NUMBER: _ClassVar[int]
    ERROR_FIELD_NUMBER: _ClassVar[int]
    NODE_ID_FIELD_NUMBER: _ClassVar[int]
    HOST_FIELD_NUMBER: _ClassVar[int]
    PORT_FIELD_NUMBER: _ClassVar[int]
    LOCAL_FIELD_NUMBER: _ClassVar[int]
    key: str
    error: Error
    node_id: int
    host: str
    port: int
    local: bool
    def __init__(self, key: _Optional[str] = ..., error: _Optional[_Union[Error, _Mapping]] = ..., node_id: _Optional[int] = ..., host: _Optional[str] = ..., port: _Optional[int] = ..., local: _Optional[bool] = ...) -> None: ...

class FindCoordinatorResponse(_message.Message):
    __slots__ = ("coordinators",)
    COORDINATORS_FIELD_NUMBER: _ClassVar[int]
    coordinators: _containers.RepeatedCompositeFieldContainer[Coordinator]
    def __init__(self, coordinators: _Optional[_Iterable[_Union[Coordinator, _Mapping]]] = ...) -> None: ...

class TopicPartitionError(_message.Message):
    __slots__ = ("topic", "partition", "error")
    TOPIC_FIELD_NUMBER: _ClassVar[int]
    PARTITION_FIELD_NUMBER: _ClassVar[int]
    ERROR_FIELD_NUMBER: _ClassVar[int]
    topic: str
    partition: int
    error: Error
    def __init__(self, topic: _Optional[str] = ..., partition: _Optional[int] = ..., error: _Optional[_Union[Error, _Mapping]] = ...) -> None: ...

class TxnMarker(_message.Message):
    __slots__ = ("producer_id", "producer_epoch", "commit", "coordinator_epoch", "partitions")
    PRODUCER_ID_FIELD_NUMBER: _ClassVar[int]
    PRODUCER_EPOCH_FIELD_NUMBER: _ClassVar[int]
    COMMIT_FIELD_NUMBER: _ClassVar[int]
    COORDINATOR_EPOCH_FIELD_NUMBER: _ClassVar[int]
    PARTITIONS_FIELD_NUMBER: _ClassVar[int]
    producer_id: int
    producer_epoch: int
    commit: bool
    coordinator_epoch: int
    partitions: _containers.RepeatedCompositeFieldContainer[TopicPartitionRef]
    def __init__(self, producer_id: _Optional[int] = ..., producer_epoch: _Optional[int] = ..., commit: _Optional[bool] = ..., coordinator_epoch: _Optional[int] = ..., partitions: _Optional[_Iterable[_Union[TopicPartitionRef, _Mapping]]] = ...) -> None: ...

class WriteTxnMarkersRequest(_message.Message):
    __slots__ = ("markers",)
    MARKERS_FIELD_NUMBER: _ClassVar[int]
    markers: _containers.RepeatedCompositeFieldContainer[TxnMarker]
    def __init__(self, markers: _Optional[_Iterable[_Union[TxnMarker, _Mapping]]] = ...) -> None: ...

class TxnMarkerResult(_message.Message):
    __slots__ = ("producer_id", "partitions")
    PRODUCER_ID_FIELD_NUMBER: _ClassVar[int]
    PARTITIONS_FIELD_NUMBER: _ClassVar[int]
    producer_id: int
    partitions: _containers.RepeatedCompositeFieldContainer[TopicPartitionError]
    def __init__(self, producer_id: _Optional[int] = ..., partitions: _Optional[_Iterable[_Union[TopicPartitionError, _Mapping]]] = ...) -> None: ...

class WriteTxnMarkersResponse(_message.Message):
    __slots__ = ("markers",)
    MARKERS_FIELD_NUMBER: _ClassVar[int]
    markers: _containers.RepeatedCompositeFieldContainer[TxnMarkerResult]
    def __init__(self, markers: _Optional[_Iterable[_Union[TxnMarkerResult, _Mapping]]] = ...) -> None: ...

class ReassignablePartition(_message.Message):
    __slots__ = ("topic", "partition", "replicas")
    TOPIC_FIELD_NUMBER: _ClassVar[int]
    PARTITION_FIELD_NUMBER: _ClassVar[int]
    REPLICAS_FIELD_NUMBER: _ClassVar[int]
    topic: str
    partition: int
    replicas: _containers.RepeatedScalarFieldContainer[int]
    def __init__(self, topic: _Optional[str] = ..., partition: _Optional[int] = ..., replicas: _Optional[_Iterable[int]] = ...) -> None: ...

class AlterPartitionReassignmentsRequest(_message.Message):
    __slots__ = ("partitions", "throttle_bytes_per_sec")
    PARTITIONS_FIELD_NUMBER: _ClassVar[int]
    THROTTLE_BYTES_PER_SEC_FIELD_NUMBER: _ClassVar[int]
    partitions: _containers.RepeatedCompositeFieldContainer[ReassignablePartition]
    throttle_bytes_per_sec: int
    def __init__(self, partitions: _Optional[_Iterable[_Union[ReassignablePartition, _Mapping]]] = ..., throttle_bytes_per_sec: _Optional[int] = ...) -> None: ...

class AlterPartitionReassignmentsResponse(_message.Message):
    __slots__ = ("results",)
    RESULTS_FIELD_NUMBER: _ClassVar[int]
    results: _containers.RepeatedCompositeFieldContainer[TopicPartitionError]
    def __init__(self, results: _Optional[_Iterable[_Union[TopicPartitionError, _Mapping]]] = ...) -> None: ...

class ListPartitionReassignmentsRequest(_message.Message):
    __slots__ = ("topics",)
    TOPICS_FIELD_NUMBER: _ClassVar[int]
    topics: _containers.RepeatedScalarFieldContainer[str]
    def __init__(self, topics: _Optional[_Iterable[str]] = ...) -> None: ...

class OngoingReassignment(_message.Message):
    __slots__ = ("topic", "partition", "replicas", "adding_replicas", "removing_replicas", "target_replicas", "bytes_total", "bytes_copied", "leader", "progress_known")
    TOPIC_FIELD_NUMBER: _ClassVar[int]
    PARTITION_FIELD_NUMBER: _ClassVar[int]
    REPLICAS_FIELD_NUMBER: _ClassVar[int]
    ADDING_REPLICAS_FIELD_NUMBER: _ClassVar[int]
    REMOVING_REPLICAS_FIELD_NUMBER: _ClassVar[int]
    TARGET_REPLICAS_FIELD_NUMBER: _ClassVar[int]
    BYTES_TOTAL_FIELD_NUMBER: _ClassVar[int]
    BYTES_COPIED_FIELD_NUMBER: _ClassVar[int]
    LEADER_FIELD_NUMBER: _ClassVar[int]
    PROGRESS_KNOWN_FIELD_NUMBER: _ClassVar[int]
    topic: str
    partition: int
    replicas: _containers.RepeatedScalarFieldContainer[int]
    adding_replicas: _containers.RepeatedScalarFieldContainer[int]
    removing_replicas: _containers.RepeatedScalarFieldContainer[int]
    target_replicas: _containers.RepeatedScalarFieldContainer[int]
    bytes_total: int
    bytes_copied: int
    leader: int
    progress_known: bool
    def __init__(self, topic: _Optional[str] = ..., partition: _Optional[int] = ..., replicas: _Optional[_Iterable[int]] = ..., adding_replicas: _Optional[_Iterable[int]] = ..., removing_replicas: _Optional[_Iterable[int]] = ..., target_replicas: _Optional[_Iterable[int]] = ..., bytes_total: _Optional[int] = ..., bytes_copied: _Optional[int] = ..., leader: _Optional[int] = ..., progress_known: _Optional[bool] = ...) -> None: ...

class ListPartitionReassignmentsResponse(_message.Message):
    __slots__ = ("error", "reassignments", "throttle_bytes_per_sec")
    ERROR_FIELD_NUMBER: _ClassVar[int]
    REASSIGNMENTS_FIELD_NUMBER: _ClassVar[int]
    THROTTLE_BYTES_PER_SEC_FIELD_NUMBER: _ClassVar[int]
    error: Error
    reassignments: _containers.RepeatedCompositeFieldContainer[OngoingReassignment]
    throttle_bytes_per_sec: int
    def __init__(self, error: _Optional[_Union[Error, _Mapping]] = ..., reassignments: _Optional[_Iterable[_Union[OngoingReassignment, _Mapping]]] = ..., throttle_bytes_per_sec: _Optional[int] = ...) -> None: ...

class ElectLeadersRequest(_message.Message):
    __slots__ = ("election_type", "partitions")
    ELECTION_TYPE_FIELD_NUMBER: _ClassVar[int]
    PARTITIONS_FIELD_NUMBER: _ClassVar[int]
    election_type: ElectionType
    partitions: _containers.RepeatedCompositeFieldContainer[TopicPartitionRef]
    def __init__(self, election_type: _Optional[_Union[ElectionType, str]] = ..., partitions: _Optional[_Iterable[_Union[TopicPartitionRef, _Mapping]]] = ...) -> None: ...

class ElectLeadersResponse(_message.Message):
    __slots__ = ("results",)
    RESULTS_FIELD_NUMBER: _ClassVar[int]
    results: _containers.RepeatedCompositeFieldContainer[TopicPartitionError]
    def __init__(self, results: _Optional[_Iterable[_Union[TopicPartitionError, _Mapping]]] = ...) -> None: ...
