"""Client routing on a single broker: bootstrap failover, and no routes from a one-broker answer.

Routing to partition leaders on a cluster is tested against a real cluster in
tests/e2e/test_cluster_broker.py; here, what every user of the single broker sees.
"""

from __future__ import annotations

import socket

import pytest

from logstore.broker.embedded import EmbeddedBroker
from logstore.client.admin import Admin
from logstore.client.consumer import Consumer
from logstore.client.producer import Producer
from logstore.client.rpc import BrokerClient
from logstore.types import NewTopic, TopicPartition

pytestmark = pytest.mark.timeout(120)


def _dead_address() -> str:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return f"127.0.0.1:{s.getsockname()[1]}"


def test_an_unreachable_first_bootstrap_entry_is_skipped(shared_broker: EmbeddedBroker) -> None:
    bootstrap = f"{_dead_address()},{shared_broker.bootstrap}"
    with Admin(bootstrap) as admin:
        admin.create_topics([NewTopic("failover-first-dead", 2)])
    with Producer(bootstrap) as producer:
        offsets = [producer.send("failover-first-dead", f"v{i}".encode(), partition=i % 2).result(timeout=30).offset
                   for i in range(4)]
    assert offsets == [0, 0, 1, 1]
    with Consumer(bootstrap, auto_offset_reset="earliest") as consumer:
        consumer.assign([TopicPartition("failover-first-dead", 0), TopicPartition("failover-first-dead", 1)])
        got = []
        for _ in range(20):
            got += [r.value for r in consumer.poll(1.0)]
            if len(got) == 4:
                break
    assert sorted(got) == [b"v0", b"v1", b"v2", b"v3"]


def test_a_single_broker_answer_adds_no_routes(shared_broker: EmbeddedBroker) -> None:
    with BrokerClient(shared_broker.bootstrap) as client:
        client.create_topics([NewTopic("routing-single", 3)])
        client.metadata(["routing-single"])
        # every partition goes home: one connection, one group
        groups = client.transport.router.split([TopicPartition("routing-single", p) for p in range(3)])
        assert [(conn.address, indexes, epochs) for conn, indexes, epochs in groups] == [
            (shared_broker.bootstrap, [0, 1, 2], {})]
