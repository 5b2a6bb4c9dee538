"""The etcd-backed metadata store against a real etcd (replication/metadata_store.py, DESIGN.md §4b).

Every test runs its own cluster id (its own key prefix) on the module's etcd server, and drives
the store through ``asyncio.run`` with a hard timeout.
"""

from __future__ import annotations

import asyncio
import socket
import threading
import time
from collections.abc import Awaitable, Callable
from typing import TypeVar

import pytest
from etcd_helpers import cluster_id, etcd  # noqa: F401

from logstore.dev.etcd_process import EtcdNotFoundError, EtcdServer, find_etcd
from logstore.errors import (
    MetadataStoreError,
    TopicAlreadyExistsError,
    UnknownTopicOrPartitionError,
)
from replication.metadata_store import MetadataStore, parse_metadata_url
from replication.state import BrokerRegistration, ClusterView, TopicRecord

T = TypeVar("T")
pytestmark = pytest.mark.timeout(60)


def run(coro: Awaitable[T]) -> T:
    async def bounded() -> T:
        return await asyncio.wait_for(coro, 45)
    return asyncio.run(bounded())


async def wait_until(cond: Callable[[], Awaitable[bool]], timeout_s: float, what: str) -> None:
    deadline = time.monotonic() + timeout_s
    while not await cond():
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out after {timeout_s} s waiting for {what}")
        await asyncio.sleep(0.05)


def reg(node_id: int, port: int = 9000, rack: str = "") -> BrokerRegistration:
    return BrokerRegistration(node_id, "127.0.0.1", port + node_id, rack)


def topic(name: str, partitions: int = 2, rf: int = 3, **configs: str) -> TopicRecord:
    return TopicRecord(name, f"id-{name}", partitions, rf, configs)


# ---------------------------------------------------------------- registrations as JSON


def test_a_registration_names_its_kafka_listener_only_when_it_has_one() -> None:
    plain = reg(1)
    assert b"kafka" not in plain.to_json()  # the bytes of a broker without one are as before
    assert BrokerRegistration.from_json(plain.to_json()) == plain and not plain.has_kafka_listener
    kafka = BrokerRegistration(2, "127.0.0.1", 9002, "r1", "10.0.0.2", 9092)
    assert BrokerRegistration.from_json(kafka.to_json()) == kafka and kafka.has_kafka_listener
    old = b'{"node_id": 3, "host": "h", "port": 9003, "rack": ""}'  # written before Kafka listeners
    assert BrokerRegistration.from_json(old) == BrokerRegistration(3, "h", 9003)


# ---------------------------------------------------------------- the server and its URL


def test_parse_metadata_url() -> None:
    assert parse_metadata_url("etcd://127.0.0.1:2379") == ["127.0.0.1:2379"]
    assert parse_metadata_url("etcd://a:1,b:2/") == ["a:1", "b:2"]
    assert parse_metadata_url("a:1") == ["a:1"]
    for bad in ("http://a:1", "etcd://", "etcd://a", "etcd://a:x"):
        with pytest.raises(ValueError):
            parse_metadata_url(bad)


def test_find_etcd_honours_the_environment(monkeypatch: pytest.MonkeyPatch, tmp_path) -> None:  # type: ignore[no-untyped-def]
    monkeypatch.setenv("LOGSTORE_ETCD_BIN", str(tmp_path / "nope"))
    with pytest.raises(EtcdNotFoundError, match="LOGSTORE_ETCD_BIN"):
        find_etcd()
    monkeypatch.delenv("LOGSTORE_ETCD_BIN")
    assert find_etcd().endswith("etcd")


def test_unreachable_etcd_is_one_clear_error() -> None:
    with EtcdServer() as server:
        endpoint = server.endpoint
    with pytest.raises(MetadataStoreError, match=f"cannot reach the metadata store .etcd. at {endpoint}"):
        run(MetadataStore.connect([endpoint], timeout_s=1.0))


def test_a_killed_etcd_restarts_with_its_data(tmp_path) -> None:  # type: ignore[no-untyped-def]
    async def write(endpoint: str) -> None:
        store = await MetadataStore.connect([endpoint], cluster_id="restart")
        await store.create_topic(topic("kept", 1, 1), {0: [1]})
        await store.close()

    async def read(endpoint: str) -> ClusterView:
        store = await MetadataStore.connect([endpoint], cluster_id="restart")
        try:
            return await store.view()
        finally:
            await store.close()

    with EtcdServer(tmp_path / "etcd") as server:
        run(write(server.endpoint))
        server.kill()
        assert not server.running()
        server.restart()
        assert "kept" in run(read(server.endpoint)).topics
        assert (tmp_path / "etcd" / "etcd.log").exists()


# ---------------------------------------------------------------- broker sessions


def test_register_refuses_a_duplicate_node_id_and_deregister_revokes(etcd: EtcdServer, cluster_id: str) -> None:  # noqa: F811
    async def scenario() -> None:
        a = await MetadataStore.connect([etcd.endpoint], cluster_id=cluster_id)
        b = await MetadataStore.connect([etcd.endpoint], cluster_id=cluster_id)
        try:
            await a.register_broker(reg(1), session_timeout_ms=10_000)
            with pytest.raises(MetadataStoreError,
                               match="node id 1 is already registered by a live broker at 127.0.0.1:9001"):
                await b.register_broker(reg(1, port=7000), session_timeout_ms=10_000)
            assert set((await b.view()).brokers) == {1}
            await a.deregister()  # revoked now, not after the 10 s session
            assert (await b.view()).brokers == {}
            await b.register_broker(reg(1, port=7000), session_timeout_ms=10_000)
            assert (await a.view()).brokers[1].port == 7001
        finally:
            await a.close()
            await b.close()
    run(scenario())


def test_a_restarted_broker_replaces_its_earlier_incarnation(etcd: EtcdServer, cluster_id: str) -> None:  # noqa: F811
    """Same node id and address: the old session (alive in etcd but, having left its address,
    dead) is replaced at once and learns it lost its session; it cannot take the id back."""
    async def scenario() -> None:
        lost = asyncio.Event()
        old = await MetadataStore.connect([etcd.endpoint], cluster_id=cluster_id)
        new = await MetadataStore.connect([etcd.endpoint], cluster_id=cluster_id)
        try:
            await old.register_broker(reg(4), session_timeout_ms=1000, on_session_lost=lost.set)
            await old.request_controlled_shutdown(4)
            assert await old.campaign(4) >= 1
            await new.register_broker(reg(4), session_timeout_ms=10_000)
            view = await new.view()
            assert set(view.brokers) == {4} and view.controller_id == -1 and view.shutting_down == frozenset()
            await asyncio.wait_for(lost.wait(), 5)
            await asyncio.sleep(1.0)  # the old one keeps trying to register again, and fails
            assert old.lease_id == 0
            _, kv = await new._etcd.get(new._key("brokers", 4))
            assert kv is not None and kv.lease == new.lease_id
        finally:
            await old.close()
            await new.close()
    run(scenario())


def test_a_session_lives_while_kept_alive_and_expires_when_not(etcd: EtcdServer, cluster_id: str) -> None:  # noqa: F811
    async def scenario() -> None:
        watcher = await MetadataStore.connect([etcd.endpoint], cluster_id=cluster_id)
        alive = await MetadataStore.connect([etcd.endpoint], cluster_id=cluster_id)
        dying = await MetadataStore.connect([etcd.endpoint], cluster_id=cluster_id)
        try:
            await alive.register_broker(reg(1), session_timeout_ms=1000)
            await dying.register_broker(reg(2), session_timeout_ms=1000)
            await dying.request_controlled_shutdown(2)
            view = await watcher.view()
            assert set(view.brokers) == {1, 2} and view.shutting_down == {2}
            await dying.close()  # stops the keep-alive without revoking: like a process death
            started = time.monotonic()
            await wait_until(lambda: _brokers(watcher, {1}), 5.0, "broker 2's lease to expire")
            expired_after = time.monotonic() - started
            assert 0.3 < expired_after < 2.5, expired_after  # a 1 s lease, checked every 0.5 s
            assert (await watcher.view()).shutting_down == frozenset()
            await asyncio.sleep(2.0)  # five more keep-alive periods of broker 1
            assert set((await watcher.view()).brokers) == {1}
        finally:
            await watcher.close()
            await alive.close()
    run(scenario())


async def _brokers(store: MetadataStore, expected: set[int]) -> bool:
    return set((await store.view()).brokers) == expected


def test_a_lost_session_is_reported_and_registered_again(etcd: EtcdServer, cluster_id: str) -> None:  # noqa: F811
    """The lease vanishes under a live broker (as after a pause past the session timeout):
    on_session_lost fires and the broker comes back on a new lease."""
    async def scenario() -> None:
        lost = asyncio.Event()
        store = await MetadataStore.connect([etcd.endpoint], cluster_id=cluster_id)
        admin = await MetadataStore.connect([etcd.endpoint], cluster_id=cluster_id)
        try:
            await store.register_broker(reg(3), session_timeout_ms=1500, on_session_lost=lost.set)
            first_lease = store.lease_id
            await admin._etcd.revoke_lease(first_lease)
            assert not await _brokers(admin, {3})
            await asyncio.wait_for(lost.wait(), 5.0)
            await wait_until(lambda: _brokers(admin, {3}), 5.0, "broker 3 to register again")
            assert store.lease_id not in (0, first_lease)
        finally:
            await store.close()
            await admin.close()
    run(scenario())


# ---------------------------------------------------------------- topics


def test_create_topic_writes_every_partition_at_once_or_nothing(etcd: EtcdServer, cluster_id: str) -> None:  # noqa: F811
    async def scenario() -> None:
        store = await MetadataStore.connect([etcd.endpoint], cluster_id=cluster_id)
        try:
            await store.create_topic(topic("orders", 3), {0: [1, 2, 3], 1: [2, 3, 1], 2: [3, 1, 2]})
            view = await store.view()
            assert view.topics["orders"].partitions == 3
            states = view.partitions_of("orders")
            assert [(s.partition, s.replicas, s.leader, s.isr, s.leader_epoch, s.partition_epoch)
                    for s in states] == [(0, (1, 2, 3), 1, (1, 2, 3), 0, 0), (1, (2, 3, 1), 2, (2, 3, 1), 0, 0),
                                         (2, (3, 1, 2), 3, (3, 1, 2), 0, 0)]
            assert len({s.revision for s in states}) == 1 and states[0].revision > 0
            with pytest.raises(TopicAlreadyExistsError):
                await store.create_topic(topic("orders", 1), {0: [9]})
            assert (await store.view()).partitions == view.partitions  # untouched
            with pytest.raises(ValueError):
                await store.create_topic(topic("gap", 2), {0: [1]})
            assert "gap" not in (await store.view()).topics

            altered = await store.alter_topic_configs("orders", {"min.insync.replicas": "2"})
            assert (await store.view()).topics["orders"].configs == {"min.insync.replicas": "2"} == altered.configs
            with pytest.raises(MetadataStoreError):   # checked against a schema that is not the stored one
                await store.alter_topic_configs("orders", {}, value_schema=b"new", schema_from=b"old")
            evolved = await store.alter_topic_configs("orders", {}, value_schema=b"new", schema_from=b"")
            assert (await store.view()).topics["orders"].value_schema == b"new" == evolved.value_schema

            await store.delete_topic("orders")
            view = await store.view()
            assert view.topics == {} and view.partitions == {}
            with pytest.raises(UnknownTopicOrPartitionError):
                await store.delete_topic("orders")
            with pytest.raises(UnknownTopicOrPartitionError):
                await store.alter_topic_configs("orders", {})
            await store.create_topic(topic("orders", 1, 1), {0: [2]})  # the name is free again
            assert [s.replicas for s in (await store.view()).partitions_of("orders")] == [(2,)]
        finally:
            await store.close()
    run(scenario())


def test_alter_isr_is_a_cas_on_the_revision(etcd: EtcdServer, cluster_id: str) -> None:  # noqa: F811
    async def scenario() -> None:
        store = await MetadataStore.connect([etcd.endpoint], cluster_id=cluster_id)
        try:
            await store.create_topic(topic("t", 1), {0: [1, 2, 3]})
            state = (await store.view()).partitions[("t", 0)]
            shrunk = await store.alter_isr(state, (1, 2))
            assert shrunk is not None and shrunk.isr == (1, 2) and shrunk.partition_epoch == 1
            assert shrunk.leader_epoch == 0 and shrunk.revision > state.revision
            assert (await store.view()).partitions[("t", 0)] == shrunk  # the revision is the key's
            assert await store.alter_isr(state, (1,)) is None  # stale: the write above came first
            again = await store.alter_isr(shrunk, (1, 2, 3))
            assert again is not None and again.isr == (1, 2, 3) and again.partition_epoch == 2
        finally:
            await store.close()
    run(scenario())


# ---------------------------------------------------------------- watch


def test_watch_view_yields_the_current_view_then_each_change(etcd: EtcdServer, cluster_id: str) -> None:  # noqa: F811
    async def scenario() -> None:
        store = await MetadataStore.connect([etcd.endpoint], cluster_id=cluster_id)
        writer = await MetadataStore.connect([etcd.endpoint], cluster_id=cluster_id)
        views = store.watch_view()
        try:
            first = await anext(views)
            assert first.topics == {}
            await writer.create_topic(topic("w", 2), {0: [1, 2], 1: [2, 1]})
            second = await anext(views)
            assert set(second.topics) == {"w"} and len(second.partitions) == 2
            assert second.revision > first.revision
            await writer.register_broker(reg(5), session_timeout_ms=5000)
            third = await anext(views)
            assert set(third.brokers) == {5}
            await writer.deregister()
            assert (await anext(views)).brokers == {}
        finally:
            await views.aclose()
            await store.close()
            await writer.close()
    run(scenario())


def test_watch_view_resumes_across_an_etcd_restart(tmp_path) -> None:  # type: ignore[no-untyped-def]
    async def scenario(server: EtcdServer) -> None:
        store = await MetadataStore.connect([server.endpoint], cluster_id="resume", timeout_s=1.0)
        views = store.watch_view()
        try:
            assert (await anext(views)).topics == {}
            server.kill()
            await asyncio.sleep(0.5)
            server.restart()
            writer = await MetadataStore.connect([server.endpoint], cluster_id="resume")
            await writer.create_topic(topic("after", 1, 1), {0: [1]})
            await writer.close()
            view = await asyncio.wait_for(anext(views), 15)
            assert "after" in view.topics
        finally:
            await views.aclose()
            await store.close()

    with EtcdServer(tmp_path / "etcd") as server:
        run(scenario(server))


# ---------------------------------------------------------------- controller election and fencing


def test_campaign_elects_one_and_fences_the_deposed(etcd: EtcdServer, cluster_id: str) -> None:  # noqa: F811
    async def scenario() -> None:
        one = await MetadataStore.connect([etcd.endpoint], cluster_id=cluster_id)
        two = await MetadataStore.connect([etcd.endpoint], cluster_id=cluster_id)
        try:
            await one.register_broker(reg(1), session_timeout_ms=1000)
            await two.register_broker(reg(2), session_timeout_ms=1000)
            await one.create_topic(topic("f", 1), {0: [1, 2]})
            epoch1 = await one.campaign(1)
            assert epoch1 == 1
            waiting = asyncio.create_task(two.campaign(2))
            await asyncio.sleep(0.5)
            assert not waiting.done()  # one controller at a time
            view = await two.view()
            assert (view.controller_id, view.controller_epoch) == (1, 1)
            state = view.partitions[("f", 0)]
            assert await one.write_partition(state.with_isr((1,)), expected_revision=state.revision,
                                             controller_epoch=epoch1)

            await one.deregister()  # the winner's session ends: the key goes with its lease
            epoch2 = await asyncio.wait_for(waiting, 5)
            assert epoch2 == 2
            view = await two.view()
            assert (view.controller_id, view.controller_epoch) == (2, 2)
            state = view.partitions[("f", 0)]
            # The deposed controller's write fails, even at the current revision.
            assert not await one.write_partition(state.with_leader(1, (1,)), expected_revision=state.revision,
                                                 controller_epoch=epoch1)
            # The new one's succeeds; then a stale revision fails for it too.
            assert await two.write_partition(state.with_leader(2, (2,)), expected_revision=state.revision,
                                             controller_epoch=epoch2)
            assert not await two.write_partition(state.with_leader(2, (2, 1)), expected_revision=state.revision,
                                                 controller_epoch=epoch2)
            assert (await two.view()).partitions[("f", 0)].leader == 2
            assert await two.campaign(2) == 2  # still ours: no new epoch
            await two.resign()
            assert (await one.view()).controller_id == -1
        finally:
            await one.close()
            await two.close()
    run(scenario())


def test_several_endpoints_use_the_one_that_answers(etcd: EtcdServer, cluster_id: str) -> None:  # noqa: F811
    with EtcdServer() as gone:
        dead = gone.endpoint

    async def scenario() -> None:
        store = await MetadataStore.connect(f"etcd://{dead},{etcd.endpoint}", cluster_id=cluster_id)
        try:
            await store.create_topic(topic("multi", 1, 1), {0: [1]})
            assert "multi" in (await store.view()).topics
        finally:
            await store.close()
    run(scenario())


def test_closing_the_store_ends_its_watch(etcd: EtcdServer, cluster_id: str) -> None:  # noqa: F811
    async def scenario() -> None:
        store = await MetadataStore.connect([etcd.endpoint], cluster_id=cluster_id)
        views = store.watch_view()
        await anext(views)
        pending = asyncio.ensure_future(anext(views))
        await asyncio.sleep(0.2)
        await store.close()
        with pytest.raises(StopAsyncIteration):
            await asyncio.wait_for(pending, 5)
    run(scenario())


_PAUSED_BROKER = """
import asyncio, sys
from replication.metadata_store import MetadataStore
from replication.state import BrokerRegistration

async def main(endpoint, cluster):
    store = await MetadataStore.connect([endpoint], cluster_id=cluster)
    await store.register_broker(BrokerRegistration(7, "127.0.0.1", 9007), session_timeout_ms=1000,
                                on_session_lost=lambda: print("session lost", flush=True))
    print("registered", flush=True)
    await asyncio.sleep(60)

asyncio.run(main(sys.argv[1], sys.argv[2]))
"""


def test_a_broker_paused_past_its_session_loses_it_and_comes_back(etcd: EtcdServer, cluster_id: str) -> None:  # noqa: F811
    """SIGSTOP a broker process longer than its session: etcd drops its registration; after
    SIGCONT it learns the session was lost (on_session_lost) and registers again."""
    import os
    import signal
    import subprocess
    import sys
    from pathlib import Path

    repo = Path(__file__).resolve().parents[2]
    child = subprocess.Popen([sys.executable, "-c", _PAUSED_BROKER, etcd.endpoint, cluster_id],
                             stdout=subprocess.PIPE, text=True, cwd=repo,
                             env={**os.environ, "PYTHONPATH": str(repo)})
    try:
        assert child.stdout is not None
        assert child.stdout.readline().strip() == "registered"

        async def scenario() -> None:
            watcher = await MetadataStore.connect([etcd.endpoint], cluster_id=cluster_id)
            try:
                assert await _brokers(watcher, {7})
                child.send_signal(signal.SIGSTOP)
                await wait_until(lambda: _brokers(watcher, set()), 5.0, "the paused broker's session to end")
                child.send_signal(signal.SIGCONT)
                await wait_until(lambda: _brokers(watcher, {7}), 5.0, "the broker to register again")
            finally:
                await watcher.close()
        run(scenario())
        assert child.stdout.readline().strip() == "session lost"
    finally:
        child.kill()
        child.wait(timeout=10)


def test_sessions_and_watches_survive_an_etcd_pause() -> None:
    """etcd stops answering (SIGSTOP) for three 1 s sessions: the broker reports its session
    lost and registers again on a new lease once etcd is back; the watch resumes."""
    async def scenario(server: EtcdServer) -> None:
        lost = asyncio.Event()
        broker = await MetadataStore.connect([server.endpoint], cluster_id="pause", timeout_s=1.0)
        watcher = await MetadataStore.connect([server.endpoint], cluster_id="pause", timeout_s=1.0)
        views = watcher.watch_view()
        try:
            await broker.register_broker(reg(1), session_timeout_ms=1000, on_session_lost=lost.set)
            first_lease = broker.lease_id
            assert set((await anext(views)).brokers) == {1}
            server.pause()
            await asyncio.wait_for(lost.wait(), 5)  # noticed while etcd is still paused
            await asyncio.sleep(1.5)
            server.resume()

            async def back() -> bool:
                return broker.lease_id not in (0, first_lease) and await _brokers(watcher, {1})
            await wait_until(back, 10.0, "the broker to register again on a new lease")
            await broker.create_topic(topic("after-pause", 1, 1), {0: [1]})
            view = await asyncio.wait_for(anext(views), 10)
            while "after-pause" not in view.topics:
                view = await asyncio.wait_for(anext(views), 10)
            assert set(view.brokers) == {1}
        finally:
            await views.aclose()
            await broker.close()
            await watcher.close()

    with EtcdServer() as server:
        run(scenario(server))


def test_connect_waits_for_an_etcd_that_starts_late(tmp_path) -> None:  # type: ignore[no-untyped-def]
    """A broker restarted while etcd is starting (or too slow to answer in one call's deadline)
    asks again until ``wait_s`` instead of exiting (seen under load: a restarted broker exited
    with METADATA_STORE_UNAVAILABLE, failing a chaos test)."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    server = EtcdServer(tmp_path / "etcd", client_port=port)
    starter = threading.Timer(2.0, server.start)
    starter.start()
    try:
        async def connect() -> float:
            began = time.monotonic()
            store = await MetadataStore.connect([f"127.0.0.1:{port}"], timeout_s=1.0, wait_s=60.0)
            await store.close()
            return time.monotonic() - began
        assert run(connect()) >= 1.5
    finally:
        starter.join()
        server.stop()
