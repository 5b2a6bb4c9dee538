"""A group's target assignment and the incremental reconciliation towards it.

What :class:`~logstore.broker.groups.coordinator.GroupCoordinator` does to a group
after a heartbeat changed it (its module docstring draws the state machine):
:func:`refresh_partitions` notices subscribed topics that grew, :func:`merge_bumps`
keeps one request's changes to one group epoch, and :func:`reconcile` computes a
new target with the group's assignor at a new group epoch, then revokes what each
member must give up before it grants anything, and grants only partitions no member
owns. :func:`member_states` and :func:`changed_members` tell which members' answers
changed (so their heartbeats can be answered at once).

Thread-safety: pure functions of a :class:`~logstore.broker.groups.state.GroupState`;
the coordinator calls them under its lock.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Callable, Mapping

from logstore.broker.groups.assignors import ASSIGNORS, MemberSubscription
from logstore.broker.groups.model import NO_PARTITIONS, MemberKey, TPs
from logstore.broker.groups.state import GroupState

__all__ = ["changed_members", "choose_assignor", "member_states", "merge_bumps", "reconcile",
           "refresh_partitions"]


def refresh_partitions(group: GroupState, topic_partitions: Callable[[str], int | None]) -> None:
    """Bump the group epoch when a subscribed topic's partition count (``topic_partitions``;
    None: no such topic) is not the one the target was computed for."""
    if not group.members:
        return  # nothing to assign; the next member's join looks again
    topics = set().union(*(m.subscriptions for m in group.members.values()))
    current: dict[str, int] = {}
    for topic in sorted(topics):
        n = topic_partitions(topic)
        if n:
            current[topic] = n
    if current != group.partitions:
        group.partitions = current
        group.bump()


def merge_bumps(group: GroupState, epoch_before: int) -> None:
    """Several changes made by one request move the group epoch by one."""
    if group.group_epoch > epoch_before + 1:
        group.group_epoch = epoch_before + 1


def choose_assignor(group: GroupState, default: str) -> str:
    """The assignor most members name (ties: the first name), else ``default``."""
    votes = Counter(m.assignor for m in group.members.values() if m.assignor)
    if not votes:
        return default
    return min(votes, key=lambda name: (-votes[name], name))


def reconcile(group: GroupState, now: float, *, default_assignor: str) -> None:
    """Move every member towards the target: revoke first, grant only free partitions."""
    if group.assignment_epoch < group.group_epoch:
        group.assignor = choose_assignor(group, default_assignor)
        subs = {m.member_id: MemberSubscription(m.subscriptions, m.instance_id)
                for m in group.members.values()}
        group.target = ASSIGNORS[group.assignor](subs, group.partitions, group.target)
        group.assignment_epoch = group.group_epoch
        group.dirty = True
    members = sorted(group.members.values(), key=lambda m: m.member_id)
    for m in members:
        target = group.target.get(m.member_id, NO_PARTITIONS)
        to_revoke = m.assigned - target
        if not to_revoke:
            continue
        m.assigned -= to_revoke
        if not m.left:  # a static member away consumes nothing: its reserved partitions are free
            m.revoking |= to_revoke
            if m.revoke_deadline is None:
                m.revoke_deadline = now + m.rebalance_timeout_ms
        group.dirty = True
    owners = group.owner_map()
    for m in members:
        if m.revoking or m.left:
            continue
        if m.member_epoch != group.assignment_epoch:
            m.member_epoch = group.assignment_epoch
            group.dirty = True
        grant = frozenset(tp for tp in group.target.get(m.member_id, NO_PARTITIONS) - m.assigned
                          if tp not in owners)
        if grant:
            m.assigned |= grant
            owners.update(dict.fromkeys(grant, m.member_id))
            group.dirty = True


def member_states(group: GroupState) -> dict[str, tuple[int, TPs]]:
    """Each member's epoch and assigned partitions, by member id."""
    return {mid: (m.member_epoch, m.assigned) for mid, m in group.members.items()}


def changed_members(group: GroupState, before: Mapping[str, tuple[int, TPs]]) -> frozenset[MemberKey]:
    """The members whose epoch or assignment differ from ``before`` (:func:`member_states`)."""
    after = member_states(group)
    keys = set(before) | set(after)
    return frozenset((group.group_id, k) for k in keys if before.get(k) != after.get(k))
