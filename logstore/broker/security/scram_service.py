"""SCRAM on the broker: the ``SaslAuthenticate`` exchange and the credential RPCs.

:class:`ScramRpcs` is a handler the broker composes (its collaborators are constructor
arguments: the config, the session table, the cluster's metadata store, the I/O pool and
the broker's :class:`~logstore.broker.rpc_errors.Guard`). With ``security_protocol`` SASL_PLAINTEXT
or SASL_SSL the broker's :class:`~.callers.Callers` keep a :class:`~.principal.SessionTable`
and the :class:`~.authentication.SessionInterceptor` (:meth:`ScramRpcs.interceptors`)
refuses every call without a live session (see :mod:`.authentication`).

``SaslAuthenticate`` runs RFC 5802 in two calls (Kafka's shape):

1. ``mechanism`` + client-first-message → server-first-message and a random
   ``exchange_id`` (an exchange lives ``EXCHANGE_TTL_S``; at most
   ``EXCHANGES_PER_CONNECTION`` per connection, ``EXCHANGES_PER_HOST`` per address and
   ``MAX_EXCHANGES`` in all are pending, and a new one replaces the flooder's oldest rather
   than being refused: :class:`~.login_limits.PendingExchanges`);
2. ``exchange_id`` + client-final-message → server-final-message, ``complete``, a
   session token (256 bits, :meth:`SessionTable.issue`) valid for
   ``sasl_session_lifetime_ms``, and the principal ``User:<name>``.

What an attacker learns: nothing about which part was wrong. An unknown user gets a
server-first-message like a real user's (a salt derived from a per-broker secret and
the name, so asking twice gives the same salt; ``scram_iterations`` iterations); a
wrong password and an unknown user both fail step 2 after the same fixed pause
(``sasl_failure_delay_ms``) with the same SASL_AUTHENTICATION_FAILED message, and count
alike against the user name and the address: after a few failures their attempts are
spaced by a delay that doubles (:class:`~.login_limits.FailedLogins`). Failures are
logged once per interval with counts per address, never the user name (people type
passwords into user-name fields).

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
import base64
import hashlib
import hmac
import logging
import secrets
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
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
from logstore.broker.security.login_limits import FailedLogins, PendingExchanges
from logstore.broker.security.principal import SessionTable, peer_host
from logstore.errors import (
    BrokerUnavailableError,
    IllegalSaslStateError,
    InvalidRequestError,
    LogstoreError,
    ResourceNotFoundError,
    SaslAuthenticationError,
    SecurityDisabledError,
    UnsupportedSaslMechanismError,
)
from logstore.scram import (
    MAX_ITERATIONS,
    MECHANISMS,
    MIN_ITERATIONS,
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
    from replication.metadata_store import MetadataStore

__all__ = ["ScramRpcs", "EXCHANGE_TTL_S", "EXCHANGES_PER_CONNECTION", "EXCHANGES_PER_HOST", "MAX_EXCHANGES",
           "FAILED_MESSAGE", "user_principal"]

log = logging.getLogger("logstore.broker.security")

EXCHANGE_TTL_S = 10.0
EXCHANGES_PER_CONNECTION = 8
EXCHANGES_PER_HOST = 256
USER_CHECK_INTERVAL_S = 2.0  # on a cluster: how soon a user deleted elsewhere loses its sessions here
MAX_EXCHANGES = 10_000
MAX_USER_NAME_CHARS = 256
_SALT_BYTES = 32  # what `logstore users create` and Admin use; fake salts have the same length
_MAX_SALT_BYTES = 1024
# The one message of a failed login, whatever was wrong.
FAILED_MESSAGE = "authentication failed: invalid user name or password"


def user_principal(user: str) -> str:
    return f"User:{user}"


@dataclass
class _Exchange:
    mechanism: str
    user: str
    client_first_bare: str
    server_first: str
    nonce: str
    credential: ScramCredential | None  # None: an unknown user, answered with a fake salt
    host: str


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
    table (None: not a SASL listener); ``credentials()`` where the SCRAM credentials live
    (:func:`local_credentials` or :func:`cluster_credentials`); ``shared_store()``, on a
    cluster, the metadata store other brokers change users in (None on a single broker)."""

    def __init__(self, *, config: BrokerConfig, sessions: SessionTable | None,
                 credentials: Callable[[], CredentialStore],
                 shared_store: Callable[[], MetadataStore | None] | None,
                 guard: Guard) -> None:
        self.config = config
        self.sessions = sessions
        self.credentials = credentials
        self._shared_store = shared_store
        self._guard = guard
        self._exchanges: PendingExchanges[_Exchange] = PendingExchanges(
            ttl_s=EXCHANGE_TTL_S, per_connection=EXCHANGES_PER_CONNECTION, per_host=EXCHANGES_PER_HOST,
            capacity=MAX_EXCHANGES)
        self._failed_logins = FailedLogins()
        self._fake_salt_key = secrets.token_bytes(32)

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
        tasks = [asyncio.create_task(self._report_failed_logins())]
        if self._shared_store is not None:
            tasks.append(asyncio.create_task(self._end_sessions_of_deleted_users(self._shared_store)))
        return tasks

    async def _report_failed_logins(self) -> None:
        while True:
            await asyncio.sleep(self._failed_logins.log_interval_s)
            self._failed_logins.report()

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
            if request.mechanism not in self.config.sasl_mechanisms:
                check_mechanism(request.mechanism)  # an unknown name: its own message
                raise UnsupportedSaslMechanismError(
                    f"SASL mechanism {request.mechanism} is not enabled on this broker; it offers "
                    f"{', '.join(self.config.sasl_mechanisms)}")
            if not request.exchange_id:
                return await self._scram_first(request, peer_host(context), str(context.peer()))
            return await self._scram_final(request, peer_host(context))
        return await self._guard.guard("SaslAuthenticate", context, body)

    async def _scram_first(self, request: pb.SaslAuthenticateRequest, host: str,
                           connection: str) -> pb.SaslAuthenticateResponse:
        first = parse_client_first(_text(request.auth_bytes))
        credential = (await self.credentials().get(first.user)).get(request.mechanism)
        if credential is not None:
            salt, iterations = credential.salt, credential.iterations
        else:  # looks like a real user's answer: a stable salt, a plausible iteration count
            salt = hmac.new(self._fake_salt_key, f"{request.mechanism}\0{first.user}".encode(),
                            hashlib.sha256).digest()[:_SALT_BYTES]
            iterations = self.config.scram_iterations
        nonce = first.nonce + make_nonce()
        server_first = server_first_message(nonce, salt, iterations)
        exchange_id = secrets.token_urlsafe(16)
        self._exchanges.add(exchange_id, _Exchange(request.mechanism, first.user, first.bare, server_first,
                                                   nonce, credential, host), connection=connection, host=host)
        return pb.SaslAuthenticateResponse(auth_bytes=server_first.encode(), exchange_id=exchange_id)

    async def _scram_final(self, request: pb.SaslAuthenticateRequest, host: str) -> pb.SaslAuthenticateResponse:
        exchange = self._exchanges.take(request.exchange_id)
        if exchange is None or exchange.host != host or exchange.mechanism != request.mechanism:
            raise IllegalSaslStateError(
                "unknown or expired SCRAM exchange (each exchange_id is good for one final message "
                f"within {EXCHANGE_TTL_S:.0f} s): start again")
        wait_s = self._failed_logins.admit(exchange.user, host)
        if wait_s is None:  # too many recent failures for this name or address: fail as a wrong password
            self._failed_logins.failed(exchange.user, host)
            await asyncio.sleep(self.config.sasl_failure_delay_ms / 1000)
            raise SaslAuthenticationError(FAILED_MESSAGE)
        if wait_s > 0:
            await asyncio.sleep(wait_s)
        credential = exchange.credential
        try:
            without_proof, proof = parse_client_final(_text(request.auth_bytes), exchange.nonce)
            auth_message = f"{exchange.client_first_bare},{exchange.server_first},{without_proof}"
            ok = credential is not None and verify_client_proof(credential, auth_message, proof)
        except SaslAuthenticationError:
            ok = False
        if not ok or credential is None:
            self._failed_logins.failed(exchange.user, host)
            await asyncio.sleep(self.config.sasl_failure_delay_ms / 1000)
            raise SaslAuthenticationError(FAILED_MESSAGE)
        self._failed_logins.succeeded(exchange.user)
        assert self.sessions is not None  # checked by SaslAuthenticate
        principal = user_principal(exchange.user)
        token = self.sessions.issue(principal)
        signature = base64.b64encode(server_signature(credential, auth_message)).decode("ascii")
        return pb.SaslAuthenticateResponse(
            auth_bytes=f"v={signature}".encode(), complete=True, session_token=token,
            session_lifetime_ms=self.config.sasl_session_lifetime_ms, principal=principal)

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


def _text(data: bytes) -> str:
    try:
        return data.decode("utf-8")
    except UnicodeDecodeError:
        raise SaslAuthenticationError("malformed SCRAM message: not UTF-8") from None


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
