"""TLS on the broker's listener: server credentials, mTLS principals, the plaintext rule.

* :func:`server_credentials` — ``tls_cert``/``tls_key`` (PEM) make the listener
  TLS; with ``tls_client_ca`` the broker *requires* a client certificate signed
  by that CA (mTLS) and refuses the handshake otherwise.
* :class:`PrincipalMapper` — Kafka's ``ssl.principal.mapping.rules`` applied
  to the client certificate's subject (RFC 2253 order, e.g.
  ``CN=alice,OU=eng,O=logstore``, as gRPC's auth context gives it). Rules are
  tried in order; the first whose pattern matches the whole subject gives the
  name: ``RULE:^CN=(.*?),OU=(.*?),.*$/$1@$2/L`` (``$n`` groups, optional ``L``
  lower-case or ``U`` upper-case). ``DEFAULT`` is the certificate's common name
  (the issue's ``User:<CN>``; Kafka's default would be the whole subject).
  The principal is ``User:<name>``; a certificate that no rule matches is refused
  (``SASL_AUTHENTICATION_FAILED``), never taken for an anonymous caller.
* :func:`check_listener` — a plaintext listener on a non-loopback address is
  refused (``INVALID_CONFIG``) unless ``allow_plaintext`` is set, which logs a
  warning instead: anyone on the network could then read and write every topic.
* :func:`client_credentials` — what the broker itself uses when it calls a peer
  (replication links, inter-broker calls): the peer's CA, and the broker's own
  certificate as its client certificate.

Thread-safety: immutable values and pure functions.
"""

from __future__ import annotations

import ipaddress
import logging
import re
import socket
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import grpc

from logstore.errors import InvalidConfigError, SaslAuthenticationError

__all__ = ["PrincipalMapper", "check_listener", "client_credentials", "is_loopback", "read_pem",
           "server_credentials", "tls_principal_function"]

log = logging.getLogger("logstore.broker")

# One rule of Kafka's syntax, then a comma or the end. Pattern and replacement may
# contain escaped slashes ("\/"); the pattern's own commas are fine (the rule ends at
# its third slash).
_RULE = re.compile(r"\s*(?:(DEFAULT)|RULE:((?:\\.|[^\\/])*)/((?:\\.|[^\\/])*)/([LU]?))\s*(?:,|$)")


@dataclass(frozen=True)
class _Rule:
    pattern: re.Pattern[str] | None  # None: DEFAULT
    replacement: str = ""
    case: str = ""


class PrincipalMapper:
    """Kafka's ``ssl.principal.mapping.rules`` (see the module docstring)."""

    def __init__(self, rules: str = "DEFAULT") -> None:
        self.rules_text = rules.strip() or "DEFAULT"
        self._rules: list[_Rule] = []
        pos = 0
        text = self.rules_text
        while pos < len(text):
            m = _RULE.match(text, pos)
            if m is None or m.end() == pos:
                raise InvalidConfigError(
                    f"ssl_principal_mapping_rules: cannot parse {text[pos:]!r} (expected DEFAULT or "
                    "RULE:pattern/replacement/[LU], comma-separated)")
            if m.group(1):
                self._rules.append(_Rule(None))
            else:
                try:
                    pattern = re.compile(m.group(2).replace("\\/", "/"))
                except re.error as e:
                    raise InvalidConfigError(f"ssl_principal_mapping_rules: bad pattern {m.group(2)!r}: {e}") from None
                replacement = re.sub(r"\$(\d+)", r"\\g<\1>", m.group(3).replace("\\/", "/"))
                self._rules.append(_Rule(pattern, replacement, m.group(4)))
            pos = m.end()

    def name_of(self, subject: str, common_name: str | None) -> str | None:
        """The principal's name (without ``User:``) for a certificate, or None when no rule matches."""
        for rule in self._rules:
            if rule.pattern is None:
                return common_name or subject or None
            m = rule.pattern.fullmatch(subject)
            if m is None:
                continue
            name = m.expand(rule.replacement)
            return name.lower() if rule.case == "L" else name.upper() if rule.case == "U" else name
        return None

    def principal(self, subject: str, common_name: str | None) -> str | None:
        name = self.name_of(subject, common_name)
        return None if not name else f"User:{name}"


def _first(auth: dict[str, list[bytes]], key: str) -> str | None:
    values = auth.get(key) or []
    return values[0].decode("utf-8", "replace") if values else None


def tls_principal_function(mapper: PrincipalMapper) -> Callable[[Any], str | None]:
    """``context -> "User:<name>"`` from the call's verified client certificate (None: the call
    has no certificate). A certificate whose subject no rule matches is refused with
    :class:`~logstore.errors.SaslAuthenticationError`, as Kafka refuses it (``NoMatchingRule``):
    it is never silently anonymous."""

    def tls_principal(context: Any) -> str | None:
        auth = context.auth_context() or {}
        subject = _first(auth, "x509_subject")
        if subject is None:
            return None
        principal = mapper.principal(subject, _first(auth, "x509_common_name"))
        if principal is None:
            raise SaslAuthenticationError(
                f"the client certificate's subject {subject!r} matches no ssl_principal_mapping_rules")
        return principal

    return tls_principal


def read_pem(path: str, what: str) -> bytes:
    """The bytes of a PEM file, or an :class:`InvalidConfigError` naming the config key."""
    try:
        with open(path, "rb") as f:
            data = f.read()
    except OSError as e:
        raise InvalidConfigError(f"{what}: cannot read {path}: {e.strerror}") from None
    if b"-----BEGIN" not in data:
        raise InvalidConfigError(f"{what}: {path} is not a PEM file")
    return data


def server_credentials(cert: str, key: str, client_ca: str = "") -> grpc.ServerCredentials:
    """The listener's TLS credentials; with ``client_ca``, client certificates are required."""
    pair = (read_pem(key, "tls_key"), read_pem(cert, "tls_cert"))
    if client_ca:
        return grpc.ssl_server_credentials([pair], root_certificates=read_pem(client_ca, "tls_client_ca"),
                                           require_client_auth=True)
    return grpc.ssl_server_credentials([pair])


def client_credentials(ca: str, cert: str = "", key: str = "") -> grpc.ChannelCredentials:
    """Credentials for calling a TLS peer: trust ``ca``; present ``cert``/``key`` when given."""
    root = read_pem(ca, "tls_ca") if ca else None
    if cert and key:
        return grpc.ssl_channel_credentials(root, read_pem(key, "tls_key"), read_pem(cert, "tls_cert"))
    return grpc.ssl_channel_credentials(root)


def is_loopback(host: str) -> bool:
    """Whether ``host`` (an address or a name) is reachable from this machine only."""
    name = host.strip("[]")
    if name in ("localhost", "ip6-localhost"):
        return True
    try:
        return ipaddress.ip_address(name).is_loopback
    except ValueError:
        pass
    try:
        infos = socket.getaddrinfo(name, None)
    except OSError:
        return False
    return bool(infos) and all(ipaddress.ip_address(str(i[4][0]).split("%")[0]).is_loopback for i in infos)


def check_listener(host: str, *, tls: bool, allow_plaintext: bool, warn: bool = True) -> None:
    """Refuse a plaintext listener on a non-loopback ``host`` unless ``allow_plaintext`` (then, with
    ``warn``, log a warning: the broker does when it binds)."""
    if tls or is_loopback(host):
        return
    if not allow_plaintext:
        raise InvalidConfigError(
            f"refusing to listen on {host} in plaintext: anyone on the network could read and write "
            "every topic; give --tls-cert/--tls-key, or --allow-plaintext to accept that")
    if warn:
        log.warning("listening on %s in PLAINTEXT (allow_plaintext): traffic is neither encrypted nor "
                    "authenticated by certificates", host)


def bind_listener(server: grpc.aio.Server, config: Any) -> tuple[int, Callable[[Any], str | None] | None]:
    """Bind ``config.host:config.port`` on ``server`` (TLS when ``config.tls``); return the bound port
    (0: the address is not available) and the listener's ``tls_principal`` function (None without
    mTLS). Logs the plaintext warning when ``allow_plaintext`` let a non-loopback address through."""
    address = f"{config.host}:{config.port}"
    if not config.tls:
        check_listener(config.host, tls=False, allow_plaintext=config.allow_plaintext)
        return server.add_insecure_port(address), None
    credentials = server_credentials(config.tls_cert, config.tls_key, config.tls_client_ca)
    port = server.add_secure_port(address, credentials)
    log.info("listener %s: TLS%s", address, " with client certificates required (mTLS)" if config.tls_client_ca else "")
    if not config.tls_client_ca:
        return port, None
    return port, tls_principal_function(PrincipalMapper(config.ssl_principal_mapping_rules))
