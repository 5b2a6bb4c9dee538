"""Consumer groups on a 3-broker cluster: the coordinator follows ``__consumer_offsets``.

A group's coordinator is the leader of partition ``crc32(group) % partitions`` of the
replicated ``__consumer_offsets`` (DESIGN.md §4b). What a user sees: every broker
names the same coordinator, the others refuse the group's calls with NOT_COORDINATOR,
and when the coordinator's broker is SIGKILLed the group's committed offsets are still
there (read from the new coordinator), its member carries on with its partitions and
commits again within seconds.
"""

from __future__ import annotations

import json
import time
from collections.abc import Iterator

import grpc
import pytest
from click.testing import CliRunner

from logstore._proto import logstore_pb2 as pb
from logstore._proto import logstore_pb2_grpc as pb_grpc
from logstore.cli import main
from logstore.client.admin import Admin
from logstore.client.consumer import Consumer
from logstore.client.producer import Producer
from logstore.dev.local_cluster import LocalCluster
from logstore.types import NewTopic, TopicPartition

pytestmark = pytest.mark.timeout(120)

TOPIC = "orders"


@pytest.fixture(scope="module")
def cluster() -> Iterator[LocalCluster]:
    with LocalCluster(3, session_timeout_ms=2000, replica_lag_time_max_ms=2000,
                      extra_config={"group_heartbeat_interval_ms": 500}) as c:
        with Admin(c.bootstrap) as admin:
            admin.create_topics([NewTopic(TOPIC, 3, replication_factor=3)])
        yield c


def _stub(cluster: LocalCluster, node: int) -> tuple[grpc.Channel, pb_grpc.LogstoreStub]:
    ch = grpc.insecure_channel(cluster.address(node), options=[("grpc.use_local_subchannel_pool", 1)])
    return ch, pb_grpc.LogstoreStub(ch)


def _find(cluster: LocalCluster, node: int, group: str) -> pb.Coordinator:
    ch, stub = _stub(cluster, node)
    with ch:
        return stub.FindCoordinator(pb.FindCoordinatorRequest(key_type=pb.GROUP, keys=[group]), timeout=15).coordinators[0]


def _coordinator(cluster: LocalCluster, group: str, timeout_s: float = 20.0) -> int:
    """The coordinator every running broker names (waits while it is being elected or created)."""
    deadline = time.monotonic() + timeout_s
    seen: dict[int, pb.Coordinator] = {}
    while time.monotonic() < deadline:
        seen = {n: _find(cluster, n, group) for n in cluster.node_ids if cluster.running(n)}
        named = {(c.node_id, c.host, c.port) for c in seen.values() if not c.error.code}
        if len(named) == 1 and all(not c.error.code for c in seen.values()):
            return next(iter(named))[0]
        time.sleep(0.1)
    raise AssertionError(f"no agreed coordinator of {group!r} within {timeout_s} s: {seen}")


def _produce(bootstrap: str, count: int, start: int) -> None:
    with Producer(bootstrap, acks="all") as producer:
        for i in range(start, start + count):
            producer.send(TOPIC, f"v{i}".encode(), partition=i % 3)
        producer.flush(30)


def test_every_broker_names_one_coordinator_and_the_others_refuse(cluster: LocalCluster) -> None:
    group = "g-find"
    coordinator = _coordinator(cluster, group)
    answer = _find(cluster, coordinator, group)
    assert f"{answer.host}:{answer.port}" == cluster.address(coordinator)
    assert not answer.local  # a cluster's client goes to the coordinator's address
    # The coordinator serves the group once it loaded its shard (nothing committed yet) ...
    ch, stub = _stub(cluster, coordinator)
    with ch:
        deadline = time.monotonic() + 15
        while (r := stub.OffsetFetch(pb.OffsetFetchRequest(group_id=group), timeout=15)).error.code:
            assert r.error.code in ("COORDINATOR_LOAD_IN_PROGRESS", "COORDINATOR_NOT_AVAILABLE"), r.error
            assert time.monotonic() < deadline, r.error
            time.sleep(0.05)
    # ... and every other broker refuses it.
    for node in cluster.node_ids:
        if node == coordinator:
            continue
        ch, stub = _stub(cluster, node)
        with ch:
            r = stub.OffsetFetch(pb.OffsetFetchRequest(group_id=group), timeout=15)
        assert r.error.code == "NOT_COORDINATOR", (node, coordinator, r.error)
    # The offsets topic is a replicated cluster topic (RF 3 on 3 brokers).
    with Admin(cluster.bootstrap) as admin:
        md = admin._client.metadata(["__consumer_offsets"]).topics["__consumer_offsets"]
    assert {len(p.replicas) for p in md.partitions} == {3}


def test_a_group_survives_the_sigkill_of_its_coordinator(cluster: LocalCluster) -> None:
    group = "g-failover"
    _produce(cluster.bootstrap, 30, 0)
    partitions = [TopicPartition(TOPIC, p) for p in range(3)]
    lost: list[set[TopicPartition]] = []
    with Consumer(cluster.bootstrap, group_id=group, auto_offset_reset="earliest", enable_auto_commit=False,
                  on_partitions_revoked=lost.append, on_partitions_lost=lost.append) as consumer:
        consumer.subscribe([TOPIC])
        got: list[bytes] = []
        deadline = time.monotonic() + 30
        while len(got) < 30 and time.monotonic() < deadline:
            got += [r.value for r in consumer.poll(0.5)]
        assert len(got) == 30
        consumer.commit()
        before = consumer.committed(partitions)
        assert sum(o.offset for o in before.values() if o is not None) == 30

        victim = _coordinator(cluster, group)
        cluster.kill(victim)
        killed_at = time.monotonic()
        try:
            # A commit right after the kill reaches the new coordinator (found again, retried).
            consumer.commit()
            print(f"coordinator fail-over: SIGKILL of broker {victim} to a successful commit "
                  f"{time.monotonic() - killed_at:.2f} s")
            # The committed offsets are still there, read from the new coordinator.
            after = consumer.committed(partitions)
            assert {tp: o.offset for tp, o in after.items() if o} == {tp: o.offset for tp, o in before.items() if o}
            # The member carries on: new records are consumed and committed.
            _produce(cluster.bootstrap, 9, 30)
            deadline = time.monotonic() + 30
            fresh: list[bytes] = []
            while len(fresh) < 9 and time.monotonic() < deadline:
                fresh += [r.value for r in consumer.poll(0.2)]
            assert sorted(fresh) == sorted(f"v{i}".encode() for i in range(30, 39))
            consumer.commit()
            print(f"... and to consuming and committing 9 new records {time.monotonic() - killed_at:.2f} s")
            new = _coordinator(cluster, group)
            assert new != victim
            assert lost == []  # the new coordinator loaded the member: it kept its partitions
            with Admin(cluster.bootstrap) as admin:
                offsets = admin.list_group_offsets(group)
            assert sum(o.offset for o in offsets.values() if o is not None) == 39
        finally:
            cluster.start(victim)


def test_list_groups_asks_every_broker(cluster: LocalCluster) -> None:
    groups = [f"g-list-{i}" for i in range(6)]
    with Admin(cluster.bootstrap) as admin:
        for g in groups:
            admin.alter_group_offsets(g, {TopicPartition(TOPIC, 0): 1})
        coordinators = {_coordinator(cluster, g) for g in groups}
        listed = {g.group_id for g in admin.list_groups()}
        assert set(groups) <= listed
        described = admin.describe_groups(groups)
        assert all(not isinstance(d, Exception) for d in described.values()), described
    assert len(coordinators) > 1  # the groups are spread: the listing really merged brokers
    # The CLI's group verbs go through the same coordinator lookup.
    runner = CliRunner(env={"LOGSTORE_BOOTSTRAP": cluster.bootstrap})
    listed_cli = runner.invoke(main, ["groups", "list", "--format", "json"])
    assert listed_cli.exit_code == 0, (listed_cli.stdout, listed_cli.stderr)
    assert set(groups) <= {d["group"] for d in json.loads(listed_cli.stdout)}
    deleted = runner.invoke(main, ["groups", "delete", *groups])
    assert deleted.exit_code == 0, (deleted.stdout, deleted.stderr)
    with Admin(cluster.bootstrap) as admin:
        assert not set(groups) & {g.group_id for g in admin.list_groups()}


def test_a_controlled_shutdown_of_the_coordinator_moves_the_group_without_a_rebalance(
        cluster: LocalCluster) -> None:
    group = "g-sigterm"
    lost: list[set[TopicPartition]] = []
    partitions = [TopicPartition(TOPIC, p) for p in range(3)]
    with Consumer(cluster.bootstrap, group_id=group, auto_offset_reset="earliest", enable_auto_commit=False,
                  on_partitions_revoked=lost.append, on_partitions_lost=lost.append) as consumer:
        consumer.subscribe([TOPIC])
        deadline = time.monotonic() + 30
        while len(consumer.assignment()) < 3 and time.monotonic() < deadline:
            consumer.poll(0.2)
        assert consumer.assignment() == set(partitions)
        consumer.commit({tp: 1 for tp in partitions})
        victim = _coordinator(cluster, group)
        cluster.stop(victim)  # SIGTERM: leaderships move first, then the broker stops
        try:
            for _ in range(10):  # the member heartbeats to the new coordinator meanwhile
                consumer.poll(0.1)
            consumer.commit({tp: 2 for tp in partitions})
            assert _coordinator(cluster, group) != victim
            assert consumer.assignment() == set(partitions)
            assert lost == []  # the member kept its partitions: no rebalance, nothing lost
            assert {tp: o.offset for tp, o in consumer.committed(partitions).items() if o} == dict.fromkeys(
                partitions, 2)
        finally:
            cluster.start(victim)
