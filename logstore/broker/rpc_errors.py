"""How the broker's RPC handlers put an error into an answer.

A :class:`~logstore.errors.LogstoreError` raised while serving one item of a
request (a partition, a topic, a group) becomes that item's ``error`` field:
its stable code and its message, never a traceback. Errors that fail the
whole call go through a :class:`Guard` instead (gRPC status plus the code in
trailing metadata, see :mod:`logstore.errors`): the broker's
:class:`~logstore.broker.rpc_gate.RpcGate` is one, and a handler that needs nothing
else of the gate is given it as a ``Guard``.

Thread-safety: pure functions.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from typing import Protocol, TypeVar

import grpc

from logstore._proto import logstore_pb2 as pb
from logstore.broker.unexpected import unexpected
from logstore.errors import (
    AuthorizationError,
    InvalidRequestError,
    LogstoreError,
    RecordTooLargeError,
    SaslAuthenticationError,
    SecurityDisabledError,
    UnknownTopicOrPartitionError,
)

__all__ = ["Guard", "error_to_pb", "grpc_status", "status_details", "unexpected", "OK", "MAX_STATUS_DETAILS_BYTES"]

T = TypeVar("T")

OK = pb.Error()  # an item's error field when it succeeded
# A call's status message travels in its trailers (grpc-message, percent-encoded: up to 3 bytes per
# byte), and a client drops trailers above 16 KiB, code and all (RESOURCE_EXHAUSTED instead): an
# error that quotes a hostile 10 KB name must still arrive. Found by tests/chaos/test_fuzz_rpc.py.
MAX_STATUS_DETAILS_BYTES = 1024


class Guard(Protocol):
    """Runs a handler's body; a :class:`~logstore.errors.LogstoreError` (or a bug) ends the call
    with a gRPC status and the error's stable code, never a traceback."""

    async def guard(self, what: str, context: grpc.aio.ServicerContext, body: Callable[[], Awaitable[T]]) -> T: ...


def error_to_pb(exc: LogstoreError) -> pb.Error:
    """The answer field of ``exc``: its stable code and message."""
    return pb.Error(code=exc.code, message=exc.message)


def grpc_status(exc: LogstoreError) -> grpc.StatusCode:
    """The gRPC status of a call that ``exc`` fails (its code travels in the trailers)."""
    return (
        grpc.StatusCode.INVALID_ARGUMENT if isinstance(exc, InvalidRequestError)
        else grpc.StatusCode.RESOURCE_EXHAUSTED if isinstance(exc, RecordTooLargeError)
        else grpc.StatusCode.UNAUTHENTICATED if isinstance(exc, SaslAuthenticationError)
        else grpc.StatusCode.PERMISSION_DENIED if isinstance(exc, AuthorizationError)
        else grpc.StatusCode.NOT_FOUND if isinstance(exc, UnknownTopicOrPartitionError)
        else grpc.StatusCode.FAILED_PRECONDITION if isinstance(exc, SecurityDisabledError)
        else grpc.StatusCode.INTERNAL
    )


def status_details(message: str) -> str:
    """``message`` cut to ``MAX_STATUS_DETAILS_BYTES`` of UTF-8 (saying how much was cut), for a status."""
    data = message.encode("utf-8", "replace")
    if len(data) <= MAX_STATUS_DETAILS_BYTES:
        return message
    kept = data[:MAX_STATUS_DETAILS_BYTES - 40].decode("utf-8", "ignore")
    return f"{kept}... ({len(data) - len(kept.encode())} bytes cut)"


