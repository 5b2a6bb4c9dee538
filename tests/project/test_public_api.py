"""Pins the public surface of ``logstore``: adding or removing a name is a deliberate act."""

from __future__ import annotations

import dataclasses
import inspect
import pickle

import pyarrow as pa

import logstore
from logstore import errors

EXPECTED = {
    # clients
    "Producer", "Consumer", "Admin", "BrokerClient", "fetch_range",
    # value types
    "TopicPartition", "NewTopic", "RecordMetadata", "BatchMetadata", "SendBatchResult",
    "ConsumerRecord", "TopicDescription", "PartitionInfo", "ListedOffset",
    "OffsetAndMetadata", "GroupListing", "GroupDescription", "MemberDescription", "PartitionLag",
    # errors
    "LogstoreError", "InvalidRequestError", "InvalidTopicError", "InvalidConfigError",
    "InvalidBootstrapError", "UnsupportedKeystoreTypeError", "InternalTopicError",
    "InvalidPartitionsError", "InvalidTimestampError", "UnknownTopicOrPartitionError",
    "TopicAlreadyExistsError", "OffsetOutOfRangeError", "CorruptRecordError",
    "RecordTooLargeError", "SchemaMismatchError", "StorageError", "LogOfflineError",
    "NotLeaderError", "FencedLeaderEpochError", "RequestTimedOutError",
    "UnknownLeaderEpochError", "LeaderNotAvailableError", "NotEnoughReplicasError",
    "NotEnoughReplicasAfterAppendError", "InvalidReplicationFactorError", "MetadataStoreError",
    "BrokerUnavailableError", "UnknownServerError", "UnknownProducerOutcomeError",
    "OutOfOrderSequenceError", "ProducerFencedError", "TransactionCoordinatorFencedError", "ProducerIdFloorUnknownError", "InvalidTxnStateError",
    "ConcurrentTransactionsError", "CompactionConflictError",
    "NotCoordinatorError", "CoordinatorNotAvailableError", "CoordinatorLoadInProgressError",
    "InvalidReplicaAssignmentError", "NoReassignmentInProgressError", "ElectionNotNeededError",
    "PreferredLeaderNotAvailableError", "OffsetNotAvailableError",
    "InvalidGroupIdError", "GroupIdNotFoundError", "NonEmptyGroupError", "UnknownMemberIdError",
    "FencedMemberEpochError", "StaleMemberEpochError", "FencedInstanceIdError",
    "SaslAuthenticationError", "UnsupportedSaslMechanismError", "IllegalSaslStateError",
    "AuthorizationError", "TopicAuthorizationError", "GroupAuthorizationError",
    "TransactionalIdAuthorizationError", "ClusterAuthorizationError", "SecurityDisabledError",
    "ResourceNotFoundError",
    "__version__",
}

VALUE_TYPES = ("TopicPartition", "NewTopic", "RecordMetadata", "BatchMetadata", "SendBatchResult",
               "ConsumerRecord", "TopicDescription", "PartitionInfo", "ListedOffset",
               "OffsetAndMetadata", "GroupListing", "GroupDescription", "MemberDescription", "PartitionLag")


def test_all_is_pinned() -> None:
    assert set(logstore.__all__) == EXPECTED
    assert len(logstore.__all__) == len(set(logstore.__all__))


def test_every_exported_name_exists() -> None:
    for name in logstore.__all__:
        assert hasattr(logstore, name), name


def test_every_error_class_of_the_hierarchy_is_exported() -> None:
    hierarchy = {n for n in errors.__all__ if n not in ("error_for_code", "WIRE_CODE_KEY")}
    assert hierarchy <= set(logstore.__all__)
    for name in hierarchy:
        assert getattr(logstore, name) is getattr(errors, name)


def test_value_types_are_frozen_slotted_dataclasses() -> None:
    for name in VALUE_TYPES:
        cls = getattr(logstore, name)
        assert dataclasses.is_dataclass(cls), name
        assert cls.__dataclass_params__.frozen, name
        assert "__slots__" in cls.__dict__, name


def test_value_types_pickle() -> None:
    tp = logstore.TopicPartition("t", 3)
    assert pickle.loads(pickle.dumps(tp)) == tp
    assert str(tp) == "t-3"
    assert sorted([logstore.TopicPartition("b", 0), tp]) == [logstore.TopicPartition("b", 0), tp]
    new = logstore.NewTopic("x", 2, value_schema=pa.schema([("a", pa.int64())]))
    assert pickle.loads(pickle.dumps(new)) == new


def test_client_options_are_keyword_only_past_bootstrap() -> None:
    for cls in (logstore.Producer, logstore.Consumer, logstore.Admin):
        params = list(inspect.signature(cls).parameters.values())
        assert params[0].name == "bootstrap"
        assert all(p.kind is inspect.Parameter.KEYWORD_ONLY for p in params[1:]), cls
