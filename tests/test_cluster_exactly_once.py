"""Exactly-once on a 3-broker cluster whose brokers die during the query (issue 15).

The kill run of ``tests/sink_chaos.py`` — a log→log query SIGKILLed at random points and
finished with AvailableNow, then checked record by record — on a cluster (RF=3,
``min.insync.replicas=2``) while a nemesis SIGKILLs and restarts brokers: the leaders of
the input and output partitions and the broker that coordinates the sink's transactions
(FindCoordinator on the sink's id). The output must still hold exactly one record per
input record. The Delta view's kill run (``tests/materialize_kill.py``) runs the same
way while the leaders of its topic die; its table must equal the model of the topic.
Each test asserts the faults it injected; the sink tests also that the query committed
micro-batches while they happened (a query that only ran after the nemesis proves nothing).
"""

from __future__ import annotations

import contextlib
import os
from collections.abc import Iterator
from pathlib import Path

import pytest
from pyspark.sql import SparkSession

from logstore._proto import logstore_pb2 as pb
from replication.local_cluster import LocalCluster
from tests.cluster_harness import Nemesis
from tests.materialize_kill import kill_run
from tests.sink_chaos import new_topic, run_sink_chaos

pytestmark = [pytest.mark.slow, pytest.mark.timeout(900)]


TOPIC_CONFIGS = {"min.insync.replicas": "2"}
MIN_FAULTS = 8  # per sink test; with the view's, 20 or more in a suite run
VIEW_MIN_FAULTS = 12  # a run sees about 25: faults go on until the kill rounds end
# A longer run: LOGSTORE_EO_ROUNDS=8 LOGSTORE_EO_MAX_FAULTS=60 pytest tests/test_cluster_exactly_once.py
MAX_FAULTS = int(os.environ.get("LOGSTORE_EO_MAX_FAULTS", "12"))
ROUNDS = int(os.environ.get("LOGSTORE_EO_ROUNDS", "2"))  # Spark SIGKILLs while the nemesis runs


@pytest.fixture(scope="module")
def cluster() -> Iterator[LocalCluster]:
    with LocalCluster(3, session_timeout_ms=2000, replica_lag_time_max_ms=2000) as c:
        yield c


@contextlib.contextmanager
def _running(nemesis: Nemesis, faults: list[str], *, finish: bool = False) -> Iterator[None]:
    """The nemesis at work while the block runs; after it, stopped (or, with ``finish``, left to
    do all its faults), and everything healed."""
    nemesis.start()
    try:
        yield
    finally:
        if not finish:
            nemesis.stop()
        nemesis.join_and_check(180)
        print("\n".join(faults))


def _run_under_nemesis(cluster: LocalCluster, mode: str, seed: int) -> None:
    boot = cluster.bootstrap
    src = new_topic(boot, f"eo-{mode}-in", replication_factor=3, configs=TOPIC_CONFIGS)
    dst = new_topic(boot, f"eo-{mode}-out", replication_factor=3, configs=TOPIC_CONFIGS)
    faults: list[str] = []

    def nemesis(sink_id: str) -> contextlib.AbstractContextManager[None]:
        return _running(Nemesis(cluster, src, faults=MAX_FAULTS, seed=seed,
                                kinds=("kill_leader", "kill_coordinator"), gap_s=(0.3, 1.5), settle_s=6.0,
                                topics=(src, dst), coordinator_of=(pb.TRANSACTION, sink_id),
                                log=faults.append), faults)

    # The query is killed and restarted until the nemesis has done its minimum (a fast query
    # would otherwise end its rounds before enough brokers died).
    committed = run_sink_chaos(boot, mode, rounds=ROUNDS, seed=seed, src=src, dst=dst, during=nemesis,
                               more=lambda: len(faults) < MIN_FAULTS)
    assert len(faults) >= MIN_FAULTS, faults
    assert any("(coordinator of" in f for f in faults), faults  # the coordinator's broker died at least once
    assert committed >= 2, f"only {committed} micro-batch(es) committed while brokers were being killed"


def test_the_sink_is_exactly_once_while_brokers_die(cluster: LocalCluster) -> None:
    _run_under_nemesis(cluster, "sink", seed=21)


def test_the_foreach_batch_helper_is_exactly_once_while_brokers_die(cluster: LocalCluster) -> None:
    _run_under_nemesis(cluster, "foreach", seed=22)


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
