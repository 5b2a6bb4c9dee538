"""Authentication on the broker: who the caller of each RPC is.

:meth:`Callers.caller` is the one place the broker's parts ask; it reads the call's SCRAM
session token (on a SASL listener, whose :class:`~.principal.SessionTable` this part keeps)
or its TLS client certificate (when the listener requires one), see :mod:`.principal`.
The broker builds one :class:`Callers` from its config and sets :attr:`Callers.tls_principal`
once its listener is bound (:func:`~.tls.bind_listener`).

Thread-safety: event loop only (the session table is not locked).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from logstore.broker.config import BrokerConfig
from logstore.broker.security.principal import Principal, SessionTable, principal_of

__all__ = ["Callers"]


class Callers:
    """The caller of a call; see the module docstring."""

    def __init__(self, config: BrokerConfig) -> None:
        # A SASL listener's sessions; None: SCRAM off, no session tokens are accepted or issued.
        self.sessions: SessionTable | None = (
            SessionTable(config.sasl_session_lifetime_ms / 1000) if config.sasl else None)
        # The listener's certificate-to-principal function; None: no mTLS, certificates name nobody.
        self.tls_principal: Callable[[Any], str | None] | None = None

    def caller(self, context: Any) -> Principal:
        """The principal of the call ``context`` belongs to (see :func:`.principal.principal_of`)."""
        return principal_of(context, self.sessions, self.tls_principal)
