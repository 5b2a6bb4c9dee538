"""Replica placement (replication/placement.py): Kafka's layout, balance, rack spread, errors."""

from __future__ import annotations

from collections import Counter

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from logstore.errors import InvalidReplicationFactorError
from replication.placement import assign_replicas
from replication.state import BrokerRegistration


def brokers(ids: list[int], racks: list[str] | None = None) -> list[BrokerRegistration]:
    racks = racks or [""] * len(ids)
    return [BrokerRegistration(i, "127.0.0.1", 9000 + i, r) for i, r in zip(ids, racks, strict=True)]


def test_the_layout_is_kafkas() -> None:
    """The example in Kafka's AdminUtils docs: 5 brokers, 10 partitions, RF 3, start 0."""
    got = assign_replicas(10, 3, brokers([4, 2, 0, 3, 1]), start=0)
    assert got[0] == [0, 1, 2] and got[1] == [1, 2, 3] and got[4] == [4, 0, 1]
    assert got[5] == [0, 2, 3] and got[6] == [1, 3, 4] and got[9] == [4, 1, 2]


@settings(max_examples=150, deadline=None)
@given(n=st.integers(1, 9), data=st.data())
def test_leaders_and_replicas_spread_evenly(n: int, data: st.DataObject) -> None:
    ids = data.draw(st.lists(st.integers(0, 1000), min_size=n, max_size=n, unique=True))
    rf = data.draw(st.integers(1, n))
    partitions = data.draw(st.integers(1, 40))
    start = data.draw(st.none() | st.integers(0, n - 1))
    got = assign_replicas(partitions, rf, brokers(ids), start=start)
    assert sorted(got) == list(range(partitions))
    for replicas in got.values():
        assert len(replicas) == rf and len(set(replicas)) == rf and set(replicas) <= set(ids)
    leaders = Counter(r[0] for r in got.values())
    counts = Counter(b for r in got.values() for b in r)
    if partitions >= n:
        assert max(leaders.values()) - min(leaders[i] for i in ids) <= 1
        assert max(counts.values()) - min(counts[i] for i in ids) <= rf
    if partitions % n == 0:
        assert set(counts.values()) == {partitions * rf // n}


def test_a_brokers_followers_are_not_all_on_one_peer() -> None:
    """With n(n-1) partitions at RF 2 every (leader, follower) pair occurs exactly once, so a dead
    broker's leaderships move to all its peers, not one."""
    n = 5
    got = assign_replicas(n * (n - 1), 2, brokers(list(range(n))), start=3)
    pairs = Counter((r[0], r[1]) for r in got.values())
    assert len(pairs) == n * (n - 1) and set(pairs.values()) == {1}


@settings(max_examples=150, deadline=None)
@given(data=st.data())
def test_racks_each_partition_spans_as_many_racks_as_it_can(data: st.DataObject) -> None:
    num_racks = data.draw(st.integers(1, 4))
    n = data.draw(st.integers(num_racks, 9))
    racks = [f"r{i % num_racks}" for i in range(n)]
    racks = data.draw(st.permutations(racks))
    rf = data.draw(st.integers(1, n))
    partitions = data.draw(st.integers(1, 30))
    bs = brokers(list(range(10, 10 + n)), list(racks))
    rack_of = {b.node_id: b.rack for b in bs}
    got = assign_replicas(partitions, rf, bs, start=data.draw(st.none() | st.integers(0, n - 1)))
    for p, replicas in got.items():
        assert len(set(replicas)) == rf, (p, replicas)
        assert len({rack_of[r] for r in replicas}) == min(rf, num_racks), (p, replicas, rack_of)
    if partitions >= n:
        leaders = Counter(r[0] for r in got.values())
        assert max(leaders.values()) - min(leaders[b.node_id] for b in bs) <= 1


def test_three_racks_of_two_put_every_partition_on_three_racks() -> None:
    bs = brokers([1, 2, 3, 4, 5, 6], ["a", "a", "b", "b", "c", "c"])
    got = assign_replicas(12, 3, bs, start=0)
    rack = {b.node_id: b.rack for b in bs}
    assert all(sorted(rack[r] for r in reps) == ["a", "b", "c"] for reps in got.values())


def test_racks_are_ignored_unless_every_broker_has_one() -> None:
    bs = brokers([1, 2, 3], ["a", "a", ""])
    assert assign_replicas(3, 2, bs, start=0) == assign_replicas(3, 2, brokers([1, 2, 3]), start=0)


@pytest.mark.parametrize("rf", [0, -1, 4])
def test_an_impossible_replication_factor_names_both_numbers(rf: int) -> None:
    with pytest.raises(InvalidReplicationFactorError, match=f"replication factor {rf} .* 3 live broker"):
        assign_replicas(1, rf, brokers([1, 2, 3]))


def test_without_a_start_the_leaders_vary() -> None:
    firsts = {assign_replicas(1, 1, brokers([1, 2, 3, 4]))[0][0] for _ in range(200)}
    assert firsts == {1, 2, 3, 4}
