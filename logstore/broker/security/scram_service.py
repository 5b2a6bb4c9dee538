"""SCRAM on the broker: the ``SaslAuthenticate`` exchange and the credential RPCs.

:class:`ScramRpcs` is a handler the broker composes (its collaborators are constructor
arguments: the config, the session table, the cluster's metadata store, the I/O pool and
the broker's :class:`~logstore.broker.rpc_errors.Guard`). With ``security_protocol`` SASL_PLAINTEXT
or SASL_SSL the broker's :class:`~.callers.Callers` keep a :class:`~.principal.SessionTable`
and the :class:`~.authentication.SessionInterceptor` (:meth:`ScramRpcs.interceptors`)
refuses every call without a live session (see :mod:`.authentication`).

``SaslAuthenticate`` runs RFC 5802 in two calls (Kafka's shape), on the broker's one SCRAM
server (:class:`~.scram_exchange.ScramExchanges`, shared with the Kafka listener: the same
pending exchanges, failed-login limits and failure delay):

1. ``mechanism`` + client-first-message → server-first-message and a random
   ``exchange_id``;
2. ``exchange_id`` + client-final-message → server-final-message, ``complete``, a
   session token (256 bits, :meth:`SessionTable.issue`) valid for
   ``sasl_session_lifetime_ms``, and the principal ``User:<name>``.

``AlterUserScramCredentials`` takes what the client computed (salt, iterations,
``Hi(password)``: the password never reaches the broker) and stores StoredKey and
ServerKey (:mod:`.credentials`); deleting a user's credential ends every session of
that user on this broker at once, and on the other brokers of a cluster within
``USER_CHECK_INTERVAL_S`` (each re-reads the users from etcd that often). ``DescribeUserScramCredentials`` lists mechanisms and iterations, never keys.
Who may call these two is the authorizer's question (ALTER / DESCRIBE on the Cluster).

Thread-safety: event loop only (the exchanges and the session table are not locked).
"""

from __future__ import annotations

import asyncio
import hashlib
import logging
from collections.abc import Awaitable, Callable
from typing import TYPE_CHECKING, Any

import grpc

from logstore._proto import logstore_pb2 as pb
from logstore.broker.rpc_errors import Guard, error_to_pb
from logstore.broker.security.authentication import SessionInterceptor
from logstore.broker.security.credentials import (
    CredentialStore,
    EtcdCredentials,
    FileCredentials,
    LocalCredentials,
)
from logstore.broker.security.principal import SessionTable, peer_host
from logstore.broker.security.scram_exchange import (
    EXCHANGE_TTL_S,
    EXCHANGES_PER_CONNECTION,
    EXCHANGES_PER_HOST,
    FAILED_MESSAGE,
    MAX_EXCHANGES,
    ScramExchanges,
    user_principal,
)
from logstore.errors import (
    BrokerUnavailableError,
    InvalidRequestError,
    LogstoreError,
    ResourceNotFoundError,
    SecurityDisabledError,
    UnsupportedSaslMechanismError,
)
from logstore.scram import (
    MAX_ITERATIONS,
    MECHANISMS,
    MIN_ITERATIONS,
    ScramCredential,
    check_mechanism,
)

if TYPE_CHECKING:
    from logstore.broker.config import BrokerConfig
    from replication.metadata_store import MetadataStore

__all__ = ["ScramRpcs", "EXCHANGE_TTL_S", "EXCHANGES_PER_CONNECTION", "EXCHANGES_PER_HOST", "MAX_EXCHANGES",
           "FAILED_MESSAGE", "user_principal"]

log = logging.getLogger("logstore.broker.security")

USER_CHECK_INTERVAL_S = 2.0  # on a cluster: how soon a user deleted elsewhere loses its sessions here
MAX_USER_NAME_CHARS = 256
_MAX_SALT_BYTES = 1024


def local_credentials(data_dir: str, run_io: Callable[..., Awaitable[Any]]) -> Callable[[], CredentialStore]:
    """A single broker's credentials: the file in its data dir, read on first use."""
    made: list[CredentialStore] = []

    def credentials() -> CredentialStore:
        if not made:
            made.append(LocalCredentials(FileCredentials(data_dir), run_io))
        return made[0]
    return credentials


def cluster_credentials(store: Callable[[], MetadataStore | None]) -> Callable[[], CredentialStore]:
    """A cluster's credentials: in etcd, once the broker joined (``store()``; before, the
    calls that need them answer BROKER_NOT_AVAILABLE)."""
    def credentials() -> CredentialStore:
        joined = store()
        if joined is None:
            raise BrokerUnavailableError("the broker is not connected to its cluster's metadata yet")
        return EtcdCredentials(joined)
    return credentials


class ScramRpcs:
    """The SCRAM handlers; see the module docstring. ``sessions`` is the listener's session
    table (None: not a SASL listener); ``exchanges`` the broker's SCRAM server;
    ``credentials()`` where the SCRAM credentials live (:func:`local_credentials` or
    :func:`cluster_credentials`); ``shared_store()``, on a cluster, the metadata store other
    brokers change users in (None on a single broker)."""

    def __init__(self, *, config: BrokerConfig, sessions: SessionTable | None, exchanges: ScramExchanges,
                 credentials: Callable[[], CredentialStore],
                 shared_store: Callable[[], MetadataStore | None] | None,
                 guard: Guard) -> None:
        self.config = config
        self.sessions = sessions
        self.exchanges = exchanges
        self.credentials = credentials
        self._shared_store = shared_store
        self._guard = guard

    def rpcs(self) -> dict[str, Callable[..., Awaitable[Any]]]:
        """The RPCs this handler implements, by name."""
        return {"SaslAuthenticate": self.SaslAuthenticate, "AlterUserScramCredentials": self.AlterUserScramCredentials,
                "DescribeUserScramCredentials": self.DescribeUserScramCredentials}

    def tasks(self) -> list[asyncio.Task[None]]:
        """Background work once serving: on a SASL listener, report failed logins once per
        interval; on a SASL cluster, also end the sessions of users deleted through another
        broker (within ``USER_CHECK_INTERVAL_S``)."""
        if self.sessions is None:
            return []
        tasks = [asyncio.create_task(self.exchanges.report_failed_logins())]
        if self._shared_store is not None:
            tasks.append(asyncio.create_task(self._end_sessions_of_deleted_users(self._shared_store)))
        return tasks

    async def _end_sessions_of_deleted_users(self, shared_store: Callable[[], MetadataStore | None]) -> None:
        while True:
            await asyncio.sleep(USER_CHECK_INTERVAL_S)
            store = shared_store()
            if self.sessions is None or store is None:
                continue
            try:
                present = {user_principal(u) for u in await store.all_scram_credentials()}
            except LogstoreError as e:  # etcd unreachable: sessions keep their lifetime meanwhile
                log.debug("cannot read the SCRAM users from etcd: %s", e)
                continue
            for principal in self.sessions.principals() - present:
                ended = self.sessions.revoke_principal(principal)
                log.info("a user was deleted on another broker; %d session(s) ended", ended)

    def interceptors(self) -> list[grpc.aio.ServerInterceptor]:
        """The server's interceptors: the session check on a SASL listener, else none."""
        return [SessionInterceptor(self.sessions)] if self.sessions is not None else []

    # ------------------------------------------------------------------ SaslAuthenticate

    async def SaslAuthenticate(self, request: pb.SaslAuthenticateRequest,
                               context: grpc.aio.ServicerContext) -> pb.SaslAuthenticateResponse:
        async def body() -> pb.SaslAuthenticateResponse:
            if self.sessions is None:
                raise SecurityDisabledError(
                    f"this broker's listener is {self.config.security_protocol}: it takes no SASL "
                    "authentication (use security_protocol PLAINTEXT or SSL on the client)")
            host = peer_host(context)
            if not request.exchange_id:
                exchange_id, server_first = await self.exchanges.first(
                    request.mechanism, request.auth_bytes, host=host, connection=str(context.peer()))
                return pb.SaslAuthenticateResponse(auth_bytes=server_first, exchange_id=exchange_id)
            login = await self.exchanges.final(request.exchange_id, request.mechanism, request.auth_bytes,
                                               host=host)
            assert self.sessions is not None  # checked above
            return pb.SaslAuthenticateResponse(
                auth_bytes=login.server_final, complete=True, session_token=self.sessions.issue(login.principal),
                session_lifetime_ms=self.config.sasl_session_lifetime_ms, principal=login.principal)
        return await self._guard.guard("SaslAuthenticate", context, body)

    # ------------------------------------------------------------------ credentials

    async def AlterUserScramCredentials(self, request: pb.AlterUserScramCredentialsRequest,
                                        context: grpc.aio.ServicerContext) -> pb.AlterUserScramCredentialsResponse:
        async def body() -> pb.AlterUserScramCredentialsResponse:
            by_user: dict[str, tuple[list[ScramCredential], list[str]]] = {}
            errors: dict[str, LogstoreError] = {}
            for d in request.deletions:
                by_user.setdefault(d.user, ([], []))[1].append(d.mechanism)
            for u in request.upsertions:
                upserts = by_user.setdefault(u.user, ([], []))[0]
                try:
                    upserts.append(_credential_of(u))
                except LogstoreError as e:
                    errors.setdefault(u.user, e)
            valid: dict[str, tuple[list[ScramCredential], list[str]]] = {}
            for user, (upserts, deletions) in by_user.items():
                try:
                    if user in errors:
                        raise errors[user]
                    _check_alteration(user, upserts, deletions)
                    valid[user] = (upserts, deletions)
                except LogstoreError as e:
                    errors[user] = e
            outcome = await self.credentials().alter_many(valid) if valid else {}
            results = []
            for user, (_, deletions) in by_user.items():
                error = errors.get(user) or outcome.get(user)
                result = pb.AlterUserScramCredentialsResult(user=user)
                if error is not None:
                    result.error.CopyFrom(error_to_pb(error))
                elif deletions and self.sessions is not None:
                    ended = self.sessions.revoke_principal(user_principal(user))
                    log.info("SCRAM credentials of a user deleted; %d session(s) ended", ended)
                results.append(result)
            return pb.AlterUserScramCredentialsResponse(results=results)
        return await self._guard.guard("AlterUserScramCredentials", context, body)

    async def DescribeUserScramCredentials(self, request: pb.DescribeUserScramCredentialsRequest,
                                           context: grpc.aio.ServicerContext
                                           ) -> pb.DescribeUserScramCredentialsResponse:
        async def body() -> pb.DescribeUserScramCredentialsResponse:
            store = self.credentials()
            if request.users:
                found = {u: await store.get(u) for u in dict.fromkeys(request.users)}
            else:
                found = await store.users()
            results = []
            for user, creds in (found.items() if request.users else sorted(found.items())):
                result = pb.DescribeUserScramCredentialsResult(user=user)
                if not creds:
                    result.error.CopyFrom(error_to_pb(ResourceNotFoundError(f"user {user!r} has no SCRAM credentials")))
                for mech, cred in sorted(creds.items()):
                    result.credentials.add(mechanism=mech, iterations=cred.iterations)
                results.append(result)
            return pb.DescribeUserScramCredentialsResponse(results=results)
        return await self._guard.guard("DescribeUserScramCredentials", context, body)


def _credential_of(u: pb.ScramCredentialUpsertion) -> ScramCredential:
    """The stored form of an upsertion, after checking what the client sent."""
    digest_size = hashlib.new(check_mechanism(u.mechanism)).digest_size
    if not MIN_ITERATIONS <= u.iterations <= MAX_ITERATIONS:
        raise InvalidRequestError(
            f"iterations must be {MIN_ITERATIONS} to {MAX_ITERATIONS} (Kafka's bounds), got {u.iterations}")
    if not 1 <= len(u.salt) <= _MAX_SALT_BYTES:
        raise InvalidRequestError(f"the salt must have 1 to {_MAX_SALT_BYTES} bytes, got {len(u.salt)}")
    if len(u.salted_password) != digest_size:
        raise InvalidRequestError(
            f"salted_password must be Hi(password, salt, iterations): {digest_size} bytes for "
            f"{u.mechanism}, got {len(u.salted_password)}")
    return ScramCredential.from_salted_password(u.mechanism, u.salt, u.iterations, u.salted_password)


def _check_alteration(user: str, upserts: list[ScramCredential], deletions: list[str]) -> None:
    if not user or len(user) > MAX_USER_NAME_CHARS or not user.isprintable():
        raise InvalidRequestError(
            f"a user name must be 1 to {MAX_USER_NAME_CHARS} printable characters, got {user[:40]!r}")
    for mech in deletions:
        if mech not in MECHANISMS:
            raise UnsupportedSaslMechanismError(f"SASL mechanism {mech!r} is not one of {', '.join(MECHANISMS)}")
    mechanisms = [c.mechanism for c in upserts] + deletions
    if len(set(mechanisms)) != len(mechanisms):
        raise InvalidRequestError(f"user {user!r}: each mechanism may be named once per request")
