"""No principal can disturb another (issue 22), on one real broker with the authorizer on.

Each test names the attack it stops: using another principal's producer id (across a
restart too), flooding the broker with unfinished logins, guessing passwords,
enumerating topics through a group subscription, creating internal topics, and
taking the broker's request capacity from other clients. The principals and the
broker are those of :mod:`tests.test_security_acls` (alice, bob, admin the super user).
"""

from __future__ import annotations

import asyncio
import logging
import os
import statistics
import threading
import time
from collections.abc import Iterator
from pathlib import Path

import grpc
import pyarrow as pa
import pytest
from acl_helpers import (
    PASSWORD,
    TOPIC,
    Metadata,
    ServedBroker,
    acl,
    clear_acls,
    records,
    set_acls,
)

from logstore._proto import logstore_pb2 as pb
from logstore._proto import logstore_pb2_grpc as pb_grpc
from logstore.broker.embedded import EmbeddedBroker
from logstore.broker.request_bounds import Admission
from logstore.broker.security.login_limits import FailedLogins, PendingExchanges
from logstore.broker.security.principal import SessionTable
from logstore.broker.security.producer_ids import ProducerIdBinder, counter_of, is_bound
from logstore.broker.security.scram_service import MAX_EXCHANGES
from logstore.client.sasl import SessionLogin
from logstore.client.security import ClientSecurity
from logstore.errors import WIRE_CODE_KEY
from logstore.scram import ScramClient

pytestmark = pytest.mark.timeout(120)


@pytest.fixture(scope="module")
def served(tmp_path_factory: pytest.TempPathFactory) -> Iterator[ServedBroker]:
    s = ServedBroker(str(tmp_path_factory.mktemp("isolation-broker")))
    r = s.stub.CreateTopics(pb.CreateTopicsRequest(topics=[pb.NewTopic(name=TOPIC, partitions=1)]),
                            metadata=s.md("User:admin"))
    assert not r.results[0].error.code, r
    yield s
    s.close()


def _produce(served: ServedBroker, md: Metadata, payload: bytes) -> str:
    r = served.stub.Produce(pb.ProduceRequest(acks=1, partitions=[
        pb.ProducePartition(topic=TOPIC, partition=0, records=payload)]), metadata=md)
    return r.partitions[0].error.code


# ---------------------------------------------------------------------- producer ids


def test_bound_producer_ids_are_checked_by_principal() -> None:
    """The binding is a pure function of (key, counter, principal): another key, principal or
    counter does not verify, and the counter is recoverable for id floors."""
    a, b = ProducerIdBinder(b"k" * 32), ProducerIdBinder(b"x" * 32)
    pid = a.bind(7, "User:alice")
    assert is_bound(pid) and counter_of(pid) == 7 and pid < 2**63
    assert a.issued_to(pid, "User:alice")
    assert not a.issued_to(pid, "User:bob") and not b.issued_to(pid, "User:alice")
    assert not a.issued_to(a.bind(8, "User:alice") ^ 1, "User:alice")
    assert not a.issued_to(7, "User:alice") and counter_of(7) == 7  # a plain counter is not bound


def test_a_transactional_producer_id_only_acts_through_its_transactional_id(served: ServedBroker) -> None:
    """Bob, with WRITE on the shared topic, sends a non-transactional batch with alice's
    transactional producer id and epoch+1: refused, and alice's transaction still commits."""
    stub, alice, bob = served.stub, served.md("User:alice"), served.md("User:bob")
    set_acls(served, (acl("WRITE"), acl("WRITE", principal="User:bob"),
                       acl("WRITE", "TRANSACTIONAL_ID", "iso-tx")), "ALLOW")
    try:
        t = stub.InitProducerId(pb.InitProducerIdRequest(transactional_id="iso-tx",
                                                         transaction_timeout_ms=60_000), metadata=alice)
        assert not t.error.code
        added = stub.AddPartitionsToTxn(pb.AddPartitionsToTxnRequest(
            transactional_id="iso-tx", producer_id=t.producer_id, producer_epoch=t.producer_epoch,
            partitions=[pb.TopicPartitionRef(topic=TOPIC, partition=0)]), metadata=alice)
        assert not added.error.code
        forged = records(pid=t.producer_id, epoch=t.producer_epoch + 1, seq=0)
        assert _produce(served, bob, forged) == "CLUSTER_AUTHORIZATION_FAILED"
        assert _produce(served, alice, forged) == "CLUSTER_AUTHORIZATION_FAILED"  # not outside it either
        assert _produce(served, alice, records(pid=t.producer_id, epoch=t.producer_epoch, seq=0, txn=True)) == ""
        ended = stub.EndTxn(pb.EndTxnRequest(transactional_id="iso-tx", producer_id=t.producer_id,
                                             producer_epoch=t.producer_epoch, txn_number=added.txn_number,
                                             commit=True), metadata=alice)
        assert not ended.error.code, ended
    finally:
        clear_acls(served)


def test_an_idempotent_producer_id_stays_its_principals_after_a_restart(served: ServedBroker) -> None:
    """Ownership is not a table that a restart (or 100k InitProducerId calls) empties: after
    a restart bob still cannot produce with alice's id, and alice still can."""
    set_acls(served, (acl("WRITE"), acl("WRITE", principal="User:bob")), "ALLOW")
    try:
        r = served.stub.InitProducerId(pb.InitProducerIdRequest(), metadata=served.md("User:alice"))
        assert not r.error.code
        pid, epoch = r.producer_id, r.producer_epoch
        assert _produce(served, served.md("User:alice"), records(pid=pid, epoch=epoch, seq=0)) == ""
        served.restart()
        alice, bob = served.md("User:alice"), served.md("User:bob")
        assert _produce(served, bob, records(pid=pid, epoch=epoch + 1, seq=0)) == "CLUSTER_AUTHORIZATION_FAILED"
        assert _produce(served, bob, records(pid=pid + 1, epoch=0, seq=0)) == "CLUSTER_AUTHORIZATION_FAILED"
        assert _produce(served, alice, records(pid=pid, epoch=epoch, seq=1)) == ""
    finally:
        clear_acls(served)


def test_an_idempotent_producer_id_is_not_a_transactional_one(served: ServedBroker) -> None:
    set_acls(served, (acl("WRITE"),), "ALLOW")
    try:
        r = served.stub.InitProducerId(pb.InitProducerIdRequest(), metadata=served.md("User:alice"))
        forged = records(pid=r.producer_id, epoch=r.producer_epoch + 1, seq=0, txn=True)
        assert _produce(served, served.md("User:alice"), forged) == "CLUSTER_AUTHORIZATION_FAILED"
    finally:
        clear_acls(served)


# ---------------------------------------------------------------------- logins


class _Clock:
    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


def test_pending_exchanges_evict_the_flooders_own_and_expire() -> None:
    clock = _Clock()
    table: PendingExchanges[str] = PendingExchanges(ttl_s=10, per_connection=2, per_host=3, capacity=4, clock=clock)
    for i in range(100):  # one connection floods: it only ever replaces its own
        table.add(f"f{i}", "flood", connection="ip:1.1.1.1:1", host="1.1.1.1")
    assert len(table) == 2
    table.add("other-conn", "x", connection="ip:1.1.1.1:2", host="1.1.1.1")
    table.add("h2", "login", connection="ip:2.2.2.2:1", host="2.2.2.2")
    table.add("h3", "login", connection="ip:3.3.3.3:1", host="3.3.3.3")  # full: the busiest address pays
    assert len(table) == 4
    assert table.take("h2") == "login" and table.take("other-conn") == "x"
    assert table.take("h2") is None  # one final message per exchange
    clock.now += 10
    assert table.take("h3") is None and len(table) == 0 or table.take("h3") is None  # expired


def test_failed_logins_space_attempts_per_user_and_host() -> None:
    clock = _Clock()
    limits = FailedLogins(free_failures_per_user=2, free_failures_per_host=4, base_delay_s=1, max_delay_s=8,
                          max_wait_s=5, forget_after_s=60, clock=clock)
    waits = []
    for _ in range(6):
        waits.append(limits.admit("alice", "h"))
        limits.failed("alice", "h")
    assert waits == [0, 0, 1, 2, 4, None], waits  # 2 free, then doubling; too far out: refused
    assert limits.admit("ghost", "other-host") == 0  # another name from elsewhere is not slowed
    held = limits.admit("bob", "h")
    assert held is None or held > 0  # the guesser's address is held back for every name
    clock.now += 61
    assert limits.admit("alice", "h") == 0  # forgotten after a quiet minute


def test_failed_logins_are_logged_once_per_interval_with_counts(caplog: pytest.LogCaptureFixture) -> None:
    clock = _Clock()
    limits = FailedLogins(log_interval_s=60, clock=clock)
    with caplog.at_level(logging.WARNING, logger="logstore.broker.security"):
        for i in range(50):
            limits.failed(f"user{i}", "10.0.0.9")
        clock.now += 61
        limits.failed("x", "10.0.0.9")
        for i in range(7):  # a burst that stops: reported by the broker's periodic report()
            limits.failed(f"user{i}", "10.0.0.7")
        assert not limits.report()  # not before the interval has passed
        clock.now += 61
        assert limits.report() and not limits.report()
    lines = [r.getMessage() for r in caplog.records]
    assert len(lines) == 3, lines
    assert "50 failed" in lines[1] and "10.0.0.9 x50" in lines[1]
    assert "7 failed" in lines[2] and "10.0.0.7 x7" in lines[2]
    assert not any("user" in line for line in lines)  # never the names


def test_the_session_table_is_bounded_per_principal_and_in_all() -> None:
    table = SessionTable(60, max_sessions=10, per_principal=4)
    victim = table.issue("User:victim")
    for _ in range(100):
        table.issue("User:loop")
    assert len(table) == 5 and table.principal(victim) == "User:victim"
    others = [table.issue(f"User:u{i}") for i in range(8)]
    assert len(table) == 10 and table.principal(victim) == "User:victim"
    assert all(table.principal(t) is not None for t in others[-4:])


def _first_message(channel: grpc.Channel, user: str) -> pb.SaslAuthenticateResponse:
    return pb.SaslAuthenticateResponse.FromString(channel.unary_unary("/logstore.v1.Logstore/SaslAuthenticate")(
        pb.SaslAuthenticateRequest(mechanism="SCRAM-SHA-256",
                                   auth_bytes=ScramClient("SCRAM-SHA-256", user, "x").first().encode()
                                   ).SerializeToString(), timeout=10))


def _login(served: ServedBroker, user: str, password: str) -> str:
    security = ClientSecurity(security_protocol="SASL_PLAINTEXT", sasl_mechanism="SCRAM-SHA-256",
                              sasl_plain_username=user, sasl_plain_password=password)
    with grpc.insecure_channel(served.embedded.bootstrap,
                               options=[("grpc.use_local_subchannel_pool", 1)]) as channel:
        return SessionLogin(served.embedded.bootstrap, security, channel).token(10)


def test_a_flood_of_unfinished_logins_does_not_stop_a_real_one(served: ServedBroker) -> None:
    """10,000 unfinished SCRAM exchanges from one client without credentials (what filled the
    broker-wide table for 30 s) leave a real login working at once."""
    with grpc.insecure_channel(served.embedded.bootstrap,
                               options=[("grpc.use_local_subchannel_pool", 1)]) as channel:
        for _ in range(MAX_EXCHANGES):
            _first_message(channel, "nobody")
    started = time.monotonic()
    assert _login(served, "alice", PASSWORD)
    assert time.monotonic() - started < 5


def test_password_guessing_is_slowed_down(served: ServedBroker) -> None:
    """Wrong passwords for one name (an unknown one: it counts the same) are spaced by a
    growing delay after the first few; other users of the address still log in."""
    started = time.monotonic()
    for _ in range(8):
        with pytest.raises(grpc.RpcError) as failed:
            _login(served, "ghost", "guess")
        assert failed.value.code() == grpc.StatusCode.UNAUTHENTICATED
    assert time.monotonic() - started >= 1.5  # 5 free, then 0.25 + 0.5 + 1 s
    started = time.monotonic()
    assert _login(served, "bob", PASSWORD)
    assert time.monotonic() - started < 2


# ---------------------------------------------------------------------- topics


def test_a_subscription_only_matches_topics_the_member_may_describe(served: ServedBroker) -> None:
    """Alice, with READ on her group and no topic ACL, subscribes to guessed names: no
    assignment tells her which exist. With DESCRIBE on a topic she gets its partitions."""
    stub, admin, alice = served.stub, served.md("User:admin"), served.md("User:alice")
    r = stub.CreateTopics(pb.CreateTopicsRequest(topics=[pb.NewTopic(name="iso-secret", partitions=2)]), metadata=admin)
    assert not r.results[0].error.code, r

    def assigned(member_id: str = "", epoch: int = 0) -> tuple[pb.ConsumerGroupHeartbeatResponse, set[str]]:
        hb = stub.ConsumerGroupHeartbeat(pb.ConsumerGroupHeartbeatRequest(
            group_id="iso-g", member_id=member_id, member_epoch=epoch, rebalance_timeout_ms=10_000,
            subscribed_topics=["iso-secret", "iso-no-such-topic", TOPIC]), metadata=alice)
        assert not hb.error.code, hb
        return hb, {a.topic for a in hb.assignment}

    set_acls(served, (acl("READ", "GROUP", "iso-g"),), "ALLOW")
    try:
        hb, topics = assigned()
        hb, topics = assigned(hb.member_id, hb.member_epoch)
        assert topics == set(), topics
        stub.ConsumerGroupHeartbeat(pb.ConsumerGroupHeartbeatRequest(
            group_id="iso-g", member_id=hb.member_id, member_epoch=-1), metadata=alice)
        set_acls(served, (acl("READ", "GROUP", "iso-g"), acl("DESCRIBE")), "ALLOW")
        hb, topics = assigned()
        hb, topics = assigned(hb.member_id, hb.member_epoch)
        assert topics == {TOPIC}, topics
        stub.ConsumerGroupHeartbeat(pb.ConsumerGroupHeartbeatRequest(
            group_id="iso-g", member_id=hb.member_id, member_epoch=-1), metadata=alice)
    finally:
        clear_acls(served)


@pytest.mark.parametrize("name", ["__consumer_offsets", "__transaction_state", "__anything"])
def test_internal_topic_names_are_reserved_without_an_authorizer(shared_broker: EmbeddedBroker, name: str) -> None:
    """On a broker without the authorizer a client could create ``__consumer_offsets`` with a
    typed schema, and every group commit failed after; only the broker creates these."""
    with grpc.insecure_channel(shared_broker.bootstrap) as channel:
        r = pb_grpc.LogstoreStub(channel).CreateTopics(
            pb.CreateTopicsRequest(topics=[pb.NewTopic(name=name, partitions=1)]), timeout=10)
    assert r.results[0].error.code == "INTERNAL_TOPIC", r
    assert "reserved" in r.results[0].error.message


def test_internal_topic_names_are_reserved_for_super_users_too(served: ServedBroker) -> None:
    r = served.stub.CreateTopics(pb.CreateTopicsRequest(topics=[pb.NewTopic(name="__mine", partitions=1)]),
                                 metadata=served.md("User:admin"))
    assert r.results[0].error.code == "INTERNAL_TOPIC", r


# ---------------------------------------------------------------------- request capacity


def test_admission_bounds_heavy_calls_per_connection_and_overall() -> None:
    async def scenario() -> list[str]:
        admission = Admission(per_connection=10, overall=15, light=3)
        order: list[str] = []

        async def call(name: str, connection: str, weight: int, hold_s: float) -> None:
            async with admission.slot(connection, weight):
                order.append(f"+{name}")
                await asyncio.sleep(hold_s)
                order.append(f"-{name}")
        await asyncio.gather(
            call("a1", "a", 10, 0.05), call("a2", "a", 10, 0.05),  # one connection: one after the other
            call("b1", "b", 8, 0.01),  # 10 + 8 > 15 overall: waits for a1
            call("light", "a", 2, 0.0),  # light: never waits
        )
        assert admission.in_flight() == 0
        return order
    order = asyncio.run(scenario())
    assert order.index("-a1") < order.index("+a2"), order
    assert order.index("+light") < order.index("-a1"), order
    assert order.index("-a1") < order.index("+b1"), order


def test_one_client_flooding_heavy_requests_does_not_take_the_broker(tmp_path: Path) -> None:
    """Six Produce requests of 2,000 partitions each, sent at once on one connection, used to
    queue 12,000 jobs ahead of everyone's (another client waited seconds for a one-record
    produce). The other client's latency now stays well under one heavy request's time,
    measured in the same run."""
    cap = 2_000
    with EmbeddedBroker(str(tmp_path), overrides={"max_request_entries": cap}) as broker, \
            grpc.insecure_channel(broker.bootstrap) as channel, \
            grpc.insecure_channel(broker.bootstrap, options=[("grpc.use_local_subchannel_pool", 1)]) as flooder:
        stub = pb_grpc.LogstoreStub(channel)
        r = stub.CreateTopics(pb.CreateTopicsRequest(topics=[pb.NewTopic(name="heavy", partitions=1),
                                                             pb.NewTopic(name="victim", partitions=1)]), timeout=30)
        assert not any(t.error.code for t in r.results), r
        one = records(1)
        heavy = pb.ProduceRequest(acks=1, partitions=[pb.ProducePartition(topic="heavy", partition=0, records=one)
                                                      for _ in range(cap)]).SerializeToString()
        call = flooder.unary_unary("/logstore.v1.Logstore/Produce")

        def victim_latency() -> float:
            started = time.perf_counter()
            answer = stub.Produce(pb.ProduceRequest(acks=1, partitions=[
                pb.ProducePartition(topic="victim", partition=0, records=one)]), timeout=60)
            assert not answer.partitions[0].error.code
            return time.perf_counter() - started

        started = time.perf_counter()
        call(heavy, timeout=60)
        heavy_s = time.perf_counter() - started
        threads = [threading.Thread(target=call, args=(heavy,), kwargs={"timeout": 120}) for _ in range(6)]
        for t in threads:
            t.start()
        latencies = []
        while any(t.is_alive() for t in threads):
            latencies.append(victim_latency())
            time.sleep(0.02)
        for t in threads:
            t.join(timeout=120)
    assert statistics.median(latencies) < heavy_s / 2, (heavy_s, latencies)
    assert max(latencies) < 3 * heavy_s, (heavy_s, latencies)


# ---------------------------------------------------------------------- smaller items


def test_replace_segments_of_an_unknown_partition_is_not_found(served: ServedBroker) -> None:
    begin = pb.ReplaceSegmentsRequest(begin=pb.ReplaceSegmentsBegin(topic="iso-no-such-topic", partition=0))
    with pytest.raises(grpc.RpcError) as caught:
        served.stub.ReplaceSegments(iter([begin]), metadata=served.md("User:admin"), timeout=10)
    assert caught.value.code() == grpc.StatusCode.NOT_FOUND
    assert (WIRE_CODE_KEY, "UNKNOWN_TOPIC_OR_PARTITION") in tuple(caught.value.trailing_metadata())


def test_security_disabled_is_a_failed_precondition(shared_broker: EmbeddedBroker) -> None:
    with grpc.insecure_channel(shared_broker.bootstrap) as channel, pytest.raises(grpc.RpcError) as caught:
        pb_grpc.LogstoreStub(channel).DescribeAcls(pb.DescribeAclsRequest(filter=pb.AclBinding()), timeout=10)
    assert caught.value.code() == grpc.StatusCode.FAILED_PRECONDITION
    assert (WIRE_CODE_KEY, "SECURITY_DISABLED") in tuple(caught.value.trailing_metadata())


@pytest.mark.parametrize("txn_id", ["a\0b", "x" * 10_000, "tab\there"])
def test_transactional_ids_follow_the_group_id_rules(shared_broker: EmbeddedBroker, txn_id: str) -> None:
    with grpc.insecure_channel(shared_broker.bootstrap) as channel:
        stub = pb_grpc.LogstoreStub(channel)
        for call in (lambda: stub.InitProducerId(pb.InitProducerIdRequest(transactional_id=txn_id,
                                                                          transaction_timeout_ms=60_000), timeout=10),
                     lambda: stub.EndTxnGroup(pb.EndTxnGroupRequest(group_id=txn_id, batch_id=0, commit=False),
                                              timeout=10)):
            with pytest.raises(grpc.RpcError) as caught:
                call()
            assert caught.value.code() == grpc.StatusCode.INVALID_ARGUMENT
            assert (WIRE_CODE_KEY, "INVALID_REQUEST") in tuple(caught.value.trailing_metadata())
            assert "transactional id" in (caught.value.details() or "")


def test_a_typed_schema_with_a_non_utf8_field_name_is_a_clear_error(shared_broker: EmbeddedBroker) -> None:
    schema = pa.schema([pa.field("ok", pa.struct([("zqzq", pa.int64())]))])
    raw = schema.serialize().to_pybytes().replace(b"zqzq", b"\xff\xfe\xfd\xfc")
    with grpc.insecure_channel(shared_broker.bootstrap) as channel:
        r = pb_grpc.LogstoreStub(channel).CreateTopics(pb.CreateTopicsRequest(topics=[
            pb.NewTopic(name="iso-bad-field-name", partitions=1, value_schema=raw)]), timeout=10)
    error = r.results[0].error
    assert error.code == "SCHEMA_MISMATCH", error
    assert "ok.#0" in error.message and "not UTF-8" in error.message


def test_a_lost_producer_id_block_never_reissues_a_bound_id(tmp_path: Path) -> None:
    """Issue 22 both ways: with the authorizer on, ids in the partitions are bound (above 2^62);
    after ``meta/producer-id-block`` is lost the floor is taken from their counters, so the next
    id is bound, new, and its counter above every counter in use."""
    s = ServedBroker(str(tmp_path))
    try:
        s.stub.CreateTopics(pb.CreateTopicsRequest(topics=[pb.NewTopic(name=TOPIC, partitions=1)]),
                            metadata=s.md("User:admin"))
        set_acls(s, (acl("WRITE"),), "ALLOW")
        first = s.stub.InitProducerId(pb.InitProducerIdRequest(), metadata=s.md("User:alice"))
        assert is_bound(first.producer_id)
        assert _produce(s, s.md("User:alice"), records(pid=first.producer_id, epoch=first.producer_epoch, seq=0)) == ""
        s.channel.close()
        s.embedded.stop()
        os.remove(os.path.join(s.data_dir, "meta", "producer-id-block"))
        s.embedded.start()
        s._connect()
        again = s.stub.InitProducerId(pb.InitProducerIdRequest(), metadata=s.md("User:alice"))
        assert not again.error.code and is_bound(again.producer_id), again
        assert counter_of(again.producer_id) > counter_of(first.producer_id)
    finally:
        s.close()
