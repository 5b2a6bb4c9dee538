"""``logstore topics create|list|describe|alter|delete``: topic administration.

Every command sends its requests through :class:`logstore.Admin`; the broker
validates names, partition counts, configs and schemas, and its error comes
back as the one line ``error: [CODE] message``.
"""

from __future__ import annotations

from typing import Any

import click

from logstore.byte_sizes import human_bytes
from logstore.cli.common import (
    bootstrap_option,
    cli_errors,
    console,
    format_option,
    parse_config_pairs,
    print_json,
    print_table,
    topic_argument,
)
from logstore.cli_api.security_options import cli_security
from logstore.client.admin import Admin
from logstore.errors import InternalTopicError, InvalidConfigError, TopicAlreadyExistsError
from logstore.schema_text import format_schema, parse_schema
from logstore.types import NewTopic, PartitionInfo, TopicDescription

__all__ = ["topics", "partition_rows", "PARTITION_COLUMNS"]

UNTYPED = "untyped: key binary, value binary, headers"
PARTITION_COLUMNS = ("partition", "leader", "epoch", "replicas", "isr", "log start", "LEO",
                     "HWM", "LSO", "size")


class _KafkaTopicsGroup(click.Group):
    """Also takes kafka-topics' form, the action as a flag anywhere among the options:
    ``topics --list``, ``topics --describe --topic T``, ``topics --create --topic T
    --partitions 3``, ``--alter``, ``--delete`` run the verb of the same name."""

    _ACTIONS = {"--list": "list", "--describe": "describe", "--create": "create", "--alter": "alter",
                "--delete": "delete"}

    def parse_args(self, ctx: click.Context, args: list[str]) -> list[str]:
        if args and args[0] not in self.commands:
            actions = [a for a in args if a in self._ACTIONS]
            if len(actions) > 1:
                raise click.UsageError(f"give one action, not {' and '.join(actions)}", ctx=ctx)
            if actions:
                args = [self._ACTIONS[actions[0]], *(a for a in args if a != actions[0])]
        return super().parse_args(ctx, args)


@click.group(cls=_KafkaTopicsGroup)
def topics() -> None:
    """Create, list, describe, alter and delete topics (also as kafka-topics: --list, --describe,
    --create, --alter, --delete with --topic NAME)."""


@topics.command("create")
@topic_argument("name")
@click.option("--partitions", type=click.IntRange(min=1), default=1, show_default=True,
              help="Number of partitions.")
@click.option("--replication-factor", type=click.IntRange(min=1), default=None,
              help="Replicas per partition (default: the cluster's default_replication_factor; "
                   "a single broker has 1).")
@click.option("--config", "configs", multiple=True, metavar="KEY=VALUE",
              help="A topic config, e.g. cleanup.policy=compact (repeatable).")
@click.option("--schema", "schema_text", default=None, metavar="SCHEMA",
              help="Make a typed topic with these value columns: Spark DDL "
                   "('id long, name string') or Arrow schema JSON.")
@click.option("--if-not-exists", is_flag=True,
              help="Succeed without changing anything when the topic exists already (as Kafka's tool; "
                   "its partitions, configs and schema are not compared).")
@bootstrap_option
@cli_errors
def create(name: str, partitions: int, replication_factor: int | None, configs: tuple[str, ...],
           schema_text: str | None, if_not_exists: bool, bootstrap: str) -> None:
    """Create topic TOPIC."""
    value_schema = parse_schema(schema_text) if schema_text is not None else None
    topic = NewTopic(name, partitions, configs=parse_config_pairs(configs),
                     value_schema=value_schema, replication_factor=replication_factor)
    with Admin(bootstrap, security=cli_security()) as admin:
        try:
            admin.create_topics([topic])
        except TopicAlreadyExistsError:
            if not if_not_exists:
                raise
            click.echo(f"topic {name} exists already: nothing changed")
            return
    kind = f"typed ({format_schema(value_schema)})" if value_schema is not None else "untyped"
    click.echo(f"created topic {name}: {partitions} partition{'s' if partitions != 1 else ''}, {kind}")


@topics.command("list")
@format_option()
@bootstrap_option
@cli_errors
def list_(output_format: str, bootstrap: str) -> None:
    """List topics with their partition counts and sizes."""
    with Admin(bootstrap, security=cli_security()) as admin:
        described = admin.describe_topics()
    docs = [_summary(described[name]) for name in sorted(described)]
    if output_format == "json":
        print_json(docs)
        return
    if not docs:
        click.echo("no topics")
        return
    print_table(None, ("topic", "partitions", "offsets", "size", "schema"), (
        (d["name"], d["partitions"], d["offsets"], human_bytes(d["size_bytes"]),
         d["schema"] or "untyped")
        for d in docs
    ), numeric=("partitions", "offsets", "size"))


@topics.command("describe")
@topic_argument("name")
@format_option()
@bootstrap_option
@cli_errors
def describe(name: str, output_format: str, bootstrap: str) -> None:
    """Show topic TOPIC: partitions (leader, log start, LEO, HWM, LSO, size), configs, schema."""
    with Admin(bootstrap, security=cli_security()) as admin:
        desc = admin.describe_topics([name])[name]
        configs = admin.describe_configs([name])[name]
    if output_format == "json":
        doc = _summary(desc)
        doc["topic_id"] = desc.topic_id
        doc["configs"] = dict(sorted(configs.items()))
        doc["partitions"] = [_partition_doc(p) for p in desc.partitions]
        print_json(doc)
        return
    out = console()
    out.print(f"[bold]{desc.name}[/bold]  id {desc.topic_id}  "
              f"{desc.num_partitions} partition{'s' if desc.num_partitions != 1 else ''}")
    out.print(f"schema: {format_schema(desc.value_schema) if desc.value_schema is not None else UNTYPED}")
    print_table("partitions", PARTITION_COLUMNS, partition_rows(desc.partitions),
                numeric=("partition", "leader", "epoch", "log start", "LEO", "HWM", "LSO", "size"))
    print_table("configs", ("key", "value"), sorted(configs.items()))


@topics.command("alter")
@topic_argument("name")
@click.option("--config", "configs", multiple=True, metavar="KEY=VALUE",
              help="Set a topic config (repeatable).")
@click.option("--delete-config", "deletes", multiple=True, metavar="KEY",
              help="Reset a topic config to the broker default (repeatable).")
@click.option("--partitions", type=click.IntRange(min=1), default=None,
              help="Grow the topic to this many partitions (Kafka's --alter --partitions; never fewer).")
@bootstrap_option
@cli_errors
def alter(name: str, configs: tuple[str, ...], deletes: tuple[str, ...], partitions: int | None,
          bootstrap: str) -> None:
    """Change configs of topic TOPIC (keys not named keep their values), or add partitions."""
    changes: dict[str, Any] = dict(parse_config_pairs(configs))
    for key in deletes:
        if key in changes:
            raise InvalidConfigError(f"{key} is both set (--config) and reset (--delete-config)")
        changes[key] = None
    if not changes and partitions is None:
        raise click.UsageError("nothing to alter: give --config KEY=VALUE, --delete-config KEY or --partitions N")
    with Admin(bootstrap, security=cli_security()) as admin:
        if partitions is not None:
            admin.create_partitions({name: partitions})
        if changes:
            admin.alter_configs({name: changes})
    parts = [f"partitions={partitions}"] if partitions is not None else []
    parts += [f"{k}={v}" for k, v in changes.items() if v is not None]
    parts += [f"{k} reset" for k, v in changes.items() if v is None]
    click.echo(f"altered topic {name}: {', '.join(parts)}")


@topics.command("delete")
@click.argument("names", nargs=-1, metavar="[TOPIC]...")
@click.option("--topic", "topic_options", multiple=True, metavar="TOPIC",
              help="A topic to delete (repeatable; the same as the TOPIC arguments; Kafka's spelling).")
@bootstrap_option
@cli_errors
def delete(names: tuple[str, ...], topic_options: tuple[str, ...], bootstrap: str) -> None:
    """Delete topics TOPIC... and their data. Internal topics (names starting with '__') are refused."""
    names = tuple(dict.fromkeys(names + topic_options))
    if not names:
        raise click.UsageError("name the topics to delete: TOPIC... or --topic TOPIC")
    internal = [n for n in names if n.startswith("__")]
    if internal:  # the broker refuses them too; checked here so that no other topic goes either
        raise InternalTopicError(f"topic {internal[0]!r} is internal (names starting with '__' hold the "
                                 "broker's own state) and cannot be deleted; nothing was deleted")
    with Admin(bootstrap, security=cli_security()) as admin:
        admin.delete_topics(names)
    for name in names:
        click.echo(f"deleted topic {name}")


# --------------------------------------------------------------------------- helpers


def _summary(desc: TopicDescription) -> dict[str, Any]:
    return {
        "name": desc.name,
        "partitions": desc.num_partitions,
        # Offsets from the log start to the HWM: the records a topic holds only until compaction
        # (or aborted transactions, markers) leave gaps, so it is not called "records".
        "offsets": sum(max(0, p.high_watermark - p.log_start_offset) for p in desc.partitions),
        "size_bytes": sum(p.size_bytes for p in desc.partitions),
        "schema": format_schema(desc.value_schema) if desc.value_schema is not None else None,
    }


def _partition_doc(p: PartitionInfo) -> dict[str, Any]:
    return {
        "partition": p.partition,
        "leader": p.leader,
        "leader_epoch": p.leader_epoch,
        "replicas": list(p.replicas),
        "isr": list(p.isr),
        "log_start_offset": p.log_start_offset,
        "log_end_offset": p.log_end_offset,
        "high_watermark": p.high_watermark,
        "last_stable_offset": p.last_stable_offset,
        "size_bytes": p.size_bytes,
        "error": None if p.error is None else str(p.error),
    }


def partition_rows(partitions: tuple[PartitionInfo, ...]) -> list[tuple[Any, ...]]:
    """Table rows in :data:`PARTITION_COLUMNS` order (an offline partition shows its error)."""
    rows: list[tuple[Any, ...]] = []
    for p in partitions:
        if p.error is not None:
            rows.append((p.partition, p.leader, p.leader_epoch, "", "", str(p.error), "", "", "", ""))
            continue
        rows.append((
            p.partition, p.leader, p.leader_epoch,
            ",".join(map(str, p.replicas)), ",".join(map(str, p.isr)),
            p.log_start_offset, p.log_end_offset, p.high_watermark, p.last_stable_offset,
            human_bytes(p.size_bytes),
        ))
    return rows
