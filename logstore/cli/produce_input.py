"""What ``logstore produce`` reads: stdin records in the formats lines, json and csv, as Arrow tables.

:class:`InputReader` reads stdin on a thread with a parser of :data:`PARSERS`
and hands out chunks of :class:`Record`; :func:`to_table` converts a chunk to
the Arrow table :meth:`logstore.Producer.send_batch` takes (bytes for an
untyped topic, the value columns of a typed one). Input formats:

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

Blank lines are skipped. A bad line is an error naming its line number.

Thread-safety: an :class:`InputReader` is used by one thread (it reads stdin on its own).
"""

from __future__ import annotations

import csv
import datetime as dt
import decimal
import io
import json
import queue
import threading
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from typing import IO, Any

import pyarrow as pa

from logstore.cli.common import (
    jsonable,
)
from logstore.errors import (
    InvalidRequestError,
    LogstoreError,
    SchemaMismatchError,
)
from logstore.schema_text import format_schema, format_type

__all__ = ["Record", "Target", "InputReader", "PARSERS", "to_table", "CHUNK_RECORDS", "CHUNK_BYTES",
           "IDLE_FLUSH_S"]

# A chunk of stdin records handed to send_batch at once.
CHUNK_RECORDS = 10_000
CHUNK_BYTES = 4 << 20
# Send what was read when stdin has been quiet this long (interactive input).
IDLE_FLUSH_S = 0.05


@dataclass(slots=True)
class Record:
    line: int
    key: bytes | None
    # bytes (untyped), a dict of value columns (typed), or None (a tombstone).
    value: bytes | dict[str, Any] | None


@dataclass(slots=True)
class Target:
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


def _parse_lines(stream: IO[bytes], target: Target, sep: bytes | None) -> Iterator[Record]:
    for n, raw in enumerate(stream, 1):
        data = raw.rstrip(b"\r\n") if raw.endswith(b"\n") else raw
        if not data:
            continue
        key, value = _split_key(data, sep, n)
        yield Record(n, key, value)


def _parse_json(stream: IO[bytes], target: Target, sep: bytes | None) -> Iterator[Record]:
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
            yield Record(n, key, None if doc is None else data.strip())
            continue
        if doc is None:
            yield Record(n, key, None)
            continue
        if not isinstance(doc, dict):
            raise SchemaMismatchError(
                f"line {n}: topic {target.topic!r} is typed: a record must be a JSON object of its "
                f"columns (or null for a tombstone), got {_json_kind(doc)}"
            )
        target.check_fields(list(doc), n)
        target.check_required(doc, n)
        yield Record(n, key, target.typed_value(doc))


def _json_kind(doc: Any) -> str:
    return {list: "an array", str: "a string", bool: "a boolean", type(None): "null"}.get(
        type(doc), "a number"
    )


def _parse_csv(stream: IO[bytes], target: Target, sep: bytes | None) -> Iterator[Record]:
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
                yield Record(n, key, json.dumps(doc, separators=(",", ":"), ensure_ascii=False).encode())
                continue
            typed = {k: (v if v or k in string_columns else None) for k, v in doc.items()}
            target.check_required(typed, n)
            yield Record(n, key, target.typed_value(typed))
    except UnicodeDecodeError as e:
        raise InvalidRequestError(f"line {reader.line_num + 1}: not UTF-8 text ({e.reason})") from None
    except csv.Error as e:
        raise InvalidRequestError(f"line {reader.line_num}: bad CSV: {e}") from None
    finally:
        text.detach()


PARSERS = {"lines": _parse_lines, "json": _parse_json, "csv": _parse_csv}


class InputReader:
    """Parses stdin on a thread; :meth:`chunks` yields lists of records.

    A chunk ends at :data:`CHUNK_RECORDS` records, :data:`CHUNK_BYTES` bytes,
    after :data:`IDLE_FLUSH_S` without input, or at the end. A parse error
    is raised by :meth:`chunks` after the records before it were yielded.
    """

    _END = object()

    def __init__(self, stream: IO[bytes], parser: Any, target: Target, sep: bytes | None) -> None:
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

    def _run(self, stream: IO[bytes], parser: Any, target: Target, sep: bytes | None) -> None:
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

    def chunks(self) -> Iterator[list[Record]]:
        pending: list[Record] = []
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


def _first_misfit(records: list[Record], f: pa.Field) -> tuple[pa.Array | None, int, str]:
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


def to_table(records: list[Record], target: Target) -> tuple[pa.Table, str, int, str]:
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


def _assemble(records: list[Record], schema: pa.Schema, arrays: list[Any], key_name: str) -> pa.Table:
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

