"""Security on the Kafka listener (issue 25): TLS, SASL SCRAM, ACLs and quotas, as Kafka clients meet them.

A real broker on SASL_SSL (SCRAM over TLS, the test CA's server certificate) with the
authorizer on, users in its credentials file and ACLs made through logstore's Admin by a
super user (logstore.broker.kafka.security, .sasl, .throttling):

* confluent-kafka (librdkafka) and kafka-python produce and consume with SCRAM-SHA-512 and
  SCRAM-SHA-256 over TLS as a principal the ACLs allow; a transactional producer commits;
* a principal without WRITE gets TOPIC_AUTHORIZATION_FAILED, one without READ on the group
  GROUP_AUTHORIZATION_FAILED, one without WRITE on a transactional id
  TRANSACTIONAL_ID_AUTHORIZATION_FAILED; over the raw protocol every API answers Kafka's
  ``*_AUTHORIZATION_FAILED`` code where Kafka does, and Metadata leaves out of a listing
  what the caller may not describe;
* an unauthenticated connection gets ApiVersions and the login, and is closed on anything else;
* a producer with a produce quota is throttled (throttle_time_ms, then its connection muted).

A second broker (SASL_PLAINTEXT, 2 s sessions) checks the session lifetime (reported,
enforced, renewed by re-authentication: KIP-368), SaslHandshake v0's bare SCRAM messages
and failed logins; a third (mTLS) the principal of a client certificate. No component of
ours is mocked.
"""

from __future__ import annotations

import datetime
import io
import json
import logging
import random
import ssl
import sys
import time
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

pytest.importorskip("kio", reason="the Kafka listener needs kio (Python 3.11+)")
ck = pytest.importorskip("confluent_kafka")

from confluent_kafka.admin import AdminClient  # noqa: E402
from kafka_tools import CLIENT_CONF, KafkaConnection  # noqa: E402
from kio.index import load_request_schema  # noqa: E402
from kio.records.schema import NewRecordBatch, Record  # noqa: E402
from kio.records.writers import write_batch  # noqa: E402
from security_helpers import Certificates, tls_dir  # noqa: E402, F401 - the session fixture

from logstore import Admin, NewTopic  # noqa: E402
from logstore.acl import AclBinding  # noqa: E402
from logstore.broker.config import load_broker_config  # noqa: E402
from logstore.broker.embedded import EmbeddedBroker  # noqa: E402
from logstore.broker.security.credentials import FileCredentials  # noqa: E402
from logstore.broker.tls_rules import rfc2253_subject  # noqa: E402
from logstore.client.security import ClientSecurity  # noqa: E402
from logstore.scram import ScramClient, make_credential  # noqa: E402

pytestmark = pytest.mark.timeout(120)

USERS = ("alice", "bob", "carol", "admin")
TOPIC, PRIVATE = "sec-events", "private-events"
QUOTA = 40_000  # carol's produce bytes/s
MAX_THROTTLE_MS = 1_500
API_VERSIONS, SASL_HANDSHAKE, SASL_AUTHENTICATE, METADATA = 18, 17, 36, 3
TOPIC_DENIED, GROUP_DENIED, CLUSTER_DENIED, TXN_DENIED = 29, 30, 31, 53
SASL_FAILED, ILLEGAL_SASL_STATE, UNSUPPORTED_MECHANISM = 58, 34, 33


def _password(user: str) -> str:
    return f"{user}-Secret-1"


def _add_users(data_dir: str) -> None:
    """Every user of :data:`USERS`, with both mechanisms (as ``logstore users create`` does)."""
    for user in USERS:
        FileCredentials(data_dir).alter(user, [make_credential(m, _password(user))
                                               for m in ("SCRAM-SHA-256", "SCRAM-SHA-512")], [])


def _acl(principal: str, resource_type: str, name: str, operation: str, pattern: str = "PREFIXED") -> AclBinding:
    return AclBinding.create(resource_type=resource_type, resource_name=name, pattern_type=pattern,
                             principal=principal, operation=operation)


@pytest.fixture(scope="module")
def secure(tls_dir: Certificates, tmp_path_factory: pytest.TempPathFactory) -> Iterator[EmbeddedBroker]:  # noqa: F811
    """SASL_SSL with the authorizer: alice may do everything on sec-* (topics, groups,
    transactional ids); bob may read and describe sec-* topics only; carol may write them,
    under a produce quota; admin is a super user; only admin sees private-events."""
    data_dir = str(tmp_path_factory.mktemp("kafka-secure"))
    _add_users(data_dir)
    broker = EmbeddedBroker(data_dir, kafka_listener="127.0.0.1:0", overrides={
        "security_protocol": "SASL_SSL", "tls_cert": tls_dir.server_cert, "tls_key": tls_dir.server_key,
        "authorizer": True, "super_users": "User:admin", "sasl_failure_delay_ms": 0,
        "quotas": {"User:carol": {"producer_byte_rate": QUOTA}}, "quota_window_size_ms": 100,
        "quota_max_throttle_ms": MAX_THROTTLE_MS}).start()
    security = ClientSecurity(security_protocol="SASL_SSL", sasl_mechanism="SCRAM-SHA-512",
                              sasl_plain_username="admin", sasl_plain_password=_password("admin"),
                              ssl_cafile=tls_dir.ca)
    with Admin(broker.bootstrap, security=security) as admin:
        admin.create_topics([NewTopic(TOPIC, num_partitions=2), NewTopic(PRIVATE, num_partitions=1)])
        admin.create_acls([
            *(_acl("User:alice", "TOPIC", "sec-", op) for op in ("READ", "WRITE", "DESCRIBE", "CREATE")),
            *(_acl("User:alice", "GROUP", "sec-", op) for op in ("READ", "DESCRIBE")),
            *(_acl("User:alice", "TRANSACTIONAL_ID", "sec-", op) for op in ("WRITE", "DESCRIBE")),
            *(_acl("User:bob", "TOPIC", "sec-", op) for op in ("READ", "DESCRIBE")),
            *(_acl("User:carol", "TOPIC", "sec-", op) for op in ("WRITE", "DESCRIBE")),
        ])
    yield broker
    broker.stop()


def _kafka_conf(broker: EmbeddedBroker, certs: Certificates, user: str, *, password: str | None = None,
                mechanism: str = "SCRAM-SHA-512") -> dict[str, Any]:
    """confluent-kafka's settings to log in as ``user`` over SASL_SSL (what docs/security.md shows)."""
    return {"bootstrap.servers": broker.kafka_bootstrap, "security.protocol": "SASL_SSL",
            "sasl.mechanism": mechanism, "sasl.username": user,
            "sasl.password": password if password is not None else _password(user),
            "ssl.ca.location": certs.ca, **CLIENT_CONF}


def _tls(certs: Certificates) -> ssl.SSLContext:
    return ssl.create_default_context(cafile=certs.ca)


def _produce(conf: dict[str, Any], topic: str, values: list[bytes], **extra: Any) -> list[tuple[Any, int]]:
    """Each value's (error, offset) once a confluent-kafka producer delivered (or gave up on) it."""
    producer = ck.Producer({**conf, "message.timeout.ms": 20_000, **extra})
    results: list[tuple[Any, int]] = []
    for value in values:
        producer.produce(topic, value, on_delivery=lambda err, msg: results.append((err, msg.offset())))
    assert producer.flush(30) == 0
    return results


def _records(count: int, size: int = 10) -> bytes:
    """A Kafka record batch of ``count`` records of ``size``-byte values."""
    buffer = io.BytesIO()
    now = datetime.datetime.now(datetime.timezone.utc)
    write_batch(buffer, NewRecordBatch(producer_id=-1, producer_epoch=-1, base_sequence=-1, attributes=0, records=tuple(
        Record(attributes=0, timestamp=now, offset=i, key=None, value=random.randbytes(size), headers=())
        for i in range(count))))
    return buffer.getvalue()


def _connect(broker: EmbeddedBroker, certs: Certificates, user: str | None = None, **kwargs: Any) -> KafkaConnection:
    """A TLS connection to the secure broker's Kafka listener, logged in as ``user`` when given."""
    connection = KafkaConnection(broker.kafka_bootstrap, tls=_tls(certs), **kwargs)
    if user is not None:
        assert connection.login(user, _password(user)).error_code == 0
    return connection


# ---------------------------------------------------------------------------- real clients


def test_confluent_kafka_produces_and_consumes_with_scram_sha_512_over_tls(
        secure: EmbeddedBroker, tls_dir: Certificates) -> None:  # noqa: F811
    conf = _kafka_conf(secure, tls_dir, "alice")
    values = [b"alice-%d" % i for i in range(10)]
    results = _produce(conf, TOPIC, values, **{"enable.idempotence": True, "partitioner": "murmur2"})
    assert [e for e, _ in results] == [None] * 10  # an idempotent producer: its id bound to alice
    consumer = ck.Consumer({**conf, "group.id": "sec-readers", "auto.offset.reset": "earliest",
                            "enable.auto.commit": False})
    try:
        consumer.subscribe([TOPIC])
        got: list[bytes] = []
        deadline = time.monotonic() + 30
        while time.monotonic() < deadline and not set(values) <= set(got):
            message = consumer.poll(0.5)
            if message is not None:
                assert message.error() is None, message.error()
                got.append(message.value())
        assert set(values) <= set(got)
        consumer.commit(asynchronous=False)
    finally:
        consumer.close()


def test_a_principal_without_write_gets_topic_authorization_failed(
        secure: EmbeddedBroker, tls_dir: Certificates) -> None:  # noqa: F811
    results = _produce(_kafka_conf(secure, tls_dir, "bob"), TOPIC, [b"not bob's to write"],
                       **{"enable.idempotence": False})
    assert [e.code() for e, _ in results] == [ck.KafkaError.TOPIC_AUTHORIZATION_FAILED]


def test_a_principal_without_read_on_the_group_gets_group_authorization_failed(
        secure: EmbeddedBroker, tls_dir: Certificates) -> None:  # noqa: F811
    consumer = ck.Consumer({**_kafka_conf(secure, tls_dir, "bob"), "group.id": "sec-bobs",
                            "auto.offset.reset": "earliest"})
    try:
        consumer.subscribe([TOPIC])
        errors: list[int] = []
        deadline = time.monotonic() + 20
        while time.monotonic() < deadline and not errors:
            try:
                message = consumer.poll(0.5)
            except ck.KafkaException as e:
                errors.append(e.args[0].code())
                continue
            if message is not None and message.error() is not None:
                errors.append(message.error().code())
        assert errors[:1] == [ck.KafkaError.GROUP_AUTHORIZATION_FAILED]
    finally:
        consumer.close()


def test_a_transactional_producer_needs_write_on_its_transactional_id(
        secure: EmbeddedBroker, tls_dir: Certificates) -> None:  # noqa: F811
    producer = ck.Producer({**_kafka_conf(secure, tls_dir, "alice"), "transactional.id": "sec-tx-alice"})
    producer.init_transactions(20)
    producer.begin_transaction()
    producer.produce(TOPIC, b"in a transaction", partition=0)
    producer.commit_transaction(20)
    carol = ck.Producer({**_kafka_conf(secure, tls_dir, "carol"), "transactional.id": "sec-tx-carol"})
    with pytest.raises(ck.KafkaException) as refused:
        carol.init_transactions(20)
    assert refused.value.args[0].code() == ck.KafkaError.TRANSACTIONAL_ID_AUTHORIZATION_FAILED


def test_kafka_python_produces_and_consumes_with_scram_sha_256_over_tls(
        secure: EmbeddedBroker, tls_dir: Certificates) -> None:  # noqa: F811
    kafka = pytest.importorskip("kafka")
    login = {"bootstrap_servers": secure.kafka_bootstrap, "security_protocol": "SASL_SSL",
             "sasl_mechanism": "SCRAM-SHA-256", "sasl_plain_username": "alice",
             "sasl_plain_password": _password("alice"), "ssl_cafile": tls_dir.ca}
    producer = kafka.KafkaProducer(**login)
    sent = [producer.send(TOPIC, b"kp-%d" % i, partition=1).get(timeout=30) for i in range(5)]
    producer.close()
    consumer = kafka.KafkaConsumer(**login, auto_offset_reset="earliest", consumer_timeout_ms=15_000)
    try:
        consumer.assign([kafka.TopicPartition(TOPIC, 1)])
        consumer.seek(kafka.TopicPartition(TOPIC, 1), sent[0].offset)
        got = [m.value for _, m in zip(range(5), consumer, strict=False)]
    finally:
        consumer.close()
    assert got == [b"kp-%d" % i for i in range(5)]
    with pytest.raises(kafka.errors.TopicAuthorizationFailedError):
        bob = kafka.KafkaProducer(**{**login, "sasl_plain_username": "bob", "sasl_plain_password": _password("bob")},
                                  max_block_ms=10_000, enable_idempotence=False)  # idempotent: CLUSTER_AUTHORIZATION_FAILED
        try:
            bob.send(TOPIC, b"not bob's").get(timeout=20)
        finally:
            bob.close()


# ---------------------------------------------------------------------------- the raw protocol


def test_an_unauthenticated_connection_gets_nothing_but_the_login(
        secure: EmbeddedBroker, tls_dir: Certificates) -> None:  # noqa: F811
    with _connect(secure, tls_dir) as connection:
        versions = connection.call(API_VERSIONS, 3, client_software_name="t", client_software_version="1")
        served = {k.api_key: (k.min_version, k.max_version) for k in versions.api_keys}
        assert served[SASL_HANDSHAKE] == (0, 1) and served[SASL_AUTHENTICATE] == (0, 2)
        connection.send(METADATA, 12, topics=None, allow_auto_topic_creation=False,
                        include_topic_authorized_operations=False)
        assert connection.closed_by_peer()
    with _connect(secure, tls_dir) as connection:  # SaslAuthenticate before the handshake
        answer = connection.call(SASL_AUTHENTICATE, 2, auth_bytes=b"n,,n=alice,r=abc")
        assert answer.error_code == ILLEGAL_SASL_STATE and connection.closed_by_peer()


def test_metadata_leaves_out_what_the_caller_may_not_describe(
        secure: EmbeddedBroker, tls_dir: Certificates) -> None:  # noqa: F811
    with _connect(secure, tls_dir, "bob") as connection:
        listing = connection.call(METADATA, 12, topics=None, allow_auto_topic_creation=False,
                                  include_topic_authorized_operations=False)
        names = {t.name for t in listing.topics}
        assert TOPIC in names and PRIVATE not in names and not any(n.startswith("__") for n in names)
        named = connection.call(METADATA, 12, topics=tuple(
            _request_module(METADATA, 12).MetadataRequestTopic(topic_id=None, name=n)
            for n in (TOPIC, PRIVATE, "no-such-topic")), allow_auto_topic_creation=False,
            include_topic_authorized_operations=False)
        codes = {t.name: t.error_code for t in named.topics}
        # A topic bob may not describe is refused whether it exists or not: nothing leaks.
        assert codes == {TOPIC: 0, PRIVATE: TOPIC_DENIED, "no-such-topic": TOPIC_DENIED}


def _request_module(api_key: int, version: int) -> Any:
    """The module of a request's version: its nested entities."""
    return sys.modules[load_request_schema(api_key, version).__module__]


def test_every_api_answers_kafkas_authorization_errors(secure: EmbeddedBroker, tls_dir: Certificates) -> None:  # noqa: F811
    """bob reads and describes sec-* topics, nothing else: each API refuses the rest with Kafka's code."""
    five_s = datetime.timedelta(seconds=5)
    with _connect(secure, tls_dir, "bob") as bob:
        m = _request_module(19, 7)  # CreateTopics: CREATE
        created = bob.call(19, 7, topics=(m.CreatableTopic(name="sec-bobs-own", num_partitions=1,
                                                          replication_factor=-1, assignments=(), configs=()),),
                           timeout=five_s, validate_only=False)
        assert [t.error_code for t in created.topics] == [TOPIC_DENIED]
        m = _request_module(20, 6)  # DeleteTopics: DELETE
        deleted = bob.call(20, 6, topics=(m.DeleteTopicState(name=TOPIC, topic_id=uuid.UUID(int=0)),), timeout=five_s)
        assert [t.error_code for t in deleted.responses] == [TOPIC_DENIED]
        m = _request_module(37, 3)  # CreatePartitions: ALTER
        grown = bob.call(37, 3, topics=(m.CreatePartitionsTopic(name=TOPIC, count=4, assignments=None),),
                         timeout=five_s, validate_only=False)
        assert [t.error_code for t in grown.results] == [TOPIC_DENIED]
        m = _request_module(32, 4)  # DescribeConfigs: DESCRIBE_CONFIGS
        configs = bob.call(32, 4, resources=(m.DescribeConfigsResource(resource_type=2, resource_name=TOPIC,
                                                                       configuration_keys=None),),
                           include_synonyms=False, include_documentation=False)
        assert [r.error_code for r in configs.results] == [TOPIC_DENIED]
        m = _request_module(44, 1)  # IncrementalAlterConfigs: ALTER_CONFIGS
        altered = bob.call(44, 1, resources=(m.AlterConfigsResource(resource_type=2, resource_name=TOPIC, configs=(
            m.AlterableConfig(name="retention.ms", config_operation=0, value="1000"),)),), validate_only=False)
        assert [r.error_code for r in altered.responses] == [TOPIC_DENIED]
        m = _request_module(21, 2)  # DeleteRecords: DELETE
        trimmed = bob.call(21, 2, topics=(m.DeleteRecordsTopic(name=TOPIC, partitions=(
            m.DeleteRecordsPartition(partition_index=0, offset=-1),)),), timeout=five_s)
        assert [p.error_code for t in trimmed.topics for p in t.partitions] == [TOPIC_DENIED]
        m = _request_module(2, 6)  # ListOffsets: DESCRIBE
        listed = bob.call(2, 6, replica_id=-1, isolation_level=0, topics=tuple(
            m.ListOffsetsTopic(name=n, partitions=(m.ListOffsetsPartition(
                partition_index=0, current_leader_epoch=-1, timestamp=-1),)) for n in (TOPIC, PRIVATE)))
        assert [p.error_code for t in listed.topics for p in t.partitions] == [0, TOPIC_DENIED]
        m = _request_module(1, 12)  # Fetch: READ
        fetched = bob.call(1, 12, cluster_id=None, replica_id=-1, max_wait=datetime.timedelta(0), min_bytes=0, max_bytes=1 << 20,
                           isolation_level=0, session_id=0, session_epoch=-1, rack_id="", forgotten_topics_data=(),
                           topics=tuple(m.FetchTopic(topic=n, partitions=(m.FetchPartition(
                               partition=0, current_leader_epoch=-1, fetch_offset=0, last_fetched_epoch=-1,
                               log_start_offset=-1, partition_max_bytes=1 << 20),)) for n in (TOPIC, PRIVATE)))
        assert [p.error_code for t in fetched.responses for p in t.partitions] == [0, TOPIC_DENIED]
        m = _request_module(0, 9)  # Produce: WRITE
        produced = bob.call(0, 9, transactional_id=None, acks=1, timeout=five_s, topic_data=(m.TopicProduceData(
            name=TOPIC, partition_data=(m.PartitionProduceData(index=0, records=_records(1)),)),))
        assert [p.error_code for t in produced.responses for p in t.partition_responses] == [TOPIC_DENIED]
        for key_type, code in ((0, GROUP_DENIED), (1, TXN_DENIED)):  # FindCoordinator: DESCRIBE
            found = bob.call(10, 3, key="sec-bobs", key_type=key_type)
            assert found.error_code == code
        txn = bob.call(22, 4, transactional_id="sec-tx-bob", transaction_timeout=datetime.timedelta(seconds=60),
                       producer_id=-1, producer_epoch=-1)  # InitProducerId: WRITE on the transactional id
        assert txn.error_code == TXN_DENIED
        idempotent = bob.call(22, 4, transactional_id=None, transaction_timeout=datetime.timedelta(seconds=60),
                              producer_id=-1, producer_epoch=-1)  # IDEMPOTENT_WRITE, or WRITE on some topic
        assert idempotent.error_code == CLUSTER_DENIED
        m = _request_module(24, 3)  # AddPartitionsToTxn
        added = bob.call(24, 3, v3_and_below_transactional_id="sec-tx-bob", v3_and_below_producer_id=1,
                         v3_and_below_producer_epoch=0, v3_and_below_topics=(m.AddPartitionsToTxnTopic(
                             name=TOPIC, partitions=(0,)),))
        assert [p.partition_error_code for t in added.results_by_topic_v3_and_below
                for p in t.results_by_partition] == [TXN_DENIED]
        ended = bob.call(26, 3, transactional_id="sec-tx-bob", producer_id=1, producer_epoch=0, committed=True)
        assert ended.error_code == TXN_DENIED
        offsets = bob.call(25, 3, transactional_id="sec-tx-bob", producer_id=1, producer_epoch=0, group_id="sec-g")
        assert offsets.error_code == TXN_DENIED
        m = _request_module(11, 5)  # JoinGroup (v5: protocol_name is not nullable): READ on the group
        joined = bob.call(11, 5, group_id="sec-bobs", session_timeout=datetime.timedelta(seconds=10),
                          rebalance_timeout=datetime.timedelta(seconds=10), member_id="", group_instance_id=None,
                          protocol_type="consumer", protocols=(m.JoinGroupRequestProtocol(name="range", metadata=b""),))
        assert joined.error_code == GROUP_DENIED
        beat = bob.call(12, 4, group_id="sec-bobs", generation_id=1, member_id="m", group_instance_id=None)
        assert beat.error_code == GROUP_DENIED
        m = _request_module(8, 8)  # OffsetCommit: READ on the group
        committed = bob.call(8, 8, group_id="sec-bobs", generation_id_or_member_epoch=-1, member_id="",
                             group_instance_id=None, topics=(m.OffsetCommitRequestTopic(name=TOPIC, partitions=(
                                 m.OffsetCommitRequestPartition(partition_index=0, committed_offset=1,
                                                                committed_leader_epoch=-1, committed_metadata=None),)),))
        assert [p.error_code for t in committed.topics for p in t.partitions] == [GROUP_DENIED]
        fetched_offsets = bob.call(9, 7, group_id="sec-bobs", topics=None, require_stable=False)
        assert fetched_offsets.error_code == GROUP_DENIED
        described = bob.call(15, 5, groups=("sec-readers",), include_authorized_operations=False)
        assert [g.error_code for g in described.groups] == [GROUP_DENIED]
        assert bob.call(16, 4, states_filter=()).groups == ()  # ListGroups: only those bob may describe
        removed = bob.call(42, 2, groups_names=("sec-readers",))
        assert [r.error_code for r in removed.results] == [GROUP_DENIED]
        heartbeat = bob.call(68, 0, group_id="sec-bobs", member_id="", member_epoch=0, instance_id=None,
                             rack_id=None, rebalance_timeout=datetime.timedelta(seconds=10),
                             subscribed_topic_names=(TOPIC,), server_assignor=None, topic_partitions=())
        assert heartbeat.error_code == GROUP_DENIED
    with _connect(secure, tls_dir, "alice") as alice:  # the same calls, allowed
        assert alice.call(10, 3, key="sec-listed", key_type=0).error_code == 0
        m = _request_module(8, 8)
        committed = alice.call(8, 8, group_id="sec-listed", generation_id_or_member_epoch=-1, member_id="",
                               group_instance_id=None, topics=(m.OffsetCommitRequestTopic(name=TOPIC, partitions=(
                                   m.OffsetCommitRequestPartition(partition_index=0, committed_offset=0,
                                                                  committed_leader_epoch=-1, committed_metadata=None),)),))
        assert [p.error_code for t in committed.topics for p in t.partitions] == [0]
        described = alice.call(15, 5, groups=("sec-listed",), include_authorized_operations=False)
        assert [g.error_code for g in described.groups] == [0]
        assert "sec-listed" in {g.group_id for g in alice.call(16, 4, states_filter=()).groups}
        idempotent = alice.call(22, 4, transactional_id=None, transaction_timeout=datetime.timedelta(seconds=60),
                                producer_id=-1, producer_epoch=-1)  # WRITE on a topic suffices (KIP-679)
        assert idempotent.error_code == 0 and idempotent.producer_id >= 1 << 62  # bound to alice


def test_kafka_acl_apis_change_the_brokers_acls(secure: EmbeddedBroker, tls_dir: Certificates) -> None:  # noqa: F811
    """AdminClient's create/describe/delete_acls (CreateAcls, DescribeAcls, DeleteAcls) act on the
    ACLs the authorizer checks; they need ALTER / DESCRIBE on the cluster."""
    from confluent_kafka.admin import AclBinding as KafkaAcl
    from confluent_kafka.admin import (
        AclBindingFilter,
        AclOperation,
        AclPermissionType,
        ResourcePatternType,
        ResourceType,
    )
    grant = KafkaAcl(ResourceType.TOPIC, TOPIC, ResourcePatternType.LITERAL, "User:bob", "*", AclOperation.WRITE,
                     AclPermissionType.ALLOW)
    bobs = AclBindingFilter(ResourceType.TOPIC, TOPIC, ResourcePatternType.MATCH, "User:bob", None,
                            AclOperation.ANY, AclPermissionType.ANY)
    bob = AdminClient(_kafka_conf(secure, tls_dir, "bob"))
    with pytest.raises(ck.KafkaException) as refused:
        bob.create_acls([grant])[grant].result(20)
    assert refused.value.args[0].code() == ck.KafkaError.CLUSTER_AUTHORIZATION_FAILED
    with _connect(secure, tls_dir, "bob") as raw:  # (librdkafka's describe_acls returns [] on this refusal)
        for version in (1, 2, 3):
            described = raw.call(29, version, resource_type_filter=1, resource_name_filter=None, pattern_type_filter=1,
                                 principal_filter=None, host_filter=None, operation=1, permission_type=1)
            assert described.error_code == CLUSTER_DENIED and described.resources == ()
    admin = AdminClient(_kafka_conf(secure, tls_dir, "admin"))
    admin.create_acls([grant])[grant].result(20)
    described = admin.describe_acls(bobs).result(20)
    assert grant in described and len(described) == 3  # and READ, DESCRIBE on the prefix sec-
    bob_conf = _kafka_conf(secure, tls_dir, "bob")
    assert [e for e, _ in _produce(bob_conf, TOPIC, [b"bob may now"], **{"enable.idempotence": False})] == [None]
    deletion = AclBindingFilter(ResourceType.TOPIC, TOPIC, ResourcePatternType.LITERAL, "User:bob", None,
                                AclOperation.WRITE, AclPermissionType.ANY)
    assert admin.delete_acls([deletion])[deletion].result(20) == [grant]
    results = _produce(bob_conf, TOPIC, [b"no more"], **{"enable.idempotence": False})
    assert [e.code() for e, _ in results] == [ck.KafkaError.TOPIC_AUTHORIZATION_FAILED]
    del bob, admin  # librdkafka's clients end when collected
    with _connect(secure, tls_dir, "admin") as raw:  # every version, in its own shape
        for version in (1, 2, 3):
            m = _request_module(30, version)
            created = raw.call(30, version, creations=(m.AclCreation(
                resource_type=3, resource_name=f"v{version}-", resource_pattern_type=4, principal="User:dave",
                host="*", operation=3, permission_type=3),))  # GROUP, PREFIXED, READ, ALLOW
            assert [r.error_code for r in created.results] == [0]
        described = raw.call(29, 3, resource_type_filter=3, resource_name_filter=None, pattern_type_filter=1,
                             principal_filter="User:dave", host_filter=None, operation=1, permission_type=1)
        assert sorted((r.resource_name, r.pattern_type, [(a.operation, a.permission_type) for a in r.acls])
                      for r in described.resources) == [(f"v{v}-", 4, [(3, 3)]) for v in (1, 2, 3)]
        for version in (1, 2, 3):
            m = _request_module(31, version)
            deleted = raw.call(31, version, filters=(m.DeleteAclsFilter(
                resource_type_filter=3, resource_name_filter=f"v{version}-", pattern_type_filter=4,
                principal_filter=None, host_filter=None, operation=1, permission_type=1),))
            assert [[a.principal for a in r.matching_acls] for r in deleted.filter_results] == [["User:dave"]]
        invalid = raw.call(30, 3, creations=(_request_module(30, 3).AclCreation(
            resource_type=7, resource_name="x", resource_pattern_type=3, principal="User:dave", host="*",
            operation=3, permission_type=3),))  # USER resources: not in this broker's model
        assert [r.error_code for r in invalid.results] == [42]  # INVALID_REQUEST


def test_a_producer_over_its_quota_is_throttled_then_muted(secure: EmbeddedBroker, tls_dir: Certificates) -> None:  # noqa: F811
    m = _request_module(0, 9)
    with _connect(secure, tls_dir, "carol", client_id="greedy") as carol:
        produced = carol.call(0, 9, transactional_id=None, acks=1, timeout=datetime.timedelta(seconds=5),
                              topic_data=(m.TopicProduceData(name=TOPIC, partition_data=(
                                  m.PartitionProduceData(index=0, records=_records(4, 25_000)),)),))
        assert [p.error_code for t in produced.responses for p in t.partition_responses] == [0]
        # 100 kB against 40 kB/s, measured over >= 1 s: throttled, capped at quota_max_throttle_ms.
        throttle_ms = produced.throttle_time.total_seconds() * 1000
        assert throttle_ms == MAX_THROTTLE_MS
        started = time.monotonic()  # KIP-219: the answer came at once, the connection is muted now
        carol.call(API_VERSIONS, 3, client_software_name="t", client_software_version="1")
        assert time.monotonic() - started >= MAX_THROTTLE_MS / 1000 * 0.9
    stats: list[dict[str, Any]] = []  # librdkafka sees the throttle time too
    results = _produce({**_kafka_conf(secure, tls_dir, "carol"), "statistics.interval.ms": 200,
                        "stats_cb": lambda data: stats.append(json.loads(data))}, TOPIC,
                       [random.randbytes(20_000) for _ in range(10)], **{"linger.ms": 0, "batch.size": 25_000})
    assert [e for e, _ in results] == [None] * 10
    assert max(b["throttle"]["max"] for s in stats for b in s["brokers"].values()) > 0


# ---------------------------------------------------------------------------- sessions and logins


@pytest.fixture(scope="module")
def short_sessions(tmp_path_factory: pytest.TempPathFactory) -> Iterator[EmbeddedBroker]:
    """SASL_PLAINTEXT (no authorizer) with 2 s sessions."""
    data_dir = str(tmp_path_factory.mktemp("kafka-sessions"))
    _add_users(data_dir)
    broker = EmbeddedBroker(data_dir, kafka_listener="127.0.0.1:0", overrides={
        "security_protocol": "SASL_PLAINTEXT", "sasl_session_lifetime_ms": 2_000,
        "sasl_failure_delay_ms": 100}).start()
    yield broker
    broker.stop()


def _metadata_ok(connection: KafkaConnection) -> bool:
    return connection.call(METADATA, 12, topics=None, allow_auto_topic_creation=False,
                           include_topic_authorized_operations=False).cluster_id is not None


def test_the_session_lifetime_is_reported_and_a_connection_past_it_is_closed(short_sessions: EmbeddedBroker) -> None:
    with KafkaConnection(short_sessions.kafka_bootstrap) as connection:
        final = connection.login("alice", _password("alice"), "SCRAM-SHA-256")
        assert final.error_code == 0 and final.session_lifetime == datetime.timedelta(seconds=2)
        assert _metadata_ok(connection)
        time.sleep(2.2)
        connection.send(METADATA, 12, topics=None, allow_auto_topic_creation=False,
                        include_topic_authorized_operations=False)
        assert connection.closed_by_peer()


def test_a_connection_re_authenticates_before_its_session_ends(short_sessions: EmbeddedBroker) -> None:
    with KafkaConnection(short_sessions.kafka_bootstrap) as connection:
        assert connection.login("alice", _password("alice")).error_code == 0
        time.sleep(1.2)
        assert connection.login("alice", _password("alice")).error_code == 0  # KIP-368: same connection
        time.sleep(1.2)  # past the first session's end, within the second's
        assert _metadata_ok(connection)
        refused = connection.login("bob", _password("bob"))  # a connection keeps its principal
        assert refused.error_code == SASL_FAILED and connection.closed_by_peer()


def test_a_large_frame_before_the_login_closes_the_connection(short_sessions: EmbeddedBroker) -> None:
    import struct
    with KafkaConnection(short_sessions.kafka_bootstrap) as connection:  # 600 kB > 512 KiB, before any login
        connection.sock.sendall(struct.pack(">ihhi", 600_000, METADATA, 12, 1))
        assert connection.closed_by_peer()


def test_sasl_handshake_v0_logs_in_with_bare_scram_messages(short_sessions: EmbeddedBroker) -> None:
    import struct

    from kafka_tools import recv_exactly
    with KafkaConnection(short_sessions.kafka_bootstrap) as connection:
        handshake = connection.call(SASL_HANDSHAKE, 0, mechanism="SCRAM-SHA-512")
        assert handshake.error_code == 0 and set(handshake.mechanisms) == {"SCRAM-SHA-256", "SCRAM-SHA-512"}
        client = ScramClient("SCRAM-SHA-512", "alice", _password("alice"))

        def token(message: str) -> str:
            connection.sock.sendall(struct.pack(">i", len(message)) + message.encode())
            (size,) = struct.unpack(">i", recv_exactly(connection.sock, 4))
            return recv_exactly(connection.sock, size).decode()
        client.verify(token(client.final(token(client.first()))))
        assert _metadata_ok(connection)


def test_a_wrong_password_or_mechanism_fails_and_closes_the_connection(short_sessions: EmbeddedBroker) -> None:
    with KafkaConnection(short_sessions.kafka_bootstrap) as connection:
        refused = connection.login("carol", "not her password")
        assert refused.error_code == SASL_FAILED and "invalid user name or password" in refused.error_message
        assert connection.closed_by_peer()
    with KafkaConnection(short_sessions.kafka_bootstrap) as connection:
        handshake = connection.call(SASL_HANDSHAKE, 1, mechanism="PLAIN")
        assert handshake.error_code == UNSUPPORTED_MECHANISM and "SCRAM-SHA-512" in handshake.mechanisms
        assert connection.closed_by_peer()
    errors: list[Any] = []
    admin = AdminClient({"bootstrap.servers": short_sessions.kafka_bootstrap, "security.protocol": "SASL_PLAINTEXT",
                         "sasl.mechanism": "SCRAM-SHA-512", "sasl.username": "carol",
                         "sasl.password": "not her password", "error_cb": errors.append, **CLIENT_CONF})
    with pytest.raises(ck.KafkaException):
        admin.list_topics(timeout=3)
    deadline = time.monotonic() + 10
    while not errors and time.monotonic() < deadline:
        admin.poll(0.2)  # serves error_cb
    assert ck.KafkaError._AUTHENTICATION in {e.code() for e in errors}
    del admin  # stop its retries now


def test_a_producer_carries_on_across_session_lifetimes(short_sessions: EmbeddedBroker,
                                                         caplog: pytest.LogCaptureFixture) -> None:
    """librdkafka re-authenticates its connection before the session ends (KIP-368): a
    long-lived producer keeps producing on it."""
    caplog.set_level(logging.DEBUG, logger="logstore.broker.kafka")
    topic = f"sessions-{random.randrange(1 << 30)}"
    security = ClientSecurity(security_protocol="SASL_PLAINTEXT", sasl_mechanism="SCRAM-SHA-256",
                              sasl_plain_username="admin", sasl_plain_password=_password("admin"))
    with Admin(short_sessions.bootstrap, security=security) as admin:
        admin.create_topics([NewTopic(topic, num_partitions=1)])
    producer = ck.Producer({"bootstrap.servers": short_sessions.kafka_bootstrap, "security.protocol": "SASL_PLAINTEXT",
                            "sasl.mechanism": "SCRAM-SHA-512", "sasl.username": "alice",
                            "sasl.password": _password("alice"), "message.timeout.ms": 20_000, **CLIENT_CONF})
    delivered: list[Any] = []
    for i in range(6):
        producer.produce(topic, b"%d" % i, on_delivery=lambda err, msg: delivered.append(err))
        assert producer.flush(20) == 0
        time.sleep(0.9)
    assert delivered == [None] * 6
    assert any("User:alice re-authenticated" in r.getMessage() for r in caplog.records)


# ---------------------------------------------------------------------------- mTLS


@pytest.fixture(scope="module")
def mtls(tls_dir: Certificates, tmp_path_factory: pytest.TempPathFactory) -> Iterator[EmbeddedBroker]:  # noqa: F811
    """SSL with client certificates required, the authorizer on, and a mapping rule for eng."""
    broker = EmbeddedBroker(str(tmp_path_factory.mktemp("kafka-mtls")), kafka_listener="127.0.0.1:0", overrides={
        "tls_cert": tls_dir.server_cert, "tls_key": tls_dir.server_key, "tls_client_ca": tls_dir.ca,
        "ssl_principal_mapping_rules": "RULE:^CN=(.*?),OU=eng,O=logstore$/$1-eng/L,DEFAULT",
        "authorizer": True, "super_users": "User:admin"}).start()
    cert, key = tls_dir.client("admin")
    security = ClientSecurity(security_protocol="SSL", ssl_cafile=tls_dir.ca, ssl_certfile=cert, ssl_keyfile=key)
    with Admin(broker.bootstrap, security=security) as admin:
        admin.create_topics([NewTopic(TOPIC, num_partitions=1)])
        admin.create_acls([_acl("User:alice-eng", "TOPIC", TOPIC, op, "LITERAL") for op in ("WRITE", "DESCRIBE")])
    yield broker
    broker.stop()


def test_a_client_certificate_is_the_principal_on_the_kafka_listener(
        mtls: EmbeddedBroker, tls_dir: Certificates) -> None:  # noqa: F811
    def conf(client: str) -> dict[str, Any]:
        cert, key = tls_dir.client(client)
        return {"bootstrap.servers": mtls.kafka_bootstrap, "security.protocol": "SSL", "ssl.ca.location": tls_dir.ca,
                "ssl.certificate.location": cert, "ssl.key.location": key, **CLIENT_CONF}
    assert [e for e, _ in _produce(conf("alice"), TOPIC, [b"from alice-eng"])] == [None]  # by the rule
    assert [e for e, _ in _produce(conf("admin"), TOPIC, [b"from admin"])] == [None]  # DEFAULT: User:admin
    with pytest.raises((ssl.SSLError, ConnectionError)), \
            KafkaConnection(mtls.kafka_bootstrap, tls=_tls(tls_dir)) as anonymous:  # no certificate: refused
        anonymous.call(API_VERSIONS, 3, client_software_name="t", client_software_version="1")


def test_python_ssl_subjects_are_written_as_grpc_writes_them(tls_dir: Certificates) -> None:  # noqa: F811
    """The same mapping rules give the same principal on both listeners (test_security_tls.py
    pins gRPC's ``CN=alice,OU=eng,O=logstore``)."""
    decoded = ssl._ssl._test_decode_cert(tls_dir.client("alice")[0])  # type: ignore[attr-defined]
    assert rfc2253_subject(decoded["subject"]) == "CN=alice,OU=eng,O=logstore"
    assert rfc2253_subject(((("commonName", "a,b"),), (("organizationName", " x"),),)) == "O=\\ x,CN=a\\,b"
    assert rfc2253_subject(((("commonName", "é"),),)) == "CN=\\C3\\A9"


# ---------------------------------------------------------------------------- config


@pytest.mark.parametrize("overrides", [
    {"security_protocol": "SASL_PLAINTEXT", "authorizer": True},
    {"authorizer": True, "metadata": "etcd://127.0.0.1:2379"},
])
def test_config_takes_a_secured_kafka_listener(overrides: dict[str, Any]) -> None:
    config = load_broker_config(None, overrides={"kafka_listener": "127.0.0.1:9092", **overrides,
                                                 "sasl_inter_broker_username": "broker",
                                                 "sasl_inter_broker_password": "x"}, env={})
    assert config.kafka_listener == "127.0.0.1:9092"


def test_a_tls_kafka_listener_may_bind_any_address(tls_dir: Certificates) -> None:  # noqa: F811
    config = load_broker_config(None, overrides={"kafka_listener": "10.1.2.3:9092", "host": "10.1.2.3",
                                                 "tls_cert": tls_dir.server_cert, "tls_key": tls_dir.server_key},
                                env={})
    assert config.tls and config.kafka_listener == "10.1.2.3:9092"
    assert Path(config.tls_cert).exists()
