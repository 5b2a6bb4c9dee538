"""TLS and mTLS on the broker's listener and in the clients (issue 12, logstore.broker.security.tls).

* a TLS broker and a TLS client (kafka-python keywords, a confluent-style dict) round-trip
  records; a plaintext client, or one that does not trust the broker's CA, fails with one
  BROKER_NOT_AVAILABLE line naming TLS;
* mTLS: a client without a certificate (or with one of another CA) is refused; the
  certificate's CN becomes ``User:alice`` (seen by the authorizer on real calls),
  and ``ssl_principal_mapping_rules`` rewrite it;
* a plaintext listener on a non-loopback address: refused (exit 2, one line) unless
  ``--allow-plaintext`` (a warning).
"""

from __future__ import annotations

import socket
import subprocess
import sys
from collections.abc import Iterator
from typing import Any

import pytest
from security_helpers import Certificates, InProcessBroker, tls_dir  # noqa: F401 - the session fixture

from logstore import (
    Admin,
    BrokerUnavailableError,
    Consumer,
    InvalidConfigError,
    Producer,
    TopicPartition,
)
from logstore.broker.config import load_broker_config
from logstore.broker.embedded import EmbeddedBroker
from logstore.broker.security.tls import PrincipalMapper
from logstore.client.rpc import BrokerClient
from logstore.client.security import ClientSecurity

pytestmark = pytest.mark.timeout(120)


@pytest.fixture(scope="module")
def tls_broker(tls_dir: Certificates, tmp_path_factory: pytest.TempPathFactory) -> Iterator[EmbeddedBroker]:  # noqa: F811
    broker = EmbeddedBroker(str(tmp_path_factory.mktemp("tls-broker")), overrides={
        "tls_cert": tls_dir.server_cert, "tls_key": tls_dir.server_key})
    broker.start()
    yield broker
    broker.stop()


@pytest.fixture(scope="module")
def mtls_broker(tls_dir: Certificates, tmp_path_factory: pytest.TempPathFactory) -> Iterator[InProcessBroker]:  # noqa: F811
    broker = InProcessBroker({
        "data_dir": str(tmp_path_factory.mktemp("mtls-broker")), "port": 0,
        "tls_cert": tls_dir.server_cert, "tls_key": tls_dir.server_key, "tls_client_ca": tls_dir.ca,
        "ssl_principal_mapping_rules": "RULE:^CN=(.*?),OU=eng,O=logstore$/$1-eng/U,DEFAULT",
    })
    yield broker
    broker.stop()


def _ssl(tls_dir: Certificates, client: str | None = None, ca: str | None = None) -> dict[str, str]:  # noqa: F811
    options = {"security_protocol": "SSL", "ssl_cafile": ca or tls_dir.ca}
    if client is not None:
        options["ssl_certfile"], options["ssl_keyfile"] = tls_dir.client(client)
    return options


# ---------------------------------------------------------------------------------------- TLS


def test_tls_round_trip_with_kafka_python_keywords_and_a_config_dict(
        tls_broker: EmbeddedBroker, tls_dir: Certificates) -> None:  # noqa: F811
    with Admin(tls_broker.bootstrap, **_ssl(tls_dir)) as admin:
        admin.create_topic("tls-orders", num_partitions=1)
    with Producer({"bootstrap.servers": tls_broker.bootstrap, "security.protocol": "SSL",
                   "ssl.ca.location": tls_dir.ca, "linger.ms": "0", "client.id": "t"}) as producer:
        for i in range(5):
            producer.send("tls-orders", value=f"v{i}".encode())
        producer.flush(timeout=30)
    with Consumer(tls_broker.bootstrap, auto_offset_reset="earliest", **_ssl(tls_dir)) as consumer:
        consumer.assign([TopicPartition("tls-orders", 0)])
        seen: list[bytes] = []
        for _ in range(50):
            seen += [r.value for r in consumer.poll(0.2)]
            if len(seen) >= 5:
                break
    assert seen == [f"v{i}".encode() for i in range(5)]


def test_a_plaintext_client_of_a_tls_broker_gets_one_line_naming_tls(tls_broker: EmbeddedBroker) -> None:
    with BrokerClient(tls_broker.bootstrap, request_timeout_ms=3000) as client, \
            pytest.raises(BrokerUnavailableError) as info:
        client.metadata([])
    assert info.value.code == "BROKER_NOT_AVAILABLE"
    assert "security_protocol=SSL" in str(info.value) and "\n" not in str(info.value)


def test_a_client_that_does_not_trust_the_broker_ca_is_refused(
        tls_broker: EmbeddedBroker, tls_dir: Certificates) -> None:  # noqa: F811
    security = ClientSecurity("SSL", ssl_cafile=tls_dir.path("rogue-ca.pem"))
    with BrokerClient(tls_broker.bootstrap, request_timeout_ms=3000, security=security) as client, \
            pytest.raises(BrokerUnavailableError) as info:
        client.metadata([])
    assert "TLS" in str(info.value) and "ssl_cafile" in str(info.value)


def test_unknown_config_keys_are_one_invalid_config_line(tls_broker: EmbeddedBroker) -> None:
    with pytest.raises(InvalidConfigError, match="no config 'linger.msec'"):
        Producer({"bootstrap.servers": tls_broker.bootstrap, "linger.msec": 5})
    with pytest.raises(InvalidConfigError, match="given in the config dict and as a keyword"):
        Admin({"bootstrap.servers": tls_broker.bootstrap}, bootstrap_servers=tls_broker.bootstrap)


# --------------------------------------------------------------------------------------- mTLS


def test_mtls_maps_the_certificate_to_the_caller_principal(
        mtls_broker: InProcessBroker, tls_dir: Certificates) -> None:  # noqa: F811
    mtls_broker.principals.clear()
    with BrokerClient(mtls_broker.bootstrap, security=ClientSecurity(**_ssl(tls_dir, "admin"))) as client:
        client.metadata([])
    with BrokerClient(mtls_broker.bootstrap, security=ClientSecurity(**_ssl(tls_dir, "alice"))) as client:
        client.metadata([])
    # admin: DEFAULT, the CN; alice (CN=alice,OU=eng,O=logstore): the rule, upper-cased.
    assert [p.name for p in mtls_broker.principals] == ["User:admin", "User:ALICE-ENG"]
    assert {p.host for p in mtls_broker.principals} == {"127.0.0.1"}


@pytest.mark.parametrize("client", [None, "rogue"])
def test_mtls_refuses_a_client_without_a_trusted_certificate(
        mtls_broker: InProcessBroker, tls_dir: Certificates, client: str | None) -> None:  # noqa: F811
    mtls_broker.principals.clear()
    security = ClientSecurity(**_ssl(tls_dir, client))
    with BrokerClient(mtls_broker.bootstrap, request_timeout_ms=3000, security=security) as conn, \
            pytest.raises(BrokerUnavailableError, match="TLS"):
        conn.metadata([])
    assert mtls_broker.principals == []


def test_principal_mapping_rules_follow_kafka_syntax() -> None:
    mapper = PrincipalMapper(r"RULE:^CN=(.*?),OU=(.*?),O=.*$/$1@$2/L, RULE:^CN=([^,]*)\/x.*$/$1/, DEFAULT")
    assert mapper.principal("CN=Alice,OU=Eng,O=logstore", "Alice") == "User:alice@eng"
    assert mapper.principal("CN=bob/x,O=a", "bob/x") == "User:bob"
    assert mapper.principal("CN=carol,O=a", "carol") == "User:carol"
    assert PrincipalMapper("RULE:^CN=x$/y/").principal("CN=z", "z") is None
    with pytest.raises(InvalidConfigError, match="ssl_principal_mapping_rules"):
        PrincipalMapper("RULE:nope")


# ------------------------------------------------------------------- plaintext on the network


def _non_loopback_address() -> str | None:
    with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as s:
        try:
            s.connect(("192.0.2.1", 9))  # no packet is sent: this picks the outgoing interface
            address = str(s.getsockname()[0])
        except OSError:
            return None
    return None if address.startswith("127.") else address


def _start(tmp_path: Any, *flags: str) -> subprocess.CompletedProcess[str] | subprocess.Popen[str]:
    cmd = [sys.executable, "-m", "logstore.broker", "--data-dir", str(tmp_path),
           "--port", "0", *flags]
    return subprocess.run(cmd, capture_output=True, text=True, timeout=60)


def test_a_plaintext_non_loopback_listener_is_refused_with_one_line(tmp_path: Any) -> None:
    result = _start(tmp_path, "--host", "0.0.0.0")
    assert result.returncode == 2
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1 and "[INVALID_CONFIG]" in lines[0] and "--allow-plaintext" in lines[0], result.stderr


def test_allow_plaintext_starts_with_a_warning(tmp_path: Any) -> None:
    host = _non_loopback_address() or "0.0.0.0"
    proc = subprocess.Popen([sys.executable, "-m", "logstore.broker", "--data-dir", str(tmp_path),
                             "--port", "0", "--host", host, "--allow-plaintext"],
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        assert proc.stdout is not None
        line = proc.stdout.readline()
        assert line.startswith(f"listening on {host}:"), line
    finally:
        proc.terminate()
        _, err = proc.communicate(timeout=60)
    assert "PLAINTEXT (allow_plaintext)" in err


# ------------------------------------------------------------------------------------ the CLI


def test_cli_reads_command_config_and_logstore_env(
        tls_broker: EmbeddedBroker, tls_dir: Certificates, tmp_path: Any) -> None:  # noqa: F811
    from click.testing import CliRunner

    from logstore.cli import main

    props = tmp_path / "client.properties"
    props.write_text(f"# Kafka tools' format\nsecurity.protocol=SSL\nssl.ca.location = {tls_dir.ca}\n")
    runner = CliRunner(env={"LOGSTORE_BOOTSTRAP": tls_broker.bootstrap})
    created = runner.invoke(main, ["topics", "create", "cli-tls", "--command-config", str(props)])
    assert created.exit_code == 0, created.output
    plain = runner.invoke(main, ["topics", "list"])
    assert plain.exit_code != 0 and "[BROKER_NOT_AVAILABLE]" in plain.output and "TLS" in plain.output
    env = CliRunner(env={"LOGSTORE_BOOTSTRAP": tls_broker.bootstrap, "LOGSTORE_SECURITY_PROTOCOL": "SSL",
                         "LOGSTORE_SSL_CAFILE": tls_dir.ca})
    listed = env.invoke(main, ["topics", "list", "--format", "json"])
    assert listed.exit_code == 0 and "cli-tls" in listed.output, listed.output
    props.write_text("security.protocol=SSL\nssl.keystore.password=secret\n")
    bad = runner.invoke(main, ["topics", "list", "--command-config", str(props)])
    assert bad.exit_code != 0 and "[INVALID_CONFIG]" in bad.output and "ssl.keystore.password" in bad.output
    assert "secret" not in bad.output


# ------------------------------------------------------------------------ parsing (no broker)


def test_command_config_files_read_as_kafka_tools_read_them(tmp_path: Any) -> None:
    from logstore.cli_api.security_options import read_command_config, security_from_env

    props = tmp_path / "c.properties"
    props.write_text("! comment\nsecurity.protocol : SASL_SSL\nssl.truststore.location ca.pem\n"
                     "sasl.mechanism=SCRAM-SHA-512\nsasl.jaas.config=org.apache.kafka.common.security.scram."
                     'ScramLoginModule required \\\n    username="alice" password="pa ss";\n')
    assert read_command_config(str(props)) == {
        "security_protocol": "SASL_SSL", "ssl_cafile": "ca.pem", "sasl_mechanism": "SCRAM-SHA-512",
        "sasl_plain_username": "alice", "sasl_plain_password": "pa ss"}
    props.write_text("sasl.password\n")
    with pytest.raises(InvalidConfigError, match="line 1 is not key=value"):
        read_command_config(str(props))
    assert security_from_env({"LOGSTORE_SSL_CAFILE": "ca.pem", "LOGSTORE_SASL_PASSWORD": ""}) == {
        "ssl_cafile": "ca.pem"}


def test_config_dict_values_take_the_keyword_types() -> None:
    import inspect

    from logstore.client.client_config import keywords_from_config

    signature = inspect.signature(Producer.__init__)
    assert keywords_from_config({"linger.ms": "7", "enable.idempotence": "false", "compression.type": "zstd",
                                 "acks": "all", "client.id": "x", "security.protocol": "SSL"},
                                signature, "Producer") == {
        "linger_ms": 7, "enable_idempotence": False, "compression": "zstd", "acks": "all",
        "client_id": "x", "security_protocol": "SSL"}  # client.id: the Producer's client_id (quotas)
    with pytest.raises(InvalidConfigError, match="must be an integer"):
        keywords_from_config({"linger.ms": "soon"}, signature, "Producer")


def test_spark_style_security_options_and_their_kafka_spellings() -> None:
    from logstore.client.security import security_from_prefixed_options

    security, used = security_from_prefixed_options({
        "kafka.security.protocol": "SASL_SSL", "logstore.sasl.mechanism": "SCRAM-SHA-256",
        "kafka.sasl.jaas.config": 'x required username="bob" password="pw";', "subscribe": "t"})
    assert security == ClientSecurity("SASL_SSL", sasl_mechanism="SCRAM-SHA-256", sasl_plain_username="bob",
                                      sasl_plain_password="pw")
    assert used == {"kafka.security.protocol", "logstore.sasl.mechanism", "kafka.sasl.jaas.config"}
    assert "pw" not in repr(security)
    with pytest.raises(InvalidConfigError, match="disagree"):
        security_from_prefixed_options({"kafka.sasl.username": "a", "logstore.sasl.username": "b"})


def test_broker_tls_keys_are_checked_when_the_config_loads(tls_dir: Certificates) -> None:  # noqa: F811
    with pytest.raises(InvalidConfigError, match="tls_cert and tls_key together"):
        load_broker_config(None, overrides={"tls_cert": tls_dir.server_cert}, env={})
    with pytest.raises(InvalidConfigError, match="tls_client_ca .* needs tls_cert"):
        load_broker_config(None, overrides={"tls_client_ca": tls_dir.ca}, env={})
    with pytest.raises(InvalidConfigError, match="tls_key: .* is not a PEM file"):
        load_broker_config(None, overrides={"tls_cert": tls_dir.server_cert, "tls_key": __file__}, env={})
    config = load_broker_config(None, overrides={"host": "0.0.0.0"}, env={"LOGSTORE_ALLOW_PLAINTEXT": "true"})
    assert config.allow_plaintext is True


def test_a_certificate_no_rule_maps_is_refused_not_anonymous() -> None:
    from logstore.broker.security.tls import tls_principal_function
    from logstore.errors import SaslAuthenticationError

    class _Call:  # what grpc's ServicerContext.auth_context() gives a verified mTLS call
        def __init__(self, subject: bytes | None) -> None:
            self.auth = {"x509_subject": [subject], "x509_common_name": [b"bob"]} if subject else {}

        def auth_context(self) -> dict[str, list[bytes]]:
            return self.auth

    principal = tls_principal_function(PrincipalMapper("RULE:^CN=(.*?),O=acme$/$1/"))
    assert principal(_Call(b"CN=bob,O=acme")) == "User:bob"
    assert principal(_Call(None)) is None
    with pytest.raises(SaslAuthenticationError, match="matches no ssl_principal_mapping_rules"):
        principal(_Call(b"CN=bob,O=other"))


# ------------------------------------------------------------------------- SCRAM over TLS


def test_sasl_ssl_logs_in_over_tls_and_needs_the_tls_keys(
        tls_dir: Certificates, tmp_path: Any) -> None:  # noqa: F811
    from logstore.broker.security.credentials import FileCredentials
    from logstore.scram import make_credential

    with pytest.raises(InvalidConfigError, match="SASL_SSL needs tls_cert"):
        load_broker_config(None, overrides={"security_protocol": "SASL_SSL"}, env={})
    with pytest.raises(InvalidConfigError, match="use SASL_SSL"):
        load_broker_config(None, overrides={"security_protocol": "SASL_PLAINTEXT", "tls_cert": tls_dir.server_cert,
                                            "tls_key": tls_dir.server_key}, env={})
    data = tmp_path / "data"
    data.mkdir()
    FileCredentials(str(data)).alter("alice", [make_credential("SCRAM-SHA-512", "alice-pw")], [])
    overrides = {"security_protocol": "SASL_SSL", "tls_cert": tls_dir.server_cert, "tls_key": tls_dir.server_key}
    with EmbeddedBroker(str(data), overrides=overrides) as broker:
        login = {"security_protocol": "SASL_SSL", "ssl_cafile": tls_dir.ca, "sasl_mechanism": "SCRAM-SHA-512",
                 "sasl_plain_username": "alice", "sasl_plain_password": "alice-pw"}
        with Admin(broker.bootstrap, **login) as admin:
            admin.create_topic("scram-tls", num_partitions=1)
            assert "scram-tls" in admin.list_topics()
        # The CLI: Kafka tools' properties with Java's JAAS line, for `logstore users list`.
        from click.testing import CliRunner

        from logstore.cli import main

        props = tmp_path / "admin.properties"
        props.write_text(f"security.protocol=SASL_SSL\nssl.ca.location={tls_dir.ca}\nsasl.mechanism=SCRAM-SHA-512\n"
                         "sasl.jaas.config=org.apache.kafka.common.security.scram.ScramLoginModule required "
                         'username="alice" password="alice-pw";\n')
        listed = CliRunner().invoke(main, ["users", "list", "-b", broker.bootstrap, "--command-config", str(props)])
        assert listed.exit_code == 0 and "alice" in listed.output and "alice-pw" not in listed.output, listed.output
        no_tls = dict(login, security_protocol="SASL_PLAINTEXT")
        with BrokerClient(broker.bootstrap, request_timeout_ms=3000, security=ClientSecurity(**no_tls)) as client, \
                pytest.raises(BrokerUnavailableError, match="TLS"):
            client.metadata([])


def test_default_mapping_takes_the_most_specific_common_name() -> None:
    """Two CNs, or a CN inside a multi-valued RDN: DEFAULT takes the CN of the most specific RDN
    (the first of the RFC 2253 subject), whatever gRPC's ``x509_common_name`` says (for
    ``/O=x/CN=admin/CN=alice`` it says ``admin``, the least specific)."""
    mapper = PrincipalMapper("DEFAULT")
    assert mapper.principal("CN=alice,CN=admin,O=logstore", "admin") == "User:alice"
    assert mapper.principal("CN=admin,OU=x,CN=alice", "alice") == "User:admin"
    assert mapper.principal("UID=x+CN=admin,O=logstore", "admin") == "User:admin"
    assert mapper.principal("CN=ca\\,rol,O=a\\,b", "ca,rol") == "User:ca,rol"
    assert mapper.principal("CN=caf\\C3\\A9,O=a", "café") == "User:café"
    assert mapper.principal("CN=a+CN=b,O=c", "a") is None  # ambiguous: refused
    assert mapper.principal("O=nocn", None) == "User:O=nocn"


def test_a_key_that_is_not_the_certificates_says_so(tls_dir: Certificates, tmp_path: Any) -> None:  # noqa: F811
    """The broker used to fail with gRPC's "Failed to bind"; now it names the mismatch."""
    started = _start(tmp_path, "--tls-cert", tls_dir.server_cert, "--tls-key", tls_dir.client("alice")[1])
    assert isinstance(started, subprocess.CompletedProcess)
    assert started.returncode != 0
    assert "does not belong to the certificate" in started.stderr, started.stderr
    assert "Failed to bind" not in started.stderr and "Traceback" not in started.stderr
