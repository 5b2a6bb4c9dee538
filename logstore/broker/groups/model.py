"""The consumer group protocol's values: what a heartbeat carries and gets back,
committed offsets, the snapshots that describe a group, the coordinator's
settings, and the epoch and state constants.

The protocol these values travel in is specified in
:mod:`logstore.broker.groups.coordinator`; how they are persisted in
:mod:`logstore.broker.groups.records`.

Member epochs a heartbeat may send besides the member's current epoch:
:data:`JOIN_EPOCH` joins (or rejoins owning nothing), :data:`LEAVE_EPOCH`
leaves, :data:`TEMPORARY_LEAVE_EPOCH` leaves *for now* (a static member).
A group's state is :data:`EMPTY` (no members), :data:`STABLE` (every member,
except a static one away for now, holds exactly its target at the
assignment epoch and revokes nothing) or :data:`RECONCILING`.

Thread-safety: immutable values and pure functions.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass

from logstore.broker.groups.assignors import ASSIGNORS, DEFAULT_ASSIGNOR
from logstore.errors import InvalidConfigError, InvalidGroupIdError
from logstore.types import TopicPartition

__all__ = [
    "GroupConfig",
    "Heartbeat",
    "PendingCommit",
    "MemberAssignment",
    "HeartbeatOutcome",
    "CommittedOffset",
    "MemberSnapshot",
    "GroupSnapshot",
    "GroupSummary",
    "MemberKey",
    "TPs",
    "NO_PARTITIONS",
    "validate_group_id",
    "JOIN_EPOCH",
    "LEAVE_EPOCH",
    "TEMPORARY_LEAVE_EPOCH",
    "EMPTY",
    "STABLE",
    "RECONCILING",
    "MAX_GROUP_ID_LENGTH",
]

JOIN_EPOCH = 0
LEAVE_EPOCH = -1
TEMPORARY_LEAVE_EPOCH = -2
EMPTY, STABLE, RECONCILING = "Empty", "Stable", "Reconciling"
MAX_GROUP_ID_LENGTH = 249

MemberKey = tuple[str, str]  # (group id, member id)
TPs = frozenset[TopicPartition]
NO_PARTITIONS: TPs = frozenset()


def validate_group_id(group_id: object) -> str:
    """Return ``group_id`` if it is a usable group id, else raise :class:`InvalidGroupIdError`."""
    if not isinstance(group_id, str) or not group_id:
        raise InvalidGroupIdError("a group id must be a non-empty string")
    if len(group_id) > MAX_GROUP_ID_LENGTH:
        raise InvalidGroupIdError(
            f"group id is {len(group_id)} characters long; the maximum is {MAX_GROUP_ID_LENGTH}"
        )
    if any(ord(c) < 32 or ord(c) == 127 for c in group_id):
        raise InvalidGroupIdError(f"group id {group_id!r} contains control characters")
    return group_id


# --------------------------------------------------------------------------- values


@dataclass(frozen=True, slots=True)
class GroupConfig:
    """Coordinator settings (the broker's ``group_*`` configs).

    ``heartbeat_interval_ms`` is how long the coordinator holds a heartbeat of
    a member that is in sync (a long poll: it answers at once when the
    member's assignment changes); ``session_timeout_ms`` evicts a member that
    sent nothing for that long and must exceed the interval.
    """

    session_timeout_ms: int = 45_000
    heartbeat_interval_ms: int = 5_000
    default_assignor: str = DEFAULT_ASSIGNOR

    def __post_init__(self) -> None:
        if self.heartbeat_interval_ms < 1:
            raise InvalidConfigError(f"group_heartbeat_interval_ms must be >= 1, got {self.heartbeat_interval_ms}")
        if self.session_timeout_ms <= self.heartbeat_interval_ms:
            raise InvalidConfigError(
                f"group_session_timeout_ms ({self.session_timeout_ms}) must exceed "
                f"group_heartbeat_interval_ms ({self.heartbeat_interval_ms})"
            )
        if self.default_assignor not in ASSIGNORS:
            raise InvalidConfigError(
                f"group_assignor {self.default_assignor!r} is unknown; use one of {sorted(ASSIGNORS)}"
            )


@dataclass(frozen=True, slots=True)
class Heartbeat:
    """One heartbeat request (see the module docstring for the epochs).

    ``owned`` is what the member consumes right now; leaving a partition out
    acknowledges its revocation. ``request_seq`` increases with each request
    of a member: an older request that arrives late does not acknowledge
    anything. ``assignor`` empty means no preference.
    """

    group_id: str
    member_id: str
    member_epoch: int
    instance_id: str = ""
    subscribed_topics: tuple[str, ...] = ()
    assignor: str = ""
    owned: TPs = NO_PARTITIONS
    rebalance_timeout_ms: int = 300_000
    request_seq: int = 0
    client_id: str = ""
    client_host: str = ""


@dataclass(frozen=True, slots=True)
class MemberAssignment:
    """The answer to a heartbeat: the member's epoch and the partitions it may consume now."""

    group_id: str
    member_id: str
    member_epoch: int
    assignment: TPs
    heartbeat_interval_ms: int
    session_timeout_ms: int


@dataclass(frozen=True, slots=True)
class HeartbeatOutcome:
    """``state`` (None after a leave); ``in_sync``: the member already knows ``state`` (its
    epoch and owned partitions match), so the broker may hold the answer; ``changed``: members
    whose epoch or assignment this call changed or who were removed (their held heartbeats
    should be answered now)."""

    state: MemberAssignment | None
    in_sync: bool
    changed: frozenset[MemberKey]


@dataclass(frozen=True, slots=True)
class CommittedOffset:
    """A committed offset: the next offset the group will read, plus what the committer said."""

    offset: int
    metadata: str = ""
    commit_timestamp_ms: int = -1
    member_id: str = ""
    member_epoch: int = -1


@dataclass(frozen=True, slots=True)
class PendingCommit:
    """A commit appended to the group log, not yet visible: durable once the replicas reach
    ``positions`` ((topic, partition, end offset); none: durable already); ``seq`` orders it
    among the coordinator's commits."""

    group_id: str
    entries: Mapping[TopicPartition, CommittedOffset]
    seq: int
    positions: tuple[tuple[str, int, int], ...]


@dataclass(frozen=True, slots=True)
class MemberSnapshot:
    member_id: str
    instance_id: str
    client_id: str
    client_host: str
    member_epoch: int
    subscribed_topics: tuple[str, ...]
    assignor: str
    assigned: TPs
    revoking: TPs
    target: TPs
    left: bool  # a static member that left for now; its partitions wait for it


@dataclass(frozen=True, slots=True)
class GroupSnapshot:
    group_id: str
    state: str
    group_epoch: int
    assignment_epoch: int
    assignor: str
    members: tuple[MemberSnapshot, ...]
    offsets: Mapping[TopicPartition, CommittedOffset]


@dataclass(frozen=True, slots=True)
class GroupSummary:
    group_id: str
    state: str
    members: int
    assignor: str
