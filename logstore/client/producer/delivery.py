"""Delivery reports: the futures and ``on_delivery`` callbacks a batch completes.

A batch appended with ``send()`` carries a :class:`RecordSink` (one future and
callback per record, in batch order); a batch cut from ``send_batch()``
belongs to a :class:`SendBatchCall` (one future for the whole call, holding a
:class:`SendBatchResult` once every batch succeeded, else the first error).
Each is completed exactly once, on the sender thread (or, for records that
fail conversion, wherever they fail), never while the producer's lock is held.
A callback that raises is logged and ignored.

Thread-safety: :class:`SendBatchCall` is thread-safe (its own lock); a
:class:`RecordSink` is filled under the producer's lock and completed by one
thread.
"""

from __future__ import annotations

import concurrent.futures
import logging
import threading
from collections.abc import Callable

from logstore.errors import LogstoreError
from logstore.types import BatchMetadata, RecordMetadata, SendBatchResult, TopicPartition

__all__ = ["DeliveryCallback", "RecordSink", "SendBatchCall", "run_callback"]

log = logging.getLogger("logstore.client.producer")

# on_delivery(error, metadata): exactly one of them is None.
DeliveryCallback = Callable[[LogstoreError | None, RecordMetadata | None], None]


class RecordSink:
    """Futures and callbacks of records appended with ``send()``, in batch order."""

    __slots__ = ("futures", "callbacks", "timestamps")

    def __init__(self) -> None:
        self.futures: list[concurrent.futures.Future[RecordMetadata]] = []
        self.callbacks: list[DeliveryCallback | None] = []
        self.timestamps: list[int] = []

    def succeed(self, tp: TopicPartition, base_offset: int, append_time_ms: int) -> None:
        for i, (fut, cb, ts) in enumerate(zip(self.futures, self.callbacks, self.timestamps, strict=True)):
            md = RecordMetadata(
                tp.topic, tp.partition, base_offset + i if base_offset >= 0 else -1,
                append_time_ms if append_time_ms >= 0 else ts,
            )
            fut.set_result(md)
            if cb is not None:
                run_callback(cb, None, md)

    def fail(self, error: LogstoreError) -> None:
        for fut, cb in zip(self.futures, self.callbacks, strict=True):
            fut.set_exception(error)
            if cb is not None:
                run_callback(cb, error, None)


def run_callback(cb: DeliveryCallback, error: LogstoreError | None, md: RecordMetadata | None) -> None:
    try:
        cb(error, md)
    except Exception:
        log.exception("on_delivery callback raised")


class SendBatchCall:
    """Tracks the batches of one ``send_batch`` call and completes its future."""

    __slots__ = ("future", "_lock", "_added", "_pending", "_sealed", "_results", "_error")

    def __init__(self) -> None:
        self.future: concurrent.futures.Future[SendBatchResult] = concurrent.futures.Future()
        self.future.set_running_or_notify_cancel()
        self._lock = threading.Lock()
        self._added = 0
        self._pending = 0
        self._sealed = False
        self._results: list[tuple[int, BatchMetadata]] = []
        self._error: BaseException | None = None

    def add(self) -> int:
        """Register one more batch; return its index in the call."""
        with self._lock:
            self._pending += 1
            self._added += 1
            return self._added - 1

    def seal(self, error: BaseException | None = None) -> None:
        with self._lock:
            self._sealed = True
            if error is not None and self._error is None:
                self._error = error
        self._maybe_complete()

    def succeed(self, index: int, md: BatchMetadata) -> None:
        with self._lock:
            self._pending -= 1
            self._results.append((index, md))
        self._maybe_complete()

    def fail(self, error: BaseException) -> None:
        with self._lock:
            self._pending -= 1
            if self._error is None:
                self._error = error
        self._maybe_complete()

    def _maybe_complete(self) -> None:
        with self._lock:
            if not self._sealed or self._pending or self.future.done():
                return
            error, results = self._error, sorted(self._results, key=lambda r: r[0])
        if error is not None:
            self.future.set_exception(error)
        else:
            self.future.set_result(SendBatchResult(tuple(md for _, md in results)))
