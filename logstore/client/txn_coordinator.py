"""Where a transactional id's requests go: its transaction coordinator, found and cached.

The transaction RPCs (InitProducerId with a transactional id, AddPartitionsToTxn,
EndTxn, EndTxnGroup, DescribeTxnGroup) are answered by the coordinator of the id:
on a cluster, the leader of the ``__transaction_state`` partition its *coordinator
key* hashes to — the part of the id before its first ``/``, so a Spark sink's
transactions ``<sinkId>/<batchId>/...`` and its group ``<sinkId>`` share one
coordinator. :class:`TxnCoordinators` asks any broker
``FindCoordinator(TRANSACTION, key)``, caches the answer per key, and sends the
request there. On NOT_COORDINATOR, COORDINATOR_NOT_AVAILABLE,
COORDINATOR_LOAD_IN_PROGRESS or an unreachable coordinator it forgets the cached
one, finds it again and retries (short pauses) until the request's deadline;
CONCURRENT_TRANSACTIONS (the id's previous transaction is still writing its
markers) is retried on the same coordinator.

A broker without a ``FindCoordinator`` handler (UNIMPLEMENTED) is its own
coordinator: the request goes to the client's bootstrap broker, as before
coordinators moved (remembered, so it is asked once per client).

Thread-safety: the cache is guarded by a lock; requests run in the caller's thread.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable
from typing import Any

import grpc

from logstore._proto import logstore_pb2 as pb
from logstore.client.error_mapping import error_from_item, error_from_rpc, raise_for_item
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

__all__ = ["TxnCoordinators", "coordinator_key", "RETRY_CODES"]

# Answers after which the coordinator is looked up again and the request retried.
RETRY_CODES = frozenset({NotCoordinatorError.code, CoordinatorNotAvailableError.code,
                         CoordinatorLoadInProgressError.code, BrokerUnavailableError.code,
                         ConcurrentTransactionsError.code})  # the last: markers still landing, same coordinator
_PAUSE_S = 0.1


def coordinator_key(transactional_id: str) -> str:
    """The part of a transactional (or group) id that picks its coordinator: before the first '/'."""
    return transactional_id.split("/", 1)[0]


class TxnCoordinators:
    """The transaction coordinators of one client's keys; see the module docstring."""

    def __init__(self, router: Router) -> None:
        self._router = router
        self._lock = threading.Lock()
        self._by_key: dict[str, Connection] = {}
        self._unsupported = False  # the brokers answer FindCoordinator UNIMPLEMENTED: home coordinates

    def call(self, transactional_id: str, rpc: str, request: Any, *, timeout_s: float,
             send: Callable[[str, Any, float, Connection | None], Any]) -> Any:
        """``rpc`` on the coordinator of ``transactional_id``; the response, its ``error`` raised.
        ``send(rpc, request, timeout_s, conn)`` makes one call (None: the bootstrap broker)."""
        key = coordinator_key(transactional_id)
        deadline = time.monotonic() + timeout_s
        while True:
            remaining = max(deadline - time.monotonic(), 0.001)
            conn: Connection | None = None
            try:
                conn = self._find(key, remaining)
                response = send(rpc, request, remaining, conn)
                error = error_from_item(getattr(response, "error", None))
                if error is None or error.code not in RETRY_CODES:
                    raise_for_item(response.error)
                    return response
            except LogstoreError as e:
                if e.code not in RETRY_CODES and not isinstance(e, RequestTimedOutError):
                    raise
                error = e
            if error.code != ConcurrentTransactionsError.code:
                self._forget(key, conn)  # a coordinator answer: find it again
            if time.monotonic() + _PAUSE_S >= deadline:
                raise error
            time.sleep(_PAUSE_S)

    def _forget(self, key: str, conn: Connection | None) -> None:
        with self._lock:
            if conn is not None and self._by_key.get(key) is conn:
                del self._by_key[key]

    def _find(self, key: str, timeout_s: float) -> Connection | None:
        """The cached coordinator of ``key``, else FindCoordinator's answer (None: the bootstrap broker)."""
        with self._lock:
            if self._unsupported:
                return None
            known = self._by_key.get(key)
        if known is not None:
            return known
        home = self._router.home
        try:
            answer: pb.FindCoordinatorResponse = home.method("FindCoordinator")(
                pb.FindCoordinatorRequest(key_type=pb.TRANSACTION, keys=[key]), timeout=timeout_s)
        except grpc.RpcError as e:
            if isinstance(e, grpc.Call) and e.code() == grpc.StatusCode.UNIMPLEMENTED:
                with self._lock:
                    self._unsupported = True
                return None
            error = home.explain(error_from_rpc(e, rpc="FindCoordinator", target=home.address))
            self._router.note_failure(home, error)  # the next lookup asks the next bootstrap entry
            raise error from None
        found = next((c for c in answer.coordinators if c.key == key), None)
        if found is None:
            raise CoordinatorNotAvailableError(f"FindCoordinator did not answer for {key!r}")
        raise_for_item(found.error)
        if found.local:  # the broker asked coordinates it itself (a single broker): keep calling home
            return None
        conn = self._router.connection(f"{found.host}:{found.port}")
        with self._lock:
            self._by_key[key] = conn
        return conn
