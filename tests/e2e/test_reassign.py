"""Growing the cluster: a fourth broker joins, a topic moves onto it while a producer (acks=all)
and a consumer keep running; invalid plans; preferred leader election after a restart; the
replication throttle.

One module-scoped cluster of three brokers (a fourth added by the first test), driven through
the CLI (click's CliRunner, in-process) and the admin client, as a user would.
"""

from __future__ import annotations

import json
import threading
import time
from collections import Counter
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
from click.testing import CliRunner, Result
from cluster_harness import Writer, create_topic

from logstore.cli import main
from logstore.client.admin import Admin
from logstore.client.consumer import Consumer
from logstore.client.producer import Producer
from logstore.dev.local_cluster import LocalCluster
from logstore.errors import (
    ElectionNotNeededError,
    InvalidReplicaAssignmentError,
    NoReassignmentInProgressError,
    PreferredLeaderNotAvailableError,
)
from logstore.types import TopicPartition
from replication.controller import decide
from replication.reassignment import (
    cancel_reassignment,
    complete_reassignment,
    elect_preferred,
    elect_unclean,
    start_reassignment,
)
from replication.state import BrokerRegistration, ClusterView, PartitionState, TopicRecord

pytestmark = pytest.mark.timeout(180)


@pytest.fixture(scope="module")
def cluster() -> Iterator[LocalCluster]:
    with LocalCluster(3, session_timeout_ms=2000, replica_lag_time_max_ms=2000) as c:
        yield c


def _cli(cluster: LocalCluster, *args: str) -> Result:
    return CliRunner().invoke(main, [*args, "--bootstrap", cluster.bootstrap])


def _wait(predicate: Callable[[], Any], timeout_s: float = 30.0) -> Any:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        found = predicate()
        if found:
            return found
        time.sleep(0.1)
    raise AssertionError(f"not within {timeout_s} s: {predicate}")


def _partitions(admin: Admin, topic: str) -> dict[int, Any]:
    return {p.partition: p for p in admin._client.metadata([topic]).topics[topic].partitions}


class Reader(threading.Thread):
    """A consumer polling the topic from the start until stopped; every record it saw."""

    def __init__(self, bootstrap: str, topic: str, partitions: int) -> None:
        super().__init__(daemon=True)
        self.bootstrap, self.topic, self.partitions = bootstrap, topic, partitions
        self.seen: list[tuple[int, int, bytes]] = []
        self.stopping = threading.Event()

    def run(self) -> None:
        with Consumer(self.bootstrap, auto_offset_reset="earliest") as consumer:
            consumer.assign([TopicPartition(self.topic, p) for p in range(self.partitions)])
            while not self.stopping.is_set():
                self.seen += [(r.partition, r.offset, r.value) for r in consumer.poll(0.5)]


def test_a_topic_moves_onto_a_new_broker_under_load(cluster: LocalCluster) -> None:
    create_topic(cluster, "moves", 2, replication_factor=3)
    writer = Writer(cluster.bootstrap, "moves", 2, rate=200)
    reader = Reader(cluster.bootstrap, "moves", 2)
    writer.start()
    reader.start()
    time.sleep(1.5)
    old_dirs = sorted(Path(cluster.broker_data_dir(1)).glob("moves-*"))
    assert len(old_dirs) == 2, old_dirs  # broker 1 holds both partitions before the move
    node = cluster.add_broker()
    assert node == 4
    with Admin(cluster.bootstrap) as admin:
        _wait(lambda: 4 in {b.node_id for b in admin.describe_cluster().brokers})
        assert all(4 not in p.replicas for p in _partitions(admin, "moves").values())  # joins empty
        moved = _cli(cluster, "partitions", "reassign", "--topic", "moves", "--to-brokers", "2,3,4",
                     "--timeout", "60")
        assert moved.exit_code == 0, (moved.stdout, moved.stderr)
        assert "started the reassignment of 2 partition(s)" in moved.stdout
        assert "reassignment of 2 partition(s) complete" in moved.stdout
        parts = _partitions(admin, "moves")
        for p in parts.values():
            assert set(p.replicas) == {2, 3, 4}, p
            assert p.leader in {2, 3, 4}, p
        assert admin.list_partition_reassignments(["moves"]) == {}
    verify = _cli(cluster, "partitions", "reassign", "--topic", "moves", "--verify")
    assert verify.exit_code == 0 and "complete" in verify.stdout, verify.stdout
    time.sleep(1.0)  # the producer keeps writing to the new leaders
    writer.stop()
    assert not writer.failures, writer.failures[:3]
    acked = {a.value for a in writer.acks}
    _wait(lambda: acked <= {v for _, _, v in reader.seen}, 30)
    reader.stopping.set()
    reader.join(10)
    values = [v for _, _, v in reader.seen]
    counts = Counter(values)
    twice = sorted({(pt, o, v) for pt, o, v in reader.seen if counts[v] > 1})
    assert not twice, f"read twice: {twice[:6]}"
    assert acked <= set(values)
    # broker 1 no longer hosts the topic: its replicas were stopped and deleted
    _wait(lambda: not any(d.exists() for d in old_dirs), 15)
    assert len(list(Path(cluster.broker_data_dir(4)).glob("moves-*"))) == 2


def test_invalid_plans_have_stable_codes(cluster: LocalCluster, tmp_path: Path) -> None:
    create_topic(cluster, "badplans", 1, replication_factor=2)
    with Admin(cluster.bootstrap) as admin:
        tp = TopicPartition("badplans", 0)
        with pytest.raises(InvalidReplicaAssignmentError, match="not registered"):
            admin.alter_partition_reassignments({tp: [1, 9]})
        with pytest.raises(InvalidReplicaAssignmentError, match="twice"):
            admin.alter_partition_reassignments({tp: [1, 1]})
        with pytest.raises(NoReassignmentInProgressError):
            admin.alter_partition_reassignments({tp: None})
    plan = tmp_path / "plan.json"
    plan.write_text(json.dumps({"version": 1, "partitions": [
        {"topic": "badplans", "partition": 0, "replicas": [2, 77]}]}))
    bad = _cli(cluster, "partitions", "reassign", "--plan", str(plan))
    assert bad.exit_code == 1 and "error: [INVALID_REPLICA_ASSIGNMENT]" in bad.stderr, bad.stderr
    cancel = _cli(cluster, "partitions", "reassign", "--topic", "badplans", "--cancel")
    assert cancel.exit_code == 1 and "[NO_REASSIGNMENT_IN_PROGRESS]" in cancel.stderr, cancel.stderr
    plan.write_text("{not json")
    broken = _cli(cluster, "partitions", "reassign", "--plan", str(plan))
    assert broken.exit_code == 1 and "[INVALID_REQUEST]" in broken.stderr, broken.stderr


def test_preferred_election_spreads_leadership_back(cluster: LocalCluster) -> None:
    create_topic(cluster, "spread", 3, replication_factor=3)
    with Admin(cluster.bootstrap) as admin, Producer(cluster.bootstrap, acks="all") as producer:
        for p in range(3):
            producer.send("spread", b"x", partition=p)
        producer.flush(30)
        parts = _partitions(admin, "spread")
        victim = parts[0].replicas[0]
        assert parts[0].leader == victim
        cluster.kill(victim)
        _wait(lambda: all(p.leader != victim and p.leader >= 0 for p in _partitions(admin, "spread").values()))
        cluster.start(victim)
        _wait(lambda: all(victim in p.isr for p in _partitions(admin, "spread").values()
                          if victim in p.replicas), 40)
        moved = [p for p in _partitions(admin, "spread").values() if p.leader != p.replicas[0]]
        assert moved  # the victim's partitions are led by another replica now
        elect = _cli(cluster, "leaders", "elect", "--preferred", "--topic", "spread")
        assert elect.exit_code == 0, (elect.stdout, elect.stderr)
        assert f"{len(moved)} partition(s) elected" in elect.stdout
        _wait(lambda: all(p.leader == p.replicas[0] for p in _partitions(admin, "spread").values()), 10)
        again = _cli(cluster, "leaders", "elect", "--preferred", "--topic", "spread", "--partition", "0")
        assert again.exit_code == 0 and "0 partition(s) elected, 1 already led" in again.stdout, again.stdout


def test_the_throttle_caps_the_copy_rate(cluster: LocalCluster) -> None:
    create_topic(cluster, "throttled", 1, replication_factor=1, min_insync_replicas=1)
    with Admin(cluster.bootstrap) as admin, Producer(cluster.bootstrap, acks="all") as producer:
        for i in range(3000):
            producer.send("throttled", b"%06d" % i + b"x" * 1000, partition=0)
        producer.flush(60)
        (old,) = _partitions(admin, "throttled")[0].replicas
        new = next(b.node_id for b in admin.describe_cluster().brokers if b.node_id != old)
        rate = 1_000_000
        started = time.monotonic()
        admin.alter_partition_reassignments({TopicPartition("throttled", 0): [new, old]},
                                            throttle_bytes_per_sec=rate)
        samples: list[tuple[float, int, int]] = []
        verified_running = False
        while time.monotonic() - started < 30:
            running = admin.list_partition_reassignments(["throttled"])
            if not running:
                break
            r = running[TopicPartition("throttled", 0)]
            assert r.throttle == rate and r.adding == (new,)
            samples.append((time.monotonic(), r.bytes_copied, r.bytes_total))
            if not verified_running:
                verify = _cli(cluster, "partitions", "reassign", "--topic", "throttled", "--verify")
                assert verify.exit_code == 1 and "still moving" in verify.stdout, verify.stdout
                verified_running = True
            time.sleep(0.25)
        took = time.monotonic() - started
        assert not admin.list_partition_reassignments(["throttled"]), "the move did not finish in 30 s"
        assert _partitions(admin, "throttled")[0].replicas == (new, old)  # the leader, in the target, stays
    moving = [(t, c) for t, c, total in samples if 0 < c < total]
    assert len(moving) >= 4, samples
    measured = (moving[-1][1] - moving[0][1]) / (moving[-1][0] - moving[0][0])
    total = max(t for _, _, t in samples)  # the last answer may come after the leader finished
    assert total > 3_000_000, samples
    print(f"throttle {rate} B/s: copy rate {measured:.0f} B/s ({measured / rate:.2f}x), {total} bytes in {took:.1f} s")
    assert 0 < measured <= 1.3 * rate, (measured, samples)
    assert took >= 0.7 * total / rate, (took, total)
    with Admin(cluster.bootstrap) as admin:  # the throttle went with the move
        assert admin.list_partition_reassignments() == {}


def test_a_running_move_is_cancelled(cluster: LocalCluster, tmp_path: Path) -> None:
    create_topic(cluster, "cancelled", 1, replication_factor=1, min_insync_replicas=1)
    with Admin(cluster.bootstrap) as admin, Producer(cluster.bootstrap, acks="all") as producer:
        for i in range(1000):
            producer.send("cancelled", b"%06d" % i + b"y" * 1000, partition=0)
        producer.flush(60)
        (old,) = _partitions(admin, "cancelled")[0].replicas
        new = next(b.node_id for b in admin.describe_cluster().brokers if b.node_id != old)
        plan = tmp_path / "plan.json"
        plan.write_text(json.dumps({"version": 1, "partitions": [
            {"topic": "cancelled", "partition": 0, "replicas": [old, new]}]}))
        start = _cli(cluster, "partitions", "reassign", "--plan", str(plan), "--throttle", "50KB", "--no-wait")
        assert start.exit_code == 0 and "throttled to 50,000 bytes/s" in start.stdout, (start.stdout, start.stderr)
        assert admin.list_partition_reassignments(["cancelled"])[TopicPartition("cancelled", 0)].adding == (new,)
        _wait(lambda: list(Path(cluster.broker_data_dir(new)).glob("cancelled-0")), 15)  # the copy began
        cancel = _cli(cluster, "partitions", "reassign", "--plan", str(plan), "--cancel")
        assert cancel.exit_code == 0 and "cancelled the reassignment of 1" in cancel.stdout, cancel.stdout
        assert admin.list_partition_reassignments(["cancelled"]) == {}
        assert _partitions(admin, "cancelled")[0].replicas == (old,)
        _wait(lambda: not list(Path(cluster.broker_data_dir(new)).glob("cancelled-0")), 15)


# ---------------------------------------------------------------- the pure steps (no cluster)


def _state(replicas: tuple[int, ...], leader: int, isr: tuple[int, ...], **kw: Any) -> PartitionState:
    return PartitionState("t", 0, replicas, leader, 3, isr, 7, revision=11, **kw)


def test_the_steps_of_a_move_and_its_cancellation() -> None:
    s = _state((1, 2, 3), 1, (1, 2, 3))
    moving = start_reassignment(s, [4, 2, 3], brokers={1, 2, 3, 4}, throttle=500)
    assert (moving.replicas, moving.adding, moving.removing, moving.throttle) == ((4, 2, 3, 1), (4,), (1,), 500)
    assert moving.target == (4, 2, 3) and moving.original == (2, 3, 1) and moving.leader == 1
    assert PartitionState.from_json("t", 0, moving.to_json()).adding == (4,)  # survives etcd
    assert complete_reassignment(moving, alive={1, 2, 3, 4}) is None  # 4 not in the ISR yet
    caught_up = moving.with_isr((1, 2, 3, 4))
    done = complete_reassignment(caught_up, alive={1, 2, 3, 4})
    assert done is not None
    assert (done.replicas, done.isr, done.leader, done.leader_epoch) == ((4, 2, 3), (2, 3, 4), 4, 4)
    assert not done.reassigning and done.throttle == 0
    back = cancel_reassignment(moving)
    assert (back.replicas, back.leader, back.reassigning) == ((2, 3, 1), 1, False)
    with pytest.raises(NoReassignmentInProgressError):
        cancel_reassignment(s)
    with pytest.raises(InvalidReplicaAssignmentError):
        start_reassignment(s, [2, 9], brokers={1, 2, 3})
    # the controller completes it on a view, in the same write as rule 1-3 would use
    brokers = {n: BrokerRegistration(n, "h", n) for n in (1, 2, 3, 4)}
    view = ClusterView(5, brokers, {"t": TopicRecord("t", "id", 1, 3)}, {("t", 0): caught_up}, 1, 1)
    (change,) = decide(view)
    assert change.after.replicas == (4, 2, 3) and "reassignment completed" in change.describe()


def test_elections() -> None:
    s = _state((1, 2, 3), 2, (1, 2, 3))
    assert elect_preferred(s, alive={1, 2, 3}).leader == 1
    with pytest.raises(ElectionNotNeededError):
        elect_preferred(_state((1, 2, 3), 1, (1, 2, 3)), alive={1, 2, 3})
    with pytest.raises(PreferredLeaderNotAvailableError):
        elect_preferred(_state((1, 2, 3), 2, (2, 3)), alive={1, 2, 3})  # 1 not in sync
    offline = _state((1, 2, 3), -1, (1,))
    unclean = elect_unclean(offline, alive={2, 3})
    assert (unclean.leader, unclean.isr) == (2, (2,))
    with pytest.raises(ElectionNotNeededError):
        elect_unclean(s, alive={1, 2, 3})
