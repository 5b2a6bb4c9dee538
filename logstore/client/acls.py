"""The ACL calls of the admin client (CreateAcls, DescribeAcls, DeleteAcls), Kafka's shape.

:class:`~logstore.client.admin.Admin` exposes them as ``create_acls``,
``describe_acls`` and ``delete_acls``; the values are
:class:`logstore.acl.AclBinding` and :class:`logstore.acl.AclFilter`. A broker
without an authorizer answers SECURITY_DISABLED; a caller without ALTER (or
DESCRIBE) on the cluster gets CLUSTER_AUTHORIZATION_FAILED.

Each function is handed the client's :class:`~logstore.client.transport.Transport`
(``BrokerClient.transport``): it sends its call through it.

Thread-safety: the functions are as thread-safe as the transport they are given.
"""

from __future__ import annotations

from collections.abc import Iterable

from logstore._proto import logstore_pb2 as pb
from logstore.acl import AclBinding, AclFilter
from logstore.client.error_mapping import about, error_from_item
from logstore.client.transport import Transport

__all__ = ["create_acls", "describe_acls", "delete_acls", "binding_to_pb", "binding_from_pb"]


def binding_to_pb(a: AclBinding) -> pb.AclBinding:
    return pb.AclBinding(resource_type=a.resource_type, resource_name=a.resource_name,
                         pattern_type=a.pattern_type, principal=a.principal, host=a.host,
                         operation=a.operation, permission_type=a.permission)


def binding_from_pb(b: pb.AclBinding) -> AclBinding:
    return AclBinding(b.resource_type, b.resource_name, b.pattern_type, b.principal, b.host,
                      b.operation, b.permission_type)


def filter_to_pb(f: AclFilter) -> pb.AclBinding:
    return pb.AclBinding(resource_type=f.resource_type or "", resource_name=f.resource_name or "",
                         pattern_type=f.pattern_type or "", principal=f.principal or "", host=f.host or "",
                         operation=f.operation or "", permission_type=f.permission or "")


def create_acls(transport: Transport, acls: Iterable[AclBinding]) -> None:
    """Create ``acls``; raise the first binding's error (the others are still created)."""
    acls = list(acls)
    r = transport.call("CreateAcls", pb.CreateAclsRequest(creations=[binding_to_pb(a) for a in acls]),
                        timeout_s=transport.deadline_s(None))
    for a, err in zip(acls, r.results, strict=False):
        e = error_from_item(err)
        if e is not None:
            raise about(e, f"ACL {a}")


def describe_acls(transport: Transport, acl_filter: AclFilter) -> list[AclBinding]:
    r = transport.call("DescribeAcls", pb.DescribeAclsRequest(filter=filter_to_pb(acl_filter)),
                        timeout_s=transport.deadline_s(None))
    e = error_from_item(r.error)
    if e is not None:
        raise e
    return [binding_from_pb(b) for b in r.acls]


def delete_acls(transport: Transport, filters: Iterable[AclFilter]) -> list[AclBinding]:
    """Delete every binding any of ``filters`` matches; return those deleted."""
    r = transport.call("DeleteAcls", pb.DeleteAclsRequest(filters=[filter_to_pb(f) for f in filters]),
                        timeout_s=transport.deadline_s(None))
    out: list[AclBinding] = []
    for result in r.results:
        e = error_from_item(result.error)
        if e is not None:
            raise e
        out.extend(binding_from_pb(b) for b in result.deleted)
    return out
