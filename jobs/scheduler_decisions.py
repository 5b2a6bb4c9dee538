"""The jobs scheduler's decisions: pure functions of the state and the time.

When a failing job may run again (:func:`backoff_s`, :func:`after_failure`,
:func:`after_success`, :func:`is_ready`), when the next dirty-ratio check is
due (:func:`compaction_check_due`), which topics to compact now
(:func:`topics_due`, :func:`retries_due`) and what to do with a view
(:func:`view_action`). Times are seconds of the caller's (injectable,
monotonic) clock; :class:`jobs.scheduler.Scheduler` applies the decisions.

Backoff: ``initial_backoff`` × ``multiplier`` ^ (failures − 1), capped at
``max_backoff``; a job that had run ``reset_after`` before failing starts its
backoff over.

Thread-safety: pure functions and immutable values.
"""

from __future__ import annotations

from collections.abc import Collection, Iterable, Mapping
from dataclasses import dataclass

from jobs.scheduler_config import RetryPolicy

__all__ = [
    "JobState",
    "DirtyPartition",
    "backoff_s",
    "after_failure",
    "after_success",
    "is_ready",
    "compaction_check_due",
    "topics_due",
    "retries_due",
    "view_action",
]


@dataclass(frozen=True, slots=True)
class JobState:
    """A job's failure record: consecutive ``failures``, and when it may run again."""

    failures: int = 0
    next_attempt_at: float = 0.0
    last_error: str | None = None


def backoff_s(failures: int, policy: RetryPolicy) -> float:
    """The wait after the ``failures``-th consecutive failure (0 when there is none)."""
    if failures <= 0:
        return 0.0
    # Exponent capped so that huge failure counts cannot overflow.
    exponent = min(failures - 1, 64)
    return min(policy.max_backoff_s, policy.initial_backoff_s * policy.multiplier ** exponent)


def after_failure(state: JobState, now: float, policy: RetryPolicy, error: str, *,
                  ran_for_s: float = 0.0) -> JobState:
    """The state after a failure at ``now``; a job that ran ``reset_after`` first starts over at 1."""
    failures = 1 if ran_for_s >= policy.reset_after_s else state.failures + 1
    return JobState(failures, now + backoff_s(failures, policy), error)


def after_success(state: JobState, now: float) -> JobState:
    """The state after a success: no failures, free to run."""
    return JobState()


def is_ready(state: JobState, now: float) -> bool:
    """Whether a job's backoff is over."""
    return now >= state.next_attempt_at


def compaction_check_due(last_check_at: float | None, now: float, interval_s: float) -> bool:
    """Whether the next dirty-ratio check is due (the first one is due at once)."""
    return last_check_at is None or now - last_check_at >= interval_s


@dataclass(frozen=True, slots=True)
class DirtyPartition:
    """A partition the planner would compact: its dirty ratio reached the topic's threshold."""

    topic: str
    partition: int
    dirty_ratio: float


def topics_due(dirty: Iterable[DirtyPartition], *, selected: Collection[str] | None,
               states: Mapping[str, JobState], now: float) -> list[tuple[str, tuple[int, ...]]]:
    """The topics to compact now, with their partitions, dirtiest topic first.

    Only topics in ``selected`` (None = all) whose backoff is over (``states``;
    a topic without a state is ready).
    """
    by_topic: dict[str, dict[int, float]] = {}
    for d in dirty:
        if selected is not None and d.topic not in selected:
            continue
        if not is_ready(states.get(d.topic, JobState()), now):
            continue
        by_topic.setdefault(d.topic, {})[d.partition] = d.dirty_ratio
    order = sorted(by_topic, key=lambda t: (-max(by_topic[t].values()), t))
    return [(t, tuple(sorted(by_topic[t]))) for t in order]


def retries_due(pending: Mapping[str, tuple[int, ...]], states: Mapping[str, JobState],
                now: float) -> list[tuple[str, tuple[int, ...]]]:
    """Failed compactions whose backoff is over (retried before the next interval check)."""
    return [(t, parts) for t, parts in sorted(pending.items())
            if is_ready(states.get(t, JobState()), now)]


def view_action(*, running: bool | None, state: JobState, now: float) -> str:
    """What to do with a view: ``"keep"`` (running), ``"failed"`` (it ended: record the
    failure), ``"start"`` (not running, backoff over) or ``"wait"``.

    ``running`` is None when no query was started (or the last one was recorded).
    """
    if running is True:
        return "keep"
    if running is False:
        return "failed"
    return "start" if is_ready(state, now) else "wait"

