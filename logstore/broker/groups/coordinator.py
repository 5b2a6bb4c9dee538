"""The consumer group coordinator: membership, epochs, target assignment, incremental
revoke-then-assign reconciliation, and committed offsets (Kafka's KIP-848 protocol).

This module is deterministic and does no I/O of its own: it is driven by
heartbeats, commits and :meth:`GroupCoordinator.tick` calls, reads time from
an injected clock, and keeps its durable state through a
:class:`~logstore.broker.groups.records.GroupLog` (the broker's is the internal
compacted topic ``__consumer_offsets``). Its request and answer values live in
:mod:`logstore.broker.groups.model`, its in-memory groups and members in
:mod:`logstore.broker.groups.state`, their record format in
:mod:`logstore.broker.groups.records`.

Protocol
--------
A member heartbeats with its group id, its member id (chosen by the client,
kept across rejoins), its *member epoch*, its subscribed topics and the
partitions it owns right now. Epoch 0 joins (or rejoins owning nothing), -1
leaves, -2 leaves *for now* (a static member, see below). The answer is the
member's epoch and the full set of partitions it may consume now.

Every group has a *group epoch*, bumped whenever membership, a subscription,
the chosen assignor or the partition count of a subscribed topic changes. At
a new group epoch the coordinator computes a *target assignment* with the
group's assignor (:mod:`logstore.broker.groups.assignors`; ``uniform`` by default,
``range`` on request; members name theirs, the most requested wins) and
then moves each member towards its target *incrementally*::

                 target drops some of its partitions
    STABLE ──────────────────────────────────────────▶ REVOKING
      ▲   (partitions stay owned, epoch unchanged)        │ member reports it no longer
      │                                                   │ owns them (or is evicted)
      │   all target partitions granted                   ▼
      └──────────────────────────────────────────── epoch := target epoch; grant the
                                                     target partitions nobody owns;
                                                     the rest follow as they are released

* A partition is granted only when no member owns it: not in any member's
  ``assigned`` nor ``revoking`` set. So **each partition is owned by at most
  one member at any time** (the invariant the tests check after every step).
* Members whose target keeps their partitions are never asked to stop them:
  only the partitions that move pause (no stop-the-world rebalance).
* A member that leaves (epoch -1) or is evicted (no heartbeat within the
  session timeout; revocation not done within its rebalance timeout)
  releases everything at once.

Static membership: a member with an instance id (``group.instance.id``) that
leaves with epoch -2 keeps its partitions reserved until the session timeout.
A join with an instance id already in the group *replaces* that member (the
new process takes over its member slot, epoch and partitions; the group
epoch does not move, so nobody else is disturbed); the old member id is
fenced (FENCED_INSTANCE_ID).

Commits are fenced: a commit names the member id and epoch, and is accepted
only when the member is in the group, its epoch is not newer than the
coordinator's, and it owns (assigned or still revoking) every partition it
commits. An evicted or replaced member (a zombie) therefore cannot commit
over the member that now owns its partitions. A commit with no member id
(admin tools, a Spark query reporting progress) is accepted only while the
group has no members (NON_EMPTY_GROUP otherwise).

Persistence: commits are durable before they are acknowledged, metadata is written
behind, a transaction's offsets stay pending until its marker; the rules, the records
and their replay are in :mod:`logstore.broker.groups.records`.

:meth:`GroupCoordinator.startup` replays the log (last record per key wins).
On a cluster the log is sharded (:mod:`logstore.broker.coordinator_shards`):
:meth:`GroupCoordinator.load_groups` replays one partition's records when this
broker becomes its leader, replacing the groups that partition owns, and
:meth:`GroupCoordinator.unload_groups` forgets them when it stops leading it.

Thread-safety: every public method takes the coordinator's lock, which is
never held during I/O. Writes to the log are serialized by a second lock
(commits, metadata flushes, deletions), so a heartbeat never waits for a disk.
"""

from __future__ import annotations

import json
import logging
import secrets
import threading
import time
from collections import OrderedDict
from collections.abc import Callable, Iterable, Mapping

from logstore.broker.groups.assignors import ASSIGNORS
from logstore.broker.groups.model import (
    JOIN_EPOCH,
    LEAVE_EPOCH,
    NO_PARTITIONS,
    TEMPORARY_LEAVE_EPOCH,
    CommittedOffset,
    GroupConfig,
    GroupSnapshot,
    GroupSummary,
    Heartbeat,
    HeartbeatOutcome,
    MemberAssignment,
    MemberKey,
    MemberSnapshot,
    PendingCommit,
    validate_group_id,
)
from logstore.broker.groups.reconcile import (
    changed_members,
    choose_assignor,
    member_states,
    merge_bumps,
    reconcile,
    refresh_partitions,
)
from logstore.broker.groups.records import (
    GroupLog,
    GroupLogEntry,
    GroupRecord,
    ReplicaPosition,
    group_key,
    offset_key,
    offset_value,
)
from logstore.broker.groups.state import (
    GroupState,
    MemberState,
    PendingDelete,
    replay_groups,
)
from logstore.errors import (
    FencedInstanceIdError,
    FencedMemberEpochError,
    GroupIdNotFoundError,
    InvalidConfigError,
    InvalidRequestError,
    NonEmptyGroupError,
    StaleMemberEpochError,
    UnknownMemberIdError,
)
from logstore.naming import validate_topic_name
from logstore.types import TopicPartition

__all__ = ["GroupCoordinator", "MAX_REBALANCE_TIMEOUT_MS"]

log = logging.getLogger("logstore.groups")

MAX_REBALANCE_TIMEOUT_MS = 30 * 60 * 1000
_REPLACED_MEMORY = 10_000  # fenced member ids remembered for a precise error


# --------------------------------------------------------------------------- the coordinator


class GroupCoordinator:
    """See the module docstring.

    ``topic_partitions(topic)`` gives a topic's partition count, or None when
    it does not exist. ``clock`` (seconds, monotonic) times sessions;
    ``wall_clock`` (seconds since the epoch) stamps commits.
    """

    def __init__(
        self,
        config: GroupConfig,
        *,
        log: GroupLog,
        topic_partitions: Callable[[str], int | None],
        clock: Callable[[], float] = time.monotonic,
        wall_clock: Callable[[], float] = time.time,
        new_member_id: Callable[[], str] = lambda: secrets.token_urlsafe(24),
    ) -> None:
        self.config = config
        self._log = log
        self._topic_partitions = topic_partitions
        self._clock = clock
        self._wall_clock = wall_clock
        self._new_member_id = new_member_id
        self._lock = threading.RLock()
        self._write_lock = threading.Lock()
        self._groups: dict[str, GroupState] = {}
        self._replaced: OrderedDict[MemberKey, str] = OrderedDict()
        self._commit_seq = 0

    def _now_ms(self) -> float:
        return self._clock() * 1000

    # ------------------------------------------------------------------ startup

    def startup(self) -> None:
        """Rebuild every group from the log: offsets, then members with fresh sessions."""
        with self._write_lock:
            groups = replay_groups(self._log.read_all(), now_ms=self._now_ms(),
                                   session_timeout_ms=self.config.session_timeout_ms)
            with self._lock:
                self._groups = groups

    def load_groups(self, records: Iterable[GroupLogEntry], *, owns: Callable[[str], bool]) -> int:
        """Replace the groups ``owns(group_id)`` selects with what ``records`` (one shard's log, in
        order) say; members get fresh sessions. Return how many groups were loaded.

        The records are read and replayed without the coordinator's lock (heartbeats of other
        groups go on); the loaded groups are swapped in at the end."""
        with self._write_lock:
            loaded = {g: state for g, state in replay_groups(records, now_ms=self._now_ms(),
                                                              session_timeout_ms=self.config.session_timeout_ms).items() if owns(g)}
            with self._lock:
                for group_id in [g for g in self._groups if owns(g)]:
                    del self._groups[group_id]
                self._groups.update(loaded)
            return len(loaded)

    def unload_groups(self, owns: Callable[[str], bool]) -> int:
        """Forget the groups ``owns(group_id)`` selects (another broker coordinates them now)."""
        with self._write_lock, self._lock:
            gone = [g for g in self._groups if owns(g)]
            for group_id in gone:
                del self._groups[group_id]
            return len(gone)

    def _group(self, group_id: str) -> GroupState:
        g = self._groups.get(group_id)
        if g is None:
            g = self._groups[group_id] = GroupState(group_id)
        return g

    # ------------------------------------------------------------------ heartbeats

    def heartbeat(self, hb: Heartbeat) -> HeartbeatOutcome:
        """Process one heartbeat (in memory only); see the module docstring."""
        validate_group_id(hb.group_id)
        if hb.member_epoch < TEMPORARY_LEAVE_EPOCH:
            raise InvalidRequestError(f"member epoch {hb.member_epoch} is invalid")
        if len(hb.member_id) > 255 or len(hb.instance_id) > 255:
            raise InvalidRequestError("member and instance ids are at most 255 characters long")
        if hb.assignor and hb.assignor not in ASSIGNORS:
            raise InvalidConfigError(f"group assignor {hb.assignor!r} is unknown; use one of {sorted(ASSIGNORS)}")
        if not 1 <= hb.rebalance_timeout_ms <= MAX_REBALANCE_TIMEOUT_MS:
            raise InvalidRequestError(
                f"rebalance timeout must be between 1 and {MAX_REBALANCE_TIMEOUT_MS} ms, got {hb.rebalance_timeout_ms}"
            )
        for topic in hb.subscribed_topics:
            validate_topic_name(topic)
        with self._lock:
            now = self._now_ms()
            if hb.member_epoch in (LEAVE_EPOCH, TEMPORARY_LEAVE_EPOCH):
                return self._leave(hb, now)
            if hb.member_epoch == JOIN_EPOCH:
                group = self._group(hb.group_id)
                before = member_states(group)
                epoch_before = group.group_epoch
                member = self._join(group, hb, now)
            else:
                found = self._groups.get(hb.group_id)
                known = found.members.get(hb.member_id) if found is not None and hb.member_id else None
                if found is None or known is None:
                    raise self._unknown_member(hb.group_id, hb.member_id)
                group, member = found, known
                before = member_states(group)
                epoch_before = group.group_epoch
                if hb.member_epoch > member.member_epoch:
                    raise FencedMemberEpochError(
                        f"member {hb.member_id} of group {hb.group_id!r} sent epoch {hb.member_epoch}, "
                        f"newer than its epoch {member.member_epoch} at the coordinator; rejoin"
                    )
                member.left = False
            member.session_deadline = now + self.config.session_timeout_ms
            if hb.request_seq > member.last_seq:
                member.last_seq = hb.request_seq
                released = member.revoking - hb.owned
                if released:
                    member.revoking -= released
                    group.dirty = True
                if not member.revoking:
                    member.revoke_deadline = None
            self._update_member(group, member, hb)
            refresh_partitions(group, self._topic_partitions)
            merge_bumps(group, epoch_before)
            reconcile(group, now, default_assignor=self.config.default_assignor)
            state = self._assignment(group, member)
            in_sync = hb.member_epoch == member.member_epoch and hb.owned == member.assigned
            return HeartbeatOutcome(state, in_sync, changed_members(group, before))

    def _leave(self, hb: Heartbeat, now: float) -> HeartbeatOutcome:
        group = self._groups.get(hb.group_id)
        member = group.members.get(hb.member_id) if group is not None else None
        if group is None or member is None:
            return HeartbeatOutcome(None, False, frozenset())  # leaving twice is fine
        before = member_states(group)
        if hb.member_epoch == TEMPORARY_LEAVE_EPOCH and member.instance_id:
            # A static member going away for now: its partitions wait for it until the session ends.
            member.left = True
            member.revoking = NO_PARTITIONS
            member.revoke_deadline = None
            member.session_deadline = now + self.config.session_timeout_ms
            group.dirty = True
            log.info("static member %s (%s) of group %r left for now", member.member_id,
                     member.instance_id, group.group_id)
        else:
            self._remove(group, member, "left the group")
        reconcile(group, now, default_assignor=self.config.default_assignor)
        return HeartbeatOutcome(None, False, changed_members(group, before))

    def _join(self, group: GroupState, hb: Heartbeat, now: float) -> MemberState:
        existing = group.members.get(hb.member_id) if hb.member_id else None
        if existing is not None:
            # A rejoin (or a retried join): the member owns nothing now.
            existing.assigned = existing.revoking = NO_PARTITIONS
            existing.revoke_deadline = None
            existing.member_epoch = JOIN_EPOCH
            existing.left = False
            existing.last_seq = -1
            group.dirty = True
            return existing
        if hb.instance_id:
            old = next((m for m in group.members.values() if m.instance_id == hb.instance_id), None)
            if old is not None:
                # The new process takes over the slot: epoch, partitions and target stay,
                # so the group epoch does not move and nobody else is disturbed.
                member_id = hb.member_id or self._new_member_id()
                del group.members[old.member_id]
                self._remember_replaced(group.group_id, old.member_id, hb.instance_id)
                target = group.target.pop(old.member_id, None)
                if target is not None:
                    group.target[member_id] = target
                old.member_id = member_id
                old.left = False
                old.last_seq = -1
                group.members[member_id] = old
                group.dirty = True
                log.info("static member %s of group %r replaced by member %s", hb.instance_id,
                         group.group_id, member_id)
                return old
        member = MemberState(hb.member_id or self._new_member_id(), hb.instance_id)
        group.members[member.member_id] = member
        group.bump()
        log.info("member %s%s joined group %r (group epoch %d)", member.member_id,
                 f" ({hb.instance_id})" if hb.instance_id else "", group.group_id, group.group_epoch)
        return member

    def _update_member(self, group: GroupState, member: MemberState, hb: Heartbeat) -> None:
        subs = frozenset(hb.subscribed_topics)
        if subs != member.subscriptions or hb.assignor != member.assignor:
            member.subscriptions = subs
            member.assignor = hb.assignor
            group.bump()
        if (hb.rebalance_timeout_ms, hb.client_id, hb.client_host) != (
                member.rebalance_timeout_ms, member.client_id, member.client_host):
            member.rebalance_timeout_ms = hb.rebalance_timeout_ms
            member.client_id = hb.client_id
            member.client_host = hb.client_host
            group.dirty = True

    def _remove(self, group: GroupState, member: MemberState, why: str) -> None:
        del group.members[member.member_id]
        group.target.pop(member.member_id, None)
        group.bump()
        log.info("member %s of group %r %s; releasing %d partitions (group epoch %d)",
                 member.member_id, group.group_id, why, len(member.assigned | member.revoking),
                 group.group_epoch)

    def _remember_replaced(self, group_id: str, member_id: str, instance_id: str) -> None:
        self._replaced[(group_id, member_id)] = instance_id
        while len(self._replaced) > _REPLACED_MEMORY:
            self._replaced.popitem(last=False)

    def _unknown_member(self, group_id: str, member_id: str) -> Exception:
        instance = self._replaced.get((group_id, member_id))
        if instance is not None:
            return FencedInstanceIdError(
                f"member {member_id} of group {group_id!r} was replaced by a newer member with "
                f"group.instance.id {instance!r}"
            )
        return UnknownMemberIdError(
            f"member {member_id or '(none)'} is not in group {group_id!r} (its session expired, it "
            "left, or it was removed); rejoin"
        )

    def _assignment(self, group: GroupState, member: MemberState) -> MemberAssignment:
        return MemberAssignment(group.group_id, member.member_id, member.member_epoch, member.assigned,
                                self.config.heartbeat_interval_ms, self.config.session_timeout_ms)

    def member_state(self, group_id: str, member_id: str) -> MemberAssignment:
        """The member's current epoch and assignment; raises when it is no longer in the group."""
        with self._lock:
            group = self._groups.get(group_id)
            member = group.members.get(member_id) if group is not None else None
            if group is None or member is None:
                raise self._unknown_member(group_id, member_id)
            return self._assignment(group, member)

    def tick(self) -> frozenset[MemberKey]:
        """Evict expired sessions and overdue revocations, notice partition count changes;
        return the members whose state changed."""
        changed: set[MemberKey] = set()
        with self._lock:
            now = self._now_ms()
            for group in list(self._groups.values()):
                before = member_states(group)
                epoch = group.group_epoch
                for m in list(group.members.values()):
                    if now >= m.session_deadline:
                        self._remove(group, m, f"sent no heartbeat for {self.config.session_timeout_ms} ms "
                                               "(session timeout)")
                    elif m.revoke_deadline is not None and now >= m.revoke_deadline:
                        self._remove(group, m, f"did not revoke {len(m.revoking)} partitions within its "
                                               f"rebalance timeout of {m.rebalance_timeout_ms} ms")
                refresh_partitions(group, self._topic_partitions)
                merge_bumps(group, epoch)
                if group.group_epoch != epoch:
                    reconcile(group, now, default_assignor=self.config.default_assignor)
                    changed |= changed_members(group, before)
        return frozenset(changed)

    # ------------------------------------------------------------------ offsets

    def commit_offsets(self, group_id: str, member_id: str, member_epoch: int,
                       offsets: Mapping[TopicPartition, tuple[int, str]]) -> None:
        """Commit ``{tp: (offset, metadata)}`` durably, fenced as the module docstring says."""
        pending = self.append_commit(group_id, member_id, member_epoch, offsets)
        if pending is not None:
            self._log.wait_durable(pending.positions)
            self.apply_commit(pending)

    def append_commit(self, group_id: str, member_id: str, member_epoch: int,
                      offsets: Mapping[TopicPartition, tuple[int, str]]) -> PendingCommit | None:
        """The first half of :meth:`commit_offsets`: check and append (None: nothing to commit).
        The caller waits for ``positions`` (a replicated log), then calls :meth:`apply_commit`."""
        _check_offsets(group_id, offsets)
        if not offsets:
            return None
        with self._write_lock:
            entries, seq, records = self._offset_records(group_id, member_id, member_epoch, offsets, fenced=True)
            return PendingCommit(group_id, entries, seq, self._log.append_pending(records, fsync=True))

    def apply_commit(self, pending: PendingCommit) -> None:
        """Make a durable commit visible, unless a later commit of a partition was applied first."""
        with self._lock:
            group = self._group(pending.group_id)
            for tp, c in pending.entries.items():
                if group.offset_seqs.get(tp, 0) < pending.seq:
                    group.offsets[tp] = c
                    group.offset_seqs[tp] = pending.seq

    # ------------------------------------------------------------------ a transaction's offsets

    def commit_txn_offsets(self, group_id: str, *, producer_id: int, producer_epoch: int, member_id: str,
                           member_epoch: int, offsets: Mapping[TopicPartition, tuple[int, str]],
                           verify: Callable[[], None] = lambda: None) -> None:
        """Write a transaction's offsets (Kafka's TxnOffsetCommit) durably as a transactional
        batch of ``producer_id`` (on a replicated log, waiting for the in-sync replicas) and keep
        them *pending* until :meth:`complete_transaction` (the producer's marker on the group's
        log partition).

        Fenced as a member's commit when ``member_id`` is given with an epoch (generation)
        >= 0 (KIP-447); without them (older clients) any producer of the transaction may
        commit. ``verify()`` raises unless the producer's transaction is open and includes the
        group's log partition (AddOffsetsToTxn; the transaction coordinator's check). It is
        called under the log's hold (:meth:`~logstore.broker.groups.records.GroupLog.hold_transaction`)
        and outside this coordinator's locks (it takes the transaction coordinator's, which a
        marker's :meth:`complete_transaction` holds while it takes ours): a marker that lands
        between it and the append makes the append refuse, so a transaction that ended meanwhile
        is never reopened on the group's partition."""
        _check_offsets(group_id, offsets)
        if not offsets:
            return
        hold = self._log.hold_transaction(group_id, producer_id)
        try:
            verify()
            positions = self._append_txn_offsets(group_id, producer_id, producer_epoch, member_id, member_epoch,
                                                 offsets, hold)
        finally:
            self._log.release_transaction(hold)
        self._log.wait_durable(positions)

    def _append_txn_offsets(self, group_id: str, producer_id: int, producer_epoch: int, member_id: str,
                            member_epoch: int, offsets: Mapping[TopicPartition, tuple[int, str]],
                            hold: object) -> tuple[ReplicaPosition, ...]:
        with self._write_lock:
            entries, seq, records = self._offset_records(group_id, member_id, member_epoch, offsets,
                                                         fenced=bool(member_id) and member_epoch >= 0)
            positions = self._log.append_transactional(records, producer_id=producer_id,
                                                       producer_epoch=producer_epoch, hold=hold)
            with self._lock:  # pending from now: a marker comes only after this call answered
                self._group(group_id).add_pending(producer_id, seq, entries)
            return positions

    def complete_transaction(self, producer_id: int, *, commit: bool, owns: Callable[[str], bool]) -> int:
        """The producer's COMMIT (``commit``) or ABORT marker landed on the log partition whose
        groups ``owns(group_id)`` selects: apply or drop their pending offsets of
        ``producer_id`` (see :mod:`logstore.broker.groups.records`). Return how many offsets
        were applied. Takes the write lock, so a marker that lands while the partition is being
        loaded is applied to the loaded groups (or was read by the load, and finds nothing)."""
        applied = 0
        with self._write_lock, self._lock:
            for group_id, g in self._groups.items():
                if producer_id in g.pending_txn and owns(group_id):
                    applied += g.complete_txn(producer_id, commit=commit)
        return applied

    def unstable_offsets(self, group_id: str) -> frozenset[TopicPartition]:
        """The group's partitions with offsets of an undecided transaction (OffsetFetch with
        ``require_stable`` answers UNSTABLE_OFFSET_COMMIT for them, KIP-447)."""
        validate_group_id(group_id)
        with self._lock:
            group = self._groups.get(group_id)
            return frozenset() if group is None else group.unstable()

    def _offset_records(self, group_id: str, member_id: str, member_epoch: int,
                        offsets: Mapping[TopicPartition, tuple[int, str]], *, fenced: bool,
                        ) -> tuple[dict[TopicPartition, CommittedOffset], int, list[GroupRecord]]:
        """A commit's offsets, its sequence number and its group log records; with ``fenced``,
        checked first as the member's commit. Called under the write lock."""
        with self._lock:
            if fenced:
                self._check_commit(group_id, member_id, member_epoch, offsets)
            when = int(self._wall_clock() * 1000)
            entries = {tp: CommittedOffset(o, md, when, member_id, member_epoch) for tp, (o, md) in offsets.items()}
            self._commit_seq += 1
            seq = self._commit_seq
        records = [GroupRecord(group_id, offset_key(group_id, tp), offset_value(c)) for tp, c in sorted(entries.items())]
        return entries, seq, records

    def _check_commit(self, group_id: str, member_id: str, member_epoch: int,
                      offsets: Mapping[TopicPartition, object]) -> None:
        group = self._groups.get(group_id)
        if not member_id:
            if group is not None and group.members:
                raise NonEmptyGroupError(
                    f"group {group_id!r} has {len(group.members)} active member(s); while it has members "
                    "only they can commit its offsets (stop them first)"
                )
            return
        member = group.members.get(member_id) if group is not None else None
        if group is None or member is None:
            raise self._unknown_member(group_id, member_id)
        if member_epoch > member.member_epoch:
            raise FencedMemberEpochError(
                f"commit by member {member_id} of group {group_id!r} names epoch {member_epoch}, "
                f"newer than its epoch {member.member_epoch}; rejoin"
            )
        owned = member.assigned | member.revoking
        foreign = sorted(tp for tp in offsets if tp not in owned)
        if foreign:
            raise StaleMemberEpochError(
                f"member {member_id} (epoch {member_epoch}) of group {group_id!r} does not own "
                f"{', '.join(map(str, foreign[:5]))}{' ...' if len(foreign) > 5 else ''}; "
                "the commit was rejected (the partitions were reassigned)"
            )

    def fetch_offsets(self, group_id: str,
                      partitions: Iterable[TopicPartition] | None = None) -> dict[TopicPartition, CommittedOffset]:
        """The group's committed offsets (only those of ``partitions`` when given; none = absent)."""
        validate_group_id(group_id)
        with self._lock:
            group = self._groups.get(group_id)
            if group is None:
                return {}
            if partitions is None:
                return dict(group.offsets)
            return {tp: group.offsets[tp] for tp in partitions if tp in group.offsets}

    # ------------------------------------------------------------------ administration

    def list_groups(self) -> list[GroupSummary]:
        with self._lock:
            return [GroupSummary(g.group_id, g.state(), len(g.members), g.assignor or choose_assignor(g, self.config.default_assignor))
                    for _, g in sorted(self._groups.items())]

    def describe_group(self, group_id: str) -> GroupSnapshot:
        validate_group_id(group_id)
        with self._lock:
            g = self._groups.get(group_id)
            if g is None:
                raise GroupIdNotFoundError(f"group {group_id!r} does not exist")
            members = tuple(
                MemberSnapshot(m.member_id, m.instance_id, m.client_id, m.client_host, m.member_epoch,
                               tuple(sorted(m.subscriptions)), m.assignor, m.assigned, m.revoking,
                               g.target.get(m.member_id, NO_PARTITIONS), m.left)
                for m in sorted(g.members.values(), key=lambda m: (m.instance_id or "\uffff", m.member_id))
            )
            return GroupSnapshot(g.group_id, g.state(), g.group_epoch, g.assignment_epoch,
                                 g.assignor or choose_assignor(g, self.config.default_assignor), members, dict(g.offsets))

    def undo_delete(self, pending: PendingDelete) -> None:
        """Put back a group whose deletion did not become durable (its replicas did not follow)."""
        with self._lock:
            self._groups.setdefault(pending.group.group_id, pending.group)

    def delete_group(self, group_id: str) -> PendingDelete:
        """Delete an empty group and its committed offsets (tombstones, fsynced). On a replicated
        log the caller waits for ``positions`` (the broker on its loop, not on an I/O thread) and
        calls :meth:`undo_delete` if the replicas do not follow."""
        validate_group_id(group_id)
        with self._write_lock:
            with self._lock:
                g = self._groups.get(group_id)
                if g is None:
                    raise GroupIdNotFoundError(f"group {group_id!r} does not exist")
                if g.members:
                    raise NonEmptyGroupError(
                        f"group {group_id!r} has {len(g.members)} active member(s); stop them before deleting it"
                    )
                del self._groups[group_id]
            records = [GroupRecord(group_id, group_key(group_id), None)]
            offsets = set(g.offsets) | g.unstable()  # a pending offset must not outlive its group
            records += [GroupRecord(group_id, offset_key(group_id, tp), None) for tp in sorted(offsets)]
            try:
                positions = self._log.append_pending(records, fsync=True)
            except BaseException:
                self.undo_delete(PendingDelete(g, ()))
                raise
        log.info("deleted group %r and %d committed offsets", group_id, len(g.offsets))
        return PendingDelete(g, positions)

    def flush_metadata(self) -> int:
        """Write the metadata of every group changed since the last flush; return how many."""
        with self._write_lock:
            with self._lock:
                dirty = [g for g in self._groups.values() if g.dirty]
                records = [GroupRecord(g.group_id, group_key(g.group_id), json.dumps(g.metadata_doc()).encode())
                           for g in dirty]
                for g in dirty:
                    g.dirty = False
            if not records:
                return 0
            try:
                self._log.append(records, fsync=False)
            except BaseException:
                with self._lock:
                    for g in dirty:
                        if self._groups.get(g.group_id) is g:
                            g.dirty = True
                raise
            return len(records)

    def has_dirty_groups(self) -> bool:
        with self._lock:
            return any(g.dirty for g in self._groups.values())


def _check_offsets(group_id: str, offsets: Mapping[TopicPartition, tuple[int, str]]) -> None:
    """Refuse a malformed group id, a negative offset or over-long metadata (INVALID_REQUEST)."""
    validate_group_id(group_id)
    for tp, (offset, metadata) in offsets.items():
        if offset < 0:
            raise InvalidRequestError(f"committed offset of {tp} must be >= 0, got {offset}")
        if len(metadata) > 4096:
            raise InvalidRequestError(f"commit metadata of {tp} is longer than 4096 characters")
