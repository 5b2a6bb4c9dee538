"""The controller (replication/controller.py): its decisions as a pure function, then the
controller itself on a real etcd, with brokers as metadata sessions (DESIGN.md §4b).

Decision rules are numbered as in the module docstring of replication/controller.py.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Awaitable, Callable
from typing import TypeVar

import pytest
from etcd_helpers import cluster_id, etcd  # noqa: F401

from logstore.dev.etcd_process import EtcdServer
from replication.controller import (
    Controller,
    PartitionChange,
    decide,
    decide_partition,
    leaderships_to_move,
)
from replication.metadata_store import MetadataStore
from replication.state import (
    NO_LEADER,
    BrokerRegistration,
    ClusterView,
    PartitionState,
    TopicRecord,
)

T = TypeVar("T")


def state(replicas: tuple[int, ...], leader: int, isr: tuple[int, ...], *, leader_epoch: int = 3,
          partition_epoch: int = 7, topic: str = "orders", partition: int = 0) -> PartitionState:
    return PartitionState(topic, partition, replicas, leader, leader_epoch, isr, partition_epoch, revision=42)


def decided(s: PartitionState, alive: set[int], shutting: frozenset[int] = frozenset(),
            unclean: bool = False) -> PartitionChange | None:
    return decide_partition(s, alive=alive, shutting_down=shutting, unclean_allowed=unclean)


# ---------------------------------------------------------------- decisions (pure)


def test_rule1_a_dead_leader_is_replaced_by_the_first_live_isr_replica() -> None:
    change = decided(state((1, 2, 3), 1, (1, 3, 2)), alive={2, 3})
    assert change is not None and change.before.revision == 42
    after = change.after
    # Replica order, not ISR order, picks the leader: 2 comes before 3 in the replicas.
    assert (after.leader, after.isr, after.leader_epoch, after.partition_epoch) == (2, (3, 2), 4, 8)
    assert change.describe() == "orders-0: leader 1 -> 2 (epoch 4), isr [1, 3, 2] -> [3, 2]"


def test_rule1_a_replica_outside_the_isr_is_not_elected() -> None:
    change = decided(state((1, 2, 3), 1, (1, 3)), alive={2, 3})
    assert change is not None and change.after.leader == 3 and change.after.isr == (3,)


def test_rule2_no_live_isr_member_takes_the_partition_offline_then_back() -> None:
    s = state((1, 2, 3), 1, (1, 2))
    change = decided(s, alive={3})
    assert change is not None and not change.unclean
    offline = change.after
    assert (offline.leader, offline.isr, offline.leader_epoch) == (NO_LEADER, (1, 2), 4)
    assert change.describe() == "orders-0: leader 1 -> none (epoch 4)"
    assert decided(offline, alive={3}) is None  # stays offline: 3 was never in the ISR
    back = decided(offline, alive={2, 3})
    assert back is not None and (back.after.leader, back.after.isr, back.after.leader_epoch) == (2, (2,), 5)


def test_rule2_unclean_election_only_when_the_topic_allows_it() -> None:
    s = state((1, 2, 3), 1, (1,))
    assert decided(s, alive={2, 3}).after.leader == NO_LEADER  # type: ignore[union-attr]
    change = decided(s, alive={2, 3}, unclean=True)
    assert change is not None and change.unclean
    assert (change.after.leader, change.after.isr, change.after.leader_epoch) == (2, (2,), 4)
    assert decided(s, alive=set(), unclean=True).after.leader == NO_LEADER  # type: ignore[union-attr]


def test_rule3_dead_followers_leave_the_isr_and_the_leader_epoch_stays() -> None:
    change = decided(state((1, 2, 3), 1, (1, 2, 3)), alive={1, 2})
    assert change is not None
    assert (change.after.leader, change.after.isr, change.after.leader_epoch, change.after.partition_epoch) \
        == (1, (1, 2), 3, 8)
    assert change.describe() == "orders-0: isr [1, 2, 3] -> [1, 2]"
    assert decided(state((1, 2, 3), 1, (1, 2)), alive={1, 2, 3}) is None  # 3 rejoins via the leader


def test_controlled_shutdown_moves_leadership_and_leaves_the_isr() -> None:
    change = decided(state((1, 2, 3), 1, (1, 2, 3)), alive={1, 2, 3}, shutting=frozenset({1}))
    assert change is not None and (change.after.leader, change.after.isr) == (2, (2, 3))
    follower = decided(state((2, 1, 3), 2, (2, 1, 3)), alive={1, 2, 3}, shutting=frozenset({1}))
    assert follower is not None and (follower.after.leader, follower.after.isr) == (2, (2, 3))
    # The only ISR member keeps leading while it shuts down: moving would lose records.
    assert decided(state((1, 2), 1, (1,)), alive={1, 2}, shutting=frozenset({1})) is None


def test_decide_reads_the_topics_unclean_config_over_the_default() -> None:
    topics = {"a": TopicRecord("a", "ia", 1, 2, {"unclean.leader.election.enable": "true"}),
              "b": TopicRecord("b", "ib", 1, 2, {}),
              "c": TopicRecord("c", "ic", 1, 2, {"unclean.leader.election.enable": "false"})}
    parts = {(t, 0): state((1, 2), 1, (1,), topic=t) for t in topics}
    view = ClusterView(10, {2: BrokerRegistration(2, "h", 2)}, topics, parts)
    leaders = {c.after.topic: c.after.leader for c in decide(view)}
    assert leaders == {"a": 2, "b": NO_LEADER, "c": NO_LEADER}
    leaders = {c.after.topic: c.after.leader for c in decide(view, unclean_default=True)}
    assert leaders == {"a": 2, "b": 2, "c": NO_LEADER}


def test_leaderships_to_move_are_those_with_another_live_isr_member() -> None:
    parts = {("t", 0): state((1, 2), 1, (1, 2), topic="t"), ("t", 1): state((1, 2), 1, (1,), topic="t", partition=1),
             ("t", 2): state((2, 1), 2, (2, 1), topic="t", partition=2),
             ("t", 3): state((1, 3), 1, (1, 3), topic="t", partition=3)}
    view = ClusterView(5, {i: BrokerRegistration(i, "h", i) for i in (1, 2)}, {}, parts)
    assert [s.partition for s in leaderships_to_move(view, 1)] == [0]  # 3 is dead, p1 has no one else
    assert [s.partition for s in leaderships_to_move(view, 2)] == [2]
    assert leaderships_to_move(view, 3) == []
    # Broker 2 stops too (the whole cluster stops at once): nothing can move, nobody waits.
    both = ClusterView(5, view.brokers, {}, parts, shutting_down=frozenset({1, 2}))
    assert leaderships_to_move(both, 1) == [] and leaderships_to_move(both, 2) == []
    only_2 = ClusterView(5, view.brokers, {}, parts, shutting_down=frozenset({2}))
    assert [s.partition for s in leaderships_to_move(only_2, 1)] == []  # 1's only partner is leaving


# ---------------------------------------------------------------- the controller on etcd

pytestmark_etcd = pytest.mark.timeout(60)


def run(coro: Awaitable[T]) -> T:
    async def bounded() -> T:
        return await asyncio.wait_for(coro, 50)
    return asyncio.run(bounded())


async def until(store: MetadataStore, cond: Callable[[ClusterView], bool], what: str,
                timeout_s: float = 8.0) -> ClusterView:
    deadline = time.monotonic() + timeout_s
    while True:
        view = await store.view()
        if cond(view):
            return view
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out after {timeout_s} s waiting for {what}; last view {view}")
        await asyncio.sleep(0.05)


class Node:
    """A broker as the controller sees it: a metadata session and a Controller task."""

    def __init__(self, store: MetadataStore, node_id: int) -> None:
        self.store, self.node_id = store, node_id
        self.controller = Controller(store, node_id, retry_s=0.1)
        self.task: asyncio.Task[None] | None = None

    @classmethod
    async def start(cls, etcd: EtcdServer, cluster: str, node_id: int, *, session_ms: int = 1000,  # noqa: F811
                    controller: bool = True) -> Node:
        store = await MetadataStore.connect([etcd.endpoint], cluster_id=cluster)
        await store.register_broker(BrokerRegistration(node_id, "127.0.0.1", 9000 + node_id),
                                    session_timeout_ms=session_ms)
        node = cls(store, node_id)
        if controller:
            node.task = asyncio.create_task(node.controller.run())
        return node

    async def crash(self) -> None:
        """Die without a goodbye: the session ends only when its lease expires."""
        if self.task is not None:
            self.task.cancel()
            with pytest.raises(asyncio.CancelledError):
                await self.task
        await self.store.close()

    async def shutdown(self) -> None:
        await self.controller.stop()
        await self.store.deregister()
        await self.store.close()


@pytestmark_etcd
def test_the_controller_elects_new_leaders_when_a_broker_dies(etcd: EtcdServer, cluster_id: str,  # noqa: F811
                                                              caplog: pytest.LogCaptureFixture) -> None:
    caplog.set_level(logging.INFO, logger="replication.controller")

    async def scenario() -> None:
        nodes = {i: await Node.start(etcd, cluster_id, i, controller=(i == 1)) for i in (1, 2, 3)}
        admin = nodes[1].store
        try:
            await admin.create_topic(TopicRecord("orders", "id", 3, 3),
                                     {0: [2, 3, 1], 1: [3, 1, 2], 2: [1, 2, 3]})
            await until(admin, lambda v: v.controller_id == 1, "node 1 to be the controller")
            await nodes[2].crash()
            crashed = time.monotonic()
            view = await until(admin, lambda v: v.partitions[("orders", 0)].leader == 3 and
                               all(2 not in s.isr for s in v.partitions.values()), "broker 2's session to end")
            # A 1 s session: etcd expires it within ~1.5 s (it checks leases every 0.5 s), then
            # one watch round trip and one write. Measured 1.4-1.5 s; the bound leaves room for load.
            assert time.monotonic() - crashed < 3.5
            p0, p1, p2 = view.partitions_of("orders")
            assert (p0.leader, p0.leader_epoch, p0.isr) == (3, 1, (3, 1))
            assert (p1.leader, p1.leader_epoch, p1.isr) == (3, 0, (3, 1))
            assert (p2.leader, p2.leader_epoch, p2.isr) == (1, 0, (1, 3))
            assert "orders-0: leader 2 -> 3 (epoch 1), isr [2, 3, 1] -> [3, 1]" in caplog.text
            # Broker 3 dies too: 1 is left, in every ISR, and leads everything.
            await nodes[3].crash()
            view = await until(admin, lambda v: all(s.isr == (1,) for s in v.partitions.values()),
                               "broker 3's session to end")
            assert {s.leader for s in view.partitions.values()} == {1}
        finally:
            await nodes[1].shutdown()
    run(scenario())


@pytestmark_etcd
def test_offline_partition_recovers_when_an_isr_member_returns(etcd: EtcdServer, cluster_id: str) -> None:  # noqa: F811
    async def scenario() -> None:
        ctl = await Node.start(etcd, cluster_id, 9)
        b1 = await Node.start(etcd, cluster_id, 1, controller=False)
        b2 = await Node.start(etcd, cluster_id, 2, controller=False)
        try:
            await ctl.store.create_topic(TopicRecord("t", "id", 1, 2), {0: [1, 2]})
            await until(ctl.store, lambda v: v.controller_id == 9, "node 9 to lead")
            await b2.crash()
            await until(ctl.store, lambda v: v.partitions[("t", 0)].isr == (1,), "2 to leave the ISR")
            await b1.crash()
            view = await until(ctl.store, lambda v: v.partitions[("t", 0)].leader == NO_LEADER, "offline")
            assert view.partitions[("t", 0)].isr == (1,)
            b2 = await Node.start(etcd, cluster_id, 2, controller=False)
            await asyncio.sleep(0.5)  # not in the ISR: not elected (unclean election is off)
            assert (await ctl.store.view()).partitions[("t", 0)].leader == NO_LEADER
            b1 = await Node.start(etcd, cluster_id, 1, controller=False)
            view = await until(ctl.store, lambda v: v.partitions[("t", 0)].leader == 1, "1 to lead again")
            assert view.partitions[("t", 0)].leader_epoch == 2  # 1 -> none -> 1
        finally:
            for n in (b1, b2):
                await n.shutdown()
            await ctl.shutdown()
    run(scenario())


@pytestmark_etcd
def test_controlled_shutdown_and_controller_failover(etcd: EtcdServer, cluster_id: str) -> None:  # noqa: F811
    """Two controllers campaign, one wins; the winner asks for a controlled shutdown (its
    leaderships move), then loses its session (as after a pause past the session timeout); the
    other takes over at a higher epoch; the deposed one's writes are fenced; it campaigns again
    and takes over when the other resigns."""
    async def scenario() -> None:
        n1 = await Node.start(etcd, cluster_id, 1)
        n2 = await Node.start(etcd, cluster_id, 2)
        try:
            await n1.store.create_topic(TopicRecord("c", "id", 2, 2), {0: [1, 2], 1: [2, 1]})
            view = await until(n1.store, lambda v: v.controller_id in (1, 2), "a controller")
            winner, other = (n1, n2) if view.controller_id == 1 else (n2, n1)
            first_epoch = view.controller_epoch
            await asyncio.sleep(0.3)
            assert winner.controller.epoch == first_epoch and not other.controller.active

            await winner.store.request_controlled_shutdown(winner.node_id)
            view = await until(other.store, lambda v: all(s.leader == other.node_id and s.isr == (other.node_id,)
                                                          for s in v.partitions.values()), "leaderships to move")
            assert leaderships_to_move(view, winner.node_id) == []

            await other.store._etcd.revoke_lease(winner.store.lease_id)  # the session ends under it
            view = await until(other.store, lambda v: v.controller_id == other.node_id, "the other to take over")
            assert view.controller_epoch == first_epoch + 1
            await until(other.store, lambda v: winner.node_id in v.brokers, "the winner to register again")
            state = view.partitions[("c", 0)]
            deposed = await winner.store.write_partition(
                state.with_leader(winner.node_id, (winner.node_id,)), expected_revision=state.revision,
                controller_epoch=first_epoch)
            assert not deposed
            assert (await other.store.view()).partitions[("c", 0)].leader == other.node_id
            assert not winner.controller.active and other.controller.epoch == first_epoch + 1

            await other.controller.stop()  # resigns: the deposed one wins the next election
            view = await until(winner.store, lambda v: v.controller_id == winner.node_id, "re-election")
            assert view.controller_epoch == first_epoch + 2
        finally:
            await n1.shutdown()
            await n2.shutdown()
    run(scenario())
