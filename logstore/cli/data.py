"""``logstore produce``, ``logstore consume`` and ``logstore offsets``: data in, data out, positions.

produce
    Reads records from stdin and appends them through :class:`logstore.Producer`'s
    columnar path (:meth:`~logstore.Producer.send_batch`): input is gathered
    into chunks of up to :data:`CHUNK_RECORDS` records, and a chunk is sent
    as soon as it is full or stdin is idle for :data:`IDLE_FLUSH_S` (typed
    lines go out promptly). Input formats:

    * ``lines`` — each line is a value (bytes as given, newline removed);
      with ``--key-separator SEP``, ``KEY<SEP>VALUE``.
    * ``json`` — each line is one JSON document. Untyped topic: the value is
      the line's text; a typed topic: an object whose fields are the value
      columns (ISO-8601 strings fill timestamp and date columns). ``null`` is
      a tombstone. ``--key-field F`` copies the key from field F (its text:
      strings as they are, other JSON values as JSON); ``--key-separator``
      works as for lines.
    * ``csv`` — a header row, then rows. Untyped topic: each row becomes a
      JSON object of strings; typed: its cells are converted to the column
      types, an empty cell is null (except in string columns).

    Blank lines are skipped. The first bad line stops the command: every
    line before it was sent, none after it; the error names the line number.
    At the end a summary tells how many records went to which offsets.

consume
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

offsets
    Per partition: log start offset, end (HWM), LSO, LEO and, with
    ``--time``, the first offset whose timestamp is at or after that time.
"""

from __future__ import annotations

import concurrent.futures
import csv
import datetime as dt
import decimal
import io
import json
import os
import queue
import sys
import threading
import time
from collections.abc import Iterator, Sequence
from dataclasses import dataclass, field
from typing import IO, Any

import click
import pyarrow as pa

from logstore.cli.common import (
    CliError,
    bootstrap_option,
    cli_errors,
    configure_logging,
    format_option,
    iso_ms,
    jsonable,
    parse_time,
    print_json,
    print_table,
    text_or_base64,
)
from logstore.client.admin import Admin
from logstore.client.consumer import Consumer
from logstore.client.producer import Producer
from logstore.errors import (
    InvalidRequestError,
    LogstoreError,
    OffsetOutOfRangeError,
    SchemaMismatchError,
    UnknownTopicOrPartitionError,
)
from logstore.schema_text import format_schema, format_type
from logstore.types import ConsumerRecord, SendBatchResult, TopicDescription, TopicPartition

__all__ = ["produce", "consume", "offsets", "CHUNK_RECORDS", "IDLE_FLUSH_S"]

# A chunk of stdin records handed to send_batch at once.
CHUNK_RECORDS = 10_000
CHUNK_BYTES = 4 << 20
# Send what was read when stdin has been quiet this long (interactive input).
IDLE_FLUSH_S = 0.05
# How long closing the producer may take when the broker does not answer.
_CLOSE_TIMEOUT_S = 30.0


# =========================================================================== produce


@dataclass(slots=True)
class _Record:
    line: int
    key: bytes | None
    # bytes (untyped), a dict of value columns (typed), or None (a tombstone).
    value: bytes | dict[str, Any] | None


@dataclass(slots=True)
class _Target:
    """What the input is converted to: the topic's value columns, or bytes."""

    topic: str
    value_schema: pa.Schema | None
    key_field: str | None

    @property
    def typed(self) -> bool:
        return self.value_schema is not None

    def check_fields(self, names: Sequence[str], line: int, *, header: bool = False) -> None:
        """Unknown fields are an error (a typo would otherwise drop data silently)."""
        assert self.value_schema is not None
        known = set(self.value_schema.names)
        unknown = [n for n in names if n not in known and n != self.key_field]
        if unknown:
            what = "the header names" if header else "unknown fields"
            raise InvalidRequestError(
                f"line {line}: {what} {', '.join(map(repr, unknown))} "
                f"{'that are not columns' if header else 'are not columns'} of topic {self.topic!r} "
                f"({format_schema(self.value_schema)})"
            )

    def check_required(self, row: dict[str, Any], line: int) -> None:
        assert self.value_schema is not None
        for f in self.value_schema:
            if not f.nullable and row.get(f.name) is None:
                raise SchemaMismatchError(
                    f"line {line}: column {f.name!r} is NOT NULL but the record has no value for it"
                )

    def typed_value(self, row: dict[str, Any]) -> dict[str, Any]:
        """The value columns of ``row`` (the key field only if it is a column)."""
        assert self.value_schema is not None
        return {k: v for k, v in row.items() if k in self.value_schema.names}


def _key_text(value: Any) -> bytes | None:
    """A JSON/CSV field as a key: strings as they are, other values as JSON text."""
    if value is None:
        return None
    if isinstance(value, str):
        return value.encode()
    return json.dumps(value, separators=(",", ":"), ensure_ascii=False).encode()


def _split_key(data: bytes, sep: bytes | None, line: int) -> tuple[bytes | None, bytes]:
    if sep is None:
        return None, data
    key, found, rest = data.partition(sep)
    if not found:
        raise InvalidRequestError(
            f"line {line}: no key separator {sep.decode(errors='replace')!r} in the line"
        )
    return key, rest


def _decode(data: bytes, line: int) -> str:
    try:
        return data.decode("utf-8")
    except UnicodeDecodeError as e:
        raise InvalidRequestError(f"line {line}: not UTF-8 text ({e.reason} at byte {e.start})") from None


def _parse_lines(stream: IO[bytes], target: _Target, sep: bytes | None) -> Iterator[_Record]:
    for n, raw in enumerate(stream, 1):
        data = raw.rstrip(b"\r\n") if raw.endswith(b"\n") else raw
        if not data:
            continue
        key, value = _split_key(data, sep, n)
        yield _Record(n, key, value)


def _parse_json(stream: IO[bytes], target: _Target, sep: bytes | None) -> Iterator[_Record]:
    for n, raw in enumerate(stream, 1):
        if not raw.strip():
            continue
        key, data = _split_key(raw.strip(b"\r\n"), sep, n)
        text = _decode(data, n)
        try:
            doc = json.loads(text)
        except json.JSONDecodeError as e:
            raise InvalidRequestError(f"line {n}: not valid JSON: {e.msg} at column {e.colno}") from None
        if target.key_field is not None:
            if not isinstance(doc, dict):
                raise InvalidRequestError(
                    f"line {n}: --key-field {target.key_field} needs a JSON object, got {_json_kind(doc)}"
                )
            if target.key_field not in doc:
                raise InvalidRequestError(f"line {n}: the object has no field {target.key_field!r} for the key")
            key = _key_text(doc[target.key_field])
        if not target.typed:
            yield _Record(n, key, None if doc is None else data.strip())
            continue
        if doc is None:
            yield _Record(n, key, None)
            continue
        if not isinstance(doc, dict):
            raise SchemaMismatchError(
                f"line {n}: topic {target.topic!r} is typed: a record must be a JSON object of its "
                f"columns (or null for a tombstone), got {_json_kind(doc)}"
            )
        target.check_fields(list(doc), n)
        target.check_required(doc, n)
        yield _Record(n, key, target.typed_value(doc))


def _json_kind(doc: Any) -> str:
    return {list: "an array", str: "a string", bool: "a boolean", type(None): "null"}.get(
        type(doc), "a number"
    )


def _parse_csv(stream: IO[bytes], target: _Target, sep: bytes | None) -> Iterator[_Record]:
    text = io.TextIOWrapper(stream, encoding="utf-8", newline="")
    reader = csv.reader(text)
    header: list[str] | None = None
    string_columns: set[str] = set()
    try:
        for row in reader:
            n = reader.line_num
            if not row or (len(row) == 1 and not row[0].strip()):
                continue
            if header is None:
                header = [c.strip() for c in row]
                if any(not c for c in header) or len(set(header)) != len(header):
                    raise InvalidRequestError(
                        f"line {n}: the CSV header must name every column once, got {header}"
                    )
                if target.key_field is not None and target.key_field not in header:
                    raise InvalidRequestError(
                        f"line {n}: the CSV header has no column {target.key_field!r} for the key"
                    )
                if target.value_schema is not None:
                    target.check_fields(header, n, header=True)
                    missing = [f.name for f in target.value_schema
                               if not f.nullable and f.name not in header]
                    if missing:
                        raise SchemaMismatchError(
                            f"line {n}: the CSV header lacks the NOT NULL column(s) {', '.join(missing)}"
                        )
                    string_columns = {f.name for f in target.value_schema
                                      if pa.types.is_string(f.type) or pa.types.is_large_string(f.type)}
                continue
            if len(row) != len(header):
                raise InvalidRequestError(
                    f"line {n}: {len(row)} fields but the header has {len(header)} columns"
                )
            doc = dict(zip(header, row, strict=True))
            key = _key_text(doc[target.key_field]) if target.key_field is not None else None
            if not target.typed:
                yield _Record(n, key, json.dumps(doc, separators=(",", ":"), ensure_ascii=False).encode())
                continue
            typed = {k: (v if v or k in string_columns else None) for k, v in doc.items()}
            target.check_required(typed, n)
            yield _Record(n, key, target.typed_value(typed))
    except UnicodeDecodeError as e:
        raise InvalidRequestError(f"line {reader.line_num + 1}: not UTF-8 text ({e.reason})") from None
    except csv.Error as e:
        raise InvalidRequestError(f"line {reader.line_num}: bad CSV: {e}") from None
    finally:
        text.detach()


_PARSERS = {"lines": _parse_lines, "json": _parse_json, "csv": _parse_csv}


class _InputReader:
    """Parses stdin on a thread; :meth:`chunks` yields lists of records.

    A chunk ends at :data:`CHUNK_RECORDS` records, :data:`CHUNK_BYTES` bytes,
    after :data:`IDLE_FLUSH_S` without input, or at the end. A parse error
    is raised by :meth:`chunks` after the records before it were yielded.
    """

    _END = object()

    def __init__(self, stream: IO[bytes], parser: Any, target: _Target, sep: bytes | None) -> None:
        self._queue: queue.Queue[Any] = queue.Queue(maxsize=2 * CHUNK_RECORDS)
        self._stop = threading.Event()
        self._thread = threading.Thread(
            target=self._run, args=(stream, parser, target, sep), name="logstore-cli-stdin", daemon=True
        )
        self._thread.start()

    def _put(self, item: Any) -> bool:
        while not self._stop.is_set():
            try:
                self._queue.put(item, timeout=0.1)
                return True
            except queue.Full:
                continue
        return False

    def _run(self, stream: IO[bytes], parser: Any, target: _Target, sep: bytes | None) -> None:
        try:
            for record in parser(stream, target, sep):
                if not self._put(record):
                    return
        except (LogstoreError, OSError) as e:
            self._put(e)
        except Exception as e:  # noqa: BLE001 - reported as the command's error
            self._put(InvalidRequestError(f"cannot read the input: {type(e).__name__}: {e}"))
        self._put(self._END)

    def close(self) -> None:
        self._stop.set()

    def chunks(self) -> Iterator[list[_Record]]:
        pending: list[_Record] = []
        size = 0
        while True:
            try:
                item = self._queue.get(timeout=IDLE_FLUSH_S if pending else 0.5)
            except queue.Empty:
                if pending:
                    yield pending
                    pending, size = [], 0
                continue
            if item is self._END or isinstance(item, BaseException):
                if pending:
                    yield pending
                if isinstance(item, BaseException):
                    raise item
                return
            pending.append(item)
            size += 32 + len(item.key or b"") + (len(item.value) if isinstance(item.value, bytes) else 64)
            if len(pending) >= CHUNK_RECORDS or size >= CHUNK_BYTES:
                yield pending
                pending, size = [], 0


# --------------------------------------------------------------------------- typed conversion


def _parse_timestamp(text: str) -> dt.datetime:
    iso = text.strip()
    iso = iso[:-1] + "+00:00" if iso.endswith(("Z", "z")) else iso
    when = dt.datetime.fromisoformat(iso)
    return when if when.tzinfo is not None else when.replace(tzinfo=dt.timezone.utc)


def _column(values: list[Any], f: pa.Field) -> pa.Array:
    """``values`` (JSON values or CSV strings) as an array of ``f``'s type; raises on misfits."""
    t = f.type
    try:
        return pa.array(values, t)
    except (pa.ArrowInvalid, pa.ArrowTypeError, TypeError, ValueError, OverflowError):
        pass
    if pa.types.is_timestamp(t):
        out = [_parse_timestamp(v) if isinstance(v, str) else v for v in values]
        if t.tz is None:
            out = [v.astimezone(dt.timezone.utc).replace(tzinfo=None) if isinstance(v, dt.datetime) else v
                   for v in out]
        return pa.array(out, t)
    if pa.types.is_date(t):
        return pa.array([dt.date.fromisoformat(v.strip()) if isinstance(v, str) else v for v in values], t)
    if pa.types.is_decimal(t):
        return pa.array([decimal.Decimal(str(v).strip()) if isinstance(v, (str, float)) else v
                         for v in values], t)
    if all(v is None or isinstance(v, str) for v in values):
        return pa.array([None if v is None else v.strip() for v in values], pa.string()).cast(t)
    return pa.array(values, t)  # raises the original error


def _first_misfit(records: list[_Record], f: pa.Field) -> tuple[pa.Array | None, int, str]:
    """Column ``f`` of ``records`` converted, or (None, index of the first misfit, why)."""
    values = [None if r.value is None else r.value.get(f.name) for r in records]  # type: ignore[union-attr]
    try:
        return _column(values, f), -1, ""
    except _MISFITS:
        pass
    for i, v in enumerate(values):
        try:
            _column([v], f)
        except _MISFITS as e:
            why = str(e).split("\n", 1)[0] or type(e).__name__
            return None, i, (
                f"line {records[i].line}: column {f.name!r}: {json.dumps(jsonable(v))} does not "
                f"convert to {format_type(f.type)} ({why})"
            )
    raise AssertionError(f"column {f.name!r} failed to convert but every value converts alone")


_MISFITS = (pa.ArrowException, TypeError, ValueError, OverflowError, decimal.InvalidOperation)


def _key_column_name(value_schema: pa.Schema | None) -> str:
    taken = set(value_schema.names) if value_schema is not None else set()
    name = "key"
    while name in taken or name == "value":
        name = "_" + name
    return name


def _to_table(records: list[_Record], target: _Target) -> tuple[pa.Table, str, int, str]:
    """The send_batch input for ``records``, its key column, and (index, why) of the first
    record that does not fit the topic's columns (-1, "" when all fit).

    The table holds only the records before that one.
    """
    key_name = _key_column_name(target.value_schema)
    if target.value_schema is None:
        keys = pa.array([r.key for r in records], pa.binary())
        values = pa.array([r.value for r in records], pa.binary())
        return pa.table({key_name: keys, "value": values}), key_name, -1, ""
    schema = target.value_schema
    good, bad, why = len(records), -1, ""
    arrays: list[pa.Array] = []
    for f in schema:
        # Each column is checked on the records that fit every column before it.
        arr, at, message = _first_misfit(records[:good], f)
        if arr is None:
            good, bad, why = at, at, message
            arr = _column([None if r.value is None else r.value.get(f.name)  # type: ignore[union-attr]
                           for r in records[:good]], f)
        arrays.append(arr)
    arrays = [a.slice(0, good) for a in arrays]
    return _assemble(records[:good], schema, arrays, key_name), key_name, bad, why


def _assemble(records: list[_Record], schema: pa.Schema, arrays: list[Any], key_name: str) -> pa.Table:
    keys = pa.array([r.key for r in records], pa.binary())
    tombstones = [r.value is None for r in records]
    if "value" not in schema.names:
        struct = pa.StructArray.from_arrays(
            arrays, fields=list(schema), mask=pa.array(tombstones, pa.bool_()) if any(tombstones) else None
        )
        return pa.table({key_name: keys, "value": struct})
    if any(tombstones):  # a column named 'value' leaves no column for a null struct
        i = tombstones.index(True)
        raise SchemaMismatchError(
            f"line {records[i].line}: a tombstone (null) cannot be sent to a typed topic that has "
            "a column named 'value'"
        )
    return pa.table({**{f.name: a for f, a in zip(schema, arrays, strict=True)}, key_name: keys})


# --------------------------------------------------------------------------- produce command


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
@click.argument("topic")
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
@format_option()
@bootstrap_option
@cli_errors
def produce(topic: str, input_format: str, key_field: str | None, key_separator: str | None,
            partition: int | None, acks: str, compression: str, output_format: str,
            bootstrap: str) -> None:
    """Append records read from stdin to TOPIC; print where they went."""
    if key_field is not None and input_format == "lines":
        raise click.UsageError("--key-field needs --input json or csv")
    if key_separator is not None and input_format == "csv":
        raise click.UsageError("--key-separator works with --input lines or json, not csv")
    if key_separator == "":
        raise click.UsageError("--key-separator must not be empty")
    if key_field is not None and key_separator is not None:
        raise click.UsageError("give --key-field or --key-separator, not both")
    configure_logging()
    with Admin(bootstrap) as admin:
        desc = admin.describe_topics([topic])[topic]
    if partition is not None and partition >= desc.num_partitions:
        raise UnknownTopicOrPartitionError(
            f"partition {partition} of topic {topic!r} does not exist (it has {desc.num_partitions} partitions)"
        )
    target = _Target(topic, desc.value_schema, key_field)
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
    producer = Producer(bootstrap, acks=acks, compression=None if compression == "none" else compression)
    reader = _InputReader(stdin, _PARSERS[input_format], target, sep)
    try:
        try:
            for chunk in reader.chunks():
                table, key_name, bad, why = _to_table(chunk, target)
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


# =========================================================================== consume


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


# =========================================================================== offsets


def _time_option(ctx: click.Context, param: click.Parameter, value: str | None) -> str | int | None:
    if value is None:
        return None
    try:
        return parse_time(value)
    except ValueError as e:
        raise click.BadParameter(str(e)) from None


@click.command()
@click.argument("topic")
@click.option("--time", "time_spec", default=None, callback=_time_option, metavar="TIME",
              help="Also find each partition's first offset at or after TIME: earliest, latest, "
                   "milliseconds since the epoch, or ISO-8601 (UTC unless it has an offset).")
@format_option()
@bootstrap_option
@cli_errors
def offsets(topic: str, time_spec: str | int | None, output_format: str, bootstrap: str) -> None:
    """Show the offsets of TOPIC's partitions: log start, end (HWM), LSO, LEO."""
    with Admin(bootstrap) as admin:
        desc = admin.describe_topics([topic])[topic]
        found = (admin.list_offsets({p.topic_partition: time_spec for p in desc.partitions})
                 if time_spec is not None else {})
    rows = []
    for p in desc.partitions:
        doc: dict[str, Any] = {
            "partition": p.partition,
            "log_start_offset": p.log_start_offset,
            "high_watermark": p.high_watermark,
            "last_stable_offset": p.last_stable_offset,
            "log_end_offset": p.log_end_offset,
        }
        if time_spec is not None:
            # (The broker's ListOffsets echoes the asked time, not the found record's: not shown.)
            doc["offset_for_time"] = found[p.topic_partition].offset
        rows.append(doc)
    if output_format == "json":
        print_json({"topic": topic, "time": time_spec, "partitions": rows})
        return
    columns = ["partition", "log start", "end (HWM)", "LSO", "LEO"]
    if time_spec is not None:
        label = time_spec if isinstance(time_spec, str) else iso_ms(time_spec)
        columns.append(f"offset at {label}")
    print_table(topic, columns, (
        [d["partition"], d["log_start_offset"], d["high_watermark"], d["last_stable_offset"],
         d["log_end_offset"]]
        + ([d["offset_for_time"]] if time_spec is not None else [])
        for d in rows
    ), numeric=columns)
