"""``logstore groups list|describe|reset-offsets|delete``: consumer group administration.

list
    Every group: state (Empty, Reconciling, Stable), members, assignor.
describe GROUP
    The group's state and epochs, its members (instance id, client, host,
    epoch, owned partitions, partitions being revoked) and, per partition of
    the topics it reads, the committed offset, the log end (high-water mark),
    the lag between them and the member that owns it.
reset-offsets GROUP --topic T ... (--to-earliest | --to-latest | --to-offset N | --to-datetime TIME | --shift-by N)
    Plans new committed offsets and, like Kafka's tool, only shows the plan
    (previous and new offset per partition) unless ``--execute`` is given;
    ``--dry-run`` says so explicitly. Executing is refused while the group has
    active members (as Kafka's tool).
    ``--topic T`` takes every partition of T, ``--topic T:0,2`` only those;
    ``--all-topics`` every topic the group has committed offsets for.
delete GROUP ...
    Deletes empty groups and their committed offsets.

Every command goes through :class:`logstore.Admin`; failures are one line,
``error: [CODE] message`` (e.g. ``NON_EMPTY_GROUP``, ``GROUP_ID_NOT_FOUND``).
"""

from __future__ import annotations

from typing import Any

import click

from logstore.cli.common import (
    CliError,
    bootstrap_option,
    cli_errors,
    console,
    format_option,
    iso_ms,
    parse_time,
    print_json,
    print_table,
)
from logstore.cli_api.security_options import cli_security
from logstore.client.admin import Admin
from logstore.types import GroupDescription, PartitionLag, TopicPartition

__all__ = ["groups"]


def _tps_text(tps: frozenset[TopicPartition]) -> str:
    by_topic: dict[str, list[int]] = {}
    for tp in sorted(tps):
        by_topic.setdefault(tp.topic, []).append(tp.partition)
    return " ".join(f"{t}:{','.join(map(str, ps))}" for t, ps in by_topic.items()) or "-"


@click.group()
def groups() -> None:
    """List, describe, reset the offsets of, and delete consumer groups."""


@groups.command("list")
@format_option()
@bootstrap_option
@cli_errors
def list_(output_format: str, bootstrap: str) -> None:
    """List consumer groups."""
    with Admin(bootstrap, security=cli_security()) as admin:
        found = admin.list_groups()
    docs = [{"group": g.group_id, "state": g.state, "members": g.members, "assignor": g.assignor} for g in found]
    if output_format == "json":
        print_json(docs)
        return
    if not docs:
        click.echo("no consumer groups")
        return
    print_table(None, ("group", "state", "members", "assignor"),
                ((d["group"], d["state"], d["members"], d["assignor"]) for d in docs), numeric=("members",))


def _describe_doc(desc: GroupDescription, lag: list[PartitionLag]) -> dict[str, Any]:
    return {
        "group": desc.group_id, "state": desc.state, "group_epoch": desc.group_epoch,
        "assignment_epoch": desc.assignment_epoch, "assignor": desc.assignor,
        "members": [{
            "member_id": m.member_id, "instance_id": m.instance_id or None, "client_id": m.client_id,
            "host": m.client_host, "member_epoch": m.member_epoch, "topics": list(m.subscribed_topics),
            "assignment": [[tp.topic, tp.partition] for tp in sorted(m.assignment)],
            "pending_revocation": [[tp.topic, tp.partition] for tp in sorted(m.pending_revocation)],
            "left": m.left,
        } for m in desc.members],
        "partitions": [{
            "topic": r.topic, "partition": r.partition, "committed_offset": r.committed_offset,
            "log_end_offset": r.log_end_offset, "lag": r.lag, "member_id": r.member_id,
            "commit_time": (iso_ms(c.commit_timestamp_ms)
                            if (c := desc.offsets.get(r.topic_partition)) is not None and c.commit_timestamp_ms >= 0
                            else None),
        } for r in lag],
        "total_lag": sum(r.lag for r in lag if r.lag is not None),
    }


@groups.command("describe")
@click.argument("group")
@format_option()
@bootstrap_option
@cli_errors
def describe(group: str, output_format: str, bootstrap: str) -> None:
    """Show GROUP's members, assignment, committed offsets, log ends and lag per partition."""
    with Admin(bootstrap, security=cli_security()) as admin:
        desc = admin.describe_group(group)
        lag = admin.group_lag(group)
    doc = _describe_doc(desc, lag)
    if output_format == "json":
        print_json(doc)
        return
    out = console()
    out.print(f"group {desc.group_id}: {desc.state}, {len(desc.members)} member"
              f"{'s' if len(desc.members) != 1 else ''}, assignor {desc.assignor}, "
              f"epoch {desc.group_epoch}, total lag {doc['total_lag']}")
    if desc.members:
        print_table("members", ("member", "instance", "client", "host", "epoch", "partitions", "revoking"), (
            (m.member_id[:12], m.instance_id or None, m.client_id or None, m.client_host or None,
             "left" if m.left else m.member_epoch, _tps_text(m.assignment),
             _tps_text(m.pending_revocation) if m.pending_revocation else None)
            for m in desc.members
        ), numeric=("epoch",))
    if lag:
        print_table("offsets", ("topic", "partition", "committed", "log end", "lag", "member"), (
            (r.topic, r.partition, r.committed_offset, r.log_end_offset if r.log_end_offset >= 0 else None,
             r.lag, (r.member_id or "")[:12] or None)
            for r in lag
        ), numeric=("partition", "committed", "log end", "lag"))


def _partitions(admin: Admin, group: str, topics: tuple[str, ...], all_topics: bool) -> list[TopicPartition]:
    if all_topics:
        if topics:
            raise click.UsageError("give --topic or --all-topics, not both")
        committed = admin.list_group_offsets(group)
        if not committed:
            raise CliError(f"group {group!r} has no committed offsets; name the topics with --topic",
                           code="GROUP_ID_NOT_FOUND")
        return sorted(committed)
    if not topics:
        raise click.UsageError("name the topics to reset with --topic (or --all-topics)")
    out: list[TopicPartition] = []
    names = sorted({spec.partition(":")[0] for spec in topics})
    described = admin.describe_topics(names)
    for spec in topics:
        name, _, parts = spec.partition(":")
        count = described[name].num_partitions
        if not parts:
            out.extend(TopicPartition(name, p) for p in range(count))
            continue
        try:
            numbers = [int(p) for p in parts.split(",") if p.strip()]
        except ValueError:
            raise click.BadParameter(f"{spec!r} is not TOPIC or TOPIC:0,1,2", param_hint="--topic") from None
        for p in numbers:
            if not 0 <= p < count:
                raise click.BadParameter(f"topic {name!r} has no partition {p} (it has {count})",
                                         param_hint="--topic")
            out.append(TopicPartition(name, p))
    return sorted(set(out))


@groups.command("reset-offsets")
@click.argument("group")
@click.option("--topic", "topics", multiple=True, metavar="TOPIC[:P,...]",
              help="A topic (all its partitions) or TOPIC:0,1 (repeatable).")
@click.option("--all-topics", is_flag=True, help="Every topic the group has committed offsets for.")
@click.option("--to-earliest", is_flag=True, help="To the log start offset.")
@click.option("--to-latest", is_flag=True, help="To the log end (high-water mark).")
@click.option("--to-offset", type=click.IntRange(min=0), default=None, help="To this offset (clamped to the log).")
@click.option("--to-datetime", default=None, metavar="TIME",
              help="To the first record at or after TIME: ISO-8601 (UTC unless it has an offset) or ms.")
@click.option("--shift-by", type=int, default=None, help="Move the committed offsets by N (negative: back).")
@click.option("--dry-run", is_flag=True, help="Show the new offsets without changing them (the default).")
@click.option("--execute", is_flag=True, help="Change the committed offsets (without it: only show the plan).")
@format_option()
@bootstrap_option
@cli_errors
def reset_offsets(group: str, topics: tuple[str, ...], all_topics: bool, to_earliest: bool, to_latest: bool,
                  to_offset: int | None, to_datetime: str | None, shift_by: int | None, dry_run: bool,
                  execute: bool, output_format: str, bootstrap: str) -> None:
    """Show, and with --execute apply, new committed offsets for GROUP (applied only while it has no
    active members)."""
    if dry_run and execute:
        raise click.UsageError("give --dry-run or --execute, not both")
    dry_run = not execute
    chosen = [name for name, given in (("--to-earliest", to_earliest), ("--to-latest", to_latest),
                                       ("--to-offset", to_offset is not None),
                                       ("--to-datetime", to_datetime is not None),
                                       ("--shift-by", shift_by is not None)) if given]
    if len(chosen) != 1:
        raise click.UsageError("give exactly one of --to-earliest, --to-latest, --to-offset, --to-datetime "
                               f"and --shift-by (got {', '.join(chosen) or 'none'})")
    timestamp_ms: int | None = None
    if to_datetime is not None:
        try:
            when = parse_time(to_datetime)
        except ValueError as e:
            raise click.BadParameter(str(e), param_hint="--to-datetime") from None
        if isinstance(when, str):
            raise click.BadParameter("use --to-earliest or --to-latest for those", param_hint="--to-datetime")
        timestamp_ms = when
    with Admin(bootstrap, security=cli_security()) as admin:
        tps = _partitions(admin, group, topics, all_topics)
        before = admin.list_group_offsets(group, tps)
        new = admin.reset_group_offsets(group, tps, to_earliest=to_earliest, to_latest=to_latest,
                                        to_offset=to_offset, to_timestamp_ms=timestamp_ms, shift_by=shift_by,
                                        dry_run=dry_run)
    rows = [{"topic": tp.topic, "partition": tp.partition,
             "previous": before[tp].offset if tp in before else None, "new": new[tp]} for tp in sorted(new)]
    if output_format == "json":
        print_json({"group": group, "dry_run": dry_run, "partitions": rows})
        return
    if dry_run:  # as Kafka's tool warns; on stderr, so the plan on stdout stays a table
        click.echo("dry run: nothing changed; add --execute to apply these offsets", err=True)
    print_table(f"{group}{' (dry run: nothing changed)' if dry_run else ''}",
                ("topic", "partition", "previous", "new"),
                ((r["topic"], r["partition"], r["previous"], r["new"]) for r in rows),
                numeric=("partition", "previous", "new"))


@groups.command("delete")
@click.argument("group_ids", nargs=-1, required=True, metavar="GROUP...")
@bootstrap_option
@cli_errors
def delete(group_ids: tuple[str, ...], bootstrap: str) -> None:
    """Delete empty groups and their committed offsets."""
    with Admin(bootstrap, security=cli_security()) as admin:
        admin.delete_groups(group_ids)
    for g in group_ids:
        click.echo(f"deleted group {g}")
