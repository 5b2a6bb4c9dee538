"""Delivery reports: the futures and ``on_delivery`` callbacks a batch completes.

Records sent with ``send()`` share a :class:`SendCompletion` per topic buffer
(the records sent to a topic between two seals); each ``send()`` returns a
:class:`RecordFuture` that indexes into it, so no record owns a lock, a
condition or a list, and a dropped future is freed at once (no cyclic
garbage per record). A batch cut from ``send_batch()``
belongs to a :class:`SendBatchCall` (one future for the whole call, holding a
:class:`SendBatchResult` once every batch succeeded, else the first error).
Each is completed exactly once, on the sender thread (or, for records that
fail conversion, wherever they fail), never while the producer's lock is held.
A callback that raises is logged and ignored.

Thread-safety: :class:`SendBatchCall` and :class:`SendCompletion` are
thread-safe (their own lock); a completion's records are added under the
producer's lock.
"""

from __future__ import annotations

import concurrent.futures
import logging
import threading
import time
from collections.abc import Callable, Iterable
from typing import Any

from logstore.errors import LogstoreError
from logstore.types import BatchMetadata, RecordMetadata, SendBatchResult

__all__ = ["DeliveryCallback", "RecordFuture", "SendBatchCall", "SendCompletion", "run_callback"]

log = logging.getLogger("logstore.client.producer")

# on_delivery(error, metadata): exactly one of them is None.
DeliveryCallback = Callable[[LogstoreError | None, RecordMetadata | None], None]


class SendCompletion:
    """Outcomes of the records of one topic buffer: what ``send()`` futures index into.

    Records sent with ``send()`` to a topic between two seals share one
    completion; record ``i`` is the ``i``-th of them. When the buffer seals,
    :meth:`set_batches` says which partition batch (``batch_of[i]``, default
    0) and which position in it (``pos[i]``, default ``i``) each record got;
    each batch's outcome is then set once by :meth:`complete`: ``(base
    offset, append time)`` or an error. A record's :class:`RecordMetadata`
    is built only when someone asks for it. ``on_delivery`` callbacks and
    future hooks are kept in dicts by record index, so records without them
    cost nothing here.

    Thread-safety: ``cond`` guards everything; callbacks run outside it.
    """

    __slots__ = ("topic", "timestamps", "partitions", "batch_of", "pos", "rows", "outcomes",
                 "errors", "on_delivery", "hooks", "cond")

    def __init__(self, topic: str, timestamps: list[int]) -> None:
        self.topic = topic
        self.timestamps = timestamps
        self.partitions: list[int] = []  # per batch, set when sealed
        self.batch_of: list[int] | None = None  # per record; None = every record in batch 0
        self.pos: list[int] | None = None  # per record; None = position i
        self.rows: list[list[int]] | None = None  # per batch its record indices; None = range(n)
        self.outcomes: list[tuple[int, int] | LogstoreError | None] = []
        self.errors: dict[int, LogstoreError] | None = None  # records that failed alone
        self.on_delivery: dict[int, DeliveryCallback] | None = None
        self.hooks: dict[int, list[Callable[[], object]]] | None = None
        self.cond = threading.Condition(threading.Lock())

    def add_on_delivery(self, index: int, callback: DeliveryCallback) -> None:
        """Register record ``index``'s callback (called under the producer's lock, before sealing)."""
        if self.on_delivery is None:
            self.on_delivery = {}
        self.on_delivery[index] = callback

    def set_batches(self, partitions: list[int], batch_of: list[int] | None, pos: list[int] | None,
                    rows: list[list[int]] | None) -> None:
        """Record where the sealed records went (see the class docstring)."""
        with self.cond:
            self.partitions = partitions
            self.batch_of, self.pos, self.rows = batch_of, pos, rows
            self.outcomes = [None] * len(partitions)

    def outcome(self, i: int) -> RecordMetadata | LogstoreError | None:
        """Record ``i``'s metadata or error; None while pending. Caller holds ``cond`` or accepts a race."""
        errors = self.errors
        if errors is not None and i in errors:
            return errors[i]
        if not self.outcomes:
            return None
        j = 0 if self.batch_of is None else self.batch_of[i]
        o = self.outcomes[j]
        if o is None or isinstance(o, LogstoreError):
            return o
        base, append_time = o
        k = i if self.pos is None else self.pos[i]
        return RecordMetadata(self.topic, self.partitions[j], base + k if base >= 0 else -1,
                              append_time if append_time >= 0 else self.timestamps[i])

    def wait(self, i: int, timeout: float | None) -> RecordMetadata | LogstoreError:
        """Block until record ``i`` has an outcome; TimeoutError after ``timeout`` seconds."""
        o = self.outcome(i)
        if o is not None:
            return o
        deadline = None if timeout is None else time.monotonic() + timeout
        with self.cond:
            while True:
                o = self.outcome(i)
                if o is not None:
                    return o
                remaining = None if deadline is None else deadline - time.monotonic()
                if remaining is not None and remaining <= 0:
                    raise TimeoutError(f"the record was not delivered within {timeout} s")
                self.cond.wait(remaining)

    def add_hook(self, i: int, hook: Callable[[], object]) -> None:
        """Call ``hook()`` once record ``i`` has an outcome (now, if it has)."""
        with self.cond:
            if self.outcome(i) is None:
                if self.hooks is None:
                    self.hooks = {}
                self.hooks.setdefault(i, []).append(hook)
                return
        hook()

    def _records_of(self, j: int) -> Iterable[int]:
        if self.rows is not None:
            return self.rows[j]
        return range(len(self.timestamps))

    def complete(self, j: int, outcome: tuple[int, int] | LogstoreError) -> None:
        """Set batch ``j``'s outcome, wake waiters, then run its records' hooks and callbacks in order."""
        with self.cond:
            if self.outcomes[j] is not None:
                return
            self.outcomes[j] = outcome
            self.cond.notify_all()
            od, hooks = self.on_delivery, self.hooks
            if not od and not hooks:
                return
            todo: list[tuple[int, DeliveryCallback | None, list[Callable[[], object]] | None]] = []
            errors = self.errors or {}
            for i in self._records_of(j):
                if i in errors:
                    continue  # reported when it failed alone
                cb = od.get(i) if od else None
                hs = hooks.pop(i, None) if hooks else None
                if cb is not None or hs is not None:
                    todo.append((i, cb, hs))
        for i, cb, hs in todo:
            self._report(i, cb, hs)

    def fail_records(self, j: int, failed: dict[int, LogstoreError]) -> None:
        """Records of batch ``j`` (by position in it) failed alone; the others keep their order.

        Called before the batch is sent, on the sender thread.
        """
        with self.cond:
            rows = list(self._records_of(j))
            errors = self.errors if self.errors is not None else {}
            for k, error in failed.items():
                errors[rows[k]] = error
            self.errors = errors
            n = len(self.timestamps)
            pos = self.pos if self.pos is not None else list(range(n))
            k = 0
            for i in rows:
                if i not in errors:
                    pos[i] = k
                    k += 1
            self.pos = pos
            self.cond.notify_all()
            todo = [(rows[k], (self.on_delivery or {}).get(rows[k]),
                     self.hooks.pop(rows[k], None) if self.hooks else None) for k in sorted(failed)]
        for i, cb, hs in todo:
            self._report(i, cb, hs)

    def _report(self, i: int, cb: DeliveryCallback | None, hooks: list[Callable[[], object]] | None) -> None:
        o = self.outcome(i)
        for hook in hooks or ():
            try:
                hook()
            except Exception:
                log.exception("a future's done callback raised")
        if cb is not None:
            if isinstance(o, LogstoreError):
                run_callback(cb, o, None)
            else:
                run_callback(cb, None, o)


class RecordFuture(concurrent.futures.Future[RecordMetadata]):
    """The future ``send()`` returns: record ``index`` of a :class:`SendCompletion`.

    A ``concurrent.futures.Future`` whose state lives in the completion: made
    without ``Future.__init__`` (no lock, condition or lists per record) and
    with nothing that refers back to it, so a future the caller drops is freed
    at once and never reaches the cyclic garbage collector. ``result``,
    ``exception``, ``done`` and ``add_done_callback`` read the completion.
    Code that reaches into a Future's internals (``concurrent.futures.wait``
    and ``as_completed`` use ``_condition``, ``_state``, ``_waiters``) makes
    it a full Future on first access (:meth:`__getattr__`), kept in step with
    the completion. A record cannot be cancelled once queued.
    """

    __slots__ = ("_completion", "_index")

    def __init__(self, completion: SendCompletion, index: int) -> None:  # noqa: D107
        # Deliberately no Future.__init__: see the class docstring.
        self._completion = completion
        self._index = index

    def done(self) -> bool:
        return self._completion.outcome(self._index) is not None

    def running(self) -> bool:
        return not self.done()

    def cancelled(self) -> bool:
        return False

    def cancel(self) -> bool:
        return False

    def result(self, timeout: float | None = None) -> RecordMetadata:
        o = self._completion.wait(self._index, timeout)
        if isinstance(o, LogstoreError):
            raise o
        return o

    def exception(self, timeout: float | None = None) -> BaseException | None:
        o = self._completion.wait(self._index, timeout)
        return o if isinstance(o, LogstoreError) else None

    def add_done_callback(self, fn: Callable[[concurrent.futures.Future[RecordMetadata]], object]) -> None:
        self._completion.add_hook(self._index, lambda: fn(self))

    def __getattr__(self, name: str) -> Any:
        # Only reached for attributes not set: Future's internals, on first use.
        if name not in _FUTURE_INTERNALS:
            raise AttributeError(name)
        completion = self._completion
        with completion.cond:
            if "_condition" not in self.__dict__:
                concurrent.futures.Future.__init__(self)
                concurrent.futures.Future.set_running_or_notify_cancel(self)
                completion.hooks = completion.hooks if completion.hooks is not None else {}
                completion.hooks.setdefault(self._index, []).append(self._settle)
        if completion.outcome(self._index) is not None:
            self._settle()
        return self.__dict__[name]

    def _settle(self) -> None:
        """Copy the outcome into the full Future's state (waking ``concurrent.futures.wait``)."""
        with self._completion.cond:
            o = self._completion.outcome(self._index)
            state = self.__dict__.get("_state")
        if o is None or state != "RUNNING":
            return
        try:
            if isinstance(o, LogstoreError):
                concurrent.futures.Future.set_exception(self, o)
            else:
                concurrent.futures.Future.set_result(self, o)
        except concurrent.futures.InvalidStateError:
            pass  # settled by a concurrent caller

    def __repr__(self) -> str:
        o = self._completion.outcome(self._index)
        state = "pending" if o is None else "finished"
        return f"<RecordFuture {self._completion.topic} #{self._index} {state}: {o!r}>"


_FUTURE_INTERNALS = frozenset(
    ("_condition", "_state", "_result", "_exception", "_waiters", "_done_callbacks")
)


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
