"""The consumer group calls, ``BrokerClient.groups``, sent to each group's coordinator.

A part of :class:`~logstore.client.rpc.BrokerClient` of its own, so ``rpc.py``
stays one concept per module; sent through the
:class:`~logstore.client.transport.Transport` it is given. Every call about one group
(heartbeat, commit, offset fetch, describe, delete) goes to the group's
coordinator, found with FindCoordinator and cached
(:class:`~logstore.client.coordinator_lookup.CoordinatorLookup`); a blocking
call is found again and retried on NOT_COORDINATOR, COORDINATOR_NOT_AVAILABLE,
COORDINATOR_LOAD_IN_PROGRESS or an unreachable coordinator until the request
timeout. The heartbeat does not block: its failure forgets the coordinator and
the member's heartbeat loop (:mod:`logstore.client.group_member`) retries.

ListGroups on a cluster asks every broker (each lists the groups it
coordinates) and merges the answers, as Kafka's admin client does.

Thread-safety: as :class:`~logstore.client.rpc.BrokerClient`.
"""

from __future__ import annotations

import concurrent.futures
from collections.abc import Iterable, Mapping, Sequence

from logstore._proto import logstore_pb2 as pb
from logstore.client import messages
from logstore.client.coordinator_lookup import COORDINATOR_ERRORS, GROUP
from logstore.client.error_mapping import error_from_item, raise_for_errors, raise_for_item
from logstore.client.results import GroupHeartbeat, RpcFuture
from logstore.client.routing import Connection
from logstore.client.transport import Transport
from logstore.errors import BrokerUnavailableError, LogstoreError
from logstore.types import GroupDescription, GroupListing, OffsetAndMetadata, TopicPartition

__all__ = ["GroupRpcs"]


class GroupRpcs:
    """The consumer group RPCs, sent through ``transport``; see the module docstring."""

    def __init__(self, transport: Transport) -> None:
        self._transport = transport

    def forget_group_coordinator(self, group_id: str) -> None:
        """Find ``group_id``'s coordinator again on its next call (e.g. after a heartbeat timed out)."""
        self._transport.coordinators.forget(GROUP, group_id)

    def group_heartbeat_async(
        self,
        group_id: str,
        *,
        member_id: str,
        member_epoch: int,
        subscribed_topics: Sequence[str],
        owned: Iterable[TopicPartition],
        instance_id: str = "",
        assignor: str = "",
        rebalance_timeout_ms: int = 300_000,
        max_wait_ms: int = 0,
        request_seq: int = 0,
        client_id: str = "",
        timeout_ms: int | None = None,
    ) -> RpcFuture[GroupHeartbeat]:
        """Send a consumer group heartbeat (see ``ConsumerGroupHeartbeatRequest`` in the proto)
        to the group's coordinator (found first when not known: this may block up to the
        request timeout; a failure to find it is the future's error).

        Epoch 0 joins, -1 leaves, -2 leaves for now (a static member). The
        broker holds the answer of an in-sync member up to ``max_wait_ms`` (a
        long poll); ``cancel_call()`` abandons it. The future raises the mapped
        error, e.g. :class:`UnknownMemberIdError` or :class:`FencedMemberEpochError`
        (rejoin), :class:`FencedInstanceIdError` (a newer process took over),
        :class:`NotCoordinatorError` (the next heartbeat finds the coordinator again).
        """
        request = pb.ConsumerGroupHeartbeatRequest(
            group_id=group_id, member_id=member_id, member_epoch=member_epoch, instance_id=instance_id,
            rebalance_timeout_ms=rebalance_timeout_ms, subscribed_topics=list(subscribed_topics),
            server_assignor=assignor, max_wait_ms=max_wait_ms, request_seq=request_seq, client_id=client_id,
            owned_partitions=messages.topic_partitions(owned, sort=True),
        )

        def convert(r: pb.ConsumerGroupHeartbeatResponse) -> GroupHeartbeat:
            raise_for_item(r.error)
            return messages.group_heartbeat(r)

        try:
            conn = self._transport.coordinators.connection(GROUP, group_id,
                                                           timeout_s=self._transport.deadline_s(timeout_ms))
        except LogstoreError as e:
            failed: RpcFuture[GroupHeartbeat] = RpcFuture()
            failed.set_running_or_notify_cancel()
            failed.set_exception(e)
            return failed
        timeout_s = self._transport.deadline_s(timeout_ms, max(0, max_wait_ms))
        future: RpcFuture[GroupHeartbeat] = self._transport.call_future(
            "ConsumerGroupHeartbeat", request, timeout_s=timeout_s, convert=convert, conn=conn)

        def forget_if_moved(f: concurrent.futures.Future[GroupHeartbeat]) -> None:
            error = f.exception() if not f.cancelled() else None
            if isinstance(error, BrokerUnavailableError) and "was cancelled" in error.message:
                return  # abandoned by the member itself, not a sign that the coordinator moved
            self._transport.coordinators.note(GROUP, group_id, error)

        future.add_done_callback(forget_if_moved)
        return future

    def commit_offsets(
        self,
        group_id: str,
        offsets: Mapping[TopicPartition, int | OffsetAndMetadata],
        *,
        member_id: str = "",
        member_epoch: int = -1,
        timeout_ms: int | None = None,
    ) -> None:
        """Commit offsets of ``group_id`` (all or nothing) at its coordinator; raise the first error.

        A member names itself (``member_id``, ``member_epoch``); a commit from
        outside the group (no member id) is refused with :class:`NonEmptyGroupError`
        while the group has members.
        """
        request = messages.offset_commit_request(group_id, offsets, member_id=member_id,
                                                 member_epoch=member_epoch)
        r = self._transport.on_coordinator(group_id, "OffsetCommit", request, timeout_ms)
        raise_for_errors((f"{p.topic}-{p.partition}", error_from_item(p.error)) for p in r.partitions)

    def fetch_committed_offsets(
        self, group_id: str, partitions: Iterable[TopicPartition] | None = None, *,
        timeout_ms: int | None = None,
    ) -> dict[TopicPartition, OffsetAndMetadata | None]:
        """The committed offsets of ``group_id`` (None where nothing is committed);
        ``partitions`` None = every partition with a committed offset."""
        request = pb.OffsetFetchRequest(group_id=group_id, partitions=messages.topic_partitions(partitions or ()))
        return messages.committed_offsets(self._transport.on_coordinator(group_id, "OffsetFetch", request, timeout_ms))

    def list_groups(self, *, timeout_ms: int | None = None) -> list[GroupListing]:
        """Every consumer group of the cluster (with members or committed offsets): each broker
        lists the groups it coordinates; on a cluster every broker is asked."""
        timeout_s = self._transport.deadline_s(timeout_ms)
        md = self._transport.call("Metadata", pb.MetadataRequest(topics=[]), timeout_s=timeout_s)
        if len(md.brokers) <= 1:
            answers = [self._transport.call("ListGroups", pb.ListGroupsRequest(), timeout_s=timeout_s)]
        else:
            answers = []
            failure: LogstoreError | None = None
            for b in sorted(md.brokers, key=lambda b: b.node_id):
                conn = self._transport.router.connection(f"{b.host}:{b.port}")
                try:
                    answers.append(self._transport.call("ListGroups", pb.ListGroupsRequest(), timeout_s=timeout_s,
                                                        conn=conn))
                except BrokerUnavailableError as e:  # a broker down coordinates nothing now
                    failure = e
            if not answers and failure is not None:
                raise failure
        merged: dict[str, GroupListing] = {}
        for r in answers:
            for g in r.groups:
                merged.setdefault(g.group_id, GroupListing(g.group_id, g.state, g.members, g.assignor))
        return list(merged.values())

    def describe_groups(
        self, group_ids: Sequence[str], *, timeout_ms: int | None = None
    ) -> dict[str, GroupDescription | LogstoreError]:
        """Describe groups: members, assignments, committed offsets (or each group's error); each
        group is asked of its coordinator."""
        out: dict[str, GroupDescription | LogstoreError] = {}
        for group_id in group_ids:
            def attempt(conn: Connection, remaining_s: float, group_id: str = group_id) -> pb.GroupDescription:
                r = self._transport.call("DescribeGroups", pb.DescribeGroupsRequest(group_ids=[group_id]),
                                         timeout_s=remaining_s, conn=conn)
                found = next((g for g in r.groups if g.group_id == group_id), pb.GroupDescription(group_id=group_id))
                raise_for_coordinator_error(found.error)
                return found
            try:
                described = self._transport.coordinators.call(GROUP, group_id, attempt,
                                                              timeout_s=self._transport.deadline_s(timeout_ms))
            except LogstoreError as e:
                out[group_id] = e
                continue
            out[group_id] = messages.group_description(described)
        return out

    def delete_groups(
        self, group_ids: Sequence[str], *, timeout_ms: int | None = None
    ) -> dict[str, LogstoreError | None]:
        """Delete empty groups and their committed offsets at their coordinators; return each
        group's error (None = deleted)."""
        out: dict[str, LogstoreError | None] = {}
        for group_id in group_ids:
            def attempt(conn: Connection, remaining_s: float, group_id: str = group_id) -> LogstoreError | None:
                r = self._transport.call("DeleteGroups", pb.DeleteGroupsRequest(group_ids=[group_id]),
                                         timeout_s=remaining_s, conn=conn)
                found = next((g for g in r.results if g.group_id == group_id), None)
                if found is None:
                    return None
                raise_for_coordinator_error(found.error)
                return error_from_item(found.error)
            try:
                out[group_id] = self._transport.coordinators.call(GROUP, group_id, attempt,
                                                                  timeout_s=self._transport.deadline_s(timeout_ms))
            except LogstoreError as e:
                out[group_id] = e
        return out


def raise_for_coordinator_error(error: pb.Error) -> None:
    """Raise an item's error when it says the coordinator is elsewhere (to find it again)."""
    found = error_from_item(error)
    if isinstance(found, COORDINATOR_ERRORS):
        raise found
