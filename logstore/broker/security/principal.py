"""Who is calling: the :class:`Principal` of a gRPC call.

A call's principal comes from, in this order:

1. a SCRAM session: the call carries metadata ``logstore-session: <token>``
   that :meth:`SessionTable.issue` handed out after a successful
   ``SaslAuthenticate`` exchange (an unknown or expired token is an
   authentication failure, never a fall-back to anonymous);
2. the TLS client certificate (mTLS), mapped to ``User:<name>`` by the
   listener's principal mapping rules (Kafka's ``ssl.principal.mapping.rules``);
3. otherwise ``User:ANONYMOUS``.

The host is the peer's IP address (what ACLs match ``host`` against).
Tokens are 256-bit random strings (``secrets.token_urlsafe``): they are
capabilities, so they must not be guessable, and they expire. The table is
bounded: at most ``MAX_SESSIONS_PER_PRINCIPAL`` per principal (a new login ends
that principal's oldest session) and ``MAX_SESSIONS`` in all (a new login ends the
oldest session of the principal holding the most), so one principal logging in in
a loop can only end its own sessions, never another's.

Thread-safety: :class:`SessionTable` is used from the event loop only.
"""

from __future__ import annotations

import secrets
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from logstore.errors import SaslAuthenticationError

__all__ = ["ANONYMOUS", "MAX_SESSIONS", "MAX_SESSIONS_PER_PRINCIPAL", "SESSION_METADATA_KEY", "Principal",
           "SessionTable", "peer_host", "principal_of"]

MAX_SESSIONS = 100_000
MAX_SESSIONS_PER_PRINCIPAL = 1_000

ANONYMOUS = "User:ANONYMOUS"
# gRPC metadata key (lower-case, as gRPC requires) carrying a SCRAM session token.
SESSION_METADATA_KEY = "logstore-session"


@dataclass(frozen=True)
class Principal:
    """An authenticated (or anonymous) caller: ``name`` like ``User:alice``, ``host`` its IP."""

    name: str
    host: str = "*"

    @property
    def anonymous(self) -> bool:
        return self.name == ANONYMOUS


def peer_host(context: Any) -> str:
    """The IP address of the call's peer (``ipv4:1.2.3.4:567`` → ``1.2.3.4``)."""
    peer = str(context.peer() or "")
    kind, _, rest = peer.partition(":")
    if kind == "ipv6":
        address = rest.rsplit(":", 1)[0]
        return address.strip("[]").replace("%5B", "").replace("%5D", "")
    if kind in ("ipv4", "dns"):
        return rest.rsplit(":", 1)[0]
    return peer or "*"


@dataclass
class _Session:
    principal: str
    expires_at: float


class SessionTable:
    """Session tokens handed out after SCRAM, each valid for ``lifetime_s``."""

    def __init__(self, lifetime_s: float, *, clock: Callable[[], float] = time.monotonic,
                 max_sessions: int = MAX_SESSIONS, per_principal: int = MAX_SESSIONS_PER_PRINCIPAL) -> None:
        self.lifetime_s = lifetime_s
        self.max_sessions, self.per_principal = max_sessions, per_principal
        self._clock = clock
        self._sessions: dict[str, _Session] = {}  # oldest first (all have the same lifetime)
        self._by_principal: dict[str, dict[str, None]] = {}  # principal -> its tokens, oldest first

    def __len__(self) -> int:
        return len(self._sessions)

    def issue(self, principal: str) -> str:
        """A new unguessable token for ``principal``; expired ones are dropped on the way, and
        the oldest of ``principal`` (or of the biggest holder) when a bound is reached."""
        now = self._clock()
        while self._sessions:
            oldest, session = next(iter(self._sessions.items()))
            if session.expires_at > now:
                break
            self._drop(oldest)
        mine = self._by_principal.get(principal)
        if mine is not None and len(mine) >= self.per_principal:
            self._drop(next(iter(mine)))
        if len(self._sessions) >= self.max_sessions:
            biggest = max(self._by_principal.values(), key=len)
            self._drop(next(iter(biggest)))
        token = secrets.token_urlsafe(32)
        self._sessions[token] = _Session(principal, now + self.lifetime_s)
        self._by_principal.setdefault(principal, {})[token] = None
        return token

    def _drop(self, token: str) -> None:
        session = self._sessions.pop(token)
        tokens = self._by_principal[session.principal]
        del tokens[token]
        if not tokens:
            del self._by_principal[session.principal]

    def principal(self, token: str) -> str | None:
        """The principal of a live token, or None for an unknown or expired one."""
        session = self._sessions.get(token)
        if session is None:
            return None
        if session.expires_at <= self._clock():
            self._drop(token)
            return None
        return session.principal

    def principals(self) -> set[str]:
        """The principals that hold a session (live or not yet pruned)."""
        return {s.principal for s in self._sessions.values()}

    def revoke_principal(self, principal: str) -> int:
        """End every session of ``principal`` (its credentials were deleted); return how many."""
        gone = list(self._by_principal.get(principal, ()))
        for token in gone:
            self._drop(token)
        return len(gone)


def principal_of(context: Any, sessions: SessionTable | None,
                 tls_principal: Callable[[Any], str | None] | None) -> Principal:
    """The caller of ``context``: session token, else client certificate, else anonymous.

    ``sessions`` is None when SCRAM is off; ``tls_principal`` maps a call's TLS
    auth context to a principal name (None when the listener has no mTLS).
    A token that is present but unknown or expired raises
    :class:`~logstore.errors.SaslAuthenticationError`: a client whose session
    ran out must log in again, not silently become anonymous.
    """
    host = peer_host(context)
    if sessions is not None:
        token = _metadata_value(context, SESSION_METADATA_KEY)
        if token is not None:
            name = sessions.principal(token)
            if name is None:
                raise SaslAuthenticationError("the session has expired or is unknown: authenticate again")
            return Principal(name, host)
    if tls_principal is not None:
        name = tls_principal(context)
        if name is not None:
            return Principal(name, host)
    return Principal(ANONYMOUS, host)


def _metadata_value(context: Any, key: str) -> str | None:
    for k, v in context.invocation_metadata() or ():
        if k == key:
            return v if isinstance(v, str) else bytes(v).decode("ascii", "replace")
    return None
