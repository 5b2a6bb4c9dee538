"""Topic names, partition directory names and coordinator keys.

Topic names follow Kafka's rules: 1 to 249 characters from ``[a-zA-Z0-9._-]``,
and neither ``.`` nor ``..``. A partition lives in ``<data_dir>/<topic>-<partition>``.
Names are checked here, before anything touches the filesystem, so a name can
never contain a path separator or climb out of the data directory.

Every file name derived from a topic name must fit the filesystems' 255-byte
``NAME_MAX`` (Kafka's reason for 249): ``<topic>-<partition>`` is at most
249 + 1 + 4 = 254 bytes (a topic has at most 10,000 partitions),
``meta/topics/<topic>.json`` 254, and temp files of long names are shortened
by :func:`logstore.storage.fileutil.tmp_path_for`. A new derived name (a
suffix such as ``-delete``) must shorten the topic part the same way.

A transactional id's *coordinator key* (:func:`coordinator_key`) is the part
before its first ``/``: the broker hashes it to a ``__transaction_state``
partition and the client asks FindCoordinator for it, so a Spark sink's
transactions ``<sinkId>/<batchId>/...`` and its batch decisions ``<sinkId>``
share one coordinator.

Thread-safety: pure functions.
"""

from __future__ import annotations

import re

from logstore.errors import InvalidPartitionsError, InvalidRequestError, InvalidTopicError

__all__ = [
    "MAX_TOPIC_NAME_LENGTH",
    "MAX_TRANSACTIONAL_ID_LENGTH",
    "validate_transactional_id",
    "validate_topic_name",
    "validate_partition",
    "partition_dir_name",
    "parse_partition_dir_name",
    "coordinator_key",
]

MAX_TOPIC_NAME_LENGTH = 249
MAX_TRANSACTIONAL_ID_LENGTH = 249  # the group id rules
_LEGAL = re.compile(r"[a-zA-Z0-9._-]+")


def validate_topic_name(name: object) -> str:
    """Return ``name`` if it is a legal topic name, else raise :class:`InvalidTopicError`."""
    if not isinstance(name, str):
        raise InvalidTopicError(f"topic name must be a string, got {type(name).__name__}")
    if not name:
        raise InvalidTopicError("topic name is empty")
    if name in (".", ".."):
        raise InvalidTopicError(f"topic name cannot be {name!r}")
    if len(name) > MAX_TOPIC_NAME_LENGTH:
        raise InvalidTopicError(
            f"topic name is {len(name)} characters long; the maximum is {MAX_TOPIC_NAME_LENGTH}"
        )
    if not _LEGAL.fullmatch(name):
        bad = sorted({c for c in name if not _LEGAL.fullmatch(c)})
        raise InvalidTopicError(
            f"topic name {name!r} contains illegal characters {bad!r}; "
            "use only ASCII letters, digits, '.', '_' and '-'"
        )
    return name


def validate_partition(partition: object) -> int:
    """Return ``partition`` if it is a non-negative int, else raise :class:`InvalidPartitionsError`."""
    if not isinstance(partition, int) or isinstance(partition, bool) or partition < 0:
        raise InvalidPartitionsError(f"partition must be a non-negative integer, got {partition!r}")
    return partition


def partition_dir_name(topic: str, partition: int) -> str:
    """``<topic>-<partition>``, after validating both parts."""
    return f"{validate_topic_name(topic)}-{validate_partition(partition)}"


def parse_partition_dir_name(name: str) -> tuple[str, int]:
    """Invert :func:`partition_dir_name`; raise :class:`InvalidTopicError` if ``name`` is not one."""
    topic, sep, number = name.rpartition("-")
    if not sep or not number.isdigit():
        raise InvalidTopicError(f"{name!r} is not a partition directory name (<topic>-<partition>)")
    return validate_topic_name(topic), int(number)


def validate_transactional_id(transactional_id: str) -> str:
    """Return ``transactional_id`` if usable, else raise :class:`InvalidRequestError`: the rules of
    group ids (1 to :data:`MAX_TRANSACTIONAL_ID_LENGTH` characters, no control characters such as
    NUL), since a transactional id is stored, logged and matched by ACLs as a group id is."""
    if not transactional_id:
        raise InvalidRequestError("a transactional id must be a non-empty string")
    if len(transactional_id) > MAX_TRANSACTIONAL_ID_LENGTH:
        raise InvalidRequestError(f"transactional id is {len(transactional_id)} characters long; the maximum "
                                  f"is {MAX_TRANSACTIONAL_ID_LENGTH}")
    if any(ord(c) < 32 or ord(c) == 127 for c in transactional_id):
        raise InvalidRequestError(f"transactional id {transactional_id[:60]!r} contains control characters")
    return transactional_id


def coordinator_key(transactional_id: str) -> str:
    """The part of a transactional id (or group id) that picks its coordinator: before the first '/'."""
    return transactional_id.split("/", 1)[0]
