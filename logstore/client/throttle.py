"""The client's side of broker quotas: its client id on every call, and backing off when throttled.

A broker whose quota a client exceeded answers with trailing metadata
``logstore-throttle-ms`` (:mod:`logstore.broker.security.quotas`) and holds
that client's next request for that long. The client waits the time out
itself, before its next request to that broker (Kafka's clients do the same
since KIP-219), so its requests are not parked on the broker, where they
would use up their deadlines. One :class:`CallHooks` sits on each
connection's channel (:class:`logstore.client.routing.Connection`): the wait
is per broker, as the broker's hold is.

Client ids: ``client_id=`` of Producer, Consumer and Admin (kafka-python's
option); the default is ``logstore-producer-N`` for a producer (N counts the
process's producers, as kafka-python's ``kafka-python-producer-N``) and
``logstore-python-VERSION`` otherwise.

Thread-safety: a :class:`CallHooks` is shared by the threads calling through
its channel; its few fields change under a lock.
"""

from __future__ import annotations

import itertools
import threading
import time
from collections.abc import Callable
from typing import Any

import grpc

from logstore._version import __version__
from logstore.defaults import CLIENT_ID_METADATA_KEY, THROTTLE_METADATA_KEY

__all__ = ["CallHooks", "MAX_BACKOFF_S", "default_client_id"]

MAX_BACKOFF_S = 30.0  # a throttle time beyond this (a broker's cap is 30 s too) is cut to it
_PRODUCERS = itertools.count(1)


def default_client_id(kind: str = "") -> str:
    """kafka-python's defaults, with our name: ``logstore-producer-N`` or ``logstore-python-VERSION``."""
    if kind == "producer":
        return f"logstore-producer-{next(_PRODUCERS)}"
    return f"logstore-python-{__version__}"


class CallHooks:
    """What every call of a channel goes through: adds ``logstore-client-id``, waits out a
    broker's throttle time. :meth:`interceptors` are its gRPC interceptors, one per kind of
    call the client makes (``grpc.intercept_channel(channel, *hooks.interceptors())``).

    ``throttle_time_ms_total`` and ``throttled_requests`` count the throttle times received
    (the client's throttle metrics, as Kafka's ``produce-throttle-time``).
    """

    def __init__(self, client_id: str, *, clock: Callable[[], float] = time.monotonic,
                 sleep: Callable[[float], None] = time.sleep) -> None:
        self.client_id = client_id
        self._metadata = ((CLIENT_ID_METADATA_KEY, client_id),) if client_id else ()
        self._clock = clock
        self._sleep = sleep
        self._lock = threading.Lock()
        self._not_before = 0.0
        self.throttle_time_ms_total = 0
        self.throttled_requests = 0

    def backoff_s(self) -> float:
        """How long the next request through this channel still waits (0: none)."""
        return max(self._not_before - self._clock(), 0.0)

    def _before(self, details: grpc.ClientCallDetails) -> grpc.ClientCallDetails:
        wait = self.backoff_s()
        if wait > 0:
            self._sleep(min(wait, MAX_BACKOFF_S))
        if not self._metadata:
            return details
        return _CallDetails(details.method, details.timeout, tuple(details.metadata or ()) + self._metadata,
                            details.credentials, details.wait_for_ready, details.compression)

    def _after(self, call: Any) -> None:
        """Read the answer's throttle time (success or failure) and set the next call's earliest start."""
        try:
            trailing = call.trailing_metadata() or ()
        except Exception:  # noqa: BLE001 - a cancelled or broken call carries none
            return
        for key, value in trailing:
            if key == THROTTLE_METADATA_KEY:
                try:
                    ms = int(value)
                except (TypeError, ValueError):
                    return
                if ms <= 0:
                    return
                with self._lock:
                    self._not_before = max(self._not_before, self._clock() + min(ms / 1000, MAX_BACKOFF_S))
                    self.throttle_time_ms_total += ms
                    self.throttled_requests += 1
                return

    def interceptors(self) -> tuple[Any, ...]:
        """This object's gRPC interceptors: unary calls, client streams, bidirectional streams."""
        return _UnaryUnary(self), _StreamUnary(self), _StreamStream(self)


class _UnaryUnary(grpc.UnaryUnaryClientInterceptor):
    def __init__(self, hooks: CallHooks) -> None:
        self._hooks = hooks

    def intercept_unary_unary(self, continuation: Any, client_call_details: grpc.ClientCallDetails,
                              request: Any) -> Any:
        outcome = continuation(self._hooks._before(client_call_details), request)
        outcome.add_done_callback(self._hooks._after)
        return outcome


class _StreamUnary(grpc.StreamUnaryClientInterceptor):
    def __init__(self, hooks: CallHooks) -> None:
        self._hooks = hooks

    def intercept_stream_unary(self, continuation: Any, client_call_details: grpc.ClientCallDetails,
                               request_iterator: Any) -> Any:
        outcome = continuation(self._hooks._before(client_call_details), request_iterator)
        outcome.add_done_callback(self._hooks._after)
        return outcome


class _StreamStream(grpc.StreamStreamClientInterceptor):
    def __init__(self, hooks: CallHooks) -> None:
        self._hooks = hooks

    def intercept_stream_stream(self, continuation: Any, client_call_details: grpc.ClientCallDetails,
                                request_iterator: Any) -> Any:
        # A produce stream (logstore.client.produce_stream): the client id; a broker with quotas
        # serves no stream (its throttle is per call), so no throttle time comes back on one.
        return continuation(self._hooks._before(client_call_details), request_iterator)


class _CallDetails(grpc.ClientCallDetails):
    """gRPC's ClientCallDetails is an interface without a constructor: a plain implementation."""

    def __init__(self, method: str, timeout: float | None, metadata: Any, credentials: Any,
                 wait_for_ready: bool | None, compression: Any) -> None:
        self.method = method
        self.timeout = timeout
        self.metadata = metadata
        self.credentials = credentials
        self.wait_for_ready = wait_for_ready
        self.compression = compression
