"""The Spark source on a real 3-broker cluster: a stream keeps going across a leader kill.

The query's tasks and its driver reach the partitions through the clients'
routing (each partition at its leader); when a leader is SIGKILLed, the next
fetch finds the new one. The query must neither fail nor skip nor repeat a record.
"""

from __future__ import annotations

import tempfile
import time
from collections.abc import Iterator

import pytest
from pyspark.sql import SparkSession

from logstore.client.admin import Admin
from logstore.client.producer import Producer
from logstore.types import NewTopic
from replication.local_cluster import LocalCluster

pytestmark = pytest.mark.timeout(300)


@pytest.fixture(scope="module")
def cluster() -> Iterator[LocalCluster]:
    with LocalCluster(3, session_timeout_ms=2000, replica_lag_time_max_ms=2000) as c:
        yield c


def _send(bootstrap: str, topic: str, values: list[bytes]) -> set[tuple[int, int, bytes]]:
    with Producer(bootstrap, acks="all", delivery_timeout_ms=60_000) as producer:
        futures = [(producer.send(topic, v, partition=i % 2), v) for i, v in enumerate(values)]
        return {(m.partition, m.offset, v) for f, v in futures for m in [f.result(timeout=60)]}


def test_a_stream_reads_on_across_a_leader_kill(spark: SparkSession, cluster: LocalCluster) -> None:
    topic = "spark-failover"
    with Admin(cluster.bootstrap) as admin:
        admin.create_topics([NewTopic(topic, 2, replication_factor=3, configs={"min.insync.replicas": "2"})])
        leader = admin.describe_topics([topic])[topic].partitions[0].leader
    acked = _send(cluster.bootstrap, topic, [f"before-{i}".encode() for i in range(40)])
    q = (spark.readStream.format("logstore").option("logstore.bootstrap.servers", cluster.bootstrap)
         .option("subscribe", topic).option("startingOffsets", "earliest").load()
         .select("partition", "offset", "value").writeStream.format("memory").queryName("cluster_failover")
         .option("checkpointLocation", tempfile.mkdtemp()).trigger(processingTime="200 milliseconds").start())
    try:
        def rows() -> list[tuple[int, int, bytes]]:
            q.processAllAvailable()
            return [(r[0], r[1], bytes(r[2])) for r in spark.table("cluster_failover").collect()]

        deadline = time.monotonic() + 120
        while len(rows()) < 40 and time.monotonic() < deadline:
            time.sleep(0.2)
        cluster.kill(leader)
        acked |= _send(cluster.bootstrap, topic, [f"after-{i}".encode() for i in range(40)])
        got = rows()
        while len(got) < 80 and time.monotonic() < deadline:
            time.sleep(0.2)
            got = rows()
        assert q.exception() is None and q.isActive
        assert len(got) == len(set(got)), "a record was read twice"
        assert set(got) == acked
    finally:
        q.stop()
        cluster.start(leader)
