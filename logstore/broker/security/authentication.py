"""The session check of a SASL listener: a ``grpc.aio`` server interceptor.

On a listener whose ``security_protocol`` is SASL_PLAINTEXT or SASL_SSL, every call
must carry a live session token (metadata ``logstore-session``, handed out by
``SaslAuthenticate``), except:

* ``SaslAuthenticate`` itself (how a client gets a token), and
* the standard gRPC health service (``/grpc.health.v1.Health/``: load balancers and
  Kubernetes probes carry no credentials, and it tells nothing about the data).

A call without a token, or with an unknown or expired one, ends before its handler
runs: gRPC ``UNAUTHENTICATED`` with ``SASL_AUTHENTICATION_FAILED`` in the
``logstore-error-code`` trailing metadata (the client maps it to
:class:`~logstore.errors.SaslAuthenticationError` and, for an expired token, logs in
again). The handler still asks :meth:`.callers.Callers.caller` for the principal, which
re-reads the token: a session that ends between the two is refused there too.

Thread-safety: runs on the server's event loop, as the session table requires.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from typing import Any

import grpc

from logstore.broker.security.principal import SESSION_METADATA_KEY, SessionTable
from logstore.errors import WIRE_CODE_KEY, SaslAuthenticationError

__all__ = ["SessionInterceptor", "EXEMPT_METHODS", "NO_SESSION_MESSAGE", "EXPIRED_SESSION_MESSAGE"]

EXEMPT_METHODS = frozenset({"/logstore.v1.Logstore/SaslAuthenticate"})
_EXEMPT_PREFIXES = ("/grpc.health.v1.Health/",)
NO_SESSION_MESSAGE = ("this broker requires SASL authentication (SCRAM): the call carries no session; "
                      "connect with security_protocol SASL_PLAINTEXT or SASL_SSL and a user name and password")
EXPIRED_SESSION_MESSAGE = "the session has expired or is unknown: authenticate again"


class SessionInterceptor(grpc.aio.ServerInterceptor):
    """Refuse calls without a live session (see the module docstring)."""

    def __init__(self, sessions: SessionTable) -> None:
        self._sessions = sessions

    async def intercept_service(
        self, continuation: Callable[[grpc.HandlerCallDetails], Awaitable[grpc.RpcMethodHandler]],
        details: grpc.HandlerCallDetails,
    ) -> grpc.RpcMethodHandler:
        handler = await continuation(details)
        method = details.method
        if handler is None or method in EXEMPT_METHODS or method.startswith(_EXEMPT_PREFIXES):
            return handler
        token = _token(details.invocation_metadata)
        if token is not None and self._sessions.principal(token) is not None:
            return handler
        return _refusal(handler, NO_SESSION_MESSAGE if token is None else EXPIRED_SESSION_MESSAGE)


def _token(metadata: Any) -> str | None:
    for key, value in metadata or ():
        if key == SESSION_METADATA_KEY:
            return value if isinstance(value, str) else bytes(value).decode("ascii", "replace")
    return None


def _refusal(handler: grpc.RpcMethodHandler, message: str) -> grpc.RpcMethodHandler:
    """A handler of ``handler``'s shape that ends the call with UNAUTHENTICATED."""
    code = SaslAuthenticationError.code

    async def refuse(_request: Any, context: grpc.aio.ServicerContext) -> Any:
        context.set_trailing_metadata(((WIRE_CODE_KEY, code),))
        await context.abort(grpc.StatusCode.UNAUTHENTICATED, message)

    if handler.request_streaming and handler.response_streaming:
        return grpc.stream_stream_rpc_method_handler(refuse)
    if handler.request_streaming:
        return grpc.stream_unary_rpc_method_handler(refuse)
    if handler.response_streaming:
        return grpc.unary_stream_rpc_method_handler(refuse)
    return grpc.unary_unary_rpc_method_handler(refuse)
