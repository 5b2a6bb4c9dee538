"""The one error hierarchy of logstore.

Every error a user, a client or a disk can cause is a :class:`LogstoreError`
with a stable ``code`` (a Kafka-style upper-case name that never changes once
released), a human sentence, and a ``retriable`` flag that tells a client
whether the same request may succeed if simply sent again::

    LogstoreError                              (code, message, retriable)
    ├── InvalidRequestError          INVALID_REQUEST
    │   ├── InvalidTopicError         INVALID_TOPIC
    │   ├── InvalidConfigError        INVALID_CONFIG
    │   │   ├── InvalidBootstrapError INVALID_BOOTSTRAP   (client only; also a ValueError)
    │   │   └── UnsupportedKeystoreTypeError UNSUPPORTED_KEYSTORE_TYPE   (client only)
    │   ├── InvalidPartitionsError    INVALID_PARTITIONS
    │   ├── InvalidTimestampError     INVALID_TIMESTAMP
    │   └── InternalTopicError        INTERNAL_TOPIC
    ├── UnknownTopicOrPartitionError  UNKNOWN_TOPIC_OR_PARTITION   retriable
    ├── TopicAlreadyExistsError       TOPIC_ALREADY_EXISTS
    ├── OffsetOutOfRangeError         OFFSET_OUT_OF_RANGE
    ├── OffsetNotAvailableError       OFFSET_NOT_AVAILABLE          retriable
    ├── CorruptRecordError            CORRUPT_MESSAGE
    ├── RecordTooLargeError           MESSAGE_TOO_LARGE
    ├── SchemaMismatchError           SCHEMA_MISMATCH
    ├── StorageError                  KAFKA_STORAGE_ERROR           retriable
    │   └── LogOfflineError           LOG_OFFLINE                   (definite: nothing written)
    ├── NotLeaderError                NOT_LEADER_OR_FOLLOWER        retriable
    ├── FencedLeaderEpochError        FENCED_LEADER_EPOCH           retriable
    ├── UnknownLeaderEpochError       UNKNOWN_LEADER_EPOCH          retriable
    ├── LeaderNotAvailableError       LEADER_NOT_AVAILABLE          retriable
    ├── NotEnoughReplicasError        NOT_ENOUGH_REPLICAS           retriable
    ├── NotEnoughReplicasAfterAppendError  NOT_ENOUGH_REPLICAS_AFTER_APPEND  retriable
    ├── InvalidReplicationFactorError INVALID_REPLICATION_FACTOR  (an InvalidRequestError)
    ├── MetadataStoreError            METADATA_STORE_UNAVAILABLE    retriable
    ├── RequestTimedOutError          REQUEST_TIMED_OUT             retriable
    │   └── UnknownProducerOutcomeError  UNKNOWN_PRODUCER_OUTCOME  (client only)
    ├── BrokerUnavailableError        BROKER_NOT_AVAILABLE          retriable
    ├── OutOfOrderSequenceError       OUT_OF_ORDER_SEQUENCE_NUMBER
    ├── ProducerFencedError           PRODUCER_FENCED
    ├── TransactionCoordinatorFencedError  TRANSACTION_COORDINATOR_FENCED
    ├── ProducerIdFloorUnknownError   PRODUCER_ID_FLOOR_UNKNOWN     (start-up only)
    ├── InvalidTxnStateError          INVALID_TXN_STATE
    ├── ConcurrentTransactionsError   CONCURRENT_TRANSACTIONS       retriable
    ├── NotCoordinatorError           NOT_COORDINATOR   retriable
    ├── CoordinatorNotAvailableError  COORDINATOR_NOT_AVAILABLE   retriable
    ├── CoordinatorLoadInProgressError COORDINATOR_LOAD_IN_PROGRESS   retriable
    ├── InvalidReplicaAssignmentError INVALID_REPLICA_ASSIGNMENT  (an InvalidRequestError)
    ├── NoReassignmentInProgressError NO_REASSIGNMENT_IN_PROGRESS
    ├── ElectionNotNeededError        ELECTION_NOT_NEEDED
    ├── PreferredLeaderNotAvailableError PREFERRED_LEADER_NOT_AVAILABLE   retriable
    ├── CompactionConflictError       COMPACTION_CONFLICT           retriable
    ├── InvalidGroupIdError           INVALID_GROUP_ID     (an InvalidRequestError)
    ├── GroupIdNotFoundError          GROUP_ID_NOT_FOUND
    ├── NonEmptyGroupError            NON_EMPTY_GROUP
    ├── UnknownMemberIdError          UNKNOWN_MEMBER_ID
    ├── FencedMemberEpochError        FENCED_MEMBER_EPOCH
    ├── StaleMemberEpochError         STALE_MEMBER_EPOCH
    ├── FencedInstanceIdError         FENCED_INSTANCE_ID
    ├── SaslAuthenticationError       SASL_AUTHENTICATION_FAILED
    │   ├── UnsupportedSaslMechanismError  UNSUPPORTED_SASL_MECHANISM
    │   └── IllegalSaslStateError     ILLEGAL_SASL_STATE
    ├── AuthorizationError            AUTHORIZATION_FAILED (base: one code per resource type)
    │   ├── TopicAuthorizationError   TOPIC_AUTHORIZATION_FAILED
    │   ├── GroupAuthorizationError   GROUP_AUTHORIZATION_FAILED
    │   ├── TransactionalIdAuthorizationError  TRANSACTIONAL_ID_AUTHORIZATION_FAILED
    │   └── ClusterAuthorizationError CLUSTER_AUTHORIZATION_FAILED
    ├── SecurityDisabledError         SECURITY_DISABLED
    ├── ResourceNotFoundError         RESOURCE_NOT_FOUND
    └── UnknownServerError            UNKNOWN_SERVER_ERROR

Consumer group errors (:mod:`logstore.broker.groups.coordinator`): UNKNOWN_MEMBER_ID and
FENCED_MEMBER_EPOCH tell a member it is no longer (or not in that epoch) part of
the group: it has lost its partitions and must rejoin; STALE_MEMBER_EPOCH
rejects a commit for partitions the member no longer owns; FENCED_INSTANCE_ID
tells a static member that a newer process with its ``group.instance.id``
took its place (fatal); NON_EMPTY_GROUP refuses changing offsets of, or
deleting, a group that has active members.

The wire carries ``(code, message)`` only. :func:`error_for_code` turns a code
back into the matching class at the client boundary, so a client raises the
same type the broker raised. Unknown codes become :class:`UnknownServerError`
so an old client keeps working against a newer broker.

Thread-safety: error objects are immutable after construction.
"""

from __future__ import annotations

from typing import ClassVar

__all__ = [
    "LogstoreError",
    "InvalidRequestError",
    "InvalidTopicError",
    "InvalidConfigError",
    "InvalidBootstrapError",
    "UnsupportedKeystoreTypeError",
    "InvalidPartitionsError",
    "InvalidTimestampError",
    "InternalTopicError",
    "UnknownTopicOrPartitionError",
    "TopicAlreadyExistsError",
    "OffsetOutOfRangeError",
    "OffsetNotAvailableError",
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
    "UnknownProducerOutcomeError",
    "UnknownServerError",
    "OutOfOrderSequenceError",
    "ProducerFencedError",
    "TransactionCoordinatorFencedError",
    "ProducerIdFloorUnknownError",
    "InvalidTxnStateError",
    "ConcurrentTransactionsError",
    "CompactionConflictError",
    "NotCoordinatorError",
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
    "error_for_code",
    "WIRE_CODE_KEY",
]

# gRPC trailing-metadata key that carries the error code of a failed call.
WIRE_CODE_KEY = "logstore-error-code"


class LogstoreError(Exception):
    """Base of every logstore error: a stable ``code`` plus a human message."""

    code: ClassVar[str] = "UNKNOWN_SERVER_ERROR"
    retriable: ClassVar[bool] = False

    def __init__(self, message: str) -> None:
        super().__init__(message)
        self.message = message

    def __str__(self) -> str:
        return f"[{self.code}] {self.message}"

    def __reduce__(self) -> tuple[type[LogstoreError], tuple[str]]:
        # Keep errors picklable across Spark workers and processes.
        return (type(self), (self.message,))


class InvalidRequestError(LogstoreError):
    """The request is malformed or asks for something impossible."""

    code = "INVALID_REQUEST"


class InvalidTopicError(InvalidRequestError):
    """A topic name breaks the naming rules (see :mod:`logstore.naming`)."""

    code = "INVALID_TOPIC"


class InvalidConfigError(InvalidRequestError):
    """A configuration key is unknown or its value is out of range."""

    code = "INVALID_CONFIG"


class InvalidBootstrapError(InvalidConfigError, ValueError):
    """A bootstrap address is not ``host:port`` (or a list of them): a port is missing or not a
    number in 1..65535, or the host is empty. Raised by the client before anything is sent
    (see :mod:`logstore.client.bootstrap`); also a :class:`ValueError`, what clients raised
    for it before this class existed."""

    code = "INVALID_BOOTSTRAP"


class UnsupportedKeystoreTypeError(InvalidConfigError):
    """A client's ``ssl.keystore.type``/``ssl.truststore.type`` (or the store's file) is not
    PKCS12 or PEM: a Java ``JKS`` store, say. The message names the ``keytool`` command that
    converts it. Raised by the client before anything is sent (:mod:`logstore.client.keystores`)."""

    code = "UNSUPPORTED_KEYSTORE_TYPE"


class InvalidPartitionsError(InvalidRequestError):
    """A partition count is not positive, or a partition number is invalid."""

    code = "INVALID_PARTITIONS"


class InvalidTimestampError(InvalidRequestError):
    """A record timestamp is out of the accepted range."""

    code = "INVALID_TIMESTAMP"


class InternalTopicError(InvalidRequestError):
    """The request would create, delete or change an internal topic (``__consumer_offsets``,
    ``__transaction_state``, ``__sink_commits``: every name starting with ``__``, reserved
    for the broker), which hold the broker's own state. Kafka refuses the same."""

    code = "INTERNAL_TOPIC"


class UnknownTopicOrPartitionError(LogstoreError):
    """The topic or partition does not exist on this broker."""

    code = "UNKNOWN_TOPIC_OR_PARTITION"
    retriable = True


class TopicAlreadyExistsError(LogstoreError):
    code = "TOPIC_ALREADY_EXISTS"


class OffsetOutOfRangeError(LogstoreError):
    """A read asked for an offset below the log start offset or above the LEO."""

    code = "OFFSET_OUT_OF_RANGE"


class OffsetNotAvailableError(LogstoreError):
    """A new leader does not know its high-water mark yet (it is below the start of its leader
    epoch), so it cannot say where the log ends; retry (Kafka's KIP-207)."""

    code = "OFFSET_NOT_AVAILABLE"
    retriable = True


class CorruptRecordError(LogstoreError):
    """A batch failed its CRC32C or structural checks."""

    code = "CORRUPT_MESSAGE"


class RecordTooLargeError(LogstoreError):
    """A batch or request exceeds ``max.message.bytes`` or a request size cap."""

    code = "MESSAGE_TOO_LARGE"


class SchemaMismatchError(LogstoreError):
    """A batch's Arrow schema is neither the topic's schema nor a compatible evolution."""

    code = "SCHEMA_MISMATCH"


class StorageError(LogstoreError):
    """The broker's disk failed an operation for this partition."""

    code = "KAFKA_STORAGE_ERROR"
    retriable = True


class LogOfflineError(StorageError):
    """The partition is offline (damaged files, a missing metadata file, an earlier I/O error):
    the message names the partition and why. Not retriable: it stays offline until an operator
    repairs it (``logstore partitions recover``), and the request wrote nothing. A write that
    fails *while* appending raises :class:`StorageError` (retriable; it may have been written)."""

    code = "LOG_OFFLINE"
    retriable = False


class NotLeaderError(LogstoreError):
    """This broker is not the leader of the partition (replication hook)."""

    code = "NOT_LEADER_OR_FOLLOWER"
    retriable = True


class FencedLeaderEpochError(LogstoreError):
    """The request's leader epoch is older than the partition's (replication hook)."""

    code = "FENCED_LEADER_EPOCH"
    retriable = True


class UnknownLeaderEpochError(LogstoreError):
    """The request's leader epoch is newer than this broker knows (its metadata is behind)."""

    code = "UNKNOWN_LEADER_EPOCH"
    retriable = True


class LeaderNotAvailableError(LogstoreError):
    """The partition has no leader right now (an election is under way, or no ISR member is alive)."""

    code = "LEADER_NOT_AVAILABLE"
    retriable = True


class NotEnoughReplicasError(LogstoreError):
    """acks=all refused before the append: the ISR is smaller than ``min.insync.replicas``."""

    code = "NOT_ENOUGH_REPLICAS"
    retriable = True


class NotEnoughReplicasAfterAppendError(LogstoreError):
    """acks=all: the leader appended, but the ISR shrank below ``min.insync.replicas`` before
    the records reached it; they were not acknowledged (a retry may duplicate them unless
    the producer is idempotent)."""

    code = "NOT_ENOUGH_REPLICAS_AFTER_APPEND"
    retriable = True


class InvalidReplicationFactorError(InvalidRequestError):
    """A replication factor below 1 or above the number of live brokers."""

    code = "INVALID_REPLICATION_FACTOR"


class MetadataStoreError(LogstoreError):
    """The cluster's metadata store (etcd) cannot be reached or refused a request."""

    code = "METADATA_STORE_UNAVAILABLE"
    retriable = True


class RequestTimedOutError(LogstoreError):
    code = "REQUEST_TIMED_OUT"
    retriable = True


class BrokerUnavailableError(LogstoreError):
    """The broker cannot be reached (connection refused, shut down, network)."""

    code = "BROKER_NOT_AVAILABLE"
    retriable = True


class UnknownProducerOutcomeError(RequestTimedOutError):
    """A producer gave up on a record the broker may or may not have appended.

    Reported instead of the last attempt's error when an attempt ended without
    a definite answer (a timeout, a connection lost after the request left) and
    no later attempt got one. A :class:`RequestTimedOutError` (Kafka reports
    these as timeouts). Raised by the client only; never on the wire. Not
    retriable: sending the record again may write it twice.
    """

    code = "UNKNOWN_PRODUCER_OUTCOME"
    retriable = False


class OutOfOrderSequenceError(LogstoreError):
    """An idempotent producer's batch does not continue its sequence (a batch was lost)."""

    code = "OUT_OF_ORDER_SEQUENCE_NUMBER"


class ProducerFencedError(LogstoreError):
    """A newer producer with the same producer id or transactional id has taken over."""

    code = "PRODUCER_FENCED"


class TransactionCoordinatorFencedError(LogstoreError):
    """A transaction marker from a deposed transaction coordinator: a marker for the same
    producer came from a coordinator of a newer epoch (its state partition's leader epoch)."""

    code = "TRANSACTION_COORDINATOR_FENCED"


class ProducerIdFloorUnknownError(LogstoreError):
    """A single broker cannot decide which producer ids are unused: ``meta/producer-id-block``
    is missing, damaged or behind, and a partition whose producer state would say is offline.
    The broker refuses to start rather than hand out an id a partition still holds."""

    code = "PRODUCER_ID_FLOOR_UNKNOWN"


class InvalidTxnStateError(LogstoreError):
    """A transactional request does not fit the transaction's state (or is stale)."""

    code = "INVALID_TXN_STATE"


class ConcurrentTransactionsError(LogstoreError):
    """The previous transaction of this transactional id is still being completed."""

    code = "CONCURRENT_TRANSACTIONS"
    retriable = True


class NotCoordinatorError(LogstoreError):
    """This broker is not the coordinator of the group or transactional id (find it again)."""

    code = "NOT_COORDINATOR"
    retriable = True


class CoordinatorNotAvailableError(LogstoreError):
    """The coordinator's state partition has no leader right now (or the broker is shutting down)."""

    code = "COORDINATOR_NOT_AVAILABLE"
    retriable = True


class CoordinatorLoadInProgressError(LogstoreError):
    """The coordinator is still loading its state from the log after a leadership change."""

    code = "COORDINATOR_LOAD_IN_PROGRESS"
    retriable = True


class InvalidReplicaAssignmentError(InvalidRequestError):
    """A reassignment names an unknown broker, a broker twice, or an empty replica set."""

    code = "INVALID_REPLICA_ASSIGNMENT"


class NoReassignmentInProgressError(LogstoreError):
    """A cancellation named a partition that is not being reassigned."""

    code = "NO_REASSIGNMENT_IN_PROGRESS"


class ElectionNotNeededError(LogstoreError):
    """The preferred replica already leads the partition."""

    code = "ELECTION_NOT_NEEDED"


class PreferredLeaderNotAvailableError(LogstoreError):
    """The preferred replica is not alive or not in sync, so it cannot lead yet."""

    code = "PREFERRED_LEADER_NOT_AVAILABLE"
    retriable = True


class CompactionConflictError(LogstoreError):
    """A segment swap of the log cleaner no longer fits the partition: the segments it
    replaces changed since it was planned (retention, another compaction, a roll back),
    or another compaction of the partition is in progress. Nothing was changed; plan
    again and retry later."""

    code = "COMPACTION_CONFLICT"
    retriable = True


class InvalidGroupIdError(InvalidRequestError):
    """A consumer group id is empty, too long or contains control characters."""

    code = "INVALID_GROUP_ID"


class GroupIdNotFoundError(LogstoreError):
    """The consumer group does not exist (it has no members and no committed offsets)."""

    code = "GROUP_ID_NOT_FOUND"


class NonEmptyGroupError(LogstoreError):
    """The consumer group has active members: its offsets cannot be reset from outside nor
    the group deleted until they stop."""

    code = "NON_EMPTY_GROUP"


class UnknownMemberIdError(LogstoreError):
    """The member is not in the group (its session expired, it left or was removed):
    its partitions were released; it must rejoin."""

    code = "UNKNOWN_MEMBER_ID"


class FencedMemberEpochError(LogstoreError):
    """The member epoch of a request does not fit the coordinator's: the member must rejoin."""

    code = "FENCED_MEMBER_EPOCH"


class StaleMemberEpochError(LogstoreError):
    """A commit names partitions the member does not own (any more): a zombie cannot
    commit over the member that owns them now."""

    code = "STALE_MEMBER_EPOCH"


class FencedInstanceIdError(LogstoreError):
    """A newer member with the same ``group.instance.id`` replaced this static member."""

    code = "FENCED_INSTANCE_ID"


class SaslAuthenticationError(LogstoreError):
    """Authentication failed. The message never says which part (user or password) was wrong."""

    code = "SASL_AUTHENTICATION_FAILED"


class UnsupportedSaslMechanismError(SaslAuthenticationError):
    """The client asked for a SASL mechanism the broker does not offer."""

    code = "UNSUPPORTED_SASL_MECHANISM"


class IllegalSaslStateError(SaslAuthenticationError):
    """A SCRAM step arrived out of order (unknown or expired exchange)."""

    code = "ILLEGAL_SASL_STATE"


class AuthorizationError(LogstoreError):
    """The principal may not do this: no ACL allows it, or one denies it (Kafka's model)."""

    code = "AUTHORIZATION_FAILED"


class TopicAuthorizationError(AuthorizationError):
    code = "TOPIC_AUTHORIZATION_FAILED"


class GroupAuthorizationError(AuthorizationError):
    code = "GROUP_AUTHORIZATION_FAILED"


class TransactionalIdAuthorizationError(AuthorizationError):
    code = "TRANSACTIONAL_ID_AUTHORIZATION_FAILED"


class ClusterAuthorizationError(AuthorizationError):
    code = "CLUSTER_AUTHORIZATION_FAILED"


class SecurityDisabledError(LogstoreError):
    """An ACL or credential call reached a broker that has no authorizer / no SCRAM configured."""

    code = "SECURITY_DISABLED"


class ResourceNotFoundError(LogstoreError):
    """The named user, credential or ACL does not exist."""

    code = "RESOURCE_NOT_FOUND"


class UnknownServerError(LogstoreError):
    """An unexpected failure inside the broker; the message says what it was."""

    code = "UNKNOWN_SERVER_ERROR"


def _all_subclasses(cls: type[LogstoreError]) -> list[type[LogstoreError]]:
    out: list[type[LogstoreError]] = []
    for sub in cls.__subclasses__():
        out.append(sub)
        out.extend(_all_subclasses(sub))
    return out


def error_for_code(code: str, message: str) -> LogstoreError:
    """Rebuild the error a broker reported as ``(code, message)``.

    Classes are looked up among all subclasses at call time, so errors that
    later modules define (transactions, groups) map without registration.
    """
    for cls in _all_subclasses(LogstoreError):
        if cls.code == code:
            return cls(message)
    err = UnknownServerError(message)
    err.message = f"{message} (unrecognised error code {code})"
    return err
