"""Client quotas: produce and fetch byte rates and a request rate, enforced by throttling.

Kafka's model (KIP-13, KIP-124, KIP-219), with our own code:

* **What is limited.** ``producer_byte_rate`` (bytes/s of Produce requests, as
  received), ``consumer_byte_rate`` (bytes/s of Fetch answers, as sent; a
  follower's replica fetch is not counted) and ``request_rate`` — **requests
  per second** of any RPC (Kafka's request quota is a percentage of handler
  time instead; a rate is what a Python broker can measure cheaply and what an
  operator can reason about). 0 means no limit.
* **Who is limited.** Each quota is resolved on its own for the caller's
  principal (``User:alice``, :meth:`Broker.caller`) and client id (call
  metadata ``logstore-client-id``), most specific first, as Kafka does: an
  override for ``"User:alice,client-id:etl"``, else for ``"User:alice"``, else
  for ``"client-id:etl"``, else the broker-wide default. An override is shared
  by every client it matches (all of alice's clients together get her rate);
  the default applies to each (principal, client id) pair separately.
* **How it is measured.** A sliding window of ``quota_window_num`` samples of
  ``quota_window_size_ms`` each (Kafka's ``quota.window.num`` = 11 and
  ``quota.window.size.seconds`` = 1): the rate is the samples' total over the
  time they cover, which is never taken as less than ``num - 1`` full samples
  (so a new client's first burst is measured over 10 s, not over its first
  millisecond).
* **How it is enforced.** A request that takes its entity's rate above the quota
  gets the throttle time that brings the rate back to it,
  ``total / quota - elapsed`` — Kafka's ``(rate - quota) / quota * window``
  once the samples span the minimum window (before that, Kafka's formula
  under-throttles a first burst over and over) — capped at
  ``quota_max_throttle_ms``, in
  its answer's trailing metadata ``logstore-throttle-ms``; the answer is sent at
  once (KIP-219) and the client's next requests are held by the broker until
  the throttle time has passed (Kafka mutes the channel; we hold the next
  request of the same principal and client id before its handler runs). Our
  clients read the throttle time and wait that long themselves before their
  next request to that broker (:mod:`logstore.client.routing`), so a
  well-behaved client never meets the hold. A call that fails as a whole
  carries only its error code (``_guard`` sets the trailing metadata), but its
  throttle still holds the next request.

State is bounded: entities idle for a whole window are dropped, client ids
are cut to 255 characters, and past ``MAX_ENTITIES`` live entities new ones
share one overflow entity (throttled together rather than growing memory
without bound under a flood of made-up client ids).

Thread-safety: a :class:`QuotaManager` is used from the broker's event loop only.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable, Mapping
from typing import Any

import grpc

from logstore._proto import logstore_pb2 as pb
from logstore.broker.quota_config import (
    FETCH,
    KINDS,
    PRODUCE,
    REQUEST,
    QuotaConfig,
    QuotaOverride,
    parse_quota_overrides,
)
from logstore.broker.security.principal import Principal
from logstore.defaults import CLIENT_ID_METADATA_KEY, THROTTLE_METADATA_KEY
from logstore.errors import LogstoreError

__all__ = ["KINDS", "MAX_ENTITIES", "QuotaConfig", "QuotaManager", "QuotaOverride", "SampledRate",
           "parse_quota_overrides", "throttled_handlers"]

MAX_ENTITIES = 10_000
_MAX_CLIENT_ID_CHARS = 255
_OVERFLOW = ("*", "*")


class SampledRate:
    """Kafka's sampled ``Rate``: ``num`` samples of ``size_s`` seconds; the rate is their total
    over the time they span, taken as at least ``num - 1`` samples (see the module docstring)."""

    __slots__ = ("num", "size_s", "_samples")

    def __init__(self, num: int, size_s: float) -> None:
        self.num = num
        self.size_s = size_s
        self._samples: list[list[float]] = []  # [start time, total], oldest first

    def record(self, amount: float, now: float) -> None:
        if not self._samples or now >= self._samples[-1][0] + self.size_s:
            self._samples.append([now, 0.0])
            self._purge(now)
        self._samples[-1][1] += amount

    def _purge(self, now: float) -> None:
        """Drop samples started ``num`` sample lengths ago or more (Kafka's expiry), and any past ``num``."""
        horizon = now - self.num * self.size_s
        while self._samples and self._samples[0][0] <= horizon:
            self._samples.pop(0)
        del self._samples[:-self.num]

    def window_s(self, now: float) -> float:
        """The time the samples span, at least ``num - 1`` whole samples."""
        self._purge(now)
        elapsed = now - self._samples[0][0] if self._samples else 0.0
        return max(elapsed, (self.num - 1) * self.size_s)

    def elapsed_s(self, now: float) -> float:
        """The time the samples span (the oldest sample's start to now)."""
        self._purge(now)
        return now - self._samples[0][0] if self._samples else 0.0

    def total(self) -> float:
        return sum(s[1] for s in self._samples)

    def rate(self, now: float) -> float:
        window = self.window_s(now)
        return sum(s[1] for s in self._samples) / window if window > 0 else 0.0

    def idle_since(self) -> float:
        return self._samples[-1][0] if self._samples else float("-inf")


class QuotaManager:
    """The rates of every quota entity and the holds of every client (see the module docstring)."""

    def __init__(self, config: QuotaConfig, *, clock: Callable[[], float] = time.monotonic,
                 on_throttle: Callable[[str, str, int], None] | None = None) -> None:
        """``on_throttle(principal, kind, throttle_ms)`` is told of every throttled request (metrics)."""
        self.config = config
        self._clock = clock
        self._on_throttle = on_throttle
        self._rates: dict[tuple[str, tuple[str, str]], SampledRate] = {}
        self._held_until: dict[tuple[str, str], float] = {}
        self._window_s = config.window_num * config.window_size_ms / 1000
        self._next_sweep = 0.0

    @property
    def enabled(self) -> bool:
        return self.config.enabled

    def limit(self, kind: str, principal: str, client_id: str) -> int:
        """The rate of ``kind`` that applies to this caller (0: none)."""
        return self.config.resolve(kind, principal, client_id)[1]

    def record(self, kind: str, principal: str, client_id: str, amount: float) -> int:
        """Count ``amount`` (bytes, or 1 request) against the caller's ``kind`` quota; return the
        throttle time in ms that brings its rate back to the quota (0: within it)."""
        entity, quota = self.config.resolve(kind, principal, client_id)
        if quota <= 0:
            return 0
        now = self._clock()
        self._maybe_sweep(now)
        key = (kind, entity)
        rate = self._rates.get(key)
        if rate is None:
            if len(self._rates) >= MAX_ENTITIES:
                key = (kind, _OVERFLOW)
                rate = self._rates.get(key)
            if rate is None:
                rate = self._rates[key] = SampledRate(self.config.window_num, self.config.window_size_ms / 1000)
        rate.record(amount, now)
        observed = rate.rate(now)
        if observed <= quota:
            return 0
        # The time at which the samples' total, spread over the time they span, is the quota:
        # total / quota - elapsed, which is Kafka's (rate - quota) / quota * window once the
        # samples span the minimum window; before (a new client's first burst), Kafka's formula
        # uses the minimum window for the time elapsed and under-throttles, again and again.
        throttle_ms = int((rate.total() / quota - rate.elapsed_s(now)) * 1000 + 0.5)
        throttle_ms = min(throttle_ms, self.config.max_throttle_ms)
        if throttle_ms > 0 and self._on_throttle is not None:
            self._on_throttle(principal, kind, throttle_ms)
        return throttle_ms

    def hold(self, principal: str, client_id: str, throttle_ms: int) -> None:
        """Hold this client's next requests for ``throttle_ms`` from now (Kafka's channel mute)."""
        if throttle_ms <= 0:
            return
        key = (principal, client_id)
        if key not in self._held_until and len(self._held_until) >= MAX_ENTITIES:
            key = _OVERFLOW
        until = self._clock() + throttle_ms / 1000
        self._held_until[key] = max(self._held_until.get(key, 0.0), until)

    def held_for_s(self, principal: str, client_id: str) -> float:
        """How long this client's next request must still wait (0: not held)."""
        until = self._held_until.get((principal, client_id))
        if until is None:
            if len(self._held_until) < MAX_ENTITIES:
                return 0.0
            until = self._held_until.get(_OVERFLOW, 0.0)  # it may have been held as overflow
        return max(until - self._clock(), 0.0)

    def entity_count(self) -> int:
        """Live rate entities and holds (bounded by ``MAX_ENTITIES`` each)."""
        return len(self._rates) + len(self._held_until)

    def _maybe_sweep(self, now: float) -> None:
        """Drop rates idle for a whole window (their rate is 0) and holds that ended."""
        if now < self._next_sweep:
            return
        self._next_sweep = now + self._window_s
        for idle in [k for k, r in self._rates.items() if r.idle_since() + self._window_s + r.size_s <= now]:
            del self._rates[idle]
        for ended in [k for k, until in self._held_until.items() if until <= now]:
            del self._held_until[ended]


# --------------------------------------------------------------------------- the gRPC hook


def client_id_of(context: Any) -> str:
    """The call's ``logstore-client-id`` metadata ("" when absent), cut to 255 characters."""
    for key, value in context.invocation_metadata() or ():
        if key == CLIENT_ID_METADATA_KEY:
            text = value if isinstance(value, str) else bytes(value).decode("utf-8", "replace")
            return text[:_MAX_CLIENT_ID_CHARS]
    return ""


def _is_replica_fetch(data: bytes) -> bool:
    """Whether a Fetch request's bytes come from a follower (replica fetches are not client traffic)."""
    try:
        return pb.FetchRequest.FromString(data).HasField("replica_id")
    except Exception:  # noqa: BLE001 - malformed: the handler answers INVALID_REQUEST
        return False


def throttled_handlers(handlers: Mapping[str, grpc.RpcMethodHandler], quotas: QuotaManager,
                       caller: Callable[[Any], Principal]) -> dict[str, grpc.RpcMethodHandler]:
    """``handlers`` (method name → gRPC handler) with quotas enforced around each.

    Before the handler: wait out the client's hold. After it: count the request,
    a Produce's bytes or a Fetch answer's bytes, hold the client's next requests
    for the throttle time and put it in the trailing metadata.
    A call whose caller cannot be named (an expired session) is left to the
    handler, which refuses it.
    """
    out: dict[str, grpc.RpcMethodHandler] = {}
    for name, handler in handlers.items():
        if handler.unary_unary is not None:
            out[name] = handler._replace(unary_unary=_wrap(name, handler.unary_unary, quotas, caller))
        elif handler.stream_unary is not None:
            out[name] = handler._replace(stream_unary=_wrap(name, handler.stream_unary, quotas, caller))
        else:  # ProduceStream: with quotas on, the broker registers its refusal (UNIMPLEMENTED)
            out[name] = handler
    return out


def _wrap(name: str, inner: Callable[[Any, Any], Any], quotas: QuotaManager,
          caller: Callable[[Any], Principal]) -> Callable[[Any, Any], Any]:
    async def handle(request: Any, context: grpc.aio.ServicerContext) -> Any:
        try:
            principal = caller(context).name
        except LogstoreError:
            return await inner(request, context)
        client_id = client_id_of(context)
        held = quotas.held_for_s(principal, client_id)
        if held > 0:
            await asyncio.sleep(held)
        try:
            response = await inner(request, context)
        except BaseException:
            # A failed call counts too; its answer carries only its error code, the hold still applies.
            quotas.hold(principal, client_id, _account(name, request, None, quotas, principal, client_id))
            raise
        throttle_ms = _account(name, request, response, quotas, principal, client_id)
        if throttle_ms:
            quotas.hold(principal, client_id, throttle_ms)
            context.set_trailing_metadata(((THROTTLE_METADATA_KEY, str(throttle_ms)),))
        return response
    return handle


def _account(name: str, request: Any, response: Any, quotas: QuotaManager, principal: str, client_id: str) -> int:
    """Count a call once it is answered (as Kafka, so the throttle time runs from the answer):
    one request; a Produce's request bytes; a consumer Fetch's answer bytes. The throttle time."""
    throttle_ms = quotas.record(REQUEST, principal, client_id, 1)
    if name == "Produce" and isinstance(request, bytes):
        throttle_ms = max(throttle_ms, quotas.record(PRODUCE, principal, client_id, len(request)))
    elif (name == "Fetch" and isinstance(response, bytes) and quotas.limit(FETCH, principal, client_id)
            and not _is_replica_fetch(request)):
        throttle_ms = max(throttle_ms, quotas.record(FETCH, principal, client_id, len(response)))
    return throttle_ms
