"""Test certificates made with the ``openssl`` CLI: a CA, a server certificate and client ones.

:func:`make_certificates` writes, into one directory::

    ca.pem, ca.key                  the test CA (self-signed, 1 day)
    server.pem, server.key          CN=localhost, SAN DNS:localhost, IP:127.0.0.1 (brokers use it
                                    as their server certificate and as their client certificate
                                    on replication links)
    alice.pem, alice.key            CN=alice,OU=eng,O=logstore   (client)
    admin.pem, admin.key            CN=admin,O=logstore          (client)
    rogue-ca.pem, rogue.pem/.key    another CA and a client certificate it signed (must not verify)

:func:`make_java_stores` writes a Java client's stores of them with pyca ``cryptography``:
``truststore.p12`` (the CA), ``alice.p12`` (alice's key and chain) and ``alice-keystore.pem``
(her key, encrypted, and certificate in one PEM file), all with one password.

:class:`InProcessBroker` runs a real broker (authorizer on) in this process and records the
principal of every call: how mTLS tests see who a certificate made the caller.

The ``tls_dir`` fixture makes them once per test session (about a second: RSA
2048 keys). Other suites copy this pattern; it needs nothing but ``openssl``.
"""

from __future__ import annotations

import asyncio
import subprocess
import threading
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

from logstore.broker.config import load_broker_config
from logstore.broker.security.principal import Principal
from logstore.broker.service import Broker

__all__ = ["Certificates", "InProcessBroker", "make_certificates", "make_java_stores", "tls_dir"]


@dataclass(frozen=True)
class Certificates:
    """Paths (as strings) of the files :func:`make_certificates` wrote."""

    dir: Path

    def path(self, name: str) -> str:
        return str(self.dir / name)

    @property
    def ca(self) -> str:
        return self.path("ca.pem")

    @property
    def server_cert(self) -> str:
        return self.path("server.pem")

    @property
    def server_key(self) -> str:
        return self.path("server.key")

    def client(self, name: str) -> tuple[str, str]:
        """(certificate, key) of client ``name``: alice, admin or rogue."""
        return self.path(f"{name}.pem"), self.path(f"{name}.key")


def _openssl(*args: str, cwd: Path) -> None:
    subprocess.run(["openssl", *args], cwd=cwd, check=True, capture_output=True, timeout=60)


def _sign(cwd: Path, name: str, subject: str, ca: str, *, san: str | None = None) -> None:
    _openssl("req", "-newkey", "rsa:2048", "-nodes", "-keyout", f"{name}.key", "-out", f"{name}.csr",
             "-subj", subject, cwd=cwd)
    extra: list[str] = []
    if san is not None:
        (cwd / f"{name}.ext").write_text(f"subjectAltName={san}\n")
        extra = ["-extfile", f"{name}.ext"]
    _openssl("x509", "-req", "-in", f"{name}.csr", "-CA", f"{ca}.pem", "-CAkey", f"{ca}.key",
             "-CAcreateserial", "-days", "1", "-sha256", "-out", f"{name}.pem", *extra, cwd=cwd)


def make_certificates(directory: Path) -> Certificates:
    """Write the CA, server and client certificates listed in the module docstring."""
    directory.mkdir(parents=True, exist_ok=True)
    for ca, subject in (("ca", "/CN=logstore test CA"), ("rogue-ca", "/CN=rogue CA")):
        _openssl("req", "-x509", "-newkey", "rsa:2048", "-nodes", "-keyout", f"{ca}.key", "-out", f"{ca}.pem",
                 "-days", "1", "-subj", subject, cwd=directory)
    _sign(directory, "server", "/CN=localhost", "ca", san="DNS:localhost,IP:127.0.0.1")
    _sign(directory, "alice", "/O=logstore/OU=eng/CN=alice", "ca")
    _sign(directory, "admin", "/O=logstore/CN=admin", "ca")
    _sign(directory, "rogue", "/CN=alice", "rogue-ca")
    return Certificates(directory)


def make_java_stores(certs: Certificates, out: Path, password: str) -> Path:
    """Write ``out``/truststore.p12, alice.p12 and alice-keystore.pem (module docstring); return ``out``."""
    from cryptography import x509
    from cryptography.hazmat.primitives import serialization
    from cryptography.hazmat.primitives.serialization import pkcs12

    ca = x509.load_pem_x509_certificate(Path(certs.ca).read_bytes())
    cert_path, key_path = certs.client("alice")
    cert = x509.load_pem_x509_certificate(Path(cert_path).read_bytes())
    key = serialization.load_pem_private_key(Path(key_path).read_bytes(), None)
    encryption = serialization.BestAvailableEncryption(password.encode())
    out.mkdir(parents=True, exist_ok=True)
    (out / "truststore.p12").write_bytes(pkcs12.serialize_java_truststore(
        [pkcs12.PKCS12Certificate(ca, b"ca")], encryption))
    (out / "alice.p12").write_bytes(pkcs12.serialize_key_and_certificates(
        b"alice", key, cert, [ca], encryption))
    (out / "alice-keystore.pem").write_bytes(
        key.private_bytes(serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8, encryption)
        + Path(cert_path).read_bytes())
    return out


@pytest.fixture(scope="session")
def tls_dir(tmp_path_factory: pytest.TempPathFactory) -> Certificates:
    """The test certificates, made once per session."""
    return make_certificates(tmp_path_factory.mktemp("tls"))


class InProcessBroker:
    """A real broker on its own event loop thread, with the authorizer on (and every call
    allowed while no ACL exists), remembering the principal each call was authorized as."""

    def __init__(self, overrides: dict[str, Any]) -> None:
        self.config = load_broker_config(None, overrides={
            **overrides, "authorizer": True, "allow_everyone_if_no_acl_found": True}, env={})
        self.broker = Broker(self.config)
        self.principals: list[Principal] = []
        principal_of = self.broker.authorization.principal

        def recording(context: Any) -> Principal | None:
            principal = principal_of(context)
            if principal is not None:
                self.principals.append(principal)
            return principal
        self.broker.authorization.principal = recording  # type: ignore[method-assign]
        self.loop = asyncio.new_event_loop()
        threading.Thread(target=self.loop.run_forever, daemon=True).start()
        port = asyncio.run_coroutine_threadsafe(self.broker.start(), self.loop).result(60)
        self.bootstrap = f"127.0.0.1:{port}"

    def stop(self) -> None:
        asyncio.run_coroutine_threadsafe(self.broker.stop(grace_s=0), self.loop).result(60)
        self.loop.call_soon_threadsafe(self.loop.stop)
