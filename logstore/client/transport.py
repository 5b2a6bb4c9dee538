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

import time
from collections.abc import Callable, Sequence
from typing import Any, TypeVar

import grpc

from logstore._proto import logstore_pb2 as pb
from logstore.client.coordinator_lookup import GROUP, CoordinatorLookup
from logstore.client.error_mapping import error_from_rpc, raise_for_item
from logstore.client.results import RpcFuture
from logstore.client.routing import Connection, Router
from logstore.client.security import ClientSecurity
from logstore.errors import BrokerUnavailableError

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

    @property
    def closed(self) -> bool:
        return self._closed

    def close(self) -> None:
        """Close the channels; calls in flight fail. Idempotent."""
        if not self._closed:
            self._closed = True
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
