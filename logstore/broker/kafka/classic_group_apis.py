"""Kafka's classic consumer group protocol, served by our KIP-848 group coordinator.

Kafka clients subscribe with the classic protocol by default (JoinGroup, SyncGroup,
Heartbeat, LeaveGroup; ``group.protocol=classic``). Our group coordinator assigns on the
broker (KIP-848), so a classic member is bridged the way Kafka bridges classic members
of a consumer group: nobody is the group's leader, and the coordinator's assignment is
every member's SyncGroup answer.

* **JoinGroup** (0-9) is a KIP-848 join (member epoch 0, owning nothing: an eager
  member gives up its partitions before it rejoins): the member gets its id, the
  generation (= its member epoch), the protocol (the first eager assignor it offered,
  ``range`` or ``roundrobin``, else its first), an empty leader and no member list.
  Its subscription is the topics of the ``consumer`` protocol's metadata; another
  protocol type is refused with INCONSISTENT_GROUP_PROTOCOL (23).
* **SyncGroup** (0-5) answers the assignment the join got, as the consumer protocol's
  ConsumerProtocolAssignment v0 bytes; an older generation gets ILLEGAL_GENERATION (22).
* **Heartbeat** (0-4) is a KIP-848 heartbeat owning that assignment: when the
  coordinator's answer differs (another member came or went, partitions to give up),
  the member is told REBALANCE_IN_PROGRESS (27) and rejoins. So is a member whose join
  this broker did not see (on a cluster the coordinator moved here with the group's
  log): it rejoins with its member id, which the coordinator loaded, and gets its
  partitions back at once; told UNKNOWN_MEMBER_ID it would rejoin as a new member and wait
  for its old self's session to end (45 s by default) before it got any.
* **LeaveGroup** (0-5) is a KIP-848 leave (member epoch -1) of each member named.

Commits (OffsetCommit) name the generation as the member epoch, which is what it is.

Authorization, as Kafka's: each of the four needs READ on the group; without it the
answer is GROUP_AUTHORIZATION_FAILED (30) and the coordinator is not asked.

Thread-safety: event loop only.
"""

from __future__ import annotations

import io
import struct
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from kio.index import load_entity_schema
from kio.schema.errors import ErrorCode
from kio.serial import entity_reader, entity_writer
from kio.static.constants import EntityType

from logstore.broker.groups.model import JOIN_EPOCH, LEAVE_EPOCH, Heartbeat, HeartbeatOutcome
from logstore.broker.kafka.error_codes import kafka_error_code
from logstore.broker.kafka.messages import NO_THROTTLE, build, nested, response_of
from logstore.broker.kafka.request_context import RequestContext
from logstore.errors import LogstoreError
from logstore.types import TopicPartition

if TYPE_CHECKING:
    from logstore.broker.security.authorization import Authorization

__all__ = ["CLASSIC_GROUP_APIS", "KafkaClassicGroupApis", "assignment_bytes", "subscription_bytes"]

JOIN_GROUP, HEARTBEAT, LEAVE_GROUP, SYNC_GROUP = 11, 12, 13, 14
CLASSIC_GROUP_APIS: dict[int, tuple[int, int]] = {JOIN_GROUP: (0, 9), SYNC_GROUP: (0, 5), HEARTBEAT: (0, 4),
                                                  LEAVE_GROUP: (0, 5)}
_EAGER = ("range", "roundrobin")
# Classic members remembered (their last join); past this the ones that joined longest ago are
# forgotten, and answered REBALANCE_IN_PROGRESS if they return (they rejoin). A restart forgets all.
MAX_REMEMBERED_MEMBERS = 100_000
_SUBSCRIPTION_VERSIONS = 3  # the newest ConsumerProtocolSubscription kio reads; newer ones only add fields


@dataclass(frozen=True, slots=True)
class _Joined:
    """What a classic member was given at its last join."""

    generation: int
    assignment: frozenset[TopicPartition]
    protocol: str


class KafkaClassicGroupApis:
    """Answers the APIs of :data:`CLASSIC_GROUP_APIS`; see the module docstring.
    ``heartbeat(hb)`` applies a KIP-848 heartbeat (the groups' handler's); ``authorization``
    answers the ACL checks."""

    def __init__(self, *, heartbeat: Callable[[Heartbeat], HeartbeatOutcome], authorization: Authorization) -> None:
        self._heartbeat = heartbeat
        self._authorization = authorization
        self._joined: dict[tuple[str, str], _Joined] = {}
        self._subscriptions: dict[tuple[str, str], tuple[str, ...]] = {}
        self._request_seq = 0

    def handlers(self) -> dict[int, Callable[[Any, RequestContext], Awaitable[Any]]]:
        handlers = {JOIN_GROUP: self._join_group, SYNC_GROUP: self._sync_group, HEARTBEAT: self._classic_heartbeat,
                    LEAVE_GROUP: self._leave_group}
        return {key: self._reading_group(handler) for key, handler in handlers.items()}

    def _reading_group(self, handler: Callable[[Any], Awaitable[Any]]
                       ) -> Callable[[Any, RequestContext], Awaitable[Any]]:
        """``handler`` for callers with READ on the request's group; the others are answered
        GROUP_AUTHORIZATION_FAILED in the shape of ``handler``'s answer."""
        async def handle(request: Any, context: RequestContext) -> Any:
            if self._authorization.allowed(context.principal, "READ", "GROUP", request.group_id):
                return await handler(request)
            return build(response_of(request), throttle_time=NO_THROTTLE,
                         error_code=ErrorCode.group_authorization_failed, generation_id=-1, protocol_type=None,
                         protocol_name=_no_protocol(request), leader="", member_id=getattr(request, "member_id", ""),
                         members=(), assignment=b"")
        return handle

    def _beat(self, group_id: str, member_id: str, epoch: int, subscribed: tuple[str, ...],
              owned: frozenset[TopicPartition], instance_id: str | None) -> HeartbeatOutcome:
        self._request_seq += 1
        return self._heartbeat(Heartbeat(group_id=group_id, member_id=member_id, member_epoch=epoch,
                                         instance_id=instance_id or "", subscribed_topics=subscribed, owned=owned,
                                         request_seq=self._request_seq))

    async def _join_group(self, request: Any) -> Any:
        response_type = response_of(request)

        def refuse(code: ErrorCode) -> Any:
            return build(response_type, throttle_time=NO_THROTTLE, error_code=code, generation_id=-1,
                         protocol_type=None, protocol_name=_no_protocol(request), leader="",
                         member_id=request.member_id, members=())
        names = [p.name for p in request.protocols]
        if request.protocol_type != "consumer" or not names:
            return refuse(ErrorCode.inconsistent_group_protocol)
        protocol = next((n for n in names if n in _EAGER), names[0])
        try:
            subscribed = _subscribed_topics(next(p.metadata for p in request.protocols if p.name == protocol))
        except Exception:  # noqa: BLE001 - bytes a client sent: not a subscription
            return refuse(ErrorCode.inconsistent_group_protocol)
        try:
            outcome = self._beat(request.group_id, request.member_id, JOIN_EPOCH, subscribed, frozenset(),
                                 getattr(request, "group_instance_id", None))
        except LogstoreError as e:
            return refuse(kafka_error_code(e))
        state = outcome.state
        if state is None:
            return refuse(ErrorCode.unknown_member_id)
        key = (request.group_id, state.member_id)
        self._forget(key)  # re-inserted last: the dicts are in order of last join
        self._subscriptions[key] = subscribed
        self._joined[key] = _Joined(state.member_epoch, state.assignment, protocol)
        while len(self._joined) > MAX_REMEMBERED_MEMBERS:  # members that vanished: forget the oldest
            self._forget(next(iter(self._joined)))
        return build(response_type, throttle_time=NO_THROTTLE, error_code=ErrorCode.none,
                     generation_id=state.member_epoch, protocol_type="consumer", protocol_name=protocol,
                     leader="", skip_assignment=False, member_id=state.member_id, members=())

    async def _sync_group(self, request: Any) -> Any:
        response_type = response_of(request)
        joined = self._joined.get((request.group_id, request.member_id))
        if joined is None:
            return build(response_type, throttle_time=NO_THROTTLE, error_code=ErrorCode.unknown_member_id,
                         assignment=b"")
        if request.generation_id != joined.generation:
            return build(response_type, throttle_time=NO_THROTTLE, error_code=ErrorCode.illegal_generation,
                         assignment=b"")
        return build(response_type, throttle_time=NO_THROTTLE, error_code=ErrorCode.none,
                     protocol_type="consumer", protocol_name=joined.protocol,
                     assignment=assignment_bytes(joined.assignment))

    async def _classic_heartbeat(self, request: Any) -> Any:
        response_type = response_of(request)
        key = (request.group_id, request.member_id)
        joined = self._joined.get(key)
        if joined is None:  # joined at another broker (the coordinator moved here), or forgotten: rejoin
            return build(response_type, throttle_time=NO_THROTTLE, error_code=ErrorCode.rebalance_in_progress)
        if request.generation_id != joined.generation:
            return build(response_type, throttle_time=NO_THROTTLE, error_code=ErrorCode.illegal_generation)
        try:
            outcome = self._beat(request.group_id, request.member_id, joined.generation,
                                 self._subscriptions.get(key, ()), joined.assignment,
                                 getattr(request, "group_instance_id", None))
        except LogstoreError as e:
            self._forget(key)
            code = kafka_error_code(e)
            if code in (ErrorCode.fenced_member_epoch, ErrorCode.stale_member_epoch):
                code = ErrorCode.illegal_generation
            return build(response_type, throttle_time=NO_THROTTLE, error_code=code)
        state = outcome.state
        if state is None or (state.member_epoch, state.assignment) != (joined.generation, joined.assignment):
            return build(response_type, throttle_time=NO_THROTTLE, error_code=ErrorCode.rebalance_in_progress)
        return build(response_type, throttle_time=NO_THROTTLE, error_code=ErrorCode.none)

    async def _leave_group(self, request: Any) -> Any:
        response_type = response_of(request)
        members: list[tuple[str, str | None]] = (  # v3+ name a list; v0-2 one member
            [(m.member_id, m.group_instance_id) for m in request.members] if hasattr(request, "members")
            else [(request.member_id, None)])
        codes = []
        for member_id, instance_id in members:
            try:
                self._beat(request.group_id, member_id, LEAVE_EPOCH, (), frozenset(), instance_id)
                codes.append(ErrorCode.none)
            except LogstoreError as e:
                codes.append(kafka_error_code(e))
            self._forget((request.group_id, member_id))
        try:
            member_type = nested(response_type, "MemberResponse")
        except AttributeError:  # v0-2: one error for the one member
            return build(response_type, throttle_time=NO_THROTTLE, error_code=codes[0])
        return build(response_type, throttle_time=NO_THROTTLE, error_code=ErrorCode.none, members=tuple(
            member_type(member_id=member_id, group_instance_id=instance_id, error_code=code)
            for (member_id, instance_id), code in zip(members, codes, strict=True)))

    def _forget(self, key: tuple[str, str]) -> None:
        self._joined.pop(key, None)
        self._subscriptions.pop(key, None)


def _no_protocol(request: Any) -> str | None:
    """A refused JoinGroup's protocol name: null from v7 (nullable there), "" before (as Kafka's)."""
    return None if request.__api_key__ != JOIN_GROUP or request.__version__ >= 7 else ""


def _subscribed_topics(metadata: bytes) -> tuple[str, ...]:
    """The topics of a ``consumer`` protocol subscription (int16 version, then the body)."""
    (version,) = struct.unpack_from(">h", metadata, 0)
    schema: Any = load_entity_schema("consumer_protocol_subscription", min(max(version, 0), _SUBSCRIPTION_VERSIONS),
                                     EntityType.data)
    subscription, _ = entity_reader(schema)(metadata, 2)
    return tuple(subscription.topics)


def subscription_bytes(topics: tuple[str, ...]) -> bytes:
    """A subscription to ``topics`` as ConsumerProtocolSubscription v0 (int16 version, then the body)."""
    schema: Any = load_entity_schema("consumer_protocol_subscription", 0, EntityType.data)
    buffer = io.BytesIO()
    buffer.write(struct.pack(">h", 0))
    entity_writer(schema)(buffer, schema(topics=topics, user_data=None))
    return buffer.getvalue()


def assignment_bytes(assignment: frozenset[TopicPartition]) -> bytes:
    """``assignment`` as ConsumerProtocolAssignment v0 (int16 version, then the body)."""
    schema: Any = load_entity_schema("consumer_protocol_assignment", 0, EntityType.data)
    topic_type = nested(schema, "TopicPartition")
    by_topic: dict[str, list[int]] = {}
    for tp in sorted(assignment):
        by_topic.setdefault(tp.topic, []).append(tp.partition)
    buffer = io.BytesIO()
    buffer.write(struct.pack(">h", 0))
    entity_writer(schema)(buffer, schema(assigned_partitions=tuple(
        topic_type(topic=t, partitions=tuple(p)) for t, p in by_topic.items()), user_data=None))
    return buffer.getvalue()

