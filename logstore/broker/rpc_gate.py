"""What every RPC handler needs of the broker's request machinery: one collaborator.

A handler class (issue 23: handlers composed, not mixed into the broker) is given an
:class:`RpcGate` in its constructor, next to the collaborators of its own domain:

* :meth:`RpcGate.guard` runs a handler's body; a :class:`~logstore.errors.LogstoreError`
  (or a bug) ends the call with a gRPC status and the error's stable code, never a
  traceback, and is counted in the metrics;
* :meth:`RpcGate.principal` is the caller when the authorizer is on (None: every check
  passes); :meth:`RpcGate.allowed`, :meth:`RpcGate.check` and :meth:`RpcGate.check_topics`
  are the authorizer's answer (``check`` names the cluster when ``name`` is left out);
* :meth:`RpcGate.run_io` runs file work on the broker's I/O pool.

The broker builds one (:class:`~logstore.broker.service.Broker`) and hands it to each
handler; tests may hand a handler their own.

Thread-safety: as the broker's: the calls run on the event loop, ``run_io``'s work on the pool.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable, Iterable
from typing import TYPE_CHECKING, Any, Protocol, TypeVar

if TYPE_CHECKING:
    import grpc

    from logstore.broker.security.principal import Principal

__all__ = ["RpcGate"]

T = TypeVar("T")


class RpcGate(Protocol):
    """The request machinery a handler calls; see the module docstring."""

    async def guard(self, what: str, context: grpc.aio.ServicerContext, body: Callable[[], Awaitable[T]]) -> T: ...

    def principal(self, context: Any) -> Principal | None: ...

    def allowed(self, principal: Principal | None, operation: str, resource_type: str, name: str) -> bool: ...

    def check(self, principal: Principal | None, operation: str, resource_type: str, name: str = ...) -> None: ...

    def check_topics(self, principal: Principal | None, operation: str, topics: Iterable[str]) -> None: ...

    async def run_io(self, fn: Callable[..., T], *args: Any) -> T: ...
