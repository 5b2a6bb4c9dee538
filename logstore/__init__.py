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

Every name resolves lazily, on first use (PEP 562): ``import logstore.storage.log``
loads neither gRPC nor the clients, and ``from logstore import Producer``
loads only what the producer needs.
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

from logstore._version import __version__

if TYPE_CHECKING:  # what type checkers and IDEs see; at run time see __getattr__
    from logstore.client.admin import Admin
    from logstore.client.consumer import Consumer
    from logstore.client.fetcher import fetch_range
    from logstore.client.producer import Producer
    from logstore.client.rpc import BrokerClient
    from logstore.errors import (
        AuthorizationError,
        BrokerUnavailableError,
        ClusterAuthorizationError,
        CompactionConflictError,
        ConcurrentTransactionsError,
        CoordinatorLoadInProgressError,
        CoordinatorNotAvailableError,
        CorruptRecordError,
        ElectionNotNeededError,
        FencedInstanceIdError,
        FencedLeaderEpochError,
        FencedMemberEpochError,
        GroupAuthorizationError,
        GroupIdNotFoundError,
        IllegalSaslStateError,
        InternalTopicError,
        InvalidBootstrapError,
        InvalidConfigError,
        InvalidGroupIdError,
        InvalidPartitionsError,
        InvalidReplicaAssignmentError,
        InvalidReplicationFactorError,
        InvalidRequestError,
        InvalidTimestampError,
        InvalidTopicError,
        InvalidTxnStateError,
        LeaderNotAvailableError,
        LogOfflineError,
        LogstoreError,
        MetadataStoreError,
        NonEmptyGroupError,
        NoReassignmentInProgressError,
        NotCoordinatorError,
        NotEnoughReplicasAfterAppendError,
        NotEnoughReplicasError,
        NotLeaderError,
        OffsetNotAvailableError,
        OffsetOutOfRangeError,
        OutOfOrderSequenceError,
        PreferredLeaderNotAvailableError,
        ProducerFencedError,
        ProducerIdFloorUnknownError,
        RecordTooLargeError,
        RequestTimedOutError,
        ResourceNotFoundError,
        SaslAuthenticationError,
        SchemaMismatchError,
        SecurityDisabledError,
        StaleMemberEpochError,
        StorageError,
        TopicAlreadyExistsError,
        TopicAuthorizationError,
        TransactionalIdAuthorizationError,
        TransactionCoordinatorFencedError,
        UnknownLeaderEpochError,
        UnknownMemberIdError,
        UnknownProducerOutcomeError,
        UnknownServerError,
        UnknownTopicOrPartitionError,
        UnsupportedKeystoreTypeError,
        UnsupportedSaslMechanismError,
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

# name -> the module that defines it
_HOMES: dict[str, str] = {
    "Producer": "logstore.client.producer",
    "Consumer": "logstore.client.consumer",
    "fetch_range": "logstore.client.fetcher",
    "Admin": "logstore.client.admin",
    "BrokerClient": "logstore.client.rpc",
    "BrokerUnavailableError": "logstore.errors",
    "CompactionConflictError": "logstore.errors",
    "NotCoordinatorError": "logstore.errors",
    "OffsetNotAvailableError": "logstore.errors",
    "CoordinatorNotAvailableError": "logstore.errors",
    "CoordinatorLoadInProgressError": "logstore.errors",
    "InvalidReplicaAssignmentError": "logstore.errors",
    "NoReassignmentInProgressError": "logstore.errors",
    "ElectionNotNeededError": "logstore.errors",
    "PreferredLeaderNotAvailableError": "logstore.errors",
    "ConcurrentTransactionsError": "logstore.errors",
    "CorruptRecordError": "logstore.errors",
    "FencedInstanceIdError": "logstore.errors",
    "FencedLeaderEpochError": "logstore.errors",
    "UnknownLeaderEpochError": "logstore.errors",
    "LeaderNotAvailableError": "logstore.errors",
    "NotEnoughReplicasError": "logstore.errors",
    "NotEnoughReplicasAfterAppendError": "logstore.errors",
    "InvalidReplicationFactorError": "logstore.errors",
    "MetadataStoreError": "logstore.errors",
    "FencedMemberEpochError": "logstore.errors",
    "GroupIdNotFoundError": "logstore.errors",
    "InternalTopicError": "logstore.errors",
    "InvalidBootstrapError": "logstore.errors",
    "UnsupportedKeystoreTypeError": "logstore.errors",
    "InvalidConfigError": "logstore.errors",
    "InvalidGroupIdError": "logstore.errors",
    "InvalidPartitionsError": "logstore.errors",
    "InvalidRequestError": "logstore.errors",
    "InvalidTimestampError": "logstore.errors",
    "InvalidTopicError": "logstore.errors",
    "InvalidTxnStateError": "logstore.errors",
    "LogOfflineError": "logstore.errors",
    "LogstoreError": "logstore.errors",
    "NonEmptyGroupError": "logstore.errors",
    "NotLeaderError": "logstore.errors",
    "OffsetOutOfRangeError": "logstore.errors",
    "OutOfOrderSequenceError": "logstore.errors",
    "ProducerFencedError": "logstore.errors",
    "TransactionCoordinatorFencedError": "logstore.errors",
    "ProducerIdFloorUnknownError": "logstore.errors",
    "RecordTooLargeError": "logstore.errors",
    "RequestTimedOutError": "logstore.errors",
    "SchemaMismatchError": "logstore.errors",
    "StaleMemberEpochError": "logstore.errors",
    "StorageError": "logstore.errors",
    "TopicAlreadyExistsError": "logstore.errors",
    "UnknownMemberIdError": "logstore.errors",
    "UnknownServerError": "logstore.errors",
    "SaslAuthenticationError": "logstore.errors",
    "UnsupportedSaslMechanismError": "logstore.errors",
    "IllegalSaslStateError": "logstore.errors",
    "AuthorizationError": "logstore.errors",
    "TopicAuthorizationError": "logstore.errors",
    "GroupAuthorizationError": "logstore.errors",
    "TransactionalIdAuthorizationError": "logstore.errors",
    "ClusterAuthorizationError": "logstore.errors",
    "SecurityDisabledError": "logstore.errors",
    "ResourceNotFoundError": "logstore.errors",
    "UnknownProducerOutcomeError": "logstore.errors",
    "UnknownTopicOrPartitionError": "logstore.errors",
    "BatchMetadata": "logstore.types",
    "ConsumerRecord": "logstore.types",
    "GroupDescription": "logstore.types",
    "GroupListing": "logstore.types",
    "ListedOffset": "logstore.types",
    "MemberDescription": "logstore.types",
    "NewTopic": "logstore.types",
    "OffsetAndMetadata": "logstore.types",
    "PartitionInfo": "logstore.types",
    "PartitionLag": "logstore.types",
    "RecordMetadata": "logstore.types",
    "SendBatchResult": "logstore.types",
    "TopicDescription": "logstore.types",
    "TopicPartition": "logstore.types",
}


def __getattr__(name: str) -> Any:
    home = _HOMES.get(name)
    if home is None:
        raise AttributeError(f"module 'logstore' has no attribute {name!r}")
    value = getattr(importlib.import_module(home), name)
    globals()[name] = value  # resolved once
    return value


def __dir__() -> list[str]:
    return sorted(set(globals()) | set(__all__))


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
    "InternalTopicError",
    "InvalidBootstrapError",
    "UnsupportedKeystoreTypeError",
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
    "UnknownLeaderEpochError",
    "LeaderNotAvailableError",
    "NotEnoughReplicasError",
    "NotEnoughReplicasAfterAppendError",
    "InvalidReplicationFactorError",
    "MetadataStoreError",
    "RequestTimedOutError",
    "BrokerUnavailableError",
    "OutOfOrderSequenceError",
    "ProducerFencedError",
    "TransactionCoordinatorFencedError",
    "ProducerIdFloorUnknownError",
    "InvalidTxnStateError",
    "ConcurrentTransactionsError",
    "CompactionConflictError",
    "NotCoordinatorError",
    "OffsetNotAvailableError",
    "CoordinatorNotAvailableError",
    "CoordinatorLoadInProgressError",
    "InvalidReplicaAssignmentError",
    "NoReassignmentInProgressError",
    "ElectionNotNeededError",
    "PreferredLeaderNotAvailableError",
    "InvalidGroupIdError",
    "GroupIdNotFoundError",
    "NonEmptyGroupError",
    "UnknownMemberIdError",
    "FencedMemberEpochError",
    "StaleMemberEpochError",
    "FencedInstanceIdError",
    "UnknownServerError",
    "UnknownProducerOutcomeError",
    "SaslAuthenticationError",
    "UnsupportedSaslMechanismError",
    "IllegalSaslStateError",
    "AuthorizationError",
    "TopicAuthorizationError",
    "GroupAuthorizationError",
    "TransactionalIdAuthorizationError",
    "ClusterAuthorizationError",
    "SecurityDisabledError",
    "ResourceNotFoundError",
    "__version__",
]
