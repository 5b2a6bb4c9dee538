"""Client quotas on the Kafka listener: the broker's quotas, counted and enforced as Kafka does.

The Kafka listener counts against the broker's one
:class:`~logstore.broker.security.quotas.QuotaManager` (the quotas of gRPC clients: the same
``quota_*`` settings and ``[quotas]`` overrides, the same principal and client id, so a user's
gRPC and Kafka traffic share its rates): one request (every API but ApiVersions,
SaslHandshake and SaslAuthenticate, which set a connection up), a Produce's request bytes,
a Fetch answer's bytes. A request that takes its entity over a quota gets the throttle
time in its answer's ``throttle_time_ms`` (KIP-219: the answer goes out at once), and the
listener then reads nothing more from that connection for that long (Kafka mutes the
channel). Kafka's clients wait out the throttle time themselves before their next request
to that broker, so a well-behaved client never meets the mute. Unlike Kafka's broker, a
throttled Fetch is answered with its records rather than empty: they were read already, and
the rate counts them.

Thread-safety: event loop only (the quota manager's).
"""

from __future__ import annotations

import dataclasses
import datetime
from typing import TYPE_CHECKING, Any

from logstore.broker.quota_config import FETCH, PRODUCE, REQUEST

if TYPE_CHECKING:
    from logstore.broker.security.quotas import QuotaManager

__all__ = ["KafkaThrottling", "with_throttle_time"]

_PRODUCE, _FETCH, _API_VERSIONS, _SASL_HANDSHAKE, _SASL_AUTHENTICATE = 0, 1, 18, 17, 36
_EXEMPT = frozenset({_API_VERSIONS, _SASL_HANDSHAKE, _SASL_AUTHENTICATE})  # a connection's set-up


class KafkaThrottling:
    """Counts each answered request against ``quotas``; see the module docstring."""

    def __init__(self, quotas: QuotaManager) -> None:
        self._quotas = quotas

    def throttle_ms(self, api_key: int, principal: str, client_id: str, *, request_bytes: int,
                    response_bytes: int) -> int:
        """Count a request of ``api_key`` once it is answered (its request's and answer's sizes,
        size prefix included); the throttle time in ms that brings the caller back to its quotas."""
        if api_key in _EXEMPT:
            return 0
        quotas = self._quotas
        throttle_ms = quotas.record(REQUEST, principal, client_id, 1)
        if api_key == _PRODUCE:
            throttle_ms = max(throttle_ms, quotas.record(PRODUCE, principal, client_id, request_bytes))
        elif api_key == _FETCH and quotas.limit(FETCH, principal, client_id):
            throttle_ms = max(throttle_ms, quotas.record(FETCH, principal, client_id, response_bytes))
        return throttle_ms


def with_throttle_time(response: Any, throttle_ms: int) -> Any:
    """``response`` saying ``throttle_time_ms`` (unchanged when its version has no such field)."""
    if not any(f.name == "throttle_time" for f in dataclasses.fields(response)):
        return response
    return dataclasses.replace(response, throttle_time=datetime.timedelta(milliseconds=throttle_ms))
