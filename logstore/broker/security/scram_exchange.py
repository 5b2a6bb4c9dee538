"""The broker's side of a SCRAM login (RFC 5802), whatever front end carries its messages.

:class:`ScramExchanges` is the one SCRAM server of a broker: gRPC's ``SaslAuthenticate``
(:mod:`.scram_service`) and the Kafka listener's SaslHandshake/SaslAuthenticate
(:mod:`logstore.broker.kafka.sasl`) both call it, so the two share the same credentials,
the same pending exchanges and the same failed-login counts (a guesser gains nothing by
alternating listeners). A login is two steps:

1. :meth:`ScramExchanges.first`: mechanism + client-first-message → server-first-message
   and a random ``exchange_id`` (an exchange lives ``EXCHANGE_TTL_S``; at most
   ``EXCHANGES_PER_CONNECTION`` per connection, ``EXCHANGES_PER_HOST`` per address and
   ``MAX_EXCHANGES`` in all are pending, and a new one replaces the flooder's oldest rather
   than being refused: :class:`~.login_limits.PendingExchanges`);
2. :meth:`ScramExchanges.final`: ``exchange_id`` + client-final-message →
   server-final-message and the principal ``User:<name>`` (:class:`ScramLogin`).

What an attacker learns: nothing about which part was wrong. An unknown user gets a
server-first-message like a real user's (a salt derived from a per-broker secret and
the name, so asking twice gives the same salt; ``scram_iterations`` iterations); a
wrong password and an unknown user both fail step 2 after the same fixed pause
(``sasl_failure_delay_ms``) with the same SASL_AUTHENTICATION_FAILED message
(:data:`FAILED_MESSAGE`), and count alike against the user name and the address: after a
few failures their attempts are spaced by a delay that doubles
(:class:`~.login_limits.FailedLogins`). Failures are logged once per interval with counts
per address, never the user name (people type passwords into user-name fields).

Thread-safety: event loop only (the exchanges and the failure counts are not locked).
"""

from __future__ import annotations

import asyncio
import base64
import hashlib
import hmac
import secrets
from collections.abc import Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING, NoReturn

from logstore.broker.security.credentials import CredentialStore
from logstore.broker.security.login_limits import FailedLogins, PendingExchanges
from logstore.errors import (
    IllegalSaslStateError,
    SaslAuthenticationError,
    UnsupportedSaslMechanismError,
)
from logstore.scram import (
    ScramCredential,
    check_mechanism,
    make_nonce,
    parse_client_final,
    parse_client_first,
    server_first_message,
    server_signature,
    verify_client_proof,
)

if TYPE_CHECKING:
    from logstore.broker.config import BrokerConfig

__all__ = ["EXCHANGE_TTL_S", "EXCHANGES_PER_CONNECTION", "EXCHANGES_PER_HOST", "FAILED_MESSAGE", "MAX_EXCHANGES",
           "ScramExchanges", "ScramLogin", "user_principal"]

EXCHANGE_TTL_S = 10.0
EXCHANGES_PER_CONNECTION = 8
EXCHANGES_PER_HOST = 256
MAX_EXCHANGES = 10_000
_SALT_BYTES = 32  # what `logstore users create` and Admin use; fake salts have the same length
# The one message of a failed login, whatever was wrong.
FAILED_MESSAGE = "authentication failed: invalid user name or password"


def user_principal(user: str) -> str:
    return f"User:{user}"


@dataclass(frozen=True, slots=True)
class ScramLogin:
    """A completed login: the user, its principal and the server-final-message to send."""

    user: str
    principal: str
    server_final: bytes


@dataclass
class _Exchange:
    mechanism: str
    user: str
    client_first_bare: str
    server_first: str
    nonce: str
    credential: ScramCredential | None  # None: an unknown user, answered with a fake salt
    host: str


class ScramExchanges:
    """The SCRAM server of a broker; see the module docstring. ``credentials()`` is where the
    credentials live (the data dir's file, or etcd on a cluster)."""

    def __init__(self, *, config: BrokerConfig, credentials: Callable[[], CredentialStore]) -> None:
        self.config = config
        self._credentials = credentials
        self._exchanges: PendingExchanges[_Exchange] = PendingExchanges(
            ttl_s=EXCHANGE_TTL_S, per_connection=EXCHANGES_PER_CONNECTION, per_host=EXCHANGES_PER_HOST,
            capacity=MAX_EXCHANGES)
        self.failed_logins = FailedLogins()
        self._fake_salt_key = secrets.token_bytes(32)

    def check_enabled(self, mechanism: str) -> None:
        """Raise UNSUPPORTED_SASL_MECHANISM unless ``mechanism`` is one of ``sasl_enabled_mechanisms``."""
        if mechanism not in self.config.sasl_mechanisms:
            check_mechanism(mechanism)  # an unknown name: its own message
            raise UnsupportedSaslMechanismError(
                f"SASL mechanism {mechanism} is not enabled on this broker; it offers "
                f"{', '.join(self.config.sasl_mechanisms)}")

    async def first(self, mechanism: str, client_first: bytes, *, host: str, connection: str) -> tuple[str, bytes]:
        """Step 1: the exchange's id and the server-first-message. ``connection`` and ``host`` bound
        the pending exchanges (see the module docstring)."""
        self.check_enabled(mechanism)
        first = parse_client_first(_text(client_first))
        credential = (await self._credentials().get(first.user)).get(mechanism)
        if credential is not None:
            salt, iterations = credential.salt, credential.iterations
        else:  # looks like a real user's answer: a stable salt, a plausible iteration count
            salt = hmac.new(self._fake_salt_key, f"{mechanism}\0{first.user}".encode(),
                            hashlib.sha256).digest()[:_SALT_BYTES]
            iterations = self.config.scram_iterations
        nonce = first.nonce + make_nonce()
        server_first = server_first_message(nonce, salt, iterations)
        exchange_id = secrets.token_urlsafe(16)
        self._exchanges.add(exchange_id, _Exchange(mechanism, first.user, first.bare, server_first,
                                                   nonce, credential, host), connection=connection, host=host)
        return exchange_id, server_first.encode()

    async def final(self, exchange_id: str, mechanism: str, client_final: bytes, *, host: str) -> ScramLogin:
        """Step 2: the login, or SASL_AUTHENTICATION_FAILED after ``sasl_failure_delay_ms`` (a wrong
        password and an unknown user alike); ILLEGAL_SASL_STATE for an unknown or expired exchange."""
        self.check_enabled(mechanism)
        exchange = self._exchanges.take(exchange_id)
        if exchange is None or exchange.host != host or exchange.mechanism != mechanism:
            raise IllegalSaslStateError(
                "unknown or expired SCRAM exchange (each exchange_id is good for one final message "
                f"within {EXCHANGE_TTL_S:.0f} s): start again")
        wait_s = self.failed_logins.admit(exchange.user, host)
        if wait_s is None:  # too many recent failures for this name or address: fail as a wrong password
            await self._fail(exchange.user, host)
        if wait_s:
            await asyncio.sleep(wait_s)
        credential = exchange.credential
        try:
            without_proof, proof = parse_client_final(_text(client_final), exchange.nonce)
            auth_message = f"{exchange.client_first_bare},{exchange.server_first},{without_proof}"
            ok = credential is not None and verify_client_proof(credential, auth_message, proof)
        except SaslAuthenticationError:
            ok = False
        if not ok or credential is None:
            await self._fail(exchange.user, host)
        self.failed_logins.succeeded(exchange.user)
        signature = base64.b64encode(server_signature(credential, auth_message)).decode("ascii")
        return ScramLogin(exchange.user, user_principal(exchange.user), f"v={signature}".encode())

    async def _fail(self, user: str, host: str) -> NoReturn:
        self.failed_logins.failed(user, host)
        await asyncio.sleep(self.config.sasl_failure_delay_ms / 1000)
        raise SaslAuthenticationError(FAILED_MESSAGE)

    async def report_failed_logins(self) -> None:
        """Forever: log the failed logins counted, once per interval (a burst that stopped too)."""
        while True:
            await asyncio.sleep(self.failed_logins.log_interval_s)
            self.failed_logins.report()


def _text(data: bytes) -> str:
    try:
        return data.decode("utf-8")
    except UnicodeDecodeError:
        raise SaslAuthenticationError("malformed SCRAM message: not UTF-8") from None
