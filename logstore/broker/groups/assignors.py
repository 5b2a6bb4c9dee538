"""Server-side partition assignors of consumer groups: ``range`` and ``uniform`` (sticky).

An assignor is a pure function from the group's members (their subscribed
topics), the partition count of every subscribed topic and the previous
*target assignment* to a new target assignment::

    assign(members, partitions, previous) -> {member_id: frozenset[TopicPartition]}

Every result satisfies, and a test checks:

* each partition of a subscribed topic goes to exactly one member that
  subscribes to its topic (a topic nobody subscribes to is not assigned);
* every member id of ``members`` is a key (possibly with an empty set);
* the result depends only on the arguments (no clock, no randomness), so the
  coordinator recomputes the same target after a restart.

``range`` (Kafka's RangeAssignor): per topic, the subscribed members sorted by
(instance id, else member id) get consecutive ranges; the first
``partitions % members`` get one more. Co-partitioned topics line up, but a
joining member shifts every range after it (many partitions move).

``uniform`` (Kafka's UniformAssignor, KIP-848's default): balanced and
sticky. Partitions stay with their previous owner when that owner is still
a member, still subscribes to the topic and is not above its fair share;
the rest go to the least loaded eligible member, and a final pass moves
partitions from the most to the least loaded eligible member until no move
can reduce the spread. With identical subscriptions every member ends with
``floor(P/M)`` or ``ceil(P/M)`` partitions and the number of partitions that
change owner is the minimum possible (a join of one member to M members of
P partitions moves ``floor(P/(M+1))`` partitions, e.g. 9 of 100 for 10 → 11).

Thread-safety: pure functions.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass

from logstore.types import TopicPartition

__all__ = [
    "MemberSubscription",
    "Assignment",
    "ASSIGNORS",
    "DEFAULT_ASSIGNOR",
    "range_assign",
    "uniform_assign",
]

# member id -> the partitions it is to own
Assignment = dict[str, frozenset[TopicPartition]]


@dataclass(frozen=True, slots=True)
class MemberSubscription:
    """What an assignor knows of a member: its subscribed topics and its static identity."""

    topics: frozenset[str]
    instance_id: str = ""


def _sort_key(member_id: str, sub: MemberSubscription) -> tuple[int, str]:
    # Static members sort by their instance id, so a restarted member keeps its place.
    return (0, sub.instance_id) if sub.instance_id else (1, member_id)


def range_assign(
    members: Mapping[str, MemberSubscription],
    partitions: Mapping[str, int],
    previous: Mapping[str, frozenset[TopicPartition]],
) -> Assignment:
    """Kafka's range assignor (see the module docstring); ``previous`` is not used."""
    out: dict[str, set[TopicPartition]] = {m: set() for m in members}
    for topic in sorted(partitions):
        count = partitions[topic]
        subscribed = sorted((m for m, s in members.items() if topic in s.topics),
                            key=lambda m: _sort_key(m, members[m]))
        if not subscribed or count <= 0:
            continue
        base, extra = divmod(count, len(subscribed))
        start = 0
        for i, m in enumerate(subscribed):
            n = base + (1 if i < extra else 0)
            out[m].update(TopicPartition(topic, p) for p in range(start, start + n))
            start += n
    return {m: frozenset(tps) for m, tps in out.items()}


def uniform_assign(
    members: Mapping[str, MemberSubscription],
    partitions: Mapping[str, int],
    previous: Mapping[str, frozenset[TopicPartition]],
) -> Assignment:
    """Balanced, sticky assignment (see the module docstring)."""
    order = sorted(members, key=lambda m: _sort_key(m, members[m]))
    rank = {m: i for i, m in enumerate(order)}
    eligible: dict[TopicPartition, list[str]] = {}
    for topic in sorted(partitions):
        subs = [m for m in order if topic in members[m].topics]
        if subs:
            for p in range(partitions[topic]):
                eligible[TopicPartition(topic, p)] = subs
    out: dict[str, set[TopicPartition]] = {m: set() for m in order}
    if not eligible:
        return {m: frozenset() for m in order}

    # Fair shares for the members that can take partitions: with identical
    # subscriptions these are exact (floor/ceil); otherwise they only cap how
    # much a member keeps, and the balancing pass below does the rest.
    active = [m for m in order if any(m in subs for subs in eligible.values())]
    base, extra = divmod(len(eligible), len(active)) if active else (0, 0)
    # Members that already hold more get the ceil shares: fewer partitions move.
    kept_before = {m: sum(1 for tp in previous.get(m, ()) if tp in eligible and m in eligible[tp])
                   for m in active}
    by_load = sorted(active, key=lambda m: (-kept_before[m], rank[m]))
    quota = {m: base + (1 if i < extra else 0) for i, m in enumerate(by_load)}

    # 1. Stickiness: keep previous partitions up to the quota (lowest partitions first).
    owner: dict[TopicPartition, str] = {}
    for m in order:
        mine = sorted(tp for tp in previous.get(m, ()) if tp in eligible and m in eligible[tp])
        for tp in mine[: quota.get(m, 0)]:
            if tp not in owner:
                owner[tp] = m
                out[m].add(tp)

    # 2. The rest, most constrained first, to the least loaded eligible member.
    free = sorted((tp for tp in eligible if tp not in owner), key=lambda tp: (len(eligible[tp]), tp))
    for tp in free:
        m = min(eligible[tp], key=lambda c: (len(out[c]) >= quota.get(c, 0), len(out[c]), rank[c]))
        owner[tp] = m
        out[m].add(tp)

    # 3. Balance: move one partition at a time from a heavier to a lighter eligible member
    # while that narrows the spread (each move lowers the sum of squared loads: it ends).
    moved = True
    while moved:
        moved = False
        for heavy in sorted(order, key=lambda c: (-len(out[c]), rank[c])):
            best: tuple[int, int, TopicPartition, str] | None = None
            for tp in out[heavy]:
                for light in eligible[tp]:
                    if len(out[light]) + 1 < len(out[heavy]):
                        cand = (len(out[light]), rank[light], tp, light)
                        if best is None or cand < best:
                            best = cand
            if best is not None:
                _, _, tp, light = best
                out[heavy].discard(tp)
                out[light].add(tp)
                moved = True
                break
    return {m: frozenset(tps) for m, tps in out.items()}


AssignorFn = Callable[
    [Mapping[str, MemberSubscription], Mapping[str, int], Mapping[str, frozenset[TopicPartition]]],
    Assignment,
]
ASSIGNORS: dict[str, AssignorFn] = {"range": range_assign, "uniform": uniform_assign}
DEFAULT_ASSIGNOR = "uniform"
