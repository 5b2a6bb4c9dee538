"""Java ``client.properties`` stores in the clients (issue 27, logstore.client.keystores).

* a PKCS12 truststore and keystore, made here with ``cryptography`` from the session's test
  certificates, connect a client to an mTLS broker, which sees the keystore's certificate
  as the caller (``User:alice``); the same through the CLI's ``--command-config`` and a
  Spark source's ``kafka.ssl.*`` options;
* a PEM keystore (certificate chain and encrypted key in one file) works as well;
* ``JKS`` (by type, or a real ``keytool`` JKS file given as PKCS12) is refused with one
  ``UNSUPPORTED_KEYSTORE_TYPE`` line naming ``keytool -importkeystore``; a wrong
  password is one ``INVALID_CONFIG`` line naming the option and never the password;
* ``ssl.endpoint.identification.algorithm``: with ``https`` a broker whose certificate
  names another host is refused; empty accepts it, and still refuses a certificate no
  trusted CA signed.
"""

from __future__ import annotations

import shutil
import subprocess
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from cryptography import x509
from cryptography.hazmat.primitives import serialization
from security_helpers import (  # noqa: F401 - tls_dir: the session fixture
    Certificates,
    InProcessBroker,
    make_java_stores,
    tls_dir,
)

from logstore.client.rpc import BrokerClient
from logstore.client.security import ClientSecurity, security_from_prefixed_options
from logstore.errors import BrokerUnavailableError, InvalidConfigError, UnsupportedKeystoreTypeError

pytestmark = pytest.mark.timeout(120)

STORE_PASSWORD = "store-secret"


def _certificate(path: str) -> x509.Certificate:
    return x509.load_pem_x509_certificate(Path(path).read_bytes())


def _key(path: str) -> Any:
    return serialization.load_pem_private_key(Path(path).read_bytes(), None)


@pytest.fixture(scope="module")
def stores(tls_dir: Certificates, tmp_path_factory: pytest.TempPathFactory) -> Path:  # noqa: F811
    return make_java_stores(tls_dir, tmp_path_factory.mktemp("stores"), STORE_PASSWORD)


@pytest.fixture(scope="module")
def mtls_broker(tls_dir: Certificates, tmp_path_factory: pytest.TempPathFactory) -> Iterator[InProcessBroker]:  # noqa: F811
    broker = InProcessBroker({
        "data_dir": str(tmp_path_factory.mktemp("mtls-keystores")), "port": 0,
        "tls_cert": tls_dir.server_cert, "tls_key": tls_dir.server_key, "tls_client_ca": tls_dir.ca})
    yield broker
    broker.stop()


def _java_properties(stores: Path, keystore: str = "alice.p12", keystore_type: str = "PKCS12") -> dict[str, str]:
    return {
        "security.protocol": "SSL",
        "ssl.truststore.location": str(stores / "truststore.p12"), "ssl.truststore.type": "PKCS12",
        "ssl.truststore.password": STORE_PASSWORD,
        "ssl.keystore.location": str(stores / keystore), "ssl.keystore.type": keystore_type,
        "ssl.keystore.password": STORE_PASSWORD, "ssl.key.password": STORE_PASSWORD,
        "ssl.endpoint.identification.algorithm": "https",
    }


def _security(properties: dict[str, str]) -> ClientSecurity:
    security, _ = security_from_prefixed_options({f"kafka.{k}": v for k, v in properties.items()})
    assert security is not None
    return security


@pytest.mark.parametrize("keystore, keystore_type, algorithm", [
    ("alice.p12", "PKCS12", "https"), ("alice-keystore.pem", "PEM", "https"), ("alice.p12", "PKCS12", "")])
def test_java_stores_connect_and_the_keystore_certificate_is_the_principal(
        mtls_broker: InProcessBroker, stores: Path, keystore: str, keystore_type: str, algorithm: str) -> None:
    mtls_broker.principals.clear()
    security = _security({**_java_properties(stores, keystore, keystore_type),
                          "ssl.endpoint.identification.algorithm": algorithm})
    with BrokerClient(mtls_broker.bootstrap, request_timeout_ms=10_000, security=security) as client:
        client.metadata([])
    assert [p.name for p in mtls_broker.principals] == ["User:alice"]
    assert STORE_PASSWORD not in repr(security)


def test_the_cli_reads_a_java_client_properties_file(
        mtls_broker: InProcessBroker, stores: Path, tmp_path: Path) -> None:
    from click.testing import CliRunner

    from logstore.cli import main

    props = tmp_path / "client.properties"
    props.write_text("".join(f"{k}={v}\n" for k, v in _java_properties(stores).items()))
    result = CliRunner().invoke(main, ["topics", "list", "--bootstrap-server", mtls_broker.bootstrap,
                                       "--command-config", str(props)])
    assert result.exit_code == 0, result.output


def test_spark_source_and_sink_options_take_the_java_store_keys(stores: Path) -> None:
    from spark_sink.options import parse_sink_options
    from spark_source.options import parse_source_options

    kafka = {f"kafka.{k}": v for k, v in _java_properties(stores).items()}
    source = parse_source_options({"logstore.bootstrap.servers": "127.0.0.1:1", "subscribe": "t", **kafka},
                                  streaming=True)
    sink = parse_sink_options({"logstore.bootstrap.servers": "127.0.0.1:1", "topic": "t", "sinkId": "s", **kafka},
                              streaming=True)
    for security in (source.security, sink.security):
        assert security is not None
        assert security.ssl_keystore_location == str(stores / "alice.p12")
        assert security.ssl_truststore_type == "PKCS12" and security.ssl_keystore_password == STORE_PASSWORD


def test_jks_is_refused_with_one_line_naming_keytool(stores: Path, tmp_path: Path) -> None:
    properties = _java_properties(stores)
    with pytest.raises(UnsupportedKeystoreTypeError) as by_type:
        _security({**properties, "ssl.truststore.type": "JKS"})
    if shutil.which("keytool") is None:
        pytest.skip("keytool (a JDK) is needed to make a JKS file")
    jks = tmp_path / "alice.jks"
    subprocess.run(["keytool", "-importkeystore", "-noprompt", "-srckeystore", str(stores / "alice.p12"),
                    "-srcstoretype", "PKCS12", "-srcstorepass", STORE_PASSWORD, "-destkeystore", str(jks),
                    "-deststoretype", "JKS", "-deststorepass", STORE_PASSWORD],
                   check=True, capture_output=True, timeout=60)
    security = _security({**properties, "ssl.keystore.location": str(jks)})  # says PKCS12, is JKS
    with BrokerClient("127.0.0.1:1", security=security) as client, \
            pytest.raises(UnsupportedKeystoreTypeError) as by_content:
        client.metadata([])
    for info in (by_type, by_content):
        message = str(info.value)
        assert info.value.code == "UNSUPPORTED_KEYSTORE_TYPE" and "\n" not in message
        assert "keytool -importkeystore" in message and "-deststoretype PKCS12" in message
        assert STORE_PASSWORD not in message
    assert f"{jks} is a Java JKS store, not PKCS12" in str(by_content.value)
    assert f"-srckeystore {jks} -destkeystore {tmp_path / 'alice.p12'}" in str(by_content.value)
    assert f"-srckeystore {stores / 'truststore.p12'}" in str(by_type.value)


@pytest.mark.parametrize("option", ["ssl.keystore.password", "ssl.truststore.password"])
def test_a_wrong_store_password_is_one_invalid_config_line(
        mtls_broker: InProcessBroker, stores: Path, option: str) -> None:
    security = _security({**_java_properties(stores), option: "not-the-password"})
    with BrokerClient(mtls_broker.bootstrap, security=security) as client, \
            pytest.raises(InvalidConfigError) as info:
        client.metadata([])
    message = str(info.value)
    assert info.value.code == "INVALID_CONFIG" and "\n" not in message
    assert option in message and "wrong" in message and "not-the-password" not in message


def test_endpoint_identification_https_checks_the_host_and_empty_only_skips_that(
        tls_dir: Certificates, tmp_path: Path) -> None:  # noqa: F811
    other_name = _server_certificate_for(tls_dir, "broker.other.test", tmp_path)
    broker = InProcessBroker({"data_dir": str(tmp_path / "data"), "port": 0, "tls_cert": other_name,
                              "tls_key": tls_dir.server_key})
    try:
        https = ClientSecurity("SSL", ssl_cafile=tls_dir.ca)
        with BrokerClient(broker.bootstrap, request_timeout_ms=3000, security=https) as client, \
                pytest.raises(BrokerUnavailableError):
            client.metadata([])
        empty = ClientSecurity("SSL", ssl_cafile=tls_dir.ca, ssl_endpoint_identification_algorithm="")
        with BrokerClient(broker.bootstrap, request_timeout_ms=10_000, security=empty) as client:
            client.metadata([])
        untrusted = ClientSecurity("SSL", ssl_cafile=tls_dir.path("rogue-ca.pem"),
                                   ssl_endpoint_identification_algorithm="")
        with pytest.raises(BrokerUnavailableError, match="CERTIFICATE_VERIFY_FAILED"), \
                BrokerClient(broker.bootstrap, request_timeout_ms=3000, security=untrusted) as client:
            client.metadata([])
    finally:
        broker.stop()
    with pytest.raises(InvalidConfigError, match="not https or empty"):
        ClientSecurity("SSL", ssl_endpoint_identification_algorithm="http")


def _server_certificate_for(tls_dir: Certificates, name: str, out: Path) -> str:  # noqa: F811
    """The server's key certified by the test CA for ``name`` only (not localhost, not 127.0.0.1)."""
    import datetime

    from cryptography.hazmat.primitives import hashes
    from cryptography.x509.oid import NameOID

    ca_key = _key(tls_dir.path("ca.key"))
    now = datetime.datetime.now(datetime.timezone.utc)
    cert = (x509.CertificateBuilder()
            .subject_name(x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, name)]))
            .issuer_name(_certificate(tls_dir.ca).subject)
            .public_key(_key(tls_dir.server_key).public_key())
            .serial_number(x509.random_serial_number())
            .not_valid_before(now - datetime.timedelta(minutes=5))
            .not_valid_after(now + datetime.timedelta(days=1))
            .add_extension(x509.SubjectAlternativeName([x509.DNSName(name)]), critical=False)
            .sign(ca_key, hashes.SHA256()))
    path = out / f"{name}.pem"
    path.write_bytes(cert.public_bytes(serialization.Encoding.PEM))
    return str(path)


@pytest.mark.parametrize("algorithm", ["https", ""])
def test_pem_content_options_need_no_file_on_the_executor(
        mtls_broker: InProcessBroker, tls_dir: Certificates, algorithm: str) -> None:  # noqa: F811
    """Kafka's KIP-651 keys, as Spark's Kafka connector users give them
    (``kafka.ssl.truststore.certificates``): the certificates and key travel in the options, so
    an executor connects without the files the driver read them from."""
    cert, key = tls_dir.client("alice")
    pem = {"security.protocol": "SSL", "ssl.truststore.type": "PEM", "ssl.keystore.type": "PEM",
           "ssl.truststore.certificates": Path(tls_dir.ca).read_text(),
           "ssl.keystore.certificate.chain": Path(cert).read_text(), "ssl.keystore.key": Path(key).read_text(),
           "ssl.endpoint.identification.algorithm": algorithm}
    security = _security(pem)
    assert security.ssl_cafile is None and security.ssl_keystore_location is None
    mtls_broker.principals.clear()
    with BrokerClient(mtls_broker.bootstrap, request_timeout_ms=10_000, security=security) as client:
        client.metadata([])
    assert [p.name for p in mtls_broker.principals] == ["User:alice"]
    assert "PRIVATE KEY" not in repr(security)
    handed_on, _ = security_from_prefixed_options(security.prefixed_options("kafka."))   # a job hands them on
    assert handed_on == security


def test_pem_content_options_are_checked(tls_dir: Certificates) -> None:  # noqa: F811
    ca = Path(tls_dir.ca).read_text()
    cert, key = tls_dir.client("alice")
    for given, message in (
            ({"ssl.truststore.certificates": ca, "ssl.truststore.location": tls_dir.ca}, "not both"),
            ({"ssl.keystore.key": Path(key).read_text()}, "together"),
            ({"ssl.keystore.key": Path(key).read_text(), "ssl.keystore.certificate.chain": Path(cert).read_text(),
              "ssl.keystore.location": "x.p12"}, "once"),
            ({"ssl.truststore.certificates": ca, "ssl.truststore.type": "PKCS12"}, "PEM content")):
        with pytest.raises(InvalidConfigError, match=message):
            _security({"security.protocol": "SSL", **given})
    bad = _security({"security.protocol": "SSL", "ssl.truststore.certificates": "not a certificate"})
    with pytest.raises(InvalidConfigError, match="no PEM certificate"), \
            BrokerClient("127.0.0.1:1", request_timeout_ms=1_000, security=bad) as client:
        client.metadata([])
