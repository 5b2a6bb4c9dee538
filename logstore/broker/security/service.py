"""Authentication on the broker: who the caller of each RPC is.

:meth:`SecurityService.caller` is the one place handlers ask; it reads the
call's SCRAM session token (when SCRAM is on) or its TLS client certificate
(when the listener requires one), see :mod:`.principal`.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from logstore.broker.security.principal import Principal, SessionTable, principal_of

__all__ = ["SecurityService"]


class SecurityService:
    """Mixin of :class:`~logstore.broker.service.Broker`: the caller of a call."""

    sessions: SessionTable | None
    tls_principal: Callable[[Any], str | None] | None

    def _init_security(self) -> None:
        self.sessions = None  # SCRAM off: no session tokens are accepted or issued
        self.tls_principal = None  # no mTLS: certificates name nobody

    def caller(self, context: Any) -> Principal:
        """The principal of the call ``context`` belongs to (see :func:`.principal.principal_of`)."""
        return principal_of(context, self.sessions, self.tls_principal)
