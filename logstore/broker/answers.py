"""How the broker's RPC handlers put an error into an answer.

A :class:`~logstore.errors.LogstoreError` raised while serving one item of a
request (a partition, a topic, a group) becomes that item's ``error`` field:
its stable code and its message, never a traceback. Errors that fail the
whole call go through the broker's ``_guard`` instead (gRPC status plus the
code in trailing metadata, see :mod:`logstore.errors`).

Thread-safety: pure functions.
"""

from __future__ import annotations

import logging

from logstore._proto import logstore_pb2 as pb
from logstore.errors import LogstoreError, UnknownServerError

__all__ = ["error_to_pb", "unexpected", "OK"]

log = logging.getLogger("logstore.broker")

OK = pb.Error()  # an item's error field when it succeeded


def error_to_pb(exc: LogstoreError) -> pb.Error:
    """The answer field of ``exc``: its stable code and message."""
    return pb.Error(code=exc.code, message=exc.message)


def unexpected(exc: BaseException, what: str) -> LogstoreError:
    """A bug's exception as what crosses the wire: logged here with its traceback, answered
    as UNKNOWN_SERVER_ERROR with one sentence."""
    log.exception("unexpected failure in %s", what)
    return UnknownServerError(f"internal error in {what}: {type(exc).__name__}: {exc}")
