"""Moving a partition's replicas and electing leaders on request: the pure state changes.

A reassignment follows Kafka's steps (KIP-455), each one :class:`PartitionState` written by a
compare-and-swap on the partition's revision:

1. **Start** (:func:`start_reassignment`, the AlterPartitionReassignments handler): replicas =
   target + the old replicas not in it; ``adding`` = target − old, ``removing`` = old − target.
   The replica managers of the adding brokers then create the replica and follow the leader; the
   leader adds each to the ISR once it has caught up (the usual ISR expansion).
2. **Complete** (:func:`complete_reassignment`, the controller, on every view): once every
   target replica is in the ISR, replicas = target, ISR = ISR ∩ target, and when the leader is
   not in the target the first in-sync target replica leads (leader epoch + 1). The brokers
   dropped from the replicas stop and delete their copy (the replica manager does that for every
   replica it no longer hosts).
3. **Cancel** (an empty target): back to the old replicas; an adding replica that meanwhile led
   hands over to the first in-sync old one.

A new target while one runs replaces it (computed from the *old* replicas, as in Kafka).
Leader elections asked for by a client (ElectLeaders): :func:`elect_preferred` (the first
replica, when it is alive and in sync) and :func:`elect_unclean` (any live replica, only when no
ISR member is alive: records only the old ISR had are lost).

Every function is pure; the callers write the result with a CAS and retry on a lost race.
"""

from __future__ import annotations

from collections.abc import Collection, Sequence
from dataclasses import replace

from logstore.errors import (
    ElectionNotNeededError,
    InvalidReplicaAssignmentError,
    LeaderNotAvailableError,
    NoReassignmentInProgressError,
    PreferredLeaderNotAvailableError,
)
from replication.state import NO_LEADER, PartitionState

__all__ = ["start_reassignment", "cancel_reassignment", "complete_reassignment", "elect_preferred",
           "elect_unclean"]


def _name(state: PartitionState) -> str:
    return f"{state.topic}-{state.partition}"


def start_reassignment(state: PartitionState, target: Sequence[int], *, brokers: Collection[int],
                       throttle: int = 0) -> PartitionState:
    """The state that starts moving ``state`` onto ``target`` (empty: cancel the running move).

    Raises :class:`InvalidReplicaAssignmentError` for a target naming a broker twice or a broker
    that is not registered, :class:`NoReassignmentInProgressError` for a cancellation of a
    partition that is not moving."""
    if not target:
        return cancel_reassignment(state)
    if len(set(target)) != len(target):
        raise InvalidReplicaAssignmentError(f"{_name(state)}: the replicas {list(target)} name a broker twice")
    unknown = sorted(set(target) - set(brokers))
    if unknown:
        raise InvalidReplicaAssignmentError(
            f"{_name(state)}: broker(s) {unknown} are not registered (live brokers: {sorted(brokers)})")
    if throttle < 0:
        raise InvalidReplicaAssignmentError(f"the throttle must be >= 0 bytes/s, not {throttle}")
    old = state.original
    adding = tuple(r for r in target if r not in old)
    removing = tuple(r for r in old if r not in target)
    replicas = tuple(target) + removing
    isr = tuple(r for r in state.isr if r in replicas)
    return replace(state, replicas=replicas, isr=isr or state.isr, adding=adding, removing=removing,
                   throttle=throttle if adding else 0, partition_epoch=state.partition_epoch + 1, revision=0)


def cancel_reassignment(state: PartitionState) -> PartitionState:
    """Back to the replicas before the move (:class:`NoReassignmentInProgressError` if none runs)."""
    if not state.reassigning:
        raise NoReassignmentInProgressError(f"{_name(state)} is not being reassigned")
    return _finish(state, state.original)


def _finish(state: PartitionState, replicas: tuple[int, ...], alive: Collection[int] | None = None) -> PartitionState:
    """``state`` with ``replicas`` and no move running; leadership moves to the first in-sync
    (and alive, when ``alive`` is given) replica of the new set if the leader is not in it."""
    isr = tuple(r for r in state.isr if r in replicas)
    done = replace(state, replicas=replicas, adding=(), removing=(), throttle=0, revision=0)
    if state.leader in replicas:
        return replace(done, isr=isr or (state.leader,), partition_epoch=state.partition_epoch + 1)
    leader = next((r for r in replicas if r in isr and (alive is None or r in alive)), NO_LEADER)
    return done.with_leader(leader, isr) if isr else done.with_leader(NO_LEADER, state.isr)


def complete_reassignment(state: PartitionState, *, alive: Collection[int]) -> PartitionState | None:
    """The final state of a running move once every target replica is in the ISR (and some
    target replica alive to lead); None while it must still wait, or when none runs."""
    if not state.reassigning:
        return None
    target = state.target
    if any(r not in state.isr for r in target):
        return None
    if state.leader not in target and not any(r in alive for r in target):
        return None
    return _finish(state, target, alive)


def elect_preferred(state: PartitionState, *, alive: Collection[int],
                    shutting_down: Collection[int] = ()) -> PartitionState:
    """Leadership to the first replica (the preferred leader), which spreads leadership back
    after restarts. :class:`ElectionNotNeededError` if it leads already,
    :class:`PreferredLeaderNotAvailableError` if it is not alive and in sync."""
    preferred = state.replicas[0]
    if state.leader == preferred:
        raise ElectionNotNeededError(f"{_name(state)}: the preferred replica {preferred} leads already")
    if preferred not in alive or preferred in shutting_down or preferred not in state.isr:
        raise PreferredLeaderNotAvailableError(
            f"{_name(state)}: the preferred replica {preferred} is not alive and in sync "
            f"(ISR {list(state.isr)})")
    return state.with_leader(preferred, state.isr)


def elect_unclean(state: PartitionState, *, alive: Collection[int]) -> PartitionState:
    """A leader for a partition with no live ISR member: the first live replica, ISR = [it]
    (records only the old ISR had are lost). With a live leader: :class:`ElectionNotNeededError`;
    with a live ISR member the clean choice is made; with no live replica:
    :class:`LeaderNotAvailableError`."""
    if state.leader in alive:
        raise ElectionNotNeededError(f"{_name(state)}: broker {state.leader} leads it and is alive")
    in_sync = [r for r in state.replicas if r in state.isr and r in alive]
    if in_sync:
        return state.with_leader(in_sync[0], tuple(r for r in state.isr if r in alive))
    live = [r for r in state.replicas if r in alive]
    if not live:
        raise LeaderNotAvailableError(f"{_name(state)}: none of the replicas {list(state.replicas)} is alive")
    return state.with_leader(live[0], (live[0],))
