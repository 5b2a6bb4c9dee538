"""One request's partitions, a bounded number at a time.

A Produce of 10,000 partitions used to queue 10,000 jobs on the I/O threads ahead of every
other client's (issue 14): :func:`gather_bounded` keeps at most :data:`FANOUT` of one
request's partitions in progress at once. When the request is cancelled (its client went away),
the partitions still queued never start, and their coroutines are closed unrun.

Thread-safety: event loop only.
"""

from __future__ import annotations

import asyncio
import inspect
from collections.abc import Awaitable, Iterable
from typing import TypeVar

__all__ = ["FANOUT", "gather_bounded"]

T = TypeVar("T")

FANOUT = 64  # partitions of one request in progress at once


async def gather_bounded(aws: Iterable[Awaitable[T]], limit: int = FANOUT) -> list[T]:
    """``asyncio.gather`` of ``aws`` with at most ``limit`` of them running at once (results in order)."""
    gate = asyncio.Semaphore(max(limit, 1))

    async def one(aw: Awaitable[T]) -> T:
        try:
            await gate.acquire()
        except BaseException:  # cancelled while queued: ``aw`` will never run, so close it
            if inspect.iscoroutine(aw):
                aw.close()
            raise
        try:
            return await aw
        finally:
            gate.release()
    return list(await asyncio.gather(*(one(aw) for aw in aws)))
