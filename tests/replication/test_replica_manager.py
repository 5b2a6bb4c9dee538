"""The replica manager driven step by step: roles, replication, HWM, acks=all, ISR, epochs.

Deterministic: nodes are real logs in temp dirs linked in-process
(:mod:`replica_steps`); fetchers run only when a test says so.
"""

from __future__ import annotations

import asyncio
import dataclasses
import os
import time

import pytest
from replica_steps import LAG_MS, StepCluster, values_of

from logstore.errors import (
    FencedLeaderEpochError,
    LeaderNotAvailableError,
    NotEnoughReplicasAfterAppendError,
    NotEnoughReplicasError,
    NotLeaderError,
    OffsetNotAvailableError,
    RequestTimedOutError,
    UnknownLeaderEpochError,
)
from replication.links import LinkError

pytestmark = pytest.mark.timeout(60)


def run(tmp_path, scenario, n: int = 3, *, live: bool = False):  # type: ignore[no-untyped-def]
    async def main() -> None:
        cluster = StepCluster(tmp_path, n, live=live)
        await cluster.start()
        try:
            await scenario(cluster)
        finally:
            await cluster.close()
    asyncio.run(main())


def test_followers_store_the_leaders_batches_byte_for_byte(tmp_path) -> None:  # type: ignore[no-untyped-def]
    async def scenario(c: StepCluster) -> None:
        await c.create_topic("t")
        assert [r["role"] for r in c.rm(1).describe()] == ["leader"]
        assert [r["role"] for r in c.rm(2).describe()] == ["follower"]
        for i in range(5):
            await c.produce(1, "t", [b"a%d" % i, b"b%d" % i])
        leader = c.nodes[1].partition("t")
        assert leader.log.log_end_offset == 10 and leader.high_watermark == 10
        await c.replicate(2)
        assert c.assert_identical_below_hwm("t") == 10
        assert c.batches(2, "t") == c.batches(1, "t") == c.batches(3, "t")
        # Followers learn the HWM from the leader's answers.
        assert c.nodes[2].partition("t").high_watermark == 10
        assert values_of(c.values(3, "t")) == [x for i in range(5) for x in (b"a%d" % i, b"b%d" % i)]
    run(tmp_path, scenario)


def test_acks_one_does_not_move_the_hwm_before_the_isr_has_the_records(tmp_path) -> None:  # type: ignore[no-untyped-def]
    async def scenario(c: StepCluster) -> None:
        await c.create_topic("t")
        await c.produce(1, "t", [b"x"], acks=1)
        leader = c.nodes[1].partition("t")
        await asyncio.sleep(0.05)
        assert leader.log.log_end_offset == 1 and leader.high_watermark == 0
        await c.replicate()  # the followers fetch the batch ...
        assert leader.high_watermark == 0
        await c.replicate()  # ... and their next fetch says they have it
        assert leader.high_watermark == 1
    run(tmp_path, scenario)


def test_a_new_leader_lists_no_end_until_its_hwm_reaches_its_epoch_start(tmp_path) -> None:  # type: ignore[no-untyped-def]
    """KIP-207: the end offset readers are told never goes backwards across a leader change."""
    async def scenario(c: StepCluster) -> None:
        await c.create_topic("t")
        await c.produce(1, "t", [b"a", b"b", b"c", b"d"], acks=1)
        await c.replicate(2)  # the followers hold all four, the leader's HWM is 4 ...
        assert c.nodes[1].partition("t").high_watermark == 4
        assert c.nodes[2].partition("t").high_watermark < 4  # ... the followers have not heard it yet
        c.rm(1).check_end_known("t", 0)
        await c.elect("t", 2, isr=(2, 3))
        with pytest.raises(OffsetNotAvailableError, match="became leader at offset 4"):
            c.rm(2).check_end_known("t", 0)
        await c.replicate(nodes=(3,))  # its follower's fetch at offset 4 raises the HWM
        assert c.nodes[2].partition("t").high_watermark == 4
        c.rm(2).check_end_known("t", 0)
    run(tmp_path, scenario)


def test_leader_and_epoch_checks(tmp_path) -> None:  # type: ignore[no-untyped-def]
    async def scenario(c: StepCluster) -> None:
        await c.create_topic("t")
        with pytest.raises(NotLeaderError):
            c.rm(2).leader_partition("t", 0)
        await c.elect("t", 2)
        with pytest.raises(FencedLeaderEpochError):
            c.rm(2).leader_partition("t", 0, 0)
        with pytest.raises(UnknownLeaderEpochError):
            c.rm(2).leader_partition("t", 0, 5)
        assert c.rm(2).leader_partition("t", 0, 1).leader_epoch == 1
        with pytest.raises(NotLeaderError):
            c.rm(1).leader_partition("t", 0, 1)
        await c.offline("t")
        with pytest.raises(LeaderNotAvailableError):
            c.rm(2).leader_partition("t", 0)
    run(tmp_path, scenario)


def test_not_enough_replicas_refuses_before_the_append(tmp_path) -> None:  # type: ignore[no-untyped-def]
    async def scenario(c: StepCluster) -> None:
        await c.create_topic("t", min_isr=2)
        c._set_state(c.state("t").with_isr((1,)))
        await c.apply()
        with pytest.raises(NotEnoughReplicasError):
            await c.produce(1, "t", [b"x"])
        assert c.nodes[1].partition("t").log.log_end_offset == 0  # nothing appended
        await c.produce(1, "t", [b"y"], acks=1)  # acks=1 still works
    run(tmp_path, scenario)


def test_acks_all_waits_for_every_isr_member(tmp_path) -> None:  # type: ignore[no-untyped-def]
    async def scenario(c: StepCluster) -> None:
        await c.create_topic("t", min_isr=2)
        rm = c.rm(1)
        part = rm.leader_partition("t", 0)
        await c.produce(1, "t", [b"x"], acks=1)
        waiting = asyncio.ensure_future(rm.wait_replicated("t", 0, part.log.log_end_offset, 5.0))
        await c.replicate(2, nodes=(2,))  # only node 2 fetches: node 3 is in the ISR and lags
        await asyncio.sleep(0.01)
        assert not waiting.done() and part.high_watermark == 0
        await c.replicate(2, nodes=(3,))
        await asyncio.wait_for(waiting, 1)
        assert part.high_watermark == 1
        with pytest.raises(RequestTimedOutError):
            await rm.wait_replicated("t", 0, 5, 0.05)
    run(tmp_path, scenario)


def test_isr_shrinks_after_the_lag_time_and_grows_back(tmp_path) -> None:  # type: ignore[no-untyped-def]
    async def scenario(c: StepCluster) -> None:
        await c.create_topic("t", min_isr=2)
        await c.produce(1, "t", [b"a"])
        # Node 3 stops fetching; node 2 goes on.
        await c.produce(1, "t", [b"b"], acks=1)
        pending = asyncio.ensure_future(c.rm(1).wait_replicated("t", 0, 2, 10))
        for _ in range(3):
            c.clock.advance_ms(1_000)
            await c.replicate(nodes=(2,))
            await c.rm(1).shrink_isr_if_lagging()
        assert c.state("t").isr == (1, 2)
        await asyncio.wait_for(pending, 1)  # the HWM moved once node 3 left the ISR
        assert c.nodes[1].partition("t").high_watermark == 2
        # Node 3 fetches again: once it has caught up to the HWM it is back in the ISR.
        await c.replicate(nodes=(3,))
        assert c.state("t").isr == (1, 2)  # its first fetch asked for offset 1: not caught up yet
        await c.replicate(nodes=(3,))
        assert c.state("t").isr == (1, 2, 3)
        c.assert_identical_below_hwm("t")
    run(tmp_path, scenario)


def test_acks_all_fails_when_the_isr_shrinks_below_min_insync(tmp_path) -> None:  # type: ignore[no-untyped-def]
    async def scenario(c: StepCluster) -> None:
        await c.create_topic("t", min_isr=3)
        await c.produce(1, "t", [b"a"], acks=1)
        pending = asyncio.ensure_future(c.rm(1).wait_replicated("t", 0, 1, 10))
        for _ in range(3):  # the leader checks its followers every quarter of the lag time
            c.clock.advance_ms(LAG_MS // 2)
            await c.rm(1).shrink_isr_if_lagging()
        assert c.state("t").isr == (1,)
        with pytest.raises(NotEnoughReplicasAfterAppendError):
            await asyncio.wait_for(pending, 1)
    run(tmp_path, scenario)


def test_a_leader_that_stood_still_does_not_blame_its_followers(tmp_path) -> None:  # type: ignore[no-untyped-def]
    """A leader paused (SIGSTOP, a GC or VM pause) for longer than the lag time finds its
    followers behind: they could not fetch from it. Its first check after the pause keeps
    them; a follower that then stays silent for the lag time while the leader runs leaves."""
    async def scenario(c: StepCluster) -> None:
        await c.create_topic("t", min_isr=2)
        await c.produce(1, "t", [b"a"])
        await c.rm(1).shrink_isr_if_lagging()
        c.clock.advance_ms(5 * LAG_MS)  # the leader stood still: no check, no fetch served
        await c.produce(1, "t", [b"b"], acks=1)
        await c.rm(1).shrink_isr_if_lagging()
        assert c.state("t").isr == (1, 2, 3)
        await c.replicate(nodes=(2,))  # node 2 fetches again; node 3 stays silent
        for _ in range(3):
            c.clock.advance_ms(LAG_MS // 2)
            await c.replicate(nodes=(2,))
            await c.rm(1).shrink_isr_if_lagging()
        assert c.state("t").isr == (1, 2)
    run(tmp_path, scenario)


async def eventually(check, timeout_s: float = 10.0) -> None:  # type: ignore[no-untyped-def]
    deadline = time.monotonic() + timeout_s
    while not check():
        assert time.monotonic() < deadline, "condition not reached in time"
        await asyncio.sleep(0.01)


def test_fetcher_tasks_replicate_over_grpc_and_follow_leader_changes(tmp_path) -> None:  # type: ignore[no-untyped-def]
    async def scenario(c: StepCluster) -> None:
        await c.create_topic("t", min_isr=2)
        t0 = time.monotonic()
        for i in range(20):
            await c.produce(1, "t", [b"v%d" % i], replicate=False)
        per_produce_ms = (time.monotonic() - t0) / 20 * 1000
        print(f"acks=all RF=3 over gRPC, in-process: {per_produce_ms:.1f} ms per produce "
              f"(replica fetch wait 500 ms)")
        # A follower's long poll returns at the append, not after replica_fetch_wait_max_ms.
        assert per_produce_ms < 250
        await eventually(lambda: all(c.nodes[i].partition("t").high_watermark == 20 for i in (1, 2, 3)))
        c.assert_identical_below_hwm("t")
        # The leader stops: its followers' links break; node 3 is elected and node 1 follows it.
        await c.nodes[1].stop()
        await c.elect("t", 3, isr=(2, 3))
        await c.produce(3, "t", [b"after"], replicate=False)
        # Node 1 comes back, follows node 3, catches up and rejoins the ISR.
        await c.nodes[1].start()
        await eventually(lambda: c.state("t").isr == (1, 2, 3))
        await c.produce(3, "t", [b"again"], replicate=False)
        await eventually(lambda: c.nodes[1].partition("t").log.log_end_offset == 22)
        assert values_of(c.values(1, "t"))[-2:] == [b"after", b"again"]
        c.assert_identical_below_hwm("t")
    run(tmp_path, scenario, live=True)


def test_a_cut_link_fails_the_round_and_a_follower_behind_the_log_start_starts_over(tmp_path) -> None:  # type: ignore[no-untyped-def]
    async def scenario(c: StepCluster) -> None:
        await c.create_topic("t", min_isr=1)
        c.network.cut(1, 3)
        leader = c.nodes[1].partition("t")
        for i in range(3):
            await c.produce(1, "t", [b"v%d" % i], acks=1)
            leader.log.roll()
        with pytest.raises(LinkError):
            await c.rm(3).replicate_once()
        await c.replicate(2, nodes=(2,))
        assert leader.log.delete_records_before(2) == 2  # retention, while node 3 was away
        c.network.heal(1, 3)
        await c.replicate(3, nodes=(3,))
        follower = c.nodes[3].partition("t")
        assert (follower.log.log_start_offset, follower.log.log_end_offset) == (2, 3)
        assert c.values(3, "t") == [(2, b"v2")]
        assert c.batches(3, "t") == c.batches(1, "t")  # the leader deleted the segments below 2
    run(tmp_path, scenario)


def test_replicas_no_longer_hosted_or_of_deleted_topics_are_removed(tmp_path) -> None:  # type: ignore[no-untyped-def]
    async def scenario(c: StepCluster) -> None:
        await c.create_topic("t", min_isr=1, partitions=2)
        await c.produce(1, "t", [b"a"])
        gone = c.nodes[3].partition("t", 0).log.directory
        # Partition 0 moves off node 3 (a reassignment): node 3 drops its replica, keeps partition 1.
        c._set_state(dataclasses.replace(c.state("t"), replicas=(1, 2), isr=(1, 2)))
        await c.apply()
        assert not os.path.exists(gone)
        assert [(r["topic"], r["partition"]) for r in c.rm(3).describe()] == [("t", 1)]
        with pytest.raises(NotLeaderError):
            c.rm(3).leader_partition("t", 0)
        await c.produce(1, "t", [b"b"])  # acks=all needs only nodes 1 and 2 now
        # The topic is deleted: every node removes its local copies.
        dirs = [c.nodes[i].partition("t", 1).log.directory for i in (1, 2, 3)]
        c.view = dataclasses.replace(c.view, topics={}, partitions={})
        await c.apply()
        assert not any(os.path.exists(d) for d in dirs)
        assert all(c.rm(i).describe() == [] for i in (1, 2, 3))
        # Created again under the same name: a new, empty topic.
        await c.create_topic("t", min_isr=1)
        await c.produce(1, "t", [b"new"])
        await c.replicate(2)
        assert values_of(c.values(3, "t")) == [b"new"]
    run(tmp_path, scenario)
