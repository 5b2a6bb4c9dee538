"""The Kafka listener's security protocol: TLS, client certificates and SASL, from the broker's config.

The Kafka listener speaks the broker's ``security_protocol`` with the broker's TLS material,
as the gRPC listener does (one broker, one way in, whichever protocol a client speaks):

=================  ==========================  ===============================================
security_protocol  Kafka listener              principal of a connection
=================  ==========================  ===============================================
PLAINTEXT          plaintext                   ``User:ANONYMOUS``
SSL                TLS (``tls_cert``,          its client certificate's, mapped by
(``tls_cert`` set) ``tls_key``); with           ``ssl_principal_mapping_rules`` (mTLS), else
                   ``tls_client_ca`` a client  ``User:ANONYMOUS``
                   certificate is required
SASL_PLAINTEXT     plaintext, SCRAM login      ``User:<name>`` of its login (:mod:`.sasl`)
SASL_SSL           TLS, SCRAM login (with      ``User:<name>`` of its login
                   ``tls_client_ca`` a client
                   certificate is required
                   too)
=================  ==========================  ===============================================

A Kafka client sets the same ``security.protocol`` (and ``sasl.mechanism``,
``sasl.username``/``sasl.password``, ``ssl.ca.location`` or its Java stores). The plaintext
rule is the gRPC listener's: a plaintext Kafka listener on a non-loopback address needs
``allow_plaintext``, and then logs a warning when it binds
(:func:`~logstore.broker.tls_rules.check_listener`). TLS is 1.2 or later. A client certificate
whose subject no mapping rule matches closes its connection at once (Kafka refuses it too;
never an anonymous caller). The subject is written as gRPC writes it
(:func:`~logstore.broker.tls_rules.rfc2253_subject`), so a certificate is the same principal
on both listeners.

Thread-safety: immutable after construction.
"""

from __future__ import annotations

import ssl
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from logstore.broker.kafka.sasl import SaslSettings
from logstore.broker.security.principal import ANONYMOUS
from logstore.broker.tls_rules import (
    PrincipalMapper,
    check_key_pair,
    check_listener,
    rfc2253_subject,
)
from logstore.errors import SaslAuthenticationError

if TYPE_CHECKING:
    from logstore.broker.config import BrokerConfig
    from logstore.broker.security.scram_exchange import ScramExchanges

__all__ = ["ListenerSecurity", "server_ssl_context"]


def server_ssl_context(cert: str, key: str, client_ca: str = "") -> ssl.SSLContext:
    """A TLS server context of ``cert``/``key`` (PEM; TLS 1.2+); with ``client_ca`` a client
    certificate signed by it is required. A key that is not the certificate's is an
    ``INVALID_CONFIG`` saying so."""
    check_key_pair(cert, key)
    context = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
    context.minimum_version = ssl.TLSVersion.TLSv1_2
    context.load_cert_chain(cert, key)
    if client_ca:
        context.verify_mode = ssl.CERT_REQUIRED
        context.load_verify_locations(cafile=client_ca)
    return context


@dataclass(frozen=True)
class ListenerSecurity:
    """How the Kafka listener authenticates its connections (see the module docstring):
    ``ssl_context`` (None: plaintext), ``mapper`` (None: client certificates name nobody),
    ``sasl`` (None: no SASL login)."""

    protocol: str = "PLAINTEXT"
    ssl_context: ssl.SSLContext | None = None
    mapper: PrincipalMapper | None = None
    sasl: SaslSettings | None = None
    allow_plaintext: bool = False

    @classmethod
    def of(cls, config: BrokerConfig, exchanges: ScramExchanges) -> ListenerSecurity:
        """The listener security of the broker's ``config``; ``exchanges`` its SCRAM server."""
        tls = config.tls
        return cls(
            protocol=("SASL_SSL" if tls else "SASL_PLAINTEXT") if config.sasl else ("SSL" if tls else "PLAINTEXT"),
            ssl_context=server_ssl_context(config.tls_cert, config.tls_key, config.tls_client_ca) if tls else None,
            # SASL_SSL with client certificates required: the login names the principal, not the certificate.
            mapper=(PrincipalMapper(config.ssl_principal_mapping_rules)
                    if config.tls_client_ca and not config.sasl else None),
            sasl=(SaslSettings(exchanges, config.sasl_mechanisms, config.sasl_session_lifetime_ms)
                  if config.sasl else None),
            allow_plaintext=config.allow_plaintext)

    def describe(self) -> str:
        """The protocol for the start-up log line, e.g. ``SSL, client certificates required``."""
        required = self.ssl_context is not None and self.ssl_context.verify_mode == ssl.CERT_REQUIRED
        return self.protocol + (", client certificates required" if required else "")

    def check_bind(self, host: str) -> None:
        """The plaintext rule for binding ``host`` (logs the warning when ``allow_plaintext`` lets it)."""
        check_listener(host, tls=self.ssl_context is not None, allow_plaintext=self.allow_plaintext)

    def connection_principal(self, peercert: Any) -> str:
        """A new connection's principal before any SASL login: its client certificate's
        (``peercert``: :meth:`ssl.SSLSocket.getpeercert`, None without one) under mTLS, else
        ``User:ANONYMOUS``. Raises :class:`~logstore.errors.SaslAuthenticationError` for a
        certificate no mapping rule matches."""
        if self.mapper is None or not peercert:
            return ANONYMOUS
        subject = rfc2253_subject(peercert.get("subject", ()))
        common_names = [v for rdn in peercert.get("subject", ()) for k, v in rdn if k == "commonName"]
        principal = self.mapper.principal(subject, common_names[-1] if common_names else None)
        if principal is None:
            raise SaslAuthenticationError(
                f"the client certificate's subject {subject!r} matches no ssl_principal_mapping_rules")
        return principal
