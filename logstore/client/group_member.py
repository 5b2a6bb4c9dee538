"""The client side of consumer group membership: :class:`GroupMembership` and its heartbeat thread.

A :class:`~logstore.client.consumer.Consumer` created with a ``group_id`` and a
subscription owns one :class:`GroupMembership` (through its
:class:`~logstore.client.consumer_coordinator.ConsumerCoordinator`). Its
thread speaks the heartbeat protocol of :mod:`logstore.broker.groups.coordinator`;
the consumer's polling thread acts on what it learns. The split follows Kafka's consumer
(a background thread for the coordinator, rebalance callbacks only inside
``poll``)::

    heartbeat thread                              polling thread (Consumer.poll)
    ────────────────                              ──────────────────────────────
    join (epoch 0), then heartbeat with owned ──▶ snapshot(): the assignment the
    answer: epoch + assignment ────── notify ──▶    coordinator gives now
                                                  revoke: commit, on_partitions_revoked
                                                  assign: committed offsets, on_partitions_assigned
    heartbeat at once with the new owned set ◀──  acknowledge(owned)

* When the member is in sync (it owns exactly its assignment) its heartbeat
  is a long poll: the broker answers when the assignment changes, or after
  the heartbeat interval. Otherwise the thread waits for the consumer's
  acknowledgement (or the interval, to stay alive) and sends it at once:
  an acknowledgement cancels the held call and is sent immediately.
* UNKNOWN_MEMBER_ID / FENCED_MEMBER_EPOCH (the session expired, e.g. a
  long pause): every partition is *lost*; once the consumer has dropped them
  (``on_partitions_lost``) the thread rejoins with epoch 0.
* ``max_poll_interval_ms`` without a ``poll()``: the member leaves the group
  (its partitions move) and rejoins when ``poll()`` is called again.
* FENCED_INSTANCE_ID (a newer process took this static member's place) and
  other non-retriable errors are fatal: ``poll()`` raises them.
* Retriable errors (broker unavailable) are retried with a backoff; the
  session may expire meanwhile, which the next answer reports.

Thread-safety: all shared state is under one lock; ``snapshot``,
``acknowledge``, ``note_poll`` and ``close`` may be called from any thread.
"""

from __future__ import annotations

import logging
import threading
import time
import uuid
from collections.abc import Callable, Iterable
from dataclasses import dataclass

from logstore.client.results import GroupHeartbeat, RpcFuture
from logstore.client.rpc import BrokerClient
from logstore.errors import (
    FencedMemberEpochError,
    LogstoreError,
    RequestTimedOutError,
    UnknownMemberIdError,
)
from logstore.types import TopicPartition

__all__ = ["GroupMembership", "MembershipState"]

log = logging.getLogger("logstore.client.consumer")

_NONE: frozenset[TopicPartition] = frozenset()
_BACKOFF_S = (0.05, 0.1, 0.2, 0.5, 1.0)


@dataclass(frozen=True, slots=True)
class MembershipState:
    """What the polling thread acts on.

    ``assignment``: the partitions the coordinator lets the member consume now;
    ``lost``: the member was fenced or left — drop everything without committing;
    ``fatal``: raise it from ``poll``.
    """

    member_id: str
    member_epoch: int
    assignment: frozenset[TopicPartition]
    lost: bool
    fatal: LogstoreError | None


class GroupMembership:
    """One member of a consumer group (see the module docstring). Starts heartbeating at once."""

    def __init__(
        self,
        client: BrokerClient,
        group_id: str,
        topics: Iterable[str],
        *,
        instance_id: str = "",
        assignor: str = "",
        rebalance_timeout_ms: int = 300_000,
        client_id: str = "",
        on_change: Callable[[], None] = lambda: None,
    ) -> None:
        self.group_id = group_id
        self.member_id = uuid.uuid4().hex
        self._client = client
        self._instance_id = instance_id
        self._assignor = assignor
        self._rebalance_timeout_ms = rebalance_timeout_ms
        self._client_id = client_id
        self._on_change = on_change
        self._lock = threading.Lock()
        self._wake = threading.Event()  # the heartbeat thread has something to look at
        self._news = False  # ... and it is news for the coordinator: send it now
        self._stopping = threading.Event()
        self._closed = False
        self._topics = tuple(sorted(set(topics)))
        self._epoch = 0
        self._assignment = _NONE
        self._owned = _NONE
        self._lost = False
        self._fatal: LogstoreError | None = None
        self._seq = 0
        self._interval_ms = 1000
        self._last_poll = time.monotonic()
        self._poll_timeout_ms = rebalance_timeout_ms
        self._left_for_poll_timeout = False
        self._thread = threading.Thread(target=self._run, daemon=True,
                                        name=f"logstore-heartbeat-{group_id}")
        self._thread.start()

    # ------------------------------------------------------------------ the polling thread's side

    def snapshot(self) -> MembershipState:
        with self._lock:
            return MembershipState(self.member_id, self._epoch, self._assignment, self._lost, self._fatal)

    @property
    def member_epoch(self) -> int:
        with self._lock:
            return self._epoch

    def acknowledge(self, owned: Iterable[TopicPartition]) -> None:
        """The consumer now consumes exactly ``owned`` (after its rebalance callbacks)."""
        owned = frozenset(owned)
        with self._lock:
            news = owned != self._owned
            if self._lost and not owned:
                self._lost = False  # everything dropped: rejoin
                self._epoch = 0
                self._assignment = _NONE
                news = True
            self._owned = owned
        if news:
            self._signal(news=True)

    def set_topics(self, topics: Iterable[str]) -> None:
        with self._lock:
            self._topics = tuple(sorted(set(topics)))
        self._signal(news=True)

    def note_poll(self) -> None:
        self._last_poll = time.monotonic()
        if self._left_for_poll_timeout:
            self._signal(news=True)

    def close(self, *, timeout_s: float = 5.0) -> None:
        """Stop heartbeating and leave the group (a static member leaves *for now*: epoch -2)."""
        if self._stopping.is_set() and not self._thread.is_alive() and self._closed:
            return
        self._closed = True
        self._stopping.set()
        self._wake.set()
        self._thread.join(timeout_s)
        with self._lock:
            joined = self._epoch > 0 and not self._lost and self._fatal is None
            self._seq += 1
            seq = self._seq
        if not joined:
            return
        epoch = -2 if self._instance_id else -1
        try:
            self._client.groups.group_heartbeat_async(
                self.group_id, member_id=self.member_id, member_epoch=epoch, subscribed_topics=(),
                owned=(), instance_id=self._instance_id, request_seq=seq, client_id=self._client_id,
                timeout_ms=int(timeout_s * 1000),
            ).result(timeout_s + 1)
        except Exception as e:  # noqa: BLE001 - leaving is best effort: the session times out anyway
            log.warning("group %r: leaving failed (%s); the session timeout will release the partitions",
                        self.group_id, e)

    # ------------------------------------------------------------------ the heartbeat thread

    def _signal(self, *, news: bool) -> None:
        if news:
            with self._lock:
                self._news = True
        self._wake.set()

    def _has_news(self) -> bool:
        with self._lock:
            return self._news

    def _sleep(self, seconds: float) -> None:
        """Wait up to ``seconds``, or until there is news for the coordinator, or stop."""
        deadline = time.monotonic() + seconds
        while not self._stopping.is_set() and not self._has_news():
            remaining = deadline - time.monotonic()
            if remaining <= 0:
                return
            self._wake.wait(remaining)
            self._wake.clear()

    def _run(self) -> None:
        failures = 0
        while not self._stopping.is_set():
            with self._lock:
                lost = self._lost
                epoch = self._epoch
                in_sync = epoch > 0 and self._owned == self._assignment
            if lost:
                self._sleep(0.5)  # the consumer drops its partitions in poll(), then we rejoin
                continue
            if self._poll_overdue(epoch):
                continue
            if epoch > 0 and not in_sync:
                # The consumer has partitions to revoke or take; wait for it, but stay alive.
                self._sleep(self._interval_ms / 2000)
            with self._lock:
                self._news = False
                epoch, owned, topics = self._epoch, self._owned, self._topics
                in_sync = epoch > 0 and owned == self._assignment
                self._seq += 1
                seq = self._seq
            if self._stopping.is_set():
                return
            wait_ms = self._interval_ms if in_sync else 0
            try:
                future = self._client.groups.group_heartbeat_async(
                    self.group_id, member_id=self.member_id, member_epoch=epoch, subscribed_topics=topics,
                    owned=owned, instance_id=self._instance_id, assignor=self._assignor,
                    rebalance_timeout_ms=self._rebalance_timeout_ms, max_wait_ms=wait_ms, request_seq=seq,
                    client_id=self._client_id,
                )
            except RuntimeError:  # the client was closed
                return
            answer = self._await(future, wait_ms)
            if answer is None:
                continue  # news for the coordinator: send it at once
            if isinstance(answer, LogstoreError):
                failures = self._failed(answer, failures)
                continue
            failures = 0
            self._apply(answer)

    def _await(self, future: RpcFuture[GroupHeartbeat], wait_ms: int) -> GroupHeartbeat | LogstoreError | None:
        """The answer, or None when news (or stop) came first: the call is then abandoned."""
        future.add_done_callback(lambda _: self._wake.set())
        deadline = time.monotonic() + wait_ms / 1000 + self._client.request_timeout_ms / 1000
        while not future.done():
            if self._stopping.is_set() or self._has_news() or time.monotonic() >= deadline:
                future.cancel_call()
                if not self._stopping.is_set() and not self._has_news():
                    # A coordinator that does not answer (paused, cut off) may have been replaced.
                    self._client.groups.forget_group_coordinator(self.group_id)
                    return RequestTimedOutError(f"group {self.group_id!r}: heartbeat timed out")
                return None
            self._wake.wait(max(0.0, deadline - time.monotonic()))
            self._wake.clear()
        try:
            return future.result()
        except LogstoreError as e:
            return e
        except Exception as e:  # noqa: BLE001
            return LogstoreError(f"heartbeat failed: {type(e).__name__}: {e}")

    def _apply(self, answer: GroupHeartbeat) -> None:
        with self._lock:
            changed = (answer.member_epoch, answer.assignment) != (self._epoch, self._assignment)
            self._epoch = answer.member_epoch
            self._assignment = answer.assignment
            self._interval_ms = max(1, answer.heartbeat_interval_ms or self._interval_ms)
        if changed:
            log.debug("group %r member %s: epoch %d, %d partitions", self.group_id, self.member_id,
                      answer.member_epoch, len(answer.assignment))
            self._on_change()

    def _failed(self, error: LogstoreError, failures: int) -> int:
        if self._stopping.is_set():
            return failures
        if isinstance(error, (UnknownMemberIdError, FencedMemberEpochError)):
            log.warning("group %r: %s; its partitions are lost, rejoining", self.group_id, error.message)
            self._lose()
            return 0
        if error.retriable:
            if failures in (0, 5) or failures % 50 == 0:
                log.warning("group %r heartbeat failed: %s; retrying", self.group_id, error)
            self._sleep(_BACKOFF_S[min(failures, len(_BACKOFF_S) - 1)])
            return failures + 1
        log.error("group %r: %s", self.group_id, error)
        with self._lock:
            self._fatal = error
        self._stopping.set()
        self._on_change()
        return failures

    def _lose(self) -> None:
        with self._lock:
            self._lost = True
            self._epoch = 0
            self._assignment = _NONE
        self._on_change()

    def _poll_overdue(self, epoch: int) -> bool:
        """Leave the group when poll() was not called for max_poll_interval_ms; rejoin when it is."""
        idle_ms = (time.monotonic() - self._last_poll) * 1000
        if idle_ms <= self._poll_timeout_ms:
            self._left_for_poll_timeout = False
            return False
        if not self._left_for_poll_timeout:
            self._left_for_poll_timeout = True
            if epoch > 0:
                log.warning("group %r: poll() was not called for %d ms (max_poll_interval_ms); leaving the "
                            "group so that its partitions move; the next poll() rejoins", self.group_id, idle_ms)
                with self._lock:
                    self._seq += 1
                    seq = self._seq
                try:
                    self._client.groups.group_heartbeat_async(
                        self.group_id, member_id=self.member_id, member_epoch=-1, subscribed_topics=(),
                        owned=(), request_seq=seq).result(self._client.request_timeout_ms / 1000 + 1)
                except Exception as e:  # noqa: BLE001
                    log.warning("group %r: leaving failed: %s", self.group_id, e)
                self._lose()
        self._sleep(0.5)
        with self._lock:
            self._news = False
        return True
