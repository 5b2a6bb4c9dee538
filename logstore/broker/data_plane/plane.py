"""The data plane: produce and fetch over this broker's partitions, with no RPC in it.

Kafka's ``ReplicaManager`` in our terms: what every front end (the gRPC service today; a
Kafka-protocol listener next) calls to append records and to read them, for clients and
for follower replicas alike. :class:`DataPlane` is built once per broker from its
collaborators (the log manager, where partitions are led, the replica manager of a
cluster, the transaction coordinator and verifier, the I/O pool) and owns:

* :class:`~logstore.broker.data_plane.produce.AppendPath` — ``append_records``;
* :class:`~logstore.broker.data_plane.fetch.FetchPath` — ``fetch_records``, one path for
  consumers and followers;
* :class:`~logstore.broker.data_plane.waiters.PartitionWaiters` — the one wake-up mechanism:
  :meth:`DataPlane.wake` after every append, transaction marker and HWM move, waking
  consumers and followers waiting on that partition alike.

Thread-safety: event loop only (disk work goes to ``run_io``).
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable, Sequence
from typing import TYPE_CHECKING, Any

from logstore.broker.data_plane.fetch import FetchPath
from logstore.broker.data_plane.params import FetchParams, PartitionAppend, PartitionRead
from logstore.broker.data_plane.produce import AppendPath, RecordsForPartition
from logstore.broker.data_plane.waiters import PartitionWaiters
from logstore.broker.placement import Placement
from logstore.errors import InvalidRequestError
from logstore.record import BatchHeader
from logstore.storage.log_manager import LogManager, Partition
from logstore.storage.validation import ValidatedRecords

if TYPE_CHECKING:
    from logstore.broker.transactions.coordinator import TransactionCoordinator
    from logstore.broker.transactions.verifier import TxnVerifier

__all__ = ["DataPlane"]


class DataPlane:
    """Appends and reads for every front end; see the module docstring.

    ``placement``: where partitions are led (:class:`~.placement.Placement`, the broker's
    cluster membership); ``max_fetch_reply_bytes``: a consumer answer's ceiling;
    ``on_appended``: told of each partition appended (metrics).
    """

    def __init__(self, *, manager: LogManager, run_io: Callable[..., Awaitable[Any]],
                 placement: Placement, coordinator: TransactionCoordinator, txn_verifier: TxnVerifier,
                 max_decompressed_bytes: int, max_fetch_reply_bytes: int,
                 on_appended: Callable[[str, int, int, ValidatedRecords], None] | None = None) -> None:
        self._manager = manager
        self._placement = placement
        self.waiters = PartitionWaiters()
        self._appends = AppendPath(
            manager=manager, run_io=run_io, placement=placement, coordinator=coordinator, txn_verifier=txn_verifier, wake=self.wake,
            max_decompressed_bytes=max_decompressed_bytes, on_appended=on_appended)
        self._fetches = FetchPath(waiters=self.waiters, leader=placement.leader, replica_partition=self._replica_partition,
                                  exists=manager.hosts, run_io=run_io, max_reply_bytes=max_fetch_reply_bytes)

    async def append_records(self, partitions: Sequence[RecordsForPartition], *, acks: int, timeout_ms: int,
                             transactional_id: str = "",
                             check_producer: Callable[[BatchHeader], None] | None = None,
                             ) -> list[PartitionAppend]:
        """Append each partition's records as ``acks`` asks (see :mod:`.produce`)."""
        return await self._appends.append_records(partitions, acks=acks, timeout_ms=timeout_ms,
                                                  transactional_id=transactional_id, check_producer=check_producer)

    async def fetch_records(self, params: FetchParams) -> list[PartitionRead]:
        """Read for a consumer or a follower (see :mod:`.fetch`)."""
        return await self._fetches.fetch_records(params)

    def wake(self, topic: str, partition: int) -> None:
        """Something new may be readable on the partition (an append, a marker, a HWM move)."""
        self.waiters.wake(topic, partition)

    def close(self) -> None:
        """The broker stops: waiting fetches answer now."""
        self.waiters.wake_all()

    async def _replica_partition(self, follower: int, topic: str, partition: int, offset: int,
                                 current_leader_epoch: int, first: bool) -> Partition:
        replicas = self._placement.replicas
        if replicas is None:  # a front end refuses a replica fetch outside a cluster first
            raise InvalidRequestError(f"a replica fetch of {topic}-{partition}: this broker is not part of a cluster")
        return await replicas.replica_partition(follower, topic, partition, offset, current_leader_epoch,
                                                record=first)
