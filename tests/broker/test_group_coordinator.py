"""The group coordinator state machine (logstore.broker.groups.coordinator), driven by heartbeats and a
hand-moved clock, against the in-memory GroupLog.

The invariant checked after every step (``check``): each partition is owned — assigned or still
being revoked — by at most one member, at the coordinator and at the (simulated) members.
"""

from __future__ import annotations

import json
import random
from collections.abc import Iterable

import pytest

from logstore.broker.groups.coordinator import GroupCoordinator
from logstore.broker.groups.model import (
    EMPTY,
    JOIN_EPOCH,
    LEAVE_EPOCH,
    RECONCILING,
    STABLE,
    TEMPORARY_LEAVE_EPOCH,
    GroupConfig,
    Heartbeat,
)
from logstore.broker.groups.records import MemoryGroupLog
from logstore.errors import (
    FencedInstanceIdError,
    FencedMemberEpochError,
    GroupIdNotFoundError,
    InvalidConfigError,
    InvalidGroupIdError,
    NonEmptyGroupError,
    StaleMemberEpochError,
    UnknownMemberIdError,
)
from logstore.types import TopicPartition

SESSION_MS = 3_000
INTERVAL_MS = 500
G = "g"


class Clock:
    def __init__(self) -> None:
        self.now_s = 1000.0

    def __call__(self) -> float:
        return self.now_s

    def advance(self, ms: float) -> None:
        self.now_s += ms / 1000


class Member:
    """A well-behaved member: it gives up revoked partitions and takes new ones as soon as told."""

    def __init__(self, name: str, topics: Iterable[str] = ("t",), instance_id: str = "") -> None:
        self.name = name
        self.member_id = f"id-{name}"
        self.instance_id = instance_id
        self.topics = tuple(topics)
        self.epoch = JOIN_EPOCH
        self.owned: frozenset[TopicPartition] = frozenset()
        self.seq = 0
        self.revoked_seen: set[TopicPartition] = set()


class Sim:
    def __init__(self, partitions: dict[str, int] | None = None, *, assignor: str = "uniform",
                 log: MemoryGroupLog | None = None) -> None:
        self.clock = Clock()
        self.partitions = dict(partitions or {"t": 12})
        self.log = log or MemoryGroupLog()
        self.coord = GroupCoordinator(
            GroupConfig(session_timeout_ms=SESSION_MS, heartbeat_interval_ms=INTERVAL_MS, default_assignor=assignor),
            log=self.log, topic_partitions=self.partitions.get, clock=self.clock,
        )
        self.members: dict[str, Member] = {}

    def add(self, name: str, **kw: object) -> Member:
        m = self.members[name] = Member(name, **kw)  # type: ignore[arg-type]
        return m

    def hb(self, m: Member, *, ack: bool = True, epoch: int | None = None) -> frozenset[TopicPartition]:
        m.seq += 1
        out = self.coord.heartbeat(Heartbeat(
            G, m.member_id, m.epoch if epoch is None else epoch, instance_id=m.instance_id,
            subscribed_topics=m.topics, owned=m.owned, request_seq=m.seq, rebalance_timeout_ms=2_000,
        ))
        assert out.state is not None
        m.epoch = out.state.member_epoch
        if ack:
            m.revoked_seen |= m.owned - out.state.assignment
            m.owned = out.state.assignment
        self.check()
        return out.state.assignment

    def leave(self, m: Member, epoch: int = LEAVE_EPOCH) -> None:
        self.coord.heartbeat(Heartbeat(G, m.member_id, epoch, instance_id=m.instance_id))
        m.owned = frozenset()
        del self.members[m.name]
        self.check()

    def settle(self, rounds: int = 10) -> None:
        for _ in range(rounds):
            for m in list(self.members.values()):
                self.hb(m)
        assert self.coord.describe_group(G).state == STABLE

    def check(self) -> None:
        try:
            snap = self.coord.describe_group(G)
        except GroupIdNotFoundError:
            return
        seen: dict[TopicPartition, str] = {}
        for m in snap.members:
            for tp in m.assigned | m.revoking:
                assert tp not in seen, f"{tp} owned by {seen[tp]} and {m.member_id}"
                seen[tp] = m.member_id
        # What members consume: an evicted member (a zombie until its next heartbeat fails)
        # is excluded — its commits are fenced instead (test_commits_are_fenced).
        live = {m.member_id for m in snap.members}
        held: dict[TopicPartition, str] = {}
        for m in self.members.values():
            if m.member_id not in live:
                continue
            for tp in m.owned:
                assert tp not in held, f"members {held[tp]} and {m.name} both consume {tp}"
                held[tp] = m.name

    def counts(self) -> dict[str, int]:
        return {m.name: len(m.owned) for m in self.members.values()}


def tps(*ps: int, topic: str = "t") -> frozenset[TopicPartition]:
    return frozenset(TopicPartition(topic, p) for p in ps)


# --------------------------------------------------------------------------- membership


def test_three_members_split_twelve_partitions_evenly() -> None:
    sim = Sim()
    for name in "abc":
        sim.hb(sim.add(name))
    sim.settle()
    assert sorted(sim.counts().values()) == [4, 4, 4]
    owned = [tp for m in sim.members.values() for tp in m.owned]
    assert sorted(owned) == sorted(tps(*range(12)))
    snap = sim.coord.describe_group(G)
    assert {m.member_epoch for m in snap.members} == {snap.assignment_epoch}


def test_join_revokes_before_it_assigns_and_leaves_the_rest_running() -> None:
    sim = Sim()
    a_m = sim.add("a")
    sim.hb(a_m)
    sim.hb(sim.add("b"))
    sim.settle()
    before = {n: m.owned for n, m in sim.members.items()}
    for m in sim.members.values():
        m.revoked_seen.clear()
    c = sim.add("c")
    assert sim.hb(c) == frozenset()          # nothing is free yet: a and b still own everything
    # a is told to give up some partitions; until it reports back, c gets none of them.
    got_a = sim.hb(a_m, ack=False)
    revoked_a = before["a"] - got_a
    assert revoked_a and got_a <= before["a"]
    assert not (sim.hb(c) & revoked_a)
    sim.hb(a_m)  # applies the revocation ...
    sim.hb(a_m)  # ... and reports it
    assert revoked_a <= sim.hb(c)
    sim.settle()
    assert sorted(sim.counts().values()) == [4, 4, 4]
    # Only moved partitions were revoked; kept ones never left their owner.
    for n in "ab":
        assert before[n] - sim.members[n].owned == sim.members[n].revoked_seen


def test_graceful_leave_hands_partitions_over_at_once() -> None:
    sim = Sim()
    for name in "abc":
        sim.hb(sim.add(name))
    sim.settle()
    gone = sim.members["b"].owned
    sim.leave(sim.members["b"])
    # No timeout involved: the next heartbeats of a and c take b's partitions.
    sim.hb(sim.members["a"])
    sim.hb(sim.members["c"])
    assert gone <= sim.members["a"].owned | sim.members["c"].owned
    assert sorted(sim.counts().values()) == [6, 6]


def test_session_timeout_evicts_a_silent_member() -> None:
    sim = Sim()
    for name in "abc":
        sim.hb(sim.add(name))
    sim.settle()
    dead = sim.members.pop("c")
    for _ in range(4):
        sim.clock.advance(SESSION_MS / 4 - 1)
        assert not sim.coord.tick()
        for m in sim.members.values():
            sim.hb(m)
    sim.clock.advance(10)
    changed = sim.coord.tick()
    assert (G, dead.member_id) in changed
    sim.settle()
    assert sorted(sim.counts().values()) == [6, 6]
    with pytest.raises(UnknownMemberIdError):
        sim.coord.heartbeat(Heartbeat(G, dead.member_id, dead.epoch, subscribed_topics=("t",)))


def test_a_member_that_does_not_revoke_in_time_is_evicted() -> None:
    sim = Sim()
    a = sim.add("a")
    sim.hb(a)
    sim.settle()
    b = sim.add("b")
    sim.hb(b)
    sim.hb(a, ack=False)  # told to revoke, never reports back (but keeps heartbeating)
    for _ in range(5):
        sim.clock.advance(500)
        sim.coord.tick()
        if a.member_id not in {m.member_id for m in sim.coord.describe_group(G).members}:
            break
        sim.coord.heartbeat(Heartbeat(G, a.member_id, a.epoch, subscribed_topics=("t",), owned=a.owned,
                                      request_seq=a.seq, rebalance_timeout_ms=2_000))
    assert [m.member_id for m in sim.coord.describe_group(G).members] == [b.member_id]
    a.owned = frozenset()
    del sim.members["a"]
    sim.settle()
    assert sim.counts() == {"b": 12}


def test_rejoin_with_epoch_zero_releases_what_the_member_had() -> None:
    sim = Sim()
    for name in "ab":
        sim.hb(sim.add(name))
    sim.settle()
    a = sim.members["a"]
    a.owned, a.epoch = frozenset(), JOIN_EPOCH  # the client dropped everything (it was fenced)
    sim.hb(a)
    sim.settle()
    assert sorted(sim.counts().values()) == [6, 6]


def test_heartbeat_with_a_newer_epoch_is_fenced() -> None:
    sim = Sim()
    a = sim.add("a")
    sim.hb(a)
    with pytest.raises(FencedMemberEpochError):
        sim.hb(a, epoch=a.epoch + 5)


def test_late_request_does_not_acknowledge_a_revocation() -> None:
    sim = Sim()
    a = sim.add("a")
    sim.hb(a)
    sim.settle()
    b = sim.add("b")
    sim.hb(b)
    old = sim.coord.heartbeat(Heartbeat(G, a.member_id, a.epoch, subscribed_topics=("t",), owned=a.owned,
                                        request_seq=a.seq + 1))
    assert old.state is not None and old.state.assignment < a.owned
    a.seq += 1
    # A request older than the last one, claiming to own nothing, must not free a's partitions.
    sim.coord.heartbeat(Heartbeat(G, a.member_id, a.epoch, subscribed_topics=("t",), owned=frozenset(),
                                  request_seq=a.seq - 1))
    assert sim.hb(b) == frozenset()


def test_heartbeat_outcome_says_when_the_answer_can_be_held() -> None:
    sim = Sim()
    a = sim.add("a")
    sim.hb(a)
    out = sim.coord.heartbeat(Heartbeat(G, a.member_id, a.epoch, subscribed_topics=("t",), owned=a.owned,
                                        request_seq=99))
    assert out.in_sync and not out.changed
    b = sim.add("b")
    out = sim.coord.heartbeat(Heartbeat(G, b.member_id, JOIN_EPOCH, subscribed_topics=("t",), request_seq=1))
    assert not out.in_sync
    assert (G, a.member_id) in out.changed  # a must be told to revoke: its held heartbeat is woken


# --------------------------------------------------------------------------- static membership


def test_static_member_restart_keeps_its_partitions_without_a_reshuffle() -> None:
    sim = Sim()
    for name in "abc":
        sim.hb(sim.add(name, instance_id=f"host-{name}"))
    sim.settle()
    b = sim.members["b"]
    mine, epoch = b.owned, sim.coord.describe_group(G).group_epoch
    sim.leave(b, TEMPORARY_LEAVE_EPOCH)
    for _ in range(3):
        sim.clock.advance(500)
        sim.coord.tick()
        for m in sim.members.values():
            sim.hb(m)
    assert sim.members["a"].owned.isdisjoint(mine) and sim.members["c"].owned.isdisjoint(mine)
    again = sim.add("b2", instance_id="host-b")
    assert sim.hb(again) == mine
    assert sim.coord.describe_group(G).group_epoch == epoch
    sim.settle()
    assert again.owned == mine


def test_static_member_replaced_without_leaving_fences_the_old_process() -> None:
    sim = Sim()
    for name in "ab":
        sim.hb(sim.add(name, instance_id=f"host-{name}"))
    sim.settle()
    old = sim.members.pop("b")  # kill -9: no leave
    new = sim.add("b-new", instance_id="host-b")
    assert sim.hb(new) == old.owned
    with pytest.raises(FencedInstanceIdError):
        sim.coord.heartbeat(Heartbeat(G, old.member_id, old.epoch, instance_id="host-b", subscribed_topics=("t",)))
    with pytest.raises(FencedInstanceIdError):
        sim.coord.commit_offsets(G, old.member_id, old.epoch, {next(iter(old.owned)): (5, "")})


def test_static_member_that_does_not_return_is_evicted_after_the_session() -> None:
    sim = Sim()
    for name in "ab":
        sim.hb(sim.add(name, instance_id=f"host-{name}"))
    sim.settle()
    sim.leave(sim.members["b"], TEMPORARY_LEAVE_EPOCH)
    a = sim.members["a"]
    for _ in range(8):
        sim.clock.advance(500)
        sim.coord.tick()
        sim.hb(a)
    assert len(a.owned) == 12


# --------------------------------------------------------------------------- commits


def test_commits_are_fenced() -> None:
    sim = Sim()
    for name in "ab":
        sim.hb(sim.add(name))
    sim.settle()
    a, b = sim.members["a"], sim.members["b"]
    tp_a, tp_b = min(a.owned), min(b.owned)
    sim.coord.commit_offsets(G, a.member_id, a.epoch, {tp_a: (10, "meta")})
    assert sim.coord.fetch_offsets(G, [tp_a])[tp_a].offset == 10
    with pytest.raises(StaleMemberEpochError):  # b's partition
        sim.coord.commit_offsets(G, a.member_id, a.epoch, {tp_b: (10, "")})
    with pytest.raises(FencedMemberEpochError):
        sim.coord.commit_offsets(G, a.member_id, a.epoch + 1, {tp_a: (11, "")})
    with pytest.raises(NonEmptyGroupError):  # from outside while the group is active
        sim.coord.commit_offsets(G, "", -1, {tp_a: (0, "")})
    # a goes silent and is evicted: the zombie cannot commit over b, who now owns tp_a.
    del sim.members["a"]
    sim.clock.advance(SESSION_MS + 1)
    sim.hb(b)
    sim.coord.tick()
    sim.settle()
    assert tp_a in b.owned
    sim.coord.commit_offsets(G, b.member_id, b.epoch, {tp_a: (12, "")})
    with pytest.raises(UnknownMemberIdError):
        sim.coord.commit_offsets(G, a.member_id, a.epoch, {tp_a: (99, "")})
    assert sim.coord.fetch_offsets(G, [tp_a])[tp_a].offset == 12


def test_a_member_may_commit_partitions_it_is_revoking() -> None:
    sim = Sim()
    a = sim.add("a")
    sim.hb(a)
    sim.settle()
    sim.hb(sim.add("b"))
    before = a.owned
    now = sim.hb(a, ack=False)
    revoking = before - now
    sim.coord.commit_offsets(G, a.member_id, a.epoch, dict.fromkeys(revoking, (3, "")))
    sim.hb(a)
    sim.hb(a)
    with pytest.raises(StaleMemberEpochError):
        sim.coord.commit_offsets(G, a.member_id, a.epoch, dict.fromkeys(revoking, (4, "")))


def test_commit_that_fails_to_reach_the_log_is_not_visible() -> None:
    sim = Sim()
    sim.log.fail = OSError("disk full")
    with pytest.raises(OSError):
        sim.coord.commit_offsets(G, "", -1, {TopicPartition("t", 0): (5, "")})
    assert sim.coord.fetch_offsets(G) == {}


def test_bad_group_ids_and_assignors_are_refused() -> None:
    sim = Sim()
    for bad in ("", "x" * 300, "a\nb"):
        with pytest.raises(InvalidGroupIdError):
            sim.coord.heartbeat(Heartbeat(bad, "m", JOIN_EPOCH))
    with pytest.raises(InvalidConfigError):
        sim.coord.heartbeat(Heartbeat(G, "m", JOIN_EPOCH, assignor="roundrobin"))
    with pytest.raises(InvalidConfigError):
        GroupConfig(session_timeout_ms=100, heartbeat_interval_ms=100)


# --------------------------------------------------------------------------- assignors and metadata


def test_range_assignor_is_the_groups_choice_when_members_ask_for_it() -> None:
    sim = Sim(assignor="range")
    for name in "ab":
        sim.hb(sim.add(name))
    sim.settle()
    assert sim.members["a"].owned == tps(*range(6)) and sim.members["b"].owned == tps(*range(6, 12))
    assert sim.coord.describe_group(G).assignor == "range"


def test_new_partitions_and_topics_are_assigned() -> None:
    sim = Sim({"t": 2})
    for name in "ab":
        sim.hb(sim.add(name, topics=("t", "u")))
    sim.settle()
    sim.partitions["t"] = 4
    sim.partitions["u"] = 2
    sim.coord.tick()
    sim.settle()
    assert sorted(sim.counts().values()) == [3, 3]


# --------------------------------------------------------------------------- persistence


def test_offsets_and_members_are_rebuilt_from_the_log() -> None:
    sim = Sim()
    for name in "ab":
        sim.hb(sim.add(name, instance_id=f"host-{name}"))
    sim.settle()
    a = sim.members["a"]
    sim.coord.commit_offsets(G, a.member_id, a.epoch, {min(a.owned): (7, "x")})
    assert sim.coord.flush_metadata() == 1
    assert sim.coord.flush_metadata() == 0
    again = GroupCoordinator(sim.coord.config, log=sim.log, topic_partitions=sim.partitions.get, clock=sim.clock)
    again.startup()
    assert again.fetch_offsets(G)[min(a.owned)].offset == 7
    snap = again.describe_group(G)
    assert {m.member_id: m.assigned for m in snap.members} == {m.member_id: m.owned for m in sim.members.values()}
    # The members carry on with their epochs: no rejoin, no reshuffle.
    sim.coord = again
    for m in sim.members.values():
        before = m.owned
        assert sim.hb(m) == before


def test_delete_group_writes_tombstones_and_refuses_active_groups() -> None:
    sim = Sim()
    a = sim.add("a")
    sim.hb(a)
    with pytest.raises(NonEmptyGroupError):
        sim.coord.delete_group(G)
    sim.coord.commit_offsets(G, a.member_id, a.epoch, {min(a.owned): (3, "")})
    sim.leave(a)
    sim.coord.flush_metadata()
    sim.coord.delete_group(G)
    with pytest.raises(GroupIdNotFoundError):
        sim.coord.describe_group(G)
    keys = {json.loads(r.key)[0] for r in sim.log.records if r.value is None}
    assert keys == {"group", "offset"}
    again = GroupCoordinator(sim.coord.config, log=sim.log, topic_partitions=sim.partitions.get, clock=sim.clock)
    again.startup()
    assert again.list_groups() == []
    with pytest.raises(GroupIdNotFoundError):
        again.delete_group(G)


class ReplicatedGroupLog(MemoryGroupLog):
    """A group log whose appends are durable only once "replicas" follow (a cluster's)."""

    def __init__(self) -> None:
        super().__init__()
        self.waits: list[tuple] = []

    def append_pending(self, records, *, fsync):  # type: ignore[no-untyped-def]
        self.append(records, fsync=fsync)
        return (("__consumer_offsets", 0, len(self.records)),)

    def wait_durable(self, positions) -> None:  # type: ignore[no-untyped-def]
        self.waits.append(tuple(positions))


def test_a_deletion_is_appended_without_waiting_and_can_be_undone() -> None:
    """The broker waits for a deletion's replicas on its event loop (as for a commit), not on
    an I/O thread: the coordinator appends and returns where to wait; a failed wait undoes it."""
    log = ReplicatedGroupLog()
    sim = Sim(log=log)
    a = sim.add("a")
    sim.hb(a)
    sim.coord.commit_offsets(G, a.member_id, a.epoch, {min(a.owned): (3, "")})
    sim.leave(a)
    log.waits.clear()
    pending = sim.coord.delete_group(G)
    assert log.waits == [] and pending.positions == (("__consumer_offsets", 0, len(log.records)),)
    with pytest.raises(GroupIdNotFoundError):
        sim.coord.describe_group(G)
    sim.coord.undo_delete(pending)          # its replicas did not follow: the group is back
    assert sim.coord.describe_group(G).offsets
    sim.coord.delete_group(G)
    with pytest.raises(GroupIdNotFoundError):
        sim.coord.describe_group(G)


def test_group_states() -> None:
    sim = Sim()
    a = sim.add("a")
    sim.hb(a)
    sim.settle()
    sim.hb(sim.add("b"))
    assert sim.coord.describe_group(G).state == RECONCILING
    sim.settle()
    for m in list(sim.members.values()):
        sim.leave(m)
    assert sim.coord.describe_group(G).state == EMPTY
    assert [(g.group_id, g.state, g.members) for g in sim.coord.list_groups()] == [(G, EMPTY, 0)]


# --------------------------------------------------------------------------- a random walk


@pytest.mark.parametrize("seed", range(12))
def test_random_walk_keeps_ownership_exclusive_and_converges(seed: int) -> None:
    rng = random.Random(seed)
    sim = Sim({"t": rng.randint(1, 16), "u": rng.randint(0, 5)})
    serial = 0
    for _ in range(300):
        op = rng.random()
        live = list(sim.members.values())
        if op < 0.12 or not live:
            serial += 1
            static = rng.random() < 0.3
            m = sim.add(f"m{serial}", topics=rng.choice([("t",), ("t", "u"), ("u",)]),
                        instance_id=f"i{rng.randint(0, 3)}" if static else "")
            try:
                sim.hb(m)
            except Exception:
                del sim.members[m.name]
                raise
            # A static join may replace a member with the same instance id: that process is a zombie now.
            for other in live:
                if m.instance_id and other.instance_id == m.instance_id:
                    other.owned = frozenset()
                    del sim.members[other.name]
        elif op < 0.18:
            sim.leave(rng.choice(live), rng.choice([LEAVE_EPOCH, TEMPORARY_LEAVE_EPOCH]))
        elif op < 0.24:
            m = rng.choice(live)  # crash: the coordinator finds out at the session timeout
            m.owned = frozenset()
            del sim.members[m.name]
        elif op < 0.32:
            sim.clock.advance(rng.choice([100, 1_000, 2_500]))
            sim.coord.tick()
            sim.check()
        else:
            m = rng.choice(live)
            try:
                sim.hb(m, ack=rng.random() < 0.8)
            except (UnknownMemberIdError, FencedMemberEpochError, FencedInstanceIdError):
                m.owned, m.epoch, m.seq = frozenset(), JOIN_EPOCH, 0
                sim.hb(m)
    # Quiet down: every live member heartbeats and acknowledges; crashed ones time out.
    for _ in range(12):
        sim.clock.advance(400)
        sim.coord.tick()
        for m in list(sim.members.values()):
            try:
                sim.hb(m)
            except (UnknownMemberIdError, FencedMemberEpochError, FencedInstanceIdError):
                m.owned, m.epoch, m.seq = frozenset(), JOIN_EPOCH, 0
                sim.hb(m)
    snap = sim.coord.describe_group(G)
    assert snap.state in (STABLE, EMPTY)
    live_ids = {m.member_id for m in sim.members.values()}
    assert {m.member_id for m in snap.members} == live_ids
    for m in snap.members:
        assert m.assigned == m.target and not m.revoking
