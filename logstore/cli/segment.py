"""``logstore dump-segment PATH``: what a segment file holds, batch by batch (Kafka's DumpLogSegments).

Reads one ``.arrow`` segment file directly, without a broker or a log: its
schema, then one line per batch with the batch facts (offsets, count, file
position and size, max timestamp, leader epoch, producer id / epoch / base
sequence, transactional and control flags, compression, CRC and whether it
verified), and with ``--records`` every record.

Output: ``--format table`` (default) prints rich tables for people;
``--format json`` prints JSON lines for scripts, one object per line with a
``type`` of ``segment``, ``batch``, ``record`` or ``summary``. In JSON, bytes
are UTF-8 text when they decode, else ``{"base64": ...}``; in tables they are
text when they decode to printable text, else ``0x``-hex (long ones cut).

Errors follow the CLI contract (:mod:`logstore.cli.common`): one line on
stderr and exit code 1. A batch that fails its CRC32C is shown as failed and
the command exits 1 after listing everything; a batch that cannot be parsed
at all (a torn tail, a damaged length) ends the listing there, after printing
the batches before it, with the error naming the file position.

Thread-safety: a CLI command; not for concurrent use.
"""

from __future__ import annotations

import json
import mmap
import os
import re
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

import click
import pyarrow as pa
from rich.table import Table
from rich.text import Text

from logstore.cli.common import (
    CliError,
    cli_errors,
    console,
    format_option,
    iso_ms,
    jsonable,
    print_json,
)
from logstore.errors import CorruptRecordError, SchemaMismatchError
from logstore.record import decode_schema
from logstore.record_reader import StoredBatch, parse_batch_at

__all__ = ["dump_segment"]

_SEGMENT_NAME = re.compile(r"(\d{20})\.arrow")
# Table cells longer than this are cut (JSON output is never cut).
_MAX_CELL_CHARS = 120


@dataclass(frozen=True, slots=True)
class _BatchInfo:
    batch: StoredBatch
    crc_valid: bool | None  # None: not checked (--no-verify)


def _map(path: str) -> memoryview:
    """The file's bytes, memory-mapped read-only (segments can be large); unmapped when
    the last view of them goes away."""
    with open(path, "rb") as f:
        if os.fstat(f.fileno()).st_size == 0:
            raise CliError(f"{path} is empty, not a logstore segment", code=CorruptRecordError.code)
        return memoryview(mmap.mmap(f.fileno(), 0, access=mmap.ACCESS_READ))


def _read_batches(data: memoryview, start: int, path: str, verify: bool) -> Iterator[_BatchInfo]:
    """Every batch from ``start`` on; raises :class:`CorruptRecordError` where parsing stops."""
    pos = start
    while pos < len(data):
        batch = parse_batch_at(data, pos, where=path)
        valid: bool | None = None
        if verify:
            try:
                batch.verify_crc(where=path)
                valid = True
            except CorruptRecordError:
                valid = False
        yield _BatchInfo(batch, valid)
        pos += batch.size


def _records(info: _BatchInfo, schema: pa.Schema) -> list[dict[str, Any]]:
    """The batch's records as dicts (``offset``, ``timestamp``, ``key``, ``value``, ``headers``).

    A batch that failed its CRC is not decoded (its layout cannot be trusted);
    an unverified one is fully validated before its values are touched.
    """
    if info.crc_valid is False:
        return []
    rb = info.batch.decode(schema, validate=info.crc_valid is None)
    offsets = rb.column("offset").to_pylist()
    stamps = rb.column("timestamp").cast(pa.int64()).to_pylist()
    keys = rb.column("key").to_pylist()
    values = rb.column("value").to_pylist()
    headers = rb.column("headers").to_pylist()
    return [
        {"offset": o, "timestamp": t, "key": k, "value": v,
         "headers": None if h is None else [(e["key"], e["value"]) for e in h]}
        for o, t, k, v, h in zip(offsets, stamps, keys, values, headers, strict=True)
    ]


# --------------------------------------------------------------------------- rendering


def _cell_bytes(data: bytes | None) -> Text:
    if data is None:
        return Text("null", style="dim")
    try:
        text = data.decode("utf-8")
        if not text.isprintable():
            raise ValueError
    except ValueError:
        text = "0x" + data.hex()
    return _cut(text, len(data))


def _cut(text: str, size: int) -> Text:
    if len(text) > _MAX_CELL_CHARS:
        return Text(text[:_MAX_CELL_CHARS] + f"… ({size} bytes)")
    return Text(text)


def _cell_value(value: Any) -> Text:
    if value is None or isinstance(value, bytes):
        return _cell_bytes(value)
    text = json.dumps(jsonable(value), ensure_ascii=False)  # a typed topic's value columns
    return _cut(text, len(text))


def _cell_headers(headers: list[tuple[str, bytes | None]] | None) -> Text:
    if not headers:
        return Text("-", style="dim")
    parts = [f"{k}={_cell_bytes(v).plain}" for k, v in headers]
    return _cut(", ".join(parts), sum(len(p) for p in parts))


def _record_doc(r: dict[str, Any]) -> dict[str, Any]:
    headers = r["headers"]
    return {
        "type": "record", "offset": r["offset"], "timestamp": r["timestamp"],
        "timestamp_iso": iso_ms(r["timestamp"]), "key": jsonable(r["key"]), "value": jsonable(r["value"]),
        "headers": None if headers is None else [{"key": k, "value": jsonable(v)} for k, v in headers],
    }


def _control(batch: StoredBatch) -> str:
    h = batch.header
    if not h.is_control:
        return ""
    return "abort" if h.is_abort_marker else "commit"


def _batch_doc(info: _BatchInfo) -> dict[str, Any]:
    b, h = info.batch, info.batch.header
    return {
        "type": "batch",
        "base_offset": h.base_offset,
        "last_offset": h.last_offset,
        "record_count": h.record_count,
        "position": b.position,
        "size": b.size,
        "max_timestamp": h.max_timestamp,
        "max_timestamp_iso": iso_ms(h.max_timestamp),
        "leader_epoch": h.leader_epoch,
        "producer_id": h.producer_id,
        "producer_epoch": h.producer_epoch,
        "base_sequence": h.base_sequence,
        "transactional": h.is_transactional,
        "control": _control(b) or None,
        "compression": h.compression,
        "crc": h.crc,
        "crc_valid": info.crc_valid,
        "format": b.version,
    }


_BATCH_COLUMNS = (
    ("base offset", True), ("last offset", True), ("count", True), ("position", True),
    ("size", True), ("max timestamp", False), ("epoch", True), ("producer id", True),
    ("p.epoch", True), ("base seq", True), ("txn", False), ("control", False),
    ("compression", False), ("crc", True), ("crc ok", False),
)


def _batch_row(info: _BatchInfo) -> list[Text]:
    d = _batch_doc(info)
    ok = {True: Text("yes", style="green"), False: Text("FAILED", style="bold red"),
          None: Text("not checked", style="dim")}[info.crc_valid]
    cells = [
        d["base_offset"], d["last_offset"], d["record_count"], d["position"], d["size"],
        d["max_timestamp_iso"], d["leader_epoch"], d["producer_id"], d["producer_epoch"],
        d["base_sequence"], "yes" if d["transactional"] else "", d["control"] or "",
        d["compression"] or "none", d["crc"],
    ]
    return [Text(str(c)) for c in cells] + [ok]


def _table(title: str, columns: tuple[tuple[str, bool], ...]) -> Table:
    table = Table(title=title, title_justify="left")
    for name, numeric in columns:
        table.add_column(name, justify="right" if numeric else "left", overflow="fold")
    return table


# --------------------------------------------------------------------------- the command


@click.command("dump-segment")
@click.argument("path", type=click.Path(path_type=str))
@click.option("--records", "show_records", is_flag=True, help="Also print every record of every batch.")
@format_option()
@click.option("--verify/--no-verify", default=True, show_default=True,
              help="Check each batch's CRC32C.")
@cli_errors
def dump_segment(path: str, show_records: bool, output_format: str, verify: bool) -> None:
    """Print the schema and the batches (and with --records, the records) of a segment file."""
    data = _map(path)
    try:
        schema, data_start = decode_schema(data, where=path)
    except (CorruptRecordError, SchemaMismatchError) as e:
        detail = e.message.removeprefix(f"{path}: ")
        raise CliError(f"{path} is not a logstore segment: {detail}", code=e.code) from None
    named = _SEGMENT_NAME.fullmatch(os.path.basename(path))
    name_base = int(named.group(1)) if named else None
    emit = _json_output if output_format == "json" else _table_output
    failed, error = emit(path, schema, data, data_start, name_base, show_records, verify)
    if error is not None:
        raise error
    if failed:
        first = failed[0].batch
        raise CliError(
            f"{path}: {len(failed)} batch(es) failed CRC32C verification, the first at offset "
            f"{first.header.base_offset} (position {first.position})",
            code=CorruptRecordError.code,
        )


_Result = tuple[list[_BatchInfo], "CorruptRecordError | None"]


def _json_output(path: str, schema: pa.Schema, data: memoryview, data_start: int,
                 name_base: int | None, show_records: bool, verify: bool) -> _Result:
    print_json({
        "type": "segment", "path": path, "base_offset": name_base, "size": len(data),
        "schema_size": data_start,
        "schema": [{"name": f.name, "type": str(f.type), "nullable": f.nullable} for f in schema],
    }, lines=True)
    failed: list[_BatchInfo] = []
    batches = records = 0
    error: CorruptRecordError | None = None
    try:
        for info in _read_batches(data, data_start, path, verify):
            batches += 1
            records += info.batch.header.record_count
            if info.crc_valid is False:
                failed.append(info)
            print_json(_batch_doc(info), lines=True)
            if show_records:
                for r in _records(info, schema):
                    print_json(_record_doc(r), lines=True)
    except CorruptRecordError as e:
        error = e
    print_json({"type": "summary", "batches": batches, "records": records,
                "crc_failures": len(failed) if verify else None,
                "error": None if error is None else {"code": error.code, "message": error.message}},
               lines=True)
    return failed, error


def _table_output(path: str, schema: pa.Schema, data: memoryview, data_start: int,
                  name_base: int | None, show_records: bool, verify: bool) -> _Result:
    out = console()
    out.print(Text(f"Segment {path}", style="bold"))
    facts = f"{len(data):,} bytes; schema message {data_start:,} bytes"
    if name_base is not None:
        facts += f"; base offset {name_base} (from the file name)"
    out.print(Text(facts))
    out.print(Text("Schema:", style="bold"))
    out.print(Text(schema.to_string(show_schema_metadata=False)))
    out.print()
    table = _table("Batches", _BATCH_COLUMNS)
    failed: list[_BatchInfo] = []
    error: CorruptRecordError | None = None
    records = 0
    record_tables: list[Table] = []
    try:
        for info in _read_batches(data, data_start, path, verify):
            table.add_row(*_batch_row(info))
            records += info.batch.header.record_count
            if info.crc_valid is False:
                failed.append(info)
            if show_records:
                h = info.batch.header
                rt = _table(f"Records of batch {h.base_offset}..{h.last_offset} "
                            f"(position {info.batch.position})",
                            (("offset", True), ("timestamp", False), ("key", False),
                             ("value", False), ("headers", False)))
                rows = _records(info, schema)
                for r in rows:
                    rt.add_row(Text(str(r["offset"])), Text(iso_ms(r["timestamp"])),
                               _cell_bytes(r["key"]), _cell_value(r["value"]),
                               _cell_headers(r["headers"]))
                if not rows:
                    rt.caption = "not decoded: the batch failed its CRC check"
                record_tables.append(rt)
    except CorruptRecordError as e:
        error = e
    out.print(table)
    for rt in record_tables:
        out.print(rt)
    out.print(Text(f"{table.row_count} batches, {records} records"
                   + ("" if verify else " (CRCs not checked)")))
    return failed, error
