"""ACLs on a cluster live in etcd (issue 12): an ACL created through one broker applies on
another within about a second (each broker watches the key); concurrent updates by CAS
lose nothing."""

from __future__ import annotations

import asyncio
import time

import grpc
import pytest
from acl_helpers import records
from etcd_helpers import cluster_id, etcd  # noqa: F401 - fixtures

from logstore._proto import logstore_pb2 as pb
from logstore._proto import logstore_pb2_grpc as pb_grpc
from logstore.acl import AclBinding, AclFilter
from logstore.broker.embedded import EmbeddedBroker
from logstore.broker.security.acl_store import EtcdAclStore
from logstore.broker.security.producer_ids import counter_of, is_bound
from logstore.client.admin import Admin
from logstore.dev.etcd_process import EtcdServer
from logstore.errors import TopicAuthorizationError
from logstore.types import NewTopic
from replication.metadata_store import MetadataStore

pytestmark = pytest.mark.timeout(120)


def _acl(name: str, permission: str = "ALLOW") -> AclBinding:
    return AclBinding.create(resource_type="TOPIC", resource_name=name, principal="User:ANONYMOUS",
                             operation="DESCRIBE_CONFIGS", permission=permission)


def test_concurrent_updates_and_the_watch(etcd: EtcdServer, cluster_id: str) -> None:  # noqa: F811
    async def scenario() -> None:
        stores = [await MetadataStore.connect(etcd.endpoint, cluster_id=cluster_id) for _ in range(2)]
        a, b = (EtcdAclStore(s) for s in stores)
        seen: list[frozenset[AclBinding]] = []

        async def watch() -> None:
            async for acls in b.watch():
                seen.append(acls)
        watcher = asyncio.create_task(watch())
        try:
            await asyncio.gather(*(a.update(lambda old, n=n: old | {_acl(f"t{n}")}) for n in range(5)),
                                 *(b.update(lambda old, n=n: old | {_acl(f"u{n}")}) for n in range(5)))
            want = {_acl(f"t{n}") for n in range(5)} | {_acl(f"u{n}") for n in range(5)}
            assert await a.load() == want  # CAS: no update lost
            deadline = time.monotonic() + 5
            while not seen or seen[-1] != want:
                assert time.monotonic() < deadline, seen[-1:]
                await asyncio.sleep(0.02)
        finally:
            watcher.cancel()
            for s in stores:
                await s.close()
    asyncio.run(scenario())


def test_an_acl_applies_on_every_broker(etcd: EtcdServer, cluster_id: str) -> None:  # noqa: F811
    common = {"metadata": etcd.url, "cluster_id": cluster_id, "broker_session_timeout_ms": 2000,
              "authorizer": True, "allow_everyone_if_no_acl_found": True}
    brokers = [EmbeddedBroker(overrides={**common, "node_id": i}) for i in (1, 2)]
    try:
        for b in brokers:
            b.start()
        with Admin(brokers[0].bootstrap) as one, Admin(brokers[1].bootstrap) as two:
            one.create_topics([NewTopic("acl-c", 1)])
            assert "acl-c" in two.describe_configs(["acl-c"])
            one.create_acls([_acl("acl-c", "DENY")])
            started = time.monotonic()
            while True:
                try:
                    two.describe_configs(["acl-c"])
                except TopicAuthorizationError:
                    print(f"ACL applied on broker 2 after {(time.monotonic() - started) * 1000:.0f} ms")
                    break
                assert time.monotonic() - started < 1.0, "broker 2 did not apply the ACL within 1 s"
                time.sleep(0.01)
            assert two.describe_acls(AclFilter(resource_name="acl-c")) == [_acl("acl-c", "DENY")]
            two.delete_acls([AclFilter(resource_name="acl-c")])
            started = time.monotonic()
            while True:
                try:
                    one.describe_configs(["acl-c"])
                    break
                except TopicAuthorizationError:
                    assert time.monotonic() - started < 1.0, "broker 1 did not drop the ACL within 1 s"
                    time.sleep(0.01)
    finally:
        for b in brokers:
            b.close()


def test_a_producer_id_issued_by_one_broker_is_checked_on_another(etcd: EtcdServer, cluster_id: str) -> None:  # noqa: F811
    """Bound producer ids (issue 22) need one key per cluster: an id broker 1 issued is accepted
    by broker 2 for the same principal, and a plain counter (an id nobody was issued) is
    refused there, so the check holds wherever a partition's leadership goes."""
    common = {"metadata": etcd.url, "cluster_id": cluster_id, "broker_session_timeout_ms": 2000,
              "authorizer": True, "allow_everyone_if_no_acl_found": True}
    brokers = [EmbeddedBroker(overrides={**common, "node_id": i}) for i in (1, 2)]
    try:
        for b in brokers:
            b.start()
        with Admin(brokers[0].bootstrap) as admin:
            # Placement spreads over the brokers broker 1 knows: wait until it knows broker 2.
            deadline = time.monotonic() + 30
            while len(admin.describe_cluster().brokers) < 2:
                assert time.monotonic() < deadline, "broker 1 to see broker 2"
                time.sleep(0.1)
            admin.create_topics([NewTopic("pid-c", 4, replication_factor=1)])
        with grpc.insecure_channel(brokers[0].bootstrap) as one, grpc.insecure_channel(brokers[1].bootstrap) as two:
            stub_one, stub_two = pb_grpc.LogstoreStub(one), pb_grpc.LogstoreStub(two)
            deadline = time.monotonic() + 10
            while True:
                meta = stub_two.Metadata(pb.MetadataRequest(topics=["pid-c"]), timeout=10).topics[0]
                on_two = [p.partition for p in meta.partitions if p.leader == 2]
                if on_two:
                    break
                assert time.monotonic() < deadline, meta
                time.sleep(0.1)
            issued = stub_one.InitProducerId(pb.InitProducerIdRequest(), timeout=10)
            assert not issued.error.code and is_bound(issued.producer_id), issued

            def produce(pid: int, seq: int) -> str:
                r = stub_two.Produce(pb.ProduceRequest(acks=1, partitions=[pb.ProducePartition(
                    topic="pid-c", partition=on_two[0], records=records(pid=pid, epoch=0, seq=seq))]), timeout=10)
                return r.partitions[0].error.code
            # The cluster's metadata names broker 2 the leader a moment before broker 2 has taken
            # the leadership up (a client retries NOT_LEADER_OR_FOLLOWER; so does this test).
            deadline = time.monotonic() + 20
            while (code := produce(issued.producer_id, 0)) == "NOT_LEADER_OR_FOLLOWER":
                assert time.monotonic() < deadline, "broker 2 to take up the leadership it was given"
                time.sleep(0.1)
            assert code == ""
            assert produce(counter_of(issued.producer_id), 0) == "CLUSTER_AUTHORIZATION_FAILED"
    finally:
        for b in brokers:
            b.close()
