"""logstore: a partitioned, append-only log of Arrow IPC segments, native to Apache Spark.

The public surface is what this module exports (``__all__``; a test pins it):
the clients :class:`Producer`, :class:`Consumer` and :class:`Admin`, their
value types, and the error hierarchy of :mod:`logstore.errors`::

    from logstore import Admin, Consumer, NewTopic, Producer, TopicPartition

    with Admin() as admin:
        admin.create_topics([NewTopic("events", num_partitions=3)])
    with Producer() as producer:
        producer.send("events", b"hello", key="user-1").result()
    with Consumer(auto_offset_reset="earliest") as consumer:
        consumer.assign([TopicPartition("events", p) for p in range(3)])
        records = consumer.poll(timeout_ms=1000)
    with Consumer(group_id="billing", subscribe=["events"]) as member:  # a consumer group
        records = member.poll(timeout_ms=1000)                           # committed automatically
"""

from logstore.client.admin import Admin
from logstore.client.consumer import Consumer
from logstore.client.fetcher import fetch_range
from logstore.client.producer import Producer
from logstore.client.rpc import BrokerClient
from logstore.errors import (
    BrokerUnavailableError,
    CompactionConflictError,
    ConcurrentTransactionsError,
    CorruptRecordError,
    FencedInstanceIdError,
    FencedLeaderEpochError,
    FencedMemberEpochError,
    GroupIdNotFoundError,
    InvalidConfigError,
    InvalidGroupIdError,
    InvalidPartitionsError,
    InvalidRequestError,
    InvalidTimestampError,
    InvalidTopicError,
    InvalidTxnStateError,
    LogOfflineError,
    LogstoreError,
    NonEmptyGroupError,
    NotLeaderError,
    OffsetOutOfRangeError,
    OutOfOrderSequenceError,
    ProducerFencedError,
    RecordTooLargeError,
    RequestTimedOutError,
    SchemaMismatchError,
    StaleMemberEpochError,
    StorageError,
    TopicAlreadyExistsError,
    UnknownMemberIdError,
    UnknownServerError,
    UnknownTopicOrPartitionError,
)
from logstore.types import (
    BatchMetadata,
    ConsumerRecord,
    GroupDescription,
    GroupListing,
    ListedOffset,
    MemberDescription,
    NewTopic,
    OffsetAndMetadata,
    PartitionInfo,
    PartitionLag,
    RecordMetadata,
    SendBatchResult,
    TopicDescription,
    TopicPartition,
)

__version__ = "0.1.0"

__all__ = [
    # clients
    "Producer",
    "Consumer",
    "Admin",
    "BrokerClient",
    "fetch_range",
    # value types
    "TopicPartition",
    "NewTopic",
    "RecordMetadata",
    "BatchMetadata",
    "SendBatchResult",
    "ConsumerRecord",
    "TopicDescription",
    "PartitionInfo",
    "ListedOffset",
    "OffsetAndMetadata",
    "GroupListing",
    "GroupDescription",
    "MemberDescription",
    "PartitionLag",
    # errors
    "LogstoreError",
    "InvalidRequestError",
    "InvalidTopicError",
    "InvalidConfigError",
    "InvalidPartitionsError",
    "InvalidTimestampError",
    "UnknownTopicOrPartitionError",
    "TopicAlreadyExistsError",
    "OffsetOutOfRangeError",
    "CorruptRecordError",
    "RecordTooLargeError",
    "SchemaMismatchError",
    "StorageError",
    "LogOfflineError",
    "NotLeaderError",
    "FencedLeaderEpochError",
    "RequestTimedOutError",
    "BrokerUnavailableError",
    "OutOfOrderSequenceError",
    "ProducerFencedError",
    "InvalidTxnStateError",
    "ConcurrentTransactionsError",
    "CompactionConflictError",
    "InvalidGroupIdError",
    "GroupIdNotFoundError",
    "NonEmptyGroupError",
    "UnknownMemberIdError",
    "FencedMemberEpochError",
    "StaleMemberEpochError",
    "FencedInstanceIdError",
    "UnknownServerError",
    "__version__",
]
