"""Our errors as Kafka's numeric error codes, in one place.

Our codes are Kafka's names (:mod:`logstore.errors`), so most map by name to kio's
:class:`~kio.schema.errors.ErrorCode`; the few of our own map to the nearest Kafka code
(:data:`OURS`). An unknown code becomes UNKNOWN_SERVER_ERROR, never a traceback.

Thread-safety: pure functions.
"""

from __future__ import annotations

from kio.schema.errors import ErrorCode

from logstore.errors import LogstoreError

__all__ = ["OURS", "kafka_error_code"]

# Our codes that are not Kafka's, and the Kafka code a Kafka client is answered with.
OURS = {
    "INVALID_TOPIC": ErrorCode.invalid_topic_exception,
    "INTERNAL_TOPIC": ErrorCode.invalid_topic_exception,
    "LOG_OFFLINE": ErrorCode.kafka_storage_error,
    "SCHEMA_MISMATCH": ErrorCode.invalid_record,
    "AUTHORIZATION_FAILED": ErrorCode.cluster_authorization_failed,
    "METADATA_STORE_UNAVAILABLE": ErrorCode.unknown_server_error,
    "COMPACTION_CONFLICT": ErrorCode.unknown_server_error,
    "PRODUCER_ID_FLOOR_UNKNOWN": ErrorCode.unknown_server_error,
    "UNKNOWN_PRODUCER_OUTCOME": ErrorCode.request_timed_out,
    "INVALID_BOOTSTRAP": ErrorCode.invalid_config,
}


def kafka_error_code(error: LogstoreError | None) -> ErrorCode:
    """The Kafka error code of ``error`` (``none`` for None)."""
    if error is None:
        return ErrorCode.none
    mapped = OURS.get(error.code)
    if mapped is not None:
        return mapped
    try:
        return ErrorCode[error.code.lower()]
    except KeyError:
        return ErrorCode.unknown_server_error
