"""``logstore dump-segment``: the batches and records of a segment file, for people and scripts.

Checked against what the log wrote (batch facts, file positions, records),
and the CLI failure contract: a non-zero exit code and exactly one line on
stderr, ``error: [CODE] message``, never a traceback.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pyarrow as pa
import pytest
from click.testing import CliRunner, Result
from storage_helpers import SCHEMA, config, make_batch, read_all, simple_batch

from logstore.cli import main
from logstore.record import ATTR_TRANSACTIONAL, build_batch, typed_schema
from logstore.storage.log import Log

SCRIPT = Path(sys.executable).parent / "logstore"

DRAFTS = [
    (1_700_000_000_000, b"k1", b"hello", [("trace", b"abc")]),
    (1_700_000_000_005, None, b"\x00\xff\x10", None),
    (1_700_000_000_003, b"k2", None, None),
]


def dump(*args: str) -> Result:
    return CliRunner().invoke(main, ["dump-segment", *args])


def json_lines(result: Result) -> list[dict]:
    assert result.stdout, result.stderr
    return [json.loads(line) for line in result.stdout.splitlines()]


def one_error_line(result: Result, code: str) -> str:
    assert result.exit_code == 1, (result.exit_code, result.stdout, result.stderr)
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1, result.stderr
    assert lines[0].startswith(f"error: [{code}] "), lines[0]
    assert "Traceback" not in result.output
    return lines[0]


@pytest.fixture
def segment(tmp_path) -> tuple[str, Log]:
    """A closed segment with an lz4 batch (epoch 3) and a transactional batch of a producer."""
    log = Log.open(str(tmp_path / "t-0"), config=config(), schema=SCHEMA)
    log.append(make_batch(DRAFTS), leader_epoch=3, compression="lz4")
    log.append(simple_batch(2, ts=1_700_000_001_000), producer_id=7, producer_epoch=1, base_sequence=0,
               attributes=ATTR_TRANSACTIONAL)
    path = log.segments[0].path
    return path, log


def test_json_lines_match_what_the_log_wrote(segment) -> None:
    path, log = segment
    stored = log.segments[0].iter_batches()
    records = read_all(log)
    docs = json_lines(dump(path, "--records", "--format", "json"))
    assert [d["type"] for d in docs] == ["segment", "batch", "record", "record", "record",
                                         "batch", "record", "record", "summary"]
    head = docs[0]
    assert head["path"] == path and head["base_offset"] == 0 and head["size"] == os.path.getsize(path)
    assert [f["name"] for f in head["schema"]] == SCHEMA.names
    batches = [d for d in docs if d["type"] == "batch"]
    for doc, b in zip(batches, stored, strict=True):
        h = b.header
        assert doc == {
            "type": "batch", "base_offset": h.base_offset, "last_offset": h.last_offset,
            "record_count": h.record_count, "position": b.position, "size": b.size,
            "max_timestamp": h.max_timestamp, "max_timestamp_iso": doc["max_timestamp_iso"],
            "leader_epoch": h.leader_epoch, "producer_id": h.producer_id,
            "producer_epoch": h.producer_epoch, "base_sequence": h.base_sequence,
            "transactional": h.is_transactional, "control": None, "compression": h.compression,
            "crc": h.crc, "crc_valid": True, "format": 2,
        }
    assert batches[0]["compression"] == "lz4" and batches[0]["leader_epoch"] == 3
    assert batches[0]["max_timestamp_iso"] == "2023-11-14T22:13:20.005Z"
    assert batches[1]["transactional"] is True and batches[1]["producer_id"] == 7
    got = [d for d in docs if d["type"] == "record"]
    assert [d["offset"] for d in got] == [r[0] for r in records]
    assert [d["timestamp"] for d in got] == [r[1] for r in records]
    assert got[0]["key"] == "k1" and got[0]["value"] == "hello"
    assert got[0]["headers"] == [{"key": "trace", "value": "abc"}]
    assert got[1]["key"] is None and got[1]["value"] == {"base64": "AP8Q"}
    assert got[2]["value"] is None and got[2]["timestamp_iso"] == "2023-11-14T22:13:20.003Z"
    assert docs[-1] == {"type": "summary", "batches": 2, "records": 5, "crc_failures": 0, "error": None}


def test_table_output_for_people(segment) -> None:
    path, log = segment
    result = dump(path, "--records")
    assert result.exit_code == 0, result.stderr
    out = result.stdout
    assert f"Segment {path}" in out
    assert "key: binary" in out and "headers: list<item: struct<key: string, value: binary>>" in out
    b0, b1 = log.segments[0].iter_batches()
    for b in (b0, b1):
        assert str(b.header.crc) in out and str(b.position) in out
    assert "lz4" in out and "2023-11-14T22:13:20.005Z" in out
    assert "0x00ff10" in out  # not UTF-8 text: hex
    assert "hello" in out and "trace=abc" in out and "null" in out
    assert "2 batches, 5 records" in out
    # Without --records, no record tables.
    plain = dump(path).stdout
    assert "Records of batch" not in plain and "hello" not in plain


def test_typed_values_are_shown_as_json(tmp_path) -> None:
    value_schema = pa.schema([pa.field("id", pa.int64()), pa.field("name", pa.string())])
    schema = typed_schema(value_schema)
    log = Log.open(str(tmp_path / "t-0"), config=config(), schema=schema)
    values = pa.StructArray.from_arrays([pa.array([1, 2]), pa.array(["a", None])], fields=list(value_schema))
    log.append(build_batch(schema, values=values, timestamps_ms=[5, 6]))
    path = log.segments[0].path
    docs = json_lines(dump(path, "--records", "--format", "json"))
    assert [d["value"] for d in docs if d["type"] == "record"] == [{"id": 1, "name": "a"}, {"id": 2, "name": None}]
    table = dump(path, "--records").stdout
    assert '{"id": 1, "name": "a"}' in table


def test_no_verify_leaves_crcs_unchecked(segment) -> None:
    path, _ = segment
    docs = json_lines(dump(path, "--no-verify", "--format", "json"))
    assert {d["crc_valid"] for d in docs if d["type"] == "batch"} == {None}
    assert docs[-1]["crc_failures"] is None
    assert "not checked" in dump(path, "--no-verify").stdout


def flip(path: str, position: int) -> None:
    with open(path, "r+b") as f:
        f.seek(position)
        byte = f.read(1)[0]
        f.seek(position)
        f.write(bytes([byte ^ 0x20]))


def test_a_batch_failing_its_crc_is_listed_and_reported(segment) -> None:
    path, log = segment
    b0, b1 = log.segments[0].iter_batches()
    log.close()
    flip(path, b1.position + b1.body_start + 10)
    result = dump(path, "--records", "--format", "json")
    line = one_error_line(result, "CORRUPT_MESSAGE")
    assert path in line and f"offset {b1.header.base_offset}" in line and f"position {b1.position}" in line
    docs = json_lines(result)
    assert [d["crc_valid"] for d in docs if d["type"] == "batch"] == [True, False]
    # The good batch's records are printed; the damaged one's are not decoded.
    assert [d["offset"] for d in docs if d["type"] == "record"] == [0, 1, 2]
    table = dump(path, "--records")
    one_error_line(table, "CORRUPT_MESSAGE")
    assert "FAILED" in table.stdout and "not decoded" in table.stdout


def test_a_torn_tail_ends_the_listing_with_its_position(segment) -> None:
    path, log = segment
    b0, b1 = log.segments[0].iter_batches()
    log.close()
    os.truncate(path, b1.position + b1.body_start + 5)
    result = dump(path, "--format", "json")
    line = one_error_line(result, "CORRUPT_MESSAGE")
    assert f"position {b1.position}" in line and "truncated" in line
    docs = json_lines(result)
    assert [d["base_offset"] for d in docs if d["type"] == "batch"] == [0]
    assert docs[-1]["error"]["code"] == "CORRUPT_MESSAGE"
    table = dump(path)
    one_error_line(table, "CORRUPT_MESSAGE")
    assert "1 batches, 3 records" in table.stdout  # the batches before the tear are shown


@pytest.mark.parametrize("kind", ["missing", "directory", "index file", "garbage", "empty", "other arrow"])
def test_bad_paths_are_one_error_line(tmp_path, segment, kind) -> None:
    path, log = segment
    log.close()
    target = {
        "missing": str(tmp_path / "nope.arrow"),
        "directory": str(tmp_path),
        "index file": path[: -len(".arrow")] + ".index",
        "garbage": str(tmp_path / "garbage.arrow"),
        "empty": str(tmp_path / "empty.arrow"),
        "other arrow": str(tmp_path / "plain.arrow"),
    }[kind]
    if kind == "garbage":
        Path(target).write_bytes(os.urandom(4096))
    elif kind == "empty":
        Path(target).write_bytes(b"")
    elif kind == "other arrow":  # a valid Arrow stream, but not a logstore segment
        table = pa.table({"a": [1, 2]})
        with pa.ipc.new_stream(target, table.schema) as w:
            w.write_table(table)
    code = "OS_ERROR" if kind in ("missing", "directory") else (
        "SCHEMA_MISMATCH" if kind == "other arrow" else "CORRUPT_MESSAGE")
    line = one_error_line(dump(target), code)
    assert target in line or os.path.basename(target) in line


def test_the_installed_script(segment) -> None:
    path, log = segment
    done = subprocess.run([str(SCRIPT), "dump-segment", path, "--records", "--format", "json"],
                          capture_output=True, text=True, timeout=60)
    assert done.returncode == 0, done.stderr
    docs = [json.loads(line) for line in done.stdout.splitlines()]
    assert docs[-1]["records"] == 5 and docs[-1]["crc_failures"] == 0
    missing = subprocess.run([str(SCRIPT), "dump-segment", path + ".missing"],
                             capture_output=True, text=True, timeout=60)
    assert missing.returncode == 1
    assert missing.stderr.count("\n") == 1 and missing.stderr.startswith("error: [OS_ERROR] ")
    assert "Traceback" not in missing.stderr


def test_dump_segment_is_listed_in_help() -> None:
    result = CliRunner().invoke(main, ["--help"])
    assert result.exit_code == 0 and "dump-segment" in result.stdout
    result = CliRunner().invoke(main, ["dump-segment", "--help"])
    assert result.exit_code == 0 and "--records" in result.stdout and "--no-verify" in result.stdout
