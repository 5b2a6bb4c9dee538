"""The group coordinator's in-memory state: groups and their members, and the
group metadata document they are persisted as (a record of
:mod:`logstore.broker.groups.records`).

What the fields mean and how they change is the state machine's business
(:mod:`logstore.broker.groups.coordinator`). The invariant it keeps here:
each partition is owned (in a member's ``assigned`` or ``revoking`` set) by at
most one member of a group. Deadlines are milliseconds of the coordinator's
monotonic clock; they are not persisted (sessions restart after a reload).

Thread-safety: none of its own; the coordinator's lock guards every object.
"""

from __future__ import annotations

import json
import logging
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from typing import Any

from logstore.broker.groups.model import (
    EMPTY,
    NO_PARTITIONS,
    RECONCILING,
    STABLE,
    CommittedOffset,
    TPs,
)
from logstore.broker.groups.records import (
    FORMAT,
    GroupLogEntry,
    TxnMarker,
    TxnRecord,
    parse_offset_value,
    tps_doc,
    tps_from,
)
from logstore.types import TopicPartition

__all__ = ["MemberState", "GroupState", "PendingDelete", "replay_groups", "replay_record", "replay_txn_record",
           "REPLAY_SEQ_BASE"]

log = logging.getLogger("logstore.groups")

# Sequence numbers of commits order them. A replay numbers records from REPLAY_SEQ_BASE up, below
# the coordinator's own (from 1), so a replayed record is older than any commit made since.
REPLAY_SEQ_BASE = -(2**62)
_NO_SEQ = REPLAY_SEQ_BASE - 1


class MemberState:
    """A member as the coordinator tracks it (deadlines in ms of the coordinator's clock)."""

    __slots__ = ("member_id", "instance_id", "client_id", "client_host", "subscriptions", "assignor",
                 "rebalance_timeout_ms", "member_epoch", "assigned", "revoking", "session_deadline",
                 "revoke_deadline", "left", "last_seq")

    def __init__(self, member_id: str, instance_id: str) -> None:
        self.member_id = member_id
        self.instance_id = instance_id
        self.client_id = ""
        self.client_host = ""
        self.subscriptions: frozenset[str] = frozenset()
        self.assignor = ""
        self.rebalance_timeout_ms = 300_000
        self.member_epoch = 0
        self.assigned: TPs = NO_PARTITIONS
        self.revoking: TPs = NO_PARTITIONS
        self.session_deadline = 0.0
        self.revoke_deadline: float | None = None
        self.left = False
        self.last_seq = -1

    def to_doc(self) -> dict[str, object]:
        return {
            "member_id": self.member_id, "instance_id": self.instance_id, "client_id": self.client_id,
            "client_host": self.client_host, "subscriptions": sorted(self.subscriptions),
            "assignor": self.assignor, "rebalance_timeout_ms": self.rebalance_timeout_ms,
            "member_epoch": self.member_epoch, "assigned": tps_doc(self.assigned),
            "revoking": tps_doc(self.revoking), "left": self.left, "last_seq": self.last_seq,
        }

    @classmethod
    def from_doc(cls, d: Mapping[str, Any]) -> MemberState:
        m = cls(str(d["member_id"]), str(d.get("instance_id", "")))
        m.client_id = str(d.get("client_id", ""))
        m.client_host = str(d.get("client_host", ""))
        m.subscriptions = frozenset(str(t) for t in d.get("subscriptions", ()))
        m.assignor = str(d.get("assignor", ""))
        m.rebalance_timeout_ms = int(d.get("rebalance_timeout_ms", 300_000))
        m.member_epoch = int(d.get("member_epoch", 0))
        m.assigned = tps_from(d.get("assigned", ()))
        m.revoking = tps_from(d.get("revoking", ()))
        m.left = bool(d.get("left", False))
        m.last_seq = int(d.get("last_seq", -1))
        return m


class GroupState:
    """A group: its epochs, assignor, target assignment, members and committed offsets.
    ``dirty``: the metadata changed since it was last written to the group log."""

    __slots__ = ("group_id", "group_epoch", "assignment_epoch", "assignor", "partitions", "target",
                 "members", "offsets", "offset_seqs", "pending_txn", "dirty")

    def __init__(self, group_id: str) -> None:
        self.group_id = group_id
        self.group_epoch = 0
        self.assignment_epoch = 0
        self.assignor = ""
        self.partitions: dict[str, int] = {}  # partition counts the target was computed for
        self.target: dict[str, TPs] = {}
        self.members: dict[str, MemberState] = {}
        self.offsets: dict[TopicPartition, CommittedOffset] = {}
        # The coordinator's sequence number of the commit each offset came from: commits are
        # applied in the order they were appended, whatever order their replication ends in.
        self.offset_seqs: dict[TopicPartition, int] = {}
        # A transaction's offsets (TxnOffsetCommit), by producer id, with the sequence number of
        # their append: pending until the producer's COMMIT or ABORT marker (complete_txn).
        self.pending_txn: dict[int, dict[TopicPartition, tuple[int, CommittedOffset]]] = {}
        self.dirty = False

    def add_pending(self, producer_id: int, seq: int, entries: Mapping[TopicPartition, CommittedOffset]) -> None:
        """Offsets of ``producer_id``'s open transaction, appended at ``seq`` (a later commit of
        the same transaction and partition replaces an earlier one)."""
        pending = self.pending_txn.setdefault(producer_id, {})
        for tp, c in entries.items():
            pending[tp] = (seq, c)

    def complete_txn(self, producer_id: int, *, commit: bool) -> int:
        """End ``producer_id``'s pending offsets: on commit each becomes the committed offset
        unless a commit appended after it (a larger sequence number) set that partition's
        already; on abort they are dropped. Return how many were applied."""
        pending = self.pending_txn.pop(producer_id, {})
        applied = 0
        if commit:
            for tp, (seq, c) in pending.items():
                if self.offset_seqs.get(tp, _NO_SEQ) < seq:
                    self.offsets[tp] = c
                    self.offset_seqs[tp] = seq
                    applied += 1
        return applied

    def unstable(self) -> frozenset[TopicPartition]:
        """The partitions with offsets of an undecided transaction (KIP-447's unstable offsets)."""
        return frozenset(tp for pending in self.pending_txn.values() for tp in pending)

    def bump(self) -> None:
        self.group_epoch += 1
        self.dirty = True

    def owner_map(self) -> dict[TopicPartition, str]:
        out: dict[TopicPartition, str] = {}
        for m in self.members.values():
            for tp in m.assigned | m.revoking:
                out[tp] = m.member_id
        return out

    def state(self) -> str:
        if not self.members:
            return EMPTY
        for m in self.members.values():
            if m.left:
                continue
            if (m.revoking or m.member_epoch != self.assignment_epoch
                    or m.assigned != self.target.get(m.member_id, NO_PARTITIONS)):
                return RECONCILING
        return STABLE

    def metadata_doc(self) -> dict[str, object]:
        return {
            "v": FORMAT, "group_epoch": self.group_epoch, "assignment_epoch": self.assignment_epoch,
            "assignor": self.assignor, "partitions": dict(sorted(self.partitions.items())),
            "target": {m: tps_doc(tps) for m, tps in sorted(self.target.items())},
            "members": [m.to_doc() for _, m in sorted(self.members.items())],
        }

    def load_metadata_doc(self, v: Mapping[str, Any], *, now: float, session_timeout_ms: int) -> None:
        """Restore what :meth:`metadata_doc` wrote; members get fresh sessions from ``now``.

        Raises ValueError, KeyError or TypeError when the document is malformed.
        """
        self.group_epoch = int(v["group_epoch"])
        self.assignment_epoch = int(v["assignment_epoch"])
        self.assignor = str(v.get("assignor", ""))
        self.partitions = {str(t): int(n) for t, n in v.get("partitions", {}).items()}
        self.target = {str(m): tps_from(tps) for m, tps in v.get("target", {}).items()}
        self.members = {}
        for d in v.get("members", ()):
            m = MemberState.from_doc(d)
            m.session_deadline = now + session_timeout_ms
            m.revoke_deadline = now + m.rebalance_timeout_ms if m.revoking else None
            self.members[m.member_id] = m
        self.dirty = False


def replay_record(groups: dict[str, GroupState], key: bytes, value: bytes | None, now: float,
            session_timeout_ms: int, *, seq: int = _NO_SEQ) -> None:
    """Apply one group-log record to ``groups`` (see :mod:`logstore.broker.groups.records`);
    ``seq`` orders it in the log (what a transaction's pending offsets are compared with)."""
    doc = json.loads(key)
    kind, group_id = doc[0], str(doc[1])
    if kind == "offset":
        tp = TopicPartition(str(doc[2]), int(doc[3]))
        if value is None:
            g = groups.get(group_id)
            if g is not None:
                g.offsets.pop(tp, None)
                g.offset_seqs[tp] = seq  # a pending offset appended before the deletion stays deleted
            return
        g = groups.setdefault(group_id, GroupState(group_id))
        g.offsets[tp] = parse_offset_value(value)
        g.offset_seqs[tp] = seq
    elif kind == "group":
        if value is None:
            groups.pop(group_id, None)
            return
        groups.setdefault(group_id, GroupState(group_id)).load_metadata_doc(
            json.loads(value), now=now, session_timeout_ms=session_timeout_ms)


@dataclass(frozen=True, slots=True)
class PendingDelete:
    """A group deleted from memory whose tombstones are in the group log: durable once the
    replicas reach ``positions`` (as a :class:`~logstore.broker.groups.model.PendingCommit`'s); ``group`` is what
    :meth:`~logstore.broker.groups.coordinator.GroupCoordinator.undo_delete` puts back."""

    group: GroupState
    positions: tuple[tuple[str, int, int], ...]


def replay_txn_record(groups: dict[str, GroupState], key: bytes, value: bytes | None, producer_id: int,
                      seq: int) -> str | None:
    """Apply one record of a transactional batch to ``groups``: a pending offset of
    ``producer_id`` (appended at ``seq``); return its group id (None: not an offset)."""
    doc = json.loads(key)
    if doc[0] != "offset" or value is None:
        return None
    group_id = str(doc[1])
    tp = TopicPartition(str(doc[2]), int(doc[3]))
    groups.setdefault(group_id, GroupState(group_id)).add_pending(producer_id, seq, {tp: parse_offset_value(value)})
    return group_id


def replay_groups(records: Iterable[GroupLogEntry], *, now_ms: float,
                  session_timeout_ms: int) -> dict[str, GroupState]:
    """The groups ``records`` (a group log, in order) describe: the last record per key wins, a
    transaction's offsets stay pending until its producer's marker on their log partition, and
    members get fresh sessions from ``now_ms``; unreadable records are skipped (and logged)."""
    groups: dict[str, GroupState] = {}
    pending: dict[tuple[int, int], set[str]] = {}  # (log partition, producer id) -> its groups
    for seq, entry in enumerate(records, start=REPLAY_SEQ_BASE):
        if isinstance(entry, TxnMarker):
            for group_id in sorted(pending.pop((entry.partition, entry.producer_id), ())):
                g = groups.get(group_id)
                if g is not None:
                    g.complete_txn(entry.producer_id, commit=entry.commit)
            continue
        key, value = (entry.key, entry.value) if isinstance(entry, TxnRecord) else entry
        try:
            if isinstance(entry, TxnRecord):
                txn_group = replay_txn_record(groups, key, value, entry.producer_id, seq)
                if txn_group is not None:
                    pending.setdefault((entry.partition, entry.producer_id), set()).add(txn_group)
            else:
                replay_record(groups, key, value, now_ms, session_timeout_ms, seq=seq)
        except (ValueError, KeyError, TypeError, IndexError) as e:
            log.warning("skipping an unreadable group record %r: %s", key[:200], e)
    return groups
