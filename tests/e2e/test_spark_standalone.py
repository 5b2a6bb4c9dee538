"""The jobs on a Spark standalone cluster against a 3-broker logstore cluster.

A master and two one-core workers (:mod:`spark_standalone`, started once for the
module) run one compaction round and one materialize round, each as the CLI a
user runs (``python -m jobs.cli compact|materialize ... --master spark://...``,
a subprocess: the driver is not this test's process). The results are checked
as the ``local`` tests check them (``test_compaction_job``, ``test_materialize``):
the compacted log equals the model of a compaction, the Delta table equals the
model of the view. That the work really ran on the cluster is checked in the
master's record of the application (executor memory as given on the command
line) and in the executors' own logs, in the workers' directories: tasks ran
in executor JVMs on both workers.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from cluster_harness import leaders
from compaction_helpers import (
    model_after_compaction,
    produce_batches,
    producer_last_batches,
    read_records,
)
from materialize_helpers import model, read_topic, read_view
from pyspark.sql import SparkSession
from spark_standalone import SparkStandalone

from logstore.client.admin import Admin
from logstore.client.producer import Producer
from logstore.client.rpc import BrokerClient
from logstore.dev.local_cluster import LocalCluster
from logstore.types import NewTopic, TopicPartition

pytestmark = pytest.mark.timeout(900)

ROOT = Path(__file__).resolve().parents[2]
DAY_MS = 86_400_000
JOB_TIMEOUT_S = 420  # a loaded 2-core machine: JVMs of the driver and two executors


@pytest.fixture(scope="module")
def logstore_cluster() -> Iterator[LocalCluster]:
    with LocalCluster(3, session_timeout_ms=2000, replica_lag_time_max_ms=2000) as c:
        yield c


@pytest.fixture(scope="module")
def spark_cluster(tmp_path_factory: pytest.TempPathFactory) -> Iterator[SparkStandalone]:
    # PYTHONPATH: the executors' Python workers import this checkout's packages, as the
    # driver does (on a user's cluster: the same virtualenv on every node).
    env = {"PYTHONPATH": os.pathsep.join(filter(None, [str(ROOT), os.environ.get("PYTHONPATH")]))}
    with SparkStandalone(tmp_path_factory.mktemp("spark-standalone"), workers=2, cores=1, memory="1g",
                         env=env) as c:
        yield c


def run_job(spark_cluster: SparkStandalone, *args: str) -> subprocess.CompletedProcess[str]:
    """``python -m jobs.cli ARGS --master spark://...`` with an executor size the workers hold."""
    env = {**os.environ, "SPARK_LOCAL_IP": "127.0.0.1",
           "PYTHONPATH": os.pathsep.join(filter(None, [str(ROOT), os.environ.get("PYTHONPATH")]))}
    proc = subprocess.run(
        [sys.executable, "-m", "jobs.cli", *args, "--master", spark_cluster.master_url,
         "--executor-memory", "768m", "--conf", "spark.sql.shuffle.partitions=2",
         # Delta reads its log in 50 tasks by default: tiny tables need 2.
         "--conf", "spark.databricks.delta.snapshotPartitions=2"],
        capture_output=True, text=True, timeout=JOB_TIMEOUT_S, env=env, cwd=spark_cluster.work_dir,
    )
    assert proc.returncode == 0, f"exit {proc.returncode}\n{proc.stdout[-2000:]}\n{proc.stderr[-4000:]}"
    return proc


def the_app(spark_cluster: SparkStandalone, name: str) -> dict[str, Any]:
    """The master's record of the finished application ``name`` (the driver stopped it)."""
    deadline = time.monotonic() + 30
    while True:
        apps = [a for a in spark_cluster.completed_apps() if a["name"] == name]
        if apps or time.monotonic() > deadline:
            break
        time.sleep(0.5)
    assert len(apps) == 1, f"{name} not among {[a['name'] for a in spark_cluster.completed_apps()]}"
    return apps[0]


def assert_ran_on_both_workers(spark_cluster: SparkStandalone, app: dict[str, Any]) -> None:
    assert app["state"] == "FINISHED" and app["memoryperexecutor"] == 768  # --executor-memory reached it
    tasks = spark_cluster.tasks_run(app["id"])
    assert set(tasks) == {"worker-1", "worker-2"} and all(n > 0 for n in tasks.values()), tasks


def test_compaction_on_a_spark_cluster(logstore_cluster: LocalCluster, spark_cluster: SparkStandalone) -> None:
    boot = logstore_cluster.bootstrap
    topic = "standalone-compact"
    with Admin(boot) as admin:
        admin.create_topics([NewTopic(topic, 2, replication_factor=3, configs={
            "cleanup.policy": "compact", "min.cleanable.dirty.ratio": "0.01", "segment.bytes": "2048",
            "min.insync.replicas": "2"})])
    now = int(time.time() * 1000)
    with Producer(boot, acks="all", linger_ms=0, delivery_timeout_ms=60_000) as producer:
        for p in range(2):  # one acked batch after the other: many closed 2 KB segments
            batches = [[(now, b"key-%d" % (i % 17), b"v%04d-" % i + b"x" * 120) for i in range(b * 10, b * 10 + 10)]
                       for b in range(30)]
            produce_batches(producer, topic, [*batches, [(now, b"key-3", None)]], partition=p)
    tps = [TopicPartition(topic, p) for p in range(2)]
    before = {tp: read_records(boot, tp) for tp in tps}
    ends = {}
    for p, node in leaders(logstore_cluster, topic).items():  # the leader's segments are the ones swapped
        with BrokerClient(logstore_cluster.address(node)) as client:
            info = client.cleaning.describe_cleaning([topic], now_ms=now)[topic]
        ends[p] = next(q.cleanable_end_offset for q in info.partitions if q.partition == p)
    assert all(ends[p] > 100 for p in range(2)), ends
    producers = {tp: producer_last_batches(boot, tp, ends[tp.partition]) for tp in tps}

    proc = run_job(spark_cluster, "compact", "--bootstrap", boot, "--topic", topic, "--format", "json")
    summary = json.loads(proc.stdout)
    assert summary["ok"] and len(summary["partitions"]) == 2, summary
    for tp in tps:
        want = model_after_compaction(before[tp], cleanable_end=ends[tp.partition], now_ms=now,
                                      delete_retention_ms=DAY_MS, producer_last=producers[tp])
        assert read_records(boot, tp) == want
    assert summary["records_removed"] == sum(len(before[tp]) - len(read_records(boot, tp)) for tp in tps) > 500
    assert_ran_on_both_workers(spark_cluster, the_app(spark_cluster, f"logstore-compact-{topic}"))


def test_materialize_on_a_spark_cluster(logstore_cluster: LocalCluster, spark_cluster: SparkStandalone,
                                        spark: SparkSession, tmp_path: Path) -> None:
    boot = logstore_cluster.bootstrap
    topic = "standalone-view"
    with Admin(boot) as admin:
        admin.create_topics([NewTopic(topic, 2, replication_factor=3, configs={"cleanup.policy": "compact"})])
    records = [(b"k%d" % (i % 40), b"value-%d" % i) for i in range(300)]
    records += [(b"k%d" % i, None) for i in range(0, 40, 7)] + [(None, b"no key")]
    with Producer(boot, acks="all", linger_ms=2, delivery_timeout_ms=60_000) as producer:
        futures = [producer.send(topic, value, key=key) for key, value in records]
        producer.flush(60)
        for f in futures:
            f.result(timeout=60)
    table = str(tmp_path / "view")

    proc = run_job(spark_cluster, "materialize", "--bootstrap", boot, "--topic", topic, "--table", table,
                   "--available-now")
    assert "caught up" in proc.stderr
    want = model(read_topic(boot, topic))
    assert len(want) == 40 - len(range(0, 40, 7))
    assert read_view(spark, table, ["value"]) == want
    app = the_app(spark_cluster, f"logstore-materialize-{topic}")
    assert_ran_on_both_workers(spark_cluster, app)
    # Delta's JVM package (spark.jars.packages, resolved by the driver) reached every executor.
    for worker, log in spark_cluster.executor_logs(app["id"]).items():
        assert any("Fetching spark://" in line and "delta-spark" in line for line in log.splitlines()), worker


def test_spark_options_map_to_spark_settings_and_conf_wins() -> None:
    from jobs.spark_options import spark_conf

    assert spark_conf(executor_memory="2g", executor_cores=2, total_executor_cores=8,
                      conf={"spark.executor.memory": "3g", "spark.driver.host": "10.0.0.5"}) == {
        "spark.executor.memory": "3g", "spark.executor.cores": "2", "spark.cores.max": "8",
        "spark.driver.host": "10.0.0.5"}
    assert spark_conf() == {}


def test_a_malformed_conf_is_refused_before_spark_starts() -> None:
    from click.testing import CliRunner

    from jobs.cli import jobs

    for verb in (["compact", "--topic", "t"], ["materialize", "--topic", "t", "--table", "/tmp/x"]):
        result = CliRunner().invoke(jobs, [*verb, "--conf", "spark.executor.memory"])
        assert result.exit_code == 2 and "is not KEY=VALUE" in result.output, result.output
