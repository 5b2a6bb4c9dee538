"""Lost or damaged broker metadata never drops an acknowledged write silently (issue 22).

* a missing ``meta/topics/<t>.json`` (or a missing ``meta/``) never deletes the topic's
  partition directories: the topic is offline, naming the missing file, logged at ERROR,
  and ``logstore partitions recover --rebuild-metadata`` rebuilds the file from the
  directories (schema from the segments, partition count from the directories);
* unfinished creations (empty directories) and committed deletions (marked directories)
  are still removed at start-up;
* a lost, reset or garbage ``meta/producer-id-block`` never makes the broker hand out a
  producer id that partitions already hold (the floor comes from the producer state);
* a produce to an offline partition fails at once, definitely; ``logstore offsets`` shows it
  offline; ``partitions recover`` reports a bad CRC in a closed segment as the loss it is;
* a flipped byte in records newer than the HWM checkpoint never gets their offsets reused.

Single broker; files are deleted or damaged between a stop and a start.
"""

from __future__ import annotations

import json
import logging
import os
import shutil
import time

import pytest
from broker_helpers import create, fetch_values, produce, records, stub_for
from click.testing import CliRunner
from storage_helpers import produced, simple_batch

from logstore._proto import logstore_pb2 as pb
from logstore.broker.embedded import EmbeddedBroker
from logstore.cli import main
from logstore.client.producer import Producer
from logstore.errors import LogOfflineError, LogstoreError, ProducerIdFloorUnknownError
from logstore.record import BatchHeader, decode_schema, typed_schema
from logstore.record_reader import parse_batch_at
from logstore.schema_text import parse_schema
from logstore.storage.checkpoint import read_hwm_checkpoint
from logstore.storage.config import LogConfig
from logstore.storage.log_manager import LogManager
from logstore.storage.ownership import DELETING_MARKER_FILE, PARTITION_MARKER_FILE
from logstore.storage.producer_state import ProducerStateManager


def _metadata(stub, topic: str):  # type: ignore[no-untyped-def]
    [t] = stub.Metadata(pb.MetadataRequest(topics=[topic]), timeout=30).topics
    return t


def _fill(stub, topic: str, partitions: int, per_partition: int = 3, **configs: str) -> None:  # type: ignore[no-untyped-def]
    assert not create(stub, topic, partitions, **configs).code
    for p in range(partitions):
        resp = produce(stub, topic, p, records([b"%s-%d-%d" % (topic.encode(), p, i) for i in range(per_partition)]))
        assert not resp.error.code and resp.base_offsets[0] == 0, resp


@pytest.mark.timeout(60)
def test_a_missing_topic_file_keeps_the_topic_offline_and_deletes_nothing(tmp_path, caplog) -> None:  # type: ignore[no-untyped-def]
    data_dir = str(tmp_path / "data")
    with EmbeddedBroker(data_dir) as broker:
        stub = stub_for(broker)
        _fill(stub, "lost", 2)
        _fill(stub, "kept", 1)
        broker.stop()
        os.remove(os.path.join(data_dir, "meta", "topics", "lost.json"))
        with caplog.at_level(logging.ERROR, logger="logstore.storage.log_manager"):
            broker.start()
        stub = stub_for(broker)
        lost = _metadata(stub, "lost")
        assert lost.error.code == "LOG_OFFLINE" and "lost.json is missing" in lost.error.message, lost.error
        assert "partitions recover" in lost.error.message and "--rebuild-metadata" in lost.error.message
        [line] = [r for r in caplog.records if "topic lost is offline" in r.getMessage()]
        assert line.levelno == logging.ERROR and "lost.json" in line.getMessage()
        assert produce(stub, "lost", 0, records([b"x"])).error.code == "LOG_OFFLINE"
        assert create(stub, "lost", 1).code == "TOPIC_ALREADY_EXISTS"  # never re-created over the data
        assert [v for _, v in fetch_values(stub, "kept", 0)] == [b"kept-0-0", b"kept-0-1", b"kept-0-2"]
        for p in range(2):
            assert os.path.isfile(os.path.join(data_dir, f"lost-{p}", "00000000000000000000.arrow"))


@pytest.mark.timeout(90)
def test_a_missing_meta_dir_deletes_nothing_and_recover_rebuilds_the_topic(tmp_path) -> None:  # type: ignore[no-untyped-def]
    data_dir = str(tmp_path / "data")
    with EmbeddedBroker(data_dir) as broker:
        stub = stub_for(broker)
        assert not create(stub, "typed", 3, schema="id BIGINT, name STRING", **{"retention.ms": "86400000"}).code
        typed = typed_schema(parse_schema("id BIGINT, name STRING"))
        for p in range(3):
            resp = produce(stub, "typed", p, records([{"id": p, "name": "x"}], schema=typed))  # type: ignore[list-item]
            assert not resp.error.code, resp
        _fill(stub, "plain", 2, per_partition=4)
        broker.stop()
        with open(os.path.join(data_dir, "typed-0", PARTITION_MARKER_FILE)) as f:
            typed_id = json.load(f)["topic_id"]
        shutil.rmtree(os.path.join(data_dir, "meta"))
        broker.start()
        stub = stub_for(broker)
        for topic in ("typed", "plain"):
            err = _metadata(stub, topic).error
            assert err.code == "LOG_OFFLINE" and f"{topic}.json is missing" in err.message, err
        broker.stop()
        kept = read_hwm_checkpoint(data_dir)  # still protecting the offline topics' records
        assert kept[("plain", 1)].high_watermark == 4 and kept[("typed", 2)].topic_id == typed_id, kept
        for name in ("typed-0", "typed-1", "typed-2", "plain-0", "plain-1"):
            assert os.path.isdir(os.path.join(data_dir, name)), name
        runner = CliRunner()
        dry = runner.invoke(main, ["partitions", "recover", "--data-dir", data_dir, "--topic", "plain",
                                   "--rebuild-metadata", "--dry-run"])
        assert dry.exit_code == 0, dry.output
        assert "2 partitions" in dry.output and not os.path.exists(os.path.join(data_dir, "meta", "topics", "plain.json"))
        for topic in ("typed", "plain"):
            out = runner.invoke(main, ["partitions", "recover", "--data-dir", data_dir, "--topic", topic,
                                       "--rebuild-metadata", "--format", "json"])
            assert out.exit_code == 0, out.output
        doc = json.loads(runner.invoke(main, ["partitions", "recover", "--data-dir", data_dir, "--topic", "typed",
                                              "--rebuild-metadata", "--dry-run", "--format", "json"]).output)
        assert doc["partitions"] == 3 and doc["topic_id"] == typed_id and doc["exists"], doc
        broker.start()
        stub = stub_for(broker)
        assert [v for _, v in fetch_values(stub, "plain", 1)] == [b"plain-1-%d" % i for i in range(4)]
        typed = _metadata(stub, "typed")
        assert not typed.error.code and len(typed.partitions) == 3, typed
        configs = stub.DescribeConfigs(pb.DescribeConfigsRequest(topics=["typed"]), timeout=30).results[0]
        assert dict(configs.configs)["schema"].upper() == "ID BIGINT, NAME STRING", configs
        assert produce(stub, "plain", 0, records([b"after"])).base_offsets[0] == 4  # no offset reused


@pytest.mark.timeout(60)
def test_unfinished_creations_and_committed_deletions_are_still_removed(tmp_path) -> None:  # type: ignore[no-untyped-def]
    data_dir = str(tmp_path / "data")
    with EmbeddedBroker(data_dir) as broker:
        stub = stub_for(broker)
        assert not create(stub, "empty", 2).code  # no record: as a creation a crash cut short
        _fill(stub, "deleted", 1)
        _fill(stub, "undeleted", 1)
        broker.stop()
        os.remove(os.path.join(data_dir, "meta", "topics", "empty.json"))
        # A deletion that marked its directories and removed the topic file (its commit point)...
        open(os.path.join(data_dir, "deleted-0", DELETING_MARKER_FILE), "wb").close()
        os.remove(os.path.join(data_dir, "meta", "topics", "deleted.json"))
        # ... and one that crashed before removing it: not committed, the topic stays.
        open(os.path.join(data_dir, "undeleted-0", DELETING_MARKER_FILE), "wb").close()
        broker.start()
        stub = stub_for(broker)
        assert not any(os.path.exists(os.path.join(data_dir, n)) for n in ("empty-0", "empty-1", "deleted-0"))
        assert _metadata(stub, "empty").error.code == "UNKNOWN_TOPIC_OR_PARTITION"
        assert [v for _, v in fetch_values(stub, "undeleted", 0)] == [b"undeleted-0-%d" % i for i in range(3)]
        assert not os.path.exists(os.path.join(data_dir, "undeleted-0", DELETING_MARKER_FILE))


# ----------------------------------------------------------------------------- producer ids


def _send_idempotent(broker: EmbeddedBroker, topic: str, values: list[bytes], partition: int = 0) -> list[int]:
    with Producer(broker.bootstrap, linger_ms=0) as producer:
        futures = [producer.send(topic, v, partition=partition) for v in values]
        return [f.result(timeout=20).offset for f in futures]


@pytest.mark.timeout(60)
@pytest.mark.parametrize("damage", ["missing", "reset", "garbage", "not utf-8"])
def test_a_lost_or_damaged_producer_id_block_never_reissues_an_id(tmp_path, damage) -> None:  # type: ignore[no-untyped-def]
    data_dir = str(tmp_path / "data")
    block = os.path.join(data_dir, "meta", "producer-id-block")
    with EmbeddedBroker(data_dir) as broker:
        stub = stub_for(broker)
        assert not create(stub, "t", 1).code
        assert _send_idempotent(broker, "t", [b"old-%d" % i for i in range(5)]) == [0, 1, 2, 3, 4]
        broker.stop()
        content = {"missing": None, "reset": b"0\n", "garbage": b"12ab\n", "not utf-8": b"\xff\xfe"}[damage]
        os.remove(block)
        if content is not None:
            with open(block, "wb") as f:
                f.write(content)
        broker.start()
        # The new producer's first batches must be written, not answered as the old one's duplicates.
        assert _send_idempotent(broker, "t", [b"new-%d" % i for i in range(5)]) == [5, 6, 7, 8, 9]
        values = [v for _, v in fetch_values(stub_for(broker), "t", 0)]
        assert values == [b"old-%d" % i for i in range(5)] + [b"new-%d" % i for i in range(5)]
        with open(block) as f:
            assert int(f.read()) >= 1  # written back at or past the floor


@pytest.mark.timeout(60)
def test_no_start_when_the_producer_id_floor_cannot_be_decided(tmp_path) -> None:  # type: ignore[no-untyped-def]
    data_dir = str(tmp_path / "data")
    with EmbeddedBroker(data_dir) as broker:
        stub = stub_for(broker)
        assert not create(stub, "t", 2).code
        assert _send_idempotent(broker, "t", [b"a"], partition=1) == [0]
        broker.stop()
        os.remove(os.path.join(data_dir, "meta", "producer-id-block"))
        with open(os.path.join(data_dir, "t-1", "00000000000000000000.arrow"), "r+b") as f:
            f.write(b"\0\0\0\0")  # t-1 goes offline, and its batches cannot be read
        with pytest.raises(ProducerIdFloorUnknownError) as e:
            broker.start()
        assert "producer-id-block is missing" in e.value.message and "t-1" in e.value.message, e.value.message
        assert "partitions recover" in e.value.message
        broker.stop()  # joins the thread of the failed start
        with open(os.path.join(data_dir, "meta", "producer-id-block"), "w") as f:
            f.write("1000\n")  # the operator's way out: a number above every id issued
        broker.start()
        assert _send_idempotent(broker, "t", [b"b"]) == [0]  # t-0 had no record yet


@pytest.mark.timeout(60)
def test_the_producer_id_floor_is_read_off_the_files_of_an_offline_topic(tmp_path) -> None:  # type: ignore[no-untyped-def]
    data_dir = str(tmp_path / "data")
    with EmbeddedBroker(data_dir) as broker:
        assert not create(stub_for(broker), "lost", 1).code
        assert _send_idempotent(broker, "lost", [b"old-%d" % i for i in range(5)]) == [0, 1, 2, 3, 4]
        broker.stop()
        os.remove(os.path.join(data_dir, "meta", "producer-id-block"))
        os.remove(os.path.join(data_dir, "meta", "topics", "lost.json"))
        broker.start()  # the floor is decided from lost-0's batches although the topic is offline
        broker.stop()
        assert CliRunner().invoke(main, ["partitions", "recover", "--data-dir", data_dir, "--topic", "lost",
                                         "--rebuild-metadata"]).exit_code == 0
        broker.start()
        assert _send_idempotent(broker, "lost", [b"new-%d" % i for i in range(5)]) == [5, 6, 7, 8, 9]


# ----------------------------------------------------------------------------- offline partitions


def _offline_partition_1(data_dir: str) -> None:
    with open(os.path.join(data_dir, "t-1", "log-start-offset"), "w") as f:
        f.write("garbage")


@pytest.mark.timeout(60)
def test_a_produce_to_an_offline_partition_fails_at_once_and_definitely(tmp_path) -> None:  # type: ignore[no-untyped-def]
    data_dir = str(tmp_path / "data")
    with EmbeddedBroker(data_dir) as broker:
        _fill(stub_for(broker), "t", 2)
        broker.stop()
        _offline_partition_1(data_dir)
        broker.start()
        with Producer(broker.bootstrap, linger_ms=0, delivery_timeout_ms=15_000) as producer:
            started = time.monotonic()
            with pytest.raises(LogstoreError) as e:
                producer.send("t", b"x", partition=1).result(timeout=30)
            assert time.monotonic() - started < 5, "retried although the partition stays offline"
            assert type(e.value) is LogOfflineError and not e.value.retriable, e.value  # not "may or may not"
            assert "t-1 is offline" in e.value.message and "log-start-offset" in e.value.message, e.value.message
            assert producer.send("t", b"y", partition=0).result(timeout=20).offset == 3  # the others carry on


@pytest.mark.timeout(60)
def test_offsets_shows_an_offline_partition_as_offline(tmp_path) -> None:  # type: ignore[no-untyped-def]
    data_dir = str(tmp_path / "data")
    with EmbeddedBroker(data_dir) as broker:
        _fill(stub_for(broker), "t", 2)
        broker.stop()
        _offline_partition_1(data_dir)
        broker.start()
        runner = CliRunner()
        out = runner.invoke(main, ["offsets", "t", "--bootstrap", broker.bootstrap, "--format", "json"])
        assert out.exit_code == 0, out.output
        by_partition = {row["partition"]: row for row in json.loads(out.stdout)["partitions"]}
        assert by_partition[0]["high_watermark"] == 3 and "state" not in by_partition[0], by_partition
        offline = by_partition[1]
        assert offline["state"] == "offline" and "log-start-offset" in offline["reason"], offline
        assert offline["high_watermark"] is None and offline["log_end_offset"] is None, offline
        table = runner.invoke(main, ["offsets", "t", "--bootstrap", broker.bootstrap]).stdout
        [row1] = [line for line in table.splitlines() if "offline" in line]
        assert "0" not in row1.replace("│", " ").split()[2:], table


@pytest.mark.timeout(60)
def test_recover_dry_run_reports_a_bad_crc_in_a_closed_segment_as_the_loss(tmp_path) -> None:  # type: ignore[no-untyped-def]
    data_dir = str(tmp_path / "data")
    with EmbeddedBroker(data_dir) as broker:
        stub = stub_for(broker)
        assert not create(stub, "t", 1, **{"segment.bytes": "1024"}).code  # one batch per segment
        for b in range(4):
            assert produce(stub, "t", 0, records([b"v%d-%d" % (b, i) for i in range(5)])).base_offsets[0] == 5 * b
        broker.stop()
    segments = sorted(n for n in os.listdir(os.path.join(data_dir, "t-0")) if n.endswith(".arrow"))
    assert len(segments) == 4
    with open(os.path.join(data_dir, "t-0", segments[1]), "r+b") as f:  # a closed segment, offsets 5..9
        f.seek(-8, os.SEEK_END)
        byte = f.read(1)[0]
        f.seek(-8, os.SEEK_END)
        f.write(bytes([byte ^ 0x10]))
    out = CliRunner().invoke(main, ["partitions", "recover", "--data-dir", data_dir, "--topic", "t",
                                    "--partition", "0"])
    assert out.exit_code == 1, out.output
    assert "[CORRUPT_MESSAGE]" in out.output and "5 records are lost" in out.output, out.output
    assert "offsets 5..9" in out.output and segments[1] in out.output, out.output
    doc = json.loads(CliRunner().invoke(main, ["partitions", "recover", "--data-dir", data_dir, "--topic", "t",
                                               "--partition", "0", "--format", "json"]).stdout)
    [damage] = doc["damaged_batches"]
    assert (damage["first_offset"], damage["end_offset"]) == (5, 10) and "CRC" in damage["reason"], damage


# ----------------------------------------------------------------------------- the HWM checkpoint's window


def _batch_positions(path: str) -> list[tuple[int, int, int]]:
    """(position, body start, size) of every batch of a segment file."""
    with open(path, "rb") as f:
        data = memoryview(f.read())
    _, pos = decode_schema(data)
    out = []
    while pos < len(data):
        batch = parse_batch_at(data, pos)
        out.append((batch.position, batch.body_start, batch.size))
        pos += batch.size
    return out


@pytest.mark.timeout(90)
def test_a_flipped_byte_in_records_newer_than_the_hwm_checkpoint_never_reuses_their_offsets(tmp_path) -> None:  # type: ignore[no-untyped-def]
    data_dir = str(tmp_path / "data")
    # The checkpoint never catches up here: every record is newer than it, as in the last seconds before a crash.
    broker = EmbeddedBroker(data_dir, subprocess=True, overrides={"hwm_checkpoint_interval_ms": 600_000})
    try:
        broker.start()
        stub = stub_for(broker)
        assert not create(stub, "t", 1).code
        for b in range(5):
            assert produce(stub, "t", 0, records([b"v%d-%d" % (b, i) for i in range(5)])).base_offsets[0] == 5 * b
        broker.kill()
        segment = os.path.join(data_dir, "t-0", "00000000000000000000.arrow")
        position, body_start, size = _batch_positions(segment)[2]  # offsets 10..14, acknowledged
        with open(segment, "r+b") as f:
            at = position + body_start + (size - body_start) // 2
            f.seek(at)
            byte = f.read(1)[0]
            f.seek(at)
            f.write(bytes([byte ^ 0x01]))
        broker.start()
        stub = stub_for(broker)
        err = _metadata(stub, "t").partitions[0].error
        assert err.code == "LOG_OFFLINE" and "offsets 10..24" in err.message, err  # not truncated and reused
        assert "may have been acknowledged" in err.message, err.message
        assert produce(stub, "t", 0, records([b"x"])).error.code == "LOG_OFFLINE"
        broker.stop()
        out = CliRunner().invoke(main, ["partitions", "recover", "--data-dir", data_dir, "--topic", "t",
                                        "--partition", "0", "--accept-data-loss"])
        assert out.exit_code == 0 and "offsets recorded as lost: 10..24" in out.output, out.output
        broker.start()
        stub = stub_for(broker)
        assert produce(stub, "t", 0, records([b"after"])).base_offsets[0] == 25  # no offset handed out twice
        assert [o for o, _ in fetch_values(stub, "t", 0, 25)] == [25]
    finally:
        broker.close()


def test_the_largest_producer_id_seen_survives_a_snapshot_and_a_reset(tmp_path) -> None:  # type: ignore[no-untyped-def]
    state = ProducerStateManager(str(tmp_path))
    for pid, offset in ((7, 0), (3, 1)):
        state.apply(BatchHeader(base_offset=offset, last_offset_delta=0, record_count=1, max_timestamp=0,
                                producer_id=pid, producer_epoch=0, base_sequence=0))
    assert state.max_producer_id == 7
    state.write_snapshot()
    state.reset()  # a truncation replays from the log start: what was seen is still seen
    assert state.max_producer_id == 7
    reopened = ProducerStateManager(str(tmp_path))
    reopened.load_snapshot(log_end_offset=0)  # a snapshot beyond the end: ignored, but not its largest id
    assert reopened.max_producer_id == 7


@pytest.mark.parametrize("same_topic", [True, False])
def test_a_cluster_replica_kept_for_want_of_its_topic_file_is_reused_only_by_its_own_topic(
        tmp_path, same_topic) -> None:  # type: ignore[no-untyped-def]
    data = str(tmp_path / "data")
    manager = LogManager(data, topic_defaults=LogConfig())
    manager.startup()
    manager.ensure_replicated_topic("r", topic_id="old", partitions=1, configs={}, value_schema=None,
                                    replication_factor=3)
    part = manager.ensure_partition("r", 0)
    part.become_leader(0)
    part.append(*produced(simple_batch(5)), fsync=True)
    manager.shutdown()
    os.remove(os.path.join(data, "meta", "topics", "r.json"))
    again = LogManager(data, topic_defaults=LogConfig())
    again.startup()  # kept, offline: nothing says the records are not wanted
    with pytest.raises(LogOfflineError):
        again.topic("r")
    # The cluster's metadata names the topic again: its own replica is reopened, an older one's removed.
    again.ensure_replicated_topic("r", topic_id="old" if same_topic else "new", partitions=1, configs={},
                                  value_schema=None, replication_factor=3)
    assert again.ensure_partition("r", 0).log.log_end_offset == (5 if same_topic else 0)
    again.shutdown()


@pytest.mark.timeout(60)
def test_recover_rebuilds_a_damaged_topic_file_and_keeps_the_damaged_one_aside(tmp_path) -> None:  # type: ignore[no-untyped-def]
    data_dir = str(tmp_path / "data")
    path = os.path.join(data_dir, "meta", "topics", "t.json")
    with EmbeddedBroker(data_dir) as broker:
        _fill(stub_for(broker), "t", 2)
        broker.stop()
        with open(path, "wb") as f:
            f.write(b'{"name": "t", "partit')
        broker.start()
        err = _metadata(stub_for(broker), "t").error
        assert err.code == "LOG_OFFLINE" and "--rebuild-metadata" in err.message, err
        broker.stop()
        out = CliRunner().invoke(main, ["partitions", "recover", "--data-dir", data_dir, "--topic", "t",
                                        "--rebuild-metadata"])
        assert out.exit_code == 0 and "2 partitions" in out.output, out.output
        with open(path + ".damaged", "rb") as f:
            assert f.read() == b'{"name": "t", "partit'
        broker.start()
        assert [v for _, v in fetch_values(stub_for(broker), "t", 1)] == [b"t-1-0", b"t-1-1", b"t-1-2"]
