"""``logstore produce``: records from stdin appended to a topic.

Reads records from stdin and appends them through :class:`logstore.Producer`'s
columnar path (:meth:`~logstore.Producer.send_batch`): input is gathered into
chunks of up to :data:`~logstore.cli.produce_input.CHUNK_RECORDS` records,
and a chunk is sent as soon as it is full or stdin is idle for
:data:`~logstore.cli.produce_input.IDLE_FLUSH_S` (typed lines go out
promptly). Input formats ``lines``, ``json`` and ``csv`` (``--input``) are
described, and parsed, in :mod:`logstore.cli.produce_input`.

Blank lines are skipped. The first bad line stops the command: every
line before it was sent, none after it; the error names the line number.
At the end a summary tells how many records went to which offsets.

Thread-safety: a command-line entry point.
"""

from __future__ import annotations

import concurrent.futures
import sys
from dataclasses import dataclass, field

import click
import pyarrow as pa

from logstore.cli.common import (
    CliError,
    bootstrap_option,
    cli_errors,
    configure_logging,
    format_option,
    print_json,
    print_table,
    topic_argument,
)
from logstore.cli.produce_input import PARSERS, InputReader, Target, to_table
from logstore.cli_api.security_options import cli_security
from logstore.client.admin import Admin
from logstore.client.producer import Producer
from logstore.errors import (
    LogstoreError,
    SchemaMismatchError,
    UnknownTopicOrPartitionError,
)
from logstore.schema_text import format_schema
from logstore.types import SendBatchResult

__all__ = ["produce"]

# How long closing the producer may take when the broker does not answer.
_CLOSE_TIMEOUT_S = 30.0


@dataclass(slots=True)
class _Sent:
    """What the acknowledged batches covered, per partition."""

    records: dict[int, int] = field(default_factory=dict)
    first: dict[int, int] = field(default_factory=dict)
    last: dict[int, int] = field(default_factory=dict)

    def add(self, result: SendBatchResult) -> None:
        for b in result.batches:
            self.records[b.partition] = self.records.get(b.partition, 0) + b.record_count
            if b.base_offset >= 0 and b.record_count:
                self.first[b.partition] = min(self.first.get(b.partition, b.base_offset), b.base_offset)
                self.last[b.partition] = max(self.last.get(b.partition, -1), b.end_offset - 1)

    @property
    def total(self) -> int:
        return sum(self.records.values())


@click.command()
@topic_argument()
@click.option("--input", "input_format", type=click.Choice(["lines", "json", "csv"]), default="lines",
              show_default=True, help="lines: a value per line; json: a JSON document per line; "
                                      "csv: a header row, then a record per row.")
@click.option("--key-field", default=None, metavar="FIELD",
              help="Take each record's key from this JSON/CSV field.")
@click.option("--key-separator", default=None, metavar="SEP",
              help="Lines are KEY<SEP>VALUE (with --input lines or json).")
@click.option("--partition", type=click.IntRange(min=0), default=None,
              help="Send every record to this partition (default: by key, keyless spread).")
@click.option("--acks", type=click.Choice(["all", "1", "0"]), default="all", show_default=True,
              help="all: durable before acknowledged; 1: appended by the leader; 0: do not wait.")
@click.option("--compression", type=click.Choice(["none", "lz4", "zstd"]), default="none",
              show_default=True, help="Compression of the record batches.")
@click.option("--header", "header_pairs", multiple=True, metavar="KEY=VALUE",
              help="A header on every record (repeatable; a key may repeat, as in Kafka).")
@format_option()
@bootstrap_option
@cli_errors
def produce(topic: str, input_format: str, key_field: str | None, key_separator: str | None,
            partition: int | None, acks: str, compression: str, header_pairs: tuple[str, ...],
            output_format: str, bootstrap: str) -> None:
    """Append records read from stdin to TOPIC; print where they went."""
    headers = _parse_headers(header_pairs)
    if key_field is not None and input_format == "lines":
        raise click.UsageError("--key-field needs --input json or csv")
    if key_separator is not None and input_format == "csv":
        raise click.UsageError("--key-separator works with --input lines or json, not csv")
    if key_separator == "":
        raise click.UsageError("--key-separator must not be empty")
    if key_field is not None and key_separator is not None:
        raise click.UsageError("give --key-field or --key-separator, not both")
    configure_logging()
    with Admin(bootstrap, security=cli_security()) as admin:
        desc = admin.describe_topics([topic])[topic]
    if partition is not None and partition >= desc.num_partitions:
        raise UnknownTopicOrPartitionError(
            f"partition {partition} of topic {topic!r} does not exist (it has {desc.num_partitions} partitions)"
        )
    target = Target(topic, desc.value_schema, key_field)
    if target.typed and input_format == "lines":
        raise SchemaMismatchError(
            f"topic {topic!r} is typed ({format_schema(desc.value_schema)}): use --input json or csv"
        )
    sep = key_separator.encode() if key_separator is not None else None
    stdin = sys.stdin.buffer
    sent = _Sent()
    failure: BaseException | None = None
    interrupted = False
    futures: list[concurrent.futures.Future[SendBatchResult]] = []
    producer = Producer(bootstrap, security=cli_security(), acks=acks, compression=None if compression == "none" else compression)
    reader = InputReader(stdin, PARSERS[input_format], target, sep)
    try:
        try:
            for chunk in reader.chunks():
                table, key_name, bad, why = to_table(chunk, target)
                if headers is not None and table.num_rows:
                    table = table.append_column("headers", pa.array([headers] * table.num_rows, HEADERS_TYPE))
                if table.num_rows:
                    futures.append(producer.send_batch(topic, table, partition=partition,
                                                       key_column=key_name))
                if bad >= 0:
                    raise SchemaMismatchError(why)
                futures, failed = _collect_done(futures, sent)
                if failed is not None:  # stop reading: the broker refuses the records
                    raise failed
        except KeyboardInterrupt:
            interrupted = True
        except LogstoreError as e:
            failure = e
        finally:
            reader.close()
        producer.flush(_CLOSE_TIMEOUT_S)
        for fut in futures:
            try:
                sent.add(fut.result(timeout=_CLOSE_TIMEOUT_S))
            except LogstoreError as e:
                failure = failure or e
            except concurrent.futures.TimeoutError:
                failure = failure or LogstoreError("records were still unacknowledged when produce gave up")
    finally:
        producer.close(_CLOSE_TIMEOUT_S)
    _print_sent(topic, sent, acks, output_format)
    if failure is not None:
        raise failure
    if interrupted:
        raise CliError("interrupted: the records read before Ctrl-C were sent", code="INTERRUPTED")


def _collect_done(futures: list[concurrent.futures.Future[SendBatchResult]], sent: _Sent
                  ) -> tuple[list[concurrent.futures.Future[SendBatchResult]], LogstoreError | None]:
    """Account for finished sends; return the unfinished ones and the first failure."""
    pending = []
    failure: LogstoreError | None = None
    for fut in futures:
        if not fut.done():
            pending.append(fut)
            continue
        try:
            sent.add(fut.result())
        except LogstoreError as e:
            failure = failure or e
    return pending, failure


def _print_sent(topic: str, sent: _Sent, acks: str, output_format: str) -> None:
    parts = sorted(sent.records)
    if output_format == "json":
        print_json({
            "topic": topic,
            "records": sent.total,
            "partitions": [
                {"partition": p, "records": sent.records[p],
                 "first_offset": sent.first.get(p), "last_offset": sent.last.get(p)}
                for p in parts
            ],
        })
        return
    if not sent.total:
        click.echo(f"sent 0 records to {topic}")
        return
    note = " (acks=0: offsets unknown)" if acks == "0" else ""
    print_table(
        f"sent {sent.total} record{'s' if sent.total != 1 else ''} to {topic}{note}",
        ("partition", "records", "first offset", "last offset"),
        ((p, sent.records[p], sent.first.get(p), sent.last.get(p)) for p in parts),
        numeric=("partition", "records", "first offset", "last offset"),
    )


HEADERS_TYPE = pa.list_(pa.struct([("key", pa.string()), ("value", pa.binary())]))


def _parse_headers(pairs: tuple[str, ...]) -> list[dict[str, object]] | None:
    """``--header`` values as a record's headers (in the order given), or None when none."""
    out: list[dict[str, object]] = []
    for pair in pairs:
        key, sep, value = pair.partition("=")
        if not sep or not key:
            raise click.UsageError(f"--header {pair!r} is not KEY=VALUE (e.g. source=web)")
        out.append({"key": key, "value": value.encode()})
    return out or None
