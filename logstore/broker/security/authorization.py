"""Authorization on the broker: the one check every handler makes, and whose producer ids are whose.

:class:`Authorization` is a part the broker composes from its config, its
:class:`~.callers.Callers` (who calls), the I/O pool and the transaction coordinator's
``transactional_id_of``. With ``authorizer`` off (the default) :attr:`Authorization.authorizer`
is None: every check passes without looking at the caller, and the ACL RPCs answer
SECURITY_DISABLED. With it on, the ACLs are loaded before the broker serves (single broker:
``<data_dir>/meta/acls.json``, :meth:`Authorization.load`) or followed in etcd (a cluster:
every broker applies a change when etcd reports it, :meth:`Authorization.follow`), see
:mod:`.acl_store`; the decision is :meth:`.acls.Authorizer.authorize`.

Handlers ask :meth:`Authorization.principal` for the caller once (through their
:class:`~logstore.broker.rpc_gate.RpcGate`), then :meth:`~Authorization.check` (raise the
resource type's ``*_AUTHORIZATION_FAILED``) or :meth:`~Authorization.allowed` (filter, as
Metadata leaves out the topics the caller may not describe). What each RPC needs is
:data:`.acl_service.RPC_AUTHORIZATION`.

Internal topics (names starting with ``__``: ``__consumer_offsets``, the transaction
decisions) are the broker's own state: only super users may touch them through an RPC,
whatever the ACLs say; the coordinators write them inside the broker, unchecked.

Capabilities (issue 12): ids a client holds are not credentials. A produce's batches with a
producer id pass :meth:`Authorization.producer_check` (a transactional id's producer needs
WRITE on that id; an idempotent producer id is bound to the principal it was issued to,
:mod:`.producer_ids`, so the check holds after restarts and fail-overs without a table);
DescribeGroups and OffsetFetch show member ids only to principals with READ on the group
(the coordinator's own member ids are ``secrets.token_urlsafe``, transaction numbers random
62-bit values).

Thread-safety: the checks run on the event loop; the authorizer is replaced whole on a
change (never mutated), so a check sees one consistent set; the producer check runs on the
I/O pool and only reads.
"""

from __future__ import annotations

import asyncio
import logging
import os
import secrets
from collections.abc import Awaitable, Callable, Iterable, Sequence
from typing import TYPE_CHECKING, Any

from logstore.broker.config import BrokerConfig
from logstore.broker.security.acl_store import AclStore, EtcdAclStore, FileAclStore
from logstore.broker.security.acls import CLUSTER_NAME, AclBinding, AclFilter, Authorizer
from logstore.broker.security.principal import Principal
from logstore.broker.security.producer_ids import ProducerIdBinder, is_bound, load_or_create_key
from logstore.errors import (
    AuthorizationError,
    ClusterAuthorizationError,
    GroupAuthorizationError,
    LogstoreError,
    SecurityDisabledError,
    TopicAuthorizationError,
    TransactionalIdAuthorizationError,
)
from logstore.record import BatchHeader

if TYPE_CHECKING:
    from replication.metadata_store import MetadataStore

__all__ = ["Authorization"]

log = logging.getLogger("logstore.broker")

_ERRORS: dict[str, type[AuthorizationError]] = {
    "TOPIC": TopicAuthorizationError,
    "GROUP": GroupAuthorizationError,
    "TRANSACTIONAL_ID": TransactionalIdAuthorizationError,
    "CLUSTER": ClusterAuthorizationError,
}
_KIND = {"TOPIC": "topic", "GROUP": "group", "TRANSACTIONAL_ID": "transactional id", "CLUSTER": "the cluster"}


def _is_internal(topic: str) -> bool:
    return topic.startswith("__")


class Authorization:
    """The authorizer's answers and the ACLs it answers from; see the module docstring.
    ``caller(context)`` is the call's principal (:meth:`.callers.Callers.caller`);
    ``transactional_id_of(producer_id)`` the transactional id the transaction coordinator
    knows for a producer id (None: not one it knows)."""

    def __init__(self, config: BrokerConfig, *, caller: Callable[[Any], Principal],
                 run_io: Callable[..., Awaitable[Any]],
                 transactional_id_of: Callable[[int], str | None]) -> None:
        self.config = config
        self._caller = caller
        self._run_io = run_io
        self._transactional_id_of = transactional_id_of
        self.authorizer: Authorizer | None = (
            Authorizer(frozenset(), frozenset(config.super_users), config.allow_everyone_if_no_acl_found)
            if config.authorizer else None)
        self._acl_store: AclStore | None = None
        self._acl_watch: asyncio.Task[None] | None = None
        # Binds idempotent producer ids to principals; loaded with the ACLs (authorizer on).
        self._producer_ids: ProducerIdBinder | None = None

    async def load(self) -> None:
        """A single broker's ACLs: read the ACL file before serving (a cluster's broker calls
        :meth:`follow` instead)."""
        if self.authorizer is None:
            return
        self._producer_ids = ProducerIdBinder(
            await self._run_io(load_or_create_key, os.path.join(self.config.data_dir, "meta")))
        store = FileAclStore(self.config.data_dir, self._run_io)
        self._acl_store = store
        self.set_acls(await store.load())

    async def follow(self, metadata: MetadataStore | None) -> None:
        """A cluster (``metadata``: its store; None on a single broker): apply the ACLs in etcd
        now, and every change from then on."""
        if self.authorizer is None or metadata is None:
            return
        self._producer_ids = ProducerIdBinder(
            await metadata.shared_secret("producer-id-key", secrets.token_bytes(32)))
        store = EtcdAclStore(metadata)
        self._acl_store = store
        first = asyncio.get_running_loop().create_future()

        async def follow() -> None:
            while True:
                try:
                    async for acls in store.watch():
                        self.set_acls(acls)
                        if not first.done():
                            first.set_result(None)
                except asyncio.CancelledError:
                    raise
                except Exception as e:  # noqa: BLE001 - keep the last good set and retry
                    log.error("cannot apply the ACLs from etcd (the previous set stays): %s", e)
                    await asyncio.sleep(1)
        self._acl_watch = asyncio.create_task(follow())
        await asyncio.wait_for(first, timeout=30)

    async def stop(self) -> None:
        if self._acl_watch is not None:
            self._acl_watch.cancel()
            await asyncio.gather(self._acl_watch, return_exceptions=True)

    async def delete_matching(self, filters: Sequence[AclFilter | LogstoreError]) -> dict[int, list[AclBinding]]:
        """Delete the ACLs each filter matches, in one change of the store (a filter that is an
        error matches nothing); returns, per filter index, what it deleted (sorted)."""
        deleted: dict[int, list[AclBinding]] = {}

        def change(old: frozenset[AclBinding]) -> frozenset[AclBinding]:
            deleted.clear()  # the store may call it again after a concurrent change
            for i, flt in enumerate(filters):
                if isinstance(flt, AclFilter):
                    deleted[i] = sorted(a for a in old if flt.matches(a))
            return old - {a for found in deleted.values() for a in found}
        self.set_acls(await self.acl_store().update(change))
        return deleted

    def set_acls(self, acls: frozenset[AclBinding]) -> None:
        assert self.authorizer is not None
        self.authorizer = self.authorizer.with_acls(acls)
        log.info("authorizer: %d ACLs in effect", len(acls))

    # ------------------------------------------------------------------ checks

    def principal(self, context: Any) -> Principal | None:
        """The caller, when the authorizer is on (None: every check passes)."""
        return None if self.authorizer is None else self._caller(context)

    def allowed(self, principal: Principal | None, operation: str, resource_type: str, name: str) -> bool:
        """Whether ``principal`` may; internal topics only for super users."""
        authz = self.authorizer
        if principal is None or authz is None:
            return True
        if resource_type == "TOPIC" and _is_internal(name):
            return principal.name in authz.super_users
        return authz.authorize(principal.name, principal.host, operation, resource_type, name)

    def check(self, principal: Principal | None, operation: str, resource_type: str, name: str = CLUSTER_NAME) -> None:
        """Raise the resource type's ``*_AUTHORIZATION_FAILED`` unless :meth:`allowed`."""
        if not self.allowed(principal, operation, resource_type, name):
            assert principal is not None
            what = _KIND[resource_type] if resource_type == "CLUSTER" else f"{_KIND[resource_type]} {name!r}"
            raise _ERRORS[resource_type](
                f"{principal.name} is not authorized to {operation} {what}: no ACL allows it, or one "
                "denies it (logstore acls create ... grants it)")

    def check_topics(self, principal: Principal | None, operation: str, topics: Iterable[str]) -> None:
        for topic in dict.fromkeys(topics):
            self.check(principal, operation, "TOPIC", topic)

    def allowed_some_topic(self, principal: Principal | None, operation: str) -> bool:
        """Whether some topic allows ``operation`` (Kafka's authorizeByResourceType)."""
        authz = self.authorizer
        if principal is None or authz is None:
            return True
        return principal.name in authz.super_users or any(
            self.allowed(principal, operation, "TOPIC", a.resource_name)
            for a in authz.acls if a.resource_type == "TOPIC" and a.permission == "ALLOW"
            and a.operation in (operation, "ALL") and a.principal in (principal.name, "User:*")
            and a.host in (principal.host, "*"))

    def check_prefix(self, principal: Principal | None, operation: str, resource_type: str, prefix: str) -> None:
        """Raise unless every name starting with ``prefix`` is allowed: a super user, or an ALLOW
        that covers the whole prefix (LITERAL '*' or PREFIXED on a prefix of it) and no DENY of
        the principal on any name the prefix covers."""
        authz = self.authorizer
        if principal is None or authz is None or principal.name in authz.super_users:
            return
        mine = [a for a in authz.acls if a.resource_type == resource_type
                and a.principal in (principal.name, "User:*") and a.host in (principal.host, "*")]
        denied = any(a.permission == "DENY" and a.operation in (operation, "ALL") and (
            a.resource_name == "*" or a.resource_name.startswith(prefix)
            or (a.pattern_type == "PREFIXED" and prefix.startswith(a.resource_name))) for a in mine)
        covered = any(a.permission == "ALLOW" and a.operation in (operation, "ALL") and (
            (a.pattern_type == "LITERAL" and a.resource_name == "*")
            or (a.pattern_type == "PREFIXED" and prefix.startswith(a.resource_name))) for a in mine)
        if denied or not covered:
            raise _ERRORS[resource_type](
                f"{principal.name} is not authorized to {operation} every {_KIND[resource_type]} starting "
                f"with {prefix!r}: that needs a PREFIXED (or '*') ACL covering the prefix")

    # ------------------------------------------------------------------ producer ids

    def issue_producer_id(self, producer_id: int, principal: Principal | None) -> int:
        """The idempotent producer id to hand ``principal`` for the coordinator's ``producer_id``:
        bound to it (:mod:`.producer_ids`) when the authorizer is on, else unchanged. An id that
        is already bound (an epoch bump of an existing producer) must be the caller's own."""
        binder = self._producer_ids
        if principal is None or binder is None:
            return producer_id
        if is_bound(producer_id):
            if not binder.issued_to(producer_id, principal.name):
                raise ClusterAuthorizationError(
                    f"{principal.name} may not use producer id {producer_id}: it was issued to another "
                    "principal (producer ids are not credentials)")
            return producer_id
        return binder.bind(producer_id, principal.name)

    def producer_check(self, principal: Principal | None) -> Callable[[BatchHeader], None] | None:
        """What a produce's batches with a producer id must pass (None: nothing, authorizer off).

        A producer id is not a credential (issues 12 and 22):

        * a non-transactional batch must carry an idempotent id issued to the caller (bound to
          its principal, checked with the cluster's key: the same answer on every broker, after
          any restart or fail-over). A transactional id's producer id, one this broker never
          issued, or another principal's is refused, so nobody can fence another's producer
          or break its sequence;
        * a transactional batch must not carry an idempotent (bound) id, and the caller needs
          WRITE on the transactional id of its producer id when this broker's coordinator knows
          it; one it does not know is refused (INVALID_TXN_STATE) on a single broker, and on a
          cluster its coordinator confirms the transaction before the partition takes it
          (:mod:`logstore.broker.transactions.verifier`; the Produce's transactional id, on
          which the caller needs WRITE, names that coordinator).

        Super users are not checked. Runs on the I/O pool: it reads the coordinator (locked),
        the authorizer (replaced whole, never mutated) and the binder (immutable).
        """
        binder = self._producer_ids
        if (principal is None or self.authorizer is None or binder is None
                or principal.name in self.authorizer.super_users):
            return None

        def check(h: BatchHeader) -> None:
            pid = h.producer_id
            if h.is_transactional:
                if is_bound(pid):
                    raise ClusterAuthorizationError(
                        f"producer id {pid} is an idempotent producer's: a transactional batch cannot use it")
                txn_id = self._transactional_id_of(pid)
                if txn_id is not None:
                    self.check(principal, "WRITE", "TRANSACTIONAL_ID", txn_id)
                return
            if binder.issued_to(pid, principal.name):
                return
            if is_bound(pid):
                why = "it was issued to another principal"
            elif self._transactional_id_of(pid) is not None:
                why = "it belongs to a transactional id and acts only through it (in a transaction)"
            else:
                why = "it was not issued to this principal (ask InitProducerId for one)"
            raise ClusterAuthorizationError(
                f"{principal.name} may not produce as producer id {pid}: {why}; producer ids are not credentials")
        return check

    def acl_store(self) -> AclStore:
        if self.authorizer is None or self._acl_store is None:
            raise SecurityDisabledError(
                "this broker has no authorizer: start it with authorizer = true (or --authorizer) to use ACLs")
        return self._acl_store
