"""The Kafka APIs of committed offsets: FindCoordinator, OffsetCommit, OffsetFetch.

Enough for a Kafka consumer that assigns its partitions itself (``assign``, not
``subscribe``) to commit its position and resume from it, through the same group
coordinator as logstore's own consumers (:class:`~logstore.broker.groups.coordinator.GroupCoordinator`),
so both see the same committed offsets:

=================  ========  ==================================================
API (key)          versions  notes
=================  ========  ==================================================
OffsetCommit (8)   2-8       commits of a group without members (member id "",
                             Kafka's "simple" consumer groups); a member id is
                             answered UNKNOWN_MEMBER_ID (25)
OffsetFetch (9)    1-7       one group per request
FindCoordinator    0-3       a group's coordinator is this broker; a transaction
(10)                         coordinator is refused with INVALID_REQUEST (42)
=================  ========  ==================================================

Group membership (JoinGroup, SyncGroup, Heartbeat, LeaveGroup, ConsumerGroupHeartbeat)
is not served, so ``subscribe`` does not work over Kafka yet.

Thread-safety: event loop only; commits are written on ``run_io``.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from typing import TYPE_CHECKING, Any

from kio.schema.errors import ErrorCode

from logstore.broker.kafka.error_codes import kafka_error_code
from logstore.broker.kafka.messages import NO_THROTTLE, build, nested, response_of
from logstore.errors import LogstoreError
from logstore.types import TopicPartition

if TYPE_CHECKING:
    from logstore.broker.groups.coordinator import GroupCoordinator
    from logstore.broker.placement import Placement

__all__ = ["GROUP_APIS", "KafkaGroupApis"]

OFFSET_COMMIT, OFFSET_FETCH, FIND_COORDINATOR = 8, 9, 10
GROUP_APIS: dict[int, tuple[int, int]] = {OFFSET_COMMIT: (2, 8), OFFSET_FETCH: (1, 7), FIND_COORDINATOR: (0, 3)}
_GROUP_KEY = 0  # FindCoordinator's key_type: 0 group, 1 transaction


class KafkaGroupApis:
    """Answers the APIs of :data:`GROUP_APIS`; see the module docstring.

    ``coordinator`` keeps the groups' offsets; ``placement`` says which partitions exist;
    ``advertised()`` is the (host, port) of this broker's Kafka listener.
    """

    def __init__(self, *, coordinator: GroupCoordinator, placement: Placement, node_id: int,
                 advertised: Callable[[], tuple[str, int]], run_io: Callable[..., Awaitable[Any]]) -> None:
        self._coordinator = coordinator
        self._placement = placement
        self._node_id = node_id
        self._advertised = advertised
        self._run_io = run_io

    def handlers(self) -> dict[int, Callable[[Any], Awaitable[Any]]]:
        return {OFFSET_COMMIT: self._offset_commit, OFFSET_FETCH: self._offset_fetch,
                FIND_COORDINATOR: self._find_coordinator}

    async def _find_coordinator(self, request: Any) -> Any:
        response_type = response_of(request)
        if getattr(request, "key_type", _GROUP_KEY) != _GROUP_KEY:
            return build(response_type, throttle_time=NO_THROTTLE, error_code=ErrorCode.invalid_request,
                         error_message="transactions are not served over the Kafka listener yet",
                         node_id=-1, host="", port=-1)
        host, port = self._advertised()
        return build(response_type, throttle_time=NO_THROTTLE, error_code=ErrorCode.none, error_message=None,
                     node_id=self._node_id, host=host, port=port)

    async def _offset_commit(self, request: Any) -> Any:
        response_type = response_of(request)
        topic_type, partition_type = nested(response_type, "OffsetCommitResponseTopic"), nested(
            response_type, "OffsetCommitResponsePartition")
        errors: dict[TopicPartition, ErrorCode] = {}
        offsets: dict[TopicPartition, tuple[int, str]] = {}
        for topic in request.topics:
            for p in topic.partitions:
                tp = TopicPartition(topic.name, int(p.partition_index))
                try:
                    self._placement.leader(tp.topic, tp.partition)
                    offsets[tp] = (int(p.committed_offset), p.committed_metadata or "")
                except LogstoreError as e:
                    errors[tp] = kafka_error_code(e)
        if offsets:
            try:
                await self._run_io(self._coordinator.commit_offsets, request.group_id, request.member_id,
                                   int(request.generation_id_or_member_epoch), offsets)
            except LogstoreError as e:
                code = kafka_error_code(e)
                errors.update({tp: code for tp in offsets})
        return build(response_type, throttle_time=NO_THROTTLE, topics=tuple(
            build(topic_type, name=topic.name, partitions=tuple(
                build(partition_type, partition_index=p.partition_index,
                      error_code=errors.get(TopicPartition(topic.name, int(p.partition_index)), ErrorCode.none))
                for p in topic.partitions))
            for topic in request.topics))

    async def _offset_fetch(self, request: Any) -> Any:
        response_type = response_of(request)
        topic_type, partition_type = nested(response_type, "OffsetFetchResponseTopic"), nested(
            response_type, "OffsetFetchResponsePartition")
        wanted = (None if request.topics is None else
                  [TopicPartition(t.name, int(i)) for t in request.topics for i in t.partition_indexes])
        try:
            found = self._coordinator.fetch_offsets(request.group_id, wanted)
        except LogstoreError as e:
            return build(response_type, throttle_time=NO_THROTTLE, error_code=kafka_error_code(e), topics=())
        by_topic: dict[str, list[Any]] = {}
        for tp in (wanted if wanted is not None else sorted(found)):
            committed = found.get(tp)
            by_topic.setdefault(tp.topic, []).append(build(
                partition_type, partition_index=tp.partition, error_code=ErrorCode.none,
                committed_offset=-1 if committed is None else committed.offset, committed_leader_epoch=-1,
                metadata="" if committed is None else committed.metadata))
        return build(response_type, throttle_time=NO_THROTTLE, error_code=ErrorCode.none, topics=tuple(
            build(topic_type, name=name, partitions=tuple(parts)) for name, parts in by_topic.items()))
