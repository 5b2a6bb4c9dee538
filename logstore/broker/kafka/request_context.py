"""Who sent a Kafka request: what every handler is given beside the request itself.

The listener builds one :class:`RequestContext` per request from its connection (the
principal the connection authenticated as: SASL, else its TLS client certificate, else
``User:ANONYMOUS``, at the peer's address) and the request header's client id. Handlers ask
the broker's :class:`~logstore.broker.security.authorization.Authorization` about
``context.principal`` (with the authorizer off every check passes), as Kafka's
``KafkaApis`` asks its authorizer about ``request.context.principal``.

Thread-safety: immutable values.
"""

from __future__ import annotations

from dataclasses import dataclass

from logstore.broker.security.principal import ANONYMOUS, Principal

__all__ = ["ANONYMOUS_CONTEXT", "RequestContext"]


@dataclass(frozen=True, slots=True)
class RequestContext:
    """A request's principal (name and host, as ACLs match them) and the client id of its header."""

    principal: Principal
    client_id: str = ""


# A caller nobody authenticated, from anywhere: what tests and tools without a connection use.
ANONYMOUS_CONTEXT = RequestContext(Principal(ANONYMOUS, "*"))
