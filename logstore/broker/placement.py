"""Where this broker's partitions are led: what the data plane asks before it appends or reads.

The broker's :class:`~logstore.broker.membership.ClusterMembership` answers these; on a
single broker every partition is local and led here, with one replica.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Protocol

from logstore.storage.log_manager import Partition

if TYPE_CHECKING:
    from replication.replica_manager import ReplicaManager

__all__ = ["Placement"]


class Placement(Protocol):
    """``leader``: the partition this broker leads at the client's leader epoch (or the error
    saying it does not); ``replicas``: the replica manager once the broker has joined a
    cluster, else None; ``replicated``: whether acks=all on the topic waits for followers;
    ``replica_count``: how many replicas the partition has."""

    @property
    def replicas(self) -> ReplicaManager | None: ...

    def leader(self, topic: str, partition: int, current_leader_epoch: int = -1) -> Partition: ...

    def replicated(self, topic: str) -> bool: ...

    def replica_count(self, topic: str, partition: int) -> int: ...
