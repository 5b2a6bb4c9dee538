"""SASL on the Kafka listener: SaslHandshake (17) v0-1 and SaslAuthenticate (36) v0-2 with
SCRAM-SHA-256 and SCRAM-SHA-512, through the broker's one SCRAM server.

Kafka authenticates a connection, not a call: on a SASL listener (``security_protocol``
SASL_PLAINTEXT or SASL_SSL) a client sends ApiVersions (optional), SaslHandshake with its
mechanism, then the SCRAM messages, and the connection is then its principal,
``User:<name>``, until the session ends. :class:`SaslAuthenticator` is that state for one
connection; the listener (:mod:`.listener`) gives it the SASL requests and asks it whether
the connection may send anything else:

* **Before authenticating** a connection may send ApiVersions, SaslHandshake and
  SaslAuthenticate only; any other request closes it (Kafka's
  ``SaslServerAuthenticator`` does the same).
* **SaslHandshake** names a mechanism of ``sasl_enabled_mechanisms`` (the answer lists
  them); another closes the connection after the answer (UNSUPPORTED_SASL_MECHANISM, 33).
  v1+ is followed by SaslAuthenticate requests; v0 (clients before Kafka 1.0) by the bare
  SCRAM messages, each framed by an int32 size and answered the same way, a failure closing
  the connection without an answer.
* **SaslAuthenticate** carries the client-first-message, then the client-final-message
  (RFC 5802); the SCRAM server (:class:`~logstore.broker.security.scram_exchange.ScramExchanges`,
  shared with gRPC's SaslAuthenticate) answers them: the same credentials, failure delay and
  failed-login limits. A failure is answered SASL_AUTHENTICATION_FAILED (58) with one
  message whatever was wrong, and the connection is closed; a request out of order,
  ILLEGAL_SASL_STATE (34), likewise.
* **Session lifetime** (KIP-368): the final answer (v1+) says ``session_lifetime_ms`` =
  ``sasl_session_lifetime_ms``. Before it runs out a client re-authenticates on the same
  connection (SaslHandshake v1+, then SaslAuthenticate, as the principal it was: another
  one fails the connection); past it, any request but these (and ApiVersions) closes the
  connection. A client that cannot re-authenticate (SaslAuthenticate v0, or handshake v0)
  reconnects.

Thread-safety: event loop only; one authenticator per connection.
"""

from __future__ import annotations

import datetime
import logging
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from kio.schema.errors import ErrorCode

from logstore.broker.kafka.error_codes import kafka_error_code
from logstore.broker.kafka.messages import build, response_of
from logstore.broker.security.scram_exchange import ScramExchanges, ScramLogin
from logstore.errors import IllegalSaslStateError, LogstoreError, SaslAuthenticationError

__all__ = ["SASL_APIS", "SASL_AUTHENTICATE", "SASL_HANDSHAKE", "SaslAuthenticator", "SaslSettings"]

log = logging.getLogger("logstore.broker.kafka")

SASL_HANDSHAKE, SASL_AUTHENTICATE = 17, 36
SASL_APIS: dict[int, tuple[int, int]] = {SASL_HANDSHAKE: (0, 1), SASL_AUTHENTICATE: (0, 2)}
_NO_LIFETIME = datetime.timedelta(0)


@dataclass(frozen=True, slots=True)
class SaslSettings:
    """A SASL listener's: the SCRAM server, the mechanisms offered, how long a session lasts."""

    exchanges: ScramExchanges
    mechanisms: tuple[str, ...]
    session_lifetime_ms: int


class SaslAuthenticator:
    """One connection's SASL state (see the module docstring). ``host`` is the peer's address
    (failed logins count against it), ``connection`` names the connection (it bounds its
    pending exchanges)."""

    def __init__(self, settings: SaslSettings, *, host: str, connection: str,
                 clock: Callable[[], float] = time.monotonic) -> None:
        self._settings = settings
        self._host = host
        self._connection = connection
        self._clock = clock
        self._stage = "handshake"  # handshake -> first -> final -> done (-> first again: re-authentication)
        self._mechanism = ""
        self._exchange_id = ""
        self.raw_tokens = False  # after SaslHandshake v0: the next frames are bare SCRAM messages
        self.principal: str | None = None  # the authenticated principal (kept while re-authenticating)
        self._expires_at = 0.0
        self.failure: str | None = None  # set: close the connection once the answer is sent; why

    @property
    def authenticated(self) -> bool:
        """Whether the connection has a principal whose session has not ended."""
        return self.principal is not None and self._clock() < self._expires_at

    @property
    def expired(self) -> bool:
        """Whether the connection authenticated once and its session has ended since."""
        return self.principal is not None and not self.authenticated

    def handshake(self, request: Any) -> Any:
        """SaslHandshake's answer (check :attr:`failure` after sending it)."""
        response_type = response_of(request)
        mechanisms = self._settings.mechanisms
        if self._stage not in ("handshake", "done") or (self._stage == "done" and request.__version__ < 1):
            self._fail(f"SaslHandshake v{request.__version__} in stage {self._stage!r}")
            return build(response_type, error_code=ErrorCode.illegal_sasl_state, mechanisms=mechanisms)
        if request.mechanism not in mechanisms:
            self._fail(f"SASL mechanism {request.mechanism[:40]!r} is not enabled (sasl_enabled_mechanisms)")
            return build(response_type, error_code=ErrorCode.unsupported_sasl_mechanism, mechanisms=mechanisms)
        self._mechanism = request.mechanism
        self._stage = "first"
        self.raw_tokens = request.__version__ == 0
        return build(response_type, error_code=ErrorCode.none, mechanisms=mechanisms)

    async def authenticate(self, request: Any) -> Any:
        """SaslAuthenticate's answer (check :attr:`failure` after sending it)."""
        response_type = response_of(request)
        try:
            if self.raw_tokens:
                raise IllegalSaslStateError("SaslAuthenticate after SaslHandshake v0 (bare SCRAM messages expected)")
            auth_bytes, lifetime = await self._step(request.auth_bytes)
        except LogstoreError as e:
            self._fail(e.message)
            return build(response_type, error_code=kafka_error_code(e), error_message=e.message, auth_bytes=b"",
                         session_lifetime=_NO_LIFETIME)
        return build(response_type, error_code=ErrorCode.none, error_message=None, auth_bytes=auth_bytes,
                     session_lifetime=lifetime)

    async def raw_token(self, token: bytes) -> bytes:
        """The answer to a bare SCRAM message (after SaslHandshake v0); raises
        :class:`~logstore.errors.SaslAuthenticationError` when the login fails (close, no answer)."""
        try:
            answer, _ = await self._step(token)
        except LogstoreError as e:
            self._fail(e.message)
            raise SaslAuthenticationError(e.message) from None
        if self._stage == "done":
            self.raw_tokens = False  # Kafka requests from now on
        return answer

    async def _step(self, message: bytes) -> tuple[bytes, datetime.timedelta]:
        """The SCRAM server's answer to the next client message, and the session lifetime to say."""
        exchanges = self._settings.exchanges
        if self._stage == "first":
            self._exchange_id, server_first = await exchanges.first(
                self._mechanism, message, host=self._host, connection=self._connection)
            self._stage = "final"
            return server_first, _NO_LIFETIME
        if self._stage == "final":
            login = await exchanges.final(self._exchange_id, self._mechanism, message, host=self._host)
            self._logged_in(login)
            return login.server_final, datetime.timedelta(milliseconds=self._settings.session_lifetime_ms)
        raise IllegalSaslStateError(f"SaslAuthenticate in stage {self._stage!r}: send SaslHandshake first")

    def _logged_in(self, login: ScramLogin) -> None:
        if self.principal is not None and login.principal != self.principal:
            raise SaslAuthenticationError(
                f"re-authentication as {login.principal} on a connection of {self.principal}: a connection "
                "keeps its principal")
        log.debug("kafka listener: %s %s with %s on %s", login.principal,
                  "logged in" if self.principal is None else "re-authenticated", self._mechanism, self._connection)
        self.principal = login.principal
        self._expires_at = self._clock() + self._settings.session_lifetime_ms / 1000
        self._stage = "done"

    def _fail(self, why: str) -> None:
        self.failure = why
        self._stage = "failed"
