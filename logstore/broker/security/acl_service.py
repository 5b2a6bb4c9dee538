"""Authorization on the broker: the ACL RPCs and the one check every handler makes.

:class:`AclService` is a mixin of :class:`logstore.broker.service.Broker`. With
``authorizer`` off (the default) :attr:`AclService.authorizer` is None: every
check passes without looking at the caller, as before issue 12, and the ACL
RPCs answer SECURITY_DISABLED. With it on, the ACLs are loaded before the
broker serves (single broker: ``<data_dir>/meta/acls.json``) or followed in
etcd (a cluster: every broker applies a change when etcd reports it), see
:mod:`.acl_store`; the decision is :meth:`.acls.Authorizer.authorize`.

What each RPC needs is :data:`RPC_AUTHORIZATION` (Kafka's table; a test checks
that it names every RPC of the service). Handlers ask :meth:`_principal` for
the caller once, then :meth:`_check` (raise the resource type's
``*_AUTHORIZATION_FAILED``) or :meth:`_allowed` (filter, as Metadata leaves out
the topics the caller may not describe). The RPCs whose only check is on the
cluster resource are wrapped at registration (:func:`guard_cluster_rpcs`), so
they are checked before their handler runs, whoever wrote it.

Internal topics (names starting with ``__``: ``__consumer_offsets``, the
transaction decisions) are the broker's own state: only super users may touch
them through an RPC, whatever the ACLs say; the coordinators write them inside
the broker, unchecked.

Capabilities (issue 12): ids a client holds are not credentials. A produce's
batches with a producer id pass :meth:`AclService._producer_check` (a
transactional id's producer needs WRITE on that id; an idempotent producer id
is bound to the principal it was issued to, :mod:`.producer_ids`, so the check
holds after restarts and fail-overs without a table); DescribeGroups and OffsetFetch show member ids only
to principals with READ on the group (the coordinator's own member ids are
``secrets.token_urlsafe``, transaction numbers random 62-bit values).

Thread-safety: handlers run on the event loop; the authorizer is replaced
whole on a change (never mutated), so a check sees one consistent set; the
producer check runs on the I/O pool and only reads.
"""

from __future__ import annotations

import asyncio
import logging
import os
import secrets
from collections.abc import Awaitable, Callable, Iterable
from typing import TYPE_CHECKING, Any, TypeVar

import grpc

from logstore._proto import logstore_pb2 as pb
from logstore.broker.answers import OK, error_to_pb
from logstore.broker.security.acl_store import AclStore, EtcdAclStore, FileAclStore
from logstore.broker.security.acls import CLUSTER_NAME, AclBinding, AclFilter, Authorizer
from logstore.broker.security.principal import Principal
from logstore.broker.security.producer_ids import ProducerIdBinder, is_bound, load_or_create_key
from logstore.errors import (
    WIRE_CODE_KEY,
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
    from logstore.broker.config import BrokerConfig
    from logstore.broker.membership import ClusterMembership

__all__ = ["AclService", "RPC_AUTHORIZATION", "CLUSTER_RPCS", "guard_cluster_rpcs"]

log = logging.getLogger("logstore.broker")
T = TypeVar("T")

# Every RPC and what it needs (operation on resource), as Kafka's authorizer. "or" = either
# suffices; "per item" = an unauthorized item gets the error in its answer, the rest is served.
RPC_AUTHORIZATION: dict[str, str] = {
    "CreateTopics": "CREATE on the Cluster or CREATE on the Topic (per item)",
    "DeleteTopics": "DELETE on the Topic (per item)",
    "CreatePartitions": "ALTER on the Topic (per item)",
    "Metadata": "DESCRIBE on the Topic (unauthorized topics are left out of a listing; named: per item)",
    "DescribeConfigs": "DESCRIBE_CONFIGS on the Topic (per item)",
    "AlterConfigs": "ALTER_CONFIGS on the Topic (per item)",
    "Produce": "WRITE on every Topic; WRITE on the TransactionalId when the request names one",
    "Fetch": "READ on every Topic; a replica fetch (replica_id set): CLUSTER_ACTION on the Cluster",
    "ListOffsets": "DESCRIBE on the Topic (per item)",
    "DeleteRecords": "DELETE on the Topic (per item)",
    "OffsetsForLeaderEpoch": "CLUSTER_ACTION on the Cluster",
    "DescribeCleaning": "DESCRIBE on the Topic (a listing leaves the others out; named: per item)",
    "ReplaceSegments": "ALTER on the Topic (the compaction job's segment swap)",
    "InitProducerId": "WRITE on the TransactionalId; idempotent: IDEMPOTENT_WRITE on the Cluster or "
                      "WRITE on some Topic",
    "AddPartitionsToTxn": "WRITE on the TransactionalId and WRITE on every Topic; verify_only (a partition "
                          "leader asking the coordinator): CLUSTER_ACTION on the Cluster",
    "EndTxn": "WRITE on the TransactionalId",
    "EndTxnGroup": "WRITE on the group's TransactionalId, on every transaction's, and on every "
                   "TransactionalId the abort prefix covers (a PREFIXED or '*' ACL)",
    "DescribeTxnGroup": "DESCRIBE on the group's TransactionalId",
    "ConsumerGroupHeartbeat": "READ on the Group",
    "OffsetCommit": "READ on the Group and READ on every Topic",
    "OffsetFetch": "DESCRIBE on the Group; partitions of topics without DESCRIBE are left out",
    "ListGroups": "DESCRIBE on the Cluster, or DESCRIBE on each Group listed (the others are left out)",
    "DescribeGroups": "DESCRIBE on the Group (per item); member ids only with READ on the Group",
    "DeleteGroups": "DELETE on the Group (per item)",
    "SaslAuthenticate": "none: it is the authentication",
    "AlterUserScramCredentials": "ALTER on the Cluster",
    "DescribeUserScramCredentials": "DESCRIBE on the Cluster",
    "CreateAcls": "ALTER on the Cluster",
    "DescribeAcls": "DESCRIBE on the Cluster",
    "DeleteAcls": "ALTER on the Cluster",
    "FindCoordinator": "DESCRIBE on the Group or the TransactionalId (per item)",
    "WriteTxnMarkers": "CLUSTER_ACTION on the Cluster (brokers only)",
    "AlterPartitionReassignments": "ALTER on the Cluster",
    "ListPartitionReassignments": "DESCRIBE on the Cluster",
    "ElectLeaders": "ALTER on the Cluster",
}

# RPCs checked on the cluster resource before their handler runs (guard_cluster_rpcs).
CLUSTER_RPCS: dict[str, str] = {
    "OffsetsForLeaderEpoch": "CLUSTER_ACTION",
    "AlterUserScramCredentials": "ALTER",
    "DescribeUserScramCredentials": "DESCRIBE",
    "CreateAcls": "ALTER",
    "DescribeAcls": "DESCRIBE",
    "DeleteAcls": "ALTER",
    "WriteTxnMarkers": "CLUSTER_ACTION",
    "AlterPartitionReassignments": "ALTER",
    "ListPartitionReassignments": "DESCRIBE",
    "ElectLeaders": "ALTER",
}

_ERRORS: dict[str, type[AuthorizationError]] = {
    "TOPIC": TopicAuthorizationError,
    "GROUP": GroupAuthorizationError,
    "TRANSACTIONAL_ID": TransactionalIdAuthorizationError,
    "CLUSTER": ClusterAuthorizationError,
}
_KIND = {"TOPIC": "topic", "GROUP": "group", "TRANSACTIONAL_ID": "transactional id", "CLUSTER": "the cluster"}


def _is_internal(topic: str) -> bool:
    return topic.startswith("__")


class AclService:
    """Authorization (mixed into the broker); see the module docstring."""

    if TYPE_CHECKING:
        config: BrokerConfig
        cluster: ClusterMembership
        def _transactional_id_of(self, producer_id: int) -> str | None: ...

        def caller(self, context: Any) -> Principal: ...
        async def _run(self, fn: Callable[..., T], *args: Any) -> T: ...
        async def _guard(self, what: str, context: grpc.aio.ServicerContext,
                         body: Callable[[], Awaitable[T]]) -> T: ...

    def _init_acls(self) -> None:
        cfg = self.config
        self.authorizer: Authorizer | None = (
            Authorizer(frozenset(), frozenset(cfg.super_users), cfg.allow_everyone_if_no_acl_found)
            if cfg.authorizer else None)
        self._acl_store: AclStore | None = None
        self._acl_watch: asyncio.Task[None] | None = None
        # Binds idempotent producer ids to principals; loaded with the ACLs (authorizer on).
        self._producer_ids: ProducerIdBinder | None = None

    async def _load_acls(self) -> None:
        """Single broker: read the ACL file before serving (a cluster follows etcd instead)."""
        if self.authorizer is None or self.config.clustered:
            return
        self._producer_ids = ProducerIdBinder(
            await self._run(load_or_create_key, os.path.join(self.config.data_dir, "meta")))
        store = FileAclStore(self.config.data_dir, self._run)
        self._acl_store = store
        self._set_acls(await store.load())

    async def _follow_acls(self) -> None:
        """A cluster: apply the ACLs in etcd now, and every change from then on."""
        if self.authorizer is None or self.cluster.store is None:
            return
        self._producer_ids = ProducerIdBinder(
            await self.cluster.store.shared_secret("producer-id-key", secrets.token_bytes(32)))
        store = EtcdAclStore(self.cluster.store)
        self._acl_store = store
        first = asyncio.get_running_loop().create_future()

        async def follow() -> None:
            while True:
                try:
                    async for acls in store.watch():
                        self._set_acls(acls)
                        if not first.done():
                            first.set_result(None)
                except asyncio.CancelledError:
                    raise
                except Exception as e:  # noqa: BLE001 - keep the last good set and retry
                    log.error("cannot apply the ACLs from etcd (the previous set stays): %s", e)
                    await asyncio.sleep(1)
        self._acl_watch = asyncio.create_task(follow())
        await asyncio.wait_for(first, timeout=30)

    async def _stop_acls(self) -> None:
        if self._acl_watch is not None:
            self._acl_watch.cancel()
            await asyncio.gather(self._acl_watch, return_exceptions=True)

    def _set_acls(self, acls: frozenset[AclBinding]) -> None:
        assert self.authorizer is not None
        self.authorizer = self.authorizer.with_acls(acls)
        log.info("authorizer: %d ACLs in effect", len(acls))

    # ------------------------------------------------------------------ checks

    def _principal(self, context: Any) -> Principal | None:
        """The caller, when the authorizer is on (None: every check passes)."""
        return None if self.authorizer is None else self.caller(context)

    def _allowed(self, principal: Principal | None, operation: str, resource_type: str, name: str) -> bool:
        """Whether ``principal`` may; internal topics only for super users."""
        authz = self.authorizer
        if principal is None or authz is None:
            return True
        if resource_type == "TOPIC" and _is_internal(name):
            return principal.name in authz.super_users
        return authz.authorize(principal.name, principal.host, operation, resource_type, name)

    def _check(self, principal: Principal | None, operation: str, resource_type: str, name: str = CLUSTER_NAME) -> None:
        """Raise the resource type's ``*_AUTHORIZATION_FAILED`` unless :meth:`_allowed`."""
        if not self._allowed(principal, operation, resource_type, name):
            assert principal is not None
            what = _KIND[resource_type] if resource_type == "CLUSTER" else f"{_KIND[resource_type]} {name!r}"
            raise _ERRORS[resource_type](
                f"{principal.name} is not authorized to {operation} {what}: no ACL allows it, or one "
                "denies it (logstore acls create ... grants it)")

    def _check_topics(self, principal: Principal | None, operation: str, topics: Iterable[str]) -> None:
        for topic in dict.fromkeys(topics):
            self._check(principal, operation, "TOPIC", topic)

    def _allowed_some_topic(self, principal: Principal | None, operation: str) -> bool:
        """Whether some topic allows ``operation`` (Kafka's authorizeByResourceType)."""
        authz = self.authorizer
        if principal is None or authz is None:
            return True
        return principal.name in authz.super_users or any(
            self._allowed(principal, operation, "TOPIC", a.resource_name)
            for a in authz.acls if a.resource_type == "TOPIC" and a.permission == "ALLOW"
            and a.operation in (operation, "ALL") and a.principal in (principal.name, "User:*")
            and a.host in (principal.host, "*"))

    def _check_prefix(self, principal: Principal | None, operation: str, resource_type: str, prefix: str) -> None:
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

    def _issue_producer_id(self, producer_id: int, principal: Principal | None) -> int:
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

    def _producer_check(self, principal: Principal | None) -> Callable[[BatchHeader], None] | None:
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
                    self._check(principal, "WRITE", "TRANSACTIONAL_ID", txn_id)
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

    # ------------------------------------------------------------------ the ACL RPCs

    def _acl_store_or_raise(self) -> AclStore:
        if self.authorizer is None or self._acl_store is None:
            raise SecurityDisabledError(
                "this broker has no authorizer: start it with authorizer = true (or --authorizer) to use ACLs")
        return self._acl_store

    async def CreateAcls(self, request: pb.CreateAclsRequest, context: grpc.aio.ServicerContext) -> pb.CreateAclsResponse:
        async def body() -> pb.CreateAclsResponse:
            store = self._acl_store_or_raise()
            results: list[pb.Error] = []
            new: list[AclBinding] = []
            for b in request.creations:
                try:
                    new.append(binding_from_pb(b))
                    results.append(OK)
                except LogstoreError as e:
                    results.append(error_to_pb(e))
            if new:
                self._set_acls(await store.update(lambda old: old | frozenset(new)))
            return pb.CreateAclsResponse(results=results)
        return await self._guard("CreateAcls", context, body)

    async def DescribeAcls(self, request: pb.DescribeAclsRequest, context: grpc.aio.ServicerContext) -> pb.DescribeAclsResponse:
        async def body() -> pb.DescribeAclsResponse:
            store = self._acl_store_or_raise()
            flt = filter_from_pb(request.filter)
            acls = await store.load()
            return pb.DescribeAclsResponse(acls=[binding_to_pb(a) for a in sorted(acls) if flt.matches(a)])
        return await self._guard("DescribeAcls", context, body)

    async def DeleteAcls(self, request: pb.DeleteAclsRequest, context: grpc.aio.ServicerContext) -> pb.DeleteAclsResponse:
        async def body() -> pb.DeleteAclsResponse:
            store = self._acl_store_or_raise()
            filters: list[AclFilter | LogstoreError] = []
            for f in request.filters:
                try:
                    filters.append(filter_from_pb(f))
                except LogstoreError as e:
                    filters.append(e)
            deleted: dict[int, list[AclBinding]] = {}

            def change(old: frozenset[AclBinding]) -> frozenset[AclBinding]:
                deleted.clear()
                for i, flt in enumerate(filters):
                    if isinstance(flt, AclFilter):
                        deleted[i] = sorted(a for a in old if flt.matches(a))
                gone = {a for found in deleted.values() for a in found}
                return old - gone
            self._set_acls(await store.update(change))
            results = [pb.DeleteAclsFilterResult(error=error_to_pb(f)) if isinstance(f, LogstoreError)
                       else pb.DeleteAclsFilterResult(deleted=[binding_to_pb(a) for a in deleted.get(i, [])])
                       for i, f in enumerate(filters)]
            return pb.DeleteAclsResponse(results=results)
        return await self._guard("DeleteAcls", context, body)


def binding_from_pb(b: pb.AclBinding) -> AclBinding:
    return AclBinding.create(resource_type=b.resource_type, resource_name=b.resource_name,
                             pattern_type=b.pattern_type or "LITERAL", principal=b.principal,
                             host=b.host or "*", operation=b.operation, permission=b.permission_type or "ALLOW")


def binding_to_pb(a: AclBinding) -> pb.AclBinding:
    return pb.AclBinding(resource_type=a.resource_type, resource_name=a.resource_name,
                         pattern_type=a.pattern_type, principal=a.principal, host=a.host,
                         operation=a.operation, permission_type=a.permission)


def filter_from_pb(b: pb.AclBinding) -> AclFilter:
    return AclFilter.create(resource_type=b.resource_type, resource_name=b.resource_name,
                            pattern_type=b.pattern_type, principal=b.principal, host=b.host,
                            operation=b.operation, permission=b.permission_type)


def guard_cluster_rpcs(broker: AclService, handlers: dict[str, Any]) -> None:
    """Wrap the handlers of :data:`CLUSTER_RPCS` with their check on the cluster resource:
    a refused call ends with PERMISSION_DENIED and CLUSTER_AUTHORIZATION_FAILED before
    its request is even parsed."""
    for name, operation in CLUSTER_RPCS.items():
        handler = handlers.get(name)
        if handler is None or handler.unary_unary is None:
            continue
        handlers[name] = handler._replace(unary_unary=_checked(broker, name, operation, handler.unary_unary))


def _checked(broker: AclService, name: str, operation: str,
             inner: Callable[[bytes, grpc.aio.ServicerContext], Awaitable[Any]]
             ) -> Callable[[bytes, grpc.aio.ServicerContext], Awaitable[Any]]:
    async def handle(data: bytes, context: grpc.aio.ServicerContext) -> Any:
        if broker.authorizer is not None:
            try:
                broker._check(broker._principal(context), operation, "CLUSTER")
            except LogstoreError as e:
                status = (grpc.StatusCode.PERMISSION_DENIED if isinstance(e, AuthorizationError)
                          else grpc.StatusCode.UNAUTHENTICATED)
                context.set_trailing_metadata(((WIRE_CODE_KEY, e.code),))
                await context.abort(status, e.message)
        return await inner(data, context)
    return handle
