"""The ``logstore jobs`` commands: Spark jobs over the log.

Registered with ``logstore`` through the ``logstore.cli`` entry-point group
(``jobs = "jobs.cli:jobs"`` in ``pyproject.toml``) and loaded only when used,
so ``logstore``'s own verbs never import Spark. Verbs:

* ``logstore jobs compact --topic T [--partition N ...] [--force]`` — compact
  the partitions of ``T`` whose dirty ratio reaches ``min.cleanable.dirty.ratio``
  (every partition with cleanable segments with ``--force``) with
  :func:`compaction.job.run_compaction` on a local SparkSession; progress on
  stderr, the summary on stdout (``--format json`` for scripts). Exit code 0
  when every planned partition was compacted, 1 otherwise (the summary says
  which failed and whether a later run will retry it).

* ``logstore jobs materialize --topic T --table PATH_OR_NAME [--available-now]
  [--checkpoint DIR] [--parse-json-values DDL]`` — keep a Delta table equal to
  the latest value per key of ``T`` (:func:`jobs.materialize.materialize`);
  runs until SIGTERM or Ctrl-C, or with ``--available-now`` until it caught
  up (a bar of offsets read on a terminal, then one result line).

Every verb takes ``spark-submit``'s options for where Spark runs:
``--master`` (default ``local[2]``; ``spark://HOST:7077`` for a standalone
cluster), ``--executor-memory``, ``--executor-cores``,
``--total-executor-cores`` and ``--conf KEY=VALUE`` (:mod:`jobs.spark_options`).

Ctrl-C stops the query, then Spark, and prints one line (exit 130; SIGTERM:
exit 0), with no py4j traceback (:mod:`jobs.interrupts`); on ``compact`` it
cancels the Spark key scan. What Spark and the JVM print is kept to errors
(:mod:`jobs.spark_session`).
* ``logstore jobs schedule --config conf/jobs.toml [--once]`` — compaction on
  an interval and materialized views kept running (:mod:`jobs.scheduler`,
  configured by :mod:`jobs.scheduler_config`).

The same commands run without the ``logstore`` command as ``python -m jobs.cli
VERB ...``. This module only holds the commands: the jobs themselves are
libraries that never import the CLI, imported here when a command runs, so
``logstore jobs --help`` starts no JVM. The jobs' progress lines (loggers
``logstore.jobs`` and ``logstore.compaction``) go to stderr.

Thread-safety: meant for the CLI's main thread.
"""

from __future__ import annotations

import contextlib
import dataclasses
import json
import logging
import signal
import sys
import threading
from collections.abc import Sequence
from typing import Any, NoReturn

import click

from jobs.interrupts import Interrupts
from jobs.progress import CurrentStderr
from jobs.spark_options import spark_conf as session_conf
from jobs.spark_options import spark_options
from logstore.cli_api import (
    CliError,
    bootstrap_option,
    cli_errors,
    cli_security,
    format_option,
    print_json,
    print_table,
)
from logstore.errors import LogstoreError

__all__ = ["jobs", "compact", "materialize_command", "schedule_command"]


@click.group(name="jobs")
def jobs() -> None:
    """Spark jobs over the log (compaction, materialization, scheduling)."""


# The jobs' own loggers: the commands' lines read as the jobs' lines.
_materialize_log = logging.getLogger("logstore.jobs.materialize")
_scheduler_log = logging.getLogger("logstore.jobs.scheduler")


def _progress_to_stderr() -> None:
    """Show the compaction's progress lines (logger ``logstore.compaction``) on stderr."""
    logger = logging.getLogger("logstore.compaction")
    if any(getattr(h, "_jobs_cli", False) for h in logger.handlers):
        return
    handler = logging.StreamHandler(CurrentStderr())
    handler.setFormatter(logging.Formatter("%(asctime)s %(message)s", "%H:%M:%S"))
    handler._jobs_cli = True  # type: ignore[attr-defined]
    logger.addHandler(handler)
    logger.setLevel(logging.INFO)
    logger.propagate = False


def first_line(error: BaseException) -> str:
    """The first line of an error's text (Spark's errors carry long JVM traces)."""
    return (str(error).strip().splitlines() or [type(error).__name__])[0][:500]


def configure_job_logging() -> None:
    """INFO lines of the ``logstore.jobs`` loggers on stderr (one handler, added once).

    The jobs' lines (one per batch or run) are their progress report, so they
    get their own handler rather than the CLI's rate-limited warning handler.
    """
    logger = logging.getLogger("logstore.jobs")
    if any(getattr(h, "_logstore_jobs", False) for h in logger.handlers):
        return
    handler = logging.StreamHandler(CurrentStderr())
    handler.setFormatter(logging.Formatter("%(asctime)s %(levelname)s %(name)s: %(message)s"))
    handler._logstore_jobs = True  # type: ignore[attr-defined]
    logger.addHandler(handler)
    logger.setLevel(logging.INFO)
    logger.propagate = False


@jobs.command("compact")
@bootstrap_option
@click.option("--topic", required=True, help="The topic to compact (its cleanup.policy must include compact).")
@click.option("--partition", "partitions", type=int, multiple=True, help="Only this partition (repeatable).")
@click.option("--force", is_flag=True,
              help="Also compact partitions whose dirty ratio is below min.cleanable.dirty.ratio.")
@spark_options()
@format_option()
@cli_errors
def compact(bootstrap: str, topic: str, partitions: tuple[int, ...], force: bool, master: str,
            executor_memory: str | None, executor_cores: int | None, total_executor_cores: int | None,
            spark_conf: dict[str, str], output_format: str) -> None:
    """Compact TOPIC: keep the latest record per key, drop expired tombstones."""
    security = cli_security()  # --command-config / LOGSTORE_*: the driver's and the executors'
    from compaction.job import run_compaction
    from jobs.progress import CompactionBars, bars_wanted
    from jobs.spark_session import local_session
    from logstore.byte_sizes import human_bytes

    _progress_to_stderr()
    spark_ref: list[Any] = []
    finished = threading.Event()

    def cancel() -> None:
        """On Ctrl-C: end the key scan's Spark job, so run_compaction returns (its partitions
        unchanged). Repeated: a job not yet submitted when the signal came is not cancelled."""
        while spark_ref and not finished.wait(0.5):
            spark_ref[0].sparkContext.cancelAllJobs()

    interrupts = Interrupts(on_first=cancel)
    interrupts.install()
    try:
        spark = local_session(f"logstore-compact-{topic}", master=master, conf=session_conf(
            executor_memory=executor_memory, executor_cores=executor_cores,
            total_executor_cores=total_executor_cores, conf=spark_conf))
        spark_ref.append(spark)
        interrupts.install()  # the SparkContext installed its own SIGINT handler
        if interrupts.requested:
            _interrupted(f"compaction of {topic} not started", interrupts)
        bars = CompactionBars(topic) if bars_wanted() else None
        with bars or contextlib.nullcontext():
            try:
                summary = run_compaction(spark, bootstrap=bootstrap, topic=topic,
                                         partitions=list(partitions) or None, force=force, listener=bars,
                                         security=security)
            finally:
                finished.set()
        if interrupts.requested:
            _interrupted(f"compaction of {topic} stopped ({len(summary.compacted)} partition(s) done); "
                         "nothing half-done is kept, rerun to compact the rest", interrupts)
    finally:
        interrupts.restore()
    if output_format == "json":
        print_json(summary.to_dict())
    else:
        print_table(
            f"compaction of {topic!r} in {summary.duration_s:.1f} s (Spark key scan {summary.scan_s:.1f} s)",
            ["partition", "segments", "size before", "size after", "records", "removed", "seconds", "result"],
            [
                [r.partition, f"{r.segments_before}->{r.segments_after}", human_bytes(r.bytes_before),
                 human_bytes(r.bytes_after), r.records_before, r.records_removed, f"{r.duration_s:.1f}",
                 "ok" if r.error is None else f"{'retry later' if r.retriable else 'FAILED'}: {r.error}"]
                for r in summary.partitions
            ] + [[s.partition, "-", "-", "-", "-", "-", "-", f"skipped: {s.reason}"] for s in summary.skipped],
            numeric=["partition", "size before", "size after", "records", "removed", "seconds"],
        )
    if not summary.ok:
        raise SystemExit(1)


# --------------------------------------------------------------------------- materialize


def _json_schema_param(ctx: click.Context, param: click.Parameter, value: str | None) -> str | None:
    if value is None:
        return None
    try:
        # Parse without Spark (no JVM yet): only the text's validity and names.
        from logstore.schema_text import parse_schema

        arrow = parse_schema(value)
        from jobs.materialize import check_value_names

        check_value_names(arrow.names, what="--parse-json-values")
    except LogstoreError as e:
        raise click.BadParameter(e.message) from None
    return value  # parsed again by materialize() once Spark runs


def _source_option(ctx: click.Context, param: click.Parameter, values: Sequence[str]) -> dict[str, str]:
    out = {}
    for item in values:
        if "=" not in item:
            raise click.BadParameter(f"{item!r} is not KEY=VALUE")
        k, v = item.split("=", 1)
        out[k.strip()] = v.strip()
    return out


@jobs.command("materialize")
@click.option("--topic", required=True, help="Topic to materialize.")
@click.option("--table", required=True, help="Delta table: a path (contains /) or a table name.")
@click.option("--checkpoint", default=None,
              help="Checkpoint directory (default: _logstore_checkpoint inside the table's directory).")
@bootstrap_option
@click.option("--available-now", is_flag=True, help="Catch up with the topic, then exit.")
@click.option("--parse-json-values", "json_schema", default=None, callback=_json_schema_param,
              metavar="DDL", help="Parse JSON values into these columns, e.g. 'id long, name string'.")
@click.option("--trigger-interval", default=None, metavar="INTERVAL",
              help="Start a batch at most this often, e.g. '10 seconds'.")
@click.option("--max-offsets-per-trigger", type=click.IntRange(min=1), default=None,
              help="At most this many records per batch.")
@click.option("--option", "source_options", multiple=True, callback=_source_option, metavar="KEY=VALUE",
              help="Further option of the logstore source (repeatable), e.g. failOnDataLoss=false.")
@spark_options()
@cli_errors
def materialize_command(topic: str, table: str, checkpoint: str | None, bootstrap: str,
                        available_now: bool, json_schema: str | None, trigger_interval: str | None,
                        max_offsets_per_trigger: int | None, source_options: dict[str, str],
                        master: str, executor_memory: str | None, executor_cores: int | None,
                        total_executor_cores: int | None, spark_conf: dict[str, str]) -> None:
    """Keep a Delta table equal to the latest value per key of a topic (tombstones delete)."""
    security = cli_security()  # --command-config / LOGSTORE_*: options of the logstore source
    if security is not None:
        source_options = {**security.prefixed_options(), **source_options}
    from pyspark.errors import PySparkException, StreamingQueryException

    from jobs.materialize import materialize, table_ref
    from jobs.spark_session import local_session

    configure_job_logging()
    if available_now and trigger_interval:
        raise click.UsageError("--available-now and --trigger-interval exclude each other")
    interrupts = Interrupts().install()
    try:
        spark = local_session(f"logstore-materialize-{topic}", master=master, delta=True, conf=session_conf(
            executor_memory=executor_memory, executor_cores=executor_cores,
            total_executor_cores=total_executor_cores, conf=spark_conf))
    except BaseException:
        interrupts.restore()
        raise
    interrupts.install()  # the SparkContext installed its own SIGINT handler
    query = None
    try:
        if interrupts.requested:
            _interrupted(f"the view of {topic} did not start", interrupts)
        query = materialize(
            spark, bootstrap=bootstrap, topic=topic, table=table, checkpoint=checkpoint,
            available_now=available_now, json_schema=json_schema,
            trigger_interval=trigger_interval, max_offsets_per_trigger=max_offsets_per_trigger,
            source_options=source_options, wait=False,
        )
        _follow(query, interrupts, topic=topic, bar=available_now)
        if interrupts.requested:
            query.stop()
            # Read after stop: a batch's progress is posted after its commit, which may be
            # after its foreachBatch logged (a batch not committed is replayed by a rerun).
            batch = (query.lastProgress or {}).get("batchId")
            query = None
            _interrupted(f"stopped the view of {topic}"
                         + (f" after batch {batch}" if batch is not None else " before a batch completed")
                         + "; rerun resumes from its checkpoint", interrupts)
        error = query.exception()
        if error is not None:
            raise CliError(f"the view of {topic} in {table_ref(table).value} failed: {first_line(error)}")
        if available_now:
            _materialize_log.info("%s", _caught_up(query, topic=topic, table=table_ref(table).value))
    except (StreamingQueryException, PySparkException) as e:
        raise CliError(f"the view of {topic} in {table_ref(table).value} failed: {first_line(e)}") from None
    finally:
        if query is not None and query.isActive:
            query.stop()
        spark.stop()
        interrupts.restore()


def _follow(query: Any, interrupts: Interrupts, *, topic: str, bar: bool) -> None:
    """Wait until ``query`` ends or a signal asks to stop; with ``bar``, draw its catch-up."""
    from jobs.progress import CatchUpBar, bars_wanted

    catch_up = CatchUpBar(topic) if bar and bars_wanted() else None
    with catch_up or contextlib.nullcontext():
        while query.isActive and not interrupts.requested:
            query.awaitTermination(0.5)
            if catch_up is not None:
                catch_up.update(query.lastProgress)


def _caught_up(query: Any, *, topic: str, table: str) -> str:
    """The result line of ``--available-now``: batches run and the offsets the view reached."""
    progress = [p for p in query.recentProgress if p.get("numInputRows", 0) > 0]
    last = query.lastProgress or {}
    sources = last.get("sources") or [{}]
    end = sources[0].get("endOffset") or {}
    if isinstance(end, str):
        end = json.loads(end)
    offsets = {int(p): int(o) for p, o in (end.get(topic) or {}).items()}
    return (f"view {table} of {topic} caught up: {len(progress)} batch(es) with records, "
            f"next offsets {dict(sorted(offsets.items()))}")


def _interrupted(what: str, interrupts: Interrupts) -> NoReturn:
    """Print the one line of an interrupted job and exit (130 after Ctrl-C, 0 after SIGTERM)."""
    name = "interrupted" if interrupts.exit_code else "terminated"
    print(f"{name}: {what}", file=sys.stderr, flush=True)
    raise SystemExit(interrupts.exit_code)


# --------------------------------------------------------------------------- schedule


@jobs.command("schedule")
@click.option("--config", "config_path", default="conf/jobs.toml", show_default=True,
              type=click.Path(dir_okay=False), help="The jobs configuration (TOML).")
@click.option("--once", is_flag=True, help="Run one round (compaction check, views caught up) and exit.")
@bootstrap_option
@spark_options(master_default=None)
@cli_errors
def schedule_command(config_path: str, once: bool, bootstrap: str, master: str | None,
                     executor_memory: str | None, executor_cores: int | None,
                     total_executor_cores: int | None, spark_conf: dict[str, str]) -> None:
    """Compact dirty compacted topics on an interval and keep the materialized views running."""
    security = cli_security()  # --command-config / LOGSTORE_*: every job the scheduler starts
    from jobs.scheduler import Scheduler, spark_jobs
    from jobs.scheduler_config import load_config
    from jobs.spark_session import local_session

    config = load_config(config_path)
    ctx = click.get_current_context()
    if ctx.get_parameter_source("bootstrap") is not click.core.ParameterSource.DEFAULT:
        config = dataclasses.replace(config, bootstrap=bootstrap)
    configure_job_logging()
    _scheduler_log.info(
        "scheduler: %s, bootstrap %s, compaction %s, %d view(s)%s", config.source, config.bootstrap,
        (f"every {config.compaction.interval_s:g}s of "
         + ("all compacted topics" if config.compaction.topics is None
            else ", ".join(config.compaction.topics))) if config.compaction.enabled else "off",
        len(config.views), " (once)" if once else "")
    # The command line's Spark options win over the config file's [spark] table.
    conf = {**config.spark.conf, **session_conf(
        executor_memory=executor_memory, executor_cores=executor_cores,
        total_executor_cores=total_executor_cores, conf=spark_conf)}
    spark = local_session(config.spark.app_name, master=master or config.spark.master, delta=True, conf=conf)
    try:
        plan, compact_topic, start_view = spark_jobs(spark, config, security)
        scheduler = Scheduler(config, plan=plan, compact=compact_topic, start_view=start_view)
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
            _scheduler_log.info("scheduler: signal %d, stopping (again to exit at once)", signum)
            stop.set()

        previous = {s: signal.signal(s, on_signal) for s in (signal.SIGTERM, signal.SIGINT)}
        try:
            scheduler.run_forever(stop)
        finally:
            for s, handler in previous.items():
                signal.signal(s, handler)
        _scheduler_log.info("scheduler: stopped")
    finally:
        spark.stop()


if __name__ == "__main__":
    jobs(prog_name="python -m jobs.cli")
