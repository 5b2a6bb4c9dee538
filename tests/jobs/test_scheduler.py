"""The jobs scheduler without Spark: configuration, the decision functions, and the loop
driven by a fake clock, a fake planner, a fake compactor and fake streaming queries.

What each group proves:

* configuration — conf/jobs.toml parses to what it says; every mistake names the file and the key;
* decisions — backoff grows and is capped, resets after a long healthy run; which topics are due
  (selection, backoff, dirtiest first); when checks and retries fall due;
* the loop — picks the right topics on the interval; a failing compaction is retried with backoff
  without waiting for the next interval; a failing view (to start, or later) is restarted with
  backoff and never stops compaction; a failing planner stops nothing; ``--once``; a stop request
  stops the views.
"""

from __future__ import annotations

import os
import threading
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import pytest
from click.testing import CliRunner

from jobs.cli import schedule_command
from jobs.scheduler import CompactionOutcome, Scheduler
from jobs.scheduler_config import (
    JobsConfig,
    JobsConfigError,
    RetryPolicy,
    ViewConfig,
    load_config,
    parse_config,
    parse_duration_s,
)
from jobs.scheduler_decisions import (
    DirtyPartition,
    JobState,
    after_failure,
    after_success,
    backoff_s,
    compaction_check_due,
    retries_due,
    topics_due,
    view_action,
)

pytestmark = pytest.mark.timeout(60)

REPO = Path(__file__).resolve().parents[2]
POLICY = RetryPolicy(initial_backoff_s=10, max_backoff_s=100, multiplier=2, reset_after_s=300)


# ---------------------------------------------------------------- configuration


def test_default_config_file_parses() -> None:
    config = load_config(REPO / "conf" / "jobs.toml")
    assert config.bootstrap == "127.0.0.1:9392"
    assert config.compaction.enabled and config.compaction.topics is None  # all compacted topics
    assert config.compaction.interval_s == 300
    assert config.retry == RetryPolicy(10, 600, 2.0, 300)
    # Relative to the working directory, as docs/compaction-and-views.md's `materialize ... data/views/users`:
    # Its view and the scheduler share the table and (the CLI's default) its checkpoint.
    assert [(v.topic, v.table, v.checkpoint) for v in config.views] == [
        ("users", str(Path.cwd().resolve() / "data" / "views" / "users"), None)]
    assert config.views[0].json_schema == "id long, name string"
    assert config.views[0].trigger_interval_s == 10
    assert config.spark.master == "local[2]" and config.tick_s == 5


def test_minimal_config_takes_defaults() -> None:
    config = parse_config({"bootstrap": "h:1"})
    assert config.compaction.topics is None and config.compaction.interval_s == 300
    assert config.views == () and config.retry == RetryPolicy()


def test_full_config() -> None:
    config = parse_config({
        "bootstrap": "broker:9392", "tick": 2,
        "compaction": {"interval": "90s", "topics": ["a", "b", "a"]},
        "retry": {"initial_backoff": "500ms", "max_backoff": "1m", "multiplier": 3, "reset_after": "1h"},
        "materialize": [
            {"topic": "users", "table": "/v/users", "json_schema": "id long, name string",
             "trigger_interval": 0, "max_offsets_per_trigger": 1000,
             "source_options": {"failOnDataLoss": False}},
            {"topic": "orders", "table": "db.orders", "trigger_interval": "1 minute"},
        ],
    })
    assert config.compaction.topics == ("a", "b") and config.compaction.interval_s == 90
    assert config.retry == RetryPolicy(0.5, 60, 3.0, 3600)
    users, orders = config.views
    assert users.trigger_interval_s is None and users.max_offsets_per_trigger == 1000
    assert users.source_options == {"failOnDataLoss": "false"}
    assert orders.trigger_interval_s == 60 and orders.checkpoint is None


def test_view_paths_are_absolute_and_resolved_as_the_views_log_lines_name_them(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    (tmp_path / "real").mkdir()
    (tmp_path / "link").symlink_to(tmp_path / "real")
    monkeypatch.chdir(tmp_path)
    real = tmp_path.resolve() / "real"
    config = parse_config({"materialize": [
        {"topic": "users", "table": "link/views/../views/users", "checkpoint": "./link/ck/users"},
        {"topic": "orders", "table": "db.orders", "checkpoint": "file:/tmp/../tmp/ck-orders"},
        {"topic": "s3", "table": "s3a://bucket/views/s3", "checkpoint": "s3a://bucket/ck/s3"}]})
    users, orders, s3 = config.views
    assert (users.table, users.checkpoint) == (str(real / "views" / "users"), str(real / "ck" / "users"))
    assert users.name == f"users -> {real / 'views' / 'users'}"  # the scheduler's log lines
    assert (orders.table, orders.checkpoint) == ("db.orders", os.path.realpath("/tmp/ck-orders"))
    assert (s3.table, s3.checkpoint) == ("s3a://bucket/views/s3", "s3a://bucket/ck/s3")
    with pytest.raises(JobsConfigError, match="use the same table"):  # one table, two spellings
        parse_config({"materialize": [{"topic": "a", "table": "link/v"}, {"topic": "b", "table": "./real/v"}]})


@pytest.mark.parametrize("text,seconds", [
    ("500ms", 0.5), ("30s", 30), ("10 seconds", 10), ("5m", 300), ("1 minute", 60), ("2h", 7200),
    ("1d", 86400), (15, 15), (0.25, 0.25),
])
def test_durations(text: object, seconds: float) -> None:
    assert parse_duration_s(text, where="x") == seconds


@pytest.mark.parametrize("doc,message", [
    ({"bootstrp": "h:1"}, r"cfg.toml: unknown key bootstrp; known keys: bootstrap, compaction, "),
    ({"compaction": {"interval": "soon"}}, r'cfg.toml: compaction.interval: expected a duration such as "30s" or "5m", got \'soon\''),
    ({"compaction": {"interval": "-5s"}}, r"compaction.interval: expected a duration"),
    ({"compaction": {"interval": 0}}, r"compaction.interval: must be a positive duration"),
    ({"compaction": {"topics": "some"}}, r'compaction.topics: expected "all" or a non-empty list'),
    ({"compaction": {"topics": []}}, r'compaction.topics: expected "all" or a non-empty list'),
    ({"compaction": {"enabled": "yes"}}, r"compaction.enabled: expected true or false"),
    ({"compaction": {"intervall": "5m"}}, r"\[compaction\]: unknown key intervall; known keys: enabled, interval, topics"),
    ({"retry": {"multiplier": 0.5}}, r"retry.multiplier: expected a number >= 1"),
    ({"retry": {"initial_backoff": "1m", "max_backoff": "10s"}}, r"retry.max_backoff \(10s\) is shorter than"),
    ({"bootstrap": "nohost"}, r"bootstrap: expected host:port, got 'nohost'"),
    ({"materialize": {"topic": "t"}}, r"materialize must be an array of tables"),
    ({"materialize": [{"table": "/x"}]}, r"materialize\[0\].topic is required"),
    ({"materialize": [{"topic": "t"}]}, r"materialize\[0\].table is required"),
    ({"materialize": [{"topic": "t", "table": "/x", "json_schema": "id lng"}]}, r"materialize\[0\].json_schema: .*lng"),
    ({"materialize": [{"topic": "t", "table": "not a name"}]}, r"materialize\[0\].table: table 'not a name' is neither"),
    ({"materialize": [{"topic": "t", "table": "/x", "trigger_interval": "fast"}]}, r"materialize\[0\].trigger_interval"),
    ({"materialize": [{"topic": "t", "table": "/x", "max_offsets_per_trigger": 0}]}, r"max_offsets_per_trigger: expected a positive integer"),
    ({"materialize": [{"topic": "t", "table": "/x", "tabel": "/y"}]}, r"materialize\[0\]: unknown key tabel"),
    ({"materialize": [{"topic": "a", "table": "/x"}, {"topic": "b", "table": "/x"}]},
     r"materialize\[0\] and materialize\[1\] use the same table '/x'"),
    ({"materialize": [{"topic": "a", "table": "/x", "checkpoint": "/c"}, {"topic": "b", "table": "/y", "checkpoint": "/c"}]},
     r"use the same checkpoint '/c'"),
])
def test_config_errors_name_the_file_and_the_key(doc: dict[str, Any], message: str) -> None:
    with pytest.raises(JobsConfigError, match=message):
        parse_config(doc, source="cfg.toml")


def test_unreadable_and_malformed_files(tmp_path: Path) -> None:
    with pytest.raises(JobsConfigError, match=r"missing.toml: cannot read the jobs configuration"):
        load_config(tmp_path / "missing.toml")
    bad = tmp_path / "bad.toml"
    bad.write_text('bootstrap = "h:1"\n[compaction\ninterval = "5m"\n')
    with pytest.raises(JobsConfigError, match=r"bad.toml: not valid TOML: .*line 2"):
        load_config(bad)


def test_cli_reports_config_errors_in_one_line(tmp_path: Path) -> None:
    bad = tmp_path / "jobs.toml"
    bad.write_text('[compaction]\ninterval = "soon"\n')
    result = CliRunner().invoke(schedule_command, ["--config", str(bad), "--once"])
    assert result.exit_code == 1
    assert result.output.strip().splitlines() == [
        f'error: [INVALID_CONFIG] {bad}: compaction.interval: expected a duration such as "30s" or "5m", '
        "got 'soon'"]


# ---------------------------------------------------------------- decisions


def test_backoff_grows_exponentially_and_is_capped() -> None:
    assert [backoff_s(n, POLICY) for n in range(7)] == [0, 10, 20, 40, 80, 100, 100]
    assert backoff_s(10_000, POLICY) == 100  # no overflow


def test_after_failure_and_success() -> None:
    s = after_failure(JobState(), 1000.0, POLICY, "boom")
    assert s == JobState(1, 1010.0, "boom")
    s = after_failure(s, 1010.0, POLICY, "boom again")
    assert (s.failures, s.next_attempt_at) == (2, 1030.0)
    # A job that ran for reset_after before failing starts over.
    s = after_failure(s, 5000.0, POLICY, "late", ran_for_s=300)
    assert (s.failures, s.next_attempt_at) == (1, 5010.0)
    assert after_success(s, 6000.0) == JobState()


def test_compaction_check_due() -> None:
    assert compaction_check_due(None, 0.0, 300)
    assert not compaction_check_due(100.0, 399.0, 300)
    assert compaction_check_due(100.0, 400.0, 300)


def test_topics_due_selects_ready_topics_dirtiest_first() -> None:
    dirty = [DirtyPartition("a", 1, 0.6), DirtyPartition("b", 0, 0.9), DirtyPartition("a", 0, 0.7),
             DirtyPartition("c", 0, 0.99), DirtyPartition("d", 2, 0.8)]
    assert topics_due(dirty, selected=None, states={}, now=0) == [
        ("c", (0,)), ("b", (0,)), ("d", (2,)), ("a", (0, 1))]
    assert topics_due(dirty, selected={"a", "b"}, states={}, now=0) == [("b", (0,)), ("a", (0, 1))]
    backing_off = {"b": JobState(1, 50.0, "x")}
    assert topics_due(dirty, selected={"a", "b"}, states=backing_off, now=49.9) == [("a", (0, 1))]
    assert topics_due(dirty, selected={"a", "b"}, states=backing_off, now=50.0)[0] == ("b", (0,))
    assert topics_due([], selected=None, states={}, now=0) == []


def test_retries_due() -> None:
    pending = {"a": (0,), "b": ()}
    states = {"a": JobState(1, 10.0, "x"), "b": JobState(2, 20.0, "y")}
    assert retries_due(pending, states, 5.0) == []
    assert retries_due(pending, states, 10.0) == [("a", (0,))]
    assert retries_due(pending, states, 25.0) == [("a", (0,)), ("b", ())]


def test_view_action() -> None:
    waiting = JobState(1, 100.0, "x")
    assert view_action(running=True, state=waiting, now=0) == "keep"
    assert view_action(running=False, state=JobState(), now=0) == "failed"
    assert view_action(running=None, state=JobState(), now=0) == "start"
    assert view_action(running=None, state=waiting, now=99) == "wait"
    assert view_action(running=None, state=waiting, now=100) == "start"


# ---------------------------------------------------------------- the loop, with fakes


class FakeClock:
    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


class FakeQuery:
    def __init__(self) -> None:
        self.isActive = True
        self.error: str | None = None
        self.stopped = False

    def exception(self) -> str | None:
        return self.error

    def stop(self) -> None:
        self.stopped = True
        self.isActive = False

    def fail(self, error: str) -> None:
        self.error = error
        self.isActive = False


class Fakes:
    """Planner, compactor and view starter that record calls and fail on demand."""

    def __init__(self) -> None:
        self.dirty: list[DirtyPartition] = []
        self.plan_errors: dict[str, str] = {}
        self.plan_fails: str | None = None
        self.plans: list[Sequence[str] | None] = []
        self.compactions: list[tuple[str, tuple[int, ...]]] = []
        self.compaction_fails: dict[str, str] = {}
        self.started: list[tuple[str, bool]] = []
        self.view_fails: dict[str, str] = {}
        self.queries: dict[str, FakeQuery] = {}

    def plan(self, topics: Sequence[str] | None) -> tuple[list[DirtyPartition], dict[str, str]]:
        self.plans.append(topics)
        if self.plan_fails:
            raise RuntimeError(self.plan_fails)
        return list(self.dirty), dict(self.plan_errors)

    def compact(self, topic: str, partitions: Sequence[int]) -> CompactionOutcome:
        self.compactions.append((topic, tuple(partitions)))
        if topic in self.compaction_fails:
            raise RuntimeError(self.compaction_fails[topic])
        return CompactionOutcome(True, f"p{list(partitions)} compacted")

    def start_view(self, view: ViewConfig, *, available_now: bool) -> FakeQuery:
        self.started.append((view.topic, available_now))
        if view.topic in self.view_fails:
            raise RuntimeError(self.view_fails[view.topic])
        q = FakeQuery()
        if available_now:
            q.isActive = False
        self.queries[view.topic] = q
        return q


def make(config: JobsConfig) -> tuple[Scheduler, Fakes, FakeClock]:
    fakes, clock = Fakes(), FakeClock()
    return Scheduler(config, plan=fakes.plan, compact=fakes.compact, start_view=fakes.start_view,
                     clock=clock), fakes, clock


def config(**kw: Any) -> JobsConfig:
    doc: dict[str, Any] = {"bootstrap": "h:1", "compaction": {"interval": "5m"},
                           "retry": {"initial_backoff": "10s", "max_backoff": "100s", "reset_after": "5m"}}
    doc.update(kw)
    return parse_config(doc)


def test_scheduler_picks_the_right_topics_on_the_interval() -> None:
    s, fakes, clock = make(config(compaction={"interval": "5m", "topics": ["a", "b"]}))
    # The planner's answer may include topics outside the selection: they are left alone.
    fakes.dirty = [DirtyPartition("a", 1, 0.55), DirtyPartition("b", 0, 0.8), DirtyPartition("b", 2, 0.6),
                   DirtyPartition("z", 0, 0.99)]
    records = s.run_round()
    assert fakes.plans == [("a", "b")]
    assert fakes.compactions == [("b", (0, 2)), ("a", (1,))]
    assert [(r.kind, r.name, r.ok) for r in records] == [
        ("plan", "compaction", True), ("compaction", "b[0, 2]", True), ("compaction", "a[1]", True)]
    assert "due: b[0, 2], a[1]" in records[0].detail
    clock.now += 299
    assert s.run_round() == [] and len(fakes.plans) == 1        # not due yet
    clock.now += 1
    fakes.dirty = []
    records = s.run_round()
    assert len(fakes.plans) == 2 and len(fakes.compactions) == 2 and "due: none" in records[0].detail


def test_all_compacted_topics_when_topics_is_all() -> None:
    s, fakes, _ = make(config())
    fakes.dirty = [DirtyPartition("x", 0, 0.7)]
    s.run_round()
    assert fakes.plans == [None] and fakes.compactions == [("x", (0,))]


def test_failed_compaction_backs_off_and_is_retried_before_the_next_interval() -> None:
    s, fakes, clock = make(config())
    fakes.dirty = [DirtyPartition("a", 0, 0.9), DirtyPartition("b", 3, 0.7)]
    fakes.compaction_fails = {"a": "broker went away"}
    records = s.run_round()
    # a failed, b still compacted.
    assert [(r.name, r.ok) for r in records[1:]] == [("a[0]", False), ("b[3]", True)]
    assert "broker went away; retry in 10s (failure 1)" in records[1].detail
    clock.now += 9.9
    assert s.run_round() == []
    clock.now += 0.1
    records = s.run_round()                            # retried at +10 s, without a new plan
    assert [(r.name, r.ok) for r in records] == [("a[0]", False)] and len(fakes.plans) == 1
    assert "retry in 20s (failure 2)" in records[0].detail
    clock.now += 19
    assert s.run_round() == []
    clock.now += 1
    del fakes.compaction_fails["a"]
    records = s.run_round()
    assert [(r.name, r.ok) for r in records] == [("a[0]", True)]
    assert s.pending == {} and s.topic_states["a"] == JobState()
    # At the next interval check, a is treated like any other topic again.
    clock.now = s.last_check_at + 300  # type: ignore[operator]
    s.run_round()
    assert fakes.compactions[-2:] == [("a", (0,)), ("b", (3,))]


def test_backoff_is_capped_for_a_job_that_keeps_failing() -> None:
    s, fakes, clock = make(config())
    fakes.dirty = [DirtyPartition("a", 0, 0.9)]
    fakes.compaction_fails = {"a": "nope"}
    waits = []
    s.run_round()
    for _ in range(6):
        state = s.topic_states["a"]
        waits.append(state.next_attempt_at - clock.now)
        clock.now = state.next_attempt_at
        s.compaction_round()
    assert waits == [10, 20, 40, 80, 100, 100]


def test_planner_errors_per_topic_do_not_stop_the_other_topics() -> None:
    s, fakes, clock = make(config(compaction={"topics": ["gone", "a"]}))
    fakes.dirty = [DirtyPartition("a", 0, 0.9)]
    fakes.plan_errors = {"gone": "UnknownTopicOrPartitionError: topic 'gone' does not exist"}
    records = s.run_round()
    assert [(r.kind, r.name, r.ok) for r in records] == [
        ("plan", "gone", False), ("plan", "compaction", True), ("compaction", "a[0]", True)]
    assert s.pending == {"gone": ()}
    clock.now += 10
    fakes.compaction_fails = {"gone": "topic 'gone' does not exist"}
    records = s.run_round()
    assert [(r.name, r.ok) for r in records] == [("gone", False)]


def test_a_failing_planner_stops_nothing_else() -> None:
    s, fakes, clock = make(config(materialize=[{"topic": "v", "table": "/t/v"}]))
    fakes.plan_fails = "broker unavailable"
    records = s.run_round()
    assert [(r.kind, r.ok) for r in records] == [("plan", False), ("view", True)]
    assert "next check in 10s" in records[0].detail
    clock.now += 5
    assert s.run_round() == [] and len(fakes.plans) == 1   # planner backing off; view keeps running
    clock.now += 5
    fakes.plan_fails = None
    fakes.dirty = [DirtyPartition("a", 0, 0.9)]
    records = s.run_round()
    assert [(r.kind, r.ok) for r in records] == [("plan", True), ("compaction", True)]


def test_failing_views_restart_with_backoff_and_never_stop_compaction() -> None:
    s, fakes, clock = make(config(materialize=[{"topic": "bad", "table": "/t/bad"},
                                               {"topic": "good", "table": "/t/good"}]))
    fakes.dirty = [DirtyPartition("a", 0, 0.9)]
    fakes.view_fails = {"bad": "MaterializeConfigError: topic 'bad' does not exist"}
    records = s.run_round()
    assert [(r.kind, r.name, r.ok) for r in records] == [
        ("plan", "compaction", True), ("compaction", "a[0]", True),
        ("view", "bad -> /t/bad", False), ("view", "good -> /t/good", True)]
    assert "restart" not in records[2].detail and "retry in 10s (failure 1)" in records[2].detail
    clock.now += 9
    assert s.run_round() == []
    clock.now += 1
    records = s.run_round()
    assert [(r.name, r.ok) for r in records] == [("bad -> /t/bad", False)]
    assert "failure 2" in records[0].detail
    # The good view dies 60 s after it started: restart after the initial backoff
    # (meanwhile bad's 20 s are over: it fails a third time).
    clock.now += 50
    fakes.queries["good"].fail("StreamingQueryException: broker gone")
    records = s.run_round()
    assert [(r.name, r.ok) for r in records] == [("bad -> /t/bad", False), ("good -> /t/good", False)]
    assert "retry in 40s (failure 3)" in records[0].detail
    assert records[1].detail == "StreamingQueryException: broker gone; restart in 10s (failure 1)"
    assert records[1].duration_s == 60
    clock.now += 10
    del fakes.view_fails["bad"]
    fakes.dirty = [DirtyPartition("a", 0, 0.9)]
    clock.now = s.last_check_at + 300  # type: ignore[operator]
    records = s.run_round()
    assert [(r.kind, r.name, r.ok) for r in records] == [
        ("plan", "compaction", True), ("compaction", "a[0]", True),
        ("view", "bad -> /t/bad", True), ("view", "good -> /t/good", True)]
    # A view that ran longer than reset_after before dying starts its backoff over.
    s.views["good -> /t/good"].state = JobState(4, 0.0, "old")
    clock.now += 301
    fakes.queries["good"].fail("late failure")
    records = s.supervise_views()
    assert [r.name for r in records] == ["good -> /t/good"]
    assert records[0].detail == "late failure; restart in 10s (failure 1)"


def test_once_runs_a_check_and_catches_views_up() -> None:
    s, fakes, _ = make(config(materialize=[{"topic": "v1", "table": "/t/1"}, {"topic": "v2", "table": "/t/2"}]))
    s.last_check_at = s._clock()  # a check just happened: --once checks anyway
    fakes.dirty = [DirtyPartition("a", 0, 0.9)]
    fakes.view_fails = {"v1": "boom"}
    records = s.run_round(once=True)
    assert [(r.kind, r.ok) for r in records] == [("plan", True), ("compaction", True), ("view", False), ("view", True)]
    assert fakes.started == [("v1", True), ("v2", True)]
    assert records[-1].detail == "caught up"


def test_run_forever_stops_the_views_when_asked() -> None:
    s, fakes, _ = make(config(materialize=[{"topic": "v", "table": "/t/v"}]))
    stop = threading.Event()
    original = s.run_round

    def round_then_stop(**kw: Any) -> Any:
        out = original(**kw)
        stop.set()
        return out

    s.run_round = round_then_stop  # type: ignore[method-assign]
    t = threading.Thread(target=s.run_forever, args=(stop,))
    t.start()
    t.join(timeout=10)
    assert not t.is_alive()
    assert fakes.queries["v"].stopped
    assert s.views["v -> /t/v"].query is None


def test_compaction_disabled_never_plans() -> None:
    s, fakes, _ = make(config(compaction={"enabled": False}))
    assert s.run_round(once=True) == [] and fakes.plans == []


def test_sizes_in_compaction_lines_stay_readable_for_small_topics() -> None:
    from logstore.byte_sizes import human_bytes

    assert [human_bytes(n) for n in (0, 1023, 1024, 1536, 1_200_000, 3_400_000_000, 5 << 40)] == [
        "0 B", "1023 B", "1.0 KiB", "1.5 KiB", "1.1 MiB", "3.2 GiB", "5.0 TiB"]
