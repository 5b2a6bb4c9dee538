"""The error hierarchy of logstore.errors: stable unique codes, code round-trips, pickling."""

from __future__ import annotations

import pickle

import pytest

from logstore import errors
from logstore.errors import (
    CorruptRecordError,
    InvalidRequestError,
    LogOfflineError,
    LogstoreError,
    StorageError,
    UnknownServerError,
    error_for_code,
)


def all_error_classes() -> list[type[LogstoreError]]:
    out: list[type[LogstoreError]] = []
    todo = [LogstoreError]
    while todo:
        cls = todo.pop()
        out.append(cls)
        todo.extend(cls.__subclasses__())
    # Only the classes this module defines: other modules (and tests) may subclass.
    return [c for c in out if c.__module__ == "logstore.errors"]


ERROR_CLASSES = all_error_classes()
# Codes are part of the wire protocol: pin them so a rename is a visible, deliberate change.
EXPECTED_CODES = {
    "LogstoreError": "UNKNOWN_SERVER_ERROR",
    "InvalidRequestError": "INVALID_REQUEST",
    "InvalidTopicError": "INVALID_TOPIC",
    "InvalidConfigError": "INVALID_CONFIG",
    "InvalidBootstrapError": "INVALID_BOOTSTRAP",
    "UnsupportedKeystoreTypeError": "UNSUPPORTED_KEYSTORE_TYPE",
    "InternalTopicError": "INTERNAL_TOPIC",
    "InvalidPartitionsError": "INVALID_PARTITIONS",
    "InvalidTimestampError": "INVALID_TIMESTAMP",
    "UnknownTopicOrPartitionError": "UNKNOWN_TOPIC_OR_PARTITION",
    "TopicAlreadyExistsError": "TOPIC_ALREADY_EXISTS",
    "OffsetOutOfRangeError": "OFFSET_OUT_OF_RANGE",
    "CorruptRecordError": "CORRUPT_MESSAGE",
    "RecordTooLargeError": "MESSAGE_TOO_LARGE",
    "SchemaMismatchError": "SCHEMA_MISMATCH",
    "StorageError": "KAFKA_STORAGE_ERROR",
    "LogOfflineError": "LOG_OFFLINE",
    "NotLeaderError": "NOT_LEADER_OR_FOLLOWER",
    "FencedLeaderEpochError": "FENCED_LEADER_EPOCH",
    "UnknownLeaderEpochError": "UNKNOWN_LEADER_EPOCH",
    "LeaderNotAvailableError": "LEADER_NOT_AVAILABLE",
    "NotEnoughReplicasError": "NOT_ENOUGH_REPLICAS",
    "NotEnoughReplicasAfterAppendError": "NOT_ENOUGH_REPLICAS_AFTER_APPEND",
    "InvalidReplicationFactorError": "INVALID_REPLICATION_FACTOR",
    "MetadataStoreError": "METADATA_STORE_UNAVAILABLE",
    "RequestTimedOutError": "REQUEST_TIMED_OUT",
    "BrokerUnavailableError": "BROKER_NOT_AVAILABLE",
    "UnknownServerError": "UNKNOWN_SERVER_ERROR",
    "UnknownProducerOutcomeError": "UNKNOWN_PRODUCER_OUTCOME",
    "OutOfOrderSequenceError": "OUT_OF_ORDER_SEQUENCE_NUMBER",
    "ProducerFencedError": "PRODUCER_FENCED",
    "TransactionCoordinatorFencedError": "TRANSACTION_COORDINATOR_FENCED",
    "InvalidTxnStateError": "INVALID_TXN_STATE",
    "ConcurrentTransactionsError": "CONCURRENT_TRANSACTIONS",
    "CompactionConflictError": "COMPACTION_CONFLICT",
    "NotCoordinatorError": "NOT_COORDINATOR",
    "OffsetNotAvailableError": "OFFSET_NOT_AVAILABLE",
    "CoordinatorNotAvailableError": "COORDINATOR_NOT_AVAILABLE",
    "CoordinatorLoadInProgressError": "COORDINATOR_LOAD_IN_PROGRESS",
    "InvalidReplicaAssignmentError": "INVALID_REPLICA_ASSIGNMENT",
    "NoReassignmentInProgressError": "NO_REASSIGNMENT_IN_PROGRESS",
    "ElectionNotNeededError": "ELECTION_NOT_NEEDED",
    "PreferredLeaderNotAvailableError": "PREFERRED_LEADER_NOT_AVAILABLE",
    "InvalidGroupIdError": "INVALID_GROUP_ID",
    "GroupIdNotFoundError": "GROUP_ID_NOT_FOUND",
    "NonEmptyGroupError": "NON_EMPTY_GROUP",
    "UnknownMemberIdError": "UNKNOWN_MEMBER_ID",
    "FencedMemberEpochError": "FENCED_MEMBER_EPOCH",
    "StaleMemberEpochError": "STALE_MEMBER_EPOCH",
    "FencedInstanceIdError": "FENCED_INSTANCE_ID",
    "SaslAuthenticationError": "SASL_AUTHENTICATION_FAILED",
    "UnsupportedSaslMechanismError": "UNSUPPORTED_SASL_MECHANISM",
    "IllegalSaslStateError": "ILLEGAL_SASL_STATE",
    "AuthorizationError": "AUTHORIZATION_FAILED",
    "TopicAuthorizationError": "TOPIC_AUTHORIZATION_FAILED",
    "GroupAuthorizationError": "GROUP_AUTHORIZATION_FAILED",
    "TransactionalIdAuthorizationError": "TRANSACTIONAL_ID_AUTHORIZATION_FAILED",
    "ClusterAuthorizationError": "CLUSTER_AUTHORIZATION_FAILED",
    "SecurityDisabledError": "SECURITY_DISABLED",
    "ProducerIdFloorUnknownError": "PRODUCER_ID_FLOOR_UNKNOWN",
    "ResourceNotFoundError": "RESOURCE_NOT_FOUND",
}


def test_every_error_class_is_exported_and_has_a_pinned_code() -> None:
    assert {c.__name__ for c in ERROR_CLASSES} == set(EXPECTED_CODES)
    for cls in ERROR_CLASSES:
        assert cls.code == EXPECTED_CODES[cls.__name__], cls
        assert cls.__name__ in errors.__all__


def test_codes_are_unique_apart_from_the_base_class() -> None:
    # The abstract base reports itself as UNKNOWN_SERVER_ERROR; every concrete
    # class must own its code so error_for_code can find it.
    concrete = [c for c in ERROR_CLASSES if c is not LogstoreError]
    codes = [c.code for c in concrete]
    assert len(codes) == len(set(codes)), sorted(codes)
    for code in codes:
        assert code.isupper() and " " not in code


@pytest.mark.parametrize("cls", [c for c in ERROR_CLASSES if c is not LogstoreError], ids=lambda c: c.__name__)
def test_error_for_code_round_trips(cls: type[LogstoreError]) -> None:
    original = cls("something went wrong: details 42")
    rebuilt = error_for_code(original.code, original.message)
    assert type(rebuilt) is cls
    assert rebuilt.message == original.message
    assert rebuilt.retriable == original.retriable
    assert str(rebuilt) == f"[{cls.code}] something went wrong: details 42"


@pytest.mark.parametrize("cls", ERROR_CLASSES, ids=lambda c: c.__name__)
def test_errors_pickle(cls: type[LogstoreError]) -> None:
    original = cls("cannot do that")
    clone = pickle.loads(pickle.dumps(original))
    assert type(clone) is cls
    assert clone.message == original.message
    assert str(clone) == str(original)


def test_unknown_code_becomes_unknown_server_error_and_keeps_the_code() -> None:
    err = error_for_code("SOME_FUTURE_CODE", "newer broker")
    assert type(err) is UnknownServerError
    assert "newer broker" in err.message and "SOME_FUTURE_CODE" in err.message


def test_retriable_flags_and_hierarchy() -> None:
    retriable = {c.__name__ for c in ERROR_CLASSES if c.retriable}
    assert retriable == {
        "UnknownTopicOrPartitionError", "StorageError", "NotLeaderError",
        "FencedLeaderEpochError", "RequestTimedOutError", "BrokerUnavailableError",
        "ConcurrentTransactionsError", "CompactionConflictError", "UnknownLeaderEpochError",
        "LeaderNotAvailableError", "NotEnoughReplicasError", "NotEnoughReplicasAfterAppendError",
        "MetadataStoreError", "NotCoordinatorError", "CoordinatorNotAvailableError",
        "CoordinatorLoadInProgressError", "PreferredLeaderNotAvailableError", "OffsetNotAvailableError",
    }
    assert issubclass(errors.InvalidReplicationFactorError, InvalidRequestError)
    assert issubclass(LogOfflineError, StorageError)
    assert issubclass(errors.InvalidTopicError, InvalidRequestError)
    assert issubclass(errors.InvalidGroupIdError, InvalidRequestError)
    assert issubclass(errors.InvalidReplicaAssignmentError, InvalidRequestError)
    assert not issubclass(CorruptRecordError, StorageError)


def test_subclass_defined_later_is_found_by_code() -> None:
    class LaterError(LogstoreError):
        code = "TEST_ONLY_LATER_ERROR"

    assert type(error_for_code("TEST_ONLY_LATER_ERROR", "x")) is LaterError


def test_subclasses_sharing_a_code_do_not_shadow_the_class_that_owns_it() -> None:
    # record.IncompleteBatchError refines CORRUPT_MESSAGE; the wire must still
    # rebuild the general class, and the refinement must pickle with its field.
    from logstore.record_reader import IncompleteBatchError

    assert IncompleteBatchError.code == CorruptRecordError.code
    assert type(error_for_code("CORRUPT_MESSAGE", "bad")) is CorruptRecordError
    clone = pickle.loads(pickle.dumps(IncompleteBatchError("torn", needed=17)))
    assert type(clone) is IncompleteBatchError
    assert (clone.message, clone.needed) == ("torn", 17)
