"""How a client proves who it is: :class:`ClientSecurity`, built from kafka-python's
option names (``security_protocol``, ``ssl_cafile``, ``ssl_certfile``,
``ssl_keyfile``, ``sasl_mechanism``, ``sasl_plain_username``,
``sasl_plain_password``) or their dotted librdkafka/Kafka spellings
(``security.protocol``, ``ssl.ca.location``, ...).

``security_protocol`` is Kafka's: ``PLAINTEXT`` (default), ``SSL`` (TLS,
with a client certificate when ``ssl_certfile``/``ssl_keyfile`` are given),
``SASL_PLAINTEXT`` or ``SASL_SSL`` (SCRAM over plaintext or TLS).

The password never appears in ``repr``/``str`` (it is shown as ``***``), so
logging a client or its options cannot leak it. Pickling keeps it: a Spark
task needs the credentials to connect.

Thread-safety: immutable values.
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

import grpc

from logstore.errors import InvalidConfigError

__all__ = ["PROTOCOLS", "ClientSecurity", "SECURITY_OPTION_NAMES", "channel_credentials", "security_from_options",
           "security_from_prefixed_options"]

PROTOCOLS = ("PLAINTEXT", "SSL", "SASL_PLAINTEXT", "SASL_SSL")
MECHANISMS = ("SCRAM-SHA-256", "SCRAM-SHA-512")

# kafka-python name -> its dotted (librdkafka / Kafka client) synonyms.
SECURITY_OPTION_NAMES: dict[str, tuple[str, ...]] = {
    "security_protocol": ("security.protocol",),
    "ssl_cafile": ("ssl.ca.location", "ssl.truststore.location", "ssl.cafile"),
    "ssl_certfile": ("ssl.certificate.location", "ssl.certfile"),
    "ssl_keyfile": ("ssl.key.location", "ssl.keyfile"),
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

    @property
    def tls(self) -> bool:
        return self.security_protocol in ("SSL", "SASL_SSL")

    @property
    def sasl(self) -> bool:
        return self.security_protocol in ("SASL_PLAINTEXT", "SASL_SSL")

    def __repr__(self) -> str:
        shown = {k: v for k, v in self.__dict__.items() if v is not None and k != "sasl_plain_password"}
        if self.sasl_plain_password is not None:
            shown["sasl_plain_password"] = "***"
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


def _read(path: str, option: str) -> bytes:
    try:
        with open(path, "rb") as f:
            return f.read()
    except OSError as e:
        raise InvalidConfigError(f"{option}: cannot read {path}: {e.strerror}") from None


def channel_credentials(security: ClientSecurity) -> grpc.ChannelCredentials:
    """gRPC TLS credentials for ``security``: trust ``ssl_cafile`` (the system's CAs when None),
    present ``ssl_certfile``/``ssl_keyfile`` as the client certificate when given (mTLS)."""
    root = _read(security.ssl_cafile, "ssl_cafile") if security.ssl_cafile else None
    if security.ssl_certfile and security.ssl_keyfile:
        return grpc.ssl_channel_credentials(root, _read(security.ssl_keyfile, "ssl_keyfile"),
                                            _read(security.ssl_certfile, "ssl_certfile"))
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
