"""``logstore consume``: records of a topic printed as they arrive.

Assigns every partition of the topic (or ``--partition``s), or with
``--group G`` consumes as a member of consumer group G (the group's
members split the partitions; it starts at the group's committed offsets
and commits what it printed), and prints records as they arrive: ``lines`` (the
value per line), ``json`` (one object per record: topic, partition,
offset, timestamp as ISO-8601 and ms, key, value, headers; bytes as
UTF-8 text when they decode, else ``{"base64": ...}``; typed values as
objects) or ``table``. It starts at the end unless ``--from-beginning``
or ``--offset`` (in a group: where the group committed, else likewise), and runs until Ctrl-C, ``--max-records`` or
``--timeout-ms`` without a new record.

Thread-safety: a command-line entry point.
"""

from __future__ import annotations

import io
import json
import os
import sys
import time
from collections.abc import Sequence
from typing import Any

import click

from logstore.cli.common import (
    bootstrap_option,
    cli_errors,
    configure_logging,
    format_option,
    iso_ms,
    jsonable,
    print_table,
    text_or_base64,
)
from logstore.client.admin import Admin
from logstore.client.consumer import Consumer
from logstore.errors import (
    OffsetOutOfRangeError,
    UnknownTopicOrPartitionError,
)
from logstore.types import ConsumerRecord, TopicDescription, TopicPartition

__all__ = ["consume"]


def _record_doc(r: ConsumerRecord) -> dict[str, Any]:
    return {
        "topic": r.topic,
        "partition": r.partition,
        "offset": r.offset,
        "timestamp": iso_ms(r.timestamp_ms),
        "timestamp_ms": r.timestamp_ms,
        "key": None if r.key is None else text_or_base64(r.key),
        "value": jsonable(r.value),
        "headers": [[k, None if v is None else text_or_base64(v)] for k, v in r.headers],
    }


def _value_text(value: Any) -> str:
    if value is None:
        return "null"
    if isinstance(value, bytes):
        doc = text_or_base64(value)
        return doc if isinstance(doc, str) else json.dumps(doc)
    return json.dumps(jsonable(value), separators=(",", ":"), ensure_ascii=False)


def _emit(records: list[ConsumerRecord], output_format: str, key_separator: str | None) -> None:
    if output_format == "json":
        click.echo("\n".join(json.dumps(_record_doc(r), separators=(",", ":"), ensure_ascii=False)
                             for r in records))
    elif output_format == "lines":
        if key_separator is None:
            click.echo("\n".join(_value_text(r.value) for r in records))
        else:
            click.echo("\n".join(
                f"{'null' if r.key is None else _value_text(r.key)}{key_separator}{_value_text(r.value)}"
                for r in records
            ))
    else:
        print_table(None, ("partition", "offset", "timestamp", "key", "value"), (
            (r.partition, r.offset, iso_ms(r.timestamp_ms),
             None if r.key is None else _value_text(r.key), _value_text(r.value))
            for r in records
        ), numeric=("partition", "offset"))


def _assignment(desc: TopicDescription, partitions: Sequence[int]) -> list[TopicPartition]:
    if not partitions:
        return [p.topic_partition for p in desc.partitions]
    for p in partitions:
        if p >= desc.num_partitions:
            raise UnknownTopicOrPartitionError(
                f"partition {p} of topic {desc.name!r} does not exist (it has {desc.num_partitions} partitions)"
            )
    return [TopicPartition(desc.name, p) for p in sorted(set(partitions))]


@click.command()
@click.argument("topic")
@click.option("--from-beginning", is_flag=True, help="Start at the log start offset (default: the end).")
@click.option("--partition", "partitions", type=click.IntRange(min=0), multiple=True,
              help="Read only this partition (repeatable; default: all of them).")
@click.option("--offset", type=click.IntRange(min=0), default=None,
              help="Start at this offset (needs exactly one --partition).")
@click.option("--max-records", type=click.IntRange(min=1), default=None,
              help="Stop after this many records.")
@click.option("--timeout-ms", type=click.IntRange(min=0), default=None,
              help="Stop when no record arrived for this long (default: run until Ctrl-C).")
@format_option("lines", "json", "table", default="lines")
@click.option("--key-separator", default=None, metavar="SEP",
              help="With --format lines: print KEY<SEP>VALUE.")
@click.option("--isolation-level", type=click.Choice(["read_committed", "read_uncommitted"]),
              default="read_committed", show_default=True,
              help="read_committed hides records of open and aborted transactions.")
@click.option("--group", "group_id", default=None, metavar="GROUP",
              help="Consume as a member of consumer group GROUP: its members split the partitions; "
                   "start at its committed offsets and commit what was printed.")
@bootstrap_option
@cli_errors
def consume(topic: str, from_beginning: bool, partitions: tuple[int, ...], offset: int | None,
            max_records: int | None, timeout_ms: int | None, output_format: str,
            key_separator: str | None, isolation_level: str, group_id: str | None, bootstrap: str) -> None:
    """Print records of TOPIC as they arrive."""
    if group_id is not None and (partitions or offset is not None):
        raise click.UsageError("--group takes the partitions the group assigns; drop --partition and --offset")
    if offset is not None and len(partitions) != 1:
        raise click.UsageError("--offset needs exactly one --partition")
    if offset is not None and from_beginning:
        raise click.UsageError("give --offset or --from-beginning, not both")
    if key_separator is not None and output_format != "lines":
        raise click.UsageError("--key-separator works with --format lines")
    configure_logging()
    with Admin(bootstrap) as admin:
        desc = admin.describe_topics([topic])[topic]
    assignment = _assignment(desc, partitions)
    if offset is not None:
        info = desc.partitions[assignment[0].partition]
        if not info.log_start_offset <= offset <= info.log_end_offset:
            raise OffsetOutOfRangeError(
                f"offset {offset} of {assignment[0]} is out of range: the log holds offsets "
                f"[{info.log_start_offset}, {info.log_end_offset})"
            )
    count = 0
    with Consumer(bootstrap, isolation_level=isolation_level,
                  auto_offset_reset="earliest" if from_beginning else "latest",
                  group_id=group_id, subscribe=[topic] if group_id is not None else None,
                  client_id="logstore-cli") as consumer:
        if group_id is None:
            consumer.assign(assignment)
            if offset is not None:
                consumer.seek(assignment[0], offset)
            for tp in assignment:  # positions now, so records produced from here on are seen
                consumer.position(tp)
        last_arrival = time.monotonic()
        try:
            while max_records is None or count < max_records:
                wait_ms = 1000
                if timeout_ms is not None:
                    idle_ms = int((time.monotonic() - last_arrival) * 1000)
                    if idle_ms >= timeout_ms:
                        break
                    wait_ms = min(wait_ms, timeout_ms - idle_ms)
                limit = 500 if max_records is None else min(500, max_records - count)
                records = consumer.poll(timeout_ms=wait_ms, max_records=limit)
                if records:
                    last_arrival = time.monotonic()
                    _emit(records, output_format, key_separator)
                    count += len(records)
        except KeyboardInterrupt:
            pass
        except BrokenPipeError:
            _quiet_stdout()
            return
    if sys.stderr.isatty():
        click.echo(f"consumed {count} record{'s' if count != 1 else ''}", err=True)


def _quiet_stdout() -> None:
    """After the reader of a pipe went away (``| head``), drop further output instead of failing."""
    try:
        devnull = os.open(os.devnull, os.O_WRONLY)
        os.dup2(devnull, sys.stdout.fileno())
    except (OSError, ValueError, io.UnsupportedOperation):
        pass

