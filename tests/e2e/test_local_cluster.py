"""LocalCluster (logstore/dev/local_cluster.py) and ``logstore dev cluster``: etcd and brokers
as real child processes, and the signals the fault harness sends them."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import grpc
import pytest
import tomllib
from cluster_harness import cluster_metadata, create_topic, wait_fully_replicated

from logstore import Admin, NewTopic
from logstore._proto import logstore_pb2 as pb
from logstore._proto import logstore_pb2_grpc as pb_grpc
from logstore.dev.local_cluster import LocalCluster, write_broker_toml

SCRIPT = Path(sys.executable).parent / "logstore"


def _metadata(address: str, timeout_s: float = 5.0) -> pb.MetadataResponse:
    with grpc.insecure_channel(address, options=[("grpc.use_local_subchannel_pool", 1)]) as ch:
        return pb_grpc.LogstoreStub(ch).Metadata(pb.MetadataRequest(), timeout=timeout_s)


def _kafka_brokers(address: str) -> dict[int, str]:
    """Kafka's Metadata from the Kafka listener at ``address``: node id -> host:port."""
    from confluent_kafka.admin import AdminClient

    admin = AdminClient({"bootstrap.servers": address, "socket.timeout.ms": 10_000})
    return {b.id: f"{b.host}:{b.port}" for b in admin.list_topics(timeout=20).brokers.values()}


def _reapable(pid: int) -> bool:
    """Gone, or a zombie whose threads have all exited (its parent's waitpid now returns it)."""
    try:
        return not _alive(pid) and len(os.listdir(f"/proc/{pid}/task")) <= 1
    except FileNotFoundError:
        return True


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    # A zombie (exited, not yet reaped by a parent that is not us) counts as gone.
    with open(f"/proc/{pid}/stat") as f:
        return f.read().rsplit(")", 1)[1].split()[0] != "Z"


def test_broker_config_files_are_toml_the_broker_can_read(tmp_path: Path) -> None:
    path = tmp_path / "b.toml"
    write_broker_toml(path, {"broker_session_timeout_ms": 2000, "rack": 'r"1',
                             "peer_addresses": "2=127.0.0.1:1000,3=127.0.0.1:1001",
                             "topic_defaults": {"min.insync.replicas": "2"}})
    assert tomllib.loads(path.read_text()) == {
        "broker_session_timeout_ms": 2000, "rack": 'r"1',
        "peer_addresses": "2=127.0.0.1:1000,3=127.0.0.1:1001",
        "topic_defaults": {"min.insync.replicas": "2"}}


@pytest.fixture(scope="module")
def cluster(tmp_path_factory: pytest.TempPathFactory) -> Iterator[LocalCluster]:
    with LocalCluster(3, tmp_path_factory.mktemp("cluster"), proxies=True) as c:
        yield c


@pytest.mark.timeout(120)
def test_every_broker_answers_and_knows_the_whole_cluster(cluster: LocalCluster) -> None:
    assert len(cluster.bootstrap.split(",")) == 3
    for n in cluster.node_ids:
        md = _metadata(cluster.address(n))
        assert sorted(b.node_id for b in md.brokers) == [1, 2, 3]
        assert {f"{b.host}:{b.port}" for b in md.brokers} == set(cluster.bootstrap.split(","))
        assert cluster.log_path(n).stat().st_size > 0
        config = tomllib.loads((cluster.data_dir / f"broker-{n}.toml").read_text())
        assert config["peer_addresses"] == ",".join(f"{b}={cluster.links[(n, b)].address}"
                                                    for b in cluster.node_ids if b != n)


@pytest.mark.timeout(120)
def test_replication_goes_through_the_proxies_and_a_cut_is_both_directions(cluster: LocalCluster) -> None:
    create_topic(cluster, "proxied", 3)
    md = wait_fully_replicated(cluster, "proxied", 30)
    assert md is not None, cluster_metadata(cluster, "proxied")
    deadline = time.monotonic() + 10
    while not all(p.bytes_forwarded > 0 or p.connections_accepted > 0 for p in cluster.links.values()):
        assert time.monotonic() < deadline, {k: p.connections_accepted for k, p in cluster.links.items()}
        time.sleep(0.1)
    cluster.cut_link(1, 2, "blackhole")
    try:
        assert cluster.links[(1, 2)].is_cut and cluster.links[(2, 1)].is_cut
        assert not cluster.links[(1, 3)].is_cut and not cluster.links[(3, 2)].is_cut
        _metadata(cluster.address(1))  # clients still reach both
        _metadata(cluster.address(2))
    finally:
        cluster.heal_link(1, 2)
    assert not any(p.is_cut for p in cluster.links.values())


@pytest.mark.timeout(120)
def test_kill_then_start_brings_a_broker_back_on_its_port(cluster: LocalCluster) -> None:
    old_pid = cluster.pid(2)
    assert old_pid is not None
    address = cluster.address(2)
    cluster.kill(2)
    assert not cluster.running(2) and cluster.pid(2) is None and not _alive(old_pid)
    with pytest.raises(grpc.RpcError):
        _metadata(address, timeout_s=1)
    cluster.start(2)
    assert cluster.address(2) == address and cluster.pid(2) not in (None, old_pid)
    assert sorted(b.node_id for b in _metadata(address).brokers) == [1, 2, 3]
    assert cluster.log_path(2).read_text().count("listening on") == 2  # appended across restarts


@pytest.mark.timeout(120)
def test_a_paused_broker_answers_nothing_until_resumed(cluster: LocalCluster) -> None:
    cluster.pause(3)
    try:
        with pytest.raises(grpc.RpcError) as err:
            _metadata(cluster.address(3), timeout_s=1)
        assert err.value.code() == grpc.StatusCode.DEADLINE_EXCEEDED
    finally:
        cluster.resume(3)
    assert sorted(b.node_id for b in _metadata(cluster.address(3)).brokers) == [1, 2, 3]


@pytest.mark.timeout(120)
def test_stop_is_a_clean_sigterm_and_close_leaves_no_process(tmp_path: Path) -> None:
    c = LocalCluster(2, tmp_path / "c").start_all()
    try:
        pids = [c.pid(n) for n in c.node_ids]
        assert c.etcd is not None
        etcd_pid = c.etcd.pid
        assert c.stop(2) == 0
        assert pids[1] is not None and not _alive(pids[1])
        c.start(2)
        pids[1] = c.pid(2)
    finally:
        c.close()
    assert not any(p is not None and _alive(p) for p in [*pids, etcd_pid])
    assert (tmp_path / "c" / "broker-1.log").exists()  # a given data dir is kept


@pytest.mark.timeout(120)
def test_dev_cluster_prints_bootstrap_and_stops_everything_on_sigint(tmp_path: Path) -> None:
    proc = subprocess.Popen([str(SCRIPT), "dev", "cluster", "--brokers", "3", "--data-dir", str(tmp_path / "d"),
                             "--session-timeout-ms", "2000"],
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        assert proc.stdout is not None
        first = proc.stdout.readline()
        assert first.startswith("bootstrap: "), (first, proc.stderr.read() if proc.poll() is not None else "")
        bootstrap = first.removeprefix("bootstrap: ").strip()
        kafka = sys.version_info >= (3, 11)  # the Kafka listener's codecs (kio) need 3.11
        kafka_bootstrap = proc.stdout.readline().removeprefix("kafka bootstrap: ").strip() if kafka else ""
        lines = [proc.stdout.readline() for _ in range(5)]
        pids = [int(line.split(" pid ")[1].split()[0]) for line in lines[:3]]
        assert [line.split(":")[0] for line in lines[:3]] == ["broker 1", "broker 2", "broker 3"]
        assert lines[3].startswith("etcd: 127.0.0.1:")
        for address in bootstrap.split(","):
            assert sorted(b.node_id for b in _metadata(address).brokers) == [1, 2, 3]
        kafka_addresses = kafka_bootstrap.split(",") if kafka else []
        assert len(kafka_addresses) == (3 if kafka else 0), kafka_bootstrap
        assert not set(kafka_addresses) & set(bootstrap.split(","))
        for address in kafka_addresses:  # each broker's Kafka listener lists all three at theirs
            assert _kafka_brokers(address) == dict(zip([1, 2, 3], kafka_addresses, strict=True))
        with Admin(bootstrap) as admin:  # no replication factor given: the dev cluster's default, 3
            admin.create_topics([NewTopic("replicated", 1)])
            assert len(admin.describe_topics(["replicated"])["replicated"].partitions[0].replicas) == 3
        os.kill(pids[2], signal.SIGKILL)
        # Dead for its parent too: a zombie leader is reapable only once its other threads exited.
        deadline = time.monotonic() + 60
        while not _reapable(pids[2]) and time.monotonic() < deadline:
            time.sleep(0.05)
        assert _reapable(pids[2]), "broker 3 outlived its SIGKILL"
        proc.send_signal(signal.SIGINT)
        out, err = proc.communicate(timeout=60)
    finally:
        if proc.poll() is None:
            proc.kill()
    assert proc.returncode == 0, err
    assert out.strip().splitlines()[-1] == "stopped 2 brokers and etcd", (out, err)  # the third was killed before
    assert not any(_alive(p) for p in pids)
