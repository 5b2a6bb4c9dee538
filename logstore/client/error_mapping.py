"""Logstore errors from gRPC outcomes: the client's one error mapping.

Every failure that reaches a client from a broker is mapped here, once:

* an item-level ``Error`` with a non-empty code (one topic or partition of a
  request failed) becomes :func:`logstore.errors.error_for_code` of it
  (:func:`error_from_item`). Methods of :class:`~logstore.client.rpc.BrokerClient`
  whose callers need per-item outcomes return those errors next to the items
  (``ProducedPartition.error``, ``FetchedPartition.error``, ...); the others
  raise the first one (:func:`raise_for_item`, :func:`raise_for_errors`).
* a failed call (:class:`grpc.RpcError`) becomes the error named by the
  ``logstore-error-code`` trailing metadata when the broker set it, else by
  its gRPC status (:func:`error_from_rpc`): UNAVAILABLE → :class:`BrokerUnavailableError`,
  DEADLINE_EXCEEDED → :class:`RequestTimedOutError`, INVALID_ARGUMENT →
  :class:`InvalidRequestError`, RESOURCE_EXHAUSTED → :class:`RecordTooLargeError`,
  anything else → :class:`UnknownServerError`. The message names the RPC, the
  broker address and the status.

Thread-safety: pure functions.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Mapping
from typing import TypeVar

import grpc

from logstore._proto import logstore_pb2 as pb
from logstore.errors import (
    WIRE_CODE_KEY,
    BrokerUnavailableError,
    InvalidRequestError,
    LogstoreError,
    RecordTooLargeError,
    RequestTimedOutError,
    UnknownServerError,
    error_for_code,
)

__all__ = ["error_from_item", "error_from_rpc", "about", "raise_for_errors", "raise_for_item", "unwrap_items"]

K = TypeVar("K")
V = TypeVar("V")

_STATUS_ERRORS: dict[grpc.StatusCode, type[LogstoreError]] = {
    grpc.StatusCode.UNAVAILABLE: BrokerUnavailableError,
    grpc.StatusCode.DEADLINE_EXCEEDED: RequestTimedOutError,
    grpc.StatusCode.INVALID_ARGUMENT: InvalidRequestError,
    grpc.StatusCode.RESOURCE_EXHAUSTED: RecordTooLargeError,
}


def error_from_item(error: pb.Error | None) -> LogstoreError | None:
    """The error an item-level ``Error`` reports, or None when its code is empty (success)."""
    if error is None or not error.code:
        return None
    return error_for_code(error.code, error.message or error.code)


def error_from_rpc(exc: grpc.RpcError, *, rpc: str, target: str) -> LogstoreError:
    """Map a failed gRPC call to the logstore error it stands for (see the module docstring)."""
    code = None
    details = ""
    status: grpc.StatusCode | None = None
    if isinstance(exc, grpc.Call):
        try:
            for key, value in exc.trailing_metadata() or ():
                if key == WIRE_CODE_KEY:
                    code = value.decode() if isinstance(value, bytes) else str(value)
        except Exception:  # a call that never reached the broker may lack metadata
            code = None
        details = exc.details() or ""
        status = exc.code()
    status_name = status.name if status is not None else "UNKNOWN"
    if code:
        return error_for_code(code, details or f"{rpc} failed on broker {target}")
    cls = _STATUS_ERRORS.get(status, UnknownServerError) if status is not None else UnknownServerError
    if cls is BrokerUnavailableError:
        what = f"broker {target} is unavailable ({rpc}: {details or status_name})"
    elif cls is RequestTimedOutError:
        what = f"{rpc} to broker {target} timed out ({details or status_name})"
    else:
        what = f"{rpc} to broker {target} failed with gRPC status {status_name}: {details}"
    return cls(what)


def about(error: LogstoreError, item: object) -> LogstoreError:
    """A copy of ``error`` (same class and code) whose message starts with the ``item`` it is about."""
    return type(error)(f"{item}: {error.message}")


def raise_for_errors(errors: Iterable[tuple[str, LogstoreError | None]]) -> None:
    """Raise the first error of ``(item name, error)`` pairs, its message prefixed by the item."""
    for name, err in errors:
        if err is not None:
            raise about(err, name) from None


def unwrap_items(wanted: Iterable[K], found: Mapping[K, V | LogstoreError], *, what: str,
                 label: Callable[[K], object] = str) -> dict[K, V]:
    """Each wanted item's value from a per-item answer, in ``wanted``'s order. An item's own
    error is raised about it (:func:`about`, ``label(key)`` naming it); an item the answer
    left out is UNKNOWN_SERVER_ERROR ("the broker's answer has no ``what`` for ...")."""
    out: dict[K, V] = {}
    for key in wanted:
        got = found.get(key)
        if got is None:
            raise UnknownServerError(f"the broker's answer has no {what} for {label(key)}")
        if isinstance(got, LogstoreError):
            raise about(got, label(key)) from None
        out[key] = got
    return out


def raise_for_item(error: pb.Error) -> None:
    """Raise the error an item-level ``Error`` reports, if any."""
    err = error_from_item(error)
    if err is not None:
        raise err
