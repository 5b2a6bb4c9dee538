"""Consumer groups through the public clients and the CLI against a real broker (in-process
consumers): commits and positions, auto_offset_reset, callbacks, zombie fencing, reset-offsets,
lag, delete, offsets and members across broker restarts, ``consume --group`` and ``groups``.
"""

from __future__ import annotations

import json
import random
import time
from collections.abc import Iterator

import pytest
from click.testing import CliRunner, Result
from group_helpers import produce, tps, wait_until

from logstore import (
    Admin,
    BrokerUnavailableError,
    Consumer,
    FencedInstanceIdError,
    GroupIdNotFoundError,
    NonEmptyGroupError,
    OffsetAndMetadata,
    OffsetOutOfRangeError,
    Producer,
    StaleMemberEpochError,
    TopicPartition,
    UnknownMemberIdError,
)
from logstore.broker.embedded import EmbeddedBroker
from logstore.broker.groups.service import OFFSETS_TOPIC
from logstore.cli import main
from logstore.client.rpc import BrokerClient

SESSION_MS = 1_500
INTERVAL_MS = 300
OVERRIDES = {"group_session_timeout_ms": SESSION_MS, "group_heartbeat_interval_ms": INTERVAL_MS}

pytestmark = pytest.mark.timeout(60)


@pytest.fixture(scope="module")
def broker() -> Iterator[EmbeddedBroker]:
    with EmbeddedBroker(overrides=OVERRIDES) as b:
        yield b


def new_topic(bootstrap: str, partitions: int = 3) -> str:
    name = f"gc-{random.randrange(1 << 30)}"
    with Admin(bootstrap) as admin:
        admin.create_topic(name, partitions)
    return name


def member(bootstrap: str, group: str, topic: str, **kw: object) -> Consumer:
    kw.setdefault("auto_offset_reset", "earliest")
    kw.setdefault("fetch_max_wait_ms", 100)
    return Consumer(bootstrap, group_id=group, subscribe=[topic], **kw)  # type: ignore[arg-type]


def poll_until(consumers: list[Consumer], what: str, predicate, timeout_s: float = 20.0) -> list:  # type: ignore[no-untyped-def]
    got: list = []

    def step() -> bool:
        for c in consumers:
            got.extend(c.poll(timeout_ms=50))
        return bool(predicate(got))
    wait_until(what, step, timeout_s, 0)
    return got


# --------------------------------------------------------------------------- positions and commits


def test_a_member_resumes_at_the_committed_offset_and_commits_on_close(broker: EmbeddedBroker) -> None:
    boot = broker.bootstrap
    topic = new_topic(boot, 2)
    group = f"g-{topic}"
    produce(boot, topic, {0: 10, 1: 10})
    tp0, tp1 = tps(topic, range(2))
    c = member(boot, group, topic, enable_auto_commit=False, max_poll_records=3)
    poll_until([c], "a few records of each partition", lambda g: {r.partition for r in g} == {0, 1})
    positions = {tp0: c.position(tp0), tp1: c.position(tp1)}
    c.commit()  # the positions
    assert {tp: o.offset for tp, o in c.committed([tp0, tp1]).items() if o is not None} == positions
    c.commit({tp0: OffsetAndMetadata(3, "checkpoint-7")})
    with Admin(boot) as admin:
        assert admin.list_group_offsets(group)[tp0].metadata == "checkpoint-7"
    c.close()  # auto-commit is off: 3 stays
    again = member(boot, group, topic)
    records = poll_until([again], "the rest", lambda g: len(g) >= (10 - 3) + (10 - positions[tp1]))
    assert min(r.offset for r in records if r.partition == 0) == 3
    assert min(r.offset for r in records if r.partition == 1) == positions[tp1]
    again.close()  # auto-commit: every position is committed
    with Admin(boot) as admin:
        assert {tp.partition: o.offset for tp, o in admin.list_group_offsets(group).items()} == {0: 10, 1: 10}


def test_auto_offset_reset_applies_only_without_a_committed_offset(broker: EmbeddedBroker) -> None:
    boot = broker.bootstrap
    topic = new_topic(boot, 1)
    produce(boot, topic, {0: 5})
    tp = TopicPartition(topic, 0)
    none = member(boot, f"none-{topic}", topic, auto_offset_reset="none")
    with pytest.raises(OffsetOutOfRangeError, match=r"no committed offset for .* auto_offset_reset is 'none'"):
        wait_until("an assignment", lambda: none.poll(timeout_ms=100) or none.assignment(), 20)
        none.poll(timeout_ms=100)
    none.close()
    latest = member(boot, f"latest-{topic}", topic, auto_offset_reset="latest")
    wait_until("an assignment", lambda: latest.poll(timeout_ms=100) or latest.assignment(), 20)
    assert latest.position(tp) == 5
    latest.close()
    with Admin(boot) as admin:
        admin.alter_group_offsets(f"none-{topic}", {tp: 2})
    resumed = member(boot, f"none-{topic}", topic, auto_offset_reset="none")
    got = poll_until([resumed], "records from 2", lambda g: len(g) >= 3)
    assert [r.offset for r in got] == [2, 3, 4]
    resumed.close()


def test_rebalance_callbacks_revoke_before_the_other_member_is_assigned(broker: EmbeddedBroker) -> None:
    boot = broker.bootstrap
    topic = new_topic(boot, 4)
    group = f"g-{topic}"
    events: list[tuple[str, str, frozenset[int]]] = []

    def cb(name: str, ev: str):  # type: ignore[no-untyped-def]
        return lambda s: events.append((name, ev, frozenset(tp.partition for tp in s)))

    a = member(boot, group, topic, on_partitions_assigned=cb("a", "assigned"), on_partitions_revoked=cb("a", "revoked"))
    wait_until("a owns 4", lambda: a.poll(timeout_ms=50) is not None and len(a.assignment()) == 4, 20)
    b = member(boot, group, topic, on_partitions_assigned=cb("b", "assigned"), on_partitions_revoked=cb("b", "revoked"))
    wait_until("2 + 2", lambda: [a.poll(timeout_ms=20), b.poll(timeout_ms=20)] and
               sorted([len(a.assignment()), len(b.assignment())]) == [2, 2], 20, 0)
    revoked = next(i for i, e in enumerate(events) if e[:2] == ("a", "revoked"))
    assigned = next(i for i, e in enumerate(events) if e[:2] == ("b", "assigned"))
    assert revoked < assigned and events[revoked][2] == events[assigned][2]
    b.close()
    assert events[-1] == ("b", "revoked", events[assigned][2])
    a.close()


def test_simple_consumer_with_a_group_id_starts_at_committed_offsets(broker: EmbeddedBroker) -> None:
    boot = broker.bootstrap
    topic = new_topic(boot, 1)
    group = f"g-{topic}"
    produce(boot, topic, {0: 6})
    tp = TopicPartition(topic, 0)
    with Admin(boot) as admin:
        admin.alter_group_offsets(group, {tp: 4})
    with Consumer(boot, group_id=group, auto_offset_reset="earliest") as c:
        c.assign([tp])
        assert c.position(tp) == 4
        assert [r.offset for r in c.poll(timeout_ms=2000)] == [4, 5]
        c.commit()
        assert c.committed([tp])[tp] == OffsetAndMetadata(6, "", c.committed([tp])[tp].commit_timestamp_ms)  # type: ignore[union-attr]


# --------------------------------------------------------------------------- fencing


def test_a_zombie_cannot_commit_over_the_live_member(broker: EmbeddedBroker) -> None:
    boot = broker.bootstrap
    topic = new_topic(boot, 2)
    group = f"g-{topic}"
    client = BrokerClient(boot)
    # The zombie: joins by hand, then falls silent (a long GC pause, a network partition).
    joined = client.groups.group_heartbeat_async(group, member_id="zombie", member_epoch=0, subscribed_topics=[topic],
                                          owned=[], request_seq=1).result(10)
    assert len(joined.assignment) == 2
    tp = TopicPartition(topic, 0)
    client.groups.commit_offsets(group, {tp: 1}, member_id="zombie", member_epoch=joined.member_epoch)
    live = member(boot, group, topic)
    wait_until("the live member to take over after the zombie's session",
               lambda: live.poll(timeout_ms=50) is not None and len(live.assignment()) == 2, 20)
    live.commit({tp: 5})
    with pytest.raises(UnknownMemberIdError):
        client.groups.commit_offsets(group, {tp: 99}, member_id="zombie", member_epoch=joined.member_epoch)
    with pytest.raises(NonEmptyGroupError):  # nor from outside while the group is active
        client.groups.commit_offsets(group, {tp: 99})
    assert live.committed([tp])[tp].offset == 5  # type: ignore[union-attr]
    live.close()
    client.close()


def test_commits_of_a_revoked_partition_and_of_a_replaced_static_member_are_rejected(broker: EmbeddedBroker) -> None:
    boot = broker.bootstrap
    topic = new_topic(boot, 2)
    group = f"g-{topic}"
    client = BrokerClient(boot)
    first = client.groups.group_heartbeat_async(group, member_id="old", member_epoch=0, instance_id="host-1",
                                         subscribed_topics=[topic], owned=[], request_seq=1).result(10)
    # The same static member restarts (kill -9, no leave): the new process takes over.
    second = client.groups.group_heartbeat_async(group, member_id="new", member_epoch=0, instance_id="host-1",
                                          subscribed_topics=[topic], owned=[], request_seq=1).result(10)
    assert second.assignment == first.assignment
    tp = next(iter(first.assignment))
    with pytest.raises(FencedInstanceIdError):
        client.groups.commit_offsets(group, {tp: 3}, member_id="old", member_epoch=first.member_epoch)
    client.groups.commit_offsets(group, {tp: 3}, member_id="new", member_epoch=second.member_epoch)
    # A second member joins; "new" gives up one partition and may no longer commit it.
    other = client.groups.group_heartbeat_async(group, member_id="other", member_epoch=0, subscribed_topics=[topic],
                                         owned=[], request_seq=1).result(10)
    state = client.groups.group_heartbeat_async(group, member_id="new", member_epoch=second.member_epoch,
                                         subscribed_topics=[topic], owned=second.assignment,
                                         request_seq=2).result(10)
    gone = second.assignment - state.assignment
    assert len(gone) == 1
    client.groups.group_heartbeat_async(group, member_id="new", member_epoch=state.member_epoch, subscribed_topics=[topic],
                                 owned=state.assignment, request_seq=3).result(10)
    with pytest.raises(StaleMemberEpochError):
        client.groups.commit_offsets(group, dict.fromkeys(gone, 7), member_id="new", member_epoch=state.member_epoch)
    assert other.member_epoch > 0
    for m in ("new", "other"):
        client.groups.group_heartbeat_async(group, member_id=m, member_epoch=-1, subscribed_topics=[], owned=[],
                                     request_seq=9).result(10)
    client.close()


# --------------------------------------------------------------------------- admin: reset, lag, delete


def test_reset_offsets_is_refused_while_members_are_active_and_moves_offsets_otherwise(broker: EmbeddedBroker) -> None:
    boot = broker.bootstrap
    topic = new_topic(boot, 2)
    group = f"g-{topic}"
    produce(boot, topic, {0: 10, 1: 10})
    with Producer(boot) as p:
        t_mid = int(time.time() * 1000) + 5
        time.sleep(0.02)
        for _ in range(5):
            p.send(topic, b"late", partition=0, timestamp_ms=t_mid + 10)
        p.flush(10)
    parts = tps(topic, range(2))
    tp0, tp1 = parts
    c = member(boot, group, topic)
    poll_until([c], "everything", lambda g: len(g) >= 25)
    with Admin(boot) as admin, pytest.raises(NonEmptyGroupError, match="active member"):
        admin.reset_group_offsets(group, parts, to_earliest=True)
    c.close()
    with Admin(boot) as admin:
        assert {tp: o.offset for tp, o in admin.list_group_offsets(group).items()} == {tp0: 15, tp1: 10}
        assert admin.reset_group_offsets(group, parts, to_earliest=True, dry_run=True) == {tp0: 0, tp1: 0}
        assert admin.list_group_offsets(group)[tp0].offset == 15
        assert admin.reset_group_offsets(group, parts, to_earliest=True) == {tp0: 0, tp1: 0}
        assert admin.reset_group_offsets(group, parts, shift_by=4) == {tp0: 4, tp1: 4}
        assert admin.reset_group_offsets(group, parts, shift_by=-10) == {tp0: 0, tp1: 0}
        assert admin.reset_group_offsets(group, parts, to_offset=12) == {tp0: 12, tp1: 10}
        assert admin.reset_group_offsets(group, parts, to_latest=True) == {tp0: 15, tp1: 10}
        assert admin.reset_group_offsets(group, [tp0], to_timestamp_ms=t_mid) == {tp0: 10}
        assert admin.list_group_offsets(group)[tp0].offset == 10
    again = member(boot, group, topic)
    got = poll_until([again], "the records after the reset", lambda g: len(g) >= 5)
    assert sorted(r.offset for r in got if r.partition == 0) == [10, 11, 12, 13, 14]
    again.close()


def test_lag_is_log_end_minus_committed(broker: EmbeddedBroker) -> None:
    boot = broker.bootstrap
    topic = new_topic(boot, 3)
    group = f"g-{topic}"
    produced = {0: 7, 1: 3, 2: 12}
    produce(boot, topic, produced)
    c = member(boot, group, topic, enable_auto_commit=False, max_poll_records=4)
    wait_until("an assignment", lambda: c.poll(timeout_ms=50) is not None and c.assignment(), 20)
    c.seek(TopicPartition(topic, 0), 0)
    c.commit({TopicPartition(topic, 0): 5, TopicPartition(topic, 2): 2})
    with Admin(boot) as admin:
        lag = {r.partition: r for r in admin.group_lag(group)}
    assert lag[0].committed_offset == 5 and lag[0].log_end_offset == 7 and lag[0].lag == 2
    assert lag[1].committed_offset is None and lag[1].lag is None and lag[1].log_end_offset == 3
    assert lag[2].lag == 12 - 2
    assert {r.member_id for r in lag.values()} == {c.member_id}
    c.close()


def test_delete_group(broker: EmbeddedBroker) -> None:
    boot = broker.bootstrap
    topic = new_topic(boot, 1)
    group = f"g-{topic}"
    c = member(boot, group, topic)
    wait_until("an assignment", lambda: c.poll(timeout_ms=50) is not None and c.assignment(), 20)
    with Admin(boot) as admin:
        with pytest.raises(NonEmptyGroupError):
            admin.delete_groups([group])
        c.close()
        assert group in [g.group_id for g in admin.list_groups()]
        admin.delete_groups([group])
        assert group not in [g.group_id for g in admin.list_groups()]
        with pytest.raises(GroupIdNotFoundError):
            admin.describe_group(group)
        with pytest.raises(GroupIdNotFoundError):
            admin.delete_groups([group])


def test_a_member_that_stops_polling_leaves_the_group(broker: EmbeddedBroker) -> None:
    boot = broker.bootstrap
    topic = new_topic(boot, 2)
    group = f"g-{topic}"
    lost: list[set[TopicPartition]] = []
    slow = member(boot, group, topic, max_poll_interval_ms=800, on_partitions_lost=lost.append)
    wait_until("slow owns 2", lambda: slow.poll(timeout_ms=50) is not None and len(slow.assignment()) == 2, 20)
    other = member(boot, group, topic)
    wait_until("other takes everything while slow does not poll",
               lambda: other.poll(timeout_ms=50) is not None and len(other.assignment()) == 2, 20)
    slow.poll(timeout_ms=100)  # learns it lost its partitions, rejoins
    assert lost and len(lost[0]) >= 1
    wait_until("a 1 + 1 split again", lambda: [slow.poll(timeout_ms=20), other.poll(timeout_ms=20)] and
               sorted([len(slow.assignment()), len(other.assignment())]) == [1, 1], 20, 0)
    slow.close()
    other.close()


# --------------------------------------------------------------------------- restarts


@pytest.mark.timeout(90)
def test_committed_offsets_survive_a_broker_kill_9(tmp_path) -> None:  # type: ignore[no-untyped-def]
    b = EmbeddedBroker(str(tmp_path / "data"), subprocess=True, overrides=OVERRIDES).start()
    try:
        topic = new_topic(b.bootstrap, 2)
        group = f"g-{topic}"
        produce(b.bootstrap, topic, {0: 8, 1: 8})
        c = member(b.bootstrap, group, topic, enable_auto_commit=False)
        poll_until([c], "16 records", lambda g: len(g) >= 16)
        c.commit({TopicPartition(topic, 0): 6, TopicPartition(topic, 1): 8})
        with Admin(b.bootstrap) as admin:
            admin.describe_group(group)
        b.kill()
        c.close()  # its leave fails; fine
        b.start()
        with Admin(b.bootstrap) as admin:
            offsets = admin.list_group_offsets(group)
            assert {tp.partition: o.offset for tp, o in offsets.items()} == {0: 6, 1: 8}
            assert OFFSETS_TOPIC in admin.list_topics()
            assert admin.describe_configs([OFFSETS_TOPIC])[OFFSETS_TOPIC]["cleanup.policy"] == "compact"
        again = member(b.bootstrap, group, topic)
        got = poll_until([again], "records after the committed offsets", lambda g: len(g) >= 2)
        assert sorted(r.offset for r in got) == [6, 7]
        again.close()
    finally:
        b.kill()
        b.close()


@pytest.mark.timeout(90)
def test_members_keep_their_partitions_across_a_broker_restart(tmp_path) -> None:  # type: ignore[no-untyped-def]
    b = EmbeddedBroker(str(tmp_path / "data"),
                       overrides={"group_session_timeout_ms": 6_000, "group_heartbeat_interval_ms": 300}).start()
    try:
        topic = new_topic(b.bootstrap, 4)
        group = f"g-{topic}"
        events: list[str] = []
        consumers = [member(b.bootstrap, group, topic, on_partitions_revoked=lambda s: events.append("revoked"),
                            on_partitions_lost=lambda s: events.append("lost")) for _ in range(2)]
        wait_until("2 + 2", lambda: [c.poll(timeout_ms=20) for c in consumers] and
                   sorted(len(c.assignment()) for c in consumers) == [2, 2], 20, 0)
        before = [c.assignment() for c in consumers]
        events.clear()  # (the first member gave up two partitions when the second joined)
        with Admin(b.bootstrap) as admin:
            epoch = admin.describe_group(group).group_epoch
        b.restart()

        def describe():  # type: ignore[no-untyped-def]
            # (gRPC shares a failed connection between channels for its reconnect backoff.)
            try:
                with Admin(b.bootstrap) as admin:
                    return admin.describe_group(group)
            except BrokerUnavailableError:
                return None
        desc = wait_until("the broker back", describe, 20, 0.1)
        assert desc.group_epoch == epoch and len(desc.members) == 2
        for _ in range(15):
            for c in consumers:
                c.poll(timeout_ms=50)
        assert [c.assignment() for c in consumers] == before
        assert events == []
        for c in consumers:
            c.close()
    finally:
        b.close()


# --------------------------------------------------------------------------- CLI


@pytest.fixture
def run(broker: EmbeddedBroker):  # type: ignore[no-untyped-def]
    runner = CliRunner(env={"LOGSTORE_BOOTSTRAP": broker.bootstrap})

    def invoke(*args: str, input: str | None = None) -> Result:
        return runner.invoke(main, list(args), input=input)

    return invoke


def ok(result: Result) -> Result:
    assert result.exit_code == 0, (result.exit_code, result.stdout, result.stderr, result.exception)
    return result


def fails(result: Result, code: str) -> str:
    assert result.exit_code != 0, result.stdout
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith(f"error: [{code}] "), result.stderr
    return lines[0]


def test_cli_consume_group_list_describe_reset_delete(run, broker: EmbeddedBroker) -> None:  # type: ignore[no-untyped-def]
    topic = new_topic(broker.bootstrap, 2)
    group = f"cli-{topic}"
    produce(broker.bootstrap, topic, {0: 5, 1: 5})
    first = ok(run("consume", topic, "--group", group, "--from-beginning", "--max-records", "6",
                   "--format", "json", "--timeout-ms", "10000"))
    seen = [(d["partition"], d["offset"]) for d in map(json.loads, first.stdout.splitlines())]
    assert len(seen) == 6
    second = ok(run("consume", topic, "--group", group, "--max-records", "4", "--format", "json",
                    "--timeout-ms", "10000"))
    rest = [(d["partition"], d["offset"]) for d in map(json.loads, second.stdout.splitlines())]
    assert sorted(seen + rest) == sorted((p, o) for p in range(2) for o in range(5)), "each record once"

    listed = json.loads(ok(run("groups", "list", "--format", "json")).stdout)
    assert {"group": group, "state": "Empty", "members": 0, "assignor": "uniform"} in listed
    doc = json.loads(ok(run("groups", "describe", group, "--format", "json")).stdout)
    assert doc["state"] == "Empty" and doc["members"] == [] and doc["total_lag"] == 0
    assert [(p["partition"], p["committed_offset"], p["log_end_offset"], p["lag"]) for p in doc["partitions"]] == [
        (0, 5, 5, 0), (1, 5, 5, 0)]
    table = ok(run("groups", "describe", group)).stdout
    assert "total lag 0" in table and "committed" in table

    dry = json.loads(ok(run("groups", "reset-offsets", group, "--topic", f"{topic}:1", "--to-offset", "2",
                            "--dry-run", "--format", "json")).stdout)
    assert dry["partitions"] == [{"topic": topic, "partition": 1, "previous": 5, "new": 2}]
    # Without --execute only the plan is shown, as Kafka's tool does.
    plan = ok(run("groups", "reset-offsets", group, "--topic", topic, "--shift-by", "-1", "--format", "json"))
    assert json.loads(plan.stdout)["dry_run"] is True
    assert [p["lag"] for p in json.loads(
        ok(run("groups", "describe", group, "--format", "json")).stdout)["partitions"]] == [0, 0]
    ok(run("groups", "reset-offsets", group, "--topic", topic, "--shift-by", "-1", "--execute"))
    doc = json.loads(ok(run("groups", "describe", group, "--format", "json")).stdout)
    assert [p["lag"] for p in doc["partitions"]] == [1, 1] and doc["total_lag"] == 2
    ok(run("groups", "reset-offsets", group, "--all-topics", "--to-datetime", "2000-01-01T00:00:00Z", "--execute"))
    assert [p["committed_offset"] for p in json.loads(
        ok(run("groups", "describe", group, "--format", "json")).stdout)["partitions"]] == [0, 0]

    with member(broker.bootstrap, group, topic) as active:
        wait_until("an active member", lambda: active.poll(timeout_ms=50) is not None and active.assignment(), 20)
        fails(run("groups", "reset-offsets", group, "--topic", topic, "--to-earliest", "--execute"),
              "NON_EMPTY_GROUP")
        fails(run("groups", "delete", group), "NON_EMPTY_GROUP")
        described = json.loads(ok(run("groups", "describe", group, "--format", "json")).stdout)
        assert len(described["members"]) == 1 and described["members"][0]["host"]
    assert ok(run("groups", "delete", group)).stdout.strip() == f"deleted group {group}"
    fails(run("groups", "describe", group), "GROUP_ID_NOT_FOUND")
    fails(run("consume", topic, "--group", "bad\x01id", "--max-records", "1", "--timeout-ms", "3000"),
          "INVALID_GROUP_ID")
    bad = run("consume", topic, "--group", group, "--partition", "0")
    assert bad.exit_code == 2 and "--group" in bad.output
