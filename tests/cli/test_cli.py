"""The ``logstore`` CLI: every verb through click's CliRunner against an embedded broker,
and the installed ``logstore`` script end to end in real processes.

Failure contract checked everywhere: a non-zero exit code and exactly one line
on stderr, ``error: [CODE] message``, never a traceback.
"""

from __future__ import annotations

import base64
import itertools
import json
import os
import signal
import socket
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from importlib import metadata
from pathlib import Path

import click
import pytest
from click.testing import CliRunner, Result

from logstore import Admin, Consumer, Producer, TopicPartition
from logstore.broker.embedded import EmbeddedBroker
from logstore.cli import main
from logstore.cli.common import jsonable, parse_config_pairs, parse_time, text_or_base64
from logstore.cli.plugins import ENTRY_POINT_GROUP, PluginCommand, add_plugin_commands
from logstore.client.partitioner import partition_for_key
from logstore.errors import InvalidConfigError

pytestmark = pytest.mark.timeout(60)

_names = itertools.count()
SCRIPT = Path(sys.executable).parent / "logstore"


@pytest.fixture(scope="module")
def broker() -> Iterator[EmbeddedBroker]:
    with EmbeddedBroker() as b:
        yield b


@pytest.fixture
def run(broker: EmbeddedBroker):  # type: ignore[no-untyped-def]
    """``run(*args, input=...)``: invoke the CLI in-process against the module's broker."""
    runner = CliRunner(env={"LOGSTORE_BOOTSTRAP": broker.bootstrap})

    def invoke(*args: str, input: str | bytes | None = None) -> Result:
        return runner.invoke(main, list(args), input=input)

    return invoke


def ok(result: Result) -> Result:
    assert result.exit_code == 0, (result.exit_code, result.stdout, result.stderr, result.exception)
    return result


def fails(result: Result, code: str, *, exit_code: int = 1) -> str:
    """The one stderr line of a failed run (which must carry ``[code]``)."""
    assert result.exit_code == exit_code, (result.exit_code, result.stdout, result.stderr)
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1, result.stderr
    assert lines[0].startswith(f"error: [{code}] "), lines[0]
    assert "Traceback" not in result.output
    return lines[0]


def new_topic(run, *args: str) -> str:  # type: ignore[no-untyped-def]
    name = f"cli-{next(_names)}"
    ok(run("topics", "create", name, *args))
    return name


def consume_json(run, topic: str, count: int, *args: str) -> list[dict]:  # type: ignore[no-untyped-def]
    result = ok(run("consume", topic, "--from-beginning", "--max-records", str(count),
                    "--timeout-ms", "10000", "--format", "json", *args))
    return [json.loads(line) for line in result.stdout.splitlines()]


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


# --------------------------------------------------------------------------- topics


def test_topics_create_list_describe_alter_delete(run) -> None:  # type: ignore[no-untyped-def]
    name = f"cli-{next(_names)}"
    out = ok(run("topics", "create", name, "--partitions", "3", "--config", "retention.ms=3600000"))
    assert out.stdout.strip() == f"created topic {name}: 3 partitions, untyped"

    listed = json.loads(ok(run("topics", "list", "--format", "json")).stdout)
    assert {"name": name, "partitions": 3, "offsets": 0, "schema": None}.items() <= next(
        t for t in listed if t["name"] == name).items()
    assert name in ok(run("topics", "list")).stdout

    doc = json.loads(ok(run("topics", "describe", name, "--format", "json")).stdout)
    assert doc["name"] == name and doc["schema"] is None and doc["topic_id"]
    assert doc["configs"]["retention.ms"] == "3600000"
    assert [p["partition"] for p in doc["partitions"]] == [0, 1, 2]
    assert {k: doc["partitions"][0][k] for k in (
        "leader", "log_start_offset", "log_end_offset", "high_watermark", "last_stable_offset")} == {
        "leader": 0, "log_start_offset": 0, "log_end_offset": 0, "high_watermark": 0,
        "last_stable_offset": 0}
    table = ok(run("topics", "describe", name)).stdout
    for heading in ("log start", "LEO", "HWM", "LSO", "size", "retention.ms", "untyped"):
        assert heading in table

    out = ok(run("topics", "alter", name, "--config", "retention.ms=1000",
                 "--config", "segment.ms=60000", "--delete-config", "cleanup.policy"))
    assert "retention.ms=1000" in out.stdout and "cleanup.policy reset" in out.stdout
    configs = json.loads(ok(run("topics", "describe", name, "--format", "json")).stdout)["configs"]
    assert configs["retention.ms"] == "1000" and configs["segment.ms"] == "60000"

    assert ok(run("topics", "delete", name)).stdout.strip() == f"deleted topic {name}"
    assert name not in [t["name"] for t in json.loads(ok(run("topics", "list", "--format", "json")).stdout)]
    fails(run("topics", "describe", name), "UNKNOWN_TOPIC_OR_PARTITION")


def test_create_typed_and_compacted_topic(run) -> None:  # type: ignore[no-untyped-def]
    name = new_topic(run, "--config", "cleanup.policy=compact",
                     "--schema", "customer_id long NOT NULL, name string, tier string")
    doc = json.loads(ok(run("topics", "describe", name, "--format", "json")).stdout)
    assert doc["schema"] == "customer_id bigint NOT NULL, name string, tier string"
    assert doc["configs"]["cleanup.policy"] == "compact"
    arrow_json = '[{"name": "id", "type": "int64", "nullable": false}, {"name": "at", "type": "timestamp"}]'
    other = new_topic(run, "--schema", arrow_json)
    assert json.loads(ok(run("topics", "describe", other, "--format", "json")).stdout)["schema"] == (
        "id bigint NOT NULL, at timestamp")


def test_topic_errors_are_one_line(run) -> None:  # type: ignore[no-untyped-def]
    line = fails(run("topics", "create", "x-bad-schema", "--schema", "id lng"), "SCHEMA_MISMATCH")
    assert "unknown type 'lng'" in line
    line = fails(run("topics", "create", "x-bad-config", "--config", "retention.ms"), "INVALID_CONFIG")
    assert "'retention.ms' is not key=value" in line
    line = fails(run("topics", "create", "x-unknown-config", "--config", "no.such.key=1"), "INVALID_CONFIG")
    assert "no.such.key" in line
    fails(run("topics", "create", "x-bad-value", "--config", "retention.ms=soon"), "INVALID_CONFIG")
    fails(run("topics", "create", "bad/name"), "INVALID_TOPIC")
    name = new_topic(run)
    fails(run("topics", "create", name), "TOPIC_ALREADY_EXISTS")
    fails(run("topics", "alter", name, "--config", "retention.ms=-5"), "INVALID_CONFIG")
    fails(run("topics", "alter", "no-such-topic", "--config", "retention.ms=5"),
          "UNKNOWN_TOPIC_OR_PARTITION")
    fails(run("topics", "delete", "no-such-topic"), "UNKNOWN_TOPIC_OR_PARTITION")
    # Usage errors are click's (exit code 2).
    assert run("topics", "alter", name).exit_code == 2
    assert run("topics", "create", name, "--partitions", "0").exit_code == 2


# --------------------------------------------------------------------------- produce and consume


def test_produce_lines_and_consume_json(run) -> None:  # type: ignore[no-untyped-def]
    topic = new_topic(run, "--partitions", "3")
    values = [f"value {i}" for i in range(50)]
    out = ok(run("produce", topic, "--format", "json", input="\n".join(values) + "\n\n"))
    summary = json.loads(out.stdout)
    assert summary["records"] == 50
    assert sum(p["records"] for p in summary["partitions"]) == 50
    for p in summary["partitions"]:
        assert p["last_offset"] - p["first_offset"] + 1 == p["records"]
    got = consume_json(run, topic, 50)
    assert sorted(r["value"] for r in got) == sorted(values)
    first = got[0]
    assert set(first) == {"topic", "partition", "offset", "timestamp", "timestamp_ms", "key", "value", "headers"}
    assert first["topic"] == topic and first["key"] is None and first["headers"] == []
    assert first["timestamp"].endswith("Z") and abs(first["timestamp_ms"] - time.time() * 1000) < 60_000
    # Records of a partition come in offset order.
    for p in range(3):
        offsets = [r["offset"] for r in got if r["partition"] == p]
        assert offsets == sorted(offsets)


def test_produce_with_keys_partitions_by_key(run) -> None:  # type: ignore[no-untyped-def]
    topic = new_topic(run, "--partitions", "4")
    lines = [f"user-{i % 7}:event {i}" for i in range(40)]
    ok(run("produce", topic, "--key-separator", ":", input="\n".join(lines)))
    got = consume_json(run, topic, 40)
    for r in got:
        assert r["partition"] == partition_for_key(r["key"].encode(), 4)
        assert r["value"].startswith("event ")
    out = ok(run("consume", topic, "--from-beginning", "--partition", "0", "--partition", "1",
                 "--timeout-ms", "500", "--key-separator", "="))
    expected = sum(1 for r in got if r["partition"] in (0, 1))
    lines_out = out.stdout.splitlines()
    assert len(lines_out) == expected and all(line.startswith("user-") and "=event " in line
                                              for line in lines_out)


def test_produce_to_one_partition_with_acks_and_compression(run) -> None:  # type: ignore[no-untyped-def]
    topic = new_topic(run, "--partitions", "3")
    out = ok(run("produce", topic, "--partition", "2", "--compression", "zstd", "--acks", "1",
                 "--format", "json", input="a\nb\nc\n"))
    assert json.loads(out.stdout)["partitions"] == [
        {"partition": 2, "records": 3, "first_offset": 0, "last_offset": 2}]
    out = ok(run("produce", topic, "--partition", "2", "--acks", "0", "--compression", "lz4",
                 "--format", "json", input="d\n"))
    assert json.loads(out.stdout)["partitions"] == [
        {"partition": 2, "records": 1, "first_offset": None, "last_offset": None}]
    got = consume_json(run, topic, 4)
    assert [(r["partition"], r["offset"], r["value"]) for r in got] == [
        (2, 0, "a"), (2, 1, "b"), (2, 2, "c"), (2, 3, "d")]
    fails(run("produce", topic, "--partition", "3", input="x\n"), "UNKNOWN_TOPIC_OR_PARTITION")


def test_produce_json_untyped_keeps_the_line_and_takes_the_key_field(run) -> None:  # type: ignore[no-untyped-def]
    topic = new_topic(run)
    lines = ['{"id": 7, "name": "seven"}', '{"id": "x-1", "tags": [1, 2]}', '{"id": null}']
    ok(run("produce", topic, "--input", "json", "--key-field", "id", input="\n".join(lines)))
    got = consume_json(run, topic, 3)
    assert [(r["key"], r["value"]) for r in got] == [("7", lines[0]), ("x-1", lines[1]), (None, lines[2])]


def test_produce_json_to_typed_topic_with_tombstones(run) -> None:  # type: ignore[no-untyped-def]
    topic = new_topic(run, "--schema", "id long NOT NULL, name string, at timestamp, price decimal(10,2), "
                                       "tags array<string>", "--config", "cleanup.policy=compact")
    lines = [
        '{"id": 1, "name": "one", "at": "2024-05-01T12:00:00Z", "price": "9.99", "tags": ["a"]}',
        '{"id": 2, "name": null, "price": 3}',
        '{"id": 1, "name": "uno", "at": "2024-05-01 13:00:00"}',
    ]
    ok(run("produce", topic, "--input", "json", "--key-field", "id", input="\n".join(lines)))
    ok(run("produce", topic, "--input", "json", "--key-separator", "\t", input="2\tnull\n"))
    got = consume_json(run, topic, 4)
    assert [r["key"] for r in got] == ["1", "2", "1", "2"]
    assert [r["value"] for r in got] == [
        {"id": 1, "name": "one", "at": "2024-05-01T12:00:00Z", "price": "9.99", "tags": ["a"]},
        {"id": 2, "name": None, "at": None, "price": "3.00", "tags": None},
        {"id": 1, "name": "uno", "at": "2024-05-01T13:00:00Z", "price": None, "tags": None},
        None,
    ]
    table = ok(run("consume", topic, "--from-beginning", "--timeout-ms", "500", "--format", "table")).stdout
    assert '"name":"uno"' in table and "null" in table


def test_produce_csv(run) -> None:  # type: ignore[no-untyped-def]
    typed = new_topic(run, "--schema", "id int NOT NULL, name string, score double, ok boolean")
    csv_text = 'id,name,score,ok\n1,Ann,1.5,true\n2,"Smith, Bob",,false\n3,,2,\n'
    out = ok(run("produce", typed, "--input", "csv", "--key-field", "name", "--format", "json", input=csv_text))
    assert json.loads(out.stdout)["records"] == 3
    got = consume_json(run, typed, 3)
    assert [r["value"] for r in got] == [
        {"id": 1, "name": "Ann", "score": 1.5, "ok": True},
        {"id": 2, "name": "Smith, Bob", "score": None, "ok": False},
        {"id": 3, "name": "", "score": 2.0, "ok": None},
    ]
    assert [r["key"] for r in got] == ["Ann", "Smith, Bob", ""]
    untyped = new_topic(run)
    ok(run("produce", untyped, "--input", "csv", input="a,b\n1,x\n"))
    assert json.loads(consume_json(run, untyped, 1)[0]["value"]) == {"a": "1", "b": "x"}


def test_bad_input_lines_stop_with_the_line_number(run) -> None:  # type: ignore[no-untyped-def]
    topic = new_topic(run)
    result = run("produce", topic, "--input", "json", "--format", "json",
                 input='{"a": 1}\n\n{"a": 2}\n{"a": \n{"a": 4}\n')
    line = fails(result, "INVALID_REQUEST")
    assert "line 4: not valid JSON" in line
    assert json.loads(result.stdout)["records"] == 2  # every line before the bad one was sent
    assert [r["value"] for r in consume_json(run, topic, 2)] == ['{"a": 1}', '{"a": 2}']

    assert "line 2: no key separator ':'" in fails(
        run("produce", topic, "--key-separator", ":", input="k:v\nno separator\n"), "INVALID_REQUEST")
    assert "line 1: the object has no field 'id'" in fails(
        run("produce", topic, "--input", "json", "--key-field", "id", input='{"a": 1}\n'), "INVALID_REQUEST")
    assert "line 3: 1 fields but the header has 2 columns" in fails(
        run("produce", topic, "--input", "csv", input="a,b\n1,2\n3\n"), "INVALID_REQUEST")
    assert "line 1: not UTF-8" in fails(
        run("produce", topic, "--input", "json", input=b'"\xff"\n'), "INVALID_REQUEST")


def test_values_that_do_not_fit_a_typed_topic(run) -> None:  # type: ignore[no-untyped-def]
    topic = new_topic(run, "--schema", "id long NOT NULL, name string")
    result = run("produce", topic, "--input", "json", "--format", "json",
                 input='{"id": 1}\n{"id": 2}\n{"id": "two"}\n{"id": 4}\n')
    line = fails(result, "SCHEMA_MISMATCH")
    assert "line 3: column 'id'" in line and '"two"' in line
    assert json.loads(result.stdout)["records"] == 2
    assert [r["value"]["id"] for r in consume_json(run, topic, 2)] == [1, 2]
    assert "unknown fields 'nmae'" in fails(
        run("produce", topic, "--input", "json", input='{"id": 5, "nmae": "x"}\n'), "INVALID_REQUEST")
    assert "line 1: column 'id' is NOT NULL" in fails(
        run("produce", topic, "--input", "json", input='{"name": "x"}\n'), "SCHEMA_MISMATCH")
    assert "a JSON object" in fails(
        run("produce", topic, "--input", "json", input="[1, 2]\n"), "SCHEMA_MISMATCH")
    assert "use --input json or csv" in fails(run("produce", topic, input="x\n"), "SCHEMA_MISMATCH")
    assert "lacks the NOT NULL column(s) id" in fails(
        run("produce", topic, "--input", "csv", input="name\nx\n"), "SCHEMA_MISMATCH")


def test_produce_option_conflicts_are_usage_errors(run) -> None:  # type: ignore[no-untyped-def]
    topic = new_topic(run)
    assert run("produce", topic, "--key-field", "id", input="x\n").exit_code == 2
    assert run("produce", topic, "--input", "csv", "--key-separator", ":", input="x\n").exit_code == 2
    assert run("produce", topic, "--input", "json", "--key-field", "a", "--key-separator", ":").exit_code == 2


def test_consume_binary_values_and_headers(broker: EmbeddedBroker, run) -> None:  # type: ignore[no-untyped-def]
    topic = new_topic(run)
    with Producer(broker.bootstrap) as producer:
        producer.send(topic, b"\xff\x00raw", key=b"\xfe\x01", headers=[("h", b"v"), ("bin", b"\xfe")]).result(10)
    [record] = consume_json(run, topic, 1)
    assert record["value"] == {"base64": base64.b64encode(b"\xff\x00raw").decode()}
    assert record["key"] == {"base64": "/gE="}
    assert record["headers"] == [["h", "v"], ["bin", {"base64": "/g=="}]]
    lines = ok(run("consume", topic, "--from-beginning", "--max-records", "1")).stdout
    assert json.loads(lines) == {"base64": base64.b64encode(b"\xff\x00raw").decode()}


def test_consume_positions(run) -> None:  # type: ignore[no-untyped-def]
    topic = new_topic(run, "--partitions", "2")
    ok(run("produce", topic, "--partition", "1", input="".join(f"{i}\n" for i in range(10))))
    out = ok(run("consume", topic, "--partition", "1", "--offset", "7", "--timeout-ms", "500"))
    assert out.stdout.split() == ["7", "8", "9"]
    # Without --from-beginning it starts at the end: nothing old arrives.
    assert ok(run("consume", topic, "--timeout-ms", "300")).stdout == ""
    out = ok(run("consume", topic, "--from-beginning", "--max-records", "4", "--timeout-ms", "5000"))
    assert out.stdout.split() == ["0", "1", "2", "3"]
    assert "out of range" in fails(run("consume", topic, "--partition", "1", "--offset", "11",
                                       "--timeout-ms", "100"), "OFFSET_OUT_OF_RANGE")
    fails(run("consume", topic, "--partition", "2", "--timeout-ms", "100"), "UNKNOWN_TOPIC_OR_PARTITION")
    fails(run("consume", "no-such-topic", "--timeout-ms", "100"), "UNKNOWN_TOPIC_OR_PARTITION")
    assert run("consume", topic, "--offset", "1").exit_code == 2  # needs one --partition
    assert run("consume", topic, "--partition", "1", "--offset", "1", "--from-beginning").exit_code == 2


def test_consume_sees_records_produced_while_it_runs(broker: EmbeddedBroker, run) -> None:  # type: ignore[no-untyped-def]
    topic = new_topic(run)

    def later() -> None:
        time.sleep(0.5)
        with Producer(broker.bootstrap) as producer:
            producer.send(topic, b"late").result(10)

    thread = threading.Thread(target=later)
    thread.start()
    out = ok(run("consume", topic, "--max-records", "1", "--timeout-ms", "10000"))
    thread.join()
    assert out.stdout == "late\n"


# --------------------------------------------------------------------------- offsets


def test_offsets(broker: EmbeddedBroker, run) -> None:  # type: ignore[no-untyped-def]
    topic = new_topic(run, "--partitions", "2")
    with Producer(broker.bootstrap) as producer:
        for i, ts in enumerate([1_000, 2_000, 3_000]):
            producer.send(topic, b"v%d" % i, partition=0, timestamp_ms=ts).result(10)
    doc = json.loads(ok(run("offsets", topic, "--format", "json")).stdout)
    assert doc["partitions"] == [
        {"partition": 0, "log_start_offset": 0, "high_watermark": 3, "last_stable_offset": 3,
         "log_end_offset": 3},
        {"partition": 1, "log_start_offset": 0, "high_watermark": 0, "last_stable_offset": 0,
         "log_end_offset": 0},
    ]
    for spec, expected in (("1500", [1, None]), ("1970-01-01T00:00:02Z", [1, None]),
                           ("1970-01-01T00:00:02.001", [2, None]), ("earliest", [0, 0]),
                           ("latest", [3, 0]), ("9999999999999", [None, None])):
        doc = json.loads(ok(run("offsets", topic, "--time", spec, "--format", "json")).stdout)
        assert [p["offset_for_time"] for p in doc["partitions"]] == expected, spec
    table = ok(run("offsets", topic, "--time", "2000")).stdout
    assert "end (HWM)" in table and "offset at 1970-01-01T00:00:02.000Z" in table
    assert run("offsets", topic, "--time", "yesterday").exit_code == 2
    fails(run("offsets", "no-such-topic"), "UNKNOWN_TOPIC_OR_PARTITION")


# --------------------------------------------------------------------------- broker down


@pytest.mark.parametrize("args", [
    ["topics", "list"],
    ["topics", "create", "t"],
    ["topics", "describe", "t"],
    ["produce", "t"],
    ["consume", "t", "--timeout-ms", "100"],
    ["offsets", "t"],
])
def test_broker_down_is_one_line(args: list[str]) -> None:
    result = CliRunner().invoke(main, [*args, "--bootstrap", f"127.0.0.1:{free_port()}"], input="x\n")
    line = fails(result, "BROKER_NOT_AVAILABLE")
    assert "unavailable" in line


# --------------------------------------------------------------------------- helpers


def test_parse_time() -> None:
    assert parse_time("earliest") == "earliest" and parse_time(" LATEST ") == "latest"
    assert parse_time("1714564800000") == 1714564800000
    assert parse_time("2024-05-01T12:00:00Z") == 1714564800000
    assert parse_time("2024-05-01T12:00:00") == 1714564800000  # UTC unless it says otherwise
    assert parse_time("2024-05-01T14:00:00+02:00") == 1714564800000
    assert parse_time("2024-05-01T12:00:00.250Z") == 1714564800250
    for bad in ("yesterday", "-5", "1969-12-31T00:00:00Z", ""):
        with pytest.raises(ValueError):
            parse_time(bad)


def test_parse_config_pairs() -> None:
    assert parse_config_pairs(["a=1", " b = x=y ", "c="]) == {"a": "1", "b": "x=y", "c": ""}
    for bad in ("a", "=1"):
        with pytest.raises(InvalidConfigError):
            parse_config_pairs([bad])


def test_json_rendering_of_values() -> None:
    import datetime as dt
    import decimal

    assert text_or_base64(b"caf\xc3\xa9") == "café"
    assert text_or_base64(b"\xff") == {"base64": "/w=="}
    when = dt.datetime(2024, 5, 1, 12, tzinfo=dt.timezone.utc)
    assert jsonable({"b": b"\x00\xff", "t": when, "d": dt.date(2024, 5, 1),
                     "n": decimal.Decimal("1.50"), "f": float("nan"), "l": [(1, b"x")]}) == {
        "b": {"base64": "AP8="}, "t": "2024-05-01T12:00:00Z", "d": "2024-05-01", "n": "1.50",
        "f": "nan", "l": [[1, "x"]]}


# --------------------------------------------------------------------------- plugins


def _entry_point(name: str, value: str) -> metadata.EntryPoint:
    return metadata.EntryPoint(name=name, value=value, group=ENTRY_POINT_GROUP)


def test_plugins_load_lazily_and_a_broken_one_fails_alone(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    (tmp_path / "cli_plugin_sample.py").write_text(
        "import click\n"
        "@click.group()\n"
        "def jobs():\n    'Sample jobs.'\n"
        "@jobs.command()\n@click.argument('n', type=int)\n@click.option('--twice', is_flag=True)\n"
        "def run(n, twice):\n    click.echo(n * (2 if twice else 1))\n"
    )
    monkeypatch.syspath_prepend(str(tmp_path))
    monkeypatch.setattr("logstore.cli.plugins._entry_points", lambda: [
        _entry_point("jobs", "cli_plugin_sample:jobs"),
        _entry_point("broken", "no_such_module_for_logstore:main"),
        _entry_point("notcmd", "os:sep"),
        _entry_point("topics", "cli_plugin_sample:jobs"),  # a built-in name: ignored
    ])
    group = click.Group("logstore", commands={"topics": click.Command("topics")})
    assert add_plugin_commands(group) == ["jobs", "broken", "notcmd"]
    assert isinstance(group.commands["jobs"], PluginCommand)
    assert "cli_plugin_sample" not in sys.modules  # nothing imported until used
    runner = CliRunner()
    listed = runner.invoke(group, ["--help"]).stdout
    assert "  jobs    Sample jobs." in listed  # the plugin's own help, read from its source...
    assert "cli_plugin_sample" not in sys.modules  # ...without importing it
    assert ok(runner.invoke(group, ["jobs", "run", "21", "--twice"])).stdout == "42\n"
    assert "Sample jobs." in ok(runner.invoke(group, ["jobs", "--help"])).stdout
    assert runner.invoke(group, ["jobs", "run", "x"]).exit_code == 2
    line = fails(runner.invoke(group, ["broken", "anything", "--flag"]), "PLUGIN_LOAD_FAILED")
    assert "no_such_module_for_logstore" in line and "ModuleNotFoundError" in line
    assert "not a click command" in fails(runner.invoke(group, ["notcmd"]), "PLUGIN_LOAD_FAILED")


@pytest.mark.timeout(60)
def test_the_cli_imports_neither_spark_nor_plugins() -> None:
    code = ("import sys; from click.testing import CliRunner; from logstore.cli import main; "
            "r = CliRunner().invoke(main, ['--help']); assert r.exit_code == 0, r.output; "
            "print(sorted(m for m in sys.modules if m.split('.')[0] in ('pyspark', 'jobs', 'delta')))")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=50)
    assert out.returncode == 0, out.stderr
    assert out.stdout.strip() == "[]"


def test_the_real_cli_has_the_verbs() -> None:
    for name in ("broker", "topics", "produce", "consume", "offsets"):
        assert name in main.commands, name
    help_text = ok(CliRunner().invoke(main, ["--help"])).stdout
    for name in ("broker", "topics", "produce", "consume", "offsets"):
        assert name in help_text


# --------------------------------------------------------------------------- the installed script


def _script(*args: str, input: str | None = None, timeout: float = 30, env: dict[str, str] | None = None,
            cwd: Path | None = None) -> subprocess.CompletedProcess[str]:
    return subprocess.run([str(SCRIPT), *args], input=input, capture_output=True, text=True,
                          timeout=timeout, env={**os.environ, **(env or {})}, cwd=cwd)


class _BrokerProcess:
    """``logstore broker start`` as a child; ``bootstrap`` once it said 'listening on'."""

    def __init__(self, *args: str, cwd: Path) -> None:
        self.proc = subprocess.Popen([str(SCRIPT), "broker", "start", *args], stdout=subprocess.PIPE,
                                     stderr=subprocess.PIPE, text=True, cwd=cwd)
        self.lines: list[str] = []
        self._listening = threading.Event()
        threading.Thread(target=self._read, daemon=True).start()

    def _read(self) -> None:
        assert self.proc.stdout is not None
        for line in self.proc.stdout:
            self.lines.append(line.strip())
            if line.startswith("listening on "):
                self._listening.set()

    def wait_listening(self, timeout_s: float = 30) -> str:
        deadline = time.monotonic() + timeout_s
        while not self._listening.wait(0.1):
            assert self.proc.poll() is None, f"broker exited with {self.proc.returncode}: {self.stderr()}"
            assert time.monotonic() < deadline, "no 'listening on' line in time"
        return next(line for line in self.lines if line.startswith("listening on ")).split()[-1]

    def stderr(self) -> str:
        return self.proc.stderr.read() if self.proc.stderr and self.proc.poll() is not None else ""

    def stop(self) -> int:
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
        try:
            return self.proc.wait(30)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            raise


needs_script = pytest.mark.skipif(not SCRIPT.exists(), reason=f"{SCRIPT} is not installed")


@needs_script
@pytest.mark.timeout(180)
def test_script_end_to_end(tmp_path: Path) -> None:
    data = tmp_path / "data"
    broker = _BrokerProcess("--data-dir", str(data), "--port", "0", cwd=tmp_path)
    try:
        bootstrap = broker.wait_listening()
        env = {"LOGSTORE_BOOTSTRAP": bootstrap}
        assert _script("topics", "create", "events", "--partitions", "3", env=env).returncode == 0
        values = [f"event-{i}" for i in range(100)]
        produced = _script("produce", "events", "--format", "json", input="\n".join(values) + "\n", env=env)
        assert produced.returncode == 0, produced.stderr
        assert json.loads(produced.stdout)["records"] == 100
        consumed = _script("consume", "events", "--from-beginning", "--max-records", "100",
                           "--timeout-ms", "20000", "--format", "json", env=env)
        assert consumed.returncode == 0, consumed.stderr
        records = [json.loads(line) for line in consumed.stdout.splitlines()]
        assert sorted(r["value"] for r in records) == sorted(values)

        described = json.loads(_script("topics", "describe", "events", "--format", "json", env=env).stdout)
        assert sum(p["high_watermark"] for p in described["partitions"]) == 100
        offsets = json.loads(_script("offsets", "events", "--time", "earliest", "--format", "json",
                                     env=env).stdout)
        assert [p["offset_for_time"] for p in offsets["partitions"]] == [0, 0, 0]
        assert sum(p["high_watermark"] for p in offsets["partitions"]) == 100

        created = _script("topics", "create", "customers", "--schema", "id long NOT NULL, name string",
                          "--config", "cleanup.policy=compact", env=env)
        assert created.returncode == 0, created.stderr
        rows = '{"id": 1, "name": "Ann"}\n{"id": 2, "name": "Bob"}\n{"id": 1, "name": "Anna"}\n'
        assert _script("produce", "customers", "--input", "json", "--key-field", "id", input=rows,
                       env=env).returncode == 0
        consumed = _script("consume", "customers", "--from-beginning", "--max-records", "3",
                           "--timeout-ms", "20000", "--format", "json", env=env)
        assert [(json.loads(line)["key"], json.loads(line)["value"]) for line in consumed.stdout.splitlines()] == [
            ("1", {"id": 1, "name": "Ann"}), ("2", {"id": 2, "name": "Bob"}), ("1", {"id": 1, "name": "Anna"})]

        for args, code in ((["topics", "describe", "nope"], "UNKNOWN_TOPIC_OR_PARTITION"),
                           (["topics", "create", "x", "--schema", "id nosuchtype"], "SCHEMA_MISMATCH"),
                           (["topics", "create", "x", "--config", "bad"], "INVALID_CONFIG"),
                           (["produce", "customers", "--input", "json"], "INVALID_REQUEST")):
            failed = _script(*args, input="{oops\n", env=env)
            assert failed.returncode != 0
            assert failed.stderr.startswith(f"error: [{code}] ") and failed.stderr.count("\n") == 1, failed.stderr
    finally:
        assert broker.stop() == 0  # SIGTERM is a graceful stop
    down = _script("topics", "list", env={"LOGSTORE_BOOTSTRAP": bootstrap})
    assert down.returncode != 0 and "Traceback" not in down.stderr
    assert down.stderr.startswith("error: [BROKER_NOT_AVAILABLE] ") and down.stderr.count("\n") == 1


@needs_script
@pytest.mark.timeout(120)
def test_script_broker_config_file_and_interactive_produce(tmp_path: Path) -> None:
    """conf/broker.toml in the working directory is used; flags beat it; a line typed into
    ``produce`` is sent while stdin stays open (no waiting for end of input)."""
    port = free_port()
    (tmp_path / "conf").mkdir()
    (tmp_path / "conf" / "broker.toml").write_text(f'port = {port}\ndata_dir = "from-file"\n')
    broker = _BrokerProcess("--data-dir", str(tmp_path / "from-flag"), cwd=tmp_path)
    producer: subprocess.Popen[str] | None = None
    try:
        assert broker.wait_listening() == f"127.0.0.1:{port}"
        assert (tmp_path / "from-flag").is_dir() and not (tmp_path / "from-file").exists()
        env = {**os.environ, "LOGSTORE_BOOTSTRAP": f"127.0.0.1:{port}"}
        assert _script("topics", "create", "typed-in", env=env).returncode == 0
        producer = subprocess.Popen([str(SCRIPT), "produce", "typed-in"], stdin=subprocess.PIPE,
                                    stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env)
        assert producer.stdin is not None
        producer.stdin.write("first line\n")
        producer.stdin.flush()
        with Consumer(f"127.0.0.1:{port}", auto_offset_reset="earliest") as consumer:
            consumer.assign([TopicPartition("typed-in", 0)])
            deadline = time.monotonic() + 20
            got: list[bytes | None] = []
            while not got:
                assert time.monotonic() < deadline, "the typed line was not sent while stdin was open"
                got = [r.value for r in consumer.poll(timeout_ms=500)]  # type: ignore[misc]
        assert got == [b"first line"]
        out, err = producer.communicate("", timeout=30)
        assert producer.returncode == 0, err
        assert "sent 1 record to typed-in" in out
    finally:
        if producer is not None and producer.poll() is None:
            producer.kill()
        assert broker.stop() == 0


@needs_script
@pytest.mark.timeout(60)
def test_script_broker_start_errors_are_one_line(tmp_path: Path) -> None:
    (tmp_path / "bad.toml").write_text("no_such_key = 1\n")
    failed = _script("broker", "start", "--config", str(tmp_path / "bad.toml"), cwd=tmp_path)
    assert failed.returncode != 0 and "Traceback" not in failed.stderr
    assert failed.stderr.strip().splitlines()[-1].startswith("error: [INVALID_CONFIG] ")
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = taken.getsockname()[1]
        failed = _script("broker", "start", "--data-dir", str(tmp_path / "d"), "--port", str(port), cwd=tmp_path)
    assert failed.returncode != 0 and "Traceback" not in failed.stderr
    assert "error: [BROKER_START_FAILED] cannot start the broker" in failed.stderr


def test_admin_sees_what_the_cli_created(broker: EmbeddedBroker, run) -> None:  # type: ignore[no-untyped-def]
    topic = new_topic(run, "--partitions", "2", "--config", "retention.ms=60000")
    with Admin(broker.bootstrap) as admin:
        assert admin.describe_topics([topic])[topic].num_partitions == 2
        assert admin.describe_configs([topic])[topic]["retention.ms"] == "60000"


def test_a_single_broker_is_a_cluster_of_one(run) -> None:  # type: ignore[no-untyped-def]
    doc = json.loads(ok(run("cluster", "describe", "--format", "json")).stdout)
    assert [b["node_id"] for b in doc["brokers"]] == [0] and doc["controller"] == 0
    assert doc["under_replicated_partitions"] == [] and doc["offline_partitions"] == []
    out = ok(run("cluster", "describe")).stdout
    assert "1 broker, controller 0" in out and "offline partitions: none" in out
    # more replicas than brokers: one clear line naming how to get a cluster
    result = run("topics", "create", "rf-two", "--replication-factor", "2")
    assert result.exit_code == 1 and "INVALID_REPLICATION_FACTOR" in result.stderr
    assert "--metadata" in result.stderr


def test_topics_alter_partitions_grows_a_topic_and_never_shrinks_it(run, broker: EmbeddedBroker) -> None:  # type: ignore[no-untyped-def]
    ok(run("topics", "create", "grow-me", "--partitions", "2"))
    assert "altered topic grow-me: partitions=5" in ok(run("topics", "alter", "grow-me", "--partitions", "5")).stdout
    described = json.loads(ok(run("topics", "describe", "grow-me", "--format", "json")).stdout)
    assert [p["partition"] for p in described["partitions"]] == [0, 1, 2, 3, 4]
    with Producer(broker.bootstrap) as producer:  # a new partition takes records
        assert producer.send("grow-me", b"x", partition=4).result(timeout=30).offset == 0
    for count in ("5", "3"):
        result = run("topics", "alter", "grow-me", "--partitions", count)
        assert result.exit_code == 1 and "INVALID_PARTITIONS" in result.stderr and "cannot be removed" in result.stderr
    result = run("topics", "alter", "__consumer_offsets", "--partitions", "99")
    assert result.exit_code == 1 and "INTERNAL_TOPIC" in result.stderr


def test_produce_with_headers_puts_them_on_every_record(run) -> None:  # type: ignore[no-untyped-def]
    topic = new_topic(run)
    ok(run("produce", topic, "--header", "source=cli", "--header", "trace=a=b", "--header", "source=again",
           input="one\ntwo\n"))
    got = consume_json(run, topic, 2)
    assert [r["headers"] for r in got] == [[["source", "cli"], ["trace", "a=b"], ["source", "again"]]] * 2
    result = run("produce", topic, "--header", "novalue", input="x\n")
    assert result.exit_code == 2 and "not KEY=VALUE" in result.stderr
