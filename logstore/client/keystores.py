"""Kafka's key and trust stores read for gRPC, which takes PEM bytes only.

A Java client's ``client.properties`` names its certificates as stores:

* **truststore** (``ssl.truststore.location``, ``.type``, ``.password``): the CA
  certificates that sign the brokers' certificates. ``ssl.truststore.location`` is
  kafka-python's ``ssl_cafile`` (a PEM file is a PEM truststore).
* **keystore** (``ssl.keystore.location``, ``.type``, ``.password``, and
  ``ssl.key.password`` for the private key): the client's own certificate chain
  and key, presented for mTLS. An alternative to ``ssl_certfile`` + ``ssl_keyfile``.

Types, as Kafka spells them (case-insensitive):

* ``PKCS12``: read with pyca ``cryptography``. A PKCS12 file has one password (as
  ``keytool`` writes it): ``ssl.keystore.password``, else ``ssl.key.password``.
* ``PEM``: certificates (and, in a keystore, one private key, encrypted with
  ``ssl.key.password`` or not) as PEM blocks in one file.
* not given: ``PEM`` when the file is PEM text, else ``PKCS12`` (Kafka's default is
  ``JKS``, which the client cannot read: a JKS file is recognised by its magic number).
* PEM *content* instead of a file (Kafka's KIP-651, what Spark's Kafka connector users
  give as ``kafka.ssl.truststore.certificates``): ``ssl.truststore.certificates`` (the CA
  certificates), ``ssl.keystore.certificate.chain`` and ``ssl.keystore.key`` (the key,
  encrypted with ``ssl.key.password`` or not), so an executor needs no file of its own
  (:func:`certificates_from_pem`, :func:`key_and_chain_from_pem`);
* ``JKS`` or any other: :class:`~logstore.errors.UnsupportedKeystoreTypeError`
  (``UNSUPPORTED_KEYSTORE_TYPE``) naming the ``keytool -importkeystore`` command that
  converts the store to PKCS12.

A wrong or missing password is an :class:`~logstore.errors.InvalidConfigError` naming
the option and the file, never the password.

Thread-safety: pure functions (they read the files they are given).
"""

from __future__ import annotations

from pathlib import PurePath
from typing import Any

from cryptography import x509
from cryptography.hazmat.primitives import serialization
from cryptography.hazmat.primitives.serialization import pkcs12

from logstore.errors import InvalidConfigError, UnsupportedKeystoreTypeError

__all__ = ["STORE_TYPES", "certificates_from_pem", "key_and_chain_from_pem", "key_and_chain_pem", "keytool_hint",
           "read_option_file", "trusted_certificates_pem"]

STORE_TYPES = ("PKCS12", "PEM")
_JKS_MAGIC = b"\xfe\xed\xfe\xed"  # Java's JKS (and JCEKS is 0xCECECECE)
_JCEKS_MAGIC = b"\xce\xce\xce\xce"


def read_option_file(path: str, option: str) -> bytes:
    """The bytes of the file ``option`` names; one INVALID_CONFIG line naming both if unreadable."""
    try:
        with open(path, "rb") as f:
            return f.read()
    except OSError as e:
        raise InvalidConfigError(f"{option}: cannot read {path}: {e.strerror}") from None


def keytool_hint(path: str | None) -> str:
    """The command that converts the Java store at ``path`` to PKCS12."""
    source = path or "STORE.jks"
    name = PurePath(source)
    target = str(name.with_suffix(".p12") if name.suffix != ".p12" else name.with_name(f"{name.stem}-pkcs12.p12"))
    return (f"convert it with keytool -importkeystore -srckeystore {source} -destkeystore {target} "
            "-deststoretype PKCS12")


def _store_type(data: bytes, given: str | None, path: str, prefix: str) -> str:
    """The store's type: ``given`` (checked) or the one its bytes show."""
    kind = (given or "").strip().upper()
    if kind not in ("", *STORE_TYPES):
        raise UnsupportedKeystoreTypeError(
            f"{prefix}.type {given} is not supported (PKCS12 or PEM): {keytool_hint(path)}")
    if data[:4] in (_JKS_MAGIC, _JCEKS_MAGIC):
        java = "JKS" if data[:4] == _JKS_MAGIC else "JCEKS"
        raise UnsupportedKeystoreTypeError(
            f"{prefix}.location {path} is a Java {java} store, not {kind or 'PKCS12 or PEM'}: {keytool_hint(path)}")
    if not kind:
        kind = "PEM" if b"-----BEGIN " in data[:4096] else "PKCS12"
    return kind


def _pem(certificates: list[x509.Certificate]) -> bytes:
    return b"".join(c.public_bytes(serialization.Encoding.PEM) for c in certificates)


def _load_pkcs12(data: bytes, password: str | None, path: str, option: str) -> pkcs12.PKCS12KeyAndCertificates:
    try:
        return pkcs12.load_pkcs12(data, password.encode() if password is not None else None)
    except ValueError:
        raise InvalidConfigError(
            f"{option} does not open {path}: the password is wrong or missing, or the file is not "
            "a PKCS12 store") from None


def trusted_certificates_pem(path: str, store_type: str | None = None, password: str | None = None) -> bytes:
    """The CA certificates of the truststore at ``path``, as PEM (gRPC's root certificates)."""
    data = read_option_file(path, "ssl.truststore.location")
    kind = _store_type(data, store_type, path, "ssl.truststore")
    if kind == "PKCS12":
        store = _load_pkcs12(data, password, path, "ssl.truststore.password")
        certificates = [c.certificate for c in ([store.cert] if store.cert else []) + list(store.additional_certs)]
    else:
        try:
            certificates = x509.load_pem_x509_certificates(data)
        except ValueError:
            certificates = []
    if not certificates:
        raise InvalidConfigError(f"ssl.truststore.location {path} ({kind}) holds no certificate")
    return _pem(certificates)


def key_and_chain_pem(path: str, store_type: str | None = None, *, store_password: str | None = None,
                      key_password: str | None = None) -> tuple[bytes, bytes]:
    """(private key, certificate chain) of the keystore at ``path``, as PEM (the key unencrypted,
    PKCS8), what gRPC presents as the client certificate."""
    data = read_option_file(path, "ssl.keystore.location")
    kind = _store_type(data, store_type, path, "ssl.keystore")
    if kind == "PKCS12":
        option = "ssl.keystore.password" if store_password is not None else "ssl.key.password"
        store = _load_pkcs12(data, store_password if store_password is not None else key_password, path, option)
        key = store.key
        chain = [c.certificate for c in ([store.cert] if store.cert else []) + list(store.additional_certs)]
    else:
        key = _pem_key(data, key_password, f"ssl.keystore.location {path}")
        chain = _pem_certificates(data)
    if key is None or not chain:
        raise InvalidConfigError(f"ssl.keystore.location {path} ({kind}) needs a private key and its certificate")
    return _unencrypted(key), _pem(chain)


def certificates_from_pem(text: str, option: str = "ssl.truststore.certificates") -> bytes:
    """The certificates of PEM ``text`` (an option's value, not a file), checked, as PEM."""
    certificates = _pem_certificates(text.encode())
    if not certificates:
        raise InvalidConfigError(f"{option} holds no PEM certificate (-----BEGIN CERTIFICATE----- ...)")
    return _pem(certificates)


def key_and_chain_from_pem(key_text: str, chain_text: str, key_password: str | None = None) -> tuple[bytes, bytes]:
    """(private key, certificate chain) given as PEM content (``ssl.keystore.key`` and
    ``ssl.keystore.certificate.chain``), as :func:`key_and_chain_pem` returns them."""
    key = _pem_key(key_text.encode(), key_password, "ssl.keystore.key")
    if key is None:
        raise InvalidConfigError("ssl.keystore.key holds no PEM private key")
    return _unencrypted(key), certificates_from_pem(chain_text, "ssl.keystore.certificate.chain")


def _pem_key(data: bytes, key_password: str | None, where: str) -> Any:
    try:
        return serialization.load_pem_private_key(data, key_password.encode() if key_password else None)
    except TypeError:  # encrypted, and no password given
        raise InvalidConfigError(f"{where}: its private key is encrypted; give ssl.key.password") from None
    except ValueError:
        raise InvalidConfigError(f"{where}: ssl.key.password does not decrypt its private key "
                                 "(or it holds none)") from None


def _pem_certificates(data: bytes) -> list[x509.Certificate]:
    try:
        return x509.load_pem_x509_certificates(data)
    except ValueError:
        return []


def _unencrypted(key: Any) -> bytes:
    return key.private_bytes(serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8,
                             serialization.NoEncryption())
