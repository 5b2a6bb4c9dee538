"""The jobs scheduler: compaction on an interval and materialized views kept running.

``logstore jobs schedule --config conf/jobs.toml`` (or ``python -m
jobs.scheduler --config ...``) runs, in one SparkSession:

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
``logstore.jobs.scheduler`` logger: what, how long, the result.

``--once`` runs one round and exits (cron, tests): a compaction check whatever
the interval, and each view caught up once (``Trigger.AvailableNow``); exit
code 1 when anything failed. Without it the scheduler runs until SIGTERM or
Ctrl-C, then stops the views (each finishes or abandons its batch; the
checkpoint makes that safe) and exits 0; a second signal exits at once. A
compaction in progress when the signal comes finishes first (a compaction cut
short changes nothing it did not finish swapping, so a second signal is safe).

The decisions are plain functions of the state and an injectable clock
(:func:`backoff_s`, :func:`after_failure`, :func:`compaction_check_due`,
:func:`topics_due`, :func:`retries_due`, :func:`view_action`); the
:class:`Scheduler` loop only applies them, and takes its planner, compactor
and view starter as callables so that it runs without Spark in tests.

Configuration: :func:`load_config` (see ``conf/jobs.toml`` for every key).
Errors name the file and the key, e.g. ``conf/jobs.toml: compaction.interval:
expected a duration such as "30s" or "5m", got "soon"``.

Thread-safety: a :class:`Scheduler` is driven by one thread; the views run in
Spark's streaming threads and are only polled.
"""

from __future__ import annotations

import dataclasses
import logging
import math
import re
import signal
import sys
import threading
import time
from collections.abc import Callable, Collection, Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Protocol

import click

from logstore.cli.common import bootstrap_option, cli_errors
from logstore.defaults import default_bootstrap
from logstore.errors import InvalidConfigError, LogstoreError

if sys.version_info >= (3, 11):
    import tomllib
else:  # pragma: no cover - exercised on Python 3.10 only
    import tomli as tomllib

__all__ = [
    "JobsConfig",
    "JobsConfigError",
    "CompactionConfig",
    "ViewConfig",
    "RetryPolicy",
    "SparkConfig",
    "load_config",
    "parse_config",
    "parse_duration_s",
    "JobState",
    "DirtyPartition",
    "CompactionOutcome",
    "RunRecord",
    "backoff_s",
    "after_failure",
    "after_success",
    "is_ready",
    "compaction_check_due",
    "topics_due",
    "retries_due",
    "view_action",
    "Scheduler",
    "spark_jobs",
    "schedule_command",
]

log = logging.getLogger("logstore.jobs.scheduler")


# --------------------------------------------------------------------------- configuration


class JobsConfigError(InvalidConfigError):
    """The jobs configuration file is unreadable, or a key is unknown, missing or malformed."""


@dataclass(frozen=True, slots=True)
class RetryPolicy:
    """Exponential backoff of a failing job (seconds)."""

    initial_backoff_s: float = 10.0
    max_backoff_s: float = 600.0
    multiplier: float = 2.0
    reset_after_s: float = 300.0


@dataclass(frozen=True, slots=True)
class CompactionConfig:
    """``[compaction]``: whether, how often, and which topics (None = every compacted topic)."""

    enabled: bool = True
    interval_s: float = 300.0
    topics: tuple[str, ...] | None = None


@dataclass(frozen=True, slots=True)
class ViewConfig:
    """One ``[[materialize]]`` entry: the arguments of :func:`jobs.materialize.materialize`."""

    topic: str
    table: str
    checkpoint: str | None = None
    json_schema: str | None = None
    trigger_interval_s: float | None = 10.0
    max_offsets_per_trigger: int | None = None
    source_options: Mapping[str, str] = field(default_factory=dict)

    @property
    def name(self) -> str:
        return f"{self.topic} -> {self.table}"


@dataclass(frozen=True, slots=True)
class SparkConfig:
    """``[spark]``: the SparkSession the scheduler builds (Delta is always on)."""

    master: str = "local[2]"
    app_name: str = "logstore-jobs"
    conf: Mapping[str, str] = field(default_factory=dict)


@dataclass(frozen=True, slots=True)
class JobsConfig:
    """The whole ``jobs.toml``; ``tick_s`` is how often views are looked after."""

    bootstrap: str
    compaction: CompactionConfig = CompactionConfig()
    views: tuple[ViewConfig, ...] = ()
    retry: RetryPolicy = RetryPolicy()
    spark: SparkConfig = SparkConfig()
    tick_s: float = 5.0
    source: str = "<config>"


_UNITS_S = {
    "ms": 0.001, "millisecond": 0.001, "milliseconds": 0.001,
    "s": 1.0, "sec": 1.0, "secs": 1.0, "second": 1.0, "seconds": 1.0,
    "m": 60.0, "min": 60.0, "mins": 60.0, "minute": 60.0, "minutes": 60.0,
    "h": 3600.0, "hour": 3600.0, "hours": 3600.0,
    "d": 86400.0, "day": 86400.0, "days": 86400.0,
}
_DURATION = re.compile(r"\s*(\d+(?:\.\d+)?)\s*([a-z]+)\s*")


def parse_duration_s(value: object, *, where: str, allow_zero: bool = False) -> float:
    """``"500ms"``, ``"30s"``, ``"10 seconds"``, ``"5m"``, ``"2h"``, ``"1d"``, or a number of seconds."""
    if isinstance(value, bool):
        raise JobsConfigError(f"{where}: expected a duration such as \"30s\" or \"5m\", got {value!r}")
    if isinstance(value, (int, float)):
        seconds = float(value)
    else:
        m = _DURATION.fullmatch(str(value).lower()) if isinstance(value, str) else None
        if m is None or m.group(2) not in _UNITS_S:
            raise JobsConfigError(
                f"{where}: expected a duration such as \"30s\" or \"5m\", got {value!r}"
            )
        seconds = float(m.group(1)) * _UNITS_S[m.group(2)]
    if not math.isfinite(seconds) or seconds < 0 or (seconds == 0 and not allow_zero):
        raise JobsConfigError(f"{where}: must be a positive duration, got {value!r}")
    return seconds


def _check_keys(table: Mapping[str, Any], allowed: Collection[str], *, where: str, source: str) -> None:
    unknown = sorted(set(table) - set(allowed))
    if unknown:
        raise JobsConfigError(
            f"{source}: {where + ': ' if where else ''}unknown key{'s' if len(unknown) > 1 else ''} "
            f"{', '.join(unknown)}; known keys: {', '.join(sorted(allowed))}"
        )


def _table(doc: Mapping[str, Any], key: str, *, source: str) -> Mapping[str, Any]:
    value = doc.get(key, {})
    if not isinstance(value, Mapping):
        raise JobsConfigError(f"{source}: [{key}] must be a table, got {value!r}")
    return value


def _str(table: Mapping[str, Any], key: str, *, where: str, source: str, required: bool = False,
         default: str | None = None) -> str | None:
    value = table.get(key)
    if value is None:
        if required:
            raise JobsConfigError(f"{source}: {where}{key} is required")
        return default
    if not isinstance(value, str) or not value.strip():
        raise JobsConfigError(f"{source}: {where}{key}: expected a non-empty string, got {value!r}")
    return value.strip()


def parse_config(doc: Mapping[str, Any], *, source: str = "<config>") -> JobsConfig:
    """Validate a parsed TOML document into a :class:`JobsConfig` (see ``conf/jobs.toml``)."""
    _check_keys(doc, ("bootstrap", "tick", "spark", "compaction", "retry", "materialize"),
                where="", source=source)
    bootstrap = _str(doc, "bootstrap", where="", source=source) or default_bootstrap()
    if not re.fullmatch(r"[^\s:,]+:\d+", bootstrap):
        raise JobsConfigError(f"{source}: bootstrap: expected host:port, got {bootstrap!r}")
    tick_s = parse_duration_s(doc.get("tick", 5), where=f"{source}: tick")

    spark_doc = _table(doc, "spark", source=source)
    _check_keys(spark_doc, ("master", "app_name", "conf"), where="[spark]", source=source)
    spark_conf = _table(spark_doc, "conf", source=f"{source}: [spark]")
    spark = SparkConfig(
        master=_str(spark_doc, "master", where="spark.", source=source, default="local[2]") or "local[2]",
        app_name=_str(spark_doc, "app_name", where="spark.", source=source,
                      default="logstore-jobs") or "logstore-jobs",
        conf={str(k): str(v).lower() if isinstance(v, bool) else str(v) for k, v in spark_conf.items()},
    )

    comp = _table(doc, "compaction", source=source)
    _check_keys(comp, ("enabled", "interval", "topics"), where="[compaction]", source=source)
    enabled = comp.get("enabled", True)
    if not isinstance(enabled, bool):
        raise JobsConfigError(f"{source}: compaction.enabled: expected true or false, got {enabled!r}")
    topics_raw = comp.get("topics", "all")
    topics: tuple[str, ...] | None
    if topics_raw == "all":
        topics = None
    elif isinstance(topics_raw, list) and topics_raw and all(isinstance(t, str) and t for t in topics_raw):
        topics = tuple(dict.fromkeys(topics_raw))
    else:
        raise JobsConfigError(
            f'{source}: compaction.topics: expected "all" or a non-empty list of topic names, '
            f"got {topics_raw!r}"
        )
    compaction = CompactionConfig(
        enabled=enabled,
        interval_s=parse_duration_s(comp.get("interval", "5m"), where=f"{source}: compaction.interval"),
        topics=topics,
    )

    retry_doc = _table(doc, "retry", source=source)
    _check_keys(retry_doc, ("initial_backoff", "max_backoff", "multiplier", "reset_after"),
                where="[retry]", source=source)
    multiplier = retry_doc.get("multiplier", 2.0)
    if isinstance(multiplier, bool) or not isinstance(multiplier, (int, float)) or multiplier < 1:
        raise JobsConfigError(f"{source}: retry.multiplier: expected a number >= 1, got {multiplier!r}")
    retry = RetryPolicy(
        initial_backoff_s=parse_duration_s(retry_doc.get("initial_backoff", "10s"),
                                           where=f"{source}: retry.initial_backoff"),
        max_backoff_s=parse_duration_s(retry_doc.get("max_backoff", "10m"),
                                       where=f"{source}: retry.max_backoff"),
        multiplier=float(multiplier),
        reset_after_s=parse_duration_s(retry_doc.get("reset_after", "5m"),
                                       where=f"{source}: retry.reset_after"),
    )
    if retry.max_backoff_s < retry.initial_backoff_s:
        raise JobsConfigError(
            f"{source}: retry.max_backoff ({retry.max_backoff_s:g}s) is shorter than "
            f"retry.initial_backoff ({retry.initial_backoff_s:g}s)"
        )

    entries = doc.get("materialize", [])
    if not isinstance(entries, list) or not all(isinstance(e, Mapping) for e in entries):
        raise JobsConfigError(f"{source}: materialize must be an array of tables ([[materialize]])")
    views = tuple(_parse_view(e, i, source=source) for i, e in enumerate(entries))
    for attr, what in (("table", "table"), ("checkpoint", "checkpoint")):
        seen: dict[str, int] = {}
        for i, v in enumerate(views):
            value = getattr(v, attr)
            if value is None:
                continue
            if value in seen:
                raise JobsConfigError(
                    f"{source}: materialize[{seen[value]}] and materialize[{i}] use the same {what} "
                    f"{value!r}; each view needs its own"
                )
            seen[value] = i
    return JobsConfig(bootstrap=bootstrap, compaction=compaction, views=views, retry=retry,
                      spark=spark, tick_s=tick_s, source=source)


def _parse_view(entry: Mapping[str, Any], index: int, *, source: str) -> ViewConfig:
    where = f"materialize[{index}]."
    _check_keys(entry, ("topic", "table", "checkpoint", "json_schema", "trigger_interval",
                        "max_offsets_per_trigger", "source_options"),
                where=f"materialize[{index}]", source=source)
    topic = _str(entry, "topic", where=where, source=source, required=True)
    table = _str(entry, "table", where=where, source=source, required=True)
    assert topic is not None and table is not None
    from jobs.materialize import MaterializeConfigError, table_ref

    try:
        table_ref(table)
    except MaterializeConfigError as e:
        raise JobsConfigError(f"{source}: {where}table: {e.message}") from None
    json_schema = _str(entry, "json_schema", where=where, source=source)
    if json_schema is not None:
        from logstore.schema_text import parse_schema

        try:
            parse_schema(json_schema)
        except LogstoreError as e:
            raise JobsConfigError(f"{source}: {where}json_schema: {e.message}") from None
    # 0 = Spark's default trigger: the next batch as soon as the previous one ended.
    trigger_s: float | None = parse_duration_s(entry.get("trigger_interval", "10s"), allow_zero=True,
                                               where=f"{source}: {where}trigger_interval")
    if trigger_s == 0:
        trigger_s = None
    max_offsets = entry.get("max_offsets_per_trigger")
    if max_offsets is not None and (isinstance(max_offsets, bool) or not isinstance(max_offsets, int)
                                    or max_offsets < 1):
        raise JobsConfigError(
            f"{source}: {where}max_offsets_per_trigger: expected a positive integer, got {max_offsets!r}"
        )
    options = entry.get("source_options", {})
    if not isinstance(options, Mapping):
        raise JobsConfigError(f"{source}: {where}source_options must be a table of strings")
    return ViewConfig(
        topic=topic, table=table,
        checkpoint=_str(entry, "checkpoint", where=where, source=source),
        json_schema=json_schema, trigger_interval_s=trigger_s, max_offsets_per_trigger=max_offsets,
        source_options={str(k): str(v).lower() if isinstance(v, bool) else str(v) for k, v in options.items()},
    )


def load_config(path: str | Path) -> JobsConfig:
    """Read and validate a jobs TOML file; :class:`JobsConfigError` names the file and the key."""
    p = Path(path)
    try:
        text = p.read_text(encoding="utf-8")
    except OSError as e:
        raise JobsConfigError(f"{p}: cannot read the jobs configuration: {e.strerror or e}") from None
    try:
        doc = tomllib.loads(text)
    except tomllib.TOMLDecodeError as e:
        raise JobsConfigError(f"{p}: not valid TOML: {e}") from None
    return parse_config(doc, source=str(p))


# --------------------------------------------------------------------------- decisions (pure)


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


# --------------------------------------------------------------------------- the loop


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

    @staticmethod
    def _log(record: RunRecord) -> RunRecord:
        (log.info if record.ok else log.warning)("%s", record.line())
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
    parts = []
    for r in summary.partitions:
        if r.error is None:
            parts.append(f"p{r.partition} {r.bytes_before / 1e6:.1f}->{r.bytes_after / 1e6:.1f} MB, "
                         f"{r.records_removed} removed")
        else:
            parts.append(f"p{r.partition} {'retriable' if r.retriable else 'FAILED'}: {r.error}")
    if not summary.partitions:
        parts.append("nothing to compact")
    return CompactionOutcome(bool(summary.ok), "; ".join(parts))


def spark_jobs(spark: Any, config: JobsConfig) -> tuple[Planner, Compactor, ViewStarter]:
    """The real planner, compactor and view starter, on ``spark`` against ``config.bootstrap``."""
    from compaction.job import run_compaction
    from compaction.planner import cleanable_partitions
    from jobs.materialize import materialize
    from logstore.client.rpc import BrokerClient

    bootstrap = config.bootstrap

    def plan(topics: Sequence[str] | None) -> tuple[list[DirtyPartition], dict[str, str]]:
        dirty: list[DirtyPartition] = []
        errors: dict[str, str] = {}
        with BrokerClient(bootstrap) as client:
            # One call per listed topic, so that one unknown topic does not hide the others.
            for names in ([None] if topics is None else [[t] for t in topics]):
                try:
                    plans = cleanable_partitions(client, names)
                except LogstoreError as e:
                    if names is None:
                        raise
                    errors[names[0]] = _short(e)
                    continue
                dirty += [DirtyPartition(p.topic, p.partition, p.dirty_ratio) for p in plans]
        return dirty, errors

    def compact(topic: str, partitions: Sequence[int]) -> CompactionOutcome:
        summary = run_compaction(spark, bootstrap=bootstrap, topic=topic,
                                 partitions=list(partitions) or None)
        return _summary_outcome(summary)

    def start_view(view: ViewConfig, *, available_now: bool) -> QueryLike:
        trigger = None
        if not available_now and view.trigger_interval_s is not None:
            trigger = f"{max(1, round(view.trigger_interval_s * 1000))} milliseconds"
        return materialize(
            spark, bootstrap=bootstrap, topic=view.topic, table=view.table,
            checkpoint=view.checkpoint, available_now=available_now, json_schema=view.json_schema,
            trigger_interval=trigger, max_offsets_per_trigger=view.max_offsets_per_trigger,
            source_options=view.source_options,
        )

    return plan, compact, start_view


# --------------------------------------------------------------------------- CLI


@click.command("schedule")
@click.option("--config", "config_path", default="conf/jobs.toml", show_default=True,
              type=click.Path(dir_okay=False), help="The jobs configuration (TOML).")
@click.option("--once", is_flag=True, help="Run one round (compaction check, views caught up) and exit.")
@bootstrap_option
@cli_errors
def schedule_command(config_path: str, once: bool, bootstrap: str) -> None:
    """Compact dirty compacted topics on an interval and keep the materialized views running."""
    from jobs.materialize import configure_job_logging
    from jobs.spark_session import local_session

    config = load_config(config_path)
    ctx = click.get_current_context()
    if ctx.get_parameter_source("bootstrap") is not click.core.ParameterSource.DEFAULT:
        config = dataclasses.replace(config, bootstrap=bootstrap)
    configure_job_logging()
    log.info("scheduler: %s, bootstrap %s, compaction %s, %d view(s)%s", config.source, config.bootstrap,
             (f"every {config.compaction.interval_s:g}s of "
              + ("all compacted topics" if config.compaction.topics is None
                 else ", ".join(config.compaction.topics))) if config.compaction.enabled else "off",
             len(config.views), " (once)" if once else "")
    spark = local_session(config.spark.app_name, master=config.spark.master, delta=True,
                          conf=dict(config.spark.conf))
    try:
        plan, compact, start_view = spark_jobs(spark, config)
        scheduler = Scheduler(config, plan=plan, compact=compact, start_view=start_view)
        if once:
            records = scheduler.run_round(once=True)
            if not all(r.ok for r in records):
                raise SystemExit(1)
            return
        stop = threading.Event()
        signals: list[int] = []

        def on_signal(signum: int, frame: object) -> None:
            signals.append(signum)
            if len(signals) > 1:
                raise SystemExit(128 + signum)
            log.info("scheduler: signal %d, stopping (again to exit at once)", signum)
            stop.set()

        previous = {s: signal.signal(s, on_signal) for s in (signal.SIGTERM, signal.SIGINT)}
        try:
            scheduler.run_forever(stop)
        finally:
            for s, handler in previous.items():
                signal.signal(s, handler)
        log.info("scheduler: stopped")
    finally:
        spark.stop()


if __name__ == "__main__":
    schedule_command(prog_name="python -m jobs.scheduler")
