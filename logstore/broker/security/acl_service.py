"""The ACL RPCs (CreateAcls, DescribeAcls, DeleteAcls), what every RPC needs of the authorizer,
and the cluster-resource check made before a handler runs.

:class:`AclRpcs` is a handler the broker composes from its
:class:`~.authorization.Authorization` (the ACLs and the checks) and the
:class:`~logstore.broker.rpc_errors.Guard`. What each RPC needs is :data:`RPC_AUTHORIZATION`
(Kafka's table; a test checks that it names every RPC of the service). The RPCs whose only
check is on the cluster resource are wrapped at registration (:func:`guard_cluster_rpcs`),
so they are checked before their handler runs, whoever wrote it.

Thread-safety: handlers run on the event loop.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from typing import Any

import grpc

from logstore._proto import logstore_pb2 as pb
from logstore.broker.rpc_errors import OK, Guard, error_to_pb
from logstore.broker.security.acls import AclBinding, AclFilter
from logstore.broker.security.authorization import Authorization
from logstore.errors import WIRE_CODE_KEY, AuthorizationError, LogstoreError

__all__ = ["AclRpcs", "RPC_AUTHORIZATION", "CLUSTER_RPCS", "guard_cluster_rpcs"]


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
    "ProduceStream": "as Produce, for each request of the stream (its answer carries the refusal)",
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

class AclRpcs:
    """The ACL RPCs; see the module docstring."""

    def __init__(self, *, authorization: Authorization, guard: Guard) -> None:
        self._authorization = authorization
        self._guard = guard

    def rpcs(self) -> dict[str, Callable[..., Awaitable[Any]]]:
        """The RPCs this handler implements, by name."""
        return {"CreateAcls": self.CreateAcls, "DescribeAcls": self.DescribeAcls, "DeleteAcls": self.DeleteAcls}

    async def CreateAcls(self, request: pb.CreateAclsRequest, context: grpc.aio.ServicerContext) -> pb.CreateAclsResponse:
        async def body() -> pb.CreateAclsResponse:
            store = self._authorization.acl_store()
            results: list[pb.Error] = []
            new: list[AclBinding] = []
            for b in request.creations:
                try:
                    new.append(binding_from_pb(b))
                    results.append(OK)
                except LogstoreError as e:
                    results.append(error_to_pb(e))
            if new:
                self._authorization.set_acls(await store.update(lambda old: old | frozenset(new)))
            return pb.CreateAclsResponse(results=results)
        return await self._guard.guard("CreateAcls", context, body)

    async def DescribeAcls(self, request: pb.DescribeAclsRequest, context: grpc.aio.ServicerContext) -> pb.DescribeAclsResponse:
        async def body() -> pb.DescribeAclsResponse:
            store = self._authorization.acl_store()
            flt = filter_from_pb(request.filter)
            acls = await store.load()
            return pb.DescribeAclsResponse(acls=[binding_to_pb(a) for a in sorted(acls) if flt.matches(a)])
        return await self._guard.guard("DescribeAcls", context, body)

    async def DeleteAcls(self, request: pb.DeleteAclsRequest, context: grpc.aio.ServicerContext) -> pb.DeleteAclsResponse:
        async def body() -> pb.DeleteAclsResponse:
            filters: list[AclFilter | LogstoreError] = []
            for f in request.filters:
                try:
                    filters.append(filter_from_pb(f))
                except LogstoreError as e:
                    filters.append(e)
            deleted = await self._authorization.delete_matching(filters)
            results = [pb.DeleteAclsFilterResult(error=error_to_pb(f)) if isinstance(f, LogstoreError)
                       else pb.DeleteAclsFilterResult(deleted=[binding_to_pb(a) for a in deleted.get(i, [])])
                       for i, f in enumerate(filters)]
            return pb.DeleteAclsResponse(results=results)
        return await self._guard.guard("DeleteAcls", context, body)


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


def guard_cluster_rpcs(authorization: Authorization, handlers: dict[str, Any]) -> None:
    """Wrap the handlers of :data:`CLUSTER_RPCS` with their check on the cluster resource:
    a refused call ends with PERMISSION_DENIED and CLUSTER_AUTHORIZATION_FAILED before
    its request is even parsed."""
    for name, operation in CLUSTER_RPCS.items():
        handler = handlers.get(name)
        if handler is None or handler.unary_unary is None:
            continue
        handlers[name] = handler._replace(unary_unary=_checked(authorization, name, operation, handler.unary_unary))


def _checked(authorization: Authorization, name: str, operation: str,
             inner: Callable[[bytes, grpc.aio.ServicerContext], Awaitable[Any]]
             ) -> Callable[[bytes, grpc.aio.ServicerContext], Awaitable[Any]]:
    async def handle(data: bytes, context: grpc.aio.ServicerContext) -> Any:
        if authorization.authorizer is not None:
            try:
                authorization.check(authorization.principal(context), operation, "CLUSTER")
            except LogstoreError as e:
                status = (grpc.StatusCode.PERMISSION_DENIED if isinstance(e, AuthorizationError)
                          else grpc.StatusCode.UNAUTHENTICATED)
                context.set_trailing_metadata(((WIRE_CODE_KEY, e.code),))
                await context.abort(status, e.message)
        return await inner(data, context)
    return handle
