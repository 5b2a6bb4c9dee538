"""Pipelined requests over one long-lived bidirectional stream (issue 24), as Kafka's TCP protocol.

A client keeps one stream per connection open and writes requests into it without
waiting; :meth:`RequestStreams.serve` reads them in arrival order, starts each one's
work at once (in that order: work that must keep a partition's order, such as an
append, starts before the next request is read), and writes each answer as soon as it
is ready, so answers may leave in another order than their requests. Each request
carries a correlation id that its answer repeats; the client matches them.

Bounds: at most ``max_in_flight`` requests of one stream are being served; the next
is not read before one of them is answered, so a client that writes faster than the
broker answers is held back by the stream's flow control, not by the broker's memory.

A request that cannot be parsed ends the stream (its correlation id is unknown, so
nothing could answer it) once the requests read before it are answered; the handler's
guard turns the error into the stream's status. Every other failure belongs to one request and is its answer's to carry.
When the client goes away, the requests still being served are cancelled, as a
unary call's handler is when its client cancels.

Stopping: a stream never ends by itself, so a broker that stops first calls
:meth:`RequestStreams.close`: every stream stops reading, answers the requests it
read, and ends with OK (the client fails the requests it wrote that were never read
as unanswered, and retries them elsewhere or later), instead of holding the
listener's stop for its whole grace period.

Thread-safety: event loop only.
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Awaitable, Callable
from typing import Any, TypeVar

import grpc

__all__ = ["RequestStreams", "MAX_STREAM_IN_FLIGHT"]

# Requests of one stream served at once (the producer keeps at most 5 in flight per connection).
MAX_STREAM_IN_FLIGHT = 32

_R = TypeVar("_R")


class RequestStreams:
    """The open request streams of one front end; see the module docstring."""

    def __init__(self, *, max_in_flight: int = MAX_STREAM_IN_FLIGHT) -> None:
        self._max_in_flight = max_in_flight
        self._readers: set[asyncio.Task[None]] = set()
        self._closed = False

    @property
    def open_streams(self) -> int:
        return len(self._readers)

    def close(self) -> None:
        """Stop reading every open stream (each ends once its requests read are answered), and
        end each later one at once."""
        self._closed = True
        for reader in list(self._readers):
            reader.cancel()

    async def serve(self, requests: AsyncIterator[bytes], context: grpc.aio.ServicerContext, *,
                    parse: Callable[[bytes], _R], serve: Callable[[_R], Awaitable[Any]]) -> None:
        """Serve the stream ``requests`` until the client closes its side (or :meth:`close`) and
        every answer is written.

        ``parse(data)`` reads one request (raising ends the stream with that error);
        ``serve(request)`` returns the answer message to write (it carries its own correlation
        id and never raises a request's error: it answers with it)."""
        if self._closed:
            return
        slots = asyncio.Semaphore(self._max_in_flight)
        writing = asyncio.Lock()  # one write at a time on the stream
        tasks: set[asyncio.Task[None]] = set()

        async def answer(request: _R) -> None:
            try:
                response = await serve(request)
                async with writing:
                    try:
                        await context.write(response)
                    except Exception:  # noqa: BLE001 - the stream ended: nobody reads this answer
                        return
            finally:
                slots.release()

        async def read() -> None:
            async for data in requests:
                request = parse(data)
                await slots.acquire()
                task = asyncio.create_task(answer(request))
                tasks.add(task)
                task.add_done_callback(tasks.discard)

        reader = asyncio.create_task(read())
        self._readers.add(reader)
        unparsed: Exception | None = None
        try:
            try:
                await asyncio.shield(reader)
            except asyncio.CancelledError:
                if not reader.cancelled():  # this handler was cancelled (the client went away)
                    reader.cancel()
                    raise
            except Exception as e:  # noqa: BLE001 - a request that does not parse ends the stream ...
                unparsed = e
            # ... once the requests read before it are answered (an answer still being written
            # when the stream's status goes out fails the call); so do a client's half-close and
            # a stopping broker
            while tasks:
                await asyncio.wait(set(tasks))
        finally:
            self._readers.discard(reader)
            reader.cancel()
            for task in tasks:
                task.cancel()
        if unparsed is not None:
            raise unparsed
