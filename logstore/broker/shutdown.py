"""Shutdown steps with a deadline: a broker's stop ends whatever etcd and its peers do.

A graceful stop (SIGTERM, :meth:`EmbeddedBroker.stop`) runs steps that may wait on things
outside the broker: etcd (the controlled-shutdown request, resigning the controller role,
revoking the session's lease) and other brokers (a coordinator's last write waiting for its
followers). Each such step runs through :meth:`ShutdownClock.step`, which gives it what is
left of a budget and, when it does not finish in that time, logs a warning naming the step
and abandons it: the step's task is cancelled and not awaited, so a step that swallows its
cancellation (or a gRPC call stuck until its own deadline) cannot hold the stop. Nothing
abandoned here is needed for safety: leaderships and the controller role move when the
broker's etcd session ends, and coordinators reload their state from the log.

Thread-safety: event loop only.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Awaitable
from typing import Any

__all__ = ["ShutdownClock"]

log = logging.getLogger("logstore.broker")


class ShutdownClock:
    """A budget of ``budget_s`` seconds, started now, shared by the steps of one stop."""

    def __init__(self, budget_s: float) -> None:
        self.budget_s = budget_s
        self._deadline = time.monotonic() + budget_s

    def left(self) -> float:
        """Seconds left of the budget (0 once it is spent)."""
        return max(self._deadline - time.monotonic(), 0.0)

    async def step(self, what: str, work: Awaitable[Any], *, limit_s: float | None = None) -> bool:
        """Run ``work`` within what is left (and within ``limit_s``, when given: a step that
        may take long leaves time for the steps after it); whether it finished. A step that
        fails is logged with its error and counts as finished; a step out of time is
        cancelled, logged at WARNING and left behind."""
        task = asyncio.ensure_future(work)
        timeout = self.left() if limit_s is None else min(self.left(), limit_s)
        done, _ = await asyncio.wait({task}, timeout=timeout)
        if not done:
            task.cancel()
            task.add_done_callback(_swallow)  # abandoned: its outcome is nobody's
            log.warning("shutdown: %s did not finish within the %.1f s budget; abandoned", what, self.budget_s)
            return False
        error = task.exception() if not task.cancelled() else None
        if error is not None:
            log.warning("shutdown: %s failed: %s", what, error, exc_info=error)
        return True


def _swallow(task: asyncio.Future[Any]) -> None:
    if not task.cancelled():
        task.exception()  # retrieved, so asyncio does not log "exception was never retrieved"
