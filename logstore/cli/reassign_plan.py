"""``logstore partitions reassign``: the plan (a Kafka JSON file or ``--to-brokers``), starting,
verifying, cancelling and watching a move. Registered on ``logstore partitions``
(:mod:`logstore.cli.partitions` documents the command).

Thread-safety: a command-line entry point.
"""

from __future__ import annotations

import json
import re
import sys
import time
from pathlib import Path

import click

from logstore.cli.common import CliError, bootstrap_option, cli_errors, console
from logstore.cli_api.security_options import cli_security
from logstore.client.admin import Admin
from logstore.client.reassignments import PartitionReassignment
from logstore.types import TopicPartition
from replication.placement import assign_replicas
from replication.state import BrokerRegistration

__all__ = ["reassign", "parse_rate", "load_plan"]

_UNITS = {"": 1, "b": 1, "kb": 10**3, "mb": 10**6, "gb": 10**9, "kib": 2**10, "mib": 2**20, "gib": 2**30}
_POLL_S = 0.5


def parse_rate(text: str) -> int:
    """``10MB`` -> 10,000,000 bytes/s (``KB``/``MB``/``GB`` decimal, ``KiB``/``MiB``/``GiB`` binary,
    an optional ``/s``); plain digits are bytes/s."""
    m = re.fullmatch(r"\s*(\d+(?:\.\d+)?)\s*([kmg]i?b|b)?\s*(?:/s)?\s*", text.strip(), re.IGNORECASE)
    if not m:
        raise CliError(f"--throttle {text!r}: give bytes per second, e.g. 10MB or 512KiB", code="INVALID_REQUEST")
    return int(float(m.group(1)) * _UNITS[(m.group(2) or "").lower()])


def load_plan(path: str) -> dict[TopicPartition, list[int]]:
    """A Kafka reassignment JSON file as {partition: target replicas}."""
    try:
        doc = json.loads(Path(path).read_text())
        plan = {TopicPartition(str(p["topic"]), int(p["partition"])): [int(r) for r in p["replicas"]]
                for p in doc["partitions"]}
    except (ValueError, KeyError, TypeError) as e:
        raise CliError(f"{path}: not a reassignment plan ({{\"version\": 1, \"partitions\": [{{\"topic\": ..., "
                       f"\"partition\": ..., \"replicas\": [...]}}]}}): {e}", code="INVALID_REQUEST") from None
    if not plan:
        raise CliError(f"{path}: the plan names no partition", code="INVALID_REQUEST")
    return plan


def _topic_plan(admin: Admin, topic: str, brokers: list[int], rf: int | None) -> dict[TopicPartition, list[int]]:
    desc = admin.describe_topics([topic])[topic]
    factor = rf or max(len(p.replicas) for p in desc.partitions)
    regs = [BrokerRegistration(b, "", 0) for b in brokers]
    spread = assign_replicas(len(desc.partitions), factor, regs, start=0)
    return {TopicPartition(topic, p): spread[p] for p in sorted(spread)}


def _line(tp: TopicPartition, r: PartitionReassignment) -> str:
    progress = "progress unknown" if r.bytes_total < 0 else (
        f"{r.bytes_copied:,}/{r.bytes_total:,} bytes ({r.fraction:.0%})")
    return (f"{tp}: moving {list(r.replicas)} -> {list(r.target)} (adding {list(r.adding)}, "
            f"removing {list(r.removing)}), {progress}")


def _wait(admin: Admin, plan: dict[TopicPartition, list[int]], timeout_s: float) -> None:
    """Poll the moves of the plan's partitions until none runs; a progress bar on a terminal."""
    topics = sorted({tp.topic for tp in plan})
    deadline = time.monotonic() + timeout_s
    if sys.stdout.isatty():
        from rich.progress import BarColumn, Progress, TextColumn, TimeElapsedColumn

        with Progress(TextColumn("{task.description}"), BarColumn(), TextColumn("{task.percentage:>3.0f}%"),
                      TimeElapsedColumn(), console=console()) as bar:
            task = bar.add_task(f"moving {len(plan)} partition(s)", total=len(plan))
            while (running := _running(admin, topics, plan)) and time.monotonic() < deadline:
                bar.update(task, completed=len(plan) - len(running) + sum(r.fraction for r in running.values()))
                time.sleep(_POLL_S)
            bar.update(task, completed=len(plan) - len(running))
    else:
        seen: dict[TopicPartition, int] = {}
        while (running := _running(admin, topics, plan)) and time.monotonic() < deadline:
            for tp, r in running.items():
                pct = int(r.fraction * 10)
                if seen.get(tp) != pct:
                    seen[tp] = pct
                    click.echo(_line(tp, r))
            time.sleep(_POLL_S)
    if running:
        raise CliError(f"{len(running)} partition(s) still moving after {timeout_s:g} s; "
                       "check with --verify", code="REQUEST_TIMED_OUT")
    click.echo(f"reassignment of {len(plan)} partition(s) complete")


def _running(admin: Admin, topics: list[str], plan: dict[TopicPartition, list[int]],
             ) -> dict[TopicPartition, PartitionReassignment]:
    return {tp: r for tp, r in admin.list_partition_reassignments(topics).items() if tp in plan}


@click.command("reassign")
@click.option("--plan", "plan_file", type=click.Path(exists=True, dir_okay=False),
              help="Kafka's reassignment JSON: {\"version\":1,\"partitions\":[{\"topic\":..,\"partition\":..,"
                   "\"replicas\":[..]}]}.")
@click.option("--topic", help="With --to-brokers: move every partition of this topic.")
@click.option("--to-brokers", help="Comma-separated broker ids to spread --topic over evenly.")
@click.option("--replication-factor", type=click.IntRange(min=1), help="With --to-brokers (default: kept).")
@click.option("--throttle", help="Copy at most this many bytes/s per new replica while moving (e.g. 10MB).")
@click.option("--verify", is_flag=True, help="Print the moves' progress; exit 0 when done, 1 while running.")
@click.option("--cancel", is_flag=True, help="Put the partitions back on their old replicas.")
@click.option("--no-wait", is_flag=True, help="Return once the move has started.")
@click.option("--timeout", "timeout_s", type=float, default=3600.0, show_default=True,
              help="How long to wait for the move, in seconds.")
@bootstrap_option
@cli_errors
def reassign(plan_file: str | None, topic: str | None, to_brokers: str | None, replication_factor: int | None,
             throttle: str | None, verify: bool, cancel: bool, no_wait: bool, timeout_s: float,
             bootstrap: str) -> None:
    """Move partitions onto other brokers: add the new replicas, let them catch up, move leadership,
    drop the old replicas."""
    if (plan_file is None) == (topic is None):
        raise CliError("give --plan FILE or --topic T (with --to-brokers, unless --verify or --cancel)",
                       code="INVALID_REQUEST")
    rate = parse_rate(throttle) if throttle else 0
    with Admin(bootstrap, security=cli_security()) as admin:
        if plan_file is not None:
            plan = load_plan(plan_file)
        elif to_brokers:
            try:
                brokers = sorted({int(b) for b in to_brokers.split(",") if b.strip()})
            except ValueError:
                raise CliError(f"--to-brokers {to_brokers!r}: give broker ids like 2,3,4",
                               code="INVALID_REQUEST") from None
            assert topic is not None
            plan = _topic_plan(admin, topic, brokers, replication_factor)
        elif verify or cancel:
            assert topic is not None
            desc = admin.describe_topics([topic])[topic]
            plan = {TopicPartition(topic, p.partition): [] for p in desc.partitions}
        else:
            raise CliError("--topic needs --to-brokers (or --verify / --cancel)", code="INVALID_REQUEST")
        if verify:
            running = _running(admin, sorted({tp.topic for tp in plan}), plan)
            for tp, r in running.items():
                click.echo(_line(tp, r))
            click.echo(f"{len(running)} of {len(plan)} partition(s) still moving" if running
                       else f"reassignment of {len(plan)} partition(s) complete")
            sys.exit(1 if running else 0)
        if cancel:
            running = _running(admin, sorted({tp.topic for tp in plan}), plan)
            if not running:
                raise CliError("none of the partitions is being reassigned", code="NO_REASSIGNMENT_IN_PROGRESS")
            admin.alter_partition_reassignments(dict.fromkeys(running))
            click.echo(f"cancelled the reassignment of {len(running)} partition(s)")
            return
        admin.alter_partition_reassignments(plan, throttle_bytes_per_sec=rate)
        click.echo(f"started the reassignment of {len(plan)} partition(s)"
                   + (f", throttled to {rate:,} bytes/s" if rate else ""))
        if not no_wait:
            _wait(admin, plan, timeout_s)
