"""The Kafka admin APIs of consumer groups: ListGroups, DescribeGroups, DeleteGroups.

What ``kafka-consumer-groups.sh --list / --describe / --delete`` and ``AdminClient``'s
group calls need, answered from the group coordinator
(:class:`~logstore.broker.groups.coordinator.GroupCoordinator`) that also serves
logstore's own consumers, so a group shows the same whichever client joined it:

=================  ========  ==================================================
API (key)          versions  notes
=================  ========  ==================================================
DescribeGroups     0-5       state (Empty, Stable, Reconciling), the assignor as
(15)                         protocol data, each member's subscription and
                             assignment in Kafka's consumer protocol; an unknown
                             group is state Dead without an error, as Kafka's
ListGroups (16)    0-5       every group this broker coordinates, of type
                             ``consumer``; the state (v4) and type (v5) filters
DeleteGroups (42)  0-2       an empty group and its committed offsets
=================  ========  ==================================================

Authorization, as Kafka's: ListGroups lists every group to a caller with DESCRIBE on the
cluster, else the groups it may DESCRIBE; DescribeGroups needs DESCRIBE on each group
(GROUP_AUTHORIZATION_FAILED), and shows member ids only to a caller with READ on it too (as
the gRPC DescribeGroups: a member id is not a credential, but need not be handed out);
DeleteGroups needs DELETE on each group (GROUP_AUTHORIZATION_FAILED).

Thread-safety: event loop only; a deletion's file work runs on ``run_io``.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from typing import TYPE_CHECKING, Any

from kio.schema.errors import ErrorCode

from logstore.broker.kafka.classic_group_apis import assignment_bytes, subscription_bytes
from logstore.broker.kafka.error_codes import kafka_error_code
from logstore.broker.kafka.messages import NO_THROTTLE, answer_each, build, nested, response_of
from logstore.broker.kafka.request_context import RequestContext
from logstore.broker.security.acls import CLUSTER_NAME
from logstore.errors import GroupIdNotFoundError, LogstoreError

if TYPE_CHECKING:
    from logstore.broker.groups.coordinator import GroupCoordinator
    from logstore.broker.security.authorization import Authorization

__all__ = ["GROUP_ADMIN_APIS", "KafkaGroupAdminApis"]

DESCRIBE_GROUPS, LIST_GROUPS, DELETE_GROUPS = 15, 16, 42
GROUP_ADMIN_APIS: dict[int, tuple[int, int]] = {DESCRIBE_GROUPS: (0, 5), LIST_GROUPS: (0, 5), DELETE_GROUPS: (0, 2)}
_PROTOCOL_TYPE = _GROUP_TYPE = "consumer"
_NO_OPERATIONS = -2147483648  # authorized_operations: not asked for / not computed


class KafkaGroupAdminApis:
    """Answers the APIs of :data:`GROUP_ADMIN_APIS`; see the module docstring. ``authorization``
    answers the ACL checks."""

    def __init__(self, *, coordinator: GroupCoordinator, authorization: Authorization,
                 run_io: Callable[..., Awaitable[Any]]) -> None:
        self._coordinator = coordinator
        self._authorization = authorization
        self._run_io = run_io

    def handlers(self) -> dict[int, Callable[[Any, RequestContext], Awaitable[Any]]]:
        return {DESCRIBE_GROUPS: self._describe_groups, LIST_GROUPS: self._list_groups,
                DELETE_GROUPS: self._delete_groups}

    async def _list_groups(self, request: Any, context: RequestContext) -> Any:
        response_type = response_of(request)
        authz, principal = self._authorization, context.principal
        every = authz.allowed(principal, "DESCRIBE", "CLUSTER", CLUSTER_NAME)
        states = {s.lower() for s in getattr(request, "states_filter", ())}
        types = {t.lower() for t in getattr(request, "types_filter", ())}
        listed = nested(response_type, "ListedGroup")
        groups = tuple(
            build(listed, group_id=g.group_id, protocol_type=_PROTOCOL_TYPE, group_state=g.state,
                  group_type=_GROUP_TYPE)
            for g in self._coordinator.list_groups()
            if (not states or g.state.lower() in states) and (not types or _GROUP_TYPE in types)
            and (every or authz.allowed(principal, "DESCRIBE", "GROUP", g.group_id)))
        return build(response_type, throttle_time=NO_THROTTLE, error_code=ErrorCode.none, groups=groups)

    async def _describe_groups(self, request: Any, context: RequestContext) -> Any:
        response_type = response_of(request)
        group_type, member_type = nested(response_type, "DescribedGroup"), nested(response_type, "DescribedGroupMember")
        authz, principal = self._authorization, context.principal
        out = []
        for group_id in request.groups:
            try:
                authz.check(principal, "DESCRIBE", "GROUP", group_id)
                g = self._coordinator.describe_group(group_id)
            except GroupIdNotFoundError:
                out.append(build(group_type, error_code=ErrorCode.none, group_id=group_id, group_state="Dead",
                                 protocol_type="", protocol_data="", members=(),
                                 authorized_operations=_NO_OPERATIONS))
                continue
            except LogstoreError as e:
                out.append(build(group_type, error_code=kafka_error_code(e), group_id=group_id, group_state="",
                                 protocol_type="", protocol_data="", members=(),
                                 authorized_operations=_NO_OPERATIONS))
                continue
            reader = authz.allowed(principal, "READ", "GROUP", group_id)  # may see member ids
            members = tuple(
                build(member_type, member_id=m.member_id if reader else "", group_instance_id=m.instance_id or None,
                      client_id=m.client_id, client_host=m.client_host,
                      member_metadata=subscription_bytes(m.subscribed_topics),
                      member_assignment=assignment_bytes(m.assigned))
                for m in g.members if not m.left)
            out.append(build(group_type, error_code=ErrorCode.none, group_id=group_id, group_state=g.state,
                             protocol_type=_PROTOCOL_TYPE, protocol_data=g.assignor, members=members,
                             authorized_operations=_NO_OPERATIONS))
        return build(response_type, throttle_time=NO_THROTTLE, groups=tuple(out))

    async def _delete_groups(self, request: Any, context: RequestContext) -> Any:
        response_type = response_of(request)
        result_type = nested(response_type, "DeletableGroupResult")

        async def delete(group_id: str) -> Any:
            self._authorization.check(context.principal, "DELETE", "GROUP", group_id)
            # a single broker's offsets log: durable once delete_group returns (no replicas to wait for)
            await self._run_io(self._coordinator.delete_group, group_id)
            return build(result_type, group_id=group_id, error_code=ErrorCode.none)

        def refused(group_id: str, e: LogstoreError) -> Any:
            return build(result_type, group_id=group_id, error_code=kafka_error_code(e))
        return build(response_type, throttle_time=NO_THROTTLE,
                     results=await answer_each(request.groups_names, delete, refused))
