"""The record accumulator: per-partition batches, linger, the memory bound.

Batches
-------
Each partition (:class:`PartitionState`) has at most one *open* batch
(:class:`OpenBatch`) that ``send()`` appends records to. It is sealed when
adding a record would take it past ``batch_size`` bytes (an estimate of the
uncompressed size), when it has been open ``linger_ms``, on :meth:`flush`,
before a ``send_batch()`` batch is queued to the same partition (records sent
earlier go first), and when the producer stops. A sealed batch
(:class:`ProducerBatch`) joins its partition's queue; ``send_batch()`` batches
are converted and encoded by the caller and queued directly
(:meth:`RecordAccumulator.append_encoded`).

Idempotence: a batch gets its ``base_sequence`` (counting records, modulo
2**31) when it joins the queue, so sequences follow queue order. Batches are
encoded with the producer id and epoch set by :meth:`set_producer_id`.

Draining (:meth:`RecordAccumulator.drain`, called by the sender): at most one
request per partition is in flight (``PartitionState.in_flight``), so the
batches of a partition are appended in queue order, retries included: a
retried batch goes back to the head of its queue (:meth:`release`) and waits
``retry_backoff_ms``. A batch still queued ``delivery_timeout_ms`` after it
was created expires. One request carries the ready batches of one or more
partitions up to ``min(4 MiB, max_request_size)`` (a single larger batch goes
alone). With idempotence a request carries at most
``IDEMPOTENT_BATCHES_PER_PARTITION`` (5) batches of a partition: the broker
recognises a retried batch only among the last 5 it appended for the producer
(Kafka's limit of 5 in-flight batches), so a request the broker appended in
part before its answer was lost can be retried without a sequence error.

Memory bound: the bytes of sealed, unsent-or-in-flight batches
(``queued_bytes``) stay within ``buffer_memory``; callers block up to
``max_block_ms`` for room (an empty buffer always admits one batch), then get
:class:`RequestTimedOutError`.

Incomplete batches: every batch, from when it opens until its outcome is
reported, is counted in ``incomplete`` (batch id -> record count); batch ids
increase, so :meth:`flush` waits for the ids up to the last one it saw.

Thread-safety: one lock (``lock``) guards the partition states, the buffer
accounting, ``incomplete``, the producer id and the sender's in-flight
bookkeeping. The sender waits on the ``wakeup`` condition; flush and
back-pressure wait on ``changed``. Futures and callbacks are completed
outside the lock.
"""

from __future__ import annotations

import concurrent.futures
import itertools
import threading
import time
from collections import deque
from collections.abc import Iterable
from typing import Any

import numpy as np
import pyarrow as pa

from logstore.client.partitioner import StickyPartitioner, partitions_for_keys
from logstore.client.producer.arrow_input import records_to_batch
from logstore.client.producer.delivery import (
    DeliveryCallback,
    RecordSink,
    SendBatchCall,
    run_callback,
)
from logstore.client.producer.metadata import TopicInfo
from logstore.errors import (
    LogstoreError,
    RecordTooLargeError,
    RequestTimedOutError,
    SchemaMismatchError,
)
from logstore.record import ATTR_TRANSACTIONAL, EncodedBatch, encode_batch
from logstore.types import BatchMetadata, RecordMetadata, TopicPartition

__all__ = ["OpenBatch", "ProducerBatch", "PartitionState", "RecordAccumulator", "Request"]

# Produce requests are cut at this size (or max_request_size if smaller): gRPC moves
# 1-4 MiB messages fastest, and smaller requests let partitions overlap in flight.
_REQUEST_TARGET_BYTES = 4 << 20
# Producer sequence numbers wrap at 2**31, as Kafka's do.
_SEQUENCE_MOD = 2**31


#: Batches of one partition per request with idempotence: the broker's duplicate window.
IDEMPOTENT_BATCHES_PER_PARTITION = 5

class OpenBatch:
    """Records appended with ``send()`` to a partition's not-yet-sealed batch."""

    __slots__ = ("keys", "values", "timestamps", "headers", "sink", "size", "created")

    def __init__(self, now: float) -> None:
        self.keys: list[bytes | None] = []
        self.values: list[Any] = []
        self.timestamps: list[int] = []
        self.headers: list[list[dict[str, Any]] | None] = []
        self.sink = RecordSink()
        self.size = 0
        self.created = now


class ProducerBatch:
    """A sealed batch waiting in a partition queue (or in flight).

    ``records`` holds the unencoded records until the sender encodes them;
    ``data`` then holds the stored batch message. ``empty`` marks a batch all
    of whose records failed conversion (nothing to send).
    """

    __slots__ = ("id", "tp", "info", "records", "data", "empty", "count", "size", "created",
                 "attempts", "record_sink", "call", "call_index", "reported", "base_sequence",
                 "maybe_written")

    def __init__(
        self, batch_id: int, info: TopicInfo, partition: int, *, created: float, size: int, count: int
    ) -> None:
        self.id = batch_id
        self.info = info
        self.tp = TopicPartition(info.name, partition)
        self.records: OpenBatch | None = None
        self.data: EncodedBatch | None = None
        self.empty = False
        self.count = count
        self.size = size
        self.created = created
        self.attempts = 0
        self.record_sink: RecordSink | None = None
        self.call: SendBatchCall | None = None
        self.call_index = 0
        self.reported = False
        self.base_sequence = -1
        # An attempt ended without a definite answer: the broker may hold the batch.
        self.maybe_written = False

    def report(self, error: LogstoreError | None, base_offset: int = -1, append_time_ms: int = -1) -> None:
        """Complete the batch's futures and callbacks, once. Never called under the lock."""
        if self.reported:
            return
        self.reported = True
        if error is None:
            if self.record_sink is not None:
                self.record_sink.succeed(self.tp, base_offset, append_time_ms)
            if self.call is not None:
                self.call.succeed(
                    self.call_index, BatchMetadata(self.tp.topic, self.tp.partition, base_offset, self.count)
                )
        else:
            if self.record_sink is not None:
                self.record_sink.fail(error)
            if self.call is not None:
                self.call.fail(error)


class PartitionState:
    __slots__ = ("tp", "info", "open", "open_id", "queue", "in_flight", "retry_at", "next_seq")

    def __init__(self, info: TopicInfo, partition: int) -> None:
        self.tp = TopicPartition(info.name, partition)
        self.info = info
        self.open: OpenBatch | None = None
        self.open_id = 0
        self.queue: deque[ProducerBatch] = deque()
        self.in_flight = False
        self.retry_at = 0.0
        self.next_seq = 0


# The batches of one produce request, per partition.
Request = dict[TopicPartition, list[ProducerBatch]]


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
        self._compression = compression
        self._idempotent = idempotent
        self._transactional = transactional
        self._sticky = sticky
        self._producer_id = -1
        self._producer_epoch = -1

        self.lock = threading.Lock()
        self.wakeup = threading.Condition(self.lock)   # the sender waits on it
        self.changed = threading.Condition(self.lock)  # flush and back-pressure wait on it
        self.partitions: dict[TopicPartition, PartitionState] = {}
        self.incomplete: dict[int, int] = {}  # batch id -> record count, until reported
        self._ids = itertools.count(1)
        self.queued_bytes = 0
        self.closing = False  # no more appends (Producer.close)
        self.failure: BaseException | None = None  # why the sender thread died

    # ------------------------------------------------------------------ caller side

    def check_open(self) -> None:
        if self.failure is not None:
            raise RuntimeError(f"the producer's sender thread failed: {self.failure!r}")
        if self.closing:
            raise RuntimeError("the producer is closed")

    def set_producer_id(self, producer_id: int, producer_epoch: int, *, reset_sequences: bool) -> None:
        """Encode later batches with this id and epoch; a new id restarts every partition's sequence."""
        with self.lock:
            self._producer_id, self._producer_epoch = producer_id, producer_epoch
            if reset_sequences:
                for state in self.partitions.values():
                    state.next_seq = 0

    def append(
        self,
        info: TopicInfo,
        partition: int | None,
        key: bytes | None,
        value: Any,
        timestamp_ms: int,
        headers: list[dict[str, Any]] | None,
        size: int,
        on_delivery: DeliveryCallback | None,
    ) -> concurrent.futures.Future[RecordMetadata]:
        """Append one ``send()`` record of about ``size`` bytes to its partition's open batch.

        ``partition`` None means the topic's sticky partition. Blocks up to
        ``max_block_ms`` while the buffer is full.
        """
        future: concurrent.futures.Future[RecordMetadata] = concurrent.futures.Future()
        future.set_running_or_notify_cancel()
        topic, n = info.name, info.num_partitions
        with self.lock:
            self._wait_for_room(0)
            now = time.monotonic()
            p = partition if partition is not None else self._sticky.partition(topic, n)
            state = self._state(info, p)
            if state.open is not None and state.open.size + size > self._batch_size:
                self._seal(state)
                if partition is None:
                    state = self._state(info, self._sticky.partition(topic, n))
            if state.open is None:
                state.open = OpenBatch(now)
                state.open_id = next(self._ids)
                self.incomplete[state.open_id] = 0
                self.wakeup.notify()
            batch = state.open
            batch.keys.append(key)
            batch.values.append(value)
            batch.timestamps.append(timestamp_ms)
            batch.headers.append(headers)
            batch.sink.futures.append(future)
            batch.sink.callbacks.append(on_delivery)
            batch.sink.timestamps.append(timestamp_ms)
            batch.size += size
            self.incomplete[state.open_id] += 1
            if batch.size >= self._batch_size:
                self._seal(state)
        return future

    def split(
        self,
        info: TopicInfo,
        stored: pa.RecordBatch,
        partition: int | None,
        parts: np.ndarray | None,
    ) -> Iterable[tuple[int, pa.RecordBatch]]:
        """Yield ``(partition, chunk of at most batch_size bytes)`` for a converted batch.

        Rows go to ``partition`` if given; else to ``parts`` (a partition per
        row); else by key (vectorized murmur2), keyless rows to the sticky
        partition; a keyless input is cut into chunks spread round-robin from
        the sticky partition. Each partition's rows keep their input order.
        """
        n = info.num_partitions
        rows = stored.num_rows
        if partition is None and parts is None:
            keys = stored.column(2)
            if keys.null_count < rows:
                parts = partitions_for_keys(keys, n)
                if keys.null_count:
                    parts[parts < 0] = self._sticky.partition(info.name, n)
        if partition is not None or parts is None:
            # One partition, or no keys: round-robin chunks from the sticky partition.
            start = partition if partition is not None else self._sticky.partition(info.name, n)
            last = start
            for i, chunk in enumerate(self._chunks(stored)):
                last = start if partition is not None else (start + i) % n
                yield last, chunk
            if partition is None:
                self._sticky.on_new_batch(info.name, n, self._sticky.partition(info.name, n))
            return
        first = int(parts[0])
        if (parts == first).all():
            for chunk in self._chunks(stored):
                yield first, chunk
            return
        order = np.argsort(parts, kind="stable")
        sorted_parts = parts[order]
        cuts = np.flatnonzero(np.diff(sorted_parts)) + 1
        taken = stored.take(pa.array(order))
        bounds = [0, *cuts.tolist(), rows]
        for lo, hi in zip(bounds[:-1], bounds[1:], strict=True):
            for chunk in self._chunks(taken.slice(lo, hi - lo)):
                yield int(sorted_parts[lo]), chunk

    def _chunks(self, batch: pa.RecordBatch) -> Iterable[pa.RecordBatch]:
        rows = batch.num_rows
        if rows == 0:
            return
        per_row = max(1, batch.nbytes // rows)
        step = max(1, self._batch_size // per_row)
        for lo in range(0, rows, step):
            yield batch.slice(lo, min(step, rows - lo))

    def append_encoded(
        self, info: TopicInfo, partition: int, chunk: pa.RecordBatch, call: SendBatchCall
    ) -> None:
        """Encode ``chunk`` (a stored batch) and queue it to ``partition`` for ``call``.

        Without idempotence the encoding happens before taking the lock; with
        it, under the lock, because the sequence numbers follow queue order.
        """
        if not self._idempotent:
            data = self.encode(chunk, -1)
            self._check_request_size(info, chunk, data)
        with self.lock:
            self._wait_for_room(data.size if not self._idempotent else chunk.nbytes)
            state = self._state(info, partition)
            self._seal(state)  # records sent earlier with send() go first
            if self._idempotent:
                data = self.encode(chunk, state.next_seq)
                self._check_request_size(info, chunk, data)
                state.next_seq = (state.next_seq + chunk.num_rows) % _SEQUENCE_MOD
            batch = ProducerBatch(next(self._ids), info, partition, created=time.monotonic(),
                                  size=data.size, count=chunk.num_rows)
            batch.data = data
            batch.call = call
            batch.call_index = call.add()
            self.incomplete[batch.id] = batch.count
            state.queue.append(batch)
            self.queued_bytes += batch.size
            self.wakeup.notify()

    def _check_request_size(self, info: TopicInfo, chunk: pa.RecordBatch, data: EncodedBatch) -> None:
        if data.size + len(info.schema_message) > self._max_request_size:
            raise RecordTooLargeError(
                f"a batch of {chunk.num_rows} records encodes to {data.size} bytes, more than "
                f"max_request_size ({self._max_request_size}); lower batch_size or raise "
                "max_request_size"
            )

    def encode(self, stored: pa.RecordBatch, base_sequence: int) -> EncodedBatch:
        """Encode with the producer's id, epoch and (when idempotent) ``base_sequence``."""
        if not self._idempotent:
            return encode_batch(stored, base_offset=0, compression=self._compression)
        return encode_batch(
            stored, base_offset=0, compression=self._compression,
            producer_id=self._producer_id, producer_epoch=self._producer_epoch,
            base_sequence=base_sequence,
            attributes=ATTR_TRANSACTIONAL if self._transactional else 0,
        )

    def encode_records(self, batch: ProducerBatch) -> None:
        """Turn a batch of ``send()`` records into a stored batch message (sender thread).

        Records whose values Arrow cannot convert to the topic's columns fail
        alone with :class:`SchemaMismatchError`; the rest are sent.
        """
        records = batch.records
        assert records is not None
        info = batch.info
        try:
            stored: pa.RecordBatch | None = records_to_batch(info, records, None)
        except (pa.ArrowException, TypeError, ValueError):
            good: list[int] = []
            for i in range(len(records.values)):
                try:
                    records_to_batch(info, records, [i])
                    good.append(i)
                except (pa.ArrowException, TypeError, ValueError) as e:
                    err = SchemaMismatchError(
                        f"record value does not fit the columns of topic {info.name!r}: {e}"
                    )
                    records.sink.futures[i].set_exception(err)
                    cb = records.sink.callbacks[i]
                    if cb is not None:
                        run_callback(cb, err, None)
            sink = RecordSink()
            sink.futures = [records.sink.futures[i] for i in good]
            sink.callbacks = [records.sink.callbacks[i] for i in good]
            sink.timestamps = [records.sink.timestamps[i] for i in good]
            batch.record_sink = sink
            batch.count = len(good)
            with self.lock:
                self.incomplete[batch.id] = len(good)
            stored = records_to_batch(info, records, good) if good else None
        batch.records = None
        if stored is None:
            batch.empty = True
        else:
            batch.data = self.encode(stored, batch.base_sequence)

    def flush(self, timeout: float | None = None) -> int:
        """Seal every open batch and wait until all batches opened so far are reported.

        Returns the number of their records still undelivered after
        ``timeout`` seconds (None = no limit).
        """
        deadline = None if timeout is None else time.monotonic() + timeout
        with self.lock:
            if not self.incomplete:
                return 0
            last_id = max(self.incomplete)
            for state in self.partitions.values():
                self._seal(state)
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
        elif state.info is not info and state.open is None:
            state.info = info  # metadata was refreshed
        return state

    def _seal(self, state: PartitionState) -> None:
        """Move the open batch of ``state`` to its queue. Caller holds the lock."""
        open_batch = state.open
        if open_batch is None:
            return
        state.open = None
        batch = ProducerBatch(state.open_id, state.info, state.tp.partition, created=open_batch.created,
                              size=open_batch.size, count=len(open_batch.values))
        batch.records = open_batch
        batch.record_sink = open_batch.sink
        if self._idempotent:
            batch.base_sequence = state.next_seq
            state.next_seq = (state.next_seq + batch.count) % _SEQUENCE_MOD
        state.queue.append(batch)
        self.queued_bytes += batch.size
        self._sticky.on_new_batch(state.tp.topic, state.info.num_partitions, state.tp.partition)
        self.wakeup.notify()

    # ------------------------------------------------------------------ sender side

    def drain(self, *, stopping: bool) -> tuple[list[Request], list[tuple[ProducerBatch, LogstoreError]]]:
        """Seal lingered batches, expire old ones, pick what to send. Caller holds the lock.

        When ``stopping``, every open batch is sealed and every queued batch
        expires (nothing new is sent). The partitions picked are marked in flight.
        """
        now = time.monotonic()
        expired: list[tuple[ProducerBatch, LogstoreError]] = []
        requests: list[Request] = []
        current: Request = {}
        current_bytes = 0
        for state in self.partitions.values():
            if state.open is not None and (
                now - state.open.created >= self._linger_s or stopping
            ):
                self._seal(state)
            if stopping:
                while state.queue:
                    batch = state.queue.popleft()
                    self.queued_bytes -= batch.size
                    expired.append((batch, RequestTimedOutError(
                        f"the producer was closed before the batch for {batch.tp} was sent"
                    )))
                continue
            if state.in_flight or not state.queue or state.retry_at > now:
                continue
            while state.queue and now - state.queue[0].created >= self._delivery_timeout_s:
                batch = state.queue.popleft()
                self.queued_bytes -= batch.size
                expired.append((batch, RequestTimedOutError(
                    f"a batch of {batch.count} records for {batch.tp} expired: not delivered "
                    f"within delivery_timeout_ms ({int(self._delivery_timeout_s * 1000)}) "
                    f"after {batch.attempts} attempts"
                )))
            if not state.queue:
                continue
            picked: list[ProducerBatch] = []
            picked_bytes = 0
            while state.queue and (
                not picked or picked_bytes + state.queue[0].size <= self._request_bytes
            ) and (
                not self._idempotent or len(picked) < IDEMPOTENT_BATCHES_PER_PARTITION
            ):
                batch = state.queue.popleft()
                picked.append(batch)
                picked_bytes += batch.size
            if current and current_bytes + picked_bytes > self._request_bytes:
                requests.append(current)
                current, current_bytes = {}, 0
            current[state.tp] = picked
            current_bytes += picked_bytes
            state.in_flight = True
        if current:
            requests.append(current)
        if expired:
            self.changed.notify_all()
        return requests, expired

    def next_deadline(self, now: float) -> float | None:
        """When the next linger, backoff or delivery timeout ends (monotonic; None = none).

        Caller holds the lock.
        """
        times: list[float] = []
        for state in self.partitions.values():
            if state.open is not None:
                times.append(state.open.created + self._linger_s)
            if state.queue and not state.in_flight:
                times.append(max(state.retry_at, now))
                times.append(state.queue[0].created + self._delivery_timeout_s)
        return min(times) if times else None

    def release(
        self, tp: TopicPartition, batches: list[ProducerBatch], *, retry: bool,
        backoff_s: float | None = None,
    ) -> None:
        """End the in-flight state of ``tp``; on retry put ``batches`` back at the queue's head.

        The retry waits ``backoff_s`` (default ``retry_backoff_ms``).
        """
        with self.lock:
            state = self.partitions[tp]
            state.in_flight = False
            if retry:
                state.queue.extendleft(reversed(batches))
                state.retry_at = time.monotonic() + (self._retry_backoff_s if backoff_s is None else backoff_s)
            else:
                for b in batches:
                    self.queued_bytes -= b.size
            self.changed.notify_all()
            self.wakeup.notify()

    def completed(self, batch: ProducerBatch) -> None:
        """Stop counting ``batch`` as incomplete (its outcome was reported)."""
        with self.lock:
            self.incomplete.pop(batch.id, None)
            self.changed.notify_all()

    def abort_queued(self) -> list[ProducerBatch]:
        """Seal and remove every batch still open or queued; return them. Caller holds the lock."""
        leftovers: list[ProducerBatch] = []
        for state in self.partitions.values():
            self._seal(state)
            leftovers.extend(state.queue)
            state.queue.clear()
        self.queued_bytes = 0
        return leftovers
