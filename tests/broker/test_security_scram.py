"""SCRAM authentication on a SASL_PLAINTEXT broker (logstore.broker.security.scram_service,
.authentication, logstore.client.sasl): without a session every RPC is refused; the right
password logs in (lazily, once per connection) and produce/fetch work; a wrong password and
an unknown user fail alike after the fixed pause; sessions are renewed and re-established;
deleting a user ends its sessions; the credentials hold no password; ``logstore users``."""

from __future__ import annotations

import os
import threading
import time
from collections.abc import Iterator
from pathlib import Path

import grpc
import pyarrow as pa
import pytest
from click.testing import CliRunner
from grpc_health.v1 import health_pb2, health_pb2_grpc

from logstore._proto import logstore_pb2 as pb
from logstore.broker.config import load_broker_config
from logstore.broker.embedded import EmbeddedBroker
from logstore.broker.security.credentials import CREDENTIALS_FILE, FileCredentials
from logstore.cli import main
from logstore.client.admin import Admin
from logstore.client.consumer import Consumer
from logstore.client.credentials import UserScramCredentialDeletion, UserScramCredentialUpsertion
from logstore.client.producer import Producer
from logstore.client.results import FetchRequestPartition
from logstore.client.rpc import BrokerClient
from logstore.client.security import ClientSecurity
from logstore.errors import (
    WIRE_CODE_KEY,
    InvalidConfigError,
    InvalidRequestError,
    ResourceNotFoundError,
    SaslAuthenticationError,
    SecurityDisabledError,
    StorageError,
    UnsupportedSaslMechanismError,
)
from logstore.record import build_batch, encode_batch, encode_schema, untyped_schema
from logstore.scram import ScramClient, make_credential
from logstore.types import NewTopic, TopicPartition

pytestmark = pytest.mark.timeout(120)

PASSWORD = "alice-secret-Pa55"
DELAY_MS = 300
SERVICE = pb.DESCRIPTOR.services_by_name["Logstore"]


def sasl(user: str = "alice", password: str = PASSWORD, mechanism: str = "SCRAM-SHA-256") -> ClientSecurity:
    return ClientSecurity(security_protocol="SASL_PLAINTEXT", sasl_mechanism=mechanism,
                          sasl_plain_username=user, sasl_plain_password=password)


def offline_user(data_dir: str, user: str, password: str) -> None:
    """The first user, written before the broker starts (as ``logstore users create --data-dir``)."""
    FileCredentials(data_dir).alter(user, [make_credential(m, password) for m in ("SCRAM-SHA-256", "SCRAM-SHA-512")], [])


@pytest.fixture(scope="module")
def broker(tmp_path_factory: pytest.TempPathFactory) -> Iterator[EmbeddedBroker]:
    data_dir = str(tmp_path_factory.mktemp("sasl-broker"))
    offline_user(data_dir, "alice", PASSWORD)
    with EmbeddedBroker(data_dir, overrides={"security_protocol": "SASL_PLAINTEXT",
                                             "sasl_failure_delay_ms": DELAY_MS}) as b:
        yield b


@pytest.fixture(scope="module")
def alice(broker: EmbeddedBroker) -> Iterator[BrokerClient]:
    with BrokerClient(broker.bootstrap, security=sasl()) as client:
        yield client


def raw_channel(broker: EmbeddedBroker) -> grpc.Channel:
    return grpc.insecure_channel(broker.bootstrap, options=[("grpc.use_local_subchannel_pool", 1)])


def refusal_code(error: grpc.RpcError) -> tuple[grpc.StatusCode, str | None]:
    assert isinstance(error, grpc.Call)
    codes = [v for k, v in error.trailing_metadata() or () if k == WIRE_CODE_KEY]
    return error.code(), (codes[0] if codes else None)


def call_raw(channel: grpc.Channel, method: str, metadata: list[tuple[str, str]] | None = None) -> None:
    """Call ``method`` with an empty request (its bytes never reach a handler when refused)."""
    path = f"/logstore.v1.Logstore/{method}"
    if SERVICE.methods_by_name[method].client_streaming:
        channel.stream_unary(path)(iter([b""]), timeout=10, metadata=metadata)
    else:
        channel.unary_unary(path)(b"", timeout=10, metadata=metadata)


def produce_and_fetch(client: BrokerClient, topic: str, values: list[bytes]) -> list[bytes]:
    schema = untyped_schema()
    batch = build_batch(schema, values=values, timestamps_ms=[1_700_000_000_000] * len(values))
    [result] = client.produce([(TopicPartition(topic, 0), encode_schema(schema) + encode_batch(batch, base_offset=0).to_bytes())],
                              acks=-1)
    assert result.error is None, result.error
    [answer] = client.fetch([FetchRequestPartition(TopicPartition(topic, 0), result.base_offsets[0], 1 << 20)],
                            max_wait_ms=0)
    assert answer.error is None, answer.error
    table = pa.ipc.open_stream(answer.schema + bytes(answer.records)).read_all()
    return table.column("value").to_pylist()


# ------------------------------------------------------------------ refused without a session


@pytest.mark.parametrize("metadata", [None, [("logstore-session", "forged-token")]], ids=["none", "forged"])
def test_every_rpc_but_sasl_authenticate_is_refused_without_a_session(
        broker: EmbeddedBroker, metadata: list[tuple[str, str]] | None) -> None:
    methods = [m.name for m in SERVICE.methods if m.name != "SaslAuthenticate"]
    assert {"Produce", "Fetch", "ReplaceSegments", "AlterUserScramCredentials", "CreateAcls"} <= set(methods)
    with raw_channel(broker) as channel:
        for method in methods:
            with pytest.raises(grpc.RpcError) as caught:
                call_raw(channel, method, metadata)
            assert refusal_code(caught.value) == (grpc.StatusCode.UNAUTHENTICATED, "SASL_AUTHENTICATION_FAILED"), method
        # The health service answers probes without credentials.
        health = health_pb2_grpc.HealthStub(channel).Check(health_pb2.HealthCheckRequest(service=""), timeout=10)
        assert health.status == health_pb2.HealthCheckResponse.SERVING


def test_a_client_without_credentials_gets_one_clear_error(broker: EmbeddedBroker) -> None:
    with BrokerClient(broker.bootstrap) as anonymous, pytest.raises(SaslAuthenticationError, match="SASL_PLAINTEXT"):
        anonymous.metadata()


# ------------------------------------------------------------------ the right password


@pytest.mark.parametrize("mechanism", ["SCRAM-SHA-256", "SCRAM-SHA-512"])
def test_the_right_password_logs_in_once_and_produce_fetch_work(broker: EmbeddedBroker, mechanism: str) -> None:
    with BrokerClient(broker.bootstrap, security=sasl(mechanism=mechanism)) as client:
        topic = f"orders-{mechanism[-3:]}"
        assert client.create_topics([NewTopic(topic, 1)]) == {topic: None}
        assert produce_and_fetch(client, topic, [b"a", b"b"]) == [b"a", b"b"]
        threads = [threading.Thread(target=client.metadata) for _ in range(8)]
        for t in threads:
            t.start()
        for t in threads:
            t.join(30)
        login = client.transport.router.home.login
        assert login is not None and login.logins == 1 and login.principal == "User:alice"


def test_produce_async_carries_the_session(alice: BrokerClient) -> None:
    alice.create_topics([NewTopic("async-t", 1)])
    schema = untyped_schema()
    data = encode_schema(schema) + encode_batch(build_batch(schema, values=[b"x"], timestamps_ms=[1]), base_offset=0).to_bytes()
    [result] = alice.produce_async([(TopicPartition("async-t", 0), data)], acks=1).result(30)
    assert result.error is None


# ------------------------------------------------------------------ wrong credentials


def test_wrong_password_and_unknown_user_fail_alike_after_the_fixed_delay(broker: EmbeddedBroker) -> None:
    outcomes = []
    for security in (sasl(password="wrong"), sasl(user="nobody"), sasl(user="nobody", mechanism="SCRAM-SHA-512")):
        started = time.monotonic()
        with BrokerClient(broker.bootstrap, security=security) as client, pytest.raises(SaslAuthenticationError) as caught:
            client.metadata()
        elapsed = time.monotonic() - started
        assert elapsed >= DELAY_MS / 1000 * 0.95, elapsed
        outcomes.append((type(caught.value), caught.value.code, caught.value.message))
    assert len(set(outcomes)) == 1, outcomes
    assert "user" not in outcomes[0][2].split(":")[0]  # nothing says which part was wrong


def test_an_unknown_users_server_first_message_looks_like_a_real_users(broker: EmbeddedBroker) -> None:
    def server_first(user: str) -> tuple[int, int]:
        client = ScramClient("SCRAM-SHA-256", user, "x")
        with raw_channel(broker) as channel:
            answer = pb.SaslAuthenticateResponse.FromString(channel.unary_unary("/logstore.v1.Logstore/SaslAuthenticate")(
                pb.SaslAuthenticateRequest(mechanism="SCRAM-SHA-256", auth_bytes=client.first().encode()).SerializeToString(),
                timeout=10))
        fields = dict(p.split("=", 1) for p in answer.auth_bytes.decode().split(","))
        return len(fields["s"]), int(fields["i"]), fields["s"]  # type: ignore[return-value]

    real, ghost, ghost_again = server_first("alice"), server_first("ghost"), server_first("ghost")
    assert real[:2] == ghost[:2]  # same salt length, same iterations
    assert ghost == ghost_again   # a stable salt: asking twice does not unmask a fake


def test_unsupported_mechanism_and_out_of_order_steps(broker: EmbeddedBroker) -> None:
    with raw_channel(broker) as channel:
        call = channel.unary_unary("/logstore.v1.Logstore/SaslAuthenticate")
        for request, code in ((pb.SaslAuthenticateRequest(mechanism="PLAIN", auth_bytes=b"\0a\0b"),
                               UnsupportedSaslMechanismError.code),
                              (pb.SaslAuthenticateRequest(mechanism="SCRAM-SHA-256", auth_bytes=b"c=biws,r=x,p=AA==",
                                                          exchange_id="made-up"), "ILLEGAL_SASL_STATE"),
                              (pb.SaslAuthenticateRequest(mechanism="SCRAM-SHA-256", auth_bytes=b"\xff\xfe"),
                               "SASL_AUTHENTICATION_FAILED")):
            with pytest.raises(grpc.RpcError) as caught:
                call(request.SerializeToString(), timeout=10)
            assert refusal_code(caught.value) == (grpc.StatusCode.UNAUTHENTICATED, code)


# ------------------------------------------------------------------ sessions


def test_sessions_are_renewed_and_reestablished_after_a_broker_restart(tmp_path: Path) -> None:
    offline_user(str(tmp_path), "alice", PASSWORD)
    overrides = {"security_protocol": "SASL_PLAINTEXT", "sasl_session_lifetime_ms": 1000}
    with EmbeddedBroker(str(tmp_path), overrides=overrides) as b, BrokerClient(b.bootstrap, security=sasl()) as client:
        client.metadata()
        login = client.transport.router.home.login
        assert login is not None and login.logins == 1
        old_token = login._token
        time.sleep(1.1)
        with raw_channel(b) as channel, pytest.raises(grpc.RpcError) as caught:  # the broker forgot it
            call_raw(channel, "Metadata", [("logstore-session", str(old_token))])
        assert refusal_code(caught.value) == (grpc.StatusCode.UNAUTHENTICATED, "SASL_AUTHENTICATION_FAILED")
        client.metadata()  # renewed before use
        assert login.logins == 2
        b.stop()
        b.overrides["sasl_session_lifetime_ms"] = 3_600_000
        b.start()  # sessions live in the broker's memory: all gone
        client.metadata()  # (its session was due for renewal anyway)
        assert login.logins == 3
        b.stop()
        b.start()
        client.metadata()  # a one-hour session, refused: logged in again and sent again
        assert login.logins == 4
        client.create_topics([NewTopic("restarts", 1)])
        b.stop()
        b.start()
        schema = untyped_schema()
        data = encode_schema(schema) + encode_batch(build_batch(schema, values=[b"x"], timestamps_ms=[1]),
                                                    base_offset=0).to_bytes()
        [result] = client.produce_async([(TopicPartition("restarts", 0), data)], acks=1).result(30)  # a future
        assert result.error is None and login.logins == 5


def test_deleting_a_user_ends_its_sessions(broker: EmbeddedBroker) -> None:
    with Admin(broker.bootstrap, security=sasl()) as admin:
        admin.alter_user_scram_credentials([UserScramCredentialUpsertion("carol", "carol-pw", "SCRAM-SHA-512", 8192)])
        described = admin.describe_user_scram_credentials(["carol"])["carol"]
        assert [(c.mechanism, c.iterations) for c in described.credentials] == [("SCRAM-SHA-512", 8192)]
        with BrokerClient(broker.bootstrap, security=sasl("carol", "carol-pw", "SCRAM-SHA-512")) as carol:
            carol.metadata()
            admin.alter_user_scram_credentials([UserScramCredentialDeletion("carol", "SCRAM-SHA-512")])
            with pytest.raises(SaslAuthenticationError, match="invalid user name or password"):
                carol.metadata()  # the session ended; logging in again fails: no such user
        with pytest.raises(ResourceNotFoundError):
            admin.describe_user_scram_credentials(["carol"])
        with pytest.raises(ResourceNotFoundError):
            admin.alter_user_scram_credentials([UserScramCredentialDeletion("carol", "SCRAM-SHA-512")])
        with pytest.raises(InvalidRequestError, match="4096 to 16384"):
            admin.alter_user_scram_credentials([UserScramCredentialUpsertion("dave", "pw", iterations=100)])


def test_one_request_alters_many_users_each_with_its_own_outcome(alice: BrokerClient) -> None:
    many = [UserScramCredentialUpsertion(f"bulk-{i}", f"pw-{i}") for i in range(50)]
    outcome = alice.scram.alter_user_scram_credentials(
        [*many, UserScramCredentialUpsertion("bulk-bad", "pw", iterations=100)],
        [UserScramCredentialDeletion("bulk-missing")])
    assert isinstance(outcome.pop("bulk-bad"), InvalidRequestError)
    assert isinstance(outcome.pop("bulk-missing"), ResourceNotFoundError)
    assert outcome == {f"bulk-{i}": None for i in range(50)}
    described = alice.scram.describe_user_scram_credentials([f"bulk-{i}" for i in range(50)] + ["bulk-bad"])
    assert isinstance(described.pop("bulk-bad"), ResourceNotFoundError)
    assert all(not isinstance(d, Exception) for d in described.values()) and len(described) == 50
    assert alice.scram.alter_user_scram_credentials([], [UserScramCredentialDeletion(f"bulk-{i}") for i in range(50)]) == {
        f"bulk-{i}": None for i in range(50)}


def test_the_credentials_file_holds_no_password(broker: EmbeddedBroker) -> None:
    with Admin(broker.bootstrap, security=sasl()) as admin:
        admin.alter_user_scram_credentials([UserScramCredentialUpsertion("erin", "erin-Secret-77")])
    path = Path(broker.data_dir) / CREDENTIALS_FILE
    assert path.stat().st_mode & 0o077 == 0  # the owner's only
    for file in Path(broker.data_dir).rglob("*"):
        if file.is_file():
            data = file.read_bytes()
            assert b"erin-Secret-77" not in data and PASSWORD.encode() not in data, file


# ------------------------------------------------------------------ logstore users


def test_users_cli_offline_needs_a_stopped_broker_and_never_shows_the_password(
        broker: EmbeddedBroker, tmp_path: Path) -> None:
    runner = CliRunner()
    running = runner.invoke(main, ["users", "create", "x", "--password-stdin", "--data-dir", broker.data_dir],
                            input="pw-x\n")
    assert running.exit_code == 1 and f"pid {os.getpid()}" in running.output
    created = runner.invoke(main, ["users", "create", "frank", "--password-stdin", "--data-dir", str(tmp_path),
                                   "--iterations", "5000"], input="frank-Pw-123\n")
    assert created.exit_code == 0, created.output
    listed = runner.invoke(main, ["users", "list", "--format", "json", "--data-dir", str(tmp_path)])
    assert '"user": "frank"' in listed.output and "SCRAM-SHA-512" in listed.output and "5000" in listed.output
    no_tty = runner.invoke(main, ["users", "create", "gina", "--data-dir", str(tmp_path)], input="pw\n")
    assert no_tty.exit_code == 1 and "--password-stdin" in no_tty.output
    deleted = runner.invoke(main, ["users", "delete", "frank", "--data-dir", str(tmp_path)])
    assert deleted.exit_code == 0, deleted.output
    assert "no users" in runner.invoke(main, ["users", "list", "--data-dir", str(tmp_path)]).output
    for result in (created, listed, deleted):
        assert "frank-Pw-123" not in result.output
    assert "frank-Pw-123" not in (tmp_path / CREDENTIALS_FILE).read_text()


def test_users_cli_online_creates_a_user_who_can_log_in(broker: EmbeddedBroker) -> None:
    env = {"LOGSTORE_BOOTSTRAP": broker.bootstrap, "LOGSTORE_SECURITY_PROTOCOL": "SASL_PLAINTEXT",
           "LOGSTORE_SASL_MECHANISM": "SCRAM-SHA-256", "LOGSTORE_SASL_USERNAME": "alice",
           "LOGSTORE_SASL_PASSWORD": PASSWORD}
    runner = CliRunner(env=env)
    created = runner.invoke(main, ["users", "create", "hank", "--password-stdin", "--mechanism", "SCRAM-SHA-256"],
                            input="hank-Pw-9\n")
    assert created.exit_code == 0, created.output
    assert "hank-Pw-9" not in created.output
    with BrokerClient(broker.bootstrap, security=sasl("hank", "hank-Pw-9")) as hank:
        hank.metadata()
    listed = runner.invoke(main, ["users", "list"])
    assert "hank" in listed.output and "alice" in listed.output
    assert runner.invoke(main, ["users", "delete", "hank"]).exit_code == 0
    refused = CliRunner(env={**env, "LOGSTORE_SASL_PASSWORD": "wrong"}).invoke(main, ["users", "list"])
    assert refused.exit_code == 1 and refused.output.startswith("error: [SASL_AUTHENTICATION_FAILED]")


def test_a_sasl_client_of_a_plaintext_broker_is_told_so(tmp_path: Path) -> None:
    with (EmbeddedBroker(str(tmp_path)) as plain, BrokerClient(plain.bootstrap, security=sasl()) as client,
          pytest.raises(SecurityDisabledError, match="PLAINTEXT")):
        client.metadata()


def test_the_credentials_file_reopens_from_disk_and_refuses_a_damaged_one(tmp_path: Path) -> None:
    store = FileCredentials(str(tmp_path))
    alice, bob = make_credential("SCRAM-SHA-256", "a"), make_credential("SCRAM-SHA-512", "b", iterations=5000)
    store.alter("alice", [alice], [])
    store.alter("bob", [bob], [])
    store.alter("alice", [], ["SCRAM-SHA-256"])  # her last mechanism: the user is gone
    reopened = FileCredentials(str(tmp_path))
    assert reopened.users() == {"bob": {"SCRAM-SHA-512": bob}}
    with pytest.raises(ResourceNotFoundError):
        reopened.alter("bob", [], ["SCRAM-SHA-256"])
    assert FileCredentials(str(tmp_path)).users() == {"bob": {"SCRAM-SHA-512": bob}}  # nothing changed
    path = tmp_path / CREDENTIALS_FILE
    path.write_text(path.read_text().replace('"version": 1', '"version": 9'))
    with pytest.raises(InvalidConfigError, match="version"):
        FileCredentials(str(tmp_path))
    path.write_text('{"version": 1, "users": {"x": {"SCRAM-SHA-256": {"salt": 1}}}}')
    with pytest.raises(StorageError, match=str(path)):
        FileCredentials(str(tmp_path))


def test_broker_config_checks_the_sasl_keys() -> None:
    config = load_broker_config(overrides={"security_protocol": "SASL_PLAINTEXT", "sasl_enabled_mechanisms": "scram-sha-512"},
                                env={})
    assert config.sasl and config.sasl_mechanisms == ("SCRAM-SHA-512",)
    for bad in ({"security_protocol": "SASL"}, {"sasl_enabled_mechanisms": "PLAIN"}, {"scram_iterations": 1000},
                {"sasl_session_lifetime_ms": 0}, {"sasl_inter_broker_mechanism": "PLAIN"},
                {"security_protocol": "SASL_PLAINTEXT", "metadata": "etcd://127.0.0.1:2379"}):
        with pytest.raises(InvalidConfigError):
            load_broker_config(overrides=bad, env={})
    clustered = load_broker_config(overrides={"security_protocol": "SASL_PLAINTEXT", "metadata": "etcd://h:2379",
                                              "sasl_inter_broker_username": "broker"},
                                   env={"LOGSTORE_SASL_INTER_BROKER_PASSWORD": "inter-Pw"})
    assert clustered.sasl_inter_broker_password == "inter-Pw" and "inter-Pw" not in repr(clustered)


# ------------------------------------------------------------------ a cluster


@pytest.mark.timeout(240)
def test_a_cluster_keeps_users_in_etcd_and_replicates_as_the_inter_broker_user(tmp_path: Path) -> None:
    from logstore.dev.local_cluster import LocalCluster

    inter_broker = {"security_protocol": "SASL_PLAINTEXT", "sasl_inter_broker_username": "broker",
                    "sasl_inter_broker_mechanism": "SCRAM-SHA-512"}
    env = {"LOGSTORE_SASL_INTER_BROKER_PASSWORD": "broker-Pw-1"}
    with LocalCluster(2, tmp_path / "cluster", extra_config=inter_broker, env=env) as cluster:
        runner = CliRunner()
        for user, password in (("broker", "broker-Pw-1"), ("alice", PASSWORD)):  # the first users, straight into etcd
            created = runner.invoke(main, ["users", "create", user, "--password-stdin", "--metadata", cluster.metadata_url],
                                    input=password + "\n")
            assert created.exit_code == 0, created.output
        first, second = (cluster.address(n) for n in cluster.node_ids)
        with Admin(first, security=sasl()) as admin:
            admin.alter_user_scram_credentials([UserScramCredentialUpsertion("ivy", "ivy-Pw-2")])
            admin.create_topics([NewTopic("replicated", 1, replication_factor=2, configs={"min.insync.replicas": "2"})])
        with BrokerClient(second, security=sasl("ivy", "ivy-Pw-2")) as ivy:  # created through the first broker
            deadline = time.monotonic() + 60
            while True:  # acks=all with min.insync.replicas=2: the follower must be fetching, logged in
                try:
                    assert produce_and_fetch(ivy, "replicated", [b"r1"]) == [b"r1"]
                    break
                except Exception:
                    if time.monotonic() > deadline:
                        raise
                    time.sleep(0.2)
        # A transaction over partitions of both brokers: the leader that is not the coordinator
        # asks the coordinator (verify_only) as the inter-broker user, in its SCRAM session.
        with Admin(first, security=sasl()) as admin:
            admin.create_topics([NewTopic("txn-sasl", 2, replication_factor=2)])
        with Producer(cluster.bootstrap, security=sasl(), transactional_id="sasl-txn") as producer:
            producer.init_transactions()
            producer.begin_transaction()
            for p in range(2):
                producer.send("txn-sasl", f"c{p}".encode(), partition=p)
            producer.commit_transaction()
        with Consumer(cluster.bootstrap, security=sasl(), isolation_level="read_committed",
                      auto_offset_reset="earliest") as consumer:
            consumer.assign([TopicPartition("txn-sasl", p) for p in range(2)])
            got: list[bytes] = []
            deadline = time.monotonic() + 30
            while len(got) < 2 and time.monotonic() < deadline:
                got += [r.value for r in consumer.poll(0.5)]
        assert sorted(got) == [b"c0", b"c1"]
        listed = runner.invoke(main, ["users", "list", "--format", "json", "--metadata", cluster.metadata_url])
        assert all(f'"user": "{u}"' in listed.output for u in ("alice", "broker", "ivy")), listed.output
        with BrokerClient(second, security=sasl("ivy", "ivy-Pw-2")) as ivy:
            ivy.metadata()  # logged in on the second broker
            deleted = runner.invoke(main, ["users", "delete", "ivy", "--metadata", cluster.metadata_url])
            assert deleted.exit_code == 0, deleted.output
            deadline = time.monotonic() + 15
            with pytest.raises(SaslAuthenticationError):  # its session there ends too, within seconds
                while time.monotonic() < deadline:
                    ivy.metadata()
                    time.sleep(0.2)
