"""The sender: the producer's background thread that ships batches and handles answers.

Loop
----
The thread (:class:`Sender`) waits on the accumulator's ``wakeup`` condition
until a batch lingered long enough, a backoff or a delivery timeout ends, or
something changed; then, outside the lock, it reports expired batches, sends
the requests the accumulator drained (:meth:`RecordAccumulator.drain`) with
``produce_async`` and handles the answers of finished requests, in the order
the requests were sent. At most ``max_in_flight_requests_per_connection``
requests are in flight (Kafka's option; default 5); with idempotence they
may carry batches of the same partition (pipelining, ordered by sequence
numbers: see :mod:`~logstore.client.producer.accumulator`), without it a
partition has at most one request in flight.

Before a request leaves, batches of ``send()`` records are encoded
(:meth:`RecordAccumulator.encode_records`) and, for a transactional producer,
new partitions join the transaction (``AddPartitionsToTxn``; on failure their
batches fail with the error).

Answers
-------
Per partition: success completes the batches with their base offsets (and the
broker's append time on LogAppendTime topics); a retriable error
(:attr:`LogstoreError.retriable`, an unreachable broker included; and
OUT_OF_ORDER_SEQUENCE_NUMBER, which with pipelining means an earlier batch
has not been appended yet) puts the batches back in their queue, in
sequence order, after a backoff (none for the first two
OUT_OF_ORDER_SEQUENCE_NUMBER retries: the partition waits for its requests
in flight anyway), while every batch has
been tried at most ``retries`` times and the retry still fits in
``delivery_timeout_ms``; any other error fails them. The backoff is Kafka's:
``retry_backoff_ms * 2**(attempts - 1)``, at most ``retry_backoff_max_ms``,
with ±20 % jitter. UNKNOWN_TOPIC_OR_PARTITION also drops the topic's cached
metadata. OUT_OF_ORDER_SEQUENCE_NUMBER for the partition's oldest pending
batch (nothing earlier is on its way, so the broker will never accept it:
a batch before it failed, or the broker lost the tail it had acknowledged)
makes an idempotent producer restart the partition's sequences under a new
epoch and resend at once (Kafka's KIP-360, see
:mod:`~logstore.client.producer.accumulator`); a transactional producer's
batches fail instead, and its transaction can only abort. With ``acks=0`` batches succeed (offset -1) as soon as the request
is sent, and errors are only logged.

Failed or unknown
-----------------
A batch reported failed was not appended by the broker. An attempt that ended
without a definite answer — a timeout, a connection lost after the request
left (not a connection that was refused), an unexpected server error — may
have appended it: the batch is then marked
``maybe_written``, and if it finally fails (retries or ``delivery_timeout_ms``
exhausted, a non-retriable error, the producer closed) it is reported as
:class:`~logstore.errors.UnknownProducerOutcomeError` ("may or may not have
been written"), never as failed. A later successful attempt settles it: with
idempotence the broker recognises the batch's sequence and answers with its
original offsets (without idempotence the retry may have written it twice).
``LOG_OFFLINE`` (the partition is offline; the message says why) fails a batch
at once as :class:`~logstore.errors.LogOfflineError`: definite (the broker
refused before appending) and not retriable (it stays offline until repaired).

Stopping
--------
:meth:`Sender.stop` makes the loop expire what is still queued and exit once
nothing is in flight or the stop deadline passed; every batch not yet
reported then fails with :class:`RequestTimedOutError`. If the loop itself
raises, every batch fails with :class:`UnknownServerError` and the producer
refuses new records (``RecordAccumulator.failure``): no future is left hanging.

Thread-safety: the in-flight bookkeeping is guarded by the accumulator's lock;
futures and callbacks complete on this thread, outside the lock.
"""

from __future__ import annotations

import concurrent.futures
import itertools
import logging
import random
import threading
import time
from collections import deque
from collections.abc import Callable

from logstore.client.producer.accumulator import ProducerBatch, RecordAccumulator, Request
from logstore.client.producer.transaction_manager import TransactionManager
from logstore.client.results import ProducedPartition
from logstore.client.rpc import BrokerClient
from logstore.errors import (
    BrokerUnavailableError,
    LogstoreError,
    OutOfOrderSequenceError,
    RequestTimedOutError,
    UnknownProducerOutcomeError,
    UnknownServerError,
    UnknownTopicOrPartitionError,
)
from logstore.types import TopicPartition

__all__ = ["Sender"]

log = logging.getLogger("logstore.client.producer")

# A produce request in flight: its number (send order), its batches per partition, and how it ended.
_InFlight = tuple[int, Request, "concurrent.futures.Future[list[ProducedPartition]]"]

# Words of gRPC's UNAVAILABLE details when no connection was made: the request never left.
_NOT_SENT_MARKERS = ("failed to connect", "connection refused")


def may_have_been_written(error: LogstoreError) -> bool:
    """Whether a produce attempt that ended with ``error`` may still have been appended."""
    if isinstance(error, BrokerUnavailableError):
        text = error.message.lower()
        return not any(marker in text for marker in _NOT_SENT_MARKERS)
    # LOG_OFFLINE is definite: the partition was offline before the append (a write that fails
    # while appending, or a partition going offline after it, answers KAFKA_STORAGE_ERROR).
    return isinstance(error, (RequestTimedOutError, UnknownServerError))


class Sender:
    """The sender thread of one producer; see the module docstring."""

    def __init__(
        self,
        client: BrokerClient,
        accumulator: RecordAccumulator,
        txn: TransactionManager,
        *,
        acks: int,
        retries: int,
        retry_backoff_ms: int,
        retry_backoff_max_ms: int | None = None,
        delivery_timeout_ms: int,
        request_timeout_ms: int,
        forget_topic: Callable[[str], None],
        max_in_flight: int = 5,
    ) -> None:
        self.client = client
        self._accumulator = accumulator
        self._txn = txn
        self._acks = acks
        self._retries = retries
        self._retry_backoff_s = retry_backoff_ms / 1000
        self._retry_backoff_max_s = max(retry_backoff_ms, retry_backoff_max_ms or retry_backoff_ms) / 1000
        self._delivery_timeout_s = delivery_timeout_ms / 1000
        self._request_timeout_ms = request_timeout_ms
        self._forget_topic = forget_topic
        self._max_in_flight = max_in_flight
        self._request_numbers = itertools.count()
        self._lock = accumulator.lock
        self._in_flight: list[_InFlight] = []
        self._completed: deque[_InFlight] = deque()
        self._stopping = False
        self._stop_deadline: float | None = None  # with _stopping: when to give up on in-flight requests
        self._thread = threading.Thread(target=self._run, name="logstore-producer-sender", daemon=True)

    def start(self) -> None:
        self._thread.start()

    def stop(self, deadline: float | None) -> None:
        """Expire what is queued; exit once nothing is in flight or at ``deadline`` (monotonic)."""
        with self._lock:
            self._stopping = True
            self._stop_deadline = deadline
            self._accumulator.wakeup.notify()

    def join(self) -> None:
        self._thread.join()

    def _run(self) -> None:
        acc = self._accumulator
        try:
            while True:
                if acc.needs_producer_id and not self._stopping and not self._txn.renew_producer_id():
                    with self._lock:
                        acc.wakeup.wait(self._retry_backoff_max_s)
                with self._lock:
                    requests, expired = acc.drain(
                        stopping=self._stopping, max_requests=self._max_in_flight - len(self._in_flight)
                    )
                    done = sorted(self._completed, key=lambda entry: entry[0])
                    self._completed.clear()
                    if not requests and not expired and not done:
                        if self._stopping and (
                            not self._in_flight
                            or (self._stop_deadline is not None
                                and time.monotonic() >= self._stop_deadline)
                        ):
                            break
                        acc.wakeup.wait(self._next_wakeup())
                        continue
                for batch, error in expired:
                    self._complete(batch, error=error)
                for request in requests:
                    self._send(request)
                for _, request, future in done:
                    self._handle_response(request, future)
        except BaseException as e:  # never leave futures hanging
            log.exception("the producer's sender thread failed")
            acc.failure = e
            self._fail_everything(UnknownServerError(f"the producer's sender thread failed: {e!r}"))
            raise
        self._fail_everything(
            RequestTimedOutError("the producer was closed before the record was delivered")
        )

    def _next_wakeup(self) -> float | None:
        """Seconds until a linger, a backoff, a delivery timeout or the stop deadline ends.

        None = until notified. Caller holds the lock.
        """
        now = time.monotonic()
        deadline = self._accumulator.next_deadline(
            now, can_send=len(self._in_flight) < self._max_in_flight
        )
        if self._stopping and self._stop_deadline is not None:
            deadline = self._stop_deadline if deadline is None else min(deadline, self._stop_deadline)
        if deadline is None:
            return None
        return max(0.0, deadline - now)

    def _join_transaction(self, request: Request) -> None:
        """Add the request's new partitions to the open transaction.

        On failure the partitions' batches fail with the error and leave the request.
        """
        new = self._txn.new_partitions(request)
        if not new:
            return
        try:
            self._txn.add_partitions(new)
        except LogstoreError as e:
            for tp in new:
                batches = request.pop(tp)
                self._accumulator.release(tp, batches, retry=False)
                self._accumulator.note_failed(tp, batches)
                for b in batches:
                    self._complete(b, error=e)

    def _send(self, request: Request) -> None:
        acc = self._accumulator
        if self._txn.transactional_id is not None:
            self._join_transaction(request)
        items: list[tuple[TopicPartition, list[bytes | memoryview]]] = []
        for tp, batches in list(request.items()):
            for batch in batches:
                if batch.data is None and not batch.empty:
                    acc.encode_records(batch)
            kept = [b for b in batches if not b.empty]
            empties = [b for b in batches if b.empty]
            if empties:  # every record failed conversion and was reported
                acc.release(tp, empties, retry=False)
                for b in empties:
                    self._complete(b, error=None)
            if not kept:
                del request[tp]
                continue
            request[tp] = kept
            for b in kept:
                b.attempts += 1
            parts: list[bytes | memoryview] = [kept[0].info.schema_message]
            for b in kept:
                assert b.data is not None
                parts += (b.data.head, b.data.body)
            items.append((tp, parts))
        if not items:
            return
        try:
            future = self.client.produce_async(
                items, acks=self._acks, timeout_ms=self._request_timeout_ms,
                transactional_id=self._txn.transactional_id or "",  # the leader verifies with it
            )
        except (RuntimeError, ValueError):  # the client was closed under us
            future = concurrent.futures.Future()
            future.set_exception(
                RequestTimedOutError("the producer was closed before the batch was sent")
            )
        entry: _InFlight = (next(self._request_numbers), request, future)
        with self._lock:
            self._in_flight.append(entry)
        if self._acks == 0:
            # Nothing will be waited for: report success as soon as the request is out.
            for batches in request.values():
                for b in batches:
                    b.report(None)

        def on_done(_: concurrent.futures.Future[list[ProducedPartition]]) -> None:
            with self._lock:
                self._completed.append(entry)
                acc.wakeup.notify()

        future.add_done_callback(on_done)

    def _handle_response(
        self,
        request: Request,
        future: concurrent.futures.Future[list[ProducedPartition]],
    ) -> None:
        acc = self._accumulator
        with self._lock:
            self._in_flight = [e for e in self._in_flight if e[2] is not future]
        results: dict[TopicPartition, ProducedPartition | LogstoreError]
        try:
            results = {TopicPartition(r.topic, r.partition): r for r in future.result()}
        except LogstoreError as e:
            results = dict.fromkeys(request, e)
        except Exception as e:
            results = dict.fromkeys(request, UnknownServerError(f"produce failed: {e!r}"))
        for tp, batches in request.items():
            outcome = results.get(tp)
            if outcome is None:
                outcome = UnknownServerError(f"the broker's produce answer has no entry for {tp}")
            elif isinstance(outcome, ProducedPartition):
                if outcome.error is not None:
                    outcome = outcome.error
                elif len(outcome.base_offsets) != len(batches):
                    outcome = UnknownServerError(
                        f"the broker returned {len(outcome.base_offsets)} base offsets for "
                        f"{len(batches)} batches sent to {tp}"
                    )
            if isinstance(outcome, ProducedPartition):
                acc.release(tp, batches, retry=False)
                for b, base in zip(batches, outcome.base_offsets, strict=True):
                    # Brokers may report an append time for CreateTime topics too: ignore it there.
                    append_time = outcome.log_append_time_ms if b.info.log_append_time else -1
                    self._complete(b, error=None, base_offset=base, append_time_ms=append_time)
                continue
            if self._acks == 0:
                log.warning("acks=0 produce to %s failed: %s", tp, outcome)
                acc.release(tp, batches, retry=False)
                for b in batches:
                    self._complete(b, error=outcome)
                continue
            if isinstance(outcome, UnknownTopicOrPartitionError):
                self._forget_topic(tp.topic)
            if may_have_been_written(outcome):
                for b in batches:
                    b.maybe_written = True
            now = time.monotonic()
            attempts = max(b.attempts for b in batches)
            backoff_s = self._backoff_s(attempts)
            out_of_order = isinstance(outcome, OutOfOrderSequenceError)
            retriable = outcome.retriable or out_of_order
            if out_of_order and acc.is_oldest_pending(tp, batches[0]):
                # Nothing earlier is on its way: the broker will never take these sequences.
                if self._txn.transactional_id is not None:
                    retriable = False  # the transaction can only abort (which bumps the epoch)
                else:
                    acc.restart_sequences(tp)  # KIP-360: a new epoch, sequences from 0
                    backoff_s = 0.0
            elif out_of_order and attempts < 3:
                # Pipelining: an earlier batch is not appended yet (lost, refused or reordered);
                # it is resent first, once the partition's earlier requests have answered.
                backoff_s = 0.0
            retry = (
                retriable
                and not self._stopping
                and all(b.attempts <= self._retries for b in batches)
                and all(
                    now + backoff_s - b.created < self._delivery_timeout_s
                    for b in batches
                )
            )
            acc.release(tp, batches, retry=retry, backoff_s=backoff_s)
            if retry:
                log.info("retrying %d batches for %s after %s", len(batches), tp, outcome)
            else:
                acc.note_failed(tp, batches)
                for b in batches:
                    self._complete(b, error=outcome)

    def _backoff_s(self, attempts: int) -> float:
        """Kafka's exponential retry backoff after ``attempts`` tries, with ±20 % jitter."""
        base = self._retry_backoff_s * 2 ** min(max(attempts - 1, 0), 30)
        return min(base, self._retry_backoff_max_s) * random.uniform(0.8, 1.2)

    @staticmethod
    def _final_error(batch: ProducerBatch, error: LogstoreError) -> LogstoreError:
        """``error``, or an unknown outcome if an attempt of ``batch`` may have appended it."""
        if not batch.maybe_written or isinstance(error, UnknownProducerOutcomeError):
            return error
        return UnknownProducerOutcomeError(
            f"the batch of {batch.count} records for {batch.tp} may or may not have been written: "
            f"an attempt ended without an answer from the broker, and then {error.message} "
            f"[{error.code}] after {batch.attempts} attempts"
        )

    def _complete(
        self,
        batch: ProducerBatch,
        *,
        error: LogstoreError | None,
        base_offset: int = -1,
        append_time_ms: int = -1,
    ) -> None:
        """Report a batch's outcome, then stop counting it as pending."""
        if error is not None:
            error = self._final_error(batch, error)
            self._txn.record_error(error)
        batch.report(error, base_offset, append_time_ms)
        self._accumulator.completed(batch)

    def _fail_everything(self, error: LogstoreError) -> None:
        """Fail every batch not yet reported (when the loop exits)."""
        acc = self._accumulator
        with self._lock:
            leftovers = acc.abort_queued()
            for _, request, _ in self._in_flight:
                for batches in request.values():
                    for b in batches:
                        b.maybe_written = True  # sent, never answered
                    leftovers.extend(batches)
            self._in_flight.clear()
        for batch in leftovers:
            batch.report(self._final_error(batch, error))
        with self._lock:
            acc.incomplete.clear()
            acc.changed.notify_all()
