"""Kafka's replication scenarios, step by step, on real logs (DESIGN.md §4b).

Each test drives three (or two) replica managers through a cluster view the test
changes by hand (:mod:`replica_steps`) and ends by checking that every replica
holds the same batch bytes below the leader's high-water mark.

* KIP-101 scenario 1: a follower whose HWM lags restarts; truncating to the HWM
  (the old scheme) would lose acknowledged records it then has to serve as leader.
* KIP-101 scenario 2: divergent logs after a double failure; the old leader
  truncates its unreplicated tail by the new leader's epoch lookup.
* KIP-279: two fast fail-overs leave a follower with epochs the leader never
  had; it walks back epoch by epoch until it converges.
* KIP-320: a leader cut off by a network split keeps accepting writes at its old
  epoch but cannot acknowledge them (its ISR change loses the compare-and-swap);
  requests with old epochs are fenced; it truncates once it learns the new epoch.
* Producer state (sequences, open transactions, LSO) survives a fail-over.
"""

from __future__ import annotations

import asyncio

import pytest
from replica_steps import StepCluster, values_of

from logstore._proto import logstore_pb2 as pb
from logstore.errors import FencedLeaderEpochError, OutOfOrderSequenceError, RequestTimedOutError

pytestmark = pytest.mark.timeout(60)


def run(tmp_path, scenario, n: int = 3):  # type: ignore[no-untyped-def]
    async def main() -> None:
        cluster = StepCluster(tmp_path, n)
        await cluster.start()
        try:
            await scenario(cluster)
        finally:
            await cluster.close()
    asyncio.run(main())


def fetch_request(follower: int, epoch: int, offset: int) -> pb.FetchRequest:
    return pb.FetchRequest(replica_id=follower, max_wait_ms=0, partitions=[
        pb.FetchPartition(topic="t", partition=0, fetch_offset=offset, current_leader_epoch=epoch)])


def test_kip101_scenario1_a_restarted_follower_keeps_what_its_lagging_hwm_does_not_cover(tmp_path) -> None:  # type: ignore[no-untyped-def]
    async def scenario(c: StepCluster) -> None:
        await c.create_topic("t", min_isr=1)
        await c.produce(1, "t", [b"m1"], acks=1)
        await c.produce(1, "t", [b"m2"], acks=1)
        await c.replicate(nodes=(2, 3))  # both followers fetch m1, m2
        await c.replicate(nodes=(2,))  # node 2 says it has them: node 3 still holds the HWM at 0
        await c.replicate(nodes=(3,))  # node 3 says so too: HWM 2, m1 and m2 are acknowledged
        assert c.nodes[1].partition("t").high_watermark == 2
        assert c.nodes[2].partition("t").high_watermark == 0  # node 2 learns it on its next fetch
        await c.nodes[2].stop()
        await c.nodes[2].start()
        b = c.nodes[2].partition("t")
        # The old scheme truncated to the HWM here (0) and lost m1, m2; no truncation without
        # asking the leader about epochs.
        assert (b.high_watermark, b.log.log_end_offset) == (0, 2)
        # The leader dies before node 2 fetches; node 3 is down too: node 2 leads.
        await c.nodes[1].stop()
        await c.nodes[3].stop()
        await c.elect("t", 2, isr=(2,))
        assert values_of(c.values(2, "t")) == [b"m1", b"m2"]
        await c.produce(2, "t", [b"m3"])
        await c.nodes[1].start()
        await c.nodes[3].start()
        await c.replicate(3)
        for node in (1, 2, 3):
            assert values_of(c.values(node, "t")) == [b"m1", b"m2", b"m3"]
        assert c.assert_identical_below_hwm("t") == 3
    run(tmp_path, scenario)


def test_kip101_scenario2_divergent_logs_after_a_double_failure(tmp_path) -> None:  # type: ignore[no-untyped-def]
    async def scenario(c: StepCluster) -> None:
        await c.create_topic("t", replicas=(1, 2), min_isr=1)
        await c.produce(1, "t", [b"m1"])  # acks=all: on both
        await c.produce(1, "t", [b"m2"], acks=1)  # only on the leader
        await c.nodes[1].stop()
        await c.nodes[2].stop()
        # Node 2 comes back first and leads at epoch 1; it writes m3 at offset 1.
        await c.elect("t", 2, isr=(2,))
        await c.nodes[2].start()
        await c.produce(2, "t", [b"m3"])
        # Node 1 comes back: offset 1 holds m2 (epoch 0) here and m3 (epoch 1) on the leader.
        await c.nodes[1].start()
        assert c.values(1, "t") == [(0, b"m1"), (1, b"m2")]
        await c.replicate(2)
        assert [r.partitions[0].leader_epoch for r in c.epoch_requests(1)] == [0]
        assert c.values(1, "t") == c.values(2, "t") == [(0, b"m1"), (1, b"m3")]
        assert c.batches(1, "t") == c.batches(2, "t")
        c.assert_identical_below_hwm("t")
    run(tmp_path, scenario, n=2)


def test_kip279_two_fast_fail_overs_converge_by_walking_back_epochs(tmp_path) -> None:  # type: ignore[no-untyped-def]
    async def scenario(c: StepCluster) -> None:
        await c.create_topic("t", min_isr=1)
        await c.produce(1, "t", [b"a0", b"a1"])  # offsets 0-1, everywhere
        await c.produce(1, "t", [b"a2", b"a3"], acks=1)  # offsets 2-3, epoch 0 ...
        await c.replicate(nodes=(3,))  # ... reach node 3 only
        await c.nodes[1].stop()
        # Fail-over 1: node 2 leads at epoch 1 and writes offsets 2-4; node 3 never hears of it.
        await c.elect("t", 2, isr=(2, 3), apply_to=(2,))
        await c.produce(2, "t", [b"b2", b"b3", b"b4"], acks=1)
        await c.nodes[2].stop()
        # Fail-over 2: node 3 leads at epoch 2 with its epoch-0 offsets 2-3, writes offset 4.
        await c.elect("t", 3, isr=(3,))
        await c.produce(3, "t", [b"c4"], acks=1)
        await c.nodes[3].stop()
        # Node 2 is back and leads at epoch 3; node 3 follows it.
        await c.nodes[2].start()
        await c.elect("t", 2, isr=(2,))
        await c.produce(2, "t", [b"b5"])
        assert [(e.epoch, e.start_offset) for e in c.nodes[2].partition("t").log.epochs.entries] == [
            (0, 0), (1, 2), (3, 5)]
        await c.nodes[3].start()
        assert [(e.epoch, e.start_offset) for e in c.nodes[3].partition("t").log.epochs.entries] == [
            (0, 0), (2, 4)]
        await c.replicate(2)
        # Asked for epoch 2: the leader's floor is epoch 1 (ends at 5), which node 3 lacks, so it
        # truncates to where its epoch 0 ends (4) and asks for epoch 0: ends at 2 on the leader.
        assert [r.partitions[0].leader_epoch for r in c.epoch_requests(3)] == [2, 0]
        expected = [b"a0", b"a1", b"b2", b"b3", b"b4", b"b5"]
        assert values_of(c.values(3, "t")) == values_of(c.values(2, "t")) == expected
        await c.nodes[1].start()
        await c.replicate(2)
        assert values_of(c.values(1, "t")) == expected
        assert c.batches(1, "t") == c.batches(2, "t") == c.batches(3, "t")
        await c.replicate(1)
        assert c.assert_identical_below_hwm("t") == 6
    run(tmp_path, scenario)


def test_kip320_a_stale_leader_after_a_split_is_fenced_by_epoch(tmp_path) -> None:  # type: ignore[no-untyped-def]
    async def scenario(c: StepCluster) -> None:
        await c.create_topic("t", min_isr=2)
        await c.produce(1, "t", [b"x0"])
        # Node 1 is cut off from the others and from the metadata: nodes 2 and 3 move on.
        c.network.cut(1, 2)
        c.network.cut(1, 3)
        await c.elect("t", 2, isr=(2, 3), apply_to=(2, 3))
        # A client that still knows epoch 0 is fenced by the new leader ...
        with pytest.raises(FencedLeaderEpochError):
            await c.produce(2, "t", [b"stale"], epoch=0)
        answer = await c.serving(2).serve_replica_fetch(fetch_request(1, 0, 1))
        assert answer[0][0].error.code == "FENCED_LEADER_EPOCH"
        # ... while the stale leader accepts a write at epoch 0 but cannot acknowledge it:
        with pytest.raises(RequestTimedOutError):
            await c.produce(1, "t", [b"lost"], epoch=0, timeout_s=0.2, replicate=False)
        # its ISR change loses the compare-and-swap (the view moved on without it).
        c.clock.advance_ms(5_000)
        await c.rm(1).shrink_isr_if_lagging()
        assert c.alter_calls[-1] == (1, (1,))
        assert (c.state("t").leader, c.state("t").isr) == (2, (2, 3))
        # A follower at the new epoch that still reached it gets UNKNOWN_LEADER_EPOCH.
        answer = await c.serving(1).serve_replica_fetch(fetch_request(3, 1, 1))
        assert answer[0][0].error.code == "UNKNOWN_LEADER_EPOCH"
        await c.produce(2, "t", [b"x1"])
        # The split heals: node 1 learns epoch 1, follows node 2 and drops its unacknowledged write.
        c.network.heal(1, 2)
        c.network.heal(1, 3)
        await c.apply(1)
        answer = await c.serving(1).serve_replica_fetch(fetch_request(3, 1, 1))
        assert answer[0][0].error.code == "NOT_LEADER_OR_FOLLOWER"
        assert values_of(c.values(1, "t")) == [b"x0", b"lost"]
        await c.replicate(2)
        for node in (1, 2, 3):
            assert values_of(c.values(node, "t")) == [b"x0", b"x1"]
        assert c.assert_identical_below_hwm("t") == 2
    run(tmp_path, scenario)


def test_producer_state_and_lso_survive_a_fail_over(tmp_path) -> None:  # type: ignore[no-untyped-def]
    async def scenario(c: StepCluster) -> None:
        await c.create_topic("t", min_isr=2)
        await c.produce(1, "t", [b"a", b"b"], producer_id=7, producer_epoch=0, base_sequence=0)
        await c.produce(1, "t", [b"c"], producer_id=7, producer_epoch=0, base_sequence=2)
        await c.produce(1, "t", [b"t1"], producer_id=9, producer_epoch=0, base_sequence=0, transactional=True)
        await c.produce(1, "t", [b"u1"], producer_id=11, producer_epoch=0, base_sequence=0, transactional=True)
        leader = c.nodes[1].partition("t")
        leader.append_marker(11, 0, commit=False)  # producer 11 aborts
        await c.replicate(3)
        assert leader.high_watermark == 6 and leader.last_stable_offset == 3
        for node in (2, 3):
            follower = c.nodes[node].partition("t")
            assert follower.last_stable_offset == 3
            assert follower.aborted_transactions(0, 6) == leader.aborted_transactions(0, 6)
        await c.nodes[1].stop()
        await c.elect("t", 2, isr=(2, 3))
        new = c.rm(2).leader_partition("t", 0, 1)
        # A retry of producer 7's last batch is answered with its original offset, not appended.
        assert await c.produce(2, "t", [b"c"], producer_id=7, producer_epoch=0, base_sequence=2) == 2
        assert new.log.log_end_offset == 6
        with pytest.raises(OutOfOrderSequenceError):
            await c.produce(2, "t", [b"e"], producer_id=7, producer_epoch=0, base_sequence=5)
        assert await c.produce(2, "t", [b"d"], producer_id=7, producer_epoch=0, base_sequence=3) == 6
        # Producer 9's transaction is still open on the new leader: it holds the LSO.
        assert new.last_stable_offset == 3
        assert new.append_marker(9, 0, commit=True) == 7
        await c.replicate(3)
        assert new.last_stable_offset == new.high_watermark == 8
        assert c.nodes[3].partition("t").last_stable_offset == 8
        c.assert_identical_below_hwm("t")
    run(tmp_path, scenario)
