"""Limits on logins: unfinished SCRAM exchanges and failed attempts (issue 22).

Two deterministic parts with an injected clock, used by
:class:`~.scram_exchange.ScramExchanges` on the event loop:

:class:`PendingExchanges` holds the SCRAM exchanges between the first and the
final message. Unauthenticated callers create them, so none of them may crowd
out another caller's login:

* an exchange lives ``ttl_s`` (seconds: a real client answers in one round trip);
* a connection (gRPC peer ``ip:port``) has at most ``per_connection``; a new one
  replaces that connection's oldest;
* a source address has at most ``per_host``; a new one replaces the oldest of
  that address's connection with the most exchanges;
* the table has at most ``capacity``; a new one replaces the oldest of the
  address with the most exchanges.

So a flood only ever evicts the flooder's own exchanges (or those of the busiest
address), and a login from anywhere else always gets its slot: a table full of
unauthenticated work never refuses a new exchange.

:class:`FailedLogins` rate-limits guessing. Each failed final message counts
against the user name and against the source address; after
``free_failures_per_user`` failures for a name (``free_failures_per_host`` for an
address: many users may share one, behind NAT or on one machine), attempts for
that name or from that address are admitted one at a time, each
``delay_s(failures, free)`` after the previous one (doubling from
``base_delay_s`` up to ``max_delay_s``); an attempt that would wait longer than
``max_wait_s`` fails at once, as a wrong password does. Counts decay: a name or
address without a failure for ``forget_after_s`` starts again at zero. An
unknown user name counts like a known one, so the limits say nothing about
which names exist. Failures are logged once per ``log_interval_s`` with counts
per address (never user names: people type passwords into them).

Thread-safety: neither class is locked; both are used from the event loop only.
"""

from __future__ import annotations

import logging
import time
from collections import OrderedDict
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Generic, TypeVar

__all__ = ["FailedLogins", "PendingExchanges"]

log = logging.getLogger("logstore.broker.security")
E = TypeVar("E")


@dataclass
class _Pending(Generic[E]):
    value: E
    connection: str
    host: str
    expires_at: float


class PendingExchanges(Generic[E]):
    """Unfinished exchanges by id, bounded per connection, per address and in all."""

    def __init__(self, *, ttl_s: float, per_connection: int, per_host: int, capacity: int,
                 clock: Callable[[], float] = time.monotonic) -> None:
        if not 1 <= per_connection <= per_host <= capacity:
            raise ValueError("need 1 <= per_connection <= per_host <= capacity")
        self.ttl_s = ttl_s
        self.per_connection, self.per_host, self.capacity = per_connection, per_host, capacity
        self._clock = clock
        self._by_id: OrderedDict[str, _Pending[E]] = OrderedDict()  # oldest first
        self._by_connection: dict[str, OrderedDict[str, None]] = {}
        self._by_host: dict[str, dict[str, int]] = {}  # host -> connection -> count
        self.evicted = 0

    def __len__(self) -> int:
        return len(self._by_id)

    def add(self, exchange_id: str, value: E, *, connection: str, host: str) -> None:
        """Hold ``value`` under ``exchange_id`` (making room as the module docstring says)."""
        now = self._clock()
        self._drop_expired(now)
        mine = self._by_connection.get(connection)
        if mine is not None and len(mine) >= self.per_connection:
            self._evict(next(iter(mine)))
        host_conns = self._by_host.get(host)
        if host_conns is not None and sum(host_conns.values()) >= self.per_host:
            busiest = max(host_conns, key=lambda c: host_conns[c])
            self._evict(next(iter(self._by_connection[busiest])))
        if len(self._by_id) >= self.capacity:
            busiest_host = max(self._by_host, key=lambda h: sum(self._by_host[h].values()))
            conns = self._by_host[busiest_host]
            self._evict(next(iter(self._by_connection[max(conns, key=lambda c: conns[c])])))
        self._by_id[exchange_id] = _Pending(value, connection, host, now + self.ttl_s)
        self._by_connection.setdefault(connection, OrderedDict())[exchange_id] = None
        counts = self._by_host.setdefault(host, {})
        counts[connection] = counts.get(connection, 0) + 1

    def take(self, exchange_id: str) -> E | None:
        """Remove and return the live exchange ``exchange_id`` (None: unknown, replaced or expired)."""
        pending = self._by_id.get(exchange_id)
        if pending is None:
            return None
        self._remove(exchange_id)
        return pending.value if pending.expires_at > self._clock() else None

    def _drop_expired(self, now: float) -> None:
        while self._by_id:
            exchange_id, pending = next(iter(self._by_id.items()))
            if pending.expires_at > now:
                return
            self._remove(exchange_id)

    def _evict(self, exchange_id: str) -> None:
        self.evicted += 1
        self._remove(exchange_id)

    def _remove(self, exchange_id: str) -> None:
        pending = self._by_id.pop(exchange_id)
        mine = self._by_connection[pending.connection]
        del mine[exchange_id]
        if not mine:
            del self._by_connection[pending.connection]
        counts = self._by_host[pending.host]
        counts[pending.connection] -= 1
        if not counts[pending.connection]:
            del counts[pending.connection]
        if not counts:
            del self._by_host[pending.host]


@dataclass
class _Failures:
    count: int = 0
    last_failure: float = 0.0
    next_slot: float = 0.0


@dataclass
class _LogWindow:
    started: float = float("-inf")
    by_host: dict[str, int] = field(default_factory=dict)


class FailedLogins:
    """Failed-login counts per user name and per address, and the admission delay they impose."""

    def __init__(self, *, free_failures_per_user: int = 5, free_failures_per_host: int = 30, base_delay_s: float = 0.25, max_delay_s: float = 10.0,
                 max_wait_s: float = 5.0, forget_after_s: float = 600.0, log_interval_s: float = 60.0,
                 max_entries: int = 100_000, clock: Callable[[], float] = time.monotonic) -> None:
        self._free = {"user": free_failures_per_user, "host": free_failures_per_host}
        self.base_delay_s, self.max_delay_s = base_delay_s, max_delay_s
        self.max_wait_s, self.forget_after_s, self.log_interval_s = max_wait_s, forget_after_s, log_interval_s
        self.max_entries = max_entries
        self._clock = clock
        self._entries: OrderedDict[tuple[str, str], _Failures] = OrderedDict()  # least recently failed first
        self._log = _LogWindow()
        self.suppressed_lines = 0

    def delay_s(self, failures: int, free: int) -> float:
        """The spacing of attempts after ``failures`` failures (0 while they are ``free``)."""
        over = failures - free
        return 0.0 if over < 0 else min(self.base_delay_s * 2 ** min(over, 32), self.max_delay_s)

    def admit(self, user: str, host: str) -> float | None:
        """Reserve the next attempt slot for ``user`` from ``host``: how many seconds the attempt
        must wait first (0: now), or None when that is more than ``max_wait_s`` (fail it at once)."""
        now = self._clock()
        start = now
        entries = [(kind, self._live((kind, name), now)) for kind, name in (("user", user), ("host", host))]
        for _, e in entries:
            if e is not None:
                start = max(start, e.next_slot)
        if start - now > self.max_wait_s:
            return None
        for kind, e in entries:
            if e is not None and e.count >= self._free[kind]:
                e.next_slot = start + self.delay_s(e.count, self._free[kind])
        return start - now

    def failed(self, user: str, host: str) -> None:
        """Count a failed attempt (a wrong password and an unknown user alike) and log it,
        at most one line per ``log_interval_s`` (the line carries the counts since the last)."""
        now = self._clock()
        for key in (("user", user), ("host", host)):
            e = self._live(key, now) or _Failures()
            e.count += 1
            e.last_failure = now
            e.next_slot = max(e.next_slot, now + self.delay_s(e.count, self._free[key[0]]))
            self._entries[key] = e
            self._entries.move_to_end(key)
        while len(self._entries) > self.max_entries:
            self._entries.popitem(last=False)
        window = self._log
        window.by_host[host] = window.by_host.get(host, 0) + 1
        if not self.report(now):
            self.suppressed_lines += 1

    def report(self, now: float | None = None) -> bool:
        """Log the failures counted since the last line, if any and if ``log_interval_s`` has
        passed since it; return whether a line was logged. :meth:`failed` calls it, and the
        broker once per interval, so the counts of a burst that stopped are reported too."""
        now = self._clock() if now is None else now
        window = self._log
        if not window.by_host or now - window.started < self.log_interval_s:
            return False
        total = sum(window.by_host.values())
        hosts = ", ".join(f"{h} x{n}" for h, n in sorted(window.by_host.items(), key=lambda kv: -kv[1])[:10])
        log.warning("%d failed SCRAM login(s) since the last report (%s); repeated failures are "
                    "slowed down and reported once per %.0f s", total, hosts, self.log_interval_s)
        self._log = _LogWindow(started=now)
        return True

    def succeeded(self, user: str) -> None:
        """A correct password for ``user``: its name starts again at zero (its address does not,
        or one valid account would reset the limit of a guesser on the same address)."""
        self._entries.pop(("user", user), None)

    def _live(self, key: tuple[str, str], now: float) -> _Failures | None:
        e = self._entries.get(key)
        if e is not None and now - e.last_failure >= self.forget_after_s:
            del self._entries[key]
            return None
        return e
