"""No principal can disturb another (issue 22), on one real broker with the authorizer on.

Each test names the attack it stops: using another principal's producer id (across a
restart too), flooding the broker with unfinished logins, guessing passwords,
enumerating topics through a group subscription, creating internal topics, and
taking the broker's request capacity from other clients. The principals and the
broker are those of :mod:`tests.test_security_acls` (alice, bob, admin the super user).
"""

from __future__ import annotations

from collections.abc import Iterator

import pytest

from logstore._proto import logstore_pb2 as pb
from logstore.broker.security.producer_ids import ProducerIdBinder, counter_of, is_bound
from tests.test_security_acls import (
    TOPIC,
    Metadata,
    ServedBroker,
    _clear_acls,
    _set_acls,
    acl,
    records,
)

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
    _set_acls(served, (acl("WRITE"), acl("WRITE", principal="User:bob"),
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
        _clear_acls(served)


def test_an_idempotent_producer_id_stays_its_principals_after_a_restart(served: ServedBroker) -> None:
    """Ownership is not a table that a restart (or 100k InitProducerId calls) empties: after
    a restart bob still cannot produce with alice's id, and alice still can."""
    _set_acls(served, (acl("WRITE"), acl("WRITE", principal="User:bob")), "ALLOW")
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
        _clear_acls(served)


def test_an_idempotent_producer_id_is_not_a_transactional_one(served: ServedBroker) -> None:
    _set_acls(served, (acl("WRITE"),), "ALLOW")
    try:
        r = served.stub.InitProducerId(pb.InitProducerIdRequest(), metadata=served.md("User:alice"))
        forged = records(pid=r.producer_id, epoch=r.producer_epoch + 1, seq=0, txn=True)
        assert _produce(served, served.md("User:alice"), forged) == "CLUSTER_AUTHORIZATION_FAILED"
    finally:
        _clear_acls(served)
