"""The transaction coordinator: transactional ids, producer ids and epochs, commit/abort.

A transactional id maps to one producer id and an epoch. Its transactions
are numbered (``txn_number``) and go through these states::

    EMPTY ──add partitions──▶ ONGOING ──end(commit)──▶ PREPARE_COMMIT ──markers──▶ COMPLETE_COMMIT
                                  └─────end(abort)───▶ PREPARE_ABORT  ──markers──▶ COMPLETE_ABORT
    COMPLETE_* ──add partitions──▶ ONGOING (a new txn_number)

Transaction numbers are random 62-bit values (``secrets``), never a counter:
a number names one transaction of one producer, and is no use to a caller
that did not get it (issue 12; authorization — WRITE on the transactional
id — decides who may end a transaction at all).

Fencing (the ordering flaw Jepsen found in Kafka's protocol cannot happen
here): every transactional request names the producer id, the epoch *and*
the transaction number it belongs to. A request from an older epoch gets
PRODUCER_FENCED; an ``end`` for an earlier transaction number never touches
the current transaction — a retried end of the transaction that just
completed with the same decision is answered OK, anything else is
INVALID_TXN_STATE. ``init_producer_id`` for an id with an open transaction
aborts it and bumps the epoch (a restarted producer fences its predecessor);
so does the timeout (``transaction.timeout.ms``) for a transaction left open
by a dead producer.

Durability: every state change of a transactional id is a record of the internal
topic ``__transaction_state`` (:mod:`logstore.broker.transactions.records` and
``state_log``: key the id, value the metadata as JSON, the latest wins; the id's
partition is ``crc32(coordinator key) % partitions``, the coordinator key being the
id's part before its first ``/``). The decision (PREPARE_*) is durable before any
marker is written. Producer ids come from a persisted counter, allocated in blocks.

Partitions and fail-over: the coordinator serves the ids of the state partitions it
has loaded (:meth:`TransactionCoordinator.load_partition`, called for every partition
at start-up on a single broker, and by the broker when it becomes a partition's
leader on a cluster); for an id of another partition it answers NOT_COORDINATOR
(COORDINATOR_LOAD_IN_PROGRESS while the partition loads). Loading replays the
partition's records, then finishes what the log says: PREPARE_COMMIT and
PREPARE_ABORT write the remaining markers (markers are idempotent per partition: a
partition whose producer has no open transaction gets none) and complete;
decided group batches are committed; ONGOING transactions stay open (they expire by
their timeout). Epochs come back with the records, so fencing holds after a load.
:meth:`~TransactionCoordinator.unload_partition` forgets a partition's ids.

Markers that do not land at once (a leader elsewhere down or moving) leave the
transaction in PREPARE_*: :meth:`~TransactionCoordinator.retry_markers` retries them in
the background, and the id answers CONCURRENT_TRANSACTIONS to a new transaction (and
to ``init_producer_id``) until they all landed.

Transaction groups (the exactly-once Spark sink): many producers — one per
Spark task attempt, with transactional ids under a common prefix — write a
micro-batch in their own open transactions; the driver then ends them
together with :meth:`TransactionCoordinator.end_group`. Committing appends a
*decision record* ``{group, batch_id, transactions}`` to ``__transaction_state``
(in the partition of the group id, which is the sink's coordinator key, fsynced) —
the commit point, kept in the log itself —
then writes the markers, and aborts every other open transaction under the
batch's prefix (failed or speculative task attempts). A batch id at or below
the group's last committed one is not committed again (a replayed batch
after a driver crash): its transactions are aborted instead. A load replays
the decisions, and transactions of a decision that were not completed before a
crash are committed then.

Thread-safety: all public methods take the coordinator's lock.
"""

from __future__ import annotations

import os
import secrets
import threading
import time
from collections.abc import Callable, Iterable
from dataclasses import replace

from logstore.broker.transactions.producer_id_block import ProducerIdFloor, producer_id_start
from logstore.broker.transactions.records import (
    TXN_STATE_TOPIC,
    GroupDecision,
    TopicPartitionKey,
    TxnMetadata,
    TxnState,
    TxnStateLog,
)
from logstore.errors import (
    ConcurrentTransactionsError,
    CoordinatorLoadInProgressError,
    InvalidRequestError,
    InvalidTxnStateError,
    NotCoordinatorError,
    ProducerFencedError,
)
from logstore.storage.fileutil import write_atomically
from logstore.types import TxnRef

__all__ = [
    "TxnState",
    "TxnMetadata",
    "TxnRef",
    "GroupDecision",
    "TxnStateLog",
    "TransactionCoordinator",
    "MarkerWriter",
    "MAX_TIMEOUT_MS",
    "TXN_STATE_TOPIC",
]

MAX_TIMEOUT_MS = 15 * 60 * 1000
_PID_BLOCK = 1000
# (partitions, producer id, producer epoch, commit?, coordinator epoch) -> the partitions whose
# marker did not land yet (None or empty: all did); writes the markers durably (fsynced, or
# replicated on a cluster). The coordinator epoch is the leader epoch its state partition was
# loaded at: a partition leader refuses markers of an older one (a deposed coordinator's).
MarkerWriter = Callable[[Iterable[TopicPartitionKey], int, int, bool, int], "Iterable[TopicPartitionKey] | None"]


_OPEN_STATES = frozenset({TxnState.ONGOING, TxnState.PREPARE_COMMIT, TxnState.PREPARE_ABORT})


class TransactionCoordinator:
    """See the module docstring."""

    topic = TXN_STATE_TOPIC

    def __init__(self, data_dir: str, *, write_markers: MarkerWriter, state: TxnStateLog,
                 clock: Callable[[], float] = time.time) -> None:
        self._pid_file = os.path.join(data_dir, "meta", "producer-id-block")
        self._write_markers = write_markers
        self._clock = clock
        self._lock = threading.RLock()
        self._txns: dict[str, TxnMetadata] = {}
        self._by_pid: dict[int, str] = {}
        self._next_pid = 0
        self._pid_limit = 0
        # Where blocks of producer ids come from on a cluster (``count → first id``); None: the
        # local producer-id-block file of a single broker.
        self.pid_blocks: Callable[[int], int] | None = None
        # A single broker's floor for its producer-id counter (the producer state of its
        # partitions, :mod:`logstore.broker.transactions.producer_id_block`); None: no floor.
        self.producer_id_floor: ProducerIdFloor | None = None
        # On a cluster a partition's leader takes transactional batches of producers whose
        # transactional id another broker coordinates (unknown here): that coordinator added the
        # partition to the transaction, and the partition's producer state still fences epochs.
        self.coordinated_elsewhere = False
        self._state = state
        self._groups: dict[str, GroupDecision] = {}
        # The state partitions served (-> the leader epoch loaded at) and being loaded. CoordinatorShards
        # decides *when* to load; these say *what is in memory*, checked (:meth:`_owned`) under the
        # same lock as the state is read, so a partition unloaded between a shard check and the
        # request's body can never be served from forgotten state.
        self._loaded: dict[int, int] = {}
        self._loading: set[int] = set()
        # PREPARE_* transactions whose markers have not all landed (a leader elsewhere was down
        # or moving): transactional id -> (its metadata, the partitions still without a marker).
        self._pending: dict[str, tuple[TxnMetadata, frozenset[TopicPartitionKey]]] = {}

    # ------------------------------------------------------------------ lifecycle

    def startup(self, *, load: bool = True) -> None:
        """Start-up: (a single broker) every state partition loaded, then the producer-id counter.
        On a cluster (``load`` False) partitions load one by one as this broker comes to lead them
        (:class:`~logstore.broker.coordinator_shards.CoordinatorShards`)."""
        if load:
            self._state.prepare()
            for partition in range(self._state.partition_count()):
                self.load_partition(partition, 0)
        with self._lock:  # never below an id the partitions or the transactional ids hold
            self._next_pid = self._pid_limit = producer_id_start(
                self._pid_file, floor=self.producer_id_floor, issued=max(self._by_pid, default=-1) + 1)

    def load_partition(self, partition: int, leader_epoch: int) -> None:
        """Serve the ids of state ``partition``: replay its records, then finish what they say
        (see the module docstring). Blocking; requests for its ids meanwhile get
        COORDINATOR_LOAD_IN_PROGRESS."""
        with self._lock:
            self._loading.add(partition)
            self._loaded.pop(partition, None)
        try:
            txns: dict[str, TxnMetadata] = {}
            groups: dict[str, GroupDecision] = {}
            for record in self._state.read_partition(partition):  # the latest record of each id wins
                if isinstance(record, TxnMetadata):
                    txns[record.transactional_id] = record
                else:
                    groups[record.group_id] = record
        except BaseException:
            with self._lock:
                self._loading.discard(partition)
            raise
        with self._lock:
            self._forget(partition)
            for meta in txns.values():
                self._txns[meta.transactional_id] = meta
                self._by_pid[meta.producer_id] = meta.transactional_id
            self._groups.update(groups)
            self._loading.discard(partition)
            self._loaded[partition] = leader_epoch
            for decision in groups.values():
                self._commit_refs(decision.txns)
            for meta in [self._txns[t] for t in txns]:
                if meta.state in (TxnState.PREPARE_COMMIT, TxnState.PREPARE_ABORT):
                    self._complete(meta)

    def unload_partition(self, partition: int) -> None:
        """Stop serving the ids of state ``partition`` (its leadership moved): forget them."""
        with self._lock:
            self._loaded.pop(partition, None)
            self._loading.discard(partition)
            self._forget(partition)

    def _forget(self, partition: int) -> None:
        of = self._state.partition_of
        for txn_id in [t for t in self._txns if of(t) == partition]:
            meta = self._txns.pop(txn_id)
            self._pending.pop(txn_id, None)
            if self._by_pid.get(meta.producer_id) == txn_id:
                del self._by_pid[meta.producer_id]
        for group_id in [g for g in self._groups if of(g) == partition]:
            del self._groups[group_id]

    def loaded_partitions(self) -> dict[int, int]:
        """The state partitions served, with the leader epoch each was loaded at."""
        with self._lock:
            return dict(self._loaded)

    def _owned(self, key: str) -> None:
        """Raise unless this coordinator serves ``key`` (a transactional or group id)."""
        partition = self._state.partition_of(key)
        if partition in self._loaded:
            return
        if partition in self._loading:
            raise CoordinatorLoadInProgressError(
                f"the coordinator of {key!r} ({self.topic} partition {partition}) is loading it; retry")
        raise NotCoordinatorError(
            f"this broker is not the transaction coordinator of {key!r} ({self.topic} partition {partition})")

    def _now_ms(self) -> int:
        return int(self._clock() * 1000)

    def _persist(self, meta: TxnMetadata) -> TxnMetadata:
        self._state.append(meta)
        self._txns[meta.transactional_id] = meta
        self._by_pid[meta.producer_id] = meta.transactional_id
        return meta

    def _allocate_pid(self) -> int:
        if self._next_pid >= self._pid_limit:
            if self.pid_blocks is not None:  # a cluster: blocks unique across the brokers
                self._next_pid = self.pid_blocks(_PID_BLOCK)
                self._pid_limit = self._next_pid + _PID_BLOCK
            else:
                self._pid_limit = self._next_pid + _PID_BLOCK
                write_atomically(self._pid_file, f"{self._pid_limit}\n".encode())
        pid = self._next_pid
        self._next_pid += 1
        return pid

    # ------------------------------------------------------------------ requests

    def init_producer_id(self, transactional_id: str, *, timeout_ms: int,
                         current: tuple[int, int] | None = None) -> tuple[int, int]:
        """A producer id and epoch; for a transactional id, fence and abort its predecessor.

        ``current`` (KIP-360: a transactional producer bumping its own epoch after an
        abortable error) is the caller's producer id and epoch: the epoch is bumped if they
        are the id's current ones; if they are those of the last bump made for this producer
        itself (its earlier request whose answer was lost, or the abort of its timed-out
        transaction) the current epoch is the answer, once that bump's markers landed;
        otherwise PRODUCER_FENCED (a newer producer took over, and must not be fenced by an
        older one). Ignored for an idempotent producer.
        """
        with self._lock:
            if not transactional_id:
                return self._allocate_pid(), 0
            self._owned(transactional_id)
            if not 1 <= timeout_ms <= MAX_TIMEOUT_MS:
                raise InvalidRequestError(
                    f"transaction.timeout.ms must be between 1 and {MAX_TIMEOUT_MS}, got {timeout_ms}"
                )
            meta = self._txns.get(transactional_id)
            last_epoch = -1  # a new producer takes the id over: nobody may "retry" an older epoch
            if current is not None:
                if meta is not None and meta.producer_id == current[0] and meta.last_producer_epoch == current[1] \
                        and meta.producer_epoch > current[1]:
                    if meta.state in (TxnState.PREPARE_COMMIT, TxnState.PREPARE_ABORT):
                        meta = self._complete(meta)
                        self._still_completing(meta)
                    return meta.producer_id, meta.producer_epoch  # its bump was made already
                if meta is None or (meta.producer_id, meta.producer_epoch) != current:
                    now = "unknown" if meta is None else f"producer {meta.producer_id} epoch {meta.producer_epoch}"
                    raise ProducerFencedError(
                        f"producer {current[0]} epoch {current[1]} of transactional id {transactional_id!r} "
                        f"cannot bump its epoch: the id's current one is {now}")
                last_epoch = current[1]
            if meta is None:
                meta = TxnMetadata(transactional_id, self._allocate_pid(), 0, TxnState.EMPTY, 0, timeout_ms)
                self._persist(meta)
                return meta.producer_id, meta.producer_epoch
            if meta.state == TxnState.ONGOING:
                self._abort_with_bump(meta, last_epoch=last_epoch)
                meta = self._txns[transactional_id]
                self._still_completing(meta)  # fenced already; the new epoch once the abort landed
            elif meta.state in (TxnState.PREPARE_COMMIT, TxnState.PREPARE_ABORT):
                meta = self._complete(meta)
                self._still_completing(meta)
            meta = self._persist(replace(meta, producer_epoch=meta.producer_epoch + 1, timeout_ms=timeout_ms,
                                         state=meta.state if meta.state != TxnState.ONGOING else TxnState.EMPTY,
                                         last_producer_epoch=last_epoch))
            return meta.producer_id, meta.producer_epoch

    def _fenced(self, transactional_id: str, producer_id: int, producer_epoch: int) -> TxnMetadata:
        self._owned(transactional_id)
        meta = self._txns.get(transactional_id)
        if meta is None:
            raise InvalidTxnStateError(
                f"transactional id {transactional_id!r} is unknown; call init_transactions() first"
            )
        if producer_id == meta.producer_id and producer_epoch == meta.last_producer_epoch < meta.producer_epoch:
            # KIP-588: the coordinator aborted this producer's own transaction (it was open longer
            # than its timeout): abortable, not fatal; its abort's InitProducerId gets the new epoch.
            raise InvalidTxnStateError(
                f"the transaction of {transactional_id!r} was aborted with epoch {producer_epoch} (it was open "
                f"longer than transaction.timeout.ms, {meta.timeout_ms} ms, or the producer has bumped its "
                "epoch since); call abort_transaction() and begin a new one"
            )
        if producer_id != meta.producer_id or producer_epoch < meta.producer_epoch:
            raise ProducerFencedError(
                f"producer {producer_id} epoch {producer_epoch} of transactional id {transactional_id!r} "
                f"is fenced by producer {meta.producer_id} epoch {meta.producer_epoch}"
            )
        if producer_epoch > meta.producer_epoch:
            raise InvalidTxnStateError(
                f"epoch {producer_epoch} is newer than the coordinator's {meta.producer_epoch}"
            )
        return meta

    def add_partitions(self, transactional_id: str, producer_id: int, producer_epoch: int,
                       partitions: Iterable[TopicPartitionKey]) -> int:
        """Add partitions to the current transaction (starting one if none is open); return its number."""
        with self._lock:
            meta = self._fenced(transactional_id, producer_id, producer_epoch)
            if meta.state in (TxnState.PREPARE_COMMIT, TxnState.PREPARE_ABORT):
                raise ConcurrentTransactionsError(
                    f"transaction {meta.txn_number} of {transactional_id!r} is still completing; retry"
                )
            if meta.state != TxnState.ONGOING:
                meta = replace(meta, state=TxnState.ONGOING, txn_number=_new_txn_number(meta.txn_number),
                               partitions=frozenset(), txn_start_ms=self._now_ms())
            added = meta.partitions | frozenset(partitions)
            if added != meta.partitions or meta is not self._txns.get(transactional_id):
                meta = self._persist(replace(meta, partitions=added))
            return meta.txn_number

    def transactional_id_of(self, producer_id: int) -> str | None:
        """The transactional id ``producer_id`` belongs to (None: an idempotent or unknown one)."""
        with self._lock:
            return self._by_pid.get(producer_id)

    def knows_producer(self, producer_id: int) -> bool:
        """Whether ``producer_id`` is a transactional producer this broker coordinates now."""
        with self._lock:
            txn_id = self._by_pid.get(producer_id)
            return txn_id is not None and txn_id in self._txns

    def verify_partition(self, producer_id: int, producer_epoch: int, tp: TopicPartitionKey) -> None:
        """Raise unless ``tp`` is part of the open transaction of ``producer_id``/``producer_epoch``
        (a producer this broker coordinates; on a cluster the partition's leader asks the
        coordinator of any other, :mod:`logstore.broker.transactions.verifier`)."""
        with self._lock:
            txn_id = self._by_pid.get(producer_id)
            meta = self._txns.get(txn_id) if txn_id is not None else None
            if meta is None:
                raise InvalidTxnStateError(f"producer {producer_id} has no transactional id")
            self._check_member(meta, producer_id, producer_epoch, tp)

    def verify_member(self, transactional_id: str, producer_id: int, producer_epoch: int,
                      partitions: Iterable[TopicPartitionKey]) -> None:
        """The coordinator's answer to a partition leader (KIP-890): raise unless every one of
        ``partitions`` is in the open transaction of ``transactional_id`` with this producer id
        and epoch (NOT_COORDINATOR and the like when the id is not coordinated here)."""
        with self._lock:
            meta = self._fenced(transactional_id, producer_id, producer_epoch)
            for tp in partitions:
                self._check_member(meta, producer_id, producer_epoch, tp)

    @staticmethod
    def _check_member(meta: TxnMetadata, producer_id: int, producer_epoch: int, tp: TopicPartitionKey) -> None:
        if producer_epoch == meta.last_producer_epoch < meta.producer_epoch:
            raise InvalidTxnStateError(
                f"the transaction of {meta.transactional_id!r} was aborted with epoch {producer_epoch} (it "
                f"was open longer than transaction.timeout.ms, {meta.timeout_ms} ms, or the producer has "
                "bumped its epoch since); call abort_transaction()"
            )
        if producer_epoch < meta.producer_epoch:
            raise ProducerFencedError(
                f"producer {producer_id} epoch {producer_epoch} is fenced by epoch {meta.producer_epoch}"
            )
        if meta.state != TxnState.ONGOING or tp not in meta.partitions:
            raise InvalidTxnStateError(
                f"partition {tp[0]}-{tp[1]} is not part of an open transaction of "
                f"{meta.transactional_id!r}; add it before sending"
            )

    def end_txn(self, transactional_id: str, producer_id: int, producer_epoch: int,
                txn_number: int, *, commit: bool) -> None:
        """Commit or abort transaction ``txn_number``; idempotent for a retried request."""
        with self._lock:
            meta = self._fenced(transactional_id, producer_id, producer_epoch)
            wanted = "commit" if commit else "abort"
            if txn_number != meta.txn_number:
                raise InvalidTxnStateError(
                    f"request to {wanted} transaction {txn_number} of {transactional_id!r} is stale: "
                    f"transaction {meta.txn_number} is current; it was not applied"
                )
            done = TxnState.COMPLETE_COMMIT if commit else TxnState.COMPLETE_ABORT
            prepare = TxnState.PREPARE_COMMIT if commit else TxnState.PREPARE_ABORT
            if meta.state == done:
                return  # a retry of the request that completed this transaction
            if meta.state == prepare:
                self._complete(meta)
                return
            if meta.state != TxnState.ONGOING:
                raise InvalidTxnStateError(
                    f"cannot {wanted} transaction {txn_number} of {transactional_id!r}: it is {meta.state.value}"
                )
            self._complete(self._persist(replace(meta, state=prepare)))

    def _complete(self, meta: TxnMetadata) -> TxnMetadata:
        """Write the markers of a PREPARE_* transaction; COMPLETE_* once every one landed.

        Markers that did not land (a leader elsewhere down or moving) leave the transaction
        in PREPARE_* with those partitions pending: :meth:`retry_markers` retries them, and
        the transactional id answers CONCURRENT_TRANSACTIONS to a new transaction meanwhile.
        The decision is durable already, so the caller's request has succeeded.
        """
        pending = self._pending.get(meta.transactional_id)
        todo = pending[1] if pending is not None and pending[0] is meta else meta.partitions
        epoch = self._loaded.get(self._state.partition_of(meta.transactional_id), -1)
        remaining = frozenset(self._write_markers(sorted(todo), meta.producer_id, meta.producer_epoch,
                                                  meta.state == TxnState.PREPARE_COMMIT, epoch) or ())
        return self._landed(meta, remaining)

    def _landed(self, meta: TxnMetadata, remaining: frozenset[TopicPartitionKey]) -> TxnMetadata:
        if remaining:
            self._pending[meta.transactional_id] = (meta, remaining)
            return meta
        self._pending.pop(meta.transactional_id, None)
        commit = meta.state == TxnState.PREPARE_COMMIT
        return self._persist(replace(meta, state=TxnState.COMPLETE_COMMIT if commit else TxnState.COMPLETE_ABORT))

    def _still_completing(self, meta: TxnMetadata) -> None:
        if meta.transactional_id in self._pending:
            raise ConcurrentTransactionsError(
                f"transaction {meta.txn_number} of {meta.transactional_id!r} is still writing its markers; retry"
            )

    def retry_markers(self) -> int:
        """Retry the markers of PREPARE_* transactions that did not all land (the broker calls it
        periodically); return how many transactions are still pending. The markers are sent
        without the coordinator's lock, so other transactional ids are not held up."""
        with self._lock:
            pending = [(meta, todo, self._loaded[self._state.partition_of(meta.transactional_id)])
                       for meta, todo in self._pending.values()]
        for meta, todo, epoch in pending:
            remaining = frozenset(self._write_markers(sorted(todo), meta.producer_id, meta.producer_epoch,
                                                      meta.state == TxnState.PREPARE_COMMIT, epoch) or ())
            with self._lock:
                current = self._pending.get(meta.transactional_id)
                if current is not None and current[0] is meta:
                    self._landed(meta, remaining & current[1])
        with self._lock:
            return len(self._pending)

    def _abort_with_bump(self, meta: TxnMetadata, *, last_epoch: int | None = None) -> TxnMetadata:
        """Abort the open transaction with a bumped epoch, fencing the producer that owns it.

        ``last_epoch``: who may still ask for the new epoch with the old one (see
        :meth:`init_producer_id`); by default the producer itself (a timed-out transaction).
        """
        last = meta.producer_epoch if last_epoch is None else last_epoch
        bumped = self._persist(replace(meta, producer_epoch=meta.producer_epoch + 1, state=TxnState.PREPARE_ABORT,
                                       last_producer_epoch=last))
        return self._complete(bumped)

    def abort_expired(self) -> list[str]:
        """Abort transactions open longer than their timeout; return their transactional ids."""
        with self._lock:
            now = self._now_ms()
            expired = [m for m in self._txns.values()
                       if m.state == TxnState.ONGOING and now - m.txn_start_ms > m.timeout_ms]
            for meta in expired:
                self._abort_with_bump(meta)
            return [m.transactional_id for m in expired]

    # ------------------------------------------------------------------ groups

    def last_committed_batch(self, group_id: str) -> int:
        """The group's last committed batch id, or -1."""
        with self._lock:
            self._owned(group_id)
            decision = self._groups.get(group_id)
            return decision.batch_id if decision is not None else -1

    def end_group(self, group_id: str, batch_id: int, txns: Iterable[TxnRef], *,
                  abort_prefix: str, commit: bool) -> bool:
        """Commit ``txns`` as batch ``batch_id`` of ``group_id`` (or abort them); abort the rest.

        Every other open transaction whose transactional id starts with
        ``abort_prefix`` is aborted. Returns False when the batch was already
        committed earlier (nothing new becomes visible), True otherwise.
        Raises when a listed transaction is no longer open as described
        (fenced, timed out): the caller retries the whole batch.
        """
        refs = tuple(txns)
        with self._lock:
            self._owned(group_id)
            if not abort_prefix:
                raise InvalidRequestError("a transaction group needs a non-empty abort prefix")
            if any(not r.transactional_id.startswith(abort_prefix) for r in refs):
                raise InvalidRequestError(f"every transaction of the group must start with {abort_prefix!r}")
            last = self._groups.get(group_id)
            committed_before = last is not None and batch_id <= last.batch_id
            if commit and not committed_before:
                for ref in refs:
                    meta = self._fenced(ref.transactional_id, ref.producer_id, ref.producer_epoch)
                    if meta.txn_number != ref.txn_number or meta.state != TxnState.ONGOING:
                        raise InvalidTxnStateError(
                            f"transaction {ref.txn_number} of {ref.transactional_id!r} is not open "
                            f"(it is {meta.state.value}, transaction {meta.txn_number}); retry the batch"
                        )
                decision = GroupDecision(group_id, batch_id, refs)
                self._state.append(decision)  # the commit point
                self._groups[group_id] = decision
                self._commit_refs(refs)
            # What was just committed is complete; anything still open under the prefix
            # (failed or speculative attempts, a replayed batch's writes) is aborted.
            for meta in list(self._txns.values()):
                if meta.transactional_id.startswith(abort_prefix) and meta.state == TxnState.ONGOING:
                    self._abort_with_bump(meta, last_epoch=-1)  # fenced for good: the batch is decided
            return commit and not committed_before

    def _commit_refs(self, refs: Iterable[TxnRef]) -> None:
        """Complete the commit of decided transactions that are not complete yet."""
        for ref in refs:
            meta = self._txns.get(ref.transactional_id)
            if meta is None or meta.txn_number != ref.txn_number or meta.producer_id != ref.producer_id:
                continue
            if meta.state in (TxnState.ONGOING, TxnState.PREPARE_COMMIT):
                self._complete(self._persist(replace(meta, state=TxnState.PREPARE_COMMIT)))

    def describe(self, transactional_id: str) -> TxnMetadata | None:
        with self._lock:
            return self._txns.get(transactional_id)

    def open_transaction_count(self) -> int:
        """Transactions begun and not yet complete (ongoing or being committed/aborted): a metric."""
        with self._lock:
            return sum(m.state in _OPEN_STATES for m in self._txns.values())


def _new_txn_number(previous: int) -> int:
    """A random transaction number, different from ``previous`` (and never 0, the "none yet")."""
    while True:
        number = secrets.randbits(62)
        if number not in (0, previous):
            return number
