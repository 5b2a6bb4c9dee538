"""The transaction manager: the producer's identity and transaction state machine.

Producer id and epoch
---------------------
An idempotent producer gets a producer id and epoch from the broker
(``InitProducerId`` with an empty transactional id) before its first batch is
queued (:meth:`TransactionManager.ensure_can_send`); its partitions restart
their sequences under newer epochs by themselves (KIP-360, see
:mod:`~logstore.client.producer.accumulator`), and when the epoch would pass
its limit the sender asks for a new id (:meth:`renew_producer_id`). A
transactional one gets them from :meth:`~TransactionManager.init_transactions`,
which also fences older producers with the same transactional id (the broker
bumps the epoch and aborts their open transaction) and restarts every
partition's sequence. ``InitProducerId`` is retried while the broker (or the
coordinator) cannot be reached or answers with another retriable error, with
the producer's retry backoff, until ``delivery_timeout_ms``.

Transactions
------------
States and transitions (anything else raises :class:`InvalidTxnStateError`)::

    (new) --init_transactions--> ready --begin--> open --commit/abort--> ready
                                   ^                                      |
                                   +--------------------------------------+

* ``begin`` starts a transaction: records sent until commit/abort belong to it.
  A transactional producer sends only inside one.
* Partitions join the open transaction (``AddPartitionsToTxn``, by the sender,
  :meth:`add_partitions`) before their first batch is sent; the broker answers
  with the transaction's number, which makes the :class:`TxnRef` that ends it.
* ``commit`` flushes, refuses if any send of the transaction failed
  (:meth:`record_error`; abort instead), then ``EndTxn(commit)``: every record
  of the transaction becomes visible to read_committed consumers atomically.
  ``abort`` flushes, then ``EndTxn(abort)``: none ever becomes visible. A
  transaction that touched no partition ends without a request.
* ``prepare`` flushes and checks like ``commit`` but leaves the transaction
  open and returns its :class:`TxnRef`, for writers whose transaction another
  process ends (the Spark sink's driver).

Errors (Kafka's KIP-360): a failed send is *abortable*: ``commit`` refuses,
and ``abort`` ends the transaction, then bumps the epoch —
``InitProducerId`` naming the current producer id and epoch, which the
coordinator refuses if a newer producer took over — and restarts every
partition's sequences, so the next transaction can commit whatever became of
the failed batches' sequences. A ``commit`` that failed (its answer lost:
it may have committed) can be retried, or ended with ``abort``, which bumps
the epoch too and accepts that the transaction already committed.
A transaction the coordinator aborted because it was open longer than
``transaction_timeout_ms`` is abortable too (KIP-588: the coordinator
answers INVALID_TXN_STATE, and the abort's bump gets the epoch it moved to).
PRODUCER_FENCED from the coordinator (a newer producer with the same
transactional id took over) is *fatal*: every later call raises it, with a
message that says to close this producer and create a new one.

Thread-safety: ``init_transactions`` and the lazy ``InitProducerId`` are
serialised by a lock; the transaction methods are meant for one thread (as
Kafka's), while :meth:`add_partitions` and :meth:`record_error` run on the
sender thread.
"""

from __future__ import annotations

import logging
import random
import threading
import time
from collections.abc import Iterable

from logstore.client.producer.accumulator import RecordAccumulator
from logstore.client.rpc import BrokerClient
from logstore.errors import (
    BrokerUnavailableError,
    ConcurrentTransactionsError,
    CoordinatorLoadInProgressError,
    CoordinatorNotAvailableError,
    InvalidTxnStateError,
    LogstoreError,
    NotCoordinatorError,
    ProducerFencedError,
)
from logstore.types import TopicPartition, TxnRef

log = logging.getLogger("logstore.client.producer")

__all__ = ["TransactionManager"]

# A coordinator call that failed with one of these never reached a coordinator that acted on it
# (unreachable, not the coordinator, loading, still writing the last markers): asked again.
_NOT_ACTED_ON = (BrokerUnavailableError, NotCoordinatorError, CoordinatorNotAvailableError,
                 CoordinatorLoadInProgressError, ConcurrentTransactionsError)


class TransactionManager:
    """Producer id, epoch and transaction state of one producer; see the module docstring."""

    def __init__(
        self,
        client: BrokerClient,
        accumulator: RecordAccumulator,
        *,
        transactional_id: str | None,
        idempotent: bool,
        transaction_timeout_ms: int,
        delivery_timeout_ms: int = 120_000,
        retry_backoff_ms: int = 100,
        retry_backoff_max_ms: int = 1000,
    ) -> None:
        self.client = client
        self._accumulator = accumulator
        self.transactional_id = transactional_id
        self._idempotent = idempotent
        self._transaction_timeout_ms = transaction_timeout_ms
        self._delivery_timeout_s = delivery_timeout_ms / 1000
        self._retry_backoff_s = retry_backoff_ms / 1000
        self._retry_backoff_max_s = max(retry_backoff_ms, retry_backoff_max_ms) / 1000
        self._fatal: LogstoreError | None = None  # raised by every later call
        self._commit_uncertain = False  # EndTxn(commit) failed: the transaction may have committed
        self._producer_id = -1
        self._producer_epoch = -1
        self._txn_number = 0
        self._in_transaction = False
        self._partitions: set[TopicPartition] = set()
        self._error: LogstoreError | None = None
        self._lock = threading.Lock()
        self.ready = False  # ensure_can_send() has nothing left to check

    def _init_producer_id(self, current: tuple[int, int] | None = None) -> tuple[int, int]:
        """``InitProducerId``, retried on retriable errors (an unreachable broker or coordinator)
        with the retry backoff until ``delivery_timeout_ms``; then the last error is raised."""
        deadline = time.monotonic() + self._delivery_timeout_s
        attempts = 0
        while True:
            try:
                if self.transactional_id is None:
                    return self.client.init_producer_id("")
                return self.client.init_producer_id(
                    self.transactional_id, transaction_timeout_ms=self._transaction_timeout_ms, current=current)
            except LogstoreError as e:
                attempts += 1
                backoff = min(self._retry_backoff_s * 2 ** min(attempts - 1, 30), self._retry_backoff_max_s)
                backoff *= random.uniform(0.8, 1.2)
                if not e.retriable or time.monotonic() + backoff >= deadline:
                    raise
                log.info("InitProducerId failed (%s); retrying in %.2f s", e, backoff)
                time.sleep(backoff)

    def _end_txn(self, ref: TxnRef, *, commit: bool) -> None:
        """``EndTxn``, asked again while it fails with an error no coordinator acted on
        (:data:`_NOT_ACTED_ON`: a broker restarting, a coordinator moving) until
        ``delivery_timeout_ms``, as Kafka's commit and abort block until they are done; each
        attempt has the request timeout (the coordinator lookup retries within it)."""
        deadline = time.monotonic() + self._delivery_timeout_s
        attempts = 0
        while True:
            try:
                self.client.end_txn(ref, commit=commit)
                return
            except _NOT_ACTED_ON as e:
                attempts += 1
                backoff = min(self._retry_backoff_s * 2 ** min(attempts - 1, 30), self._retry_backoff_max_s)
                if time.monotonic() + backoff >= deadline:
                    raise
                log.info("EndTxn(%s) failed (%s); asking again in %.2f s", "commit" if commit else "abort",
                         e, backoff)
                time.sleep(backoff)

    def _check_fatal(self) -> None:
        if self._fatal is not None:
            raise self._fatal

    def _fatal_error(self, error: ProducerFencedError) -> ProducerFencedError:
        """Make ``error`` this producer's fatal error (raised by every later call); return it."""
        if self._fatal is None:
            self._fatal = ProducerFencedError(
                f"{error.message}. This producer cannot continue: close it and create a new Producer")
        assert isinstance(self._fatal, ProducerFencedError)
        return self._fatal

    def init_transactions(self) -> None:
        """Register the transactional id (fencing older producers with it) and restart sequences."""
        if self.transactional_id is None:
            raise InvalidTxnStateError("init_transactions() needs a Producer with a transactional_id")
        self._check_fatal()
        self._accumulator.check_open()
        with self._lock:
            pid, epoch = self._init_producer_id()
            self._accumulator.set_producer_id(pid, epoch, reset_sequences=True)
            self._producer_id, self._producer_epoch = pid, epoch
            self._in_transaction = False

    def ensure_can_send(self) -> None:
        """Before queueing: a producer id for idempotence; an open transaction if transactional.

        Sets ``ready`` once nothing is left to check (a plain or idempotent
        producer with its id): ``send()`` then skips this call.
        """
        self._check_fatal()
        if self.transactional_id is not None:
            if not self._in_transaction:
                raise InvalidTxnStateError(
                    "a transactional producer sends inside a transaction: call begin_transaction()"
                )
            return
        if self._idempotent and self._producer_id < 0:
            with self._lock:
                if self._producer_id < 0:
                    pid, epoch = self._init_producer_id()
                    self._accumulator.set_producer_id(pid, epoch, reset_sequences=False)
                    self._producer_id, self._producer_epoch = pid, epoch
        self.ready = True

    def renew_producer_id(self) -> bool:
        """A new producer id for an idempotent producer whose epoch reached its limit (sender
        thread, one attempt); False when the broker could not give one (the caller retries)."""
        try:
            pid, epoch = self.client.init_producer_id("")
        except LogstoreError as e:
            log.warning("could not get a new producer id to restart sequences: %s", e)
            return False
        with self._lock:
            self._accumulator.set_producer_id(pid, epoch, reset_sequences=False)
            self._producer_id, self._producer_epoch = pid, epoch
        return True

    def begin(self) -> None:
        self._check_fatal()
        if self.transactional_id is None or self._producer_id < 0:
            raise InvalidTxnStateError("call init_transactions() before begin_transaction()")
        if self._in_transaction:
            raise InvalidTxnStateError("a transaction is already open; commit or abort it first")
        self._partitions = set()
        self._error = None
        self._commit_uncertain = False
        self._in_transaction = True

    def transaction_ref(self) -> TxnRef | None:
        """The open transaction as the broker knows it (None before it touched a partition)."""
        if not self._in_transaction or not self._partitions or self.transactional_id is None:
            return None
        return TxnRef(self.transactional_id, self._producer_id, self._producer_epoch, self._txn_number)

    def prepare(self) -> TxnRef | None:
        self._finish_sends("prepare")
        return self.transaction_ref()

    def commit(self) -> None:
        self._finish_sends("commit")
        ref = self.transaction_ref()
        if ref is not None:
            try:
                self._end_txn(ref, commit=True)
            except ProducerFencedError as e:
                raise self._fatal_error(e) from None
            except LogstoreError:
                self._commit_uncertain = True  # retry commit(), or abort() (which then bumps)
                raise
        self._in_transaction = False

    def abort(self) -> None:
        """Abort the open transaction; after a failed send or commit, bump the epoch too (KIP-360).

        After a commit whose answer was lost the transaction may have committed: the
        coordinator then refuses the abort (INVALID_TXN_STATE), the transaction is over
        either way, and the bump leaves the producer ready for the next one.
        """
        self._check_fatal()
        if not self._in_transaction:
            raise InvalidTxnStateError("no transaction is open")
        self._accumulator.flush()
        self._check_fatal()
        ref = self.transaction_ref()
        try:
            if ref is not None:
                try:
                    self._end_txn(ref, commit=False)
                except InvalidTxnStateError as e:
                    if not (self._commit_uncertain or self._error is not None):
                        raise
                    # The transaction is over (the failed commit went through, or the coordinator
                    # aborted it after its timeout): the bump below ends whatever is still open.
                    log.info("transactional id %r: abort refused (%s); bumping the epoch",
                             self.transactional_id, e)
            if self._error is not None or self._commit_uncertain:
                self._bump_epoch()
        except ProducerFencedError as e:
            raise self._fatal_error(e) from None
        self._in_transaction = False
        self._commit_uncertain = False

    def _bump_epoch(self) -> None:
        """A new epoch of the same producer id, asked with the current one; every partition's
        sequences restart at 0 under it (the accumulator is empty: abort flushed it)."""
        with self._lock:
            pid, epoch = self._init_producer_id(current=(self._producer_id, self._producer_epoch))
            log.info("transactional id %r: producer %d bumped its epoch %d -> %d after a failed send",
                     self.transactional_id, pid, self._producer_epoch, epoch)
            self._accumulator.set_producer_id(pid, epoch, reset_sequences=True)
            self._producer_id, self._producer_epoch = pid, epoch
            self._error = None

    def _finish_sends(self, what: str) -> None:
        self._check_fatal()
        if not self._in_transaction:
            raise InvalidTxnStateError(f"no transaction is open to {what}")
        self._accumulator.flush()
        self._check_fatal()
        if self._error is not None:
            raise InvalidTxnStateError(
                f"cannot {what} the transaction: a send failed ({self._error}); abort it"
            )

    # ------------------------------------------------------------------ sender side

    def new_partitions(self, partitions: Iterable[TopicPartition]) -> list[TopicPartition]:
        """Those of ``partitions`` not yet in the open transaction."""
        return [tp for tp in partitions if tp not in self._partitions]

    def add_partitions(self, partitions: list[TopicPartition]) -> None:
        """``AddPartitionsToTxn``: the partitions join the open transaction. Raises LogstoreError."""
        ref = TxnRef(self.transactional_id or "", self._producer_id, self._producer_epoch, self._txn_number)
        try:
            self._txn_number = self.client.add_partitions_to_txn(ref, partitions)
        except ProducerFencedError as e:
            raise self._fatal_error(e) from None
        self._partitions.update(partitions)

    def record_error(self, error: LogstoreError) -> None:
        """A batch failed: a transactional producer's open transaction can then only abort.

        A batch refused as PRODUCER_FENCED by its partition too: the partition cannot tell a
        newer producer from the coordinator's abort of this one's timed-out transaction
        (KIP-588); the abort's epoch bump tells, and is fatal only for the former.
        """
        if self.transactional_id is not None:
            self._error = self._error or error
