"""The active controller: elects partition leaders and shrinks ISRs when brokers come and go.

Every broker runs a :class:`Controller`; one at a time wins the election in etcd
(:meth:`MetadataStore.campaign`) and acts, the others wait to take over. The active one
reacts to every :class:`ClusterView` from :meth:`MetadataStore.watch_view` by computing, with
the pure function :func:`decide`, which partition states must change, and writing each with
:meth:`MetadataStore.write_partition`: a CAS on the partition's revision that is also fenced by
the controller epoch, so a deposed controller writes nothing and a write that raced with a
leader's ISR change fails and is decided again on the next view, never forced.

The rules (Kafka's controller, with etcd sessions as liveness; "alive" = registered in the view):

1. **Leader gone** (not alive, or asked for a controlled shutdown): the new leader is the first
   replica, in replica order, that is in the ISR, alive and not shutting down; the new ISR is
   the old ISR without dead or shutting-down brokers. Leader epoch + 1.
2. **No such replica**: with the topic's ``unclean.leader.election.enable`` true, the first alive
   replica leads with ISR = [it] (a warning: records only the old ISR had are lost); otherwise
   the partition goes offline (leader :data:`NO_LEADER`, leader epoch + 1, ISR unchanged) and
   is elected again by rule 1 once an ISR member is back. A shutting-down leader with no other
   ISR member keeps leading (moving would lose data) until its session ends.
3. **Leader alive, ISR lists dead or shutting-down followers**: remove them (partition epoch + 1,
   leader epoch unchanged), so ``acks=all`` stops waiting for brokers that are gone or going.
4. **A reassignment whose target replicas are all in the ISR** (and nothing above to do):
   complete it (:func:`replication.reassignment.complete_reassignment`): replicas = target,
   leadership to the target's first in-sync replica if the leader is not in the target.

Every change is logged at INFO as ``orders-0: leader 1 -> 2 (epoch 4), isr [1, 2, 3] -> [2, 3]``.

Thread-safety: a :class:`Controller` runs on one asyncio event loop; :func:`decide` is pure.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import Collection
from dataclasses import dataclass

from logstore.errors import MetadataStoreError
from replication.metadata_store import MetadataStore
from replication.reassignment import complete_reassignment
from replication.state import NO_LEADER, ClusterView, PartitionState

__all__ = ["Controller", "PartitionChange", "decide", "decide_partition", "leaderships_to_move"]

log = logging.getLogger(__name__)

UNCLEAN_CONFIG = "unclean.leader.election.enable"


@dataclass(frozen=True, slots=True)
class PartitionChange:
    """A decided change: ``after`` is written only if the partition is still ``before``
    (``before.revision``). ``unclean``: the new leader was not in the ISR."""

    before: PartitionState
    after: PartitionState
    unclean: bool = False

    def event_fields(self) -> dict[str, object]:
        """The change as a log event (``leader_changed`` when the leader or its epoch moved, else
        ``isr_changed``), for logstore.broker.log_lines's text and JSON lines."""
        b, a = self.before, self.after
        moved = a.leader != b.leader or a.leader_epoch != b.leader_epoch
        event = "reassignment_completed" if b.reassigning and not a.reassigning else (
            "leader_changed" if moved else "isr_changed")
        return {"event": event, "replicas": list(a.replicas), "previous_replicas": list(b.replicas), "topic": a.topic,
                "partition": a.partition, "leader": a.leader, "leader_epoch": a.leader_epoch,
                "isr": list(a.isr), "previous_leader": b.leader, "previous_isr": list(b.isr),
                "unclean": self.unclean, "decided_by": "controller"}

    def describe(self) -> str:
        b, a = self.before, self.after
        parts = []
        if a.replicas != b.replicas:
            parts.append(f"replicas {list(b.replicas)} -> {list(a.replicas)} (reassignment completed)")
        if a.leader != b.leader or a.leader_epoch != b.leader_epoch:
            parts.append(f"leader {_name(b.leader)} -> {_name(a.leader)} (epoch {a.leader_epoch})")
        if a.isr != b.isr:
            parts.append(f"isr {list(b.isr)} -> {list(a.isr)}")
        return f"{a.topic}-{a.partition}: " + ", ".join(parts) + (" [unclean]" if self.unclean else "")


def _name(node: int) -> str:
    return "none" if node == NO_LEADER else str(node)


def _is_true(value: str | None) -> bool:
    return (value or "").strip().lower() == "true"


def decide_partition(state: PartitionState, *, alive: Collection[int], shutting_down: Collection[int],
                     unclean_allowed: bool = False) -> PartitionChange | None:
    """The change rules 1-3 of the module docstring make to one partition, or None."""
    eligible = [r for r in state.replicas if r in alive and r not in shutting_down]
    if state.leader in alive and state.leader not in shutting_down:
        isr = tuple(r for r in state.isr if r == state.leader or r in eligible)
        return PartitionChange(state, state.with_isr(isr)) if isr != state.isr else None
    candidates = [r for r in state.replicas if r in state.isr and r in eligible]
    if candidates:
        isr = tuple(r for r in state.isr if r in eligible)
        return PartitionChange(state, state.with_leader(candidates[0], isr))
    if state.leader in alive:  # shutting down, but the only ISR member left: keep leading
        isr = tuple(r for r in state.isr if r == state.leader or r in alive)
        return PartitionChange(state, state.with_isr(isr)) if isr != state.isr else None
    if unclean_allowed and eligible:
        return PartitionChange(state, state.with_leader(eligible[0], (eligible[0],)), unclean=True)
    if state.leader != NO_LEADER:
        return PartitionChange(state, state.with_leader(NO_LEADER, state.isr))
    return None


def decide(view: ClusterView, *, unclean_default: bool = False) -> list[PartitionChange]:
    """Every partition change the view calls for, in (topic, partition) order.

    ``unclean_default`` is the broker's default for topics that do not set
    ``unclean.leader.election.enable`` themselves."""
    alive = set(view.brokers)
    changes = []
    for key in sorted(view.partitions):
        state = view.partitions[key]
        topic = view.topics.get(state.topic)
        configured = topic.configs.get(UNCLEAN_CONFIG) if topic is not None else None
        unclean = _is_true(configured) if configured is not None else unclean_default
        change = decide_partition(state, alive=alive, shutting_down=view.shutting_down,
                                  unclean_allowed=unclean)
        if change is None and state.reassigning:
            done = complete_reassignment(state, alive=alive)
            change = PartitionChange(state, done) if done is not None else None
        if change is not None:
            changes.append(change)
    return changes


def leaderships_to_move(view: ClusterView, node_id: int) -> list[PartitionState]:
    """The partitions ``node_id`` leads that a controlled shutdown can still move: those with
    another live ISR member that is not shutting down itself. A shutting-down broker waits until
    this is empty (or its timeout) before it deregisters; partitions it alone holds stay with it
    until it exits (rule 2). When the whole cluster stops at once nothing can move, so nobody
    waits out the timeout."""
    eligible = set(view.brokers) - view.shutting_down
    return [s for _, s in sorted(view.partitions.items())
            if s.leader == node_id and any(r != node_id and r in eligible for r in s.isr)]


class Controller:
    """Campaigns for the controller role forever and, while it holds it, applies :func:`decide`
    to every view (see the module docstring). ``run`` is the task; ``stop`` ends it."""

    def __init__(self, store: MetadataStore, node_id: int, *, unclean_default: bool = False,
                 retry_s: float = 0.5) -> None:
        self._store = store
        self.node_id = node_id
        self._unclean_default = unclean_default
        self._retry_s = retry_s
        self._task: asyncio.Task[None] | None = None
        self._stopping = False
        self.epoch = 0
        """The controller epoch while this node is the active controller; 0 otherwise."""

    @property
    def active(self) -> bool:
        return self.epoch > 0

    async def run(self) -> None:
        """Campaign, act while elected, campaign again after losing the role; until :meth:`stop`."""
        self._task = asyncio.current_task()
        while not self._stopping:
            try:
                epoch = await self._store.campaign(self.node_id)
                self.epoch = epoch
                await self._act(epoch)
            except MetadataStoreError as e:
                log.warning("controller on node %d: %s; retrying in %.1f s", self.node_id, e, self._retry_s)
                await asyncio.sleep(self._retry_s)
            finally:
                self.epoch = 0

    async def _act(self, epoch: int) -> None:
        async for view in self._store.watch_view():
            if view.controller_id != self.node_id or view.controller_epoch != epoch:
                log.info("node %d is no longer the controller (epoch %d; now node %d, epoch %d)",
                         self.node_id, epoch, view.controller_id, view.controller_epoch)
                return
            for change in decide(view, unclean_default=self._unclean_default):
                written = await self._store.write_partition(
                    change.after, expected_revision=change.before.revision, controller_epoch=epoch)
                if not written:
                    log.info("%s-%d: not written (the partition or the controller changed); "
                             "deciding again on the next view", change.after.topic, change.after.partition)
                elif change.unclean:
                    log.warning("%s: unclean election, records only the old ISR had may be lost",
                                change.describe(), extra=change.event_fields())
                else:
                    log.info("%s", change.describe(), extra=change.event_fields())

    async def stop(self) -> None:
        """Stop campaigning and acting, and give up the role if held (another broker takes over
        at once instead of after this broker's session timeout)."""
        self._stopping = True
        task = self._task
        if task is not None and task is not asyncio.current_task():
            task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await task
        with contextlib.suppress(MetadataStoreError):
            await self._store.resign()
