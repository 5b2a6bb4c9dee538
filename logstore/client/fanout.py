"""One call to several leaders: the answers of per-leader calls joined into one.

On a cluster, a produce or fetch naming partitions led by different brokers is
sent as one call per leader (:meth:`logstore.client.routing.Router.split`); the
caller still gets one future with one answer per partition, as from a single
broker:

* :func:`join_produce` — every per-leader answer, in the order of the request; a
  call that failed as a whole (an unreachable broker) gives each of its
  partitions that error, so the producer retries them like any retriable
  partition error.
* :func:`join_fetch` — a long poll: the joined answer is ready as soon as one
  leader answers with records or an error (the other long polls are cancelled
  and their partitions are simply absent from the answer, to be asked again by
  the next fetch), or when every leader answered. The consumer handles
  partitions missing from an answer already: it fetches them again.

Thread-safety: the per-leader futures complete on gRPC's threads; the joins
keep their state under a lock and complete their future once.
"""

from __future__ import annotations

import concurrent.futures
import threading
from collections.abc import Callable, Sequence
from typing import TypeVar

from logstore.client.results import FetchedPartition, ProducedPartition, RpcFuture
from logstore.errors import LogstoreError, UnknownServerError
from logstore.types import TopicPartition

__all__ = ["join_produce", "join_fetch"]

_A = TypeVar("_A")


class _Joined(RpcFuture[list[_A]]):
    """A future over several calls: ``cancel_call`` abandons them all."""

    parts: Sequence[RpcFuture[list[_A]]] = ()

    def cancel_call(self) -> None:
        for part in self.parts:
            part.cancel_call()


def _as_error(exc: BaseException | None) -> LogstoreError:
    return exc if isinstance(exc, LogstoreError) else UnknownServerError(f"{type(exc).__name__}: {exc}")


def join_produce(
    tps: Sequence[TopicPartition], calls: Sequence[tuple[list[int], RpcFuture[list[ProducedPartition]]]],
) -> RpcFuture[list[ProducedPartition]]:
    """One answer per partition of ``tps`` (request order) from ``calls``: (indexes, future)."""
    out: _Joined[ProducedPartition] = _Joined()
    out.parts = [f for _, f in calls]
    out.set_running_or_notify_cancel()
    lock = threading.Lock()
    answers: list[ProducedPartition | None] = [None] * len(tps)
    pending = [len(calls)]

    def done(indexes: list[int], f: concurrent.futures.Future[list[ProducedPartition]]) -> None:
        exc = f.exception()
        with lock:
            if exc is not None:
                err = _as_error(exc)
                for i in indexes:
                    answers[i] = ProducedPartition(tps[i].topic, tps[i].partition, err, (), -1, -1)
            else:
                by_tp = {(a.topic, a.partition): a for a in f.result()}
                for i in indexes:
                    answers[i] = by_tp.get((tps[i].topic, tps[i].partition)) or ProducedPartition(
                        tps[i].topic, tps[i].partition,
                        UnknownServerError(f"the broker's produce answer left out {tps[i]}"), (), -1, -1)
            pending[0] -= 1
            finished = pending[0] == 0
        if finished:
            out.set_result([a for a in answers if a is not None])

    def on_done(indexes: list[int]) -> Callable[[concurrent.futures.Future[list[ProducedPartition]]], None]:
        return lambda fut: done(indexes, fut)

    for indexes, f in calls:
        f.add_done_callback(on_done(indexes))
    return out


def join_fetch(calls: Sequence[RpcFuture[list[FetchedPartition]]]) -> RpcFuture[list[FetchedPartition]]:
    """The answers of ``calls`` once one has records or an error, or all answered (see the module)."""
    out: _Joined[FetchedPartition] = _Joined()
    out.parts = list(calls)
    out.set_running_or_notify_cancel()
    lock = threading.Lock()
    answers: list[FetchedPartition] = []
    failures: list[BaseException] = []
    pending = [len(calls)]
    finished = [False]

    def done(f: concurrent.futures.Future[list[FetchedPartition]]) -> None:
        exc = f.exception()
        with lock:
            if finished[0]:
                return
            pending[0] -= 1
            if exc is not None:
                failures.append(exc)
                useful = False
            else:
                got = f.result()
                answers.extend(got)
                useful = any(len(a.records) or a.error is not None for a in got)
            if not (useful or pending[0] == 0):
                return
            finished[0] = True
        for other in calls:
            if other is not f:
                other.cancel_call()
        if not answers and failures:
            out.set_exception(failures[0])
        else:
            out.set_result(list(answers))

    for f in calls:
        f.add_done_callback(done)
    return out
