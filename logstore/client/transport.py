"""How a :class:`~logstore.client.rpc.BrokerClient` reaches brokers: :class:`Transport`.

The transport owns what every RPC of the client shares, so that the RPC parts
(:class:`~logstore.client.rpc.BrokerClient` itself and the parts it is built
from: :class:`~logstore.client.rpc_groups.GroupRpcs`,
:class:`~logstore.client.rpc_cleaning.CleaningRpcs`,
:class:`~logstore.client.rpc_scram.ScramRpcs`, and the admin calls of
:mod:`~logstore.client.acls` and :mod:`~logstore.client.reassignments`) are
handed it in their constructors instead of sharing one class:

* the deadline of a call (:meth:`Transport.deadline_s`): ``request_timeout_ms``
  unless the call names its own, plus any long-poll wait on top;
* the blocking call (:meth:`Transport.call`), to a partition's leader or to
  home, moving to the next bootstrap entry while home is unreachable; and the
  call that does not block (:meth:`Transport.call_future`); errors are mapped
  here, once (:mod:`logstore.client.error_mapping`);
* produce requests (:meth:`Transport.produce_future`): over one long-lived
  ProduceStream per connection (:mod:`logstore.client.produce_stream`), or as
  unary calls to a broker that does not serve it, and on SASL connections (the
  session interceptor authenticates unary calls);
* where calls go: :attr:`Transport.router` (home and partition leaders,
  :mod:`logstore.client.routing`) and :attr:`Transport.coordinators` (each
  group's and transactional id's coordinator,
  :mod:`logstore.client.coordinator_lookup`), with
  :meth:`Transport.on_coordinator`, the one way a blocking call is sent to a
  coordinator (groups and transactions).

Thread-safety: safe to share between threads (the gRPC channels are; the
router and the coordinator lookup lock their caches). Not picklable: the
client pickles as its options and builds a new transport when unpickled.
"""

from __future__ import annotations

import concurrent.futures
import functools
import threading
import time
from collections.abc import Callable, Sequence
from typing import Any, TypeVar

import grpc

from logstore._proto import logstore_pb2 as pb
from logstore.client.coordinator_lookup import GROUP, CoordinatorLookup
from logstore.client.error_mapping import error_from_item, error_from_rpc, raise_for_item
from logstore.client.produce_stream import ProduceStream, Refused
from logstore.client.results import RpcFuture
from logstore.client.routing import Connection, Router
from logstore.client.security import ClientSecurity
from logstore.errors import BrokerUnavailableError, LogstoreError, RequestTimedOutError

__all__ = ["Transport"]

_T = TypeVar("_T")


class Transport:
    """The channels, deadlines and routes of one client; see the module docstring.

    ``entries`` are the parsed bootstrap addresses (home is the first that
    answers); ``client_id`` is sent with every call (broker quotas).
    """

    def __init__(self, entries: Sequence[str], *, request_timeout_ms: int, security: ClientSecurity | None,
                 client_id: str) -> None:
        self.bootstrap = ",".join(entries)
        self.request_timeout_ms = request_timeout_ms
        # Where each call goes: home (a bootstrap entry) or a partition's leader (logstore.client.routing).
        self.router = Router(entries, refresh=self._metadata_from, security=security, client_id=client_id)
        # Where each group's (transactional id's) coordinator is (logstore.client.coordinator_lookup).
        self.coordinators = CoordinatorLookup(self.router, lambda request, timeout_s: self.call(
            "FindCoordinator", request, timeout_s=timeout_s))
        self._closed = False
        # Produce streams (logstore.client.produce_stream): one per connection; False once a
        # connection's broker answered UNIMPLEMENTED (it is then sent unary calls).
        self._streams_lock = threading.Lock()
        self._streams: dict[Connection, ProduceStream | bool] = {}
        self.use_produce_streams = True
        self.produce_streams_opened = 0  # how many were opened (a broken one is replaced)

    @property
    def closed(self) -> bool:
        return self._closed

    def close(self) -> None:
        """Close the channels; calls in flight fail. Idempotent."""
        if not self._closed:
            self._closed = True
            with self._streams_lock:
                streams, self._streams = list(self._streams.values()), {}
            for stream in streams:
                if isinstance(stream, ProduceStream):
                    stream.close()
            self.router.close()

    def deadline_s(self, timeout_ms: int | None, extra_ms: int = 0) -> float:
        """A call's deadline in seconds: ``timeout_ms`` (None: ``request_timeout_ms``) plus ``extra_ms``."""
        return ((timeout_ms if timeout_ms is not None else self.request_timeout_ms) + extra_ms) / 1000

    def call(self, rpc: str, request: Any, *, timeout_s: float, conn: Connection | None = None) -> Any:
        """Call ``rpc`` on ``conn`` (a partition's leader), or on home, moving to the next bootstrap
        entry while home is unreachable."""
        if self._closed:
            raise RuntimeError(f"{rpc}: the client for {self.bootstrap} is closed")
        target = conn or self.router.home
        failover = conn is None or conn.address == self.router.home.address  # unrouted: any broker answers
        deadline = time.monotonic() + timeout_s
        for attempt in range(1, len(self.router.entries) + 1):
            try:
                return target.method(rpc)(request, timeout=max(deadline - time.monotonic(), 0.001))
            except grpc.RpcError as e:
                err = target.explain(error_from_rpc(e, rpc=rpc, target=target.address))
            self.router.note_failure(target, err)  # an unreachable home: the next entry is home now
            following = self.router.home
            if (not failover or not isinstance(err, BrokerUnavailableError) or attempt == len(self.router.entries)
                    or following.address == target.address or time.monotonic() >= deadline):
                raise err from None
            target = following
        raise AssertionError("unreachable: the last attempt raises")

    def call_future(
        self, rpc: str, request: Any, *, timeout_s: float, convert: Callable[[Any], _T],
        conn: Connection | None = None,
    ) -> RpcFuture[_T]:
        """Start ``rpc`` without blocking; the future holds ``convert(response)`` or the mapped error."""
        if self._closed:
            raise RuntimeError(f"{rpc}: the client for {self.bootstrap} is closed")
        target = conn or self.router.home
        out: RpcFuture[_T] = RpcFuture()
        out.set_running_or_notify_cancel()
        call = target.method(rpc).future(request, timeout=timeout_s)
        out._call = call

        def done(f: grpc.Future) -> None:
            try:
                response = f.result()
            except grpc.RpcError as e:
                err = target.explain(error_from_rpc(e, rpc=rpc, target=target.address))
                self.router.note_failure(target, err)  # the next call tries the next bootstrap entry
                out.set_exception(err)
                return
            except grpc.FutureCancelledError:
                out.set_exception(BrokerUnavailableError(f"{rpc} to {target.address} was cancelled"))
                return
            try:
                out.set_result(convert(response))
            except BaseException as e:  # a malformed answer must still complete the future
                out.set_exception(e)

        call.add_done_callback(done)
        return out

    def produce_future(
        self, encode: Callable[[int], bytes], *, timeout_s: float, convert: Callable[[Any], _T],
        conn: Connection | None = None,
    ) -> RpcFuture[_T]:
        """Send the produce request ``encode(correlation_id)`` without blocking, over ``conn``'s
        produce stream when it has one (else as a unary call, ``encode(0)``); the future holds
        ``convert(response)`` or the mapped error, as :meth:`call_future`'s."""
        if self._closed:
            raise RuntimeError(f"Produce: the client for {self.bootstrap} is closed")
        target = conn or self.router.home
        stream = self._produce_stream(target)
        if stream is None:
            return self.call_future("Produce", encode(0), timeout_s=timeout_s, convert=convert, conn=target)
        out: RpcFuture[_T] = RpcFuture()
        out.set_running_or_notify_cancel()

        def answered(response: pb.ProduceResponse | None, error: LogstoreError | None) -> None:
            if error is None and response is not None and response.HasField("error"):
                error = error_from_item(response.error)
            if error is not None:
                out.set_exception(error)
                return
            try:
                out.set_result(convert(response))
            except BaseException as e:  # a malformed answer must still complete the future
                out.set_exception(e)

        for _ in range(2):  # a stream found broken is replaced once
            if stream is None:
                break
            if stream.send(encode, timeout_s=timeout_s, answered=answered):
                return out
            stream = self._produce_stream(target)
        return self.call_future("Produce", encode(0), timeout_s=timeout_s, convert=convert, conn=target)

    def _produce_stream(self, conn: Connection) -> ProduceStream | None:
        """``conn``'s open produce stream, opened now if needed; None: send unary calls."""
        if not self.use_produce_streams or conn.login is not None:
            return None
        with self._streams_lock:
            stream = self._streams.get(conn)
            if stream is False:
                return None
            if isinstance(stream, ProduceStream) and stream.refused:
                self._streams[conn] = False
                return None
            if isinstance(stream, ProduceStream) and not stream.broken:
                return stream
            if self._closed:
                return None
            fresh = ProduceStream(conn.channel, conn.address,
                                  on_refused=lambda refused: self._refused(conn, refused),
                                  on_broken=lambda error: self.router.note_failure(conn, error))
            self._streams[conn] = fresh
            self.produce_streams_opened += 1
            return fresh

    def _refused(self, conn: Connection, refused: list[Refused]) -> None:
        """``conn``'s broker serves no produce stream: unary calls from now on, these first."""
        with self._streams_lock:
            self._streams[conn] = False
        for r in refused:
            remaining_s = r.deadline - time.monotonic()
            if remaining_s <= 0:
                r.answered(None, RequestTimedOutError(f"Produce to broker {conn.address} timed out"))
                continue
            try:
                unary = self.call_future("Produce", r.data, timeout_s=remaining_s, convert=lambda x: x, conn=conn)
            except RuntimeError as e:  # closed meanwhile
                r.answered(None, BrokerUnavailableError(str(e)))
                continue
            unary.add_done_callback(functools.partial(_answer_from, answered=r.answered))

    def on_coordinator(self, key: str, rpc: str, request: Any, timeout_ms: int | None, *,
                       key_type: pb.CoordinatorType = GROUP) -> Any:
        """``rpc`` on the coordinator of ``key``: a group id (``key_type`` GROUP) or a transactional
        id's coordinator key (TRANSACTION); the answer's top-level error is raised (and retried
        when it says the coordinator moved)."""
        def attempt(conn: Connection, remaining_s: float) -> Any:
            response = self.call(rpc, request, timeout_s=remaining_s, conn=conn)
            if hasattr(response, "error"):
                raise_for_item(response.error)
            return response
        return self.coordinators.call(key_type, key, attempt, timeout_s=self.deadline_s(timeout_ms))

    def _metadata_from(self, conn: Connection, topics: list[str]) -> pb.MetadataResponse:
        """The router's refresh: one Metadata call to ``conn``."""
        return self.call("Metadata", pb.MetadataRequest(topics=topics), timeout_s=self.deadline_s(None), conn=conn)


def _answer_from(future: concurrent.futures.Future[Any], *,
                 answered: Callable[[Any, LogstoreError | None], None]) -> None:
    error = future.exception()
    if error is None:
        answered(future.result(), None)
    elif isinstance(error, LogstoreError):
        answered(None, error)
    else:
        answered(None, BrokerUnavailableError(f"Produce failed: {error!r}"))
