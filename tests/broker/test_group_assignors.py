"""The server-side assignors (logstore.broker.groups.assignors): validity, balance and stickiness."""

from __future__ import annotations

from collections.abc import Mapping

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from logstore.broker.groups.assignors import (
    ASSIGNORS,
    MemberSubscription,
    range_assign,
    uniform_assign,
)
from logstore.types import TopicPartition

TOPICS = ("a", "b", "c")


def check_valid(members: Mapping[str, MemberSubscription], partitions: Mapping[str, int],
                result: Mapping[str, frozenset[TopicPartition]]) -> None:
    assert set(result) == set(members)
    seen: dict[TopicPartition, str] = {}
    for m, tps in result.items():
        for tp in tps:
            assert tp not in seen, f"{tp} given to {seen[tp]} and {m}"
            assert tp.topic in members[m].topics, f"{m} got {tp} without subscribing to {tp.topic}"
            seen[tp] = m
    wanted = {TopicPartition(t, p) for t, n in partitions.items() for p in range(n)
              if any(t in s.topics for s in members.values())}
    assert set(seen) == wanted


def homogeneous(n: int, topics: tuple[str, ...] = ("a",)) -> dict[str, MemberSubscription]:
    return {f"m{i:02d}": MemberSubscription(frozenset(topics)) for i in range(n)}


subscriptions = st.dictionaries(
    st.text("xyz", min_size=1, max_size=3),
    st.frozensets(st.sampled_from(TOPICS), max_size=3).map(MemberSubscription),
    max_size=6,
)
partition_counts = st.fixed_dictionaries({t: st.integers(0, 9) for t in TOPICS})


@settings(max_examples=200, deadline=None)
@given(subscriptions, partition_counts, st.data())
def test_every_assignor_gives_each_partition_to_exactly_one_subscriber(members, partitions, data) -> None:  # type: ignore[no-untyped-def]
    for name, assign in ASSIGNORS.items():
        # A previous assignment that may be stale or invalid (departed members, other topics).
        previous = data.draw(st.dictionaries(
            st.sampled_from(sorted(members) + ["gone"]),
            st.frozensets(st.builds(TopicPartition, st.sampled_from(TOPICS), st.integers(0, 9)), max_size=6),
        ), label=f"previous-{name}")
        result = assign(members, partitions, previous)
        check_valid(members, partitions, result)
        assert assign(members, partitions, previous) == result, "assignors are deterministic"


@settings(max_examples=200, deadline=None)
@given(st.integers(1, 12), st.integers(0, 60), st.integers(1, 3))
def test_uniform_balances_identical_subscriptions_to_within_one(members, partitions, topics) -> None:  # type: ignore[no-untyped-def]
    subs = homogeneous(members, TOPICS[:topics])
    counts = dict.fromkeys(TOPICS[:topics], partitions)
    result = uniform_assign(subs, counts, {})
    sizes = [len(v) for v in result.values()]
    assert max(sizes) - min(sizes) <= 1


@pytest.mark.parametrize(("members", "partitions"), [(10, 100), (3, 12), (4, 7), (1, 5), (7, 3)])
def test_uniform_join_moves_the_minimum(members: int, partitions: int) -> None:
    subs = homogeneous(members)
    before = uniform_assign(subs, {"a": partitions}, {})
    subs["zz-new"] = MemberSubscription(frozenset({"a"}))
    after = uniform_assign(subs, {"a": partitions}, before)
    moved = sum(len(before[m] - after[m]) for m in before)
    assert moved == partitions // (members + 1) == len(after["zz-new"])
    # Nobody gains except the newcomer: members that keep their partitions are untouched.
    assert all(after[m] <= before[m] for m in before)


def test_uniform_leave_moves_only_the_departed_members_partitions() -> None:
    subs = homogeneous(3)
    before = uniform_assign(subs, {"a": 12}, {})
    assert sorted(len(v) for v in before.values()) == [4, 4, 4]
    gone = "m01"
    del subs[gone]
    after = uniform_assign(subs, {"a": 12}, before)
    for m in subs:
        assert before[m] <= after[m]
    assert sorted(len(v) for v in after.values()) == [6, 6]


def test_uniform_heterogeneous_subscriptions() -> None:
    subs = {"m1": MemberSubscription(frozenset({"a"})), "m2": MemberSubscription(frozenset({"a", "b"})),
            "m3": MemberSubscription(frozenset({"b"}))}
    result = uniform_assign(subs, {"a": 4, "b": 4}, {})
    check_valid(subs, {"a": 4, "b": 4}, result)
    assert sorted(len(v) for v in result.values()) == [2, 3, 3]


def test_range_gives_consecutive_ranges_per_topic() -> None:
    subs = homogeneous(3, ("a", "b"))
    result = range_assign(subs, {"a": 7, "b": 3}, {})
    assert result["m00"] == {TopicPartition("a", p) for p in (0, 1, 2)} | {TopicPartition("b", 0)}
    assert result["m01"] == {TopicPartition("a", p) for p in (3, 4)} | {TopicPartition("b", 1)}
    assert result["m02"] == {TopicPartition("a", p) for p in (5, 6)} | {TopicPartition("b", 2)}


def test_range_orders_static_members_by_instance_id() -> None:
    subs = {"zzz": MemberSubscription(frozenset({"a"}), "host-1"),
            "aaa": MemberSubscription(frozenset({"a"}), "host-2")}
    result = range_assign(subs, {"a": 2}, {})
    assert result["zzz"] == {TopicPartition("a", 0)} and result["aaa"] == {TopicPartition("a", 1)}
