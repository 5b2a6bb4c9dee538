"""Futures waiting on partitions: the data plane's one wake-up mechanism.

The data plane keeps one registry for its fetches (the append path's
:class:`~logstore.broker.data_plane.appends.SequenceGate` keeps another, for requests
held behind their predecessors). A long-polling fetch, a consumer's or a follower's,
registers one future under each
partition it reads before it reads (so an append between its read and its wait still
wakes it), waits, and unregisters. :meth:`PartitionWaiters.wake` resolves every future
of a partition: after a producer's append, a transaction marker, and a HWM move. A
woken fetch looks again and may find nothing yet for its role (a consumer woken by an
append the followers do not have yet): it waits again, without a read.

Only partitions that exist get an entry (:meth:`PartitionWaiters.watch` asks), so fetches
naming unknown topics leave nothing behind (issue 14).

Thread-safety: event loop only.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable, Iterable

__all__ = ["Key", "PartitionWaiters"]

Key = tuple[str, int]


class PartitionWaiters:
    """Per-partition futures of waiting requests; see the module docstring."""

    def __init__(self) -> None:
        self._waiters: dict[Key, set[asyncio.Future[None]]] = {}

    def watch(self, keys: Iterable[Key], waiter: asyncio.Future[None], *,
              exists: Callable[[str, int], bool] | None = None) -> list[Key]:
        """Register ``waiter`` under each of ``keys`` that ``exists`` (all without it); return those keys."""
        watched = []
        for key in keys:
            waiters = self._waiters.get(key)
            if waiters is None:
                if exists is not None and not exists(*key):
                    continue
                waiters = self._waiters[key] = set()
            waiters.add(waiter)
            watched.append(key)
        return watched

    def unwatch(self, keys: Iterable[Key], waiter: asyncio.Future[None]) -> None:
        """Remove ``waiter``, and the entries it leaves empty."""
        for key in keys:
            waiters = self._waiters.get(key)
            if waiters is not None:
                waiters.discard(waiter)
                if not waiters:
                    del self._waiters[key]

    def waiting(self, topic: str, partition: int) -> int:
        """How many requests wait on the partition now."""
        return len(self._waiters.get((topic, partition), ()))

    def wake(self, topic: str, partition: int) -> None:
        """Something happened on the partition: every request waiting on it looks again."""
        for waiter in self._waiters.pop((topic, partition), ()):
            if not waiter.done():
                waiter.set_result(None)

    def wake_all(self) -> None:
        """The broker stops: every waiting request looks again (and answers with what it has)."""
        for key in list(self._waiters):
            self.wake(*key)
