"""Produce requests pipelined over one long-lived gRPC stream per broker connection (issue 24).

A unary Produce call costs the client a call object, a future and a channel thread that
completes it; at 1,000 one-record requests a second that is most of the producer's CPU.
:class:`ProduceStream` keeps one ``ProduceStream`` call open on a connection instead and
writes each request into it, numbered by a correlation id (``ProduceRequest.correlation_id``)
that the broker repeats in the request's answer, as Kafka's TCP protocol does. Answers may
arrive in any order; each completes its own request.

Threads: gRPC's thread that writes the requests (it takes them from a queue, and checks the
requests' deadlines between two), and one reader thread per stream that reads answers and
completes the requests: none per call.

A stream that breaks (the broker went away, restarted, or the connection was cut) fails
every request still waiting for its answer with the stream's error, mapped as a unary
call's (:func:`~logstore.client.error_mapping.error_from_rpc`: UNAVAILABLE is a retriable
:class:`~logstore.errors.BrokerUnavailableError` that may have been written), so the
producer's retries and sequence numbers treat them exactly as lost unary answers. A request
not answered within its deadline cancels the stream (a broker that answers nothing may be
frozen; Kafka's clients close the connection then) and fails every waiting request with
:class:`~logstore.errors.RequestTimedOutError`. The next request opens a new stream. A
broker that does not serve the stream (UNIMPLEMENTED: an older broker, or one with client
quotas, which throttle per call) gets the waiting requests again as unary calls, through
``on_refused``, and no stream again.

Thread-safety: :meth:`ProduceStream.send` may be called from any thread; callbacks run on the
stream's reader thread (or the sending thread when the stream is already broken).
"""

from __future__ import annotations

import itertools
import queue
import threading
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from typing import Any

import grpc

from logstore._proto import logstore_pb2 as pb
from logstore.client.error_mapping import error_from_rpc
from logstore.errors import BrokerUnavailableError, LogstoreError, RequestTimedOutError

__all__ = ["ProduceStream", "PRODUCE_STREAM_METHOD", "Answered", "Refused"]

PRODUCE_STREAM_METHOD = "/logstore.v1.Logstore/ProduceStream"
# How often the writing thread looks at the deadlines when no request comes.
_DEADLINE_CHECK_S = 0.5

# A request's callback: its answer, or the error that ended it.
Answered = Callable[[pb.ProduceResponse | None, LogstoreError | None], None]


@dataclass(slots=True)
class Refused:
    """A request the broker did not take because it serves no ProduceStream: send it unary."""

    data: bytes
    deadline: float  # time.monotonic()
    answered: Answered


@dataclass(slots=True)
class _Waiting:
    data: bytes
    deadline: float
    answered: Answered


class ProduceStream:
    """One ``ProduceStream`` call on ``channel`` to ``address``; see the module docstring.

    ``on_refused(requests)`` gets the requests waiting when the broker answered
    UNIMPLEMENTED; ``on_broken(error)`` hears any other end of the stream that left
    requests unanswered (the router's :meth:`~logstore.client.routing.Router.note_failure`).
    """

    def __init__(self, channel: grpc.Channel, address: str, *,
                 on_refused: Callable[[list[Refused]], None],
                 on_broken: Callable[[LogstoreError], None]) -> None:
        self.address = address
        self._on_refused = on_refused
        self._on_broken = on_broken
        self._lock = threading.Lock()
        self._waiting: dict[int, _Waiting] = {}
        self._ids = itertools.count(1)
        self._outbox: queue.SimpleQueue[bytes | None] = queue.SimpleQueue()
        self._ended: LogstoreError | None = None  # once set, the stream takes no request
        self._cancel_reason: LogstoreError | None = None
        self.refused = False  # the broker serves no ProduceStream (set before the stream ends)
        method = channel.stream_stream(PRODUCE_STREAM_METHOD, request_serializer=None,
                                       response_deserializer=pb.ProduceResponse.FromString)
        self._call: Any = method(self._requests())
        self._reader = threading.Thread(target=self._read, name=f"logstore-produce-stream {address}", daemon=True)
        self._reader.start()

    @property
    def broken(self) -> bool:
        """Whether the stream ended (a new one is needed for the next request)."""
        return self._ended is not None

    def send(self, encode: Callable[[int], bytes], *, timeout_s: float, answered: Answered) -> bool:
        """Write the request ``encode(correlation_id)``; ``answered`` is called once with its answer
        or its error. False (and nothing sent) when the stream has already ended."""
        with self._lock:
            if self._ended is not None:
                return False
            correlation_id = next(self._ids)
        data = encode(correlation_id)  # outside the lock: the reader completes answers meanwhile
        with self._lock:
            if self._ended is not None:
                return False
            self._waiting[correlation_id] = _Waiting(data, time.monotonic() + timeout_s, answered)
            self._outbox.put(data)
        return True

    def close(self) -> None:
        """End the stream; waiting requests fail with BrokerUnavailableError. Idempotent."""
        self._cancel(BrokerUnavailableError(f"the produce stream to broker {self.address} was closed"))

    def _cancel(self, reason: LogstoreError) -> None:
        with self._lock:
            if self._cancel_reason is None:
                self._cancel_reason = reason
        self._outbox.put(None)
        self._call.cancel()

    # ------------------------------------------------------------------ gRPC's writing thread

    def _requests(self) -> Iterator[bytes]:
        while True:
            try:
                data = self._outbox.get(timeout=_DEADLINE_CHECK_S)
            except queue.Empty:
                data = b""
            if data is None:
                return
            if data:
                yield data
            self._expire()

    def _expire(self) -> None:
        now = time.monotonic()
        with self._lock:
            late = [cid for cid, w in self._waiting.items() if w.deadline <= now]
        if late:
            self._cancel(RequestTimedOutError(
                f"Produce to broker {self.address} timed out: {len(late)} requests of its produce "
                "stream were not answered in time (the stream is closed, a new one is opened)"))

    # ------------------------------------------------------------------ the reader thread

    def _read(self) -> None:
        refused = False
        error: LogstoreError
        try:
            for response in self._call:
                with self._lock:
                    waiting = self._waiting.pop(response.correlation_id, None)
                if waiting is not None:
                    waiting.answered(response, None)
            error = BrokerUnavailableError(f"broker {self.address} ended the produce stream")
        except grpc.RpcError as e:
            refused = isinstance(e, grpc.Call) and e.code() == grpc.StatusCode.UNIMPLEMENTED
            error = self._cancel_reason or error_from_rpc(e, rpc="Produce", target=self.address)
        except BaseException as e:  # noqa: BLE001 - a malformed answer: no request may hang
            error = self._cancel_reason or BrokerUnavailableError(
                f"the produce stream to broker {self.address} failed: {e!r}")
        with self._lock:
            self.refused = refused
            self._ended = error
            waiting_now, self._waiting = list(self._waiting.values()), {}
        self._outbox.put(None)  # ends gRPC's writing thread
        if refused:
            self._on_refused([Refused(w.data, w.deadline, w.answered) for w in waiting_now])
            return
        if waiting_now:
            self._on_broken(error)
        for w in waiting_now:
            w.answered(None, error)
