"""CoordinatorShards against a model: which keys a broker coordinates as leaderships come and go.

No network, no broker: a recording :class:`ShardedState` whose loads block until the test lets
them finish, so the in-between states (COORDINATOR_LOAD_IN_PROGRESS, a resignation during a
load) are observed exactly. Also the group coordinator's shard loading (load_groups /
unload_groups) against a memory log.
"""

from __future__ import annotations

import asyncio
import threading
from collections.abc import Callable
from typing import Any

import pytest

from logstore.broker.coordinator_shards import CoordinatorShards, partition_for
from logstore.broker.groups.coordinator import GroupCoordinator
from logstore.broker.groups.model import GroupConfig
from logstore.broker.groups.records import MemoryGroupLog
from logstore.errors import (
    CoordinatorLoadInProgressError,
    CoordinatorNotAvailableError,
    NotCoordinatorError,
)
from logstore.types import TopicPartition

pytestmark = pytest.mark.timeout(30)


class Recording:
    topic = "__consumer_offsets"

    def __init__(self) -> None:
        self.events: list[tuple[str, int, int]] = []
        self.loaded: set[int] = set()
        self.gate = threading.Event()
        self.gate.set()

    def load_partition(self, partition: int, leader_epoch: int) -> None:
        assert self.gate.wait(10)
        self.events.append(("load", partition, leader_epoch))
        self.loaded.add(partition)

    def unload_partition(self, partition: int) -> None:
        self.events.append(("unload", partition, -1))
        self.loaded.discard(partition)


async def _run_io(fn: Callable[..., Any], *args: Any) -> Any:
    return await asyncio.get_running_loop().run_in_executor(None, fn, *args)


def _key_of(partition: int, n: int) -> str:
    return next(k for i in range(10_000) if partition_for(k := f"g{i}", n) == partition)


async def _settle(shards: CoordinatorShards) -> None:
    for _ in range(200):
        if not shards._tasks:
            return
        await asyncio.sleep(0.01)
    raise AssertionError("loads did not finish")


def test_keys_are_served_only_where_their_partition_is_loaded() -> None:
    async def main() -> None:
        state = Recording()
        shards = CoordinatorShards(state, run_io=_run_io, node_id=7)
        with pytest.raises(CoordinatorNotAvailableError):
            shards.check("g")  # no topic yet
        k0, k1 = _key_of(0, 4), _key_of(1, 4)
        state.gate.clear()
        shards.update(4, {0: 3})
        with pytest.raises(CoordinatorLoadInProgressError):
            shards.check(k0)
        with pytest.raises(NotCoordinatorError):
            shards.check(k1)
        state.gate.set()
        await _settle(shards)
        assert shards.check(k0) == 0 and shards.loaded_epoch(0) == 3
        shards.update(4, {0: 3})  # the same leadership: nothing reloads
        shards.update(4, {0: 4, 1: 4})  # a new epoch reloads; a new partition loads
        await _settle(shards)
        assert shards.check(k1) == 1
        shards.update(4, {1: 4})  # partition 0 moved away
        await _settle(shards)
        with pytest.raises(NotCoordinatorError):
            shards.check(k0)
        assert state.events == [("load", 0, 3), ("load", 0, 4), ("load", 1, 4), ("unload", 0, -1)]
        assert state.loaded == {1}
    asyncio.run(main())


def test_a_partition_resigned_while_loading_is_unloaded_after_the_load() -> None:
    async def main() -> None:
        state = Recording()
        shards = CoordinatorShards(state, run_io=_run_io)
        state.gate.clear()
        shards.update(2, {0: 1})
        await asyncio.sleep(0.05)  # the load is running, blocked
        shards.update(2, {})
        state.gate.set()
        await _settle(shards)
        assert state.loaded == set()  # the stale load left nothing behind
        assert state.events[0] == ("load", 0, 1) and state.events[-1][0] == "unload"
        with pytest.raises(NotCoordinatorError):
            shards.check(_key_of(0, 2))
    asyncio.run(main())


def test_a_view_naming_the_broker_leader_answers_load_in_progress_until_applied() -> None:
    state = Recording()
    shards = CoordinatorShards(state, run_io=_run_io)
    shards.expect(3, {2})
    with pytest.raises(CoordinatorLoadInProgressError):
        shards.check(_key_of(2, 3))
    with pytest.raises(NotCoordinatorError):
        shards.check(_key_of(1, 3))


def test_a_single_broker_serves_every_key() -> None:
    shards = CoordinatorShards(Recording(), run_io=_run_io)
    shards.serve_everything(10)
    assert [shards.check(f"g{i}") for i in range(3)] == [partition_for(f"g{i}", 10) for i in range(3)]


def test_the_group_coordinator_loads_and_unloads_one_shard() -> None:
    log = MemoryGroupLog()
    n = 4
    writer = GroupCoordinator(GroupConfig(), log=log, topic_partitions=lambda t: 1)
    a, b = _key_of(0, n), _key_of(1, n)
    tp = TopicPartition("t", 0)
    writer.commit_offsets(a, "", -1, {tp: (5, "")})
    writer.commit_offsets(b, "", -1, {tp: (7, "")})
    reader = GroupCoordinator(GroupConfig(), log=log, topic_partitions=lambda t: 1)

    def owns(p: int) -> Callable[[str], bool]:
        return lambda g: partition_for(g, n) == p

    shard0 = [(r.key, r.value) for r in log.records if partition_for(r.group_id, n) == 0]
    assert reader.load_groups(shard0, owns=owns(0)) == 1
    assert reader.fetch_offsets(a)[tp].offset == 5 and reader.fetch_offsets(b) == {}
    assert reader.unload_groups(owns(0)) == 1
    assert reader.fetch_offsets(a) == {}


class ReplicatedMemoryLog(MemoryGroupLog):
    """Appends at once; each append's durability wait blocks until the test releases it."""

    def __init__(self) -> None:
        super().__init__()
        self.releases: list[threading.Event] = []

    def append_pending(self, records: Any, *, fsync: bool) -> tuple[tuple[str, int, int], ...]:
        self.append(records, fsync=fsync)
        self.releases.append(threading.Event())
        return (("__consumer_offsets", 0, len(self.releases) - 1),)

    def wait_durable(self, positions: Any) -> None:
        for _, _, n in positions:
            assert self.releases[n].wait(10), "never released"


def test_commits_waiting_for_replicas_apply_in_append_order() -> None:
    log = ReplicatedMemoryLog()
    coordinator = GroupCoordinator(GroupConfig(), log=log, topic_partitions=lambda t: 1)
    tp = TopicPartition("t", 0)
    first = threading.Thread(target=coordinator.commit_offsets, args=("g", "", -1, {tp: (5, "")}))
    first.start()
    while len(log.releases) < 1:
        threading.Event().wait(0.01)
    # The second commit is not held up by the first one's replication ...
    second = threading.Thread(target=coordinator.commit_offsets, args=("g", "", -1, {tp: (7, "")}))
    second.start()
    while len(log.releases) < 2:
        threading.Event().wait(0.01)
    assert coordinator.fetch_offsets("g") == {}  # ... and neither is visible before it is durable
    log.releases[1].set()
    second.join(10)
    assert coordinator.fetch_offsets("g")[tp].offset == 7
    log.releases[0].set()  # the older commit's replication ends last: it must not win
    first.join(10)
    assert coordinator.fetch_offsets("g")[tp].offset == 7


def test_a_resignation_is_announced_and_its_keys_are_no_longer_served() -> None:
    async def main() -> None:
        resigned: list[int] = []
        shards = CoordinatorShards(Recording(), run_io=_run_io, on_resign=resigned.append)
        key = _key_of(1, 2)
        shards.update(2, {1: 0})
        await _settle(shards)
        assert shards.serves(key) and not shards.resigned(key)
        shards.update(2, {})
        assert resigned == [1]
        assert not shards.serves(key) and shards.resigned(key)
        await _settle(shards)
    asyncio.run(main())
