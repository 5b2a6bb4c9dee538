"""Kafka's habits in the ``logstore`` CLI (issue 13): option names, dry-run resets, internal topics,
one-line errors for malformed bootstrap addresses, and a consume that ends when the topic runs out.

Every verb goes through click's CliRunner against a real embedded broker. The
failure contract of tests/cli/test_cli.py holds: a non-zero exit code and exactly one
stderr line ``error: [CODE] message``, never a traceback.
"""

from __future__ import annotations

import itertools
import json
import time
from collections.abc import Iterator

import click
import pytest
from click.testing import CliRunner, Result

from logstore import Admin, Consumer, InternalTopicError, Producer, TopicPartition
from logstore.broker.embedded import EmbeddedBroker
from logstore.cli import main
from logstore.cli.consume import DEFAULT_GROUP_IDLE_TIMEOUT_MS, DEFAULT_IDLE_TIMEOUT_MS

pytestmark = pytest.mark.timeout(60)

_names = itertools.count()
# Nothing listens here: a command that reaches the broker did so through the option under test.
NOBODY = "127.0.0.1:1"


@pytest.fixture(scope="module")
def broker() -> Iterator[EmbeddedBroker]:
    with EmbeddedBroker() as b:
        yield b


@pytest.fixture
def run(broker: EmbeddedBroker):  # type: ignore[no-untyped-def]
    runner = CliRunner(env={"LOGSTORE_BOOTSTRAP": broker.bootstrap})

    def invoke(*args: str, input: str | None = None, env: dict[str, str] | None = None) -> Result:
        return runner.invoke(main, list(args), input=input, env=env)

    return invoke


def ok(result: Result) -> Result:
    assert result.exit_code == 0, (result.exit_code, result.stdout, result.stderr, result.exception)
    return result


def fails(result: Result, code: str) -> str:
    assert result.exit_code == 1, (result.exit_code, result.stdout, result.stderr)
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1, result.stderr
    assert lines[0].startswith(f"error: [{code}] "), lines[0]
    assert "Traceback" not in result.output
    return lines[0]


def usage_error(result: Result, text: str) -> None:
    assert result.exit_code == 2, (result.exit_code, result.stdout, result.stderr)
    assert text in result.stderr, result.stderr


def new_topic(run, *args: str) -> str:  # type: ignore[no-untyped-def]
    name = f"names-{next(_names)}"
    ok(run("topics", "create", name, *args))
    return name


def _commands(group: click.Group, prefix: tuple[str, ...] = ()) -> Iterator[tuple[tuple[str, ...], click.Command]]:
    for name, cmd in group.commands.items():
        if isinstance(cmd, click.Group):
            yield from _commands(cmd, (*prefix, name))
        else:
            yield (*prefix, name), cmd


# --------------------------------------------------------------------------- --bootstrap-server, -b


def test_every_bootstrap_option_has_kafkas_spellings() -> None:
    found = []
    for path, cmd in _commands(main):
        for param in cmd.params:
            if param.name == "bootstrap":
                found.append(path)
                assert set(param.opts) == {"--bootstrap", "--bootstrap-server", "--broker-list", "-b"}, (
                    path, param.opts)
    # The verbs that talk to a broker (jobs is a plugin with its own options).
    assert {("topics", "create"), ("topics", "list"), ("produce",), ("consume",), ("offsets",),
            ("groups", "reset-offsets")} <= set(found), found


@pytest.mark.parametrize("spelling", ["--bootstrap", "--bootstrap-server", "--broker-list", "-b"])
def test_bootstrap_spellings_reach_the_broker(broker: EmbeddedBroker, run, spelling: str) -> None:  # type: ignore[no-untyped-def]
    env = {"LOGSTORE_BOOTSTRAP": NOBODY}
    name = f"names-{next(_names)}"
    ok(run("topics", "create", name, spelling, broker.bootstrap, env=env))
    ok(run("produce", name, spelling, broker.bootstrap, input="a\nb\n", env=env))
    out = ok(run("consume", name, "--from-beginning", "--max-records", "2", spelling, broker.bootstrap, env=env))
    assert out.stdout.splitlines() == ["a", "b"]


@pytest.mark.parametrize("address, says", [
    ("localhost", "'localhost' has no port"),
    ("localhost:", "is not a number in 1..65535"),
    ("localhost:abc", "is not a number in 1..65535"),
    ("localhost:70000", "is not a number in 1..65535"),
    (":9392", "has no host"),
    ("http://localhost:9392", "has a scheme"),
    ("localhost:9392,other", "'other' has no port"),
    ("::1:9392", "IPv6 address in brackets"),
])
@pytest.mark.parametrize("verb", [("topics", "list"), ("consume", "t"), ("produce", "t"),
                                  ("groups", "list"), ("offsets", "t")])
def test_malformed_bootstrap_is_one_line(run, address: str, says: str, verb: tuple[str, ...]) -> None:  # type: ignore[no-untyped-def]
    line = fails(run(*verb, "-b", address, input=""), "INVALID_BOOTSTRAP")
    assert says in line, line


def test_malformed_bootstrap_from_the_environment_is_one_line(run) -> None:  # type: ignore[no-untyped-def]
    line = fails(run("topics", "list", env={"LOGSTORE_BOOTSTRAP": "localhost"}), "INVALID_BOOTSTRAP")
    assert "e.g. localhost:9392" in line


# --------------------------------------------------------------------------- --topic, --max-messages


def test_topic_option_is_the_positional_topic(run) -> None:  # type: ignore[no-untyped-def]
    name = f"names-{next(_names)}"
    ok(run("topics", "create", "--topic", name, "--partitions", "2"))
    assert json.loads(ok(run("topics", "describe", "--topic", name, "--format", "json")).stdout)["partitions"]
    ok(run("topics", "alter", "--topic", name, "--config", "retention.ms=60000"))
    ok(run("produce", "--topic", name, "--partition", "1", input="x\ny\n"))
    out = ok(run("consume", "--topic", name, "--from-beginning", "--max-messages", "2"))
    assert out.stdout.splitlines() == ["x", "y"]
    offsets = json.loads(ok(run("offsets", "--topic", name, "--format", "json")).stdout)
    assert [p["log_end_offset"] for p in offsets["partitions"]] == [0, 2]
    # The same name twice is fine; two names, or none, are usage errors.
    ok(run("offsets", name, "--topic", name))
    usage_error(run("offsets", name, "--topic", "other"), "give the topic once")
    usage_error(run("consume", "--max-messages", "1"), "missing the topic")
    assert ok(run("topics", "delete", "--topic", name)).stdout.strip() == f"deleted topic {name}"
    usage_error(run("topics", "delete"), "name the topics to delete")


def test_max_messages_stops_at_that_many(run) -> None:  # type: ignore[no-untyped-def]
    name = new_topic(run)
    ok(run("produce", name, input="".join(f"{i}\n" for i in range(5))))
    out = ok(run("consume", name, "--from-beginning", "--max-messages", "3"))
    assert out.stdout.splitlines() == ["0", "1", "2"]


def test_consume_with_more_max_records_than_the_topic_holds_ends(run) -> None:  # type: ignore[no-untyped-def]
    # The README's "consume orders --from-beginning --max-records 10" on 7 records hung for ever.
    name = new_topic(run)
    ok(run("produce", name, input="".join(f"{i}\n" for i in range(7))))
    started = time.monotonic()
    out = ok(run("consume", name, "--from-beginning", "--max-records", "10"))
    took = time.monotonic() - started
    assert out.stdout.splitlines() == [str(i) for i in range(7)]
    assert DEFAULT_IDLE_TIMEOUT_MS / 1000 <= took < DEFAULT_IDLE_TIMEOUT_MS / 1000 + 10, took
    # An explicit --timeout-ms wins over the default.
    started = time.monotonic()
    ok(run("consume", name, "--from-beginning", "--max-records", "10", "--timeout-ms", "500"))
    assert time.monotonic() - started < DEFAULT_IDLE_TIMEOUT_MS / 1000


def test_group_consume_with_more_max_records_than_the_topic_holds_ends(run) -> None:  # type: ignore[no-untyped-def]
    name = new_topic(run, "--partitions", "2")
    ok(run("produce", name, input="".join(f"{i}\n" for i in range(7))))
    started = time.monotonic()
    out = ok(run("consume", name, "--group", f"g-{name}", "--from-beginning", "--max-records", "10"))
    took = time.monotonic() - started
    assert sorted(out.stdout.splitlines()) == [str(i) for i in range(7)]
    assert DEFAULT_GROUP_IDLE_TIMEOUT_MS / 1000 <= took < DEFAULT_GROUP_IDLE_TIMEOUT_MS / 1000 + 15, took


# --------------------------------------------------------------------------- kafka-topics' action flags


def test_topics_takes_kafka_topics_action_flags(run, broker: EmbeddedBroker) -> None:  # type: ignore[no-untyped-def]
    name = f"names-{next(_names)}"
    ok(run("topics", "--bootstrap-server", broker.bootstrap, "--create", "--topic", name, "--partitions", "2"))
    assert name in ok(run("topics", "--list")).stdout.split()
    doc = json.loads(ok(run("topics", "--describe", "--topic", name, "--format", "json")).stdout)
    assert len(doc["partitions"]) == 2
    ok(run("topics", "--alter", "--topic", name, "--partitions", "3"))
    assert len(json.loads(ok(run("topics", "describe", name, "--format", "json")).stdout)["partitions"]) == 3
    ok(run("topics", "--delete", "--topic", name))
    assert name not in ok(run("topics", "--list")).stdout.split()
    usage_error(run("topics", "--list", "--describe"), "give one action")


# --------------------------------------------------------------------------- consume --property


def test_console_consumer_properties_print_what_kafkas_would(run) -> None:  # type: ignore[no-untyped-def]
    name = new_topic(run)
    ok(run("produce", name, "--key-separator", ":", input="k1:v1\nk2:v2\n"))
    out = ok(run("consume", name, "--from-beginning", "--max-messages", "2", "--property", "print.key=true"))
    assert out.stdout.splitlines() == ["k1\tv1", "k2\tv2"]  # Kafka's default key.separator: a tab
    out = ok(run("consume", name, "--from-beginning", "--max-messages", "2", "--property", "print.key=true",
                 "--property", "key.separator=|", "--property", "print.partition=true",
                 "--property", "print.offset=true", "--property", "print.timestamp=true"))
    lines = [line.split("|") for line in out.stdout.splitlines()]
    assert [fields[1:] for fields in lines] == [["Partition:0", "Offset:0", "k1", "v1"],
                                                ["Partition:0", "Offset:1", "k2", "v2"]]
    assert all(fields[0].startswith("CreateTime:") and fields[0][11:].isdigit() for fields in lines)
    out = ok(run("consume", name, "--from-beginning", "--max-messages", "1", "--property", "print.value=false",
                 "--property", "print.offset=true"))
    assert out.stdout.splitlines() == ["Offset:0"]
    usage_error(run("consume", name, "--property", "print.headers=true"), "print.headers")
    usage_error(run("consume", name, "--property", "print.key"), "NAME=VALUE")
    usage_error(run("consume", name, "--format", "json", "--property", "print.key=true"), "--format lines")


# --------------------------------------------------------------------------- topics create --if-not-exists


def test_create_if_not_exists(run) -> None:  # type: ignore[no-untyped-def]
    name = new_topic(run, "--partitions", "3")
    fails(run("topics", "create", name), "TOPIC_ALREADY_EXISTS")
    out = ok(run("topics", "create", name, "--partitions", "1", "--if-not-exists"))
    assert out.stdout.strip() == f"topic {name} exists already: nothing changed"
    doc = json.loads(ok(run("topics", "describe", name, "--format", "json")).stdout)
    assert len(doc["partitions"]) == 3, "the existing topic is left as it was"
    fresh = f"names-{next(_names)}"
    assert "created topic" in ok(run("topics", "create", fresh, "--if-not-exists")).stdout


# --------------------------------------------------------------------------- consume --from-timestamp


def test_consume_from_timestamp(broker: EmbeddedBroker, run) -> None:  # type: ignore[no-untyped-def]
    name = new_topic(run, "--partitions", "2")
    base = 1_700_000_000_000  # 2023-11-14T22:13:20Z
    with Producer(broker.bootstrap) as producer:
        for i in range(6):
            producer.send(name, f"v{i}".encode(), partition=i % 2, timestamp_ms=base + i * 1000)
        producer.flush()

    def values(*args: str) -> list[str]:
        out = ok(run("consume", name, "--max-records", "6", "--timeout-ms", "1500", "--format", "json", *args))
        return sorted(json.loads(line)["value"] for line in out.stdout.splitlines())

    assert values("--from-timestamp", str(base + 3000)) == ["v3", "v4", "v5"]
    assert values("--from-timestamp", "2023-11-14T22:13:22Z") == ["v2", "v3", "v4", "v5"]
    assert values("--from-timestamp", "2023-11-14T23:13:21+01:00") == ["v1", "v2", "v3", "v4", "v5"]
    assert values("--from-timestamp", str(base + 60_000)) == []  # after every record: the end
    usage_error(run("consume", name, "--from-timestamp", "yesterday"), "is not earliest, latest")
    usage_error(run("consume", name, "--from-timestamp", "earliest"), "use --from-beginning")
    usage_error(run("consume", name, "--from-timestamp", "0", "--from-beginning"), "not several")
    usage_error(run("consume", name, "--from-timestamp", "0", "--group", "g"), "--to-datetime TIME --execute")


# --------------------------------------------------------------------------- internal topics


@pytest.mark.parametrize("internal", ["__consumer_offsets", "__transaction_state", "__sink_commits", "__mine"])
def test_internal_topics_cannot_be_deleted(broker: EmbeddedBroker, run, internal: str) -> None:  # type: ignore[no-untyped-def]
    line = fails(run("topics", "delete", internal), "INTERNAL_TOPIC")
    assert f"'{internal}' is internal" in line
    # The broker refuses it too, for any client.
    with Admin(broker.bootstrap) as admin, pytest.raises(InternalTopicError, match="cannot be deleted"):
        admin.delete_topics([internal])


def test_internal_topic_that_exists_survives_and_nothing_else_is_deleted(broker: EmbeddedBroker, run) -> None:  # type: ignore[no-untyped-def]
    name = new_topic(run)
    with Consumer(broker.bootstrap, group_id=f"g-{name}") as consumer:  # makes __consumer_offsets exist
        consumer.commit({TopicPartition(name, 0): 0})
    listed = [d["name"] for d in json.loads(ok(run("topics", "list", "--format", "json")).stdout)]
    assert "__consumer_offsets" in listed
    fails(run("topics", "delete", name, "__consumer_offsets"), "INTERNAL_TOPIC")
    listed = [d["name"] for d in json.loads(ok(run("topics", "list", "--format", "json")).stdout)]
    assert name in listed and "__consumer_offsets" in listed
    with Admin(broker.bootstrap) as admin, pytest.raises(InternalTopicError):
        admin.delete_topics(["__consumer_offsets"])
    with Consumer(broker.bootstrap, group_id=f"g-{name}") as consumer:
        assert consumer.committed([TopicPartition(name, 0)])[TopicPartition(name, 0)] is not None


# --------------------------------------------------------------------------- groups reset-offsets


def test_reset_offsets_shows_the_plan_unless_execute(broker: EmbeddedBroker, run) -> None:  # type: ignore[no-untyped-def]
    name = new_topic(run)
    ok(run("produce", name, input="".join(f"{i}\n" for i in range(4))))
    group = f"g-{name}"
    with Consumer(broker.bootstrap, group_id=group) as consumer:
        consumer.commit({TopicPartition(name, 0): 4})

    def committed() -> int:
        with Consumer(broker.bootstrap, group_id=group) as c:
            found = c.committed([TopicPartition(name, 0)])[TopicPartition(name, 0)]
            assert found is not None
            return found.offset

    plan = ok(run("groups", "reset-offsets", group, "--topic", name, "--to-earliest"))
    assert plan.stderr.strip() == "dry run: nothing changed; add --execute to apply these offsets"
    assert "(dry run: nothing changed)" in plan.stdout
    assert committed() == 4
    doc = json.loads(ok(run("groups", "reset-offsets", group, "--topic", name, "--to-offset", "1",
                            "--dry-run", "--format", "json")).stdout)
    assert doc["dry_run"] is True and doc["partitions"][0]["new"] == 1
    assert committed() == 4
    usage_error(run("groups", "reset-offsets", group, "--topic", name, "--to-earliest", "--dry-run", "--execute"),
                "not both")
    doc = json.loads(ok(run("groups", "reset-offsets", group, "--topic", name, "--to-offset", "1",
                            "--execute", "--format", "json")).stdout)
    assert doc["dry_run"] is False and doc["partitions"] == [
        {"topic": name, "partition": 0, "previous": 4, "new": 1}]
    assert committed() == 1
