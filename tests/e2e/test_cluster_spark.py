"""The Spark source on a real 3-broker cluster: a stream keeps going across a leader kill,
and failOnDataLoss decides what a query does when an unclean election lost records it read.

The query's tasks and its driver reach the partitions through the clients'
routing (each partition at its leader); when a leader is SIGKILLed, the next
fetch finds the new one. The query must neither fail nor skip nor repeat a record.
"""

from __future__ import annotations

import tempfile
import time
from collections.abc import Iterator

import pytest
from pyspark.errors import PySparkException
from pyspark.sql import SparkSession

from logstore.client.admin import Admin
from logstore.client.producer import Producer
from logstore.dev.local_cluster import LocalCluster
from logstore.types import NewTopic

pytestmark = pytest.mark.timeout(300)


@pytest.fixture(scope="module")
def cluster() -> Iterator[LocalCluster]:
    with LocalCluster(3, session_timeout_ms=2000, replica_lag_time_max_ms=2000) as c:
        yield c


def _send(bootstrap: str, topic: str, values: list[bytes], partitions: int = 2) -> set[tuple[int, int, bytes]]:
    with Producer(bootstrap, acks="all", delivery_timeout_ms=60_000) as producer:
        futures = [(producer.send(topic, v, partition=i % partitions), v) for i, v in enumerate(values)]
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


def _to_parquet(spark: SparkSession, bootstrap: str, topic: str, out: str, ck: str, **options: str) -> None:
    """An AvailableNow run of ``topic`` into a parquet directory; raises what the query raised."""
    reader = (spark.readStream.format("logstore").option("logstore.bootstrap.servers", bootstrap)
              .option("subscribe", topic).option("startingOffsets", "earliest"))
    for k, v in options.items():
        reader = reader.option(k, v)
    q = (reader.load().select("offset", "value").writeStream.format("parquet").option("path", out)
         .option("checkpointLocation", ck).trigger(availableNow=True).start())
    q.awaitTermination(120)


def test_fail_on_data_loss_after_an_unclean_election(spark: SparkSession, cluster: LocalCluster) -> None:
    """Records the queries read are gone after an unclean election: failOnDataLoss decides."""
    topic = "spark-unclean"
    with Admin(cluster.bootstrap) as admin:
        admin.create_topics([NewTopic(topic, 1, replication_factor=2,
                                      configs={"unclean.leader.election.enable": "true"})])
        info = admin.describe_topics([topic])[topic].partitions[0]
    leader = info.leader
    (follower,) = [r for r in info.replicas if r != leader]
    _send(cluster.bootstrap, topic, [b"both-%d" % i for i in range(10)], 1)
    runs = {name: (tempfile.mkdtemp(), tempfile.mkdtemp()) for name in ("strict", "lenient")}
    cluster.kill(follower)  # the ISR shrinks to the leader, which takes ten more on its own
    _send(cluster.bootstrap, topic, [b"leader-only-%d" % i for i in range(10)], 1)
    for out, ck in runs.values():
        _to_parquet(spark, cluster.bootstrap, topic, out, ck)
        assert spark.read.parquet(out).count() == 20
    cluster.kill(leader)
    cluster.start(follower)  # no in-sync replica is alive: the out-of-sync one is elected
    try:
        with Admin(cluster.bootstrap) as admin:
            deadline = time.monotonic() + 60
            while admin.describe_topics([topic])[topic].partitions[0].leader != follower:
                assert time.monotonic() < deadline, "the follower was not elected"
                time.sleep(0.2)
        _send(cluster.bootstrap, topic, [b"after-%d" % i for i in range(3)], 1)  # offsets 10-12 again
        out, ck = runs["strict"]
        with pytest.raises(PySparkException) as info_:
            _to_parquet(spark, cluster.bootstrap, topic, out, ck)
        assert "now ends at offset 13, before offset 20" in str(info_.value), str(info_.value)[:2000]
        assert spark.read.parquet(out).count() == 20
        out, ck = runs["lenient"]  # goes on from the new end, as Spark's Kafka source does
        def rows() -> list[tuple[int, bytes]]:
            return sorted((r["offset"], bytes(r["value"])) for r in spark.read.parquet(out).collect())

        _to_parquet(spark, cluster.bootstrap, topic, out, ck, failOnDataLoss="false")
        read_before = rows()
        assert len(read_before) == 20
        _send(cluster.bootstrap, topic, [b"later-%d" % i for i in range(2)], 1)  # offsets 13 and 14
        _to_parquet(spark, cluster.bootstrap, topic, out, ck, failOnDataLoss="false")
        assert sorted(set(rows()) - set(read_before)) == [(13, b"later-0"), (14, b"later-1")]
        assert len(rows()) == 22
    finally:
        cluster.start(leader)
