"""A cluster broker's graceful stop ends within its bound whatever etcd and its peers do (issue 29).

Three in-process brokers on an etcd of the test's own, with a replicated topic and a consumer
group (so ``__consumer_offsets`` is replicated and led here), then the brokers stop in the worst
orders: with etcd SIGKILLed first, and as the last broker alive (the controller, leading
partitions whose ISR is itself). Every stop must return within :data:`BOUND_S`: the
controlled shutdown and the close are each bounded by ``controlled_shutdown_timeout_ms``
(:meth:`logstore.broker.service.Broker.stop`), plus a margin for closing the local logs.
"""

from __future__ import annotations

import time
from collections.abc import Iterator

import pytest

from logstore.broker.embedded import EmbeddedBroker
from logstore.client.admin import Admin
from logstore.client.consumer import Consumer
from logstore.client.producer import Producer
from logstore.dev.etcd_process import EtcdServer
from logstore.dev.local_cluster import LocalCluster
from logstore.types import NewTopic

pytestmark = pytest.mark.timeout(240)

SHUTDOWN_TIMEOUT_MS = 3000
BOUND_S = 2 * SHUTDOWN_TIMEOUT_MS / 1000 + 4.0


@pytest.fixture
def cluster() -> Iterator[tuple[EtcdServer, dict[int, EmbeddedBroker]]]:
    etcd = EtcdServer(start_timeout_s=30.0).start()
    brokers = {i: EmbeddedBroker(overrides={
        "metadata": etcd.url, "cluster_id": "shutdown", "node_id": i,
        "broker_session_timeout_ms": 2000, "replica_lag_time_max_ms": 2000,
        "controlled_shutdown_timeout_ms": SHUTDOWN_TIMEOUT_MS}) for i in (1, 2, 3)}
    try:
        for b in brokers.values():
            b.start()
        _use(brokers[1].bootstrap)
        yield etcd, brokers
    finally:
        for b in brokers.values():
            b.close()
        etcd.stop()


def _use(bootstrap: str) -> None:
    """A replicated topic with records, and a group that commits (``__consumer_offsets``)."""
    with Admin(bootstrap) as admin:
        deadline = time.monotonic() + 60
        while len(admin.describe_cluster().brokers) < 3:
            assert time.monotonic() < deadline, "three brokers to register"
            time.sleep(0.1)
        admin.create_topics([NewTopic("events", 3, replication_factor=3)])
    with Producer(bootstrap, acks="all") as producer:
        for i in range(30):
            producer.send("events", f"v{i}".encode(), partition=i % 3)
        assert producer.flush(60) == 0
    with Consumer(bootstrap, group_id="readers", subscribe=["events"], auto_offset_reset="earliest") as consumer:
        seen = 0
        deadline = time.monotonic() + 60
        while seen < 30 and time.monotonic() < deadline:
            seen += len(consumer.poll(timeout_ms=500))
        assert seen == 30
        consumer.commit()


def _timed_stop(broker: EmbeddedBroker) -> float:
    started = time.monotonic()
    broker.stop(timeout_s=60)
    return time.monotonic() - started


def test_stop_is_bounded_while_etcd_is_down(cluster: tuple[EtcdServer, dict[int, EmbeddedBroker]]) -> None:
    etcd, brokers = cluster
    etcd.kill()
    for node, broker in brokers.items():
        took = _timed_stop(broker)
        assert took < BOUND_S, f"broker {node} took {took:.1f} s to stop with etcd down (bound {BOUND_S:g} s)"


def test_the_last_broker_alive_stops_within_the_bound(cluster: tuple[EtcdServer, dict[int, EmbeddedBroker]]) -> None:
    _, brokers = cluster
    for node in (2, 3):
        took = _timed_stop(brokers[node])
        assert took < BOUND_S, f"broker {node} took {took:.1f} s to stop (bound {BOUND_S:g} s)"
    took = _timed_stop(brokers[1])
    assert took < BOUND_S, f"the last broker took {took:.1f} s to stop (bound {BOUND_S:g} s)"


def test_the_last_broker_stops_within_the_bound_with_etcd_down(
        cluster: tuple[EtcdServer, dict[int, EmbeddedBroker]]) -> None:
    etcd, brokers = cluster
    for node in (2, 3):
        brokers[node].stop(timeout_s=60)
    etcd.kill()
    took = _timed_stop(brokers[1])
    assert took < BOUND_S, f"the last broker took {took:.1f} s to stop with etcd down (bound {BOUND_S:g} s)"


def test_stop_is_bounded_while_etcd_is_frozen(cluster: tuple[EtcdServer, dict[int, EmbeddedBroker]]) -> None:
    etcd, brokers = cluster
    etcd.pause()  # SIGSTOP: every etcd call hangs until its deadline
    try:
        for node, broker in brokers.items():
            took = _timed_stop(broker)
            assert took < BOUND_S, f"broker {node} took {took:.1f} s to stop with etcd frozen (bound {BOUND_S:g} s)"
    finally:
        etcd.resume()


def test_sigterm_ends_the_last_broker_process_within_the_bound_with_etcd_frozen() -> None:
    """The process, not only Broker.stop: SIGTERM of the last broker alive (its peers SIGKILLed,
    etcd SIGSTOPped) exits within the bound, with code 0."""
    with LocalCluster(3, extra_config={"controlled_shutdown_timeout_ms": SHUTDOWN_TIMEOUT_MS}) as cluster:
        _use(cluster.bootstrap)
        for node in (2, 3):
            cluster.kill(node)
        assert cluster.etcd is not None
        cluster.etcd.pause()
        try:
            started = time.monotonic()
            code = cluster.stop(1, timeout_s=60)
            took = time.monotonic() - started
        finally:
            cluster.etcd.resume()
        assert took < BOUND_S, f"broker 1 exited {took:.1f} s after SIGTERM (bound {BOUND_S:g} s)\n{cluster.log_path(1).read_text()[-3000:]}"
        assert code == 0, cluster.log_path(1).read_text()[-3000:]
