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
"""

from logstore.admin import Admin
from logstore.client import BrokerClient
from logstore.consumer import Consumer, fetch_range
from logstore.errors import (
    BrokerUnavailableError,
    CompactionConflictError,
    ConcurrentTransactionsError,
    CorruptRecordError,
    FencedLeaderEpochError,
    InvalidConfigError,
    InvalidPartitionsError,
    InvalidRequestError,
    InvalidTimestampError,
    InvalidTopicError,
    InvalidTxnStateError,
    LogOfflineError,
    LogstoreError,
    NotLeaderError,
    OffsetOutOfRangeError,
    OutOfOrderSequenceError,
    ProducerFencedError,
    RecordTooLargeError,
    RequestTimedOutError,
    SchemaMismatchError,
    StorageError,
    TopicAlreadyExistsError,
    UnknownServerError,
    UnknownTopicOrPartitionError,
)
from logstore.producer import Producer
from logstore.types import (
    BatchMetadata,
    ConsumerRecord,
    ListedOffset,
    NewTopic,
    PartitionInfo,
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
    "UnknownServerError",
    "__version__",
]
