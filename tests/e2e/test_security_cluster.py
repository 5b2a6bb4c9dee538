"""A 3-broker cluster with TLS everywhere (issue 12): mTLS listeners, replication links over
mTLS (each broker presents its own certificate), etcd over https with client certificates.
Produce with acks=all, kill the leader, read everything back from the new one.
"""

from __future__ import annotations

import time
from pathlib import Path

import pytest
from security_helpers import Certificates, tls_dir  # noqa: F401 - the session fixture

from logstore import Admin, Consumer, NewTopic, Producer, TopicPartition
from logstore.dev.local_cluster import LocalCluster
from logstore.types import PartitionInfo


def _partition(admin: Admin, topic: str) -> PartitionInfo:
    return admin.describe_topics([topic])[topic].partitions[0]


@pytest.mark.timeout(240)
def test_a_tls_cluster_keeps_acknowledged_records_when_the_leader_dies(
        tls_dir: Certificates, tmp_path: Path) -> None:  # noqa: F811
    certs = tls_dir
    cert, key = certs.client("alice")
    client = {"security_protocol": "SSL", "ssl_cafile": certs.ca, "ssl_certfile": cert, "ssl_keyfile": key}
    tls = {"tls_cert": certs.server_cert, "tls_key": certs.server_key, "tls_client_ca": certs.ca,
           "topic_defaults": {"min.insync.replicas": "2"}}
    with LocalCluster(3, tmp_path / "c", extra_config=tls,
                      etcd_tls=(certs.ca, certs.server_cert, certs.server_key)) as cluster:
        with Admin(cluster.bootstrap, **client) as admin:
            admin.create_topics([NewTopic("tls-replicated", num_partitions=1, replication_factor=3)])
            deadline = time.monotonic() + 60
            while len(_partition(admin, "tls-replicated").isr) < 3:  # replication links work
                assert time.monotonic() < deadline, _partition(admin, "tls-replicated")
                time.sleep(0.2)
            first = _partition(admin, "tls-replicated")
        with Producer(cluster.bootstrap, acks="all", linger_ms=0, **client) as producer:
            for i in range(50):
                producer.send("tls-replicated", value=f"v{i}".encode())
            producer.flush(timeout=60)
        cluster.kill(first.leader)
        with Admin(cluster.bootstrap, **client) as admin:
            deadline = time.monotonic() + 60
            while _partition(admin, "tls-replicated").leader in (first.leader, -1):
                assert time.monotonic() < deadline, "no new leader"
                time.sleep(0.2)
        with Producer(cluster.bootstrap, acks="all", linger_ms=0, **client) as producer:
            producer.send("tls-replicated", value=b"after")
            producer.flush(timeout=60)
        with Consumer(cluster.bootstrap, isolation_level="read_uncommitted", **client) as consumer:
            consumer.assign([TopicPartition("tls-replicated", 0)])
            consumer.seek_to_beginning()
            got: list[bytes] = []
            deadline = time.monotonic() + 60
            while len(got) < 51 and time.monotonic() < deadline:
                got.extend(r.value for r in consumer.poll(0.5))
    assert got == [f"v{i}".encode() for i in range(50)] + [b"after"]
