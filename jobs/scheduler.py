"""The jobs scheduler: compaction on an interval and materialized views kept running.

``logstore jobs schedule --config conf/jobs.toml`` (or ``python -m
jobs.cli schedule --config ...``, the command in :mod:`jobs.cli`) runs, in
one SparkSession:

* **compaction** — every ``compaction.interval`` it asks the broker which
  partitions of the chosen topics (``topics = "all"``: every compacted topic)
  have a dirty ratio at or above their ``min.cleanable.dirty.ratio``
  (:func:`compaction.planner.cleanable_partitions`), and compacts them topic by
  topic (:func:`compaction.job.run_compaction`), dirtiest topic first;
* **views** — each ``[[materialize]]`` entry is a streaming query
  (:func:`jobs.materialize.materialize`) that is started, watched, and
  restarted when it fails.

A failing job never stops the others: a topic whose compaction fails, and a
view that fails (to start, or later), is retried after an exponential
backoff (``retry``: ``initial_backoff`` × ``multiplier`` ^ (failures − 1),
capped at ``max_backoff``); a job that had run ``reset_after`` before failing
starts its backoff over. Every run is one log line on the
``logstore.jobs.scheduler`` logger: what, how long, the result; with
``status_file`` in the configuration it is also each job's last run in that
JSON file (:mod:`jobs.run_status`), which ``logstore console --jobs-status``
shows.

``--once`` runs one round and exits (cron, tests): a compaction check whatever
the interval, and each view caught up once (``Trigger.AvailableNow``); exit
code 1 when anything failed. Without it the scheduler runs until SIGTERM or
Ctrl-C, then stops the views (each finishes or abandons its batch; the
checkpoint makes that safe) and exits 0; a second signal exits at once. A
compaction in progress when the signal comes finishes first (a compaction cut
short changes nothing it did not finish swapping, so a second signal is safe).

The decisions are plain functions of the state and an injectable clock
(:mod:`jobs.scheduler_decisions`: ``backoff_s``, ``after_failure``,
``compaction_check_due``, ``topics_due``, ``retries_due``, ``view_action``);
the :class:`Scheduler` loop (this module) only applies them, and takes its
planner, compactor and view starter as callables so that it runs without
Spark in tests; :func:`spark_jobs` makes the real ones.

Configuration: :func:`jobs.scheduler_config.load_config` (see ``conf/jobs.toml`` for every key).
Errors name the file and the key, e.g. ``conf/jobs.toml: compaction.interval:
expected a duration such as "30s" or "5m", got "soon"``.

Thread-safety: a :class:`Scheduler` is driven by one thread; the views run in
Spark's streaming threads and are only polled.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any, Protocol

from jobs.run_status import RunStatusFile
from jobs.scheduler_config import JobsConfig, ViewConfig
from jobs.scheduler_decisions import (
    DirtyPartition,
    JobState,
    after_failure,
    after_success,
    backoff_s,
    compaction_check_due,
    is_ready,
    retries_due,
    topics_due,
    view_action,
)
from logstore.client.security import ClientSecurity
from logstore.errors import LogstoreError

__all__ = [
    "CompactionOutcome",
    "RunRecord",
    "QueryLike",
    "Scheduler",
    "spark_jobs",
]

log = logging.getLogger("logstore.jobs.scheduler")


@dataclass(frozen=True, slots=True)
class CompactionOutcome:
    """What the scheduler needs of a compaction run: success, and one line about it."""

    ok: bool
    detail: str


@dataclass(frozen=True, slots=True)
class RunRecord:
    """One run, as logged: ``kind`` (plan, compaction, view), the job, success, duration, detail."""

    kind: str
    name: str
    ok: bool
    duration_s: float
    detail: str

    def line(self) -> str:
        return (f"{self.kind} {self.name}: {'ok' if self.ok else 'FAILED'} in "
                f"{self.duration_s:.1f}s: {self.detail}")


class QueryLike(Protocol):
    @property
    def isActive(self) -> bool: ...  # noqa: N802 - Spark's name

    def exception(self) -> Any: ...

    def stop(self) -> None: ...


# planner(topics or None for all compacted) -> (dirty partitions, errors per topic)
Planner = Callable[[Sequence[str] | None], tuple[list[DirtyPartition], dict[str, str]]]
Compactor = Callable[[str, Sequence[int]], CompactionOutcome]
ViewStarter = Callable[..., QueryLike]  # (ViewConfig, *, available_now: bool) -> query


@dataclass
class _ViewRun:
    state: JobState = JobState()
    query: QueryLike | None = None
    started_at: float = 0.0


def _short(error: BaseException) -> str:
    text = error.message if isinstance(error, LogstoreError) else str(error)
    first = (text.strip().splitlines() or [type(error).__name__])[0]
    return f"{type(error).__name__}: {first[:400]}"


class Scheduler:
    """Applies the decisions above on a clock; see the module docstring.

    ``plan``, ``compact`` and ``start_view`` do the work (:func:`spark_jobs`
    makes the real ones); ``clock`` is monotonic seconds.
    """

    def __init__(self, config: JobsConfig, *, plan: Planner, compact: Compactor,
                 start_view: ViewStarter, clock: Callable[[], float] = time.monotonic) -> None:
        self.config = config
        self._plan = plan
        self._compact = compact
        self._start_view = start_view
        self._clock = clock
        self.last_check_at: float | None = None
        self.plan_state = JobState()
        self.topic_states: dict[str, JobState] = {}
        self.pending: dict[str, tuple[int, ...]] = {}   # failed compactions awaiting retry
        self.views: dict[str, _ViewRun] = {v.name: _ViewRun() for v in config.views}
        self.status = (RunStatusFile(config.status_file, config=config.source)
                       if config.status_file else None)

    # -- one round ---------------------------------------------------------------

    def run_round(self, *, once: bool = False) -> list[RunRecord]:
        """Compaction (if due; always with ``once``), then the views; returns the runs made."""
        records = self.compaction_round(force_check=once)
        records += self.catch_up_views() if once else self.supervise_views()
        return records

    def compaction_round(self, *, force_check: bool = False) -> list[RunRecord]:
        cfg = self.config.compaction
        if not cfg.enabled:
            return []
        records: list[RunRecord] = []
        now = self._clock()
        done: set[str] = set()
        for topic, parts in retries_due(self.pending, self.topic_states, now):
            records.append(self._compact_topic(topic, parts))
            done.add(topic)
        now = self._clock()
        if not (force_check or (compaction_check_due(self.last_check_at, now, cfg.interval_s)
                                and is_ready(self.plan_state, now))):
            return records
        started = now
        try:
            dirty, errors = self._plan(cfg.topics)
        except Exception as e:  # noqa: BLE001 - the planner failing must not stop the views
            # Not a check: the next one comes after the planner's backoff, not the interval.
            self.plan_state = after_failure(self.plan_state, self._clock(), self.config.retry, _short(e))
            records.append(self._log(RunRecord(
                "plan", "compaction", False, self._clock() - started,
                f"{_short(e)}; next check in {backoff_s(self.plan_state.failures, self.config.retry):.0f}s")))
            return records
        self.last_check_at = started
        self.plan_state = after_success(self.plan_state, self._clock())
        for topic, error in sorted(errors.items()):
            self._fail_topic(topic, (), error)
            records.append(self._log(RunRecord(
                "plan", topic, False, 0.0, f"{error}; retry in "
                f"{backoff_s(self.topic_states[topic].failures, self.config.retry):.0f}s")))
        due = [(t, p) for t, p in topics_due(dirty, selected=cfg.topics, states=self.topic_states,
                                             now=self._clock()) if t not in done]
        records.append(self._log(RunRecord(
            "plan", "compaction", True, self._clock() - started,
            f"{len(dirty)} partition(s) over their dirty ratio; due: "
            + (", ".join(f"{t}{list(p)}" for t, p in due) or "none"))))
        for topic, parts in due:
            records.append(self._compact_topic(topic, parts))
        return records

    def _compact_topic(self, topic: str, partitions: Sequence[int]) -> RunRecord:
        started = self._clock()
        name = f"{topic}{list(partitions)}" if partitions else topic
        try:
            outcome = self._compact(topic, partitions)
        except Exception as e:  # noqa: BLE001 - one topic failing must not stop the others
            outcome = CompactionOutcome(False, _short(e))
        took = self._clock() - started
        if outcome.ok:
            self.topic_states[topic] = after_success(self.topic_states.get(topic, JobState()), self._clock())
            self.pending.pop(topic, None)
            return self._log(RunRecord("compaction", name, True, took, outcome.detail))
        self._fail_topic(topic, partitions, outcome.detail)
        wait = backoff_s(self.topic_states[topic].failures, self.config.retry)
        return self._log(RunRecord(
            "compaction", name, False, took,
            f"{outcome.detail}; retry in {wait:.0f}s (failure {self.topic_states[topic].failures})"))

    def _fail_topic(self, topic: str, partitions: Sequence[int], error: str) -> None:
        self.topic_states[topic] = after_failure(
            self.topic_states.get(topic, JobState()), self._clock(), self.config.retry, error)
        self.pending[topic] = tuple(partitions)

    # -- views -------------------------------------------------------------------

    def supervise_views(self) -> list[RunRecord]:
        """Record views that ended, start those whose backoff is over."""
        records: list[RunRecord] = []
        for view in self.config.views:
            run = self.views[view.name]
            now = self._clock()
            try:
                running = None if run.query is None else bool(run.query.isActive)
            except Exception:  # noqa: BLE001 - a query whose JVM side is gone counts as ended
                running = False
            action = view_action(running=running, state=run.state, now=now)
            if action == "failed":
                assert run.query is not None
                error = _query_error(run.query)
                ran_for = now - run.started_at
                run.state = after_failure(run.state, now, self.config.retry, error, ran_for_s=ran_for)
                run.query = None
                records.append(self._log(RunRecord(
                    "view", view.name, False, ran_for,
                    f"{error}; restart in {run.state.next_attempt_at - now:.0f}s "
                    f"(failure {run.state.failures})")))
                action = view_action(running=None, state=run.state, now=now)
            if action == "start":
                records.append(self._start(view, run, available_now=False))
        return records

    def catch_up_views(self) -> list[RunRecord]:
        """``--once``: each view reads what is in its topic now, then stops."""
        records = []
        for view in self.config.views:
            records.append(self._start(view, self.views[view.name], available_now=True))
        return records

    def _start(self, view: ViewConfig, run: _ViewRun, *, available_now: bool) -> RunRecord:
        started = self._clock()
        try:
            query = self._start_view(view, available_now=available_now)
        except Exception as e:  # noqa: BLE001 - one view failing must not stop the others
            now = self._clock()
            run.state = after_failure(run.state, now, self.config.retry, _short(e))
            retry = "" if available_now else (
                f"; retry in {run.state.next_attempt_at - now:.0f}s (failure {run.state.failures})")
            return self._log(RunRecord("view", view.name, False, now - started, _short(e) + retry))
        if available_now:
            run.state = after_success(run.state, self._clock())
            return self._log(RunRecord("view", view.name, True, self._clock() - started, "caught up"))
        run.query = query
        run.started_at = self._clock()
        return self._log(RunRecord("view", view.name, True, run.started_at - started, "started"))

    def stop_views(self) -> None:
        for view in self.config.views:
            run = self.views[view.name]
            if run.query is not None:
                try:
                    run.query.stop()
                    log.info("view %s: stopped", view.name)
                except Exception as e:  # noqa: BLE001 - stopping the rest matters more
                    log.warning("view %s: stop failed: %s", view.name, _short(e))
                run.query = None

    # -- forever -----------------------------------------------------------------

    def run_forever(self, stop: threading.Event) -> None:
        """Rounds every ``tick`` until ``stop`` is set; then stop the views."""
        try:
            while not stop.is_set():
                self.run_round()
                stop.wait(self._next_wait())
        finally:
            self.stop_views()

    def _next_wait(self) -> float:
        """Until the next tick, or sooner if a compaction check or retry falls due before it."""
        now = self._clock()
        wait = self.config.tick_s
        if self.config.compaction.enabled:
            if self.last_check_at is not None:
                wait = min(wait, self.last_check_at + self.config.compaction.interval_s - now)
            for topic in self.pending:
                wait = min(wait, self.topic_states.get(topic, JobState()).next_attempt_at - now)
            if self.plan_state.failures:
                wait = min(wait, self.plan_state.next_attempt_at - now)
        return max(0.05, wait)

    def _log(self, record: RunRecord) -> RunRecord:
        (log.info if record.ok else log.warning)("%s", record.line())
        if self.status is not None:
            self.status.record(record)
        return record


def _query_error(query: QueryLike) -> str:
    try:
        error = query.exception()
    except Exception as e:  # noqa: BLE001
        return _short(e)
    if error is None:
        return "the query stopped"
    return _short(error) if isinstance(error, BaseException) else str(error)


# --------------------------------------------------------------------------- the real jobs


def _summary_outcome(summary: Any) -> CompactionOutcome:
    """A :class:`compaction.job.CompactionSummary` in one line."""
    from logstore.byte_sizes import human_bytes

    parts = []
    for r in summary.partitions:
        if r.error is None:
            parts.append(f"p{r.partition} {human_bytes(r.bytes_before)}->{human_bytes(r.bytes_after)}, "
                         f"{r.records_removed} removed")
        else:
            parts.append(f"p{r.partition} {'retriable' if r.retriable else 'FAILED'}: {r.error}")
    if not summary.partitions:
        parts.append("nothing to compact")
    return CompactionOutcome(bool(summary.ok), "; ".join(parts))


def spark_jobs(spark: Any, config: JobsConfig,
               security: ClientSecurity | None = None) -> tuple[Planner, Compactor, ViewStarter]:
    """The real planner, compactor and view starter, on ``spark`` against ``config.bootstrap``
    (connecting with ``security`` to a secured broker: TLS, SCRAM)."""
    from compaction.job import run_compaction
    from compaction.planner import cleanable_partitions
    from jobs.materialize import materialize
    from logstore.client.rpc import BrokerClient

    bootstrap = config.bootstrap

    def plan(topics: Sequence[str] | None) -> tuple[list[DirtyPartition], dict[str, str]]:
        dirty: list[DirtyPartition] = []
        errors: dict[str, str] = {}
        with BrokerClient(bootstrap, security=security) as client:
            # One call per listed topic, so that one unknown topic does not hide the others.
            for names in ([None] if topics is None else [[t] for t in topics]):
                try:
                    plans = cleanable_partitions(client, names, security=security)
                except LogstoreError as e:
                    if names is None:
                        raise
                    errors[names[0]] = _short(e)
                    continue
                dirty += [DirtyPartition(p.topic, p.partition, p.dirty_ratio) for p in plans]
        return dirty, errors

    def compact(topic: str, partitions: Sequence[int]) -> CompactionOutcome:
        summary = run_compaction(spark, bootstrap=bootstrap, topic=topic,
                                 partitions=list(partitions) or None, security=security)
        return _summary_outcome(summary)

    def start_view(view: ViewConfig, *, available_now: bool) -> QueryLike:
        trigger = None
        if not available_now and view.trigger_interval_s is not None:
            trigger = f"{max(1, round(view.trigger_interval_s * 1000))} milliseconds"
        return materialize(
            spark, bootstrap=bootstrap, topic=view.topic, table=view.table,
            checkpoint=view.checkpoint, available_now=available_now, json_schema=view.json_schema,
            trigger_interval=trigger, max_offsets_per_trigger=view.max_offsets_per_trigger,
            source_options={**(security.prefixed_options() if security else {}), **view.source_options},
        )

    return plan, compact, start_view

