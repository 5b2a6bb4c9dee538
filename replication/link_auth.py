"""How a follower's link logs in to a leader whose listener requires SASL (SCRAM).

On a SASL cluster every broker logs in to the others as the inter-broker user
(``sasl_inter_broker_username``/``_password``, Kafka's inter-broker credentials): a
:class:`LinkSession` runs the SCRAM exchange (:mod:`logstore.scram`) on the link's
``grpc.aio`` channel the first time the link needs a session, and
:class:`~replication.links.GrpcLeaderLink` sends its token as ``logstore-session``
metadata on every call. A call refused for its session (SASL_AUTHENTICATION_FAILED:
the leader restarted, or the session ran out) drops the token; the follower's fetcher
backs off as for any broken link and the next call logs in again. Sessions are also
renewed at 90% of their lifetime, before the leader would refuse them.

The leader checks the exchange; the follower checks the leader's final message too,
so a process that does not know the credential cannot pose as the leader.

Thread-safety: one event loop; a lock keeps concurrent calls to one login.
"""

from __future__ import annotations

import asyncio
import time

import grpc

from logstore._proto import logstore_pb2 as pb
from logstore.errors import SaslAuthenticationError
from logstore.scram import ScramClient

__all__ = ["LinkCredentials", "LinkSession", "SESSION_METADATA_KEY"]

SESSION_METADATA_KEY = "logstore-session"  # as logstore.broker.security.principal names it
_RENEW_AT = 0.9


class LinkCredentials:
    """The inter-broker user; ``repr`` hides the password."""

    def __init__(self, mechanism: str, username: str, password: str) -> None:
        self.mechanism = mechanism
        self.username = username
        self.password = password

    def __repr__(self) -> str:
        return f"LinkCredentials({self.mechanism!r}, {self.username!r}, password=***)"


class LinkSession:
    """The session of one link's channel (see the module docstring)."""

    def __init__(self, credentials: LinkCredentials) -> None:
        self._credentials = credentials
        self._token: str | None = None
        self._renew_at = 0.0
        self._lock = asyncio.Lock()

    async def metadata(self, channel: grpc.aio.Channel, timeout_s: float) -> tuple[tuple[str, str], ...]:
        """The call metadata carrying a live session, logging in first when needed.
        Raises :class:`grpc.aio.AioRpcError` or :class:`SaslAuthenticationError` when the login fails."""
        async with self._lock:
            if self._token is None or time.monotonic() >= self._renew_at:
                await self._login(channel, timeout_s)
            assert self._token is not None
            return ((SESSION_METADATA_KEY, self._token),)

    def invalidate(self) -> None:
        """The leader refused the session: the next call logs in again."""
        self._token = None

    async def _login(self, channel: grpc.aio.Channel, timeout_s: float) -> None:
        c = self._credentials
        scram = ScramClient(c.mechanism, c.username, c.password)
        call = channel.unary_unary("/logstore.v1.Logstore/SaslAuthenticate",
                                   request_serializer=pb.SaslAuthenticateRequest.SerializeToString,
                                   response_deserializer=pb.SaslAuthenticateResponse.FromString)
        first = await call(pb.SaslAuthenticateRequest(mechanism=c.mechanism, auth_bytes=scram.first().encode()),
                           timeout=timeout_s)
        final = scram.final(first.auth_bytes.decode("utf-8", "replace"))
        answer = await call(pb.SaslAuthenticateRequest(mechanism=c.mechanism, auth_bytes=final.encode(),
                                                       exchange_id=first.exchange_id), timeout=timeout_s)
        scram.verify(answer.auth_bytes.decode("utf-8", "replace"))
        if not answer.complete or not answer.session_token:
            raise SaslAuthenticationError("the leader ended the SCRAM exchange without a session")
        self._token = answer.session_token
        self._renew_at = time.monotonic() + max(answer.session_lifetime_ms, 1) / 1000 * _RENEW_AT
