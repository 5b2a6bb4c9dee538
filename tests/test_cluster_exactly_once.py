"""Exactly-once on a 3-broker cluster whose brokers die during the query (issue 15).

The Delta view's kill run (``tests/test_materialize_crash.py``: the view SIGKILLed at
random points, the table compared with a model of the topic after each kill, then
finished with AvailableNow) on a cluster while a nemesis SIGKILLs and restarts the
leaders of the topic's partitions. The table must equal the model of the whole topic.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from pathlib import Path

import pytest
from pyspark.sql import SparkSession

from replication.local_cluster import LocalCluster
from tests.cluster_harness import Nemesis
from tests.test_materialize_crash import kill_run

pytestmark = pytest.mark.timeout(900)


@pytest.fixture(scope="module")
def cluster() -> Iterator[LocalCluster]:
    with LocalCluster(3, session_timeout_ms=2000, replica_lag_time_max_ms=2000) as c:
        yield c


def test_a_view_equals_the_model_while_leaders_die(spark: SparkSession, cluster: LocalCluster,
                                                    tmp_path: Path) -> None:
    faults: list[str] = []

    @contextlib.contextmanager
    def nemesis(topic: str) -> Iterator[None]:
        n = Nemesis(cluster, topic, faults=6, seed=23, kinds=("kill_leader",), gap_s=(0.5, 2.0),
                    settle_s=6.0, log=faults.append)
        n.start()
        try:
            yield
        finally:
            n.stop()
            n.join_and_check(120)
            print("\n".join(faults))

    kill_run(spark, cluster.bootstrap, tmp_path, during=nemesis)
    assert len(faults) >= 4, faults  # six unless the kill rounds ended first
