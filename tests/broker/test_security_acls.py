"""Authorization end to end (issue 12): for every RPC of the service, on one real broker with
the authorizer on — denied without credentials, denied with credentials but no ACL, allowed
with the ACL, denied again after a DENY ACL. Internal topics, member ids, the ACL RPCs on a
broker without an authorizer, and ``logstore acls``.

Principals: alice, bob and admin log in with SCRAM (``SaslAuthenticate``, the client's
``SessionLogin``) and the calls carry their session tokens as ``logstore-session`` metadata;
a call without one is refused by the SASL listener (UNAUTHENTICATED). ``User:admin`` is a
super user. The ACL CLI runs against a plaintext broker whose resources without ACLs are open.
"""

from __future__ import annotations

import json
import shlex
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import grpc
import pytest
from acl_helpers import (
    GROUP,
    PASSWORD,
    SINK,
    TOPIC,
    TXN,
    Metadata,
    ServedBroker,
    acl,
    clear_acls,
    records,
    set_acls,
)
from click.testing import CliRunner

from logstore._proto import logstore_pb2 as pb
from logstore._proto import logstore_pb2_grpc as pb_grpc
from logstore.acl import AclBinding, AclFilter
from logstore.broker.embedded import EmbeddedBroker
from logstore.broker.security.acl_service import RPC_AUTHORIZATION
from logstore.cli import main as cli
from logstore.client.acls import binding_to_pb
from logstore.client.admin import Admin
from logstore.errors import SecurityDisabledError, TopicAuthorizationError

pytestmark = pytest.mark.timeout(120)


@pytest.fixture(scope="module")
def served(tmp_path_factory: pytest.TempPathFactory) -> Iterator[ServedBroker]:
    s = ServedBroker(str(tmp_path_factory.mktemp("acl-broker")))
    admin = s.md("User:admin")
    r = s.stub.CreateTopics(pb.CreateTopicsRequest(topics=[pb.NewTopic(name=TOPIC, partitions=1)]), metadata=admin)
    assert not r.results[0].error.code, r
    yield s
    s.close()


def _auth_codes(message: Any) -> list[str]:
    """Every *_AUTHORIZATION_FAILED code in the item errors of a response, at any depth."""
    out: list[str] = []
    for fd, value in message.ListFields():
        if fd.message_type is None or fd.message_type.GetOptions().map_entry:
            continue
        for item in (value if fd.is_repeated else [value]):
            if fd.message_type.name == "Error":
                if item.code.endswith("AUTHORIZATION_FAILED"):
                    out.append(item.code)
            else:
                out.extend(_auth_codes(item))
    return out


@dataclass(frozen=True)
class Case:
    """One RPC: how to call it, the ACLs that allow it, and (for RPCs that filter instead of
    failing) how to see in the answer that the resource was left out."""

    rpc: str
    call: Callable[[pb_grpc.LogstoreStub, Metadata], Any]
    grants: tuple[AclBinding, ...]
    hidden: Callable[[Any], bool] | None = None


def denied(case: Case, stub: pb_grpc.LogstoreStub, md: Metadata) -> bool:
    """Whether the call was refused by authorization (a status or an item error), or — for an
    RPC that filters — its answer leaves the resource out. Any other failure means the call
    got past authorization."""
    try:
        response = case.call(stub, md)
    except grpc.RpcError as e:
        code = dict(e.trailing_metadata() or ()).get("logstore-error-code", "")
        if not md:  # no credentials: the SASL listener refuses the call before any handler
            assert (e.code(), code) == (grpc.StatusCode.UNAUTHENTICATED, "SASL_AUTHENTICATION_FAILED"), case.rpc
            return True
        if e.code() == grpc.StatusCode.PERMISSION_DENIED:
            assert code.endswith("AUTHORIZATION_FAILED"), (case.rpc, code, e.details())
            return True
        assert not code.endswith("AUTHORIZATION_FAILED"), (case.rpc, e.code(), code)
        return False
    if _auth_codes(response):
        return True
    return case.hidden(response) if case.hidden is not None else False


def _replace_segments(stub: pb_grpc.LogstoreStub, md: Metadata) -> Any:
    begin = pb.ReplaceSegmentsRequest(begin=pb.ReplaceSegmentsBegin(topic=TOPIC, partition=0, end_offset=0))
    return stub.ReplaceSegments(iter([begin]), metadata=md, timeout=10)


def _cases() -> list[Case]:
    tp = [pb.TopicPartitionRef(topic=TOPIC, partition=0)]
    return [
        Case("CreateTopics", lambda s, md: s.CreateTopics(pb.CreateTopicsRequest(
            topics=[pb.NewTopic(name="acl-new", partitions=1)], validate_only=True), metadata=md),
            (acl("CREATE", name="acl-new"),)),
        Case("DeleteTopics", lambda s, md: s.DeleteTopics(pb.DeleteTopicsRequest(names=["acl-missing"]), metadata=md),
             (acl("DELETE", name="acl-missing"),)),
        Case("CreatePartitions", lambda s, md: s.CreatePartitions(pb.CreatePartitionsRequest(
            topics=[pb.CreatePartitionsRequest.Topic(name=TOPIC, count=2)], validate_only=True), metadata=md),
            (acl("ALTER"),)),
        Case("Metadata", lambda s, md: s.Metadata(pb.MetadataRequest(), metadata=md), (acl("DESCRIBE"),),
             hidden=lambda r: TOPIC not in [t.name for t in r.topics]),
        Case("DescribeConfigs", lambda s, md: s.DescribeConfigs(pb.DescribeConfigsRequest(topics=[TOPIC]), metadata=md),
             (acl("DESCRIBE_CONFIGS"),)),
        Case("AlterConfigs", lambda s, md: s.AlterConfigs(pb.AlterConfigsRequest(alterations=[
            pb.AlterConfigsRequest.Alteration(topic=TOPIC, set={"retention.ms": "3600000"})], validate_only=True),
            metadata=md), (acl("ALTER_CONFIGS"),)),
        Case("Produce", lambda s, md: s.Produce(pb.ProduceRequest(acks=1, partitions=[
            pb.ProducePartition(topic=TOPIC, partition=0, records=records())]), metadata=md), (acl("WRITE"),)),
        Case("ProduceStream", lambda s, md: next(iter(s.ProduceStream(iter([pb.ProduceRequest(
            acks=1, correlation_id=1, partitions=[pb.ProducePartition(topic=TOPIC, partition=0, records=records())])]),
            metadata=md, timeout=10))), (acl("WRITE"),)),
        Case("Fetch", lambda s, md: s.Fetch(pb.FetchRequest(max_wait_ms=0, partitions=[
            pb.FetchPartition(topic=TOPIC, partition=0, fetch_offset=0)]), metadata=md), (acl("READ"),)),
        Case("Fetch", lambda s, md: s.Fetch(pb.FetchRequest(replica_id=7, max_wait_ms=0, partitions=[
            pb.FetchPartition(topic=TOPIC, partition=0)]), metadata=md), (acl("CLUSTER_ACTION", "CLUSTER", ""),)),
        Case("ListOffsets", lambda s, md: s.ListOffsets(pb.ListOffsetsRequest(partitions=[
            pb.ListOffsetsPartition(topic=TOPIC, partition=0, timestamp=-1)]), metadata=md), (acl("DESCRIBE"),)),
        Case("DeleteRecords", lambda s, md: s.DeleteRecords(pb.DeleteRecordsRequest(partitions=[
            pb.DeleteRecordsPartition(topic=TOPIC, partition=0, offset=0)]), metadata=md), (acl("DELETE"),)),
        Case("OffsetsForLeaderEpoch", lambda s, md: s.OffsetsForLeaderEpoch(
            pb.OffsetsForLeaderEpochRequest(replica_id=7), metadata=md), (acl("CLUSTER_ACTION", "CLUSTER", ""),)),
        Case("WriteTxnMarkers", lambda s, md: s.WriteTxnMarkers(pb.WriteTxnMarkersRequest(markers=[pb.TxnMarker(
            producer_id=987654, producer_epoch=0, commit=False,
            partitions=[pb.TopicPartitionRef(topic=TOPIC, partition=0)])]), metadata=md),
            (acl("CLUSTER_ACTION", "CLUSTER", ""),)),
        Case("DescribeCleaning", lambda s, md: s.DescribeCleaning(pb.DescribeCleaningRequest(topics=[TOPIC]),
                                                                  metadata=md), (acl("DESCRIBE"),)),
        Case("ReplaceSegments", _replace_segments, (acl("ALTER"),)),
        Case("InitProducerId", lambda s, md: s.InitProducerId(pb.InitProducerIdRequest(
            transactional_id=TXN, transaction_timeout_ms=60_000), metadata=md), (acl("WRITE", "TRANSACTIONAL_ID", TXN),)),
        Case("InitProducerId", lambda s, md: s.InitProducerId(pb.InitProducerIdRequest(), metadata=md),
             (acl("IDEMPOTENT_WRITE", "CLUSTER", ""),)),
        Case("AddPartitionsToTxn", lambda s, md: s.AddPartitionsToTxn(pb.AddPartitionsToTxnRequest(
            transactional_id=TXN, producer_id=1, producer_epoch=0, partitions=tp), metadata=md),
            (acl("WRITE", "TRANSACTIONAL_ID", TXN), acl("WRITE"))),
        Case("AddPartitionsToTxn", lambda s, md: s.AddPartitionsToTxn(pb.AddPartitionsToTxnRequest(
            transactional_id=TXN, producer_id=1, producer_epoch=0, partitions=tp, verify_only=True), metadata=md),
            (acl("CLUSTER_ACTION", "CLUSTER", ""),)),
        Case("EndTxn", lambda s, md: s.EndTxn(pb.EndTxnRequest(transactional_id=TXN, producer_id=1, producer_epoch=0,
                                                               txn_number=1, commit=False), metadata=md),
             (acl("WRITE", "TRANSACTIONAL_ID", TXN),)),
        Case("EndTxnGroup", lambda s, md: s.EndTxnGroup(pb.EndTxnGroupRequest(
            group_id=SINK, batch_id=0, abort_prefix=f"{SINK}/0/", commit=False), metadata=md),
            (acl("WRITE", "TRANSACTIONAL_ID", SINK, pattern="PREFIXED"),)),
        Case("DescribeTxnGroup", lambda s, md: s.DescribeTxnGroup(pb.DescribeTxnGroupRequest(group_id=SINK),
                                                                  metadata=md), (acl("DESCRIBE", "TRANSACTIONAL_ID", SINK),)),
        Case("ConsumerGroupHeartbeat", lambda s, md: s.ConsumerGroupHeartbeat(pb.ConsumerGroupHeartbeatRequest(
            group_id=GROUP, member_id="m-acl", member_epoch=-1), metadata=md), (acl("READ", "GROUP", GROUP),)),
        Case("OffsetCommit", lambda s, md: s.OffsetCommit(pb.OffsetCommitRequest(
            group_id=GROUP, member_epoch=-1, partitions=[pb.OffsetCommitPartition(topic=TOPIC, partition=0, offset=0)]),
            metadata=md), (acl("READ", "GROUP", GROUP), acl("READ"))),
        Case("OffsetFetch", lambda s, md: s.OffsetFetch(pb.OffsetFetchRequest(group_id=GROUP), metadata=md),
             (acl("DESCRIBE", "GROUP", GROUP),)),
        Case("ListGroups", lambda s, md: s.ListGroups(pb.ListGroupsRequest(), metadata=md),
             (acl("DESCRIBE", "GROUP", GROUP),), hidden=lambda r: GROUP not in [g.group_id for g in r.groups]),
        Case("DescribeGroups", lambda s, md: s.DescribeGroups(pb.DescribeGroupsRequest(group_ids=[GROUP]), metadata=md),
             (acl("DESCRIBE", "GROUP", GROUP),)),
        Case("DeleteGroups", lambda s, md: s.DeleteGroups(pb.DeleteGroupsRequest(group_ids=["acl-none"]), metadata=md),
             (acl("DELETE", "GROUP", "acl-none"),)),
        Case("FindCoordinator", lambda s, md: s.FindCoordinator(pb.FindCoordinatorRequest(
            key_type=pb.GROUP, keys=[GROUP]), metadata=md), (acl("DESCRIBE", "GROUP", GROUP),)),
        Case("FindCoordinator", lambda s, md: s.FindCoordinator(pb.FindCoordinatorRequest(
            key_type=pb.TRANSACTION, keys=[TXN]), metadata=md), (acl("DESCRIBE", "TRANSACTIONAL_ID", TXN),)),
        Case("AlterUserScramCredentials", lambda s, md: s.AlterUserScramCredentials(
            pb.AlterUserScramCredentialsRequest(), metadata=md), (acl("ALTER", "CLUSTER", ""),)),
        Case("DescribeUserScramCredentials", lambda s, md: s.DescribeUserScramCredentials(
            pb.DescribeUserScramCredentialsRequest(users=["nobody"]), metadata=md), (acl("DESCRIBE", "CLUSTER", ""),)),
        Case("CreateAcls", lambda s, md: s.CreateAcls(pb.CreateAclsRequest(creations=[binding_to_pb(
            acl("READ", principal="User:nobody"))]), metadata=md), (acl("ALTER", "CLUSTER", ""),)),
        Case("DescribeAcls", lambda s, md: s.DescribeAcls(pb.DescribeAclsRequest(), metadata=md),
             (acl("DESCRIBE", "CLUSTER", ""),)),
        Case("DeleteAcls", lambda s, md: s.DeleteAcls(pb.DeleteAclsRequest(filters=[
            pb.AclBinding(principal="User:nobody")]), metadata=md), (acl("ALTER", "CLUSTER", ""),)),
        # A single broker answers these with INVALID_REQUEST ("needs a cluster") once authorized.
        Case("AlterPartitionReassignments", lambda s, md: s.AlterPartitionReassignments(
            pb.AlterPartitionReassignmentsRequest(partitions=[pb.ReassignablePartition(
                topic=TOPIC, partition=0, replicas=[1])]), metadata=md), (acl("ALTER", "CLUSTER", ""),)),
        Case("ListPartitionReassignments", lambda s, md: s.ListPartitionReassignments(
            pb.ListPartitionReassignmentsRequest(), metadata=md), (acl("DESCRIBE", "CLUSTER", ""),)),
        Case("ElectLeaders", lambda s, md: s.ElectLeaders(pb.ElectLeadersRequest(partitions=tp), metadata=md),
             (acl("ALTER", "CLUSTER", ""),)),
    ]


CASES = _cases()
SERVICE_RPCS = {m.name for m in pb.DESCRIPTOR.services_by_name["Logstore"].methods}
UNCHECKED = {"SaslAuthenticate"}  # the authentication itself: it runs before there is a principal
# Declared in the protocol, handlers being written (issue 15); each gets its matrix case with its handler.


def test_every_rpc_is_in_the_table_and_in_the_matrix() -> None:
    assert set(RPC_AUTHORIZATION) == SERVICE_RPCS
    assert {c.rpc for c in CASES} == SERVICE_RPCS - UNCHECKED


@pytest.mark.parametrize("case", CASES, ids=[f"{c.rpc}-{i}" for i, c in enumerate(CASES)])
def test_rpc_matrix(served: ServedBroker, case: Case) -> None:
    stub, anonymous, alice = served.stub, served.md(None), served.md("User:alice")
    clear_acls(served)
    try:
        assert denied(case, stub, anonymous), "anonymous, no ACL"
        assert denied(case, stub, alice), "alice, no ACL"
        set_acls(served, case.grants, "ALLOW")
        assert not denied(case, stub, alice), "alice, with the ACL"
        assert denied(case, stub, anonymous), "anonymous, with alice's ACL"
        set_acls(served, case.grants, "DENY")
        assert denied(case, stub, alice), "alice, with the ACL and a DENY"
        assert not denied(case, stub, served.md("User:admin")), "a super user"
    finally:
        clear_acls(served)


def test_produce_and_fetch_answer_a_refused_topic_per_partition(served: ServedBroker) -> None:
    # Kafka's rule: the partitions of a topic the caller may not use carry
    # TOPIC_AUTHORIZATION_FAILED; the request's other partitions are served.
    stub, alice, admin = served.stub, served.md("User:alice"), served.md("User:admin")
    other = "acl-other"
    r = stub.CreateTopics(pb.CreateTopicsRequest(topics=[pb.NewTopic(name=other, partitions=1)]), metadata=admin)
    assert not r.results[0].error.code, r
    set_acls(served, (acl("WRITE"), acl("READ")), "ALLOW")
    try:
        before = stub.ListOffsets(pb.ListOffsetsRequest(partitions=[
            pb.ListOffsetsPartition(topic=t, partition=0, timestamp=-1) for t in (TOPIC, other)]), metadata=admin)
        ends = [p.offset for p in before.partitions]
        produced = stub.Produce(pb.ProduceRequest(acks=1, partitions=[
            pb.ProducePartition(topic=other, partition=0, records=records()),
            pb.ProducePartition(topic=TOPIC, partition=0, records=records(2))]), metadata=alice)
        assert [(p.topic, p.error.code) for p in produced.partitions] == [
            (other, "TOPIC_AUTHORIZATION_FAILED"), (TOPIC, "")]
        assert list(produced.partitions[1].base_offsets) == [ends[0]]
        after = stub.ListOffsets(pb.ListOffsetsRequest(partitions=[
            pb.ListOffsetsPartition(topic=t, partition=0, timestamp=-1) for t in (TOPIC, other)]), metadata=admin)
        assert [p.offset for p in after.partitions] == [ends[0] + 2, ends[1]]  # nothing written to the refused one
        fetched = stub.Fetch(pb.FetchRequest(max_wait_ms=0, partitions=[
            pb.FetchPartition(topic=TOPIC, partition=0, fetch_offset=ends[0]),
            pb.FetchPartition(topic=other, partition=0, fetch_offset=0)]), metadata=alice)
        assert [(p.topic, p.error.code, bool(p.records)) for p in fetched.partitions] == [
            (TOPIC, "", True), (other, "TOPIC_AUTHORIZATION_FAILED", False)]
        refused_only = stub.Produce(pb.ProduceRequest(acks=1, partitions=[
            pb.ProducePartition(topic=other, partition=0, records=records())]), metadata=alice)
        assert [p.error.code for p in refused_only.partitions] == ["TOPIC_AUTHORIZATION_FAILED"]
    finally:
        clear_acls(served)
        stub.DeleteTopics(pb.DeleteTopicsRequest(names=[other]), metadata=admin)


def test_internal_topics_only_for_super_users(served: ServedBroker) -> None:
    stub, alice, admin = served.stub, served.md("User:alice"), served.md("User:admin")
    set_acls(served, (acl("ALL", name="*"), acl("ALL", "CLUSTER", "")), "ALLOW")
    try:
        # The group coordinator's topic exists once a group committed.
        stub.OffsetCommit(pb.OffsetCommitRequest(group_id="acl-internal", member_epoch=-1, partitions=[
            pb.OffsetCommitPartition(topic=TOPIC, partition=0, offset=0)]), metadata=admin)
        listed = [t.name for t in stub.Metadata(pb.MetadataRequest(), metadata=alice).topics]
        assert TOPIC in listed and "__consumer_offsets" not in listed
        assert "__consumer_offsets" in [t.name for t in stub.Metadata(pb.MetadataRequest(), metadata=admin).topics]
        r = stub.DeleteTopics(pb.DeleteTopicsRequest(names=["__consumer_offsets"]), metadata=alice)
        assert r.results[0].error.code == "TOPIC_AUTHORIZATION_FAILED"
        r = stub.CreateTopics(pb.CreateTopicsRequest(topics=[pb.NewTopic(name="__mine", partitions=1)]), metadata=alice)
        assert r.results[0].error.code == "TOPIC_AUTHORIZATION_FAILED"
        r = stub.Fetch(pb.FetchRequest(partitions=[pb.FetchPartition(topic="__consumer_offsets", partition=0)]),
                       metadata=alice)
        assert [(p.error.code, p.records) for p in r.partitions] == [("TOPIC_AUTHORIZATION_FAILED", b"")]
        r = stub.DeleteTopics(pb.DeleteTopicsRequest(names=["__consumer_offsets"]), metadata=admin)
        assert r.results[0].error.code == "INTERNAL_TOPIC"  # a super user is refused by the broker's own rule
    finally:
        clear_acls(served)


def test_describe_groups_shows_member_ids_only_to_readers(served: ServedBroker) -> None:
    stub, alice, admin = served.stub, served.md("User:alice"), served.md("User:admin")
    hb = stub.ConsumerGroupHeartbeat(pb.ConsumerGroupHeartbeatRequest(
        group_id="acl-members", member_epoch=0, subscribed_topics=[TOPIC]), metadata=admin)
    assert not hb.error.code and len(hb.member_id) >= 32  # handed out by the broker: unguessable
    set_acls(served, (acl("DESCRIBE", "GROUP", "acl-members"),), "ALLOW")
    try:
        committed = stub.OffsetCommit(pb.OffsetCommitRequest(
            group_id="acl-members", member_id=hb.member_id, member_epoch=hb.member_epoch,
            partitions=[pb.OffsetCommitPartition(topic=TOPIC, partition=0, offset=0)]), metadata=admin)
        assert not committed.error.code, committed
        described = stub.DescribeGroups(pb.DescribeGroupsRequest(group_ids=["acl-members"]), metadata=alice)
        assert [m.member_id for m in described.groups[0].members] == [""]
        assert [c.member_id for c in described.groups[0].offsets] == [""]
        set_acls(served, (acl("DESCRIBE"),), "ALLOW")  # to see the topic's offsets at all
        fetched = stub.OffsetFetch(pb.OffsetFetchRequest(group_id="acl-members"), metadata=alice)
        assert [(o.offset, o.member_id) for o in fetched.offsets] == [(0, "")]
        with pytest.raises(grpc.RpcError) as e:  # nor may alice act as the member
            stub.OffsetCommit(pb.OffsetCommitRequest(group_id="acl-members", member_id=hb.member_id,
                                                     member_epoch=hb.member_epoch), metadata=alice)
        assert e.value.code() == grpc.StatusCode.PERMISSION_DENIED
        set_acls(served, (acl("READ", "GROUP", "acl-members"),), "ALLOW")
        described = stub.DescribeGroups(pb.DescribeGroupsRequest(group_ids=["acl-members"]), metadata=alice)
        assert [m.member_id for m in described.groups[0].members] == [hb.member_id]
        fetched = stub.OffsetFetch(pb.OffsetFetchRequest(group_id="acl-members"), metadata=alice)
        assert [o.member_id for o in fetched.offsets] == [hb.member_id]
    finally:
        stub.ConsumerGroupHeartbeat(pb.ConsumerGroupHeartbeatRequest(
            group_id="acl-members", member_id=hb.member_id, member_epoch=-1), metadata=admin)
        clear_acls(served)


def test_acl_rpcs_without_an_authorizer(shared_broker: EmbeddedBroker) -> None:
    with Admin(shared_broker.bootstrap) as admin:
        with pytest.raises(SecurityDisabledError, match="authorizer"):
            admin.describe_acls()
        with pytest.raises(SecurityDisabledError):
            admin.create_acls([acl("READ")])


@pytest.fixture(scope="module")
def open_broker() -> Iterator[EmbeddedBroker]:
    """Authorizer on, but resources without ACLs are open to everyone (so the CLI, which
    connects without credentials here, may manage ACLs)."""
    with EmbeddedBroker(overrides={"authorizer": True, "allow_everyone_if_no_acl_found": True}) as b:
        yield b


def test_acls_cli(open_broker: EmbeddedBroker) -> None:
    runner = CliRunner()
    b = ["--bootstrap", open_broker.bootstrap]
    with Admin(open_broker.bootstrap) as admin:
        admin.create_topic("cli-orders")
        assert "cli-orders" in admin.describe_configs(["cli-orders"])
        out = runner.invoke(cli, ["acls", "create", "--principal", "User:alice", "--operation", "Write",
                                  "--operation", "Read", "--topic", "cli-orders", *b])
        assert out.exit_code == 0, out.output
        out = runner.invoke(cli, ["acls", "create", "--principal", "User:*", "--operation", "DescribeConfigs",
                                  "--topic", "cli-", "--prefixed", "--deny", *b])
        assert out.exit_code == 0, out.output
        out = runner.invoke(cli, ["acls", "list", "--topic", "cli-orders", "--format", "json", *b])
        assert out.exit_code == 0, out.output
        listed = {(d["principal"], d["operation"], d["permission"], d["pattern_type"]) for d in json.loads(out.output)}
        assert listed == {("User:alice", "WRITE", "ALLOW", "LITERAL"), ("User:alice", "READ", "ALLOW", "LITERAL"),
                          ("User:*", "DESCRIBE_CONFIGS", "DENY", "PREFIXED")}
        # The topic now has ACLs, so allow_everyone no longer applies to it, and the DENY wins.
        with pytest.raises(TopicAuthorizationError):
            admin.describe_configs(["cli-orders"])
        out = runner.invoke(cli, ["acls", "delete", "--topic", "cli-", "--prefixed", *b])
        assert out.exit_code == 0 and "DESCRIBE_CONFIGS" in out.output, out.output
        out = runner.invoke(cli, ["acls", "delete", "--principal", "User:alice", "--operation", "Read",
                                  "--topic", "cli-orders", *b])
        assert out.exit_code == 0, out.output
        assert [a.operation for a in admin.describe_acls()] == ["WRITE"]
        out = runner.invoke(cli, ["acls", "delete", *b])
        assert out.exit_code == 2 and "refused" in out.output
        with open(f"{open_broker.data_dir}/meta/acls.json") as f:
            assert [d["operation"] for d in json.load(f)] == ["WRITE"]
    open_broker.restart()  # the ACLs are the broker's metadata: they survive a restart
    with Admin(open_broker.bootstrap) as admin:
        assert [(a.principal, a.operation, a.resource_name) for a in admin.describe_acls()] == [
            ("User:alice", "WRITE", "cli-orders")]
        out = runner.invoke(cli, ["acls", "create", "--principal", "alice", "--operation", "Write", "--topic", "x", *b])
        assert out.exit_code == 1 and "INVALID_REQUEST" in out.output


def test_producer_ids_are_not_credentials(served: ServedBroker) -> None:
    """A principal allowed to write the topic still cannot produce as another principal's
    idempotent producer (fencing it, or breaking its sequence), nor into another transactional
    id's transaction."""
    stub, alice, bob = served.stub, served.md("User:alice"), served.md("User:bob")

    def produce(md: Metadata, payload: bytes) -> str:
        r = stub.Produce(pb.ProduceRequest(acks=1, partitions=[
            pb.ProducePartition(topic=TOPIC, partition=0, records=payload)]), metadata=md)
        return r.partitions[0].error.code

    set_acls(served, (acl("WRITE"), acl("WRITE", principal="User:bob"),
                       acl("WRITE", "TRANSACTIONAL_ID", "alice-tx")), "ALLOW")
    try:
        r = stub.InitProducerId(pb.InitProducerIdRequest(), metadata=alice)  # WRITE on a topic suffices
        pid = r.producer_id
        assert not r.error.code and pid >= 0
        assert produce(bob, records(pid=pid, epoch=r.producer_epoch + 1, seq=0)) == "CLUSTER_AUTHORIZATION_FAILED"
        assert produce(alice, records(pid=pid, epoch=r.producer_epoch, seq=0)) == ""
        # An id this broker never issued belongs to nobody (issue 22: no claim by first use).
        assert produce(bob, records(pid=pid + 1000, epoch=0, seq=0)) == "CLUSTER_AUTHORIZATION_FAILED"
        assert produce(alice, records(pid=pid + 1000, epoch=0, seq=0)) == "CLUSTER_AUTHORIZATION_FAILED"

        t = stub.InitProducerId(pb.InitProducerIdRequest(transactional_id="alice-tx",
                                                         transaction_timeout_ms=60_000), metadata=alice)
        assert not t.error.code
        added = stub.AddPartitionsToTxn(pb.AddPartitionsToTxnRequest(
            transactional_id="alice-tx", producer_id=t.producer_id, producer_epoch=t.producer_epoch,
            partitions=[pb.TopicPartitionRef(topic=TOPIC, partition=0)]), metadata=alice)
        assert not added.error.code
        forged = records(pid=t.producer_id, epoch=t.producer_epoch, seq=0, txn=True)
        assert produce(bob, forged) == "TRANSACTIONAL_ID_AUTHORIZATION_FAILED"
        assert produce(alice, forged) == ""
        with pytest.raises(grpc.RpcError) as e:  # nor may bob end it, knowing every number
            stub.EndTxn(pb.EndTxnRequest(transactional_id="alice-tx", producer_id=t.producer_id,
                                         producer_epoch=t.producer_epoch, txn_number=added.txn_number,
                                         commit=False), metadata=bob)
        assert e.value.code() == grpc.StatusCode.PERMISSION_DENIED
        ended = stub.EndTxn(pb.EndTxnRequest(transactional_id="alice-tx", producer_id=t.producer_id,
                                             producer_epoch=t.producer_epoch, txn_number=added.txn_number,
                                             commit=True), metadata=alice)
        assert not ended.error.code
    finally:
        clear_acls(served)


def test_create_on_the_cluster_and_named_metadata(served: ServedBroker) -> None:
    stub, alice = served.stub, served.md("User:alice")
    set_acls(served, (acl("CREATE", "CLUSTER", ""),), "ALLOW")
    try:
        r = stub.CreateTopics(pb.CreateTopicsRequest(topics=[pb.NewTopic(name="any-name", partitions=1)],
                                                     validate_only=True), metadata=alice)
        assert not r.results[0].error.code  # CREATE on the cluster: any (non-internal) topic
        named = stub.Metadata(pb.MetadataRequest(topics=[TOPIC]), metadata=alice).topics
        assert [(t.name, t.error.code, len(t.partitions)) for t in named] == [
            (TOPIC, "TOPIC_AUTHORIZATION_FAILED", 0)]  # named: an error, and nothing about the topic
    finally:
        clear_acls(served)


def test_a_sink_abort_prefix_needs_a_prefixed_acl(served: ServedBroker) -> None:
    """EndTxnGroup's abort prefix aborts every transaction under it: literal ACLs on the names
    known so far do not cover it; a DENY on one name under it refuses the whole call."""
    stub, alice = served.stub, served.md("User:alice")

    def end_group() -> bool:
        return denied(CASES[[c.rpc for c in CASES].index("EndTxnGroup")], stub, alice)
    set_acls(served, (acl("WRITE", "TRANSACTIONAL_ID", SINK), acl("WRITE", "TRANSACTIONAL_ID", f"{SINK}/0/")), "ALLOW")
    try:
        assert end_group()
        set_acls(served, (acl("WRITE", "TRANSACTIONAL_ID", SINK, pattern="PREFIXED"),), "ALLOW")
        assert not end_group()
        set_acls(served, (acl("WRITE", "TRANSACTIONAL_ID", f"{SINK}/0/7"),), "DENY")
        assert end_group()
    finally:
        clear_acls(served)


def test_clients_fail_fast_when_refused(open_broker: EmbeddedBroker) -> None:
    """A producer and a consumer refused by an ACL raise TopicAuthorizationError at once (it is
    not retriable), rather than retrying until their timeouts."""
    from logstore import Consumer, Producer, TopicPartition

    deny = [AclBinding.create(resource_type="TOPIC", resource_name="refused", principal="User:ANONYMOUS",
                              operation=op, permission="DENY") for op in ("WRITE", "READ")]
    deny.append(AclBinding.create(resource_type="TOPIC", resource_name="refused", principal="User:ANONYMOUS",
                                  operation="DESCRIBE"))  # so metadata answers and the produce itself is refused
    with Admin(open_broker.bootstrap) as admin:
        admin.create_topic("refused")
        admin.create_acls(deny)
    try:
        started = time.monotonic()
        with (Producer(open_broker.bootstrap, acks="all") as producer,
              pytest.raises(TopicAuthorizationError, match="User:ANONYMOUS is not authorized to WRITE")):
            producer.send("refused", value=b"x").result(timeout=30)
        with Consumer(open_broker.bootstrap, auto_offset_reset="earliest") as consumer:
            consumer.assign([TopicPartition("refused", 0)])
            with pytest.raises(TopicAuthorizationError, match="not authorized to READ"):
                consumer.poll(timeout=10)
        assert time.monotonic() - started < 10
    finally:
        with Admin(open_broker.bootstrap) as admin:
            admin.delete_acls([AclFilter(resource_name="refused")])


def _readme_acl_commands() -> list[list[str]]:
    """The commands of the ACLs block of docs/security.md (its first line is in test_readme's
    NOT_RUN list)."""
    text = (Path(__file__).resolve().parents[2] / "docs" / "security.md").read_text()
    block = text.split("```sh no-run\nlogstore acls create --principal User:alice", 1)[1].split("```", 1)[0]
    lines = ["logstore acls create --principal User:alice" + block.splitlines()[0]] + block.splitlines()[1:]
    return [shlex.split(line.split("  #")[0])[1:] for line in lines if line.strip()]


def test_the_readme_acl_commands_as_a_logged_in_super_user(served: ServedBroker, tmp_path: Path) -> None:
    """The ``logstore acls`` block of docs/security.md, run through the CLI with ``--command-config`` (Kafka's
    properties) logging in as admin; as alice the same call is refused."""
    runner = CliRunner()

    def config(user: str) -> str:
        path = tmp_path / f"{user}.properties"
        path.write_text("security.protocol=SASL_PLAINTEXT\nsasl.mechanism=SCRAM-SHA-256\n"
                        f"sasl.jaas.config=org.apache.kafka.common.security.scram.ScramLoginModule required "
                        f'username="{user}" password="{PASSWORD}";\n')
        return str(path)
    admin, alice = config("admin"), config("alice")
    b = ["--bootstrap", served.embedded.bootstrap]
    clear_acls(served)
    try:
        commands = _readme_acl_commands()
        assert len(commands) == 7
        for argv in commands:
            out = runner.invoke(cli, [*argv, *b, "--command-config", admin])
            assert out.exit_code == 0, (argv, out.output)
        out = runner.invoke(cli, ["acls", "list", "--principal", "User:alice", "--format", "json", *b,
                                  "--command-config", admin])
        assert {(d["operation"], d["resource_type"], d["resource_name"]) for d in json.loads(out.output)} == {
            ("WRITE", "TOPIC", "orders"), ("READ", "TOPIC", "orders"), ("READ", "GROUP", "orders-app")}
        out = runner.invoke(cli, ["acls", "list", *b, "--command-config", alice])
        assert out.exit_code == 1 and "CLUSTER_AUTHORIZATION_FAILED" in out.output, out.output
        out = runner.invoke(cli, ["acls", "list", *b])  # no credentials: the SASL listener refuses
        assert out.exit_code == 1 and "SASL_AUTHENTICATION_FAILED" in out.output, out.output
    finally:
        served.stub.DeleteAcls(pb.DeleteAclsRequest(filters=[pb.AclBinding()]), metadata=served.md("User:admin"))
