"""What every RPC handler needs of the broker's request machinery: one collaborator.

A handler class (issue 23: handlers composed, not mixed into the broker) is given an
:class:`RpcGate` in its constructor, next to the collaborators of its own domain:

* :meth:`RpcGate.guard` runs a handler's body; a :class:`~logstore.errors.LogstoreError`
  (or a bug) ends the call with a gRPC status and the error's stable code, never a
  traceback, and is counted in the metrics; :meth:`RpcGate.settle` is the same for one
  request of a stream: the error is counted and returned, for the request's answer to
  carry, and the stream goes on;
* :meth:`RpcGate.principal` is the caller when the authorizer is on (None: every check
  passes); :meth:`RpcGate.allowed`, :meth:`RpcGate.check` and :meth:`RpcGate.check_topics`
  are the authorizer's answer (``check`` names the cluster when ``name`` is left out);
* :meth:`RpcGate.run_io` runs file work on the broker's I/O pool.

The broker builds one :class:`BrokerGate` (:class:`~logstore.broker.service.Broker`) and hands
it to each handler; tests may hand a handler their own.

Thread-safety: as the broker's: the calls run on the event loop, ``run_io``'s work on the pool.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable, Iterable
from typing import Any, Protocol, TypeVar

import grpc

from logstore.broker.rpc_errors import Guard, grpc_status, status_details, unexpected
from logstore.broker.security.acls import CLUSTER_NAME
from logstore.broker.security.authorization import Authorization
from logstore.broker.security.principal import Principal
from logstore.errors import WIRE_CODE_KEY, LogstoreError

__all__ = ["RpcGate", "BrokerGate"]

T = TypeVar("T")


class RpcGate(Guard, Protocol):
    """The request machinery a handler calls; see the module docstring."""

    async def settle(self, what: str, body: Callable[[], Awaitable[T]]) -> T | LogstoreError: ...

    def principal(self, context: Any) -> Principal | None: ...

    def allowed(self, principal: Principal | None, operation: str, resource_type: str, name: str) -> bool: ...

    def check(self, principal: Principal | None, operation: str, resource_type: str, name: str = ...) -> None: ...

    def check_topics(self, principal: Principal | None, operation: str, topics: Iterable[str]) -> None: ...

    async def run_io(self, fn: Callable[..., T], *args: Any) -> T: ...


class BrokerGate:
    """The broker's :class:`RpcGate`: its :class:`~logstore.broker.security.authorization.Authorization`
    answers the checks, ``run_io`` is its I/O pool, and ``on_error(what, code)`` hears every
    call a guard ended with an error (the metrics)."""

    def __init__(self, *, authorization: Authorization, run_io: Callable[..., Awaitable[Any]],
                 on_error: Callable[[str, str], None]) -> None:
        self._authorization = authorization
        self._run_io = run_io
        self._on_error = on_error

    async def guard(self, what: str, context: grpc.aio.ServicerContext, body: Callable[[], Awaitable[T]]) -> T:
        outcome = await self.settle(what, body)
        if not isinstance(outcome, LogstoreError):
            return outcome
        exc = outcome
        context.set_trailing_metadata(((WIRE_CODE_KEY, exc.code),))
        await context.abort(grpc_status(exc), status_details(exc.message))
        raise AssertionError("unreachable")  # context.abort raises

    async def settle(self, what: str, body: Callable[[], Awaitable[T]]) -> T | LogstoreError:
        try:
            return await body()
        except LogstoreError as e:
            exc: LogstoreError = e
        except Exception as e:  # noqa: BLE001 - the wire must never see a traceback
            exc = unexpected(e, what)
        self._on_error(what, exc.code)
        return exc

    def principal(self, context: Any) -> Principal | None:
        return self._authorization.principal(context)

    def allowed(self, principal: Principal | None, operation: str, resource_type: str, name: str) -> bool:
        return self._authorization.allowed(principal, operation, resource_type, name)

    def check(self, principal: Principal | None, operation: str, resource_type: str, name: str = CLUSTER_NAME) -> None:
        self._authorization.check(principal, operation, resource_type, name)

    def check_topics(self, principal: Principal | None, operation: str, topics: Iterable[str]) -> None:
        self._authorization.check_topics(principal, operation, topics)

    async def run_io(self, fn: Callable[..., T], *args: Any) -> T:
        result: T = await self._run_io(fn, *args)
        return result
