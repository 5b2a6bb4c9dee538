"""A bug's exception turned into what a caller may see: logged here, one sentence out.

Kept apart from :mod:`logstore.broker.rpc_errors` (the gRPC answers) so that parts with no
gRPC in them, the data plane first, answer a bug the same way.

Thread-safety: a pure function (and the logging module's lock).
"""

from __future__ import annotations

import logging

from logstore.errors import LogstoreError, UnknownServerError

__all__ = ["unexpected"]

log = logging.getLogger("logstore.broker")


def unexpected(exc: BaseException, what: str) -> LogstoreError:
    """A bug's exception as what crosses the wire: logged here with its traceback, answered
    as UNKNOWN_SERVER_ERROR with one sentence."""
    log.exception("unexpected failure in %s", what)
    return UnknownServerError(f"internal error in {what}: {type(exc).__name__}: {exc}")
