"""The group log: how the group coordinator's state is persisted.

Where the records go is a :class:`GroupLog` (the broker's is the internal
compacted topic ``__consumer_offsets``; :class:`MemoryGroupLog` in tests). When
the coordinator writes them is specified in
:mod:`logstore.broker.groups.coordinator`.

Records
-------
Keys are compact JSON arrays, values JSON objects carrying their format
version ``"v"`` (:data:`FORMAT`); a ``None`` value is a tombstone. All records
of a group go to one partition, so their order is kept; on replay the last
record per key wins.

* ``["offset", group, topic, partition]`` (:func:`offset_key`) →
  ``{"v", "offset", "metadata", "commit_ms", "member_id", "member_epoch"}``
  (:func:`offset_value`): one committed offset;
* ``["group", group]`` (:func:`group_key`) → the group's metadata: group and
  assignment epochs, assignor, the partition counts the target was computed
  for, the target, and the members with their subscriptions, epochs and
  owned partitions (partition sets are lists of ``[topic, partition]``,
  :func:`tps_doc`);
* deleting a group writes tombstones for its metadata and every offset.

Thread-safety: the functions are pure; a :class:`GroupLog` is called by one
writer at a time (the coordinator serializes its writes).
"""

from __future__ import annotations

import json
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from typing import Any

from logstore.broker.groups.model import CommittedOffset, TPs
from logstore.types import TopicPartition

__all__ = [
    "FORMAT",
    "GroupRecord",
    "ReplicaPosition",
    "GroupLog",
    "MemoryGroupLog",
    "offset_key",
    "group_key",
    "offset_value",
    "parse_offset_value",
    "tps_doc",
    "tps_from",
]

FORMAT = 1


# (topic, partition, end offset): a replicated log's records below the end offset are durable
# once its in-sync replicas have them.
ReplicaPosition = tuple[str, int, int]


@dataclass(frozen=True, slots=True)
class GroupRecord:
    """A record of the group log; ``value`` None is a tombstone."""

    group_id: str
    key: bytes
    value: bytes | None


class GroupLog:
    """Where the coordinator keeps its state. ``append`` must have written the records (and,
    with ``fsync``, made them durable) when it returns; records of one group keep their order."""

    def append(self, records: Sequence[GroupRecord], *, fsync: bool) -> None:  # pragma: no cover
        raise NotImplementedError

    def read_all(self) -> Iterable[tuple[bytes, bytes | None]]:  # pragma: no cover
        raise NotImplementedError

    def append_pending(self, records: Sequence[GroupRecord], *, fsync: bool) -> tuple[ReplicaPosition, ...]:
        """Append now; return the positions the records are durable at once the replicas reach
        them (a replicated log), for :meth:`wait_durable` or the broker's own wait. The
        default appends durably at once and returns none."""
        self.append(records, fsync=fsync)
        return ()

    def wait_durable(self, positions: Sequence[ReplicaPosition]) -> None:
        """Block until the replicas reach ``positions`` (nothing to wait for by default)."""


class MemoryGroupLog(GroupLog):
    """An in-memory :class:`GroupLog` (tests); ``fail`` makes the next appends raise."""

    def __init__(self) -> None:
        self.records: list[GroupRecord] = []
        self.fail: Exception | None = None

    def append(self, records: Sequence[GroupRecord], *, fsync: bool) -> None:
        if self.fail is not None:
            raise self.fail
        self.records.extend(records)

    def read_all(self) -> Iterable[tuple[bytes, bytes | None]]:
        return [(r.key, r.value) for r in self.records]


# --------------------------------------------------------------------------- keys and values


def offset_key(group_id: str, tp: TopicPartition) -> bytes:
    return json.dumps(["offset", group_id, tp.topic, tp.partition], separators=(",", ":")).encode()


def group_key(group_id: str) -> bytes:
    return json.dumps(["group", group_id], separators=(",", ":")).encode()


def offset_value(c: CommittedOffset) -> bytes:
    return json.dumps({
        "v": FORMAT, "offset": c.offset, "metadata": c.metadata, "commit_ms": c.commit_timestamp_ms,
        "member_id": c.member_id, "member_epoch": c.member_epoch}).encode()


def parse_offset_value(value: bytes) -> CommittedOffset:
    """The committed offset in ``value``; raises ValueError, KeyError or TypeError when malformed."""
    v = json.loads(value)
    return CommittedOffset(
        int(v["offset"]), str(v.get("metadata", "")), int(v.get("commit_ms", -1)),
        str(v.get("member_id", "")), int(v.get("member_epoch", -1)))


def tps_doc(tps: Iterable[TopicPartition]) -> list[list[object]]:
    return [[tp.topic, tp.partition] for tp in sorted(tps)]


def tps_from(doc: Any) -> TPs:
    return frozenset(TopicPartition(str(t), int(p)) for t, p in doc)
