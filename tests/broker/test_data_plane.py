"""The data plane serves consumers and followers through one fetch path, woken by one mechanism.

A consumer's long poll and a follower's wait on the same partition in the same registry
(:class:`~logstore.broker.data_plane.waiters.PartitionWaiters`); one append wakes both, and each
answers with the record long before its wait would have ended (issue 23). Driven on the
in-process replication harness (:mod:`replica_steps`): real logs, a real replica manager.
"""

from __future__ import annotations

import asyncio
import dataclasses
import inspect
import time

import pytest
from replica_steps import StepCluster

from logstore.broker.data_plane import FetchParams, FetchPartition, PartitionRead
from logstore.broker.data_plane.fanout import gather_bounded
from logstore.record import decode_schema
from logstore.record_reader import iter_batches

pytestmark = pytest.mark.timeout(60)


def values(read: PartitionRead) -> list[bytes]:
    schema, _ = decode_schema(read.schema)
    return [v for batch in iter_batches(read.records) for v in batch.decode(schema).column("value").to_pylist()]


def test_one_append_wakes_a_waiting_follower_and_a_waiting_consumer(tmp_path) -> None:  # type: ignore[no-untyped-def]
    async def scenario() -> None:
        c = StepCluster(tmp_path, 2)
        await c.start()
        try:
            # Broker 2 follows but stays out of the ISR (a controlled shutdown): the leader's HWM
            # moves with its own appends, so a consumer can read what the follower is sent.
            c.view = dataclasses.replace(c.view, shutting_down=frozenset({2}))
            await c.create_topic("t", replicas=(1, 2), min_isr=1)
            state = await c.elect("t", 1, isr=(1,))
            serving = c.serving(1)
            follower = asyncio.ensure_future(serving.fetch(FetchParams(
                (FetchPartition("t", 0, 0, current_leader_epoch=state.leader_epoch),),
                max_wait_s=10, min_bytes=1, replica_id=2)))
            consumer = asyncio.ensure_future(serving.fetch(FetchParams(
                (FetchPartition("t", 0, 0),), max_wait_s=10, min_bytes=1)))
            while serving.waiters.waiting("t", 0) < 2:   # both wait on the partition, in one registry
                await asyncio.sleep(0.01)
            started = time.monotonic()
            await c.produce(1, "t", [b"once"], acks=1)
            to_follower, to_consumer = await asyncio.wait_for(asyncio.gather(follower, consumer), 5)
            assert time.monotonic() - started < 2  # woken, not timed out (10 s)
            assert [r.error for r in to_follower + to_consumer] == [None, None]
            assert values(to_follower[0]) == values(to_consumer[0]) == [b"once"]
            assert serving.waiters.waiting("t", 0) == 0
        finally:
            await c.close()
    asyncio.run(scenario())


def test_a_cancelled_request_closes_the_partitions_it_never_started() -> None:
    """A multi-partition produce cancelled mid-flight left its queued partitions' coroutines
    unawaited ("coroutine 'AppendPath._append' was never awaited"): now they are closed unrun."""
    started: list[int] = []

    async def partition(i: int) -> None:
        started.append(i)
        await asyncio.sleep(30)

    async def scenario() -> None:
        parts = [partition(i) for i in range(5)]
        request = asyncio.ensure_future(gather_bounded(parts, limit=2))
        await asyncio.sleep(0.05)
        request.cancel()
        with pytest.raises(asyncio.CancelledError):
            await request
        assert started == [0, 1]
        assert [inspect.getcoroutinestate(p) for p in parts] == ["CORO_CLOSED"] * 5

    asyncio.run(scenario())
