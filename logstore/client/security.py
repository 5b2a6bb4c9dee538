"""How a client proves who it is: :class:`ClientSecurity`, built from kafka-python's
option names (``security_protocol``, ``ssl_cafile``, ``ssl_certfile``,
``ssl_keyfile``, ``sasl_mechanism``, ``sasl_plain_username``,
``sasl_plain_password``) or their dotted librdkafka/Kafka spellings
(``security.protocol``, ``ssl.ca.location``, ...).

``security_protocol`` is Kafka's: ``PLAINTEXT`` (default), ``SSL`` (TLS,
with a client certificate when ``ssl_certfile``/``ssl_keyfile`` are given),
``SASL_PLAINTEXT`` or ``SASL_SSL`` (SCRAM over plaintext or TLS).

A Java client's store keys are accepted too (:mod:`logstore.client.keystores`):
``ssl.truststore.location`` (the same option as ``ssl_cafile``) with
``ssl.truststore.type`` (``PKCS12`` or ``PEM``) and ``ssl.truststore.password``;
``ssl.keystore.location`` (instead of ``ssl_certfile`` + ``ssl_keyfile``) with
``ssl.keystore.type``, ``ssl.keystore.password`` and ``ssl.key.password``. ``JKS``
is refused (``UNSUPPORTED_KEYSTORE_TYPE``, naming the ``keytool`` command that converts it).

``ssl.endpoint.identification.algorithm`` is Kafka's: ``https`` (the default) checks
that the broker's certificate names the host the client connects to; empty skips
that check only. gRPC cannot skip it, so the client first reads the name the
broker's certificate holds (a TLS handshake that verifies the certificate against
the truststore) and gRPC then checks the certificate against that name
(:mod:`logstore.client.endpoint_names`). The certificate chain is verified either way.

Passwords never appear in ``repr``/``str`` (they are shown as ``***``), so
logging a client or its options cannot leak them. Pickling keeps them: a Spark
task needs the credentials to connect.

Thread-safety: immutable values.
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

import grpc

from logstore.client.keystores import (
    STORE_TYPES,
    certificates_from_pem,
    key_and_chain_from_pem,
    key_and_chain_pem,
    keytool_hint,
    read_option_file,
    trusted_certificates_pem,
)
from logstore.errors import InvalidConfigError, UnsupportedKeystoreTypeError

__all__ = ["PROTOCOLS", "ClientSecurity", "SECURITY_OPTION_NAMES", "channel_credentials", "security_from_options",
           "security_from_prefixed_options", "client_identity", "trusted_certificates"]

PROTOCOLS = ("PLAINTEXT", "SSL", "SASL_PLAINTEXT", "SASL_SSL")
ENDPOINT_IDENTIFICATION = ("https", "")
_SECRETS = ("sasl_plain_password", "ssl_truststore_password", "ssl_keystore_password", "ssl_key_password",
            "ssl_keystore_key")
MECHANISMS = ("SCRAM-SHA-256", "SCRAM-SHA-512")

# kafka-python name -> its dotted (librdkafka / Kafka client) synonyms.
SECURITY_OPTION_NAMES: dict[str, tuple[str, ...]] = {
    "security_protocol": ("security.protocol",),
    "ssl_cafile": ("ssl.ca.location", "ssl.truststore.location", "ssl.cafile"),
    "ssl_certfile": ("ssl.certificate.location", "ssl.certfile"),
    "ssl_keyfile": ("ssl.key.location", "ssl.keyfile"),
    "ssl_truststore_type": ("ssl.truststore.type",),
    "ssl_truststore_password": ("ssl.truststore.password",),
    "ssl_keystore_location": ("ssl.keystore.location",),
    "ssl_keystore_type": ("ssl.keystore.type",),
    "ssl_keystore_password": ("ssl.keystore.password",),
    "ssl_key_password": ("ssl.key.password",),
    "ssl_endpoint_identification_algorithm": ("ssl.endpoint.identification.algorithm",),
    "ssl_truststore_certificates": ("ssl.truststore.certificates",),
    "ssl_keystore_certificate_chain": ("ssl.keystore.certificate.chain",),
    "ssl_keystore_key": ("ssl.keystore.key",),
    "sasl_mechanism": ("sasl.mechanism", "sasl.mechanisms"),
    "sasl_plain_username": ("sasl.username",),
    "sasl_plain_password": ("sasl.password",),
}


@dataclass(frozen=True)
class ClientSecurity:
    """One client's transport security and credentials (see the module docstring)."""

    security_protocol: str = "PLAINTEXT"
    ssl_cafile: str | None = None
    ssl_certfile: str | None = None
    ssl_keyfile: str | None = None
    sasl_mechanism: str | None = None
    sasl_plain_username: str | None = None
    sasl_plain_password: str | None = field(default=None, repr=False)
    ssl_truststore_type: str | None = None
    ssl_truststore_password: str | None = field(default=None, repr=False)
    ssl_keystore_location: str | None = None
    ssl_keystore_type: str | None = None
    ssl_keystore_password: str | None = field(default=None, repr=False)
    ssl_key_password: str | None = field(default=None, repr=False)
    ssl_endpoint_identification_algorithm: str | None = None
    # PEM content instead of files (Kafka's KIP-651): see logstore.client.keystores.
    ssl_truststore_certificates: str | None = None
    ssl_keystore_certificate_chain: str | None = None
    ssl_keystore_key: str | None = field(default=None, repr=False)

    def __post_init__(self) -> None:
        if self.security_protocol not in PROTOCOLS:
            raise InvalidConfigError(
                f"security_protocol {self.security_protocol!r} is not one of {', '.join(PROTOCOLS)}")
        if self.sasl:
            if self.sasl_mechanism not in MECHANISMS:
                raise InvalidConfigError(
                    f"sasl_mechanism {self.sasl_mechanism!r} is not one of {', '.join(MECHANISMS)} "
                    f"(needed with security_protocol {self.security_protocol})")
            if not self.sasl_plain_username or self.sasl_plain_password is None:
                raise InvalidConfigError(
                    f"security_protocol {self.security_protocol} needs sasl_plain_username and sasl_plain_password")
        if (self.ssl_certfile is None) != (self.ssl_keyfile is None):
            raise InvalidConfigError("give ssl_certfile and ssl_keyfile together (a client certificate and its key)")
        if self.ssl_keystore_location is not None and self.ssl_certfile is not None:
            raise InvalidConfigError("give ssl.keystore.location or ssl_certfile and ssl_keyfile, not both")
        if (self.ssl_keystore_key is None) != (self.ssl_keystore_certificate_chain is None):
            raise InvalidConfigError("give ssl.keystore.key and ssl.keystore.certificate.chain together "
                                     "(a client certificate's key and its chain, as PEM)")
        if self.ssl_keystore_key is not None and (self.ssl_keystore_location or self.ssl_certfile):
            raise InvalidConfigError("give the client certificate once: ssl.keystore.key with "
                                     "ssl.keystore.certificate.chain, ssl.keystore.location, or ssl_certfile")
        if self.ssl_truststore_certificates is not None and self.ssl_cafile is not None:
            raise InvalidConfigError("give ssl.truststore.location or ssl.truststore.certificates, not both")
        for prefix, content, kind in (
                ("ssl.truststore", self.ssl_truststore_certificates, self.ssl_truststore_type),
                ("ssl.keystore", self.ssl_keystore_key, self.ssl_keystore_type)):
            if content is not None and kind is not None and kind.strip().upper() != "PEM":
                raise InvalidConfigError(f"{prefix}.type {kind} does not go with PEM content in {prefix} options")
        for prefix, kind, location in (("ssl.truststore", self.ssl_truststore_type, self.ssl_cafile),
                                       ("ssl.keystore", self.ssl_keystore_type, self.ssl_keystore_location)):
            if kind is not None and kind.strip().upper() not in STORE_TYPES:
                raise UnsupportedKeystoreTypeError(
                    f"{prefix}.type {kind} is not supported (PKCS12 or PEM): {keytool_hint(location)}")
        for needs, option, given in (
                ("ssl.keystore.location", "ssl.keystore.password", self.ssl_keystore_password),
                ("ssl.keystore.location", "ssl.key.password", self.ssl_key_password),
                ("ssl.keystore.location", "ssl.keystore.type", self.ssl_keystore_type),
                ("ssl.truststore.location", "ssl.truststore.password", self.ssl_truststore_password),
                ("ssl.truststore.location", "ssl.truststore.type", self.ssl_truststore_type)):
            location = ((self.ssl_keystore_location or self.ssl_keystore_key) if needs == "ssl.keystore.location"
                        else (self.ssl_cafile or self.ssl_truststore_certificates))
            if given is not None and location is None:
                raise InvalidConfigError(f"{option} is given without {needs}: give the store's location too")
        algorithm = self.ssl_endpoint_identification_algorithm
        if algorithm is not None and algorithm.strip().lower() not in ENDPOINT_IDENTIFICATION:
            raise InvalidConfigError(f"ssl.endpoint.identification.algorithm {algorithm!r} is not https or empty")

    @property
    def tls(self) -> bool:
        return self.security_protocol in ("SSL", "SASL_SSL")

    @property
    def sasl(self) -> bool:
        return self.security_protocol in ("SASL_PLAINTEXT", "SASL_SSL")

    @property
    def verify_host_name(self) -> bool:
        """Whether the broker's certificate must name the address connected to (Kafka's
        ``ssl.endpoint.identification.algorithm=https``, the default)."""
        algorithm = self.ssl_endpoint_identification_algorithm
        return algorithm is None or algorithm.strip().lower() == "https"

    def __repr__(self) -> str:
        shown: dict[str, Any] = {k: v for k, v in self.__dict__.items() if v is not None}
        for secret in _SECRETS:
            if secret in shown:
                shown[secret] = "***"
        return "ClientSecurity(" + ", ".join(f"{k}={v!r}" for k, v in shown.items()) + ")"

    __str__ = __repr__

    def prefixed_options(self, prefix: str = "logstore.") -> dict[str, str]:
        """These settings as Spark source/sink options (``logstore.security.protocol``, ...):
        what a job passes to the ``logstore`` source it starts (the inverse of
        :func:`security_from_prefixed_options`)."""
        return {f"{prefix}{SECURITY_OPTION_NAMES[name][0]}": str(value)
                for name, value in self.__dict__.items() if value is not None}


def security_from_options(options: Mapping[str, Any]) -> ClientSecurity | None:
    """The :class:`ClientSecurity` that ``options`` describe, or None when they name none.

    Keys may be kafka-python names or their dotted synonyms; giving both
    spellings of one option with different values is an
    :class:`~logstore.errors.InvalidConfigError`. Other keys are ignored.
    """
    values: dict[str, Any] = {}
    for name, synonyms in SECURITY_OPTION_NAMES.items():
        given = {key: options[key] for key in (name, *synonyms) if options.get(key) is not None}
        if len({str(v) for v in given.values()}) > 1:
            raise InvalidConfigError(f"{' and '.join(given)} disagree: give one of them")
        if given:
            values[name] = str(next(iter(given.values())))
    if not values:
        return None
    if "security_protocol" in values:
        values["security_protocol"] = values["security_protocol"].upper()
    if "sasl_mechanism" in values:
        values["sasl_mechanism"] = values["sasl_mechanism"].upper()
    return ClientSecurity(**values)


def trusted_certificates(security: ClientSecurity) -> bytes | None:
    """The CA certificates (PEM) ``security`` trusts: its ``ssl_cafile`` truststore, or None
    (the system's CAs)."""
    if security.ssl_truststore_certificates is not None:
        return certificates_from_pem(security.ssl_truststore_certificates)
    if not security.ssl_cafile:
        return None
    return trusted_certificates_pem(security.ssl_cafile, security.ssl_truststore_type,
                                    security.ssl_truststore_password)


def client_identity(security: ClientSecurity) -> tuple[bytes, bytes] | None:
    """(private key, certificate chain) as PEM that ``security`` presents (mTLS): its
    ``ssl_keystore_location`` store or ``ssl_keyfile``/``ssl_certfile``; None without either."""
    if security.ssl_keystore_key is not None and security.ssl_keystore_certificate_chain is not None:
        return key_and_chain_from_pem(security.ssl_keystore_key, security.ssl_keystore_certificate_chain,
                                      security.ssl_key_password)
    if security.ssl_keystore_location:
        return key_and_chain_pem(security.ssl_keystore_location, security.ssl_keystore_type,
                                 store_password=security.ssl_keystore_password, key_password=security.ssl_key_password)
    if security.ssl_certfile and security.ssl_keyfile:
        return (read_option_file(security.ssl_keyfile, "ssl_keyfile"),
                read_option_file(security.ssl_certfile, "ssl_certfile"))
    return None


def channel_credentials(security: ClientSecurity) -> grpc.ChannelCredentials:
    """gRPC TLS credentials for ``security``: trust ``ssl_cafile`` (the system's CAs when None),
    present :func:`client_identity` as the client certificate when there is one (mTLS)."""
    root = trusted_certificates(security)
    identity = client_identity(security)
    if identity is not None:
        return grpc.ssl_channel_credentials(root, *identity)
    return grpc.ssl_channel_credentials(root)


_PREFIXES = ("logstore.", "kafka.")
_JAAS_VALUE = re.compile(r'\b(username|password)\s*=\s*"((?:\\.|[^"\\])*)"')
_DOTTED = {syn for syns in SECURITY_OPTION_NAMES.values() for syn in syns} | {"sasl.jaas.config"}


def security_from_prefixed_options(options: Mapping[str, str]) -> tuple[ClientSecurity | None, set[str]]:
    """The security that Spark-style ``options`` (keys lower-cased) give, and the keys it used.

    ``logstore.security.protocol``, ``logstore.ssl.ca.location``, ``logstore.sasl.username``, ...
    (a dotted name of :data:`SECURITY_OPTION_NAMES` behind ``logstore.``) and the same behind
    ``kafka.`` (Spark's Kafka connector spelling; ``kafka.sasl.jaas.config`` with a SCRAM login
    module's ``username="..." password="..."`` too). Both spellings with different values is an
    :class:`~logstore.errors.InvalidConfigError`.
    """
    plain: dict[str, str] = {}
    used: set[str] = set()
    for key, value in options.items():
        prefix = next((p for p in _PREFIXES if key.startswith(p)), None)
        name = key[len(prefix):] if prefix else ""
        if name not in _DOTTED:
            continue
        used.add(key)
        if name == "sasl.jaas.config":
            for field_name, found in _JAAS_VALUE.findall(value):
                name_value = ("sasl.username" if field_name == "username" else "sasl.password", found)
                _merge(plain, *name_value, key)
            continue
        _merge(plain, name, value, key)
    return security_from_options(plain), used


def _merge(plain: dict[str, str], name: str, value: str, key: str) -> None:
    if name in plain and plain[name] != value:
        raise InvalidConfigError(f"options logstore.{name} and kafka.{name} disagree ({key}): give one of them")
    plain[name] = value
