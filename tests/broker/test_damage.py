"""Damaged files on a child broker: what starts, what goes offline, what is logged, and that no
offset is ever reused (issue 14 finding 4; DESIGN I3 and §3 crash behaviour).

One topic, one partition per kind of damage plus an undamaged control partition, on a
child broker stopped cleanly (SIGTERM) or killed (SIGKILL); then the files of each
partition are damaged in its own way and the broker restarted. Every partition must be
either served with every acknowledged record (damage repaired automatically), or offline
alone with its reason in Metadata and in the broker's log — never silently shorter, and a
produce must never get an offset an acknowledged record had.
"""

from __future__ import annotations

import json
import os
import time
from collections.abc import Callable

import pytest
from broker_helpers import create, produce, records, stub_for
from click.testing import CliRunner

from logstore._proto import logstore_pb2 as pb
from logstore._proto import logstore_pb2_grpc as pb_grpc
from logstore.broker.embedded import EmbeddedBroker
from logstore.cli import main
from logstore.client.consumer import Consumer
from logstore.client.fetcher import fetch_range
from logstore.client.rpc import BrokerClient
from logstore.errors import LogOfflineError, OffsetOutOfRangeError
from logstore.storage.checkpoint import HWM_CHECKPOINT_FILE
from logstore.types import TopicPartition

TOPIC = "dmg"
BATCHES = 4  # of 5 records each; segment.bytes=1024 gives one batch per segment
RECORDS = 5 * BATCHES


def _segments(d: str) -> list[str]:
    return sorted(os.path.join(d, n) for n in os.listdir(d) if n.endswith(".arrow"))


def _flip(path: str, from_end: int) -> None:
    with open(path, "r+b") as f:
        f.seek(-from_end, os.SEEK_END)
        b = f.read(1)[0]
        f.seek(-from_end, os.SEEK_END)
        f.write(bytes([b ^ 0x10]))


def _write(path: str, data: bytes) -> None:
    with open(path, "wb") as f:
        f.write(data)


def _active_crc(d: str) -> None:
    _flip(_segments(d)[-1], 8)


def _closed_crc(d: str) -> None:
    _flip(_segments(d)[0], 8)


def _active_schema(d: str) -> None:
    with open(_segments(d)[-1], "r+b") as f:
        f.write(b"\x00\x00\x00\x00")  # the schema message's continuation marker


def _index_garbage(d: str) -> None:
    _write(_segments(d)[1][: -len(".arrow")] + ".index", os.urandom(13))


def _timeindex_garbage(d: str) -> None:
    _write(_segments(d)[0][: -len(".arrow")] + ".timeindex", os.urandom(7))


def _epochs_garbage(d: str) -> None:
    _write(os.path.join(d, "leader-epoch-checkpoint"), b"0\nnot an epoch\n")


def _lso_garbage(d: str) -> None:
    _write(os.path.join(d, "log-start-offset"), b"\x00\xffseven\n")


def _lso_beyond(d: str) -> None:
    _write(os.path.join(d, "log-start-offset"), b"999999\n")


def _missing_middle(d: str) -> None:
    seg = _segments(d)[1][: -len(".arrow")]
    for suffix in (".arrow", ".index", ".timeindex"):
        os.remove(seg + suffix)


def _producer_state_garbage(d: str) -> None:
    _write(os.path.join(d, "producer-state.json"), b"\xff\xfe{not json")


def _torn_tail(d: str) -> None:
    with open(_segments(d)[-1], "ab") as f:
        f.write(b"\xff\xff\xff\xff\x40\x00\x00\x00" + os.urandom(30))  # a write the crash tore


def _active_deleted(d: str) -> None:
    seg = _segments(d)[-1][: -len(".arrow")]
    for suffix in (".arrow", ".index", ".timeindex"):
        os.remove(seg + suffix)


ONLINE = "online"  # every acknowledged record served, produce continues at the end
ON_READ = "offline on read"  # starts; the damaged batch is reported when read, then LOG_OFFLINE
# kind -> (damage, expectation after a clean stop, after SIGKILL); offline expectations
# are a substring of the reason that Metadata and the broker's log must show.
KINDS: dict[str, tuple[Callable[[str], None], str, str]] = {
    "control": (lambda d: None, ONLINE, ONLINE),
    "active-crc": (_active_crc, ON_READ, "checkpointed high-water mark 20"),
    "closed-crc": (_closed_crc, ON_READ, ON_READ),
    "active-schema": (_active_schema, "no valid schema message", "no valid schema message"),
    "index-garbage": (_index_garbage, ONLINE, ONLINE),
    "timeindex-garbage": (_timeindex_garbage, ONLINE, ONLINE),
    "epochs-garbage": (_epochs_garbage, ONLINE, ONLINE),
    "lso-garbage": (_lso_garbage, "log-start-offset: not an offset", "log-start-offset: not an offset"),
    "lso-beyond": (_lso_beyond, "log start offset 999999 is beyond", "log start offset 999999 is beyond"),
    "missing-middle": (_missing_middle, "offsets 5..9 are missing", "offsets 5..9 are missing"),
    "producer-state-garbage": (_producer_state_garbage, ONLINE, ONLINE),
    "torn-tail": (_torn_tail, ONLINE, ONLINE),
    "active-deleted": (_active_deleted, "offsets 15..19 were lost", "offsets 15..19 were lost"),
}


def _metadata(stub: pb_grpc.LogstoreStub) -> dict[int, pb.PartitionMetadata]:
    resp = stub.Metadata(pb.MetadataRequest(topics=[TOPIC]), timeout=30)
    return {p.partition: p for p in resp.topics[0].partitions}


def _fetch_all(stub: pb_grpc.LogstoreStub, partition: int, offset: int = 0) -> tuple[list[int], str]:
    """Offsets served from ``offset`` to the HWM, and the error code that stopped the reading ('' if none)."""
    from logstore.record import decode_schema
    from logstore.record_reader import iter_batches

    got: list[int] = []
    while True:
        resp = stub.Fetch(pb.FetchRequest(max_wait_ms=0, partitions=[
            pb.FetchPartition(topic=TOPIC, partition=partition, fetch_offset=offset)]), timeout=30)
        p = resp.partitions[0]
        if p.error.code:
            return got, p.error.code
        if not p.records:
            return got, ""
        schema, _ = decode_schema(p.schema)
        for stored in iter_batches(memoryview(p.records)):
            got.extend(o for o in stored.decode(schema).column("offset").to_pylist() if o >= offset)
        offset = p.next_offset


def _wait_for_checkpoint(data_dir: str, partitions: int, hwm: int) -> None:
    path = os.path.join(data_dir, HWM_CHECKPOINT_FILE)
    deadline = time.monotonic() + 10
    while time.monotonic() < deadline:
        try:
            with open(path) as f:
                doc = json.load(f)
            marks = [e["high_watermark"] for e in doc["partitions"] if e["topic"] == TOPIC]
            if len(marks) == partitions and all(m == hwm for m in marks):
                return
        except (OSError, ValueError):
            pass
        time.sleep(0.02)
    raise AssertionError(f"{path} did not checkpoint HWM {hwm} for {partitions} partitions within 10 s")


def _fill(data_dir: str) -> EmbeddedBroker:
    broker = EmbeddedBroker(data_dir, subprocess=True, overrides={"hwm_checkpoint_interval_ms": 50})
    broker.start()
    stub = stub_for(broker)
    assert not create(stub, TOPIC, len(KINDS), **{"segment.bytes": "1024"}).code
    for p in range(len(KINDS)):
        for b in range(BATCHES):
            resp = produce(stub, TOPIC, p, records([b"p%d-b%d-%d" % (p, b, i) for i in range(5)]))
            assert not resp.error.code and resp.base_offsets[0] == 5 * b, resp
    assert all(len(_segments(os.path.join(data_dir, f"{TOPIC}-{p}"))) == BATCHES for p in range(len(KINDS)))
    return broker


@pytest.mark.timeout(90)
@pytest.mark.parametrize("shutdown", ["clean", "sigkill"])
def test_each_damaged_partition_is_repaired_or_offline_alone_and_no_offset_is_reused(
        tmp_path, capfd, shutdown) -> None:  # type: ignore[no-untyped-def]
    data_dir = str(tmp_path / "data")
    broker = _fill(data_dir)
    try:
        if shutdown == "clean":
            broker.stop()
        else:
            _wait_for_checkpoint(data_dir, len(KINDS), RECORDS)
            broker.kill()
        for p, (damage, _, _) in enumerate(KINDS.values()):
            damage(os.path.join(data_dir, f"{TOPIC}-{p}"))
        capfd.readouterr()
        broker.start()  # the broker starts, whatever the damage
        stub = stub_for(broker)
        meta = _metadata(stub)
        log_text = capfd.readouterr().err
        for p, (kind, (_, clean_expect, kill_expect)) in enumerate(KINDS.items()):
            expect = clean_expect if shutdown == "clean" else kill_expect
            err = meta[p].error
            if expect in (ONLINE, ON_READ):
                assert not err.code, (kind, err)
                served, code = _fetch_all(stub, p)
                if expect == ONLINE:
                    assert (served, code) == (list(range(RECORDS)), ""), kind
                else:
                    assert code == "CORRUPT_MESSAGE" and len(served) < RECORDS, (kind, served, code)
                    assert _metadata(stub)[p].error.code == "LOG_OFFLINE", kind
            else:
                assert err.code == "LOG_OFFLINE" and expect in err.message, (kind, err)
                assert f"partition {TOPIC}-{p} is offline" in log_text and expect in log_text, kind
                assert _fetch_all(stub, p)[1] == "LOG_OFFLINE", kind
            # No offset is ever handed out twice: a produce either fails or lands past every ack.
            resp = produce(stub, TOPIC, p, records([b"after"]))
            if expect == ONLINE:
                assert not resp.error.code and resp.base_offsets[0] == RECORDS, (kind, resp)
            else:
                assert resp.error.code == "LOG_OFFLINE" or resp.base_offsets[0] >= RECORDS, (kind, resp)
        torn = list(KINDS).index("torn-tail")
        assert f"partition {TOPIC}-{torn}: recovery truncated" in log_text  # every truncation is logged
        assert "38 bytes, 0 batches (no whole batch header, at offset 20) dropped" in log_text
        epochs_dir = os.path.join(data_dir, f"{TOPIC}-{list(KINDS).index('epochs-garbage')}")
        assert f"rebuilt {epochs_dir}/leader-epoch-checkpoint from the batches (1 epochs)" in log_text
        with open(os.path.join(epochs_dir, "leader-epoch-checkpoint")) as f:
            assert f.read() == "0 0\n"
        # The offline partitions' files are left as they were (nothing deleted on the way).
        for kind in ("lso-garbage", "lso-beyond", "active-schema"):
            d = os.path.join(data_dir, f"{TOPIC}-{list(KINDS).index(kind)}")
            assert len(_segments(d)) == BATCHES, kind
    finally:
        broker.close()


@pytest.mark.timeout(90)
def test_lost_acknowledged_records_keep_the_partition_offline_until_the_operator_accepts(
        tmp_path) -> None:  # type: ignore[no-untyped-def]
    data_dir = str(tmp_path / "data")
    broker = EmbeddedBroker(data_dir, subprocess=True, overrides={"hwm_checkpoint_interval_ms": 50})
    broker.start()
    try:
        stub = stub_for(broker)
        assert not create(stub, TOPIC, 2, **{"segment.bytes": "1024"}).code
        for b in range(BATCHES):
            for p in range(2):
                assert produce(stub, TOPIC, p, records([b"b%d-%d" % (b, i) for i in range(5)])).base_offsets[0] == 5 * b
        _wait_for_checkpoint(data_dir, 2, RECORDS)
        broker.kill()
        victim = os.path.join(data_dir, f"{TOPIC}-1")
        _active_crc(victim)  # the last acknowledged batch, offsets 15..19, is damaged
        broker.start()
        stub = stub_for(broker)
        err = _metadata(stub)[1].error
        assert err.code == "LOG_OFFLINE" and "offsets 15..19" in err.message, err
        assert produce(stub, TOPIC, 1, records([b"x"])).error.code == "LOG_OFFLINE"
        assert produce(stub, TOPIC, 0, records([b"x"])).base_offsets[0] == RECORDS  # the rest is served
        runner = CliRunner()
        described = runner.invoke(main, ["topics", "describe", TOPIC, "--bootstrap", broker.bootstrap,
                                         "--format", "json"])
        assert described.exit_code == 0, described.output
        shown = {p["partition"]: p["error"] for p in json.loads(described.output)["partitions"]}
        assert shown[0] is None and "[LOG_OFFLINE]" in shown[1] and "offsets 15..19" in shown[1], shown
        # Consumers see the offline partition instead of polling nothing forever.
        with Consumer(broker.bootstrap) as consumer:
            consumer.assign([TopicPartition(TOPIC, 1)])
            consumer.seek(TopicPartition(TOPIC, 1), 0)
            with pytest.raises(LogOfflineError, match=f"{TOPIC}-1.*offsets 15..19"):
                consumer.poll(timeout_ms=10_000)
        consumed = runner.invoke(main, ["consume", TOPIC, "--partition", "1", "--offset", "0",
                                        "--timeout-ms", "3000", "--bootstrap", broker.bootstrap])
        assert consumed.exit_code == 1, consumed.output
        assert consumed.output.strip().splitlines()[-1].startswith(f"error: [LOG_OFFLINE] {TOPIC}-1"), consumed.output
        broker.stop()

        args = ["partitions", "recover", "--data-dir", data_dir, "--topic", TOPIC, "--partition", "1"]
        refused = runner.invoke(main, args)
        assert refused.exit_code == 1 and "[LOG_OFFLINE]" in refused.output and "15..19" in refused.output
        accepted = runner.invoke(main, [*args, "--accept-data-loss"])
        assert accepted.exit_code == 0, accepted.output
        assert "offsets recorded as lost: 15..19" in accepted.output

        broker.start()
        stub = stub_for(broker)
        assert not _metadata(stub)[1].error.code
        # The next offset continues at the checkpointed HWM: 15..19 are never reused.
        resp = produce(stub, TOPIC, 1, records([b"new"]))
        assert not resp.error.code and resp.base_offsets[0] == RECORDS, resp
        assert _fetch_all(stub, 1) == (list(range(15)), "OFFSET_OUT_OF_RANGE")  # stops at the gap
        assert _fetch_all(stub, 1, 17) == ([], "OFFSET_OUT_OF_RANGE")  # a consumer inside the gap
        assert _fetch_all(stub, 1, RECORDS) == ([RECORDS], "")
        tp = TopicPartition(TOPIC, 1)
        # What clients see of the gap: data loss, never new records at old offsets.
        with Consumer(broker.bootstrap, auto_offset_reset="none") as strict:
            strict.assign([tp])
            strict.seek(tp, 16)
            with pytest.raises(OffsetOutOfRangeError, match="offsets 15..19 .* were lost"):
                strict.poll(timeout_ms=10_000)
        with Consumer(broker.bootstrap, auto_offset_reset="earliest") as lenient:
            lenient.assign([tp])
            lenient.seek(tp, 0)
            seen: list[int] = []
            deadline = time.monotonic() + 20
            while len(seen) < 16 and time.monotonic() < deadline:
                seen.extend(r.offset for r in lenient.poll(timeout_ms=1000))
            assert seen == [*range(15), RECORDS]  # skips the gap once, with a warning; no re-reading
        with BrokerClient(broker.bootstrap) as client:
            with pytest.raises(OffsetOutOfRangeError, match=r"records \[15, 20\) of dmg-1 were lost"):
                list(fetch_range(client, tp, 10, RECORDS + 1))
            skipped = list(fetch_range(client, tp, 10, RECORDS + 1, fail_on_data_loss=False))
            assert [o for b in skipped for o in b.column(0).to_pylist()] == [10, 11, 12, 13, 14, RECORDS]
        broker.restart()  # and the record of the loss survives restarts
        stub = stub_for(broker)
        assert _fetch_all(stub, 1, 15) == ([], "OFFSET_OUT_OF_RANGE")
        assert produce(stub, TOPIC, 1, records([b"newer"])).base_offsets[0] == RECORDS + 1
    finally:
        broker.close()


@pytest.mark.timeout(60)
def test_a_damaged_topic_file_takes_only_that_topic_offline_and_deletes_nothing(tmp_path) -> None:  # type: ignore[no-untyped-def]
    data_dir = str(tmp_path / "data")
    with EmbeddedBroker(data_dir) as broker:
        stub = stub_for(broker)
        for name in ("kept", "broken"):
            assert not create(stub, name, 2).code
            assert produce(stub, name, 1, records([b"a", b"b"])).base_offsets[0] == 0
        broker.stop()
        _write(os.path.join(data_dir, "meta", "topics", "broken.json"), b'{"name": "broken", "partit')
        broker.start()
        stub = stub_for(broker)
        resp = stub.Metadata(pb.MetadataRequest(topics=["broken", "kept"]), timeout=30)
        broken, kept = resp.topics
        assert broken.error.code == "LOG_OFFLINE" and "broken.json" in broken.error.message, broken.error
        assert not kept.error.code and [p.high_watermark for p in kept.partitions] == [0, 2]
        assert produce(stub, "broken", 1, records([b"c"])).error.code == "LOG_OFFLINE"
        assert produce(stub, "kept", 1, records([b"c"])).base_offsets[0] == 2
        assert create(stub, "broken", 1).code == "TOPIC_ALREADY_EXISTS"
        assert os.path.isdir(os.path.join(data_dir, "broken-0")) and _segments(os.path.join(data_dir, "broken-1"))
