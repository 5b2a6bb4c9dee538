"""Exactly-once on a 3-broker cluster whose brokers die during the query (issue 15).

The kill run of ``tests/support/sink_chaos.py`` — log→log queries SIGKILLed at random points and
finished with AvailableNow, then checked record by record — on a cluster (RF=3,
``min.insync.replicas=2``) while a nemesis SIGKILLs and restarts brokers: the leaders of
the input and output partitions and the brokers that coordinate the sinks' transactions
(FindCoordinator on each sink's id). The sink's query and the foreachBatch helper's run
side by side in one Spark driver, so every kill round and every broker fault hits both.
Each output must still hold exactly one record per input record. The Delta view's kill
run (``tests/support/materialize_kill.py``) runs the same way while the leaders of its topic die;
its table must equal the model of the topic. Each test asserts the faults it injected;
the sink test also that each query committed micro-batches while they happened (a query
that only ran after the nemesis proves nothing).
"""

from __future__ import annotations

import contextlib
import os
from collections.abc import Iterator
from pathlib import Path

import pytest
from cluster_harness import Nemesis
from materialize_kill import kill_run
from pyspark.sql import SparkSession
from sink_chaos import Pipeline, new_topic, run_sink_chaos

from logstore._proto import logstore_pb2 as pb
from logstore.dev.local_cluster import LocalCluster

pytestmark = [pytest.mark.slow, pytest.mark.timeout(900)]


TOPIC_CONFIGS = {"min.insync.replicas": "2"}
MIN_FAULTS = 8  # the sink test's; with the view test's, 20 or more in a suite run
VIEW_MIN_FAULTS = 12  # a run sees about 25: its faults go on until the kill rounds end
# A longer run: LOGSTORE_EO_ROUNDS=8 LOGSTORE_EO_MAX_FAULTS=60 pytest tests/chaos/test_cluster_exactly_once.py
MAX_FAULTS = int(os.environ.get("LOGSTORE_EO_MAX_FAULTS", "12"))
ROUNDS = int(os.environ.get("LOGSTORE_EO_ROUNDS", "2"))  # Spark SIGKILLs while the nemesis runs


@pytest.fixture(scope="module")
def cluster() -> Iterator[LocalCluster]:
    with LocalCluster(3, session_timeout_ms=2000, replica_lag_time_max_ms=2000) as c:
        yield c


@contextlib.contextmanager
def _running(nemesis: Nemesis, faults: list[str]) -> Iterator[None]:
    """The nemesis at work while the block runs; after it, stopped and everything healed."""
    nemesis.start()
    try:
        yield
    finally:
        nemesis.stop()
        nemesis.join_and_check(180)
        print("\n".join(faults))


def test_the_sink_and_the_foreach_batch_helper_are_exactly_once_while_brokers_die(cluster: LocalCluster) -> None:
    boot = cluster.bootstrap
    pipelines = [Pipeline(mode, new_topic(boot, f"eo-{mode}-in", replication_factor=3, configs=TOPIC_CONFIGS),
                          new_topic(boot, f"eo-{mode}-out", replication_factor=3, configs=TOPIC_CONFIGS))
                 for mode in ("sink", "foreach")]
    faults: list[str] = []

    def nemesis(sink_ids: list[str]) -> contextlib.AbstractContextManager[None]:
        topics = tuple(t for p in pipelines for t in (p.src, p.dst))
        return _running(Nemesis(cluster, topics[0], faults=MAX_FAULTS, seed=21,
                                kinds=("kill_leader", "kill_coordinator"), gap_s=(0.3, 1.5), settle_s=6.0,
                                topics=topics, coordinator_of=tuple((pb.TRANSACTION, i) for i in sink_ids),
                                log=faults.append), faults)

    # The queries are killed and restarted until the nemesis has done its minimum (fast queries
    # would otherwise end their rounds before enough brokers died).
    committed = run_sink_chaos(boot, pipelines, rounds=ROUNDS, seed=21, during=nemesis,
                               more=lambda: len(faults) < MIN_FAULTS)
    assert len(faults) >= MIN_FAULTS, faults
    assert any("(coordinator of" in f for f in faults), faults  # a coordinator's broker died at least once
    for p, n in committed.items():
        assert n >= 2, f"{p.mode}: only {n} micro-batch(es) committed while brokers were being killed"


def test_a_view_equals_the_model_while_leaders_die(spark: SparkSession, cluster: LocalCluster,
                                                    tmp_path: Path) -> None:
    faults: list[str] = []

    def nemesis(topic: str) -> contextlib.AbstractContextManager[None]:
        # Faults until the kill rounds end, so leaders die while the view runs batches too, not
        # only while its JVM starts (six faults at once took 20 s: all before the first batch).
        return _running(Nemesis(cluster, topic, faults=None, seed=23, kinds=("kill_leader",), gap_s=(0.5, 2.0),
                                settle_s=6.0, log=faults.append), faults)

    kill_run(spark, cluster.bootstrap, tmp_path, during=nemesis)
    assert len(faults) >= VIEW_MIN_FAULTS, faults
