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
  the latest value per key of ``T`` (:mod:`jobs.materialize`).
* ``logstore jobs schedule --config conf/jobs.toml [--once]`` — compaction on
  an interval and materialized views kept running (:mod:`jobs.scheduler`).

Thread-safety: meant for the CLI's main thread.
"""

from __future__ import annotations

import logging
import sys

import click

from logstore.cli.common import bootstrap_option, cli_errors, format_option, print_json, print_table

__all__ = ["jobs", "main"]


@click.group(name="jobs")
def jobs() -> None:
    """Spark jobs over the log (compaction, materialization, scheduling)."""


# The name the entry-point example of logstore.cli.plugins uses.
main = jobs


def _progress_to_stderr() -> None:
    """Show the compaction's progress lines (logger ``logstore.compaction``) on stderr."""
    logger = logging.getLogger("logstore.compaction")
    if any(getattr(h, "_jobs_cli", False) for h in logger.handlers):
        return
    handler = logging.StreamHandler(sys.stderr)
    handler.setFormatter(logging.Formatter("%(asctime)s %(message)s", "%H:%M:%S"))
    handler._jobs_cli = True  # type: ignore[attr-defined]
    logger.addHandler(handler)
    logger.setLevel(logging.INFO)
    logger.propagate = False


@jobs.command("compact")
@bootstrap_option
@click.option("--topic", required=True, help="The topic to compact (its cleanup.policy must include compact).")
@click.option("--partition", "partitions", type=int, multiple=True, help="Only this partition (repeatable).")
@click.option("--force", is_flag=True,
              help="Also compact partitions whose dirty ratio is below min.cleanable.dirty.ratio.")
@click.option("--master", default="local[2]", show_default=True, help="Spark master.")
@format_option()
@cli_errors
def compact(bootstrap: str, topic: str, partitions: tuple[int, ...], force: bool, master: str,
            output_format: str) -> None:
    """Compact TOPIC: keep the latest record per key, drop expired tombstones."""
    from compaction.job import run_compaction
    from jobs.spark_session import local_session

    _progress_to_stderr()
    spark = local_session(f"logstore-compact-{topic}", master=master)
    summary = run_compaction(spark, bootstrap=bootstrap, topic=topic,
                             partitions=list(partitions) or None, force=force)
    if output_format == "json":
        print_json(summary.to_dict())
    else:
        print_table(
            f"compaction of {topic!r} in {summary.duration_s:.1f} s (Spark key scan {summary.scan_s:.1f} s)",
            ["partition", "segments", "MB before", "MB after", "records", "removed", "seconds", "result"],
            [
                [r.partition, f"{r.segments_before}->{r.segments_after}", f"{r.bytes_before / 1e6:.1f}",
                 f"{r.bytes_after / 1e6:.1f}", r.records_before, r.records_removed, f"{r.duration_s:.1f}",
                 "ok" if r.error is None else f"{'retry later' if r.retriable else 'FAILED'}: {r.error}"]
                for r in summary.partitions
            ] + [[s.partition, "-", "-", "-", "-", "-", "-", f"skipped: {s.reason}"] for s in summary.skipped],
            numeric=["partition", "MB before", "MB after", "records", "removed", "seconds"],
        )
    if not summary.ok:
        raise SystemExit(1)


# Defined with their jobs; they start Spark only when run.
from jobs.materialize import materialize_command  # noqa: E402
from jobs.scheduler import schedule_command  # noqa: E402

jobs.add_command(materialize_command)
jobs.add_command(schedule_command)
