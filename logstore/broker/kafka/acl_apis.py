"""The Kafka admin APIs of ACLs: what ``kafka-acls.sh`` and ``AdminClient.create_acls`` /
``describe_acls`` / ``delete_acls`` call, on the broker's one set of ACLs.

The ACLs are the authorizer's (:class:`~logstore.broker.security.authorization.Authorization`:
the data dir's ``meta/acls.json`` on a single broker, etcd on a cluster), the same that
``logstore acls`` and the gRPC ACL RPCs change, in Kafka's model (:mod:`logstore.acl`):

=================  ========  ===================================================
API (key)          versions  notes
=================  ========  ===================================================
DescribeAcls (29)  1-3       DESCRIBE on the cluster; the bindings a filter
                             matches (ANY, and MATCH as Kafka's), by resource
CreateAcls (30)    1-3       ALTER on the cluster; an invalid binding (a resource
                             type other than TOPIC, GROUP, CLUSTER and
                             TRANSACTIONAL_ID, a bad principal or host) is
                             refused per item with INVALID_REQUEST
DeleteAcls (31)    1-3       ALTER on the cluster; each filter's deleted bindings
=================  ========  ===================================================

Kafka's numeric codes (ResourceType, PatternType, AclOperation, AclPermissionType) are
mapped to our names here. Without the authorizer every call answers SECURITY_DISABLED (54);
without the cluster permission CLUSTER_AUTHORIZATION_FAILED (31), as Kafka's.

Thread-safety: event loop only; the ACL store's file or etcd work is its own.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from typing import TYPE_CHECKING, Any

from kio.schema.errors import ErrorCode

from logstore.acl import AclBinding, AclFilter
from logstore.broker.kafka.error_codes import kafka_error_code
from logstore.broker.kafka.messages import NO_THROTTLE, build, nested, response_of
from logstore.broker.kafka.request_context import RequestContext
from logstore.errors import InvalidRequestError, LogstoreError

if TYPE_CHECKING:
    from logstore.broker.security.authorization import Authorization

__all__ = ["ACL_APIS", "KafkaAclApis"]

DESCRIBE_ACLS, CREATE_ACLS, DELETE_ACLS = 29, 30, 31
ACL_APIS: dict[int, tuple[int, int]] = {DESCRIBE_ACLS: (1, 3), CREATE_ACLS: (1, 3), DELETE_ACLS: (1, 3)}
_ANY = 1  # every enum's ANY
_MATCH = 2  # PatternType.MATCH (filters only)
# Kafka's numeric codes and our names (logstore.acl).
RESOURCE_TYPES = {2: "TOPIC", 3: "GROUP", 4: "CLUSTER", 5: "TRANSACTIONAL_ID"}
PATTERN_TYPES = {3: "LITERAL", 4: "PREFIXED"}
OPERATIONS = {2: "ALL", 3: "READ", 4: "WRITE", 5: "CREATE", 6: "DELETE", 7: "ALTER", 8: "DESCRIBE",
              9: "CLUSTER_ACTION", 10: "DESCRIBE_CONFIGS", 11: "ALTER_CONFIGS", 12: "IDEMPOTENT_WRITE"}
PERMISSIONS = {2: "DENY", 3: "ALLOW"}
_CODES = {kind: {name: code for code, name in names.items()}
          for kind, names in (("resource", RESOURCE_TYPES), ("pattern", PATTERN_TYPES), ("operation", OPERATIONS),
                              ("permission", PERMISSIONS))}


def _name(kind: str, names: dict[int, str], code: int) -> str:
    try:
        return names[int(code)]
    except KeyError:
        raise InvalidRequestError(f"{kind} {code} is not one this broker's ACLs have "
                                  f"({', '.join(f'{c} {n}' for c, n in names.items())})") from None


def _filter_name(kind: str, names: dict[int, str], code: int, *, match: bool = False) -> str | None:
    """A filter's field: None for ANY, MATCH for a pattern type's MATCH, else the name."""
    if int(code) == _ANY:
        return None
    if match and int(code) == _MATCH:
        return "MATCH"
    return _name(kind, names, code)


class KafkaAclApis:
    """Answers the APIs of :data:`ACL_APIS`; see the module docstring. ``authorization`` holds
    the ACLs and answers the checks."""

    def __init__(self, *, authorization: Authorization) -> None:
        self._authorization = authorization

    def handlers(self) -> dict[int, Callable[[Any, RequestContext], Awaitable[Any]]]:
        return {DESCRIBE_ACLS: self._describe_acls, CREATE_ACLS: self._create_acls, DELETE_ACLS: self._delete_acls}

    def _refusal(self, context: RequestContext, operation: str) -> LogstoreError | None:
        """SECURITY_DISABLED without the authorizer, CLUSTER_AUTHORIZATION_FAILED without
        ``operation`` on the cluster; None: go ahead."""
        try:
            self._authorization.acl_store()
            self._authorization.check(context.principal, operation, "CLUSTER")
        except LogstoreError as e:
            return e
        return None

    async def _describe_acls(self, request: Any, context: RequestContext) -> Any:
        response_type = response_of(request)
        refusal = self._refusal(context, "DESCRIBE")
        try:
            if refusal is not None:
                raise refusal
            flt = _acl_filter(request)
            acls = sorted(a for a in await self._authorization.acl_store().load() if flt.matches(a))
        except LogstoreError as e:
            return build(response_type, throttle_time=NO_THROTTLE, error_code=kafka_error_code(e),
                         error_message=e.message, resources=())
        resource_type, description_type = nested(response_type, "DescribeAclsResource"), nested(
            response_type, "AclDescription")
        by_resource: dict[tuple[str, str, str], list[AclBinding]] = {}
        for a in acls:
            by_resource.setdefault((a.resource_type, a.resource_name, a.pattern_type), []).append(a)
        return build(response_type, throttle_time=NO_THROTTLE, error_code=ErrorCode.none, error_message=None,
                     resources=tuple(
                         resource_type(resource_type=_CODES["resource"][rtype], resource_name=name,
                                       pattern_type=_CODES["pattern"][ptype], acls=tuple(
                                           description_type(principal=a.principal, host=a.host,
                                                            operation=_CODES["operation"][a.operation],
                                                            permission_type=_CODES["permission"][a.permission])
                                           for a in bindings))
                         for (rtype, name, ptype), bindings in by_resource.items()))

    async def _create_acls(self, request: Any, context: RequestContext) -> Any:
        response_type = response_of(request)
        result_type = nested(response_type, "AclCreationResult")
        refusal = self._refusal(context, "ALTER")
        outcomes: list[LogstoreError | None] = []
        new: list[AclBinding] = []
        for c in request.creations:
            if refusal is not None:
                outcomes.append(refusal)
                continue
            try:
                new.append(AclBinding.create(
                    resource_type=_name("resource type", RESOURCE_TYPES, c.resource_type),
                    resource_name=c.resource_name,
                    pattern_type=_name("pattern type", PATTERN_TYPES, c.resource_pattern_type),
                    principal=c.principal, host=c.host, operation=_name("operation", OPERATIONS, c.operation),
                    permission=_name("permission type", PERMISSIONS, c.permission_type)))
                outcomes.append(None)
            except LogstoreError as e:
                outcomes.append(e)
        if new:
            try:
                store = self._authorization.acl_store()
                self._authorization.set_acls(await store.update(lambda old: old | frozenset(new)))
            except LogstoreError as e:  # the store could not take them: every creation failed
                outcomes = [o if o is not None else e for o in outcomes]
        return build(response_type, throttle_time=NO_THROTTLE, results=tuple(
            result_type(error_code=ErrorCode.none, error_message=None) if o is None
            else result_type(error_code=kafka_error_code(o), error_message=o.message) for o in outcomes))

    async def _delete_acls(self, request: Any, context: RequestContext) -> Any:
        response_type = response_of(request)
        result_type, matching_type = nested(response_type, "DeleteAclsFilterResult"), nested(
            response_type, "DeleteAclsMatchingAcl")
        refusal = self._refusal(context, "ALTER")
        filters: list[AclFilter | LogstoreError] = []
        for f in request.filters:
            try:
                filters.append(refusal if refusal is not None else _acl_filter(f))
            except LogstoreError as e:
                filters.append(e)
        deleted: dict[int, list[AclBinding]] = {}
        if any(isinstance(f, AclFilter) for f in filters):
            try:
                deleted = await self._authorization.delete_matching(filters)
            except LogstoreError as e:
                filters = [e] * len(filters)
        results = []
        for i, f in enumerate(filters):
            if isinstance(f, LogstoreError):
                results.append(result_type(error_code=kafka_error_code(f), error_message=f.message, matching_acls=()))
                continue
            results.append(result_type(error_code=ErrorCode.none, error_message=None, matching_acls=tuple(
                matching_type(error_code=ErrorCode.none, error_message=None,
                              resource_type=_CODES["resource"][a.resource_type], resource_name=a.resource_name,
                              pattern_type=_CODES["pattern"][a.pattern_type], principal=a.principal, host=a.host,
                              operation=_CODES["operation"][a.operation],
                              permission_type=_CODES["permission"][a.permission])
                for a in deleted.get(i, ()))))
        return build(response_type, throttle_time=NO_THROTTLE, filter_results=tuple(results))


def _acl_filter(f: Any) -> AclFilter:
    """DescribeAcls' request or one of DeleteAcls' filters as an :class:`AclFilter`."""
    return AclFilter.create(
        resource_type=_filter_name("resource type", RESOURCE_TYPES, f.resource_type_filter),
        resource_name=f.resource_name_filter,
        pattern_type=_filter_name("pattern type", PATTERN_TYPES, f.pattern_type_filter, match=True),
        principal=f.principal_filter, host=f.host_filter,
        operation=_filter_name("operation", OPERATIONS, f.operation),
        permission=_filter_name("permission type", PERMISSIONS, f.permission_type))
