"""``logstore consume``: records of a topic printed as they arrive.

Assigns every partition of the topic (or ``--partition``s), or with
``--group G`` consumes as a member of consumer group G (the group's
members split the partitions; it starts at the group's committed offsets
and commits what it printed), and prints records as they arrive: ``lines`` (the
value per line; ``--key-separator`` and Kafka's ``--property print.key=true`` etc. add
fields, see :class:`LineFormat`), ``json`` (one object per record: topic, partition,
offset, timestamp as ISO-8601 and ms, key, value, headers; bytes as
UTF-8 text when they decode, else ``{"base64": ...}``; typed values as
objects) or ``table``. It starts at the end unless ``--from-beginning``,
``--offset`` or ``--from-timestamp`` (in a group: where the group committed,
else likewise), and runs until Ctrl-C or SIGTERM, ``--max-records`` (alias
``--max-messages``, Kafka's name) records, or ``--timeout-ms`` without a new
record. With ``--max-records`` and no ``--timeout-ms`` the idle timeout is
:data:`DEFAULT_IDLE_TIMEOUT_MS` (5 s; :data:`DEFAULT_GROUP_IDLE_TIMEOUT_MS`,
15 s, with ``--group``: three heartbeat intervals, time for a rebalance to hand
partitions over), so asking for more records than the topic holds ends instead
of waiting for ever (Kafka's console consumer has no default and waits).
Without ``--max-records`` it waits for records until stopped, unless
``--timeout-ms`` is given. The idle clock restarts when a group member's
assignment changes (new partitions may hold records).

Ctrl-C (SIGINT) and SIGTERM stop it cleanly: a ``--group`` member commits what
it printed and leaves its group, so the group gives its partitions to the
other members at once instead of after the session timeout. The first signal
only asks the poll loop to stop (it checks between polls, at most a second
apart); a second one interrupts at once.

Thread-safety: a command-line entry point.
"""

from __future__ import annotations

import contextlib
import io
import json
import os
import signal
import sys
import threading
import time
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from types import FrameType
from typing import Any

import click

from logstore.cli.common import (
    bootstrap_option,
    cli_errors,
    configure_logging,
    format_option,
    iso_ms,
    jsonable,
    parse_time,
    print_table,
    text_or_base64,
    topic_argument,
)
from logstore.cli_api.security_options import cli_security
from logstore.client.admin import Admin
from logstore.client.consumer import Consumer
from logstore.errors import (
    OffsetOutOfRangeError,
    UnknownTopicOrPartitionError,
)
from logstore.types import ConsumerRecord, TopicDescription, TopicPartition

__all__ = ["consume", "DEFAULT_IDLE_TIMEOUT_MS", "DEFAULT_GROUP_IDLE_TIMEOUT_MS"]

# With --max-records and no --timeout-ms: stop after this long without a new record ...
DEFAULT_IDLE_TIMEOUT_MS = 5_000
# ... or, in a group, this long: a joining member gets its partitions only once their
# owners revoked them, up to two heartbeat intervals (5 s each by default) later.
DEFAULT_GROUP_IDLE_TIMEOUT_MS = 15_000


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


@dataclass(frozen=True)
class LineFormat:
    """What ``--format lines`` prints of a record, in the order of Kafka's console consumer
    (``CreateTime:MS``, ``Partition:N``, ``Offset:N``, key, value), ``separator`` between them."""

    key: bool = False
    value: bool = True
    timestamp: bool = False
    partition: bool = False
    offset: bool = False
    separator: str = "\t"

    def line(self, r: ConsumerRecord) -> str:
        fields = []
        if self.timestamp:
            fields.append(f"CreateTime:{r.timestamp_ms}")
        if self.partition:
            fields.append(f"Partition:{r.partition}")
        if self.offset:
            fields.append(f"Offset:{r.offset}")
        if self.key:
            fields.append("null" if r.key is None else _value_text(r.key))
        if self.value:
            fields.append(_value_text(r.value))
        return self.separator.join(fields)


# Kafka's console consumer properties (--property NAME=VALUE) and the LineFormat field each sets.
_PRINT_PROPERTIES = {"print.key": "key", "print.value": "value", "print.timestamp": "timestamp",
                     "print.partition": "partition", "print.offset": "offset"}


def line_format(properties: Sequence[str], key_separator: str | None) -> LineFormat:
    """The line format of ``--property`` values (Kafka's names) and ``--key-separator``."""
    fields: dict[str, Any] = {}
    for item in properties:
        name, eq, value = item.partition("=")
        if not eq:
            raise click.UsageError(f"--property takes NAME=VALUE, got {item!r}")
        if name == "key.separator":
            fields["separator"] = value
        elif name in _PRINT_PROPERTIES:
            if value.lower() not in ("true", "false"):
                raise click.UsageError(f"--property {name} takes true or false, got {value!r}")
            fields[_PRINT_PROPERTIES[name]] = value.lower() == "true"
        else:
            raise click.UsageError(f"--property {name!r} is not one this consumer has; it has "
                                   f"{', '.join([*_PRINT_PROPERTIES, 'key.separator'])}")
    if key_separator is not None:
        fields.setdefault("key", True)
        fields["separator"] = key_separator
    return LineFormat(**fields)


def _emit(records: list[ConsumerRecord], output_format: str, lines: LineFormat) -> None:
    if output_format == "json":
        click.echo("\n".join(json.dumps(_record_doc(r), separators=(",", ":"), ensure_ascii=False)
                             for r in records))
    elif output_format == "lines":
        click.echo("\n".join(lines.line(r) for r in records))
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
@topic_argument()
@click.option("--from-beginning", is_flag=True, help="Start at the log start offset (default: the end).")
@click.option("--from-timestamp", "from_timestamp", default=None, metavar="TIME",
              help="Start at each partition's first record at or after TIME: milliseconds since the "
                   "epoch or ISO-8601 (UTC unless it has an offset); the end where there is none.")
@click.option("--partition", "partitions", type=click.IntRange(min=0), multiple=True,
              help="Read only this partition (repeatable; default: all of them).")
@click.option("--offset", type=click.IntRange(min=0), default=None,
              help="Start at this offset (needs exactly one --partition).")
@click.option("--max-records", "--max-messages", "max_records", type=click.IntRange(min=1), default=None,
              help="Stop after this many records (--max-messages is Kafka's name).")
@click.option("--timeout-ms", type=click.IntRange(min=0), default=None,
              help=f"Stop when no record arrived for this long (default with --max-records: "
                   f"{DEFAULT_IDLE_TIMEOUT_MS}, with --group {DEFAULT_GROUP_IDLE_TIMEOUT_MS}; "
                   "else run until Ctrl-C).")
@format_option("lines", "json", "table", default="lines")
@click.option("--key-separator", default=None, metavar="SEP",
              help="With --format lines: print KEY<SEP>VALUE.")
@click.option("--property", "properties", multiple=True, metavar="NAME=VALUE",
              help="With --format lines, Kafka's console consumer properties: print.key, print.value, "
                   "print.timestamp, print.partition, print.offset (true/false) and key.separator "
                   "(default a tab). Repeatable.")
@click.option("--isolation-level", type=click.Choice(["read_committed", "read_uncommitted"]),
              default="read_committed", show_default=True,
              help="read_committed hides records of open and aborted transactions.")
@click.option("--group", "group_id", default=None, metavar="GROUP",
              help="Consume as a member of consumer group GROUP: its members split the partitions; "
                   "start at its committed offsets and commit what was printed.")
@bootstrap_option
@cli_errors
def consume(topic: str, from_beginning: bool, from_timestamp: str | None, partitions: tuple[int, ...],
            offset: int | None, max_records: int | None, timeout_ms: int | None, output_format: str,
            key_separator: str | None, properties: tuple[str, ...], isolation_level: str, group_id: str | None,
            bootstrap: str) -> None:
    """Print records of TOPIC as they arrive."""
    if group_id is not None and (partitions or offset is not None):
        raise click.UsageError("--group takes the partitions the group assigns; drop --partition and --offset")
    if group_id is not None and from_timestamp is not None:
        raise click.UsageError("a group starts at its committed offsets; move them first with "
                               "'logstore groups reset-offsets GROUP --topic TOPIC --to-datetime TIME --execute'")
    if offset is not None and len(partitions) != 1:
        raise click.UsageError("--offset needs exactly one --partition")
    starts = [n for n, given in (("--offset", offset is not None), ("--from-beginning", from_beginning),
                                 ("--from-timestamp", from_timestamp is not None)) if given]
    if len(starts) > 1:
        raise click.UsageError(f"give one of {', '.join(starts)}, not several")
    start_ms = _timestamp_ms(from_timestamp) if from_timestamp is not None else None
    if timeout_ms is None and max_records is not None:
        timeout_ms = DEFAULT_IDLE_TIMEOUT_MS if group_id is None else DEFAULT_GROUP_IDLE_TIMEOUT_MS
    if (key_separator is not None or properties) and output_format != "lines":
        raise click.UsageError("--key-separator and --property work with --format lines")
    lines = line_format(properties, key_separator)
    configure_logging()
    with Admin(bootstrap, security=cli_security()) as admin:
        desc = admin.describe_topics([topic])[topic]
    assignment = _assignment(desc, partitions)
    if offset is not None:
        info = desc.partitions[assignment[0].partition]
        if not info.log_start_offset <= offset <= info.log_end_offset:
            raise OffsetOutOfRangeError(
                f"offset {offset} of {assignment[0]} is out of range: the log holds offsets "
                f"[{info.log_start_offset}, {info.log_end_offset})"
            )
    counted = [0]
    with _stop_on_signals() as stop, Consumer(
        bootstrap, security=cli_security(), isolation_level=isolation_level,
        auto_offset_reset="earliest" if from_beginning else "latest",
        group_id=group_id, subscribe=[topic] if group_id is not None else None, client_id="logstore-cli",
    ) as consumer:
        try:
            if group_id is None:
                consumer.assign(assignment)
                if offset is not None:
                    consumer.seek(assignment[0], offset)
                if start_ms is not None:
                    consumer.seek_to_timestamp(start_ms, *assignment)
                for tp in assignment:  # positions now, so records produced from here on are seen
                    consumer.position(tp)
            _print_records(consumer, counted, max_records, timeout_ms, output_format, lines, stop)
        except KeyboardInterrupt:  # a second Ctrl-C or SIGTERM: leaving the with-block leaves the group
            pass
        except BrokenPipeError:
            _quiet_stdout()
            return
    count = counted[0]
    if sys.stderr.isatty():
        click.echo(f"consumed {count} record{'s' if count != 1 else ''}", err=True)


def _print_records(consumer: Consumer, counted: list[int], max_records: int | None, timeout_ms: int | None,
                   output_format: str, lines: LineFormat, stop: threading.Event) -> None:
    """Poll and print until ``max_records`` (counted in ``counted[0]``), ``timeout_ms`` idle
    (the idle clock restarts when the assignment changes) or ``stop``."""
    last_arrival = time.monotonic()
    owned = consumer.assignment()
    while (max_records is None or counted[0] < max_records) and not stop.is_set():
        if (now_owned := consumer.assignment()) != owned:
            owned, last_arrival = now_owned, time.monotonic()
        wait_ms = 1000
        if timeout_ms is not None:
            idle_ms = int((time.monotonic() - last_arrival) * 1000)
            if idle_ms >= timeout_ms:
                return
            wait_ms = min(wait_ms, timeout_ms - idle_ms)
        limit = 500 if max_records is None else min(500, max_records - counted[0])
        records = consumer.poll(timeout_ms=wait_ms, max_records=limit)
        if records:
            last_arrival = time.monotonic()
            _emit(records, output_format, lines)
            counted[0] += len(records)


@contextlib.contextmanager
def _stop_on_signals() -> Iterator[threading.Event]:
    """Within: the first SIGINT (Ctrl-C) or SIGTERM sets the event yielded, which the poll loop
    checks between polls, so the command ends through its clean path (a group member commits and
    leaves its group); a second one raises KeyboardInterrupt at once (a call that hangs). Raising
    at the first would interrupt the client at an arbitrary point: Python's signal documentation
    warns that such an exception can leave locks and futures inconsistent, and a consumer
    interrupted that way could then fail to leave its group. The old handlers are restored after."""
    stop = threading.Event()

    def on_signal(signum: int, frame: FrameType | None) -> None:
        if stop.is_set():
            raise KeyboardInterrupt(f"signal {signum}")
        stop.set()

    try:
        previous = {s: signal.signal(s, on_signal) for s in (signal.SIGINT, signal.SIGTERM)}
    except ValueError:  # not the main thread (an embedding program): leave signals alone
        yield stop
        return
    try:
        yield stop
    finally:
        for s, handler in previous.items():
            signal.signal(s, handler)


def _timestamp_ms(text: str) -> int:
    try:
        when = parse_time(text)
    except ValueError as e:
        raise click.BadParameter(str(e), param_hint="--from-timestamp") from None
    if isinstance(when, str):
        raise click.BadParameter(f"use --from-beginning for {when!r}, or leave it out for the end",
                                 param_hint="--from-timestamp")
    return when


def _quiet_stdout() -> None:
    """After the reader of a pipe went away (``| head``), drop further output instead of failing."""
    try:
        devnull = os.open(os.devnull, os.O_WRONLY)
        os.dup2(devnull, sys.stdout.fileno())
    except (OSError, ValueError, io.UnsupportedOperation):
        pass

