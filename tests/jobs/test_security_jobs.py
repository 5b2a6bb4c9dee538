"""The Spark jobs against a secured broker (issue 12): compaction and a materialized view log in
with SCRAM and are authorized by ACLs, in the driver and in the executors' tasks.

One real broker on a SASL_PLAINTEXT listener with the authorizer on. ``User:admin`` (a super
user) creates a compacted topic and writes it; ``User:alice`` may Read and Alter it (what the
compaction job needs: Alter is the segment swap) and nothing else. The jobs run on the test
session's SparkSession with alice's credentials: ``run_compaction(security=...)``, and
``materialize`` with the ``logstore.security.*``/``sasl.*`` source options that
``logstore jobs materialize`` derives from ``--command-config``/``LOGSTORE_*``.
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest
from compaction_helpers import produce_batches

from compaction.job import run_compaction
from jobs.materialize import materialize
from logstore.acl import AclBinding
from logstore.broker.embedded import EmbeddedBroker
from logstore.broker.security.credentials import FileCredentials
from logstore.client.admin import Admin
from logstore.client.producer import Producer
from logstore.client.security import ClientSecurity
from logstore.errors import SaslAuthenticationError
from logstore.scram import make_credential

pytestmark = pytest.mark.timeout(240)

TOPIC = "secured-profiles"
PASSWORD = "jobs-test-Pa55"


def _login(user: str) -> ClientSecurity:
    return ClientSecurity(security_protocol="SASL_PLAINTEXT", sasl_mechanism="SCRAM-SHA-256",
                          sasl_plain_username=user, sasl_plain_password=PASSWORD)


@pytest.fixture(scope="module")
def secured(tmp_path_factory: pytest.TempPathFactory) -> Iterator[EmbeddedBroker]:
    data_dir = str(tmp_path_factory.mktemp("secured-jobs"))
    for user in ("alice", "admin"):  # as `logstore users create NAME --data-dir DIR` does
        FileCredentials(data_dir).alter(user, [make_credential("SCRAM-SHA-256", PASSWORD)], [])
    with EmbeddedBroker(data_dir, overrides={
            "security_protocol": "SASL_PLAINTEXT", "sasl_failure_delay_ms": 0,
            "authorizer": True, "super_users": "User:admin"}) as broker:
        with Admin(broker.bootstrap, security=_login("admin")) as admin:
            admin.create_topic(TOPIC, 1, configs={"cleanup.policy": "compact", "segment.bytes": "1024",
                                                  "min.cleanable.dirty.ratio": "0.01"})
            admin.create_acls([AclBinding.create(resource_type="TOPIC", resource_name=TOPIC,
                                                 principal="User:alice", operation=op)
                               for op in ("Read", "Alter")])
        with Producer(broker.bootstrap, security=_login("admin")) as producer:
            # 5 rounds of the same 10 keys, one batch each: every batch closes a 1 KiB segment
            produce_batches(producer, TOPIC, [
                [(1_000 + r, f"user-{k}".encode(), f"round-{r}-{'x' * 40}".encode()) for k in range(10)]
                for r in range(5)
            ])
        yield broker


def test_compaction_logs_in_and_is_authorized_in_driver_and_tasks(spark, secured) -> None:  # type: ignore[no-untyped-def]
    with pytest.raises(SaslAuthenticationError):  # no credentials: the SASL listener refuses the planning call
        run_compaction(spark, bootstrap=secured.bootstrap, topic=TOPIC, force=True)
    summary = run_compaction(spark, bootstrap=secured.bootstrap, topic=TOPIC, force=True,
                             security=_login("alice"))
    results = [r for r in summary.partitions if r.error is None]
    assert results and all(r.error is None for r in summary.partitions), summary.format()
    assert sum(r.records_removed for r in results) > 0, summary.format()


def test_a_view_reads_a_secured_topic_with_the_source_security_options(spark, secured, tmp_path: Path) -> None:  # type: ignore[no-untyped-def]
    table = str(tmp_path / "view")
    query = materialize(spark, bootstrap=secured.bootstrap, topic=TOPIC, table=table, available_now=True,
                        checkpoint=str(tmp_path / "ck"), source_options=_login("alice").prefixed_options())
    query.awaitTermination(180)
    rows = spark.read.format("delta").load(table).collect()
    assert {bytes(r["key"]): bytes(r["value"]).split(b"-")[1] for r in rows} == {
        f"user-{k}".encode(): b"4" for k in range(10)}
