"""Kafka clients on a secured 2-broker cluster (issue 25): SASL_SSL, the authorizer and etcd's users.

A real LocalCluster (etcd and two broker processes, each with a Kafka listener) on SASL_SSL
with the authorizer on; users in etcd (``logstore users create --metadata``), ACLs made by a
super user through logstore's Admin. confluent-kafka logs in with SCRAM-SHA-512 over TLS on
either broker: Metadata lists both brokers, an idempotent ``acks=all`` producer writes to a
topic replicated on both, a consumer group (its coordinator found through FindCoordinator)
reads it back; a user without WRITE is refused with TOPIC_AUTHORIZATION_FAILED by both
brokers. No component of ours is mocked.
"""

from __future__ import annotations

import time
from pathlib import Path
from typing import Any

import pytest

pytest.importorskip("kio", reason="the Kafka listener needs kio (Python 3.11+)")
ck = pytest.importorskip("confluent_kafka")

from click.testing import CliRunner  # noqa: E402
from confluent_kafka.admin import AdminClient  # noqa: E402
from kafka_tools import CLIENT_CONF  # noqa: E402
from security_helpers import Certificates, tls_dir  # noqa: E402, F401 - the session fixture

from logstore import Admin, NewTopic  # noqa: E402
from logstore.acl import AclBinding  # noqa: E402
from logstore.cli import main  # noqa: E402
from logstore.client.security import ClientSecurity  # noqa: E402
from logstore.dev.local_cluster import LocalCluster  # noqa: E402

TOPIC = "ks-orders"


def _password(user: str) -> str:
    return f"{user}-Pw-1"


@pytest.mark.timeout(240)
def test_kafka_clients_log_in_and_are_authorized_on_every_broker_of_a_cluster(
        tls_dir: Certificates, tmp_path: Path) -> None:  # noqa: F811
    config = {"security_protocol": "SASL_SSL", "tls_cert": tls_dir.server_cert, "tls_key": tls_dir.server_key,
              "tls_ca": tls_dir.ca, "sasl_inter_broker_username": "broker",
              "sasl_inter_broker_mechanism": "SCRAM-SHA-512", "authorizer": True,
              "super_users": "User:broker,User:admin", "group_heartbeat_interval_ms": 500}
    env = {"LOGSTORE_SASL_INTER_BROKER_PASSWORD": _password("broker")}
    with LocalCluster(2, tmp_path / "c", extra_config=config, env=env, kafka=True) as cluster:
        runner = CliRunner()
        for user in ("broker", "admin", "alice", "bob"):  # the users, straight into etcd
            created = runner.invoke(main, ["users", "create", user, "--password-stdin", "--metadata",
                                           cluster.metadata_url], input=_password(user) + "\n")
            assert created.exit_code == 0, created.output
        admin_login = ClientSecurity(security_protocol="SASL_SSL", sasl_mechanism="SCRAM-SHA-512",
                                     sasl_plain_username="admin", sasl_plain_password=_password("admin"),
                                     ssl_cafile=tls_dir.ca)
        with Admin(cluster.bootstrap, security=admin_login) as admin:
            admin.create_topics([NewTopic(TOPIC, 2, replication_factor=2)])
            admin.create_acls([AclBinding.create(resource_type=kind, resource_name="ks-", pattern_type="PREFIXED",
                                                 principal="User:alice", operation=op)
                               for kind, op in (("TOPIC", "WRITE"), ("TOPIC", "READ"), ("GROUP", "READ"))])
            admin.create_acls([AclBinding.create(resource_type="TOPIC", resource_name="ks-", pattern_type="PREFIXED",
                                                 principal="User:bob", operation="DESCRIBE")])

        def conf(user: str, bootstrap: str) -> dict[str, Any]:
            return {"bootstrap.servers": bootstrap, "security.protocol": "SASL_SSL",
                    "sasl.mechanism": "SCRAM-SHA-512", "sasl.username": user, "sasl.password": _password(user),
                    "ssl.ca.location": tls_dir.ca, **CLIENT_CONF}
        for node in cluster.node_ids:  # every broker's listener: the cluster as Kafka clients see it
            deadline = time.monotonic() + 60
            while True:
                listed = AdminClient(conf("alice", cluster.kafka_address(node))).list_topics(timeout=20)
                partitions = listed.topics[TOPIC].partitions if TOPIC in listed.topics else {}
                if len(listed.brokers) == 2 and len(partitions) == 2 and all(
                        p.leader in cluster.node_ids and len(p.isrs) == 2 for p in partitions.values()):
                    break
                assert time.monotonic() < deadline, (listed.brokers, partitions)
                time.sleep(0.5)

        producer = ck.Producer({**conf("alice", cluster.kafka_bootstrap), "enable.idempotence": True, "acks": "all"})
        delivered: list[Any] = []
        for i in range(20):
            producer.produce(TOPIC, b"order-%d" % i, key=b"%d" % i, on_delivery=lambda e, m: delivered.append(e))
        assert producer.flush(60) == 0 and delivered == [None] * 20

        consumer = ck.Consumer({**conf("alice", cluster.kafka_bootstrap), "group.id": "ks-billing",
                                "auto.offset.reset": "earliest", "enable.auto.commit": False})
        try:
            consumer.subscribe([TOPIC])
            got: set[bytes] = set()
            deadline = time.monotonic() + 60
            while len(got) < 20 and time.monotonic() < deadline:
                message = consumer.poll(0.5)
                if message is not None:
                    assert message.error() is None, message.error()
                    got.add(message.value())
            assert got == {b"order-%d" % i for i in range(20)}
            consumer.commit(asynchronous=False)
        finally:
            consumer.close()

        for node in cluster.node_ids:  # both leaders refuse bob's records
            refused: list[Any] = []
            for p in (0, 1):  # a producer each: librdkafka fails the topic's later records itself
                bob = ck.Producer({**conf("bob", cluster.kafka_address(node)), "enable.idempotence": False,
                                   "message.timeout.ms": 20_000})
                bob.produce(TOPIC, b"not bob's", partition=p, on_delivery=lambda e, m, into=refused: into.append(e))
                assert bob.flush(30) == 0
            assert [e.code() for e in refused] == [ck.KafkaError.TOPIC_AUTHORIZATION_FAILED] * 2
