"""The Kafka APIs of consumer groups: FindCoordinator, OffsetCommit, OffsetFetch and
ConsumerGroupHeartbeat (KIP-848, Kafka's new group protocol).

A Kafka consumer that assigns its partitions itself commits its position and resumes from
it; one that subscribes (``group.protocol=consumer``) is a member of the group. Both go
through the same group coordinator as logstore's own consumers
(:class:`~logstore.broker.groups.coordinator.GroupCoordinator`), which speaks KIP-848
already, so Kafka and logstore consumers see the same offsets and may share a group:

=================  ========  ==================================================
API (key)          versions  notes
=================  ========  ==================================================
OffsetCommit (8)   2-8       a member's (member id and epoch, fenced as our
                             members' are), or a group's without members
                             (member id "", Kafka's "simple" consumer groups)
OffsetFetch (9)    1-7       one group per request; v7's ``require_stable``
                             answers UNSTABLE_OFFSET_COMMIT (88) for a partition
                             with offsets of an undecided transaction (KIP-447)
FindCoordinator    0-3       for a group and for a transactional id
(10)                         (:mod:`.txn_apis`): the broker leading the key's
                             shard of the coordinator topic, at its Kafka
                             listener (:mod:`.cluster`; a single broker: itself)
ConsumerGroup-     0-1       subscriptions by topic name (a regex is refused
Heartbeat (68)               with INVALID_REQUEST); fields a client leaves null
                             ("unchanged") are the member's last ones; a member
                             the listener does not remember (after a restart) is
                             told FENCED_MEMBER_EPOCH (110) and rejoins
=================  ========  ==================================================

The classic protocol (JoinGroup, SyncGroup, Heartbeat, LeaveGroup), Kafka clients'
default, is bridged onto the same coordinator by :mod:`.classic_group_apis`.

Authorization, as Kafka's: FindCoordinator needs DESCRIBE on the group
(GROUP_AUTHORIZATION_FAILED) or on the transactional id
(TRANSACTIONAL_ID_AUTHORIZATION_FAILED); OffsetCommit READ on the group (every partition
GROUP_AUTHORIZATION_FAILED) and READ on each topic (its partitions
TOPIC_AUTHORIZATION_FAILED); OffsetFetch DESCRIBE on the group (GROUP_AUTHORIZATION_FAILED)
and DESCRIBE on each topic named (TOPIC_AUTHORIZATION_FAILED; asked for all, the other
topics are left out); ConsumerGroupHeartbeat READ on the group.

Thread-safety: event loop only; commits go through ``commit`` (the I/O pool, then the loop).
"""

from __future__ import annotations

import datetime
import itertools
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from kio.schema.errors import ErrorCode

from logstore.broker.groups.model import (
    LEAVE_EPOCH,
    TEMPORARY_LEAVE_EPOCH,
    Heartbeat,
    HeartbeatOutcome,
)
from logstore.broker.kafka.cluster import GROUPS_TOPIC, TRANSACTIONS_TOPIC
from logstore.broker.kafka.error_codes import kafka_error_code
from logstore.broker.kafka.messages import (
    NO_THROTTLE,
    build,
    nested,
    response_of,
    topic_uuid,
)
from logstore.broker.kafka.request_context import RequestContext
from logstore.errors import FencedMemberEpochError, InvalidRequestError, LogstoreError
from logstore.types import TopicPartition

if TYPE_CHECKING:
    from logstore.broker.groups.coordinator import GroupCoordinator
    from logstore.broker.kafka.cluster import KafkaCluster
    from logstore.broker.security.authorization import Authorization
    from logstore.storage.log_manager import LogManager

__all__ = ["GROUP_APIS", "KafkaGroupApis"]

OFFSET_COMMIT, OFFSET_FETCH, FIND_COORDINATOR, CONSUMER_GROUP_HEARTBEAT = 8, 9, 10, 68
GROUP_APIS: dict[int, tuple[int, int]] = {OFFSET_COMMIT: (2, 8), OFFSET_FETCH: (1, 7), FIND_COORDINATOR: (0, 3),
                                          CONSUMER_GROUP_HEARTBEAT: (0, 1)}
_GROUP_KEY, _TRANSACTION_KEY = 0, 1  # FindCoordinator's key_type
# Members whose last heartbeat fields are kept; past this the least recently heard are
# forgotten (a member that vanished is never heard again) and are told to rejoin if they return.
MAX_REMEMBERED_MEMBERS = 100_000


@dataclass(frozen=True, slots=True)
class _Member:
    """What a member said last: a Kafka heartbeat leaves a field null when it is unchanged."""

    subscribed: tuple[str, ...]
    owned: frozenset[TopicPartition]
    assignor: str
    rebalance_timeout_ms: int


class KafkaGroupApis:
    """Answers the APIs of :data:`GROUP_APIS`; see the module docstring.

    ``coordinator`` keeps the groups' offsets; ``heartbeat(hb)`` applies a member's heartbeat
    (the groups' handler: it wakes the members it changed and writes the groups' metadata);
    ``cluster`` says which partitions exist and who coordinates a key (:mod:`.cluster`),
    ``manager`` names topics by id; ``commit(group_id, member_id, member_epoch, offsets)``
    commits offsets durably (the groups' handler, as for logstore's OffsetCommit);
    ``authorization`` answers the ACL checks.
    """

    def __init__(self, *, coordinator: GroupCoordinator, heartbeat: Callable[[Heartbeat], HeartbeatOutcome],
                 manager: LogManager, cluster: KafkaCluster,
                 commit: Callable[[str, str, int, dict[TopicPartition, tuple[int, str]]], Awaitable[None]],
                 authorization: Authorization) -> None:
        self._coordinator = coordinator
        self._authorization = authorization
        self._heartbeat = heartbeat
        self._manager = manager
        self._members: dict[tuple[str, str], _Member] = {}
        self._request_seq = itertools.count(1)
        self._cluster = cluster
        self._commit = commit

    def handlers(self) -> dict[int, Callable[[Any, RequestContext], Awaitable[Any]]]:
        return {OFFSET_COMMIT: self._offset_commit, OFFSET_FETCH: self._offset_fetch,
                FIND_COORDINATOR: self._find_coordinator, CONSUMER_GROUP_HEARTBEAT: self._consumer_group_heartbeat}

    async def _consumer_group_heartbeat(self, request: Any, context: RequestContext) -> Any:
        response_type = response_of(request)
        key = (request.group_id, request.member_id)
        try:
            self._authorization.check(context.principal, "READ", "GROUP", request.group_id)
            if getattr(request, "subscribed_topic_regex", None):
                raise InvalidRequestError("subscribing by regex is not served over Kafka yet; name the topics")
            last = self._members.get(key)
            if last is None and request.member_epoch > 0 and None in (request.subscribed_topic_names,
                                                                    request.topic_partitions):
                # "Unchanged" from a member this listener does not remember (it restarted, or the
                # member was forgotten): make it rejoin with everything said, never guess.
                raise FencedMemberEpochError(
                    f"member {request.member_id} of group {request.group_id!r}: the broker does not know its "
                    "subscription; rejoin")
            ids = {t.topic_id: t.name for t in self._manager.topics()}
            member = _Member(
                subscribed=(tuple(request.subscribed_topic_names) if request.subscribed_topic_names is not None
                            else last.subscribed if last is not None else ()),
                owned=(frozenset(TopicPartition(ids[t.topic_id.hex], int(p)) for t in request.topic_partitions
                                 if t.topic_id is not None and t.topic_id.hex in ids for p in t.partitions)
                       if request.topic_partitions is not None else last.owned if last is not None else frozenset()),
                assignor=(request.server_assignor if request.server_assignor is not None
                          else last.assignor if last is not None else ""),
                rebalance_timeout_ms=(int(request.rebalance_timeout.total_seconds() * 1000)
                                      if request.rebalance_timeout.total_seconds() > 0
                                      else last.rebalance_timeout_ms if last is not None else 300_000))
            outcome = self._heartbeat(Heartbeat(
                group_id=request.group_id, member_id=request.member_id, member_epoch=int(request.member_epoch),
                instance_id=request.instance_id or "", subscribed_topics=member.subscribed,
                assignor=member.assignor, owned=member.owned, rebalance_timeout_ms=member.rebalance_timeout_ms,
                request_seq=next(self._request_seq)))
        except LogstoreError as e:
            if not e.retriable:
                self._members.pop(key, None)
            return build(response_type, throttle_time=NO_THROTTLE, error_code=kafka_error_code(e),
                         error_message=e.message, member_id=request.member_id, member_epoch=-1,
                         heartbeat_interval=datetime.timedelta(0), assignment=None)
        state = outcome.state
        if state is None or request.member_epoch in (LEAVE_EPOCH, TEMPORARY_LEAVE_EPOCH):  # left
            self._members.pop(key, None)
            return build(response_type, throttle_time=NO_THROTTLE, error_code=ErrorCode.none,
                         member_id=request.member_id, member_epoch=request.member_epoch,
                         heartbeat_interval=datetime.timedelta(0), assignment=None)
        self._members.pop(key, None)
        self._members[(request.group_id, state.member_id)] = member
        while len(self._members) > MAX_REMEMBERED_MEMBERS:  # members that vanished: forget the oldest
            del self._members[next(iter(self._members))]
        by_topic: dict[str, list[int]] = {}
        for tp in sorted(state.assignment):
            by_topic.setdefault(tp.topic, []).append(tp.partition)
        names = {t.name: t.topic_id for t in self._manager.topics()}
        assigned = nested(response_type, "TopicPartitions")
        return build(
            response_type, throttle_time=NO_THROTTLE, error_code=ErrorCode.none, member_id=state.member_id,
            member_epoch=state.member_epoch, heartbeat_interval=datetime.timedelta(milliseconds=state.heartbeat_interval_ms),
            assignment=nested(response_type, "Assignment")(topic_partitions=tuple(
                assigned(topic_id=topic_uuid(names.get(topic, "")), partitions=tuple(parts))
                for topic, parts in by_topic.items())))

    async def _find_coordinator(self, request: Any, context: RequestContext) -> Any:
        response_type = response_of(request)
        if getattr(request, "key_type", _GROUP_KEY) not in (_GROUP_KEY, _TRANSACTION_KEY):
            return build(response_type, throttle_time=NO_THROTTLE, error_code=ErrorCode.invalid_request,
                         error_message=f"key type {request.key_type}: only groups (0) and transactional ids (1) "
                                       "have coordinators", node_id=-1, host="", port=-1)
        transactional = getattr(request, "key_type", _GROUP_KEY) == _TRANSACTION_KEY
        topic = TRANSACTIONS_TOPIC if transactional else GROUPS_TOPIC
        try:
            self._authorization.check(context.principal, "DESCRIBE", "TRANSACTIONAL_ID" if transactional else "GROUP",
                                      request.key)
            found = await self._cluster.coordinator(topic, request.key)
        except LogstoreError as e:
            return build(response_type, throttle_time=NO_THROTTLE, error_code=kafka_error_code(e),
                         error_message=e.message, node_id=-1, host="", port=-1)
        return build(response_type, throttle_time=NO_THROTTLE, error_code=ErrorCode.none, error_message=None,
                     node_id=found.node_id, host=found.host, port=found.port)

    async def _offset_commit(self, request: Any, context: RequestContext) -> Any:
        response_type = response_of(request)
        topic_type, partition_type = nested(response_type, "OffsetCommitResponseTopic"), nested(
            response_type, "OffsetCommitResponsePartition")
        errors: dict[TopicPartition, ErrorCode] = {}
        offsets: dict[TopicPartition, tuple[int, str]] = {}
        authz, principal = self._authorization, context.principal
        try:
            authz.check(principal, "READ", "GROUP", request.group_id)
            self._cluster.check_coordinator(GROUPS_TOPIC, request.group_id)
        except LogstoreError as e:  # NOT_COORDINATOR, ...: every partition says so, the client finds it again
            errors = {TopicPartition(t.name, int(p.partition_index)): kafka_error_code(e)
                      for t in request.topics for p in t.partitions}
        for topic in request.topics if not errors else ():
            for p in topic.partitions:
                tp = TopicPartition(topic.name, int(p.partition_index))
                try:
                    authz.check(principal, "READ", "TOPIC", tp.topic)
                    self._cluster.check_partition(tp.topic, tp.partition)
                    offsets[tp] = (int(p.committed_offset), p.committed_metadata or "")
                except LogstoreError as e:
                    errors[tp] = kafka_error_code(e)
        if offsets:
            try:
                await self._commit(request.group_id, request.member_id, int(request.generation_id_or_member_epoch),
                                   offsets)
            except LogstoreError as e:
                code = kafka_error_code(e)
                errors.update({tp: code for tp in offsets})
        return build(response_type, throttle_time=NO_THROTTLE, topics=tuple(
            build(topic_type, name=topic.name, partitions=tuple(
                build(partition_type, partition_index=p.partition_index,
                      error_code=errors.get(TopicPartition(topic.name, int(p.partition_index)), ErrorCode.none))
                for p in topic.partitions))
            for topic in request.topics))

    async def _offset_fetch(self, request: Any, context: RequestContext) -> Any:
        response_type = response_of(request)
        topic_type, partition_type = nested(response_type, "OffsetFetchResponseTopic"), nested(
            response_type, "OffsetFetchResponsePartition")
        wanted = (None if request.topics is None else
                  [TopicPartition(t.name, int(i)) for t in request.topics for i in t.partition_indexes])
        authz, principal = self._authorization, context.principal
        if not authz.allowed(principal, "DESCRIBE", "GROUP", request.group_id):
            if request.__version__ < 2 and wanted:  # no error of its own before v2: each partition's
                return self._offsets_refused(response_type, wanted, ErrorCode.group_authorization_failed)
            return build(response_type, throttle_time=NO_THROTTLE, error_code=ErrorCode.group_authorization_failed,
                         topics=())
        try:
            self._cluster.check_coordinator(GROUPS_TOPIC, request.group_id)
            found = self._coordinator.fetch_offsets(request.group_id, wanted)
            # v7+ (KIP-447): a partition with offsets of an undecided transaction is unstable.
            unstable = (self._coordinator.unstable_offsets(request.group_id)
                        if getattr(request, "require_stable", False) else frozenset())
        except LogstoreError as e:
            return build(response_type, throttle_time=NO_THROTTLE, error_code=kafka_error_code(e), topics=())
        by_topic: dict[str, list[Any]] = {}
        describable: dict[str, bool] = {}
        for tp in (wanted if wanted is not None else sorted(found)):
            if tp.topic not in describable:
                describable[tp.topic] = authz.allowed(principal, "DESCRIBE", "TOPIC", tp.topic)
            if not describable[tp.topic]:
                if wanted is not None:  # named: refused; all of the group's: left out (Kafka's answers)
                    by_topic.setdefault(tp.topic, []).append(build(
                        partition_type, partition_index=tp.partition, error_code=ErrorCode.topic_authorization_failed,
                        committed_offset=-1, committed_leader_epoch=-1, metadata=""))
                continue
            committed = None if tp in unstable else found.get(tp)
            by_topic.setdefault(tp.topic, []).append(build(
                partition_type, partition_index=tp.partition,
                error_code=ErrorCode.unstable_offset_commit if tp in unstable else ErrorCode.none,
                committed_offset=-1 if committed is None else committed.offset, committed_leader_epoch=-1,
                metadata="" if committed is None else committed.metadata))
        return build(response_type, throttle_time=NO_THROTTLE, error_code=ErrorCode.none, topics=tuple(
            build(topic_type, name=name, partitions=tuple(parts)) for name, parts in by_topic.items()))

    @staticmethod
    def _offsets_refused(response_type: Any, wanted: list[TopicPartition], code: ErrorCode) -> Any:
        """OffsetFetch v1's answer refusing each partition asked for with ``code``."""
        topic_type, partition_type = nested(response_type, "OffsetFetchResponseTopic"), nested(
            response_type, "OffsetFetchResponsePartition")
        by_topic: dict[str, list[Any]] = {}
        for tp in wanted:
            by_topic.setdefault(tp.topic, []).append(build(
                partition_type, partition_index=tp.partition, error_code=code, committed_offset=-1,
                committed_leader_epoch=-1, metadata=""))
        return build(response_type, throttle_time=NO_THROTTLE, topics=tuple(
            build(topic_type, name=name, partitions=tuple(parts)) for name, parts in by_topic.items()))
