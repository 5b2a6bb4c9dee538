"""A partition leader asks a transaction's coordinator before it takes its first batch (KIP-890).

On a single broker the coordinator that knows every transactional producer sits
beside the partitions, and :meth:`TransactionCoordinator.verify_partition` checks
each transactional batch before it is appended. On a cluster a partition's leader
is often not the coordinator of the producer's transactional id, and knows
nothing of the transaction. Taking such a batch unchecked let anyone with Write
on a topic open a transaction there that no coordinator would ever end: the
partition's last stable offset stayed at that batch forever and every
read_committed reader stalled (issue 22).

So the producer names its transactional id on Produce (its ``transactional_id``,
which the broker authorizes as WRITE on that id), and before the *first*
transactional batch of a transaction is appended to a partition the leader asks
the id's coordinator, with the inter-broker ``AddPartitionsToTxn`` and
``verify_only`` set, whether the partition is in the producer's open transaction
at that epoch (:meth:`TxnVerifier.verify`). Later batches of the same
transaction continue the transaction open on the partition and need no question:
one round trip per partition per transaction, as in Kafka. The leader takes a
*verification guard* before asking (:meth:`Partition.verification_guard`); a
marker drops it, so the batch cannot reopen a transaction that ended while the
question was out.

Errors: the coordinator's own answer (INVALID_TXN_STATE when the partition is not
in the transaction, PRODUCER_FENCED, NOT_COORDINATOR, ...) is the produce's
error for that partition; a coordinator that cannot be reached answers
COORDINATOR_NOT_AVAILABLE. Both of the latter are retriable, so the producer
tries again.

Thread-safety: :meth:`TxnVerifier.verify` runs on the event loop (channels are
made and used there); the coordinator's local check runs on the I/O pool.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from typing import TYPE_CHECKING, Any

import grpc

from logstore._proto import logstore_pb2 as pb
from logstore.broker.transactions.records import TXN_STATE_TOPIC
from logstore.errors import (
    WIRE_CODE_KEY,
    CoordinatorNotAvailableError,
    InvalidTxnStateError,
    error_for_code,
)

if TYPE_CHECKING:
    from logstore.broker.transactions.coordinator import TransactionCoordinator
    from replication.link_auth import LinkSession
    from replication.state import ClusterView

__all__ = ["TxnVerifier"]

_CALL = "/logstore.v1.Logstore/AddPartitionsToTxn"
_TIMEOUT_S = 2.0


class TxnVerifier:
    """Confirms with a transactional id's coordinator that a partition is in its open transaction.

    ``view()`` is the broker's cluster view (where each ``__transaction_state`` partition is
    led), ``partition_of(transactional_id)`` the state partition of an id, ``channel_for(node)``
    the channel and SASL session to a peer broker, ``run_io`` runs a call on the I/O pool.
    """

    def __init__(self, node_id: int, *, coordinator: TransactionCoordinator,
                 view: Callable[[], ClusterView | None], partition_of: Callable[[str], int],
                 channel_for: Callable[[int], tuple[grpc.aio.Channel, LinkSession | None] | None],
                 run_io: Callable[..., Awaitable[Any]], timeout_s: float = _TIMEOUT_S) -> None:
        self._node_id = node_id
        self._coordinator = coordinator
        self._view = view
        self._partition_of = partition_of
        self._channel_for = channel_for
        self._run_io = run_io
        self._timeout_s = timeout_s

    async def verify(self, transactional_id: str, producer_id: int, producer_epoch: int,
                     topic: str, partition: int) -> None:
        """Return if ``topic``-``partition`` is in the open transaction of ``transactional_id``
        with this producer id and epoch; raise the coordinator's error otherwise."""
        if not transactional_id:
            raise InvalidTxnStateError(
                f"a transactional batch for {topic}-{partition} names no transactional id: on a cluster "
                "a Produce with transactional batches must carry its producer's transactional_id")
        view = self._view()
        state = None if view is None else view.partitions.get((TXN_STATE_TOPIC, self._partition_of(transactional_id)))
        if state is None or state.leader < 0:
            raise CoordinatorNotAvailableError(
                f"the coordinator of transactional id {transactional_id!r} is not available; retry")
        if state.leader == self._node_id:
            await self._run_io(self._coordinator.verify_member, transactional_id, producer_id, producer_epoch,
                               [(topic, partition)])
            return
        await self._ask(state.leader, pb.AddPartitionsToTxnRequest(
            transactional_id=transactional_id, producer_id=producer_id, producer_epoch=producer_epoch,
            partitions=[pb.TopicPartitionRef(topic=topic, partition=partition)], verify_only=True))

    async def _ask(self, node: int, request: pb.AddPartitionsToTxnRequest) -> None:
        found = self._channel_for(node)
        if found is None:
            raise CoordinatorNotAvailableError(f"broker {node}, the transaction coordinator, is not registered")
        channel, session = found
        call = channel.unary_unary(_CALL, request_serializer=pb.AddPartitionsToTxnRequest.SerializeToString,
                                   response_deserializer=pb.AddPartitionsToTxnResponse.FromString)
        try:
            metadata = await session.metadata(channel, self._timeout_s) if session is not None else None
            answer: pb.AddPartitionsToTxnResponse = await call(request, timeout=self._timeout_s, metadata=metadata)
        except grpc.aio.AioRpcError as e:
            if session is not None:
                session.invalidate()  # refused for its session, perhaps: log in again next time
            code = dict(e.trailing_metadata() or ()).get(WIRE_CODE_KEY)
            if isinstance(code, str) and code:
                raise error_for_code(code, e.details() or code) from e
            raise CoordinatorNotAvailableError(
                f"broker {node}, the coordinator of {request.transactional_id!r}, did not answer the "
                f"transaction check: {e.code().name}") from e
        if answer.error.code:
            raise error_for_code(answer.error.code, answer.error.message or answer.error.code)
