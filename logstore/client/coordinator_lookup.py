"""Where a client sends a coordinator's calls: FindCoordinator, cached per key.

The coordinator of a consumer group (or a transactional id) is one broker of
the cluster: the leader of the internal-topic partition the key hashes to
(:mod:`logstore.broker.coordinator_service`). :class:`CoordinatorLookup` asks
any broker (the client's home, with bootstrap fail-over) with FindCoordinator,
keeps the answer per ``(key type, key)``, and runs a call against it
(:meth:`CoordinatorLookup.call`):

* the call's errors NOT_COORDINATOR, COORDINATOR_NOT_AVAILABLE,
  COORDINATOR_LOAD_IN_PROGRESS and an unreachable broker forget the cached
  coordinator; the call is then found and tried again, with a short growing
  pause (:data:`BACKOFF_S`), until its deadline (the request timeout) — the
  last error is raised then; a call that times out forgets the coordinator too
  (it may be paused or cut off) and raises;
* CONCURRENT_TRANSACTIONS (a transactional id's previous transaction is still
  writing its markers) is asked again of the same coordinator, with the same
  pauses, until the deadline;
* a single broker answers ``local``: it is the coordinator at the address the
  client reached it by (its home connection).

Groups are keyed by their id; transactional ids by their coordinator key
(:func:`logstore.naming.coordinator_key`, the part before the first ``/``).

:meth:`CoordinatorLookup.connection` and :meth:`CoordinatorLookup.forget` are
the parts for calls that do not block (the group heartbeat): the caller's own
retry loop finds again.

Thread-safety: shared by a client's threads; the cache changes under a lock and
no RPC is made while holding it.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable
from typing import TypeVar

from logstore._proto import logstore_pb2 as pb
from logstore.client.error_mapping import error_from_item
from logstore.client.routing import Connection, Router
from logstore.errors import (
    BrokerUnavailableError,
    ConcurrentTransactionsError,
    CoordinatorLoadInProgressError,
    CoordinatorNotAvailableError,
    LogstoreError,
    NotCoordinatorError,
    RequestTimedOutError,
)

__all__ = ["CoordinatorLookup", "COORDINATOR_ERRORS", "BACKOFF_S", "GROUP", "TRANSACTION"]

T = TypeVar("T")

GROUP = pb.GROUP
TRANSACTION = pb.TRANSACTION
# Errors after which the coordinator is found again and the call retried.
COORDINATOR_ERRORS: tuple[type[LogstoreError], ...] = (
    NotCoordinatorError, CoordinatorNotAvailableError, CoordinatorLoadInProgressError, BrokerUnavailableError,
)
# Errors after which the call is tried again: found again, or (CONCURRENT_TRANSACTIONS) the same one.
_ASK_AGAIN: tuple[type[LogstoreError], ...] = (*COORDINATOR_ERRORS, ConcurrentTransactionsError)
BACKOFF_S = (0.02, 0.05, 0.1, 0.2, 0.5)


class CoordinatorLookup:
    """Coordinators found for one client; see the module docstring.

    ``find(request, timeout_s)`` is the client's FindCoordinator call to its home
    (errors mapped).
    """

    def __init__(self, router: Router, find: Callable[[pb.FindCoordinatorRequest, float], pb.FindCoordinatorResponse]
                 ) -> None:
        self._router = router
        self._find = find
        self._lock = threading.Lock()
        self._known: dict[tuple[pb.CoordinatorType, str], str | None] = {}  # None: local (home)

    def connection(self, key_type: pb.CoordinatorType, key: str, *, timeout_s: float) -> Connection:
        """The coordinator of ``key`` (cached, else found now); raises the finding's error."""
        with self._lock:
            found = self._known.get((key_type, key), "")
        if found == "":
            response = self._find(pb.FindCoordinatorRequest(key_type=key_type, keys=[key]), timeout_s)
            answer = next((c for c in response.coordinators if c.key == key), None)
            if answer is None:
                raise CoordinatorNotAvailableError(f"FindCoordinator answered nothing for {key!r}")
            error = error_from_item(answer.error)
            if error is not None:
                raise error
            found = None if answer.local else f"{answer.host}:{answer.port}"
            with self._lock:
                self._known[(key_type, key)] = found
        return self._router.home if found is None else self._router.connection(found)

    def forget(self, key_type: pb.CoordinatorType, key: str) -> None:
        """Drop the cached coordinator of ``key``: the next call finds it again."""
        with self._lock:
            self._known.pop((key_type, key), None)

    def note(self, key_type: pb.CoordinatorType, key: str, error: BaseException | None) -> None:
        """Forget the coordinator of ``key`` if ``error`` says it is elsewhere or gone."""
        if isinstance(error, COORDINATOR_ERRORS):
            self.forget(key_type, key)

    def call(self, key_type: pb.CoordinatorType, key: str, fn: Callable[[Connection, float], T], *, timeout_s: float) -> T:
        """``fn(coordinator, remaining_s)`` against the coordinator of ``key``, found again and retried
        on the errors of :data:`COORDINATOR_ERRORS` (and asked again on CONCURRENT_TRANSACTIONS)
        until ``timeout_s`` has passed."""
        deadline = time.monotonic() + timeout_s
        attempt = 0
        while True:
            remaining = max(deadline - time.monotonic(), 0.001)
            try:
                return fn(self.connection(key_type, key, timeout_s=remaining), remaining)
            except RequestTimedOutError:
                self.forget(key_type, key)  # it may be paused or cut off: find it again next time
                raise
            except _ASK_AGAIN as e:
                if not isinstance(e, ConcurrentTransactionsError):  # that one: the right coordinator, busy
                    self.forget(key_type, key)
                pause = BACKOFF_S[min(attempt, len(BACKOFF_S) - 1)]
                if time.monotonic() + pause >= deadline:
                    raise e from None
                time.sleep(pause)
                attempt += 1
