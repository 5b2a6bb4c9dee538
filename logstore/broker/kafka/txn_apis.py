"""The Kafka APIs of producer ids and transactions: InitProducerId, AddPartitionsToTxn, EndTxn.

A Kafka producer with ``transactional.id`` goes through the same transaction coordinator
as logstore's own transactional producers
(:class:`~logstore.broker.transactions.coordinator.TransactionCoordinator`): the same
fencing by epoch, the same COMMIT/ABORT markers, the same ``read_committed`` view for
every reader (Kafka's, logstore's, Spark's). FindCoordinator for a transactional id is
answered by :mod:`.group_apis` (this broker coordinates every id: a single broker).

=====================  ========  ==============================================
API (key)              versions  notes
=====================  ========  ==============================================
InitProducerId (22)    0-4       idempotent producers (a producer id, epoch 0);
                                 a transactional id fences its previous producer
                                 and aborts its open transaction; v3+ producer
                                 id and epoch: KIP-360's epoch bump
AddPartitionsToTxn     0-3       the client's version (v4+ is Kafka's broker-to-
(24)                             broker batch); if one partition is refused the
                                 others answer OPERATION_NOT_ATTEMPTED (55)
EndTxn (26)            0-4       commit or abort the open transaction; a retry
                                 of a completed one succeeds
=====================  ========  ==============================================

Not served yet (absent from ApiVersions): AddOffsetsToTxn and TxnOffsetCommit, the
consumer offsets of a transaction (``send_offsets_to_transaction``).

Errors: PRODUCER_FENCED is Kafka's answer from InitProducerId v4, AddPartitionsToTxn v2 and
EndTxn v2 on; older versions are answered INVALID_PRODUCER_EPOCH, as Kafka's broker does.

Thread-safety: event loop only; the coordinator's calls run on ``run_io``.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from typing import TYPE_CHECKING, Any

from kio.schema.errors import ErrorCode

from logstore.broker.kafka.error_codes import kafka_error_code
from logstore.broker.kafka.messages import NO_THROTTLE, build, nested, response_of
from logstore.errors import LogstoreError
from logstore.naming import validate_transactional_id

if TYPE_CHECKING:
    from logstore.broker.placement import Placement
    from logstore.broker.transactions.coordinator import TransactionCoordinator

__all__ = ["TXN_APIS", "KafkaTxnApis"]

INIT_PRODUCER_ID, ADD_PARTITIONS_TO_TXN, END_TXN = 22, 24, 26
TXN_APIS: dict[int, tuple[int, int]] = {INIT_PRODUCER_ID: (0, 4), ADD_PARTITIONS_TO_TXN: (0, 3), END_TXN: (0, 4)}
# The first version of each API that may answer PRODUCER_FENCED (KIP-588); older: INVALID_PRODUCER_EPOCH.
_FENCED_SINCE = {INIT_PRODUCER_ID: 4, ADD_PARTITIONS_TO_TXN: 2, END_TXN: 2}
_DEFAULT_TIMEOUT_MS = 60_000


class KafkaTxnApis:
    """Answers the APIs of :data:`TXN_APIS`; see the module docstring."""

    def __init__(self, *, coordinator: TransactionCoordinator, placement: Placement,
                 run_io: Callable[..., Awaitable[Any]]) -> None:
        self._coordinator = coordinator
        self._placement = placement
        self._run_io = run_io

    def handlers(self) -> dict[int, Callable[[Any], Awaitable[Any]]]:
        return {INIT_PRODUCER_ID: self._init_producer_id, ADD_PARTITIONS_TO_TXN: self._add_partitions_to_txn,
                END_TXN: self._end_txn}

    async def _init_producer_id(self, request: Any) -> Any:
        response_type = response_of(request)
        txn_id = request.transactional_id or ""
        timeout_ms = int(request.transaction_timeout.total_seconds() * 1000) or _DEFAULT_TIMEOUT_MS
        pid, epoch = int(getattr(request, "producer_id", -1)), int(getattr(request, "producer_epoch", -1))
        current = (pid, epoch) if txn_id and pid >= 0 and epoch >= 0 else None
        try:
            if txn_id:
                validate_transactional_id(txn_id)
            pid, epoch = await self._run_io(lambda: self._coordinator.init_producer_id(
                txn_id, timeout_ms=timeout_ms, current=current))
        except LogstoreError as e:
            return build(response_type, throttle_time=NO_THROTTLE, error_code=_code(e, request),
                         producer_id=-1, producer_epoch=-1)
        return build(response_type, throttle_time=NO_THROTTLE, error_code=ErrorCode.none, producer_id=pid,
                     producer_epoch=epoch)

    async def _add_partitions_to_txn(self, request: Any) -> Any:
        response_type = response_of(request)
        topic_type = nested(response_type, "AddPartitionsToTxnTopicResult")
        partition_type = nested(response_type, "AddPartitionsToTxnPartitionResult")
        wanted = [(t.name, int(p)) for t in request.v3_and_below_topics for p in t.partitions]
        refused: dict[tuple[str, int], ErrorCode] = {}
        for tp in wanted:
            try:
                self._placement.leader(*tp)  # the partition exists (and is served here)
            except LogstoreError as e:
                refused[tp] = kafka_error_code(e)
        if refused:
            codes = {tp: refused.get(tp, ErrorCode.operation_not_attempted) for tp in wanted}
        else:
            try:
                await self._run_io(lambda: self._coordinator.add_partitions(
                    request.v3_and_below_transactional_id, int(request.v3_and_below_producer_id),
                    int(request.v3_and_below_producer_epoch), wanted))
                codes = dict.fromkeys(wanted, ErrorCode.none)
            except LogstoreError as e:
                codes = dict.fromkeys(wanted, _code(e, request))
        return build(response_type, throttle_time=NO_THROTTLE, results_by_topic_v3_and_below=tuple(
            build(topic_type, name=t.name, results_by_partition=tuple(
                build(partition_type, partition_index=p, partition_error_code=codes[(t.name, int(p))])
                for p in t.partitions))
            for t in request.v3_and_below_topics))

    async def _end_txn(self, request: Any) -> Any:
        response_type = response_of(request)
        txn_id = request.transactional_id

        def end() -> None:
            meta = self._coordinator.describe(txn_id)  # Kafka's EndTxn names no transaction: the open one
            self._coordinator.end_txn(txn_id, int(request.producer_id), int(request.producer_epoch),
                                      0 if meta is None else meta.txn_number, commit=bool(request.committed))
        try:
            await self._run_io(end)
        except LogstoreError as e:
            return build(response_type, throttle_time=NO_THROTTLE, error_code=_code(e, request))
        return build(response_type, throttle_time=NO_THROTTLE, error_code=ErrorCode.none)


def _code(error: LogstoreError, request: Any) -> ErrorCode:
    """``error``'s Kafka code, as the version of ``request`` knows it."""
    code = kafka_error_code(error)
    if code == ErrorCode.producer_fenced and request.__version__ < _FENCED_SINCE[request.__api_key__]:
        return ErrorCode.invalid_producer_epoch
    return code
