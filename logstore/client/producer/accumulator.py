"""The record accumulator: per-partition batches, linger, the memory bound.

Batches
-------
``send()`` appends records column-wise to their topic's open buffer
(:class:`~logstore.client.producer.record_buffer.TopicBuffer`; the partition
of keyed and keyless records is decided when it seals). A buffer is sealed
when adding a record would take it past ``batch_size`` bytes (an estimate of
the uncompressed size), when it has been open ``linger_ms``, on
:meth:`flush`, before a ``send_batch()`` batch of the same topic is queued
(records sent earlier go first), and when the producer stops. Sealing cuts
it into one batch per partition (:class:`ProducerBatch`, at most
``batch_size`` bytes each, as Kafka's), which join their partitions' queues;
``send_batch()`` batches are converted and encoded by the caller and queued
directly (:meth:`RecordAccumulator.append_encoded`).

Idempotence: a batch gets its ``base_sequence`` (counting records, modulo
2**31) when it joins the queue, so sequences follow queue order. A
partition numbers its batches under the producer id and epoch it started
with (:meth:`set_producer_id`), and encodes them with those.

Restarting sequences (Kafka's KIP-360, for an idempotent producer without a
transactional id): a partition's sequences cannot be accepted any more once
a numbered batch fails for good without having reached the broker (it
expired in the queue, or was refused) — a permanent hole — or once the
broker refuses the partition's oldest pending batch as out of order (the
broker lost the batches before it, e.g. a leader change truncated an
``acks=1`` tail, or a batch that may have been written was not):
:meth:`restart_sequences` marks it. Once its requests in flight have all
answered, the partition takes a new epoch (the producer's epoch plus one
unless another partition already moved to a newer one; a new producer id
from the sender when the epoch would pass :data:`MAX_PRODUCER_EPOCH`),
numbers its queued batches again from 0 and re-stamps those already encoded
(:func:`~logstore.record.with_producer`). None of them is in the log: the
broker keeps a producer's batches in sequence order, so a batch after the
hole, or after the refused one, cannot have been appended. A transactional
producer's partitions never restart by themselves: its epoch comes from the
coordinator when the transaction is aborted
(:mod:`~logstore.client.producer.transaction_manager`).

Batching under back-pressure (Kafka's accumulator keeps a ready batch open
while its broker has no free in-flight slot): a buffer that lingered long
enough is sealed only when what it becomes could leave now. While the sender
has no free request slot, or a batch of the buffer's topic already waits in
its queue behind requests in flight, the buffer stays open and takes the
records that arrive meanwhile; the answer that frees the slot wakes the
sender, which seals them into one batch per partition. So with
``linger_ms=0`` a producer sends one-record requests while the broker keeps
up, and as many records per request as arrived during a round trip when it
does not: the request rate follows the round trip instead of a backlog of
one-record batches. A buffer is held at most :data:`MAX_HOLD_S` past its
linger (a slow partition delays the other partitions of its topic at most
that long), and never past ``batch_size`` (it is sealed when full).

Draining (:meth:`RecordAccumulator.drain`, called by the sender) builds at
most the number of requests the sender may still have in flight
(``max_in_flight_requests_per_connection`` in all). One request carries the
ready batches of one or more partitions up to ``min(4 MiB,
max_request_size)`` (a single larger batch goes alone).

* Without idempotence a partition has at most one request in flight
  (``PartitionState.in_flight``), so its batches are appended in queue order,
  retries included.
* With idempotence (pipelining, as Kafka's) batches of a partition go out
  in one request or several without waiting for answers, within a *window*
  (``PartitionState.window``) of ``IDEMPOTENT_BATCHES_PER_PARTITION`` (5)
  batches: from the oldest batch sent and not yet acknowledged to the newest
  sent. The broker accepts only the next sequence, answers a duplicate of one
  of the producer's last 5 batches with its original offsets and refuses a
  gap with OUT_OF_ORDER_SEQUENCE_NUMBER; so order holds, and a retried batch
  whose first answer was lost is still among the broker's last 5 (answers
  may arrive out of order, hence a window and not a count of batches in
  flight). A batch that comes back for a retry puts the partition in
  *resync*: nothing more of it is sent until all its requests in flight have
  answered; the batches to retry are back in the queue in sequence order and
  go again from there.

A retried batch waits ``retry_backoff_ms`` (:meth:`release`). A batch still
queued ``delivery_timeout_ms`` after it was created expires.

Memory bound: the bytes of sealed, unsent-or-in-flight batches
(``queued_bytes``) stay within ``buffer_memory``; callers block up to
``max_block_ms`` for room (an empty buffer always admits one batch), then get
:class:`RequestTimedOutError`.

Incomplete batches: every batch, from when it is sealed until its outcome is
reported, is counted in ``incomplete`` (batch id -> record count); batch ids
increase, so :meth:`flush` seals the open buffers, then waits for the ids up
to the last one it saw.

Thread-safety: one lock (``lock``) guards the partition states, the buffer
accounting, ``incomplete``, the producer id and the sender's in-flight
bookkeeping. The sender waits on the ``wakeup`` condition; flush and
back-pressure wait on ``changed``. Futures and callbacks are completed
outside the lock.
"""

from __future__ import annotations

import itertools
import logging
import threading
import time
from collections import deque
from collections.abc import Iterable
from typing import Any

import numpy as np
import pyarrow as pa

from logstore.client.partitioner import StickyPartitioner
from logstore.client.producer.batch import SEQUENCE_MOD, PartitionState, ProducerBatch, Request
from logstore.client.producer.batch_encoder import BatchEncoder
from logstore.client.producer.delivery import (
    DeliveryCallback,
    RecordFuture,
    SendBatchCall,
)
from logstore.client.producer.metadata import TopicInfo
from logstore.client.producer.record_buffer import (
    TopicBuffer,
    split_buffer,
    split_stored,
)
from logstore.errors import (
    LogstoreError,
    RequestTimedOutError,
)
from logstore.types import TopicPartition

__all__ = ["ProducerBatch", "PartitionState", "RecordAccumulator", "Request"]

# Produce requests are cut at this size (or max_request_size if smaller): gRPC moves
# 1-4 MiB messages fastest, and smaller requests let partitions overlap in flight.
_REQUEST_TARGET_BYTES = 4 << 20
# Producer sequence numbers wrap at 2**31, as Kafka's do.
_SEQUENCE_MOD = SEQUENCE_MOD


#: Batches of a partition in its window with idempotence: the broker's duplicate window.
IDEMPOTENT_BATCHES_PER_PARTITION = 5
#: How long past its linger a buffer may stay open while its records could not leave.
MAX_HOLD_S = 0.1
#: The largest producer epoch (Kafka's, a 16-bit signed number); past it a new producer id.
MAX_PRODUCER_EPOCH = 2**15 - 1

log = logging.getLogger("logstore.client.producer")

class RecordAccumulator:
    """Per-partition batches of one producer; see the module docstring."""

    def __init__(
        self,
        *,
        batch_size: int,
        linger_ms: int,
        max_request_size: int,
        buffer_memory: int,
        max_block_ms: int,
        retry_backoff_ms: int,
        delivery_timeout_ms: int,
        compression: str | None,
        idempotent: bool,
        transactional: bool,
        sticky: StickyPartitioner,
    ) -> None:
        self._batch_size = batch_size
        self._linger_s = linger_ms / 1000
        self._max_request_size = max_request_size
        self._request_bytes = min(max_request_size, _REQUEST_TARGET_BYTES)
        self._buffer_memory = buffer_memory
        self._max_block_s = max_block_ms / 1000
        self._retry_backoff_s = retry_backoff_ms / 1000
        self._delivery_timeout_s = delivery_timeout_ms / 1000
        self._encoder = BatchEncoder(compression=compression, idempotent=idempotent,
                                     transactional=transactional, max_request_size=max_request_size)
        self._idempotent = idempotent
        self._transactional = transactional
        self._sticky = sticky
        self._producer_id = -1
        self._producer_epoch = -1

        self.lock = threading.Lock()
        self.wakeup = threading.Condition(self.lock)   # the sender waits on it
        self.changed = threading.Condition(self.lock)  # flush and back-pressure wait on it
        self.partitions: dict[TopicPartition, PartitionState] = {}
        self.buffers: dict[str, TopicBuffer] = {}  # open send() records per topic
        self.incomplete: dict[int, int] = {}  # batch id -> record count, until reported
        self._ids = itertools.count(1)
        self.queued_bytes = 0
        self.closing = False  # no more appends (Producer.close)
        self.failure: BaseException | None = None  # why the sender thread died
        # A partition must restart its sequences and the epoch is at its limit: the sender
        # gets a new producer id (idempotent producers only).
        self.needs_producer_id = False

    # ------------------------------------------------------------------ caller side

    def check_open(self) -> None:
        if self.failure is not None:
            raise RuntimeError(f"the producer's sender thread failed: {self.failure!r}")
        if self.closing:
            raise RuntimeError("the producer is closed")

    def set_producer_id(self, producer_id: int, producer_epoch: int, *, reset_sequences: bool) -> None:
        """The producer id and epoch partitions start (or restart) numbering under.

        With ``reset_sequences`` (a transactional producer's new epoch; its
        queues are empty) every partition restarts at 0 under them now.
        """
        with self.lock:
            self._producer_id, self._producer_epoch = producer_id, producer_epoch
            self.needs_producer_id = False
            for state in self.partitions.values():
                if reset_sequences or state.producer_id < 0:
                    state.producer_id, state.producer_epoch = producer_id, producer_epoch
                    state.next_seq = 0
                    state.restart = False
            self.wakeup.notify()

    def append(
        self,
        info: TopicInfo,
        partition: int,
        key: bytes | None,
        value: Any,
        timestamp_ms: int,
        headers: list[dict[str, Any]] | None,
        size: int,
        on_delivery: DeliveryCallback | None,
    ) -> RecordFuture:
        """Append one ``send()`` record of about ``size`` bytes to its topic's open buffer.

        ``partition`` is the partition, or ``KEYED``/``STICKY`` (see
        :mod:`~logstore.client.producer.record_buffer`). Blocks up to
        ``max_block_ms`` while the buffer is full. The hot path of ``send()``:
        list appends under the lock, and one small future.
        """
        with self.lock:
            if self.queued_bytes > self._buffer_memory:
                self._wait_for_room(0)
            buffer = self.buffers.get(info.name)
            if buffer is None or buffer.info is not info:
                buffer = self._open_buffer(info)
            elif buffer.size + size > self._batch_size:
                self._seal_buffer(buffer)
                buffer = self._open_buffer(info)
            columns = buffer.columns
            index = len(columns.values)
            columns.keys.append(key)
            columns.values.append(value)
            columns.timestamps.append(timestamp_ms)
            columns.headers.append(headers)
            buffer.parts.append(partition)
            buffer.size += size
            completion = buffer.completion
            if on_delivery is not None:
                completion.add_on_delivery(index, on_delivery)
            if buffer.size >= self._batch_size:
                self._seal_buffer(buffer)
        return RecordFuture(completion, index)

    def _open_buffer(self, info: TopicInfo) -> TopicBuffer:
        """A new open buffer for ``info``'s topic (sealing one of older metadata). Caller holds the lock."""
        old = self.buffers.get(info.name)
        if old is not None:
            self._seal_buffer(old)
        buffer = self.buffers[info.name] = TopicBuffer(info, time.monotonic())
        self.wakeup.notify()  # the sender learns the linger deadline
        return buffer

    def split(
        self,
        info: TopicInfo,
        stored: pa.RecordBatch,
        partition: int | None,
        parts: np.ndarray | None,
    ) -> Iterable[tuple[int, pa.RecordBatch]]:
        """Yield ``(partition, chunk of at most batch_size bytes)`` for a converted ``send_batch`` batch.

        See :func:`~logstore.client.producer.record_buffer.split_stored`.
        """
        return split_stored(info, stored, partition, parts, sticky=self._sticky, batch_size=self._batch_size)

    def append_encoded(
        self, info: TopicInfo, partition: int, chunk: pa.RecordBatch, call: SendBatchCall
    ) -> None:
        """Encode ``chunk`` (a stored batch) and queue it to ``partition`` for ``call``.

        Without idempotence the encoding happens before taking the lock; with
        it, under the lock, because the sequence numbers follow queue order.
        """
        if not self._idempotent:
            data = self._encoder.encode(chunk)
            self._encoder.check_request_size(info, chunk, data)
        with self.lock:
            self._wait_for_room(data.size if not self._idempotent else chunk.nbytes)
            buffer = self.buffers.get(info.name)
            if buffer is not None:
                self._seal_buffer(buffer)  # records sent earlier with send() go first
            state = self._state(info, partition)
            sequence = state.next_seq
            if self._idempotent:
                data = self._encoder.encode(chunk, base_sequence=sequence, producer_id=state.producer_id,
                                            producer_epoch=state.producer_epoch)
                self._encoder.check_request_size(info, chunk, data)
                state.next_seq = (state.next_seq + chunk.num_rows) % _SEQUENCE_MOD
            batch = ProducerBatch(next(self._ids), info, partition, created=time.monotonic(),
                                  size=data.size, count=chunk.num_rows)
            if self._idempotent:
                batch.base_sequence = sequence
                batch.producer_id, batch.producer_epoch = state.producer_id, state.producer_epoch
            batch.data = data
            batch.call = call
            batch.call_index = call.add()
            self.incomplete[batch.id] = batch.count
            state.queue.append(batch)
            self.queued_bytes += batch.size
            self.wakeup.notify()

    def encode_records(self, batch: ProducerBatch) -> None:
        """Turn a batch of ``send()`` records into a stored batch message (sender thread);
        records Arrow cannot convert fail alone (:meth:`BatchEncoder.encode_records`)."""
        count = batch.count
        self._encoder.encode_records(batch)
        if batch.count != count:
            with self.lock:
                self.incomplete[batch.id] = batch.count

    def flush(self, timeout: float | None = None) -> int:
        """Seal every open batch and wait until all batches opened so far are reported.

        Returns the number of their records still undelivered after
        ``timeout`` seconds (None = no limit).
        """
        deadline = None if timeout is None else time.monotonic() + timeout
        with self.lock:
            self._seal_all()
            if not self.incomplete:
                return 0
            last_id = max(self.incomplete)
            self.wakeup.notify()
            while True:
                waiting = [c for i, c in self.incomplete.items() if i <= last_id]
                if not waiting:
                    return 0
                remaining = None if deadline is None else deadline - time.monotonic()
                if remaining is not None and remaining <= 0:
                    return sum(waiting)
                self.changed.wait(remaining)

    def _wait_for_room(self, size: int) -> None:
        """Block until ``size`` more bytes fit in ``buffer_memory``. Caller holds the lock."""
        deadline = time.monotonic() + self._max_block_s
        while True:
            self.check_open()
            if not self.queued_bytes or self.queued_bytes + size <= self._buffer_memory:
                return
            remaining = deadline - time.monotonic()
            if remaining <= 0:
                raise RequestTimedOutError(
                    f"the producer buffer stayed full (buffer_memory={self._buffer_memory} bytes) "
                    f"for max_block_ms ({int(self._max_block_s * 1000)}); the broker is not keeping up"
                )
            self.changed.wait(remaining)

    def _state(self, info: TopicInfo, partition: int) -> PartitionState:
        """The state of a partition, created on first use. Caller holds the lock."""
        tp = TopicPartition(info.name, partition)
        state = self.partitions.get(tp)
        if state is None:
            state = self.partitions[tp] = PartitionState(info, partition)
            state.producer_id, state.producer_epoch = self._producer_id, self._producer_epoch
        elif state.info is not info:
            state.info = info  # metadata was refreshed
        return state

    def _seal_buffer(self, buffer: TopicBuffer) -> None:
        """Cut ``buffer`` into partition batches and queue them. Caller holds the lock.

        Sequences are assigned here, in queue order, when idempotent.
        """
        info = buffer.info
        name = info.name
        if self.buffers.get(name) is buffer:
            del self.buffers[name]
        total = len(buffer.parts)
        if not total:
            return
        n = info.num_partitions
        sticky = self._sticky.partition(name, n)
        for sub, (p, columns, count) in enumerate(split_buffer(buffer, sticky)):
            state = self._state(info, p)
            batch = ProducerBatch(next(self._ids), info, p, created=buffer.created,
                                  size=max(1, buffer.size * count // total), count=count)
            batch.records = columns
            batch.completion = buffer.completion
            batch.sub = sub
            if self._idempotent:
                batch.base_sequence = state.next_seq
                batch.producer_id, batch.producer_epoch = state.producer_id, state.producer_epoch
                state.next_seq = (state.next_seq + count) % _SEQUENCE_MOD
            state.queue.append(batch)
            self.queued_bytes += batch.size
            self.incomplete[batch.id] = count
            self._sticky.on_new_batch(name, n, p)
        self.wakeup.notify()

    def _seal_all(self) -> None:
        """Seal every open buffer. Caller holds the lock."""
        for buffer in list(self.buffers.values()):
            self._seal_buffer(buffer)

    # ------------------------------------------------------------------ sender side

    def drain(
        self, *, stopping: bool, max_requests: int
    ) -> tuple[list[Request], list[tuple[ProducerBatch, LogstoreError]]]:
        """Seal lingered buffers, expire old batches, pick what to send. Caller holds the lock.

        Returns at most ``max_requests`` requests (the sender's free
        in-flight slots). When ``stopping``, every open buffer is sealed and
        every queued batch expires (nothing new is sent). The batches picked
        are counted in flight.
        """
        now = time.monotonic()
        expired: list[tuple[ProducerBatch, LogstoreError]] = []
        requests: list[Request] = []
        current: Request = {}
        current_bytes = 0
        waiting = self._topics_waiting() if self.buffers else set()
        for buffer in list(self.buffers.values()):
            if stopping or (now - buffer.created >= self._linger_s
                            and not self._held_back(buffer, now, max_requests > 0, waiting)):
                self._seal_buffer(buffer)
        limit = IDEMPOTENT_BATCHES_PER_PARTITION
        for state in self.partitions.values():
            if stopping:
                while state.queue:
                    batch = state.queue.popleft()
                    self.queued_bytes -= batch.size
                    expired.append((batch, RequestTimedOutError(
                        f"the producer was closed before the batch for {batch.tp} was sent"
                    )))
                continue
            if not state.queue or state.retry_at > now:
                continue
            if state.in_flight and (not self._idempotent or state.resync or state.restart):
                continue  # one request at a time; or wait until the pipeline has drained
            while state.queue and now - state.queue[0].created >= self._delivery_timeout_s:
                batch = state.queue.popleft()
                self.queued_bytes -= batch.size
                if batch.base_sequence >= 0 and not batch.maybe_written and not self._transactional:
                    state.restart = True  # a hole the broker will never see filled
                expired.append((batch, RequestTimedOutError(
                    f"a batch of {batch.count} records for {batch.tp} expired: not delivered "
                    f"within delivery_timeout_ms ({int(self._delivery_timeout_s * 1000)}) "
                    f"after {batch.attempts} attempts"
                )))
            if not state.queue or len(requests) >= max_requests:
                continue
            if state.restart and not self._new_epoch(state):
                continue  # waiting for a new producer id
            window = state.window
            while window and window[0].reported:
                window.popleft()
            picked: list[ProducerBatch] = []
            picked_bytes = 0
            while state.queue and (
                not picked or picked_bytes + state.queue[0].size <= self._request_bytes
            ):
                batch = state.queue[0]
                if self._idempotent and not batch.in_window:
                    if len(window) >= limit:
                        break
                    window.append(batch)
                    batch.in_window = True
                state.queue.popleft()
                picked.append(batch)
                picked_bytes += batch.size
            if not picked:
                continue
            if current and current_bytes + picked_bytes > self._request_bytes:
                requests.append(current)
                current, current_bytes = {}, 0
                if len(requests) >= max_requests:
                    state.queue.extendleft(reversed(picked))
                    break
            current[state.tp] = picked
            current_bytes += picked_bytes
            state.in_flight += len(picked)
            state.resync = False
        if current:
            requests.append(current)
        if expired:
            self.changed.notify_all()
        return requests, expired

    def next_deadline(self, now: float, *, can_send: bool = True) -> float | None:
        """When the next linger, backoff or delivery timeout ends (monotonic; None = none).

        A partition waiting for answers (one request at a time, resync, a
        full window) or, when not ``can_send`` (no free request slot), any
        partition, has no deadline to send: an answer wakes the sender.
        Caller holds the lock.
        """
        waiting = self._topics_waiting() if self.buffers else set()
        times = [b.created + self._linger_s + (MAX_HOLD_S if self._held_back(b, now, can_send, waiting) else 0.0)
                 for b in self.buffers.values()]
        for state in self.partitions.values():
            if state.queue and not (state.in_flight and (not self._idempotent or state.resync or state.restart)):
                times.append(state.queue[0].created + self._delivery_timeout_s)
                if can_send and not self._window_full(state):
                    times.append(max(state.retry_at, now))
        return min(times) if times else None

    def _topics_waiting(self) -> set[str]:
        """The topics with a batch queued behind requests in flight (one pass over the
        partitions, whatever the number of open buffers). Caller holds the lock."""
        return {tp.topic for tp, state in self.partitions.items() if state.queue and state.in_flight}

    def _held_back(self, buffer: TopicBuffer, now: float, can_send: bool, waiting: set[str]) -> bool:
        """Whether a lingered ``buffer`` stays open to take more records: sealed now, its batches
        would wait (no free request slot, or its topic is in ``waiting``), and it is younger than
        its linger plus :data:`MAX_HOLD_S`. Caller holds the lock."""
        if now - buffer.created >= self._linger_s + MAX_HOLD_S:
            return False
        return not can_send or buffer.info.name in waiting

    def _window_full(self, state: PartitionState) -> bool:
        """Whether the next batch of ``state`` must wait for an answer (idempotent window)."""
        if not self._idempotent or not state.queue or state.queue[0].in_window:
            return False
        window = state.window
        while window and window[0].reported:
            window.popleft()
        return len(window) >= IDEMPOTENT_BATCHES_PER_PARTITION

    def release(
        self, tp: TopicPartition, batches: list[ProducerBatch], *, retry: bool,
        backoff_s: float | None = None,
    ) -> None:
        """``batches`` of ``tp`` are no longer in flight; on retry they go back to the queue.

        Retried batches are put back in sequence (queue) order and the
        partition waits ``backoff_s`` (default ``retry_backoff_ms``) and, when
        pipelining, until its other requests have answered.
        """
        with self.lock:
            self._release(tp, batches, retry=retry, backoff_s=backoff_s)

    def _release(
        self, tp: TopicPartition, batches: list[ProducerBatch], *, retry: bool, backoff_s: float | None,
    ) -> None:
        state = self.partitions[tp]
        state.in_flight -= len(batches)
        if retry:
            if state.queue and batches and state.queue[0].id < batches[-1].id:
                state.queue = deque(sorted((*batches, *state.queue), key=lambda b: b.id))
            else:
                state.queue.extendleft(reversed(batches))
            state.resync = True
            wait = self._retry_backoff_s if backoff_s is None else backoff_s
            state.retry_at = max(state.retry_at, time.monotonic() + wait)
        else:
            for b in batches:
                self.queued_bytes -= b.size
        self.changed.notify_all()
        self.wakeup.notify()

    def note_failed(self, tp: TopicPartition, batches: list[ProducerBatch]) -> None:
        """``batches`` failed for good: a hole in the sequences if one of them never reached the
        broker (one that may have been written is settled by the broker's answer to the next)."""
        if any(b.base_sequence >= 0 and not b.maybe_written for b in batches):
            self.restart_sequences(tp)

    def restart_sequences(self, tp: TopicPartition) -> None:
        """``tp`` restarts its sequences under a new epoch once its requests in flight have answered
        (see the module docstring). Not for a transactional producer (its coordinator bumps)."""
        if self._transactional:
            return
        with self.lock:
            state = self.partitions.get(tp)
            if state is not None:
                state.restart = True
                self.wakeup.notify()

    def is_oldest_pending(self, tp: TopicPartition, batch: ProducerBatch) -> bool:
        """Whether every batch of ``tp`` numbered before ``batch`` has been reported on (so a refusal
        of ``batch`` as out of order cannot be waiting for an earlier one to arrive)."""
        with self.lock:
            state = self.partitions.get(tp)
            if state is None:
                return False
            for b in state.window:
                if b is batch:
                    return True
                if not b.reported:
                    return False
            return False

    def _new_epoch(self, state: PartitionState) -> bool:
        """Restart ``state``'s sequences at 0 under a newer epoch, re-stamping its queued batches.

        Caller holds the lock; nothing of the partition is in flight. False
        (nothing done) while the producer waits for a new producer id.
        """
        if (state.producer_id, state.producer_epoch) == (self._producer_id, self._producer_epoch):
            if self._producer_epoch >= MAX_PRODUCER_EPOCH:
                self.needs_producer_id = True
                return False
            self._producer_epoch += 1
        state.restart_at_zero(self._producer_id, self._producer_epoch)
        log.info("producer %d restarts the sequences of %s at 0 under epoch %d (%d batches queued)",
                 state.producer_id, state.tp, state.producer_epoch, len(state.queue))
        return True

    def completed(self, batch: ProducerBatch) -> None:
        """Stop counting ``batch`` as incomplete (its outcome was reported)."""
        with self.lock:
            self.incomplete.pop(batch.id, None)
            self.changed.notify_all()

    def abort_queued(self) -> list[ProducerBatch]:
        """Seal and remove every batch still open or queued; return them. Caller holds the lock."""
        self._seal_all()
        leftovers: list[ProducerBatch] = []
        for state in self.partitions.values():
            leftovers.extend(state.queue)
            state.queue.clear()
        self.queued_bytes = 0
        return leftovers
