"""The Kafka APIs of producer ids and transactions: InitProducerId, AddPartitionsToTxn, EndTxn,
and a transaction's consumer offsets: AddOffsetsToTxn and TxnOffsetCommit.

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
AddOffsetsToTxn (25)   0-4       adds the group's partition of
                                 ``__consumer_offsets`` to the transaction, so
                                 EndTxn's marker ends its offsets there too
EndTxn (26)            0-4       commit or abort the open transaction; a retry
                                 of a completed one succeeds
TxnOffsetCommit (28)   0-4       the transaction's consumer offsets: checked to
                                 be of the producer's open transaction with the
                                 group's partition added (else INVALID_TXN_STATE),
                                 fenced as a member's commit from v3 (member id
                                 and generation, KIP-447), then *pending* in the
                                 group coordinator until the marker
=====================  ========  ==============================================

``send_offsets_to_transaction`` is AddOffsetsToTxn to the transaction coordinator, then
TxnOffsetCommit to the group coordinator. The offsets are written to the group's log as a
transactional batch of the producer and become the group's committed offsets when the
transaction's COMMIT marker lands there; an ABORT drops them
(:meth:`~logstore.broker.groups.coordinator.GroupCoordinator.commit_txn_offsets`). v5 of
TxnOffsetCommit (KIP-890's transactions v2, which adds the partition implicitly) is not served.

Authorization, as Kafka's: every API needs WRITE on the transactional id
(TRANSACTIONAL_ID_AUTHORIZATION_FAILED, for every partition where the answer has
partitions); AddPartitionsToTxn also WRITE on each topic (TOPIC_AUTHORIZATION_FAILED, the
other partitions OPERATION_NOT_ATTEMPTED); AddOffsetsToTxn and TxnOffsetCommit also READ on
the group (GROUP_AUTHORIZATION_FAILED), TxnOffsetCommit READ on each topic. An idempotent
producer's InitProducerId needs IDEMPOTENT_WRITE on the cluster or WRITE on some topic
(CLUSTER_AUTHORIZATION_FAILED), and the producer id it gets is bound to the caller
(:meth:`~logstore.broker.security.authorization.Authorization.issue_producer_id`).

Errors: PRODUCER_FENCED is Kafka's answer from InitProducerId v4, AddPartitionsToTxn v2,
AddOffsetsToTxn v2 and EndTxn v2 on; older versions, and TxnOffsetCommit (whose versions
never added it), are answered INVALID_PRODUCER_EPOCH, as Kafka's broker does.

Thread-safety: event loop only; the coordinator's calls run on ``run_io``.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
from collections.abc import Awaitable, Callable, Coroutine
from typing import TYPE_CHECKING, Any

from kio.schema.errors import ErrorCode

from logstore.broker.groups.model import validate_group_id
from logstore.broker.kafka.cluster import GROUPS_TOPIC, KafkaCluster
from logstore.broker.kafka.error_codes import kafka_error_code
from logstore.broker.kafka.messages import NO_THROTTLE, build, nested, response_of
from logstore.broker.kafka.request_context import RequestContext
from logstore.broker.security.acls import CLUSTER_NAME
from logstore.errors import CoordinatorNotAvailableError, LogstoreError
from logstore.naming import validate_transactional_id
from logstore.types import TopicPartition

if TYPE_CHECKING:
    from logstore.broker.groups.coordinator import GroupCoordinator
    from logstore.broker.security.authorization import Authorization
    from logstore.broker.transactions.coordinator import TransactionCoordinator

__all__ = ["TXN_APIS", "KafkaTxnApis"]

_VERIFY_TIMEOUT_S = 10.0  # the coordinator's check, asked over the cluster (its own RPC times out at 2 s)

INIT_PRODUCER_ID, ADD_PARTITIONS_TO_TXN, ADD_OFFSETS_TO_TXN, END_TXN, TXN_OFFSET_COMMIT = 22, 24, 25, 26, 28
TXN_APIS: dict[int, tuple[int, int]] = {INIT_PRODUCER_ID: (0, 4), ADD_PARTITIONS_TO_TXN: (0, 3),
                                        ADD_OFFSETS_TO_TXN: (0, 4), END_TXN: (0, 4), TXN_OFFSET_COMMIT: (0, 4)}
# The first version of each API that may answer PRODUCER_FENCED (KIP-588); older: INVALID_PRODUCER_EPOCH.
_NEVER = 1 << 15
_FENCED_SINCE = {INIT_PRODUCER_ID: 4, ADD_PARTITIONS_TO_TXN: 2, ADD_OFFSETS_TO_TXN: 2, END_TXN: 2,
                 TXN_OFFSET_COMMIT: _NEVER}
_DEFAULT_TIMEOUT_MS = 60_000


class KafkaTxnApis:
    """Answers the APIs of :data:`TXN_APIS`; see the module docstring.

    ``coordinator`` is the transaction coordinator, ``groups`` the group coordinator (a
    transaction's offsets); ``offsets_partition(group_id)`` the ``__consumer_offsets``
    partition of a group (blocking: it may create the topic); ``cluster`` says which
    partitions exist and which groups this broker coordinates; ``run_io`` runs a call on the
    broker's I/O pool. ``verify(transactional_id, producer_id, producer_epoch, topic,
    partition)``, on a cluster, asks the id's coordinator (maybe another broker) whether the
    partition is in the producer's open transaction (None: a single broker, whose own
    ``coordinator`` answers). ``authorization`` answers the ACL checks.
    """

    def __init__(self, *, coordinator: TransactionCoordinator, groups: GroupCoordinator,
                 offsets_partition: Callable[[str], tuple[str, int]], cluster: KafkaCluster,
                 authorization: Authorization, run_io: Callable[..., Awaitable[Any]],
                 verify: Callable[[str, int, int, str, int], Coroutine[Any, Any, None]] | None = None) -> None:
        self._coordinator = coordinator
        self._authorization = authorization
        self._groups = groups
        self._offsets_partition = offsets_partition
        self._cluster = cluster
        self._verify = verify
        self._run_io = run_io

    def handlers(self) -> dict[int, Callable[[Any, RequestContext], Awaitable[Any]]]:
        return {INIT_PRODUCER_ID: self._init_producer_id, ADD_PARTITIONS_TO_TXN: self._add_partitions_to_txn,
                ADD_OFFSETS_TO_TXN: self._add_offsets_to_txn, END_TXN: self._end_txn,
                TXN_OFFSET_COMMIT: self._txn_offset_commit}

    def _group_partition(self, group_id: str) -> tuple[str, int]:
        """The group's ``__consumer_offsets`` partition (blocking); INVALID_GROUP_ID for a bad id."""
        validate_group_id(group_id)
        return self._offsets_partition(group_id)

    async def _add_offsets_to_txn(self, request: Any, context: RequestContext) -> Any:
        response_type = response_of(request)
        refusal = self._refusal(context, request.transactional_id, request.group_id)
        if refusal is not None:
            return build(response_type, throttle_time=NO_THROTTLE, error_code=refusal)

        def add() -> None:
            tp = self._group_partition(request.group_id)
            self._coordinator.add_partitions(request.transactional_id, int(request.producer_id),
                                             int(request.producer_epoch), [tp])
        try:
            await self._run_io(add)
        except LogstoreError as e:
            return build(response_type, throttle_time=NO_THROTTLE, error_code=_code(e, request))
        return build(response_type, throttle_time=NO_THROTTLE, error_code=ErrorCode.none)

    async def _txn_offset_commit(self, request: Any, context: RequestContext) -> Any:
        response_type = response_of(request)
        topic_type = nested(response_type, "TxnOffsetCommitResponseTopic")
        partition_type = nested(response_type, "TxnOffsetCommitResponsePartition")
        codes: dict[TopicPartition, ErrorCode] = {}
        offsets: dict[TopicPartition, tuple[int, str]] = {}
        refusal = self._refusal(context, request.transactional_id, request.group_id)
        if refusal is None:
            try:  # the group's coordinator takes its offsets (NOT_COORDINATOR: the client finds it again)
                self._cluster.check_coordinator(GROUPS_TOPIC, request.group_id)
            except LogstoreError as e:
                refusal = _code(e, request)
        for topic in request.topics:
            readable = self._authorization.allowed(context.principal, "READ", "TOPIC", topic.name)
            for p in topic.partitions:
                tp = TopicPartition(topic.name, int(p.partition_index))
                if refusal is not None or not readable:
                    codes[tp] = refusal if refusal is not None else ErrorCode.topic_authorization_failed
                    continue
                try:
                    self._cluster.check_partition(tp.topic, tp.partition)  # it exists, wherever it is led
                    offsets[tp] = (int(p.committed_offset), p.committed_metadata or "")
                except LogstoreError as e:
                    codes[tp] = kafka_error_code(e)

        loop = asyncio.get_running_loop()

        def commit() -> None:
            tp = self._group_partition(request.group_id)
            txn = (request.transactional_id, int(request.producer_id), int(request.producer_epoch))

            def verify() -> None:
                if self._verify is None:
                    self._coordinator.verify_member(*txn, [tp])
                    return
                asked: concurrent.futures.Future[None] = asyncio.run_coroutine_threadsafe(self._verify(*txn, *tp), loop)  # maybe another broker
                try:
                    asked.result(_VERIFY_TIMEOUT_S)
                except TimeoutError:
                    asked.cancel()
                    raise CoordinatorNotAvailableError(
                        f"the coordinator of transactional id {txn[0]!r} did not confirm its transaction in "
                        f"{_VERIFY_TIMEOUT_S:g} s; retry") from None
            self._groups.commit_txn_offsets(
                request.group_id, producer_id=int(request.producer_id), producer_epoch=int(request.producer_epoch),
                member_id=getattr(request, "member_id", ""), member_epoch=int(getattr(request, "generation_id", -1)),
                offsets=offsets,
                # The producer's open transaction, with the group's partition added (AddOffsetsToTxn):
                # its marker there is what ends these offsets.
                verify=verify)
        if offsets:  # a partition that does not exist is refused, the others committed (as Kafka's)
            try:
                await self._run_io(commit)
            except LogstoreError as e:
                codes.update(dict.fromkeys(offsets, _code(e, request)))
        return build(response_type, throttle_time=NO_THROTTLE, topics=tuple(
            build(topic_type, name=topic.name, partitions=tuple(
                build(partition_type, partition_index=p.partition_index,
                      error_code=codes.get(TopicPartition(topic.name, int(p.partition_index)), ErrorCode.none))
                for p in topic.partitions))
            for topic in request.topics))

    async def _init_producer_id(self, request: Any, context: RequestContext) -> Any:
        response_type = response_of(request)
        txn_id = request.transactional_id or ""
        timeout_ms = int(request.transaction_timeout.total_seconds() * 1000) or _DEFAULT_TIMEOUT_MS
        pid, epoch = int(getattr(request, "producer_id", -1)), int(getattr(request, "producer_epoch", -1))
        current = (pid, epoch) if txn_id and pid >= 0 and epoch >= 0 else None
        authz, principal = self._authorization, context.principal
        try:
            if txn_id:
                validate_transactional_id(txn_id)
                authz.check(principal, "WRITE", "TRANSACTIONAL_ID", txn_id)
            elif not (authz.allowed(principal, "IDEMPOTENT_WRITE", "CLUSTER", CLUSTER_NAME)
                      or authz.allowed_some_topic(principal, "WRITE")):  # Kafka's KIP-679 rule
                authz.check(principal, "IDEMPOTENT_WRITE", "CLUSTER")
            pid, epoch = await self._run_io(lambda: self._coordinator.init_producer_id(
                txn_id, timeout_ms=timeout_ms, current=current))
            if not txn_id:
                pid = authz.issue_producer_id(pid, principal)  # bound to the caller (authorizer on)
        except LogstoreError as e:
            return build(response_type, throttle_time=NO_THROTTLE, error_code=_code(e, request),
                         producer_id=-1, producer_epoch=-1)
        return build(response_type, throttle_time=NO_THROTTLE, error_code=ErrorCode.none, producer_id=pid,
                     producer_epoch=epoch)

    async def _add_partitions_to_txn(self, request: Any, context: RequestContext) -> Any:
        response_type = response_of(request)
        topic_type = nested(response_type, "AddPartitionsToTxnTopicResult")
        partition_type = nested(response_type, "AddPartitionsToTxnPartitionResult")
        wanted = [(t.name, int(p)) for t in request.v3_and_below_topics for p in t.partitions]
        refused: dict[tuple[str, int], ErrorCode] = {}
        authz, principal = self._authorization, context.principal
        if not authz.allowed(principal, "WRITE", "TRANSACTIONAL_ID", request.v3_and_below_transactional_id):
            refused = dict.fromkeys(wanted, ErrorCode.transactional_id_authorization_failed)
        for tp in wanted if not refused else ():
            try:
                authz.check(principal, "WRITE", "TOPIC", tp[0])
                self._cluster.check_partition(*tp)  # it exists, wherever it is led
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

    async def _end_txn(self, request: Any, context: RequestContext) -> Any:
        response_type = response_of(request)
        txn_id = request.transactional_id
        refusal = self._refusal(context, txn_id, None)
        if refusal is not None:
            return build(response_type, throttle_time=NO_THROTTLE, error_code=refusal)

        def end() -> None:
            meta = self._coordinator.describe(txn_id)  # Kafka's EndTxn names no transaction: the open one
            self._coordinator.end_txn(txn_id, int(request.producer_id), int(request.producer_epoch),
                                      0 if meta is None else meta.txn_number, commit=bool(request.committed))
        try:
            await self._run_io(end)
        except LogstoreError as e:
            return build(response_type, throttle_time=NO_THROTTLE, error_code=_code(e, request))
        return build(response_type, throttle_time=NO_THROTTLE, error_code=ErrorCode.none)


    def _refusal(self, context: RequestContext, transactional_id: str, group_id: str | None) -> ErrorCode | None:
        """TRANSACTIONAL_ID_AUTHORIZATION_FAILED without WRITE on ``transactional_id``, else
        GROUP_AUTHORIZATION_FAILED without READ on ``group_id`` (when given); None: allowed."""
        authz, principal = self._authorization, context.principal
        if not authz.allowed(principal, "WRITE", "TRANSACTIONAL_ID", transactional_id):
            return ErrorCode.transactional_id_authorization_failed
        if group_id is not None and not authz.allowed(principal, "READ", "GROUP", group_id):
            return ErrorCode.group_authorization_failed
        return None


def _code(error: LogstoreError, request: Any) -> ErrorCode:
    """``error``'s Kafka code, as the version of ``request`` knows it."""
    code = kafka_error_code(error)
    if code == ErrorCode.producer_fenced and request.__version__ < _FENCED_SINCE[request.__api_key__]:
        return ErrorCode.invalid_producer_epoch
    return code
