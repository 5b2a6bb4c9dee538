"""TLS on the broker's listener: server credentials, mTLS principals, the plaintext rule.

* :func:`server_credentials` — ``tls_cert``/``tls_key`` (PEM) make the listener
  TLS; with ``tls_client_ca`` the broker *requires* a client certificate signed
  by that CA (mTLS) and refuses the handshake otherwise.
* :func:`tls_principal_function` — the call's verified client certificate, mapped by
  :class:`~logstore.broker.tls_rules.PrincipalMapper` (Kafka's
  ``ssl.principal.mapping.rules``) to ``User:<name>``; a certificate that no rule
  matches is refused (``SASL_AUTHENTICATION_FAILED``), never taken for an anonymous caller.
* :func:`bind_listener` — TLS or plaintext; the plaintext rule
  (:func:`~logstore.broker.tls_rules.check_listener`: a non-loopback address needs
  ``allow_plaintext``, and then logs a warning: anyone on the network could read and
  write every topic). The rules without gRPC live in :mod:`logstore.broker.tls_rules`.
* :func:`client_credentials` — what the broker itself uses when it calls a peer
  (replication links, inter-broker calls): the peer's CA, and the broker's own
  certificate as its client certificate.

Thread-safety: immutable values and pure functions.
"""

from __future__ import annotations

import errno
import logging
import socket
from collections.abc import Callable
from typing import Any

import grpc

from logstore.broker.tls_rules import (
    PrincipalMapper,
    check_key_pair,
    check_listener,
    is_loopback,
    read_pem,
)
from logstore.errors import SaslAuthenticationError

__all__ = ["PrincipalMapper", "check_listener", "client_credentials", "is_loopback", "read_pem",
           "server_credentials", "tls_principal_function"]

log = logging.getLogger("logstore.broker")

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


def server_credentials(cert: str, key: str, client_ca: str = "") -> grpc.ServerCredentials:
    """The listener's TLS credentials; with ``client_ca``, client certificates are required. A key
    that is not the certificate's is an ``INVALID_CONFIG`` saying so (:func:`check_key_pair`)."""
    pair = (read_pem(key, "tls_key"), read_pem(cert, "tls_cert"))
    check_key_pair(cert, key)
    if client_ca:
        return grpc.ssl_server_credentials([pair], root_certificates=read_pem(client_ca, "tls_client_ca"),
                                           require_client_auth=True)
    return grpc.ssl_server_credentials([pair])


def client_credentials(ca: str, cert: str = "", key: str = "") -> grpc.ChannelCredentials:
    """Credentials for calling a TLS peer: trust ``ca``; present ``cert``/``key`` when given."""
    root = read_pem(ca, "tls_ca") if ca else None
    if cert and key:
        check_key_pair(cert, key)
        return grpc.ssl_channel_credentials(root, read_pem(key, "tls_key"), read_pem(cert, "tls_cert"))
    return grpc.ssl_channel_credentials(root)


def check_address_free(host: str, port: int, *, what: str = "listen on", option: str = "") -> None:
    """Raise OSError when ``host:port`` is already in use, before the broker recovers its logs
    and before gRPC tries it (whose own failure is a raw C-core log line on stderr first).
    The message: ``cannot {what} host:port ({option}): the address is in use ...``.
    Port 0, and any other bind failure, are left to the listener."""
    if port == 0:
        return
    try:
        family, kind, proto, _, address = socket.getaddrinfo(host, port, type=socket.SOCK_STREAM,
                                                             flags=socket.AI_PASSIVE)[0]
    except OSError:
        return
    with socket.socket(family, kind, proto) as probe:
        probe.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)  # as gRPC binds
        try:
            probe.bind(address)
        except OSError as e:
            if e.errno == errno.EADDRINUSE:
                named = f" ({option})" if option else ""
                raise OSError(f"cannot {what} {host}:{port}{named}: the address is in use (another broker, "
                              "or another program, listens there)") from None


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
