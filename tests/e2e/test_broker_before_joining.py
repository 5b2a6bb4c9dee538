"""A cluster broker leads nothing until it has joined its cluster.

Its listener serves from before it has joined (it connects to etcd, then applies the first
view). A restarted former leader still has the partitions it led in its own files; clients
whose routes still name it (they have not refreshed yet) must be told NOT_LEADER_OR_FOLLOWER,
never served from those files: a write taken there would be acknowledged by a broker that is
not the leader (with acks=all, after a local fsync alone) and lost when it truncates to the
real leader's log. Here etcd never answers, so the broker stays in that window for its whole
metadata connect wait (30 s).
"""

from __future__ import annotations

import os
import subprocess
import sys
import time
from pathlib import Path

import grpc
import pytest
from broker_helpers import records
from metrics_helpers import free_port

from logstore._proto import logstore_pb2 as pb
from logstore._proto import logstore_pb2_grpc as pb_grpc
from logstore.storage.config import LogConfig
from logstore.storage.log_manager import LogManager

pytestmark = pytest.mark.timeout(120)


@pytest.mark.parametrize("acks", [1, -1])
def test_a_broker_that_has_not_joined_refuses_produce_and_fetch_as_not_leader(tmp_path: Path, acks: int) -> None:
    data = str(tmp_path / "data")
    manager = LogManager(data, topic_defaults=LogConfig())  # what a former leader keeps in its own files
    manager.startup()
    manager.ensure_replicated_topic("t", topic_id="t1", partitions=1, configs={}, value_schema=None,
                                    replication_factor=3)
    manager.ensure_partition("t", 0).become_leader(0)
    manager.shutdown()
    port, etcd_port = free_port(), free_port()  # nothing listens on the etcd port
    broker = subprocess.Popen(
        [sys.executable, "-m", "logstore.broker", "--data-dir", data, "--host", "127.0.0.1", "--port", str(port),
         "--node-id", "1", "--metadata", f"etcd://127.0.0.1:{etcd_port}"],
        stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, env=dict(os.environ, LOGSTORE_LOG_LEVEL="WARNING"))
    try:
        stub = pb_grpc.LogstoreStub(grpc.insecure_channel(f"127.0.0.1:{port}"))
        deadline = time.monotonic() + 20
        while True:  # the listener is up before the broker joins
            try:
                produced = stub.Produce(pb.ProduceRequest(acks=acks, partitions=[
                    pb.ProducePartition(topic="t", partition=0, records=records([b"lost?"]))]), timeout=5)
                break
            except grpc.RpcError as e:
                if e.code() != grpc.StatusCode.UNAVAILABLE or time.monotonic() > deadline:
                    raise
                time.sleep(0.1)
        assert produced.partitions[0].error.code == "NOT_LEADER_OR_FOLLOWER", produced
        fetched = stub.Fetch(pb.FetchRequest(max_wait_ms=0, partitions=[
            pb.FetchPartition(topic="t", partition=0, fetch_offset=0, partition_max_bytes=1 << 20)]), timeout=5)
        assert fetched.partitions[0].error.code == "NOT_LEADER_OR_FOLLOWER", fetched
        assert broker.poll() is None, "the broker is still waiting to join"
    finally:
        broker.kill()
        broker.wait(30)
    manager = LogManager(data, topic_defaults=LogConfig())
    manager.startup()
    try:
        assert manager.partition("t", 0).log.log_end_offset == 0, "a write was taken by a broker that leads nothing"
    finally:
        manager.shutdown()
