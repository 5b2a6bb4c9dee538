"""The consumer's side of its group, on the polling thread: :class:`ConsumerCoordinator`.

Kafka's ``ConsumerCoordinator``: a :class:`~logstore.client.consumer.Consumer`
with a ``group_id`` has one. It owns the subscription (a
:class:`~logstore.client.group_member.GroupMembership`, whose heartbeat thread
talks to the broker's group coordinator), committed offsets (commit,
auto-commit, fetch) and the rebalance callbacks. It acts only when the
consumer calls it, from :meth:`Consumer.poll` or the consumer's own methods,
so callbacks run inside ``poll``. Reconciling with the coordinator's latest
answer (:meth:`ConsumerCoordinator.reconcile`) happens in this order:

* lost partitions (the session expired, the member was fenced): dropped
  without a commit, then ``on_partitions_lost`` (default:
  ``on_partitions_revoked``);
* revoked partitions: their positions are committed (with auto-commit), then
  ``on_partitions_revoked`` runs, then they are given up;
* assigned partitions: each resumes at the group's committed offset (else by
  ``auto_offset_reset``), then ``on_partitions_assigned`` runs;
* the owned set is acknowledged to the heartbeat thread.

A callback that raises does not stop the rebalance: ``poll`` raises the
first error once the owned set is acknowledged. Committing from
:meth:`~ConsumerCoordinator.commit` raises; auto-commits and commits before a
revocation or on close only log failures.

The partition states (``assigned``, the consumer's dict from partition to its
position state) are shared with the consumer: both mutate the one dict in
place and never rebind it.

Thread-safety: not thread-safe, like the consumer; call it from the polling
thread (:meth:`leave` from :meth:`Consumer.close`, which may be another one).
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable, Iterable, Mapping
from typing import Any

from logstore.client.group_member import GroupMembership
from logstore.client.rpc import BrokerClient
from logstore.errors import LogstoreError
from logstore.types import OffsetAndMetadata, TopicPartition

__all__ = ["ConsumerCoordinator", "RebalanceCallback"]

log = logging.getLogger("logstore.client.consumer")

# A rebalance callback: called with the partitions revoked, assigned or lost.
RebalanceCallback = Callable[[set[TopicPartition]], Any]


class ConsumerCoordinator:
    """Subscription, committed offsets and rebalances of one consumer; see the module docstring.

    ``assigned`` is the consumer's dict of owned partitions (shared, mutated in
    place); ``add_partitions(partitions)`` makes the consumer own them and
    gives them positions; ``wakeup`` is set when the membership changes.
    """

    def __init__(
        self,
        client: BrokerClient,
        group_id: str,
        *,
        assigned: dict[TopicPartition, Any],
        add_partitions: Callable[[list[TopicPartition]], None],
        wakeup: threading.Event,
        instance_id: str,
        assignor: str,
        rebalance_timeout_ms: int,
        client_id: str,
        auto_commit: bool,
        auto_commit_interval_ms: int,
        on_revoked: RebalanceCallback | None,
        on_assigned: RebalanceCallback | None,
        on_lost: RebalanceCallback | None,
    ) -> None:
        self._client = client
        self.group_id = group_id
        self._assigned = assigned
        self._add_partitions = add_partitions
        self._wakeup = wakeup
        self._instance_id = instance_id
        self._assignor = assignor
        self._rebalance_timeout_ms = rebalance_timeout_ms
        self._client_id = client_id
        self._auto_commit = auto_commit
        self._auto_commit_interval_s = auto_commit_interval_ms / 1000
        self._next_auto_commit = time.monotonic() + self._auto_commit_interval_s
        self._on_revoked = on_revoked
        self._on_assigned = on_assigned
        self._on_lost = on_lost
        self.membership: GroupMembership | None = None  # set while subscribed

    # ------------------------------------------------------------------ subscription

    def subscribe(self, topics: list[str]) -> None:
        """Join the group for ``topics``, or change the subscription of the joined member."""
        if self.membership is not None:
            self.membership.set_topics(topics)
            return
        if self._assigned:
            raise ValueError("this consumer has assigned partitions; call assign([]) before subscribe()")
        self.membership = GroupMembership(
            self._client, self.group_id, topics, instance_id=self._instance_id,
            assignor=self._assignor, rebalance_timeout_ms=self._rebalance_timeout_ms,
            client_id=self._client_id, on_change=self._wakeup.set,
        )

    def unsubscribe(self) -> None:
        """Give up the owned partitions (committing them with auto-commit) and leave the group."""
        membership = self.membership
        if membership is None:
            return
        try:
            owned = set(self._assigned)
            if owned and not membership.snapshot().lost:
                if self._auto_commit:
                    self.commit_positions(owned, quiet=True)
                self._call_back(self._on_revoked, owned, "on_partitions_revoked")
        finally:
            self._assigned.clear()
            self.membership = None
            membership.close()

    def leave(self) -> None:
        """On close: commit (with auto-commit) and revoke what is owned, quietly; leave the group."""
        membership = self.membership
        if membership is None:
            return
        try:
            if self._assigned and not membership.snapshot().lost:
                if self._auto_commit:
                    self.commit_positions(set(self._assigned), quiet=True)
                self._call_back(self._on_revoked, set(self._assigned), "on_partitions_revoked", quiet=True)
            self._assigned.clear()
        finally:
            membership.close()

    # ------------------------------------------------------------------ committed offsets

    def commit(self, offsets: Mapping[TopicPartition, int | OffsetAndMetadata] | None) -> None:
        """Commit ``offsets`` (checked), or the position of every owned partition; raises on failure."""
        if offsets is None:
            self.commit_positions(set(self._assigned))
            return
        for tp, value in offsets.items():
            o = value.offset if isinstance(value, OffsetAndMetadata) else value
            if not isinstance(tp, TopicPartition) or not isinstance(o, int) or o < 0:
                raise ValueError(f"commit takes {{TopicPartition: offset >= 0}}, got {tp!r}: {value!r}")
        self._commit(offsets)

    def committed(self, partitions: Iterable[TopicPartition]) -> dict[TopicPartition, OffsetAndMetadata | None]:
        """The group's committed offsets of ``partitions`` (None where nothing is committed)."""
        wanted = list(partitions)
        found = self._client.groups.fetch_committed_offsets(self.group_id, wanted)
        return {tp: found.get(tp) for tp in wanted}

    def _commit(self, offsets: Mapping[TopicPartition, int | OffsetAndMetadata]) -> None:
        if not offsets:
            return
        if self.membership is not None:
            snap = self.membership.snapshot()
            self._client.groups.commit_offsets(self.group_id, offsets, member_id=snap.member_id,
                                        member_epoch=snap.member_epoch)
        else:
            self._client.groups.commit_offsets(self.group_id, offsets)

    def commit_positions(self, partitions: set[TopicPartition], *, quiet: bool = False) -> None:
        """Commit the positions of ``partitions`` (those that have one); ``quiet`` only logs failures."""
        offsets = {tp: s.position for tp in sorted(partitions)
                   if (s := self._assigned.get(tp)) is not None and s.position is not None}
        try:
            self._commit(offsets)
        except LogstoreError as e:
            if not quiet:
                raise
            log.warning("group %r: committing %d positions failed: %s", self.group_id, len(offsets), e)

    def maybe_auto_commit(self) -> None:
        """Commit the positions if auto-commit is on and its interval has passed (quietly)."""
        if not self._auto_commit or time.monotonic() < self._next_auto_commit:
            return
        self._next_auto_commit = time.monotonic() + self._auto_commit_interval_s
        self.commit_positions(set(self._assigned), quiet=True)

    # ------------------------------------------------------------------ rebalancing

    def _call_back(self, fn: RebalanceCallback | None, partitions: set[TopicPartition], name: str,
                   *, quiet: bool = False) -> None:
        if fn is None or not partitions:
            return
        try:
            fn(set(partitions))
        except Exception:
            if not quiet:
                raise
            log.exception("group %r: %s raised", self.group_id, name)

    def reconcile(self) -> None:
        """Act on the coordinator's latest answer: lose, revoke, then assign partitions."""
        membership = self.membership
        assert membership is not None
        snap = membership.snapshot()
        if snap.fatal is not None:
            raise snap.fatal
        owned = set(self._assigned)
        if snap.lost:
            self._assigned.clear()
            try:
                self._call_back(self._on_lost or self._on_revoked, owned,
                                "on_partitions_lost" if self._on_lost else "on_partitions_revoked")
            finally:
                membership.acknowledge(())
            return
        revoked = owned - snap.assignment
        added = set(snap.assignment) - owned
        if not revoked and not added:
            membership.acknowledge(owned)
            return
        failure: BaseException | None = None
        if revoked:
            if self._auto_commit:
                self.commit_positions(revoked, quiet=True)
            try:
                self._call_back(self._on_revoked, revoked, "on_partitions_revoked")
            except Exception as e:  # the rebalance goes on; poll raises it afterwards
                failure = e
            for tp in revoked:
                del self._assigned[tp]
        if added:
            try:
                self._add_partitions(sorted(added))
            except LogstoreError as e:
                if e.retriable:  # give them back for now; the next poll retries
                    for tp in added:
                        del self._assigned[tp]
                    membership.acknowledge(set(self._assigned))
                    raise
                failure = failure or e  # e.g. auto_offset_reset "none": the partitions stay without a position
        membership.acknowledge(set(self._assigned))
        if added:
            try:
                self._call_back(self._on_assigned, added, "on_partitions_assigned")
            except Exception as e:
                failure = failure or e
        if failure is not None:
            raise failure
