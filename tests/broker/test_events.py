"""The broker's log events (logstore.broker.log_lines): each happens, with its fields.

Real brokers, real damage: a torn tail written into a stopped broker's
segment, a corrupt acknowledged batch. Events are captured in-process as
``logging`` records (their fields are the records' attributes), and once
through a child broker's stderr with ``--log-format json`` / ``LOGSTORE_LOG_FORMAT``.
"""

from __future__ import annotations

import json
import logging
import os
import random
import signal
import subprocess as sp
import sys
from collections.abc import Iterator

import grpc
import pytest
from metrics_helpers import free_port, scrape

from logstore import Admin
from logstore._proto import logstore_pb2 as pb
from logstore._proto import logstore_pb2_grpc as pb_grpc
from logstore.broker.embedded import EmbeddedBroker
from logstore.broker.log_lines import JsonFormatter, TextFormatter
from logstore.record import build_batch, encode_batch, encode_schema, untyped_schema
from logstore.storage.log import CLEAN_SHUTDOWN_FILE
from logstore.storage.segment import SEGMENT_SUFFIX

SCHEMA = untyped_schema()


class Captured(logging.Handler):
    def __init__(self) -> None:
        super().__init__(logging.INFO)
        self.records: list[logging.LogRecord] = []

    def emit(self, record: logging.LogRecord) -> None:
        self.records.append(record)

    def events(self, name: str) -> list[logging.LogRecord]:
        return [r for r in self.records if getattr(r, "event", None) == name]


@pytest.fixture()
def captured() -> Iterator[Captured]:
    handler = Captured()
    logger = logging.getLogger("logstore")
    old_level = logger.level
    logger.setLevel(logging.INFO)
    logger.addHandler(handler)
    try:
        yield handler
    finally:
        logger.removeHandler(handler)
        logger.setLevel(old_level)


def produce(broker: EmbeddedBroker, topic: str, values: list[bytes]) -> None:
    batch = build_batch(SCHEMA, values=values, timestamps_ms=[1_000] * len(values), keys=[None] * len(values))
    data = encode_schema(SCHEMA) + encode_batch(batch, base_offset=0).to_bytes()
    with grpc.insecure_channel(broker.bootstrap) as channel:
        r = pb_grpc.LogstoreStub(channel).Produce(pb.ProduceRequest(acks=-1, partitions=[
            pb.ProducePartition(topic=topic, partition=0, records=data)]), timeout=30).partitions[0]
    assert not r.error.code, r.error


def segment_path(data_dir: str, topic: str) -> str:
    directory = os.path.join(data_dir, f"{topic}-0")
    (name,) = [n for n in os.listdir(directory) if n.endswith(SEGMENT_SUFFIX)]
    return os.path.join(directory, name)


def two_batches(broker: EmbeddedBroker, topic: str) -> tuple[str, int, int]:
    """Create ``topic``, append 3 then 2 records; return the segment and its size after each."""
    with Admin(broker.bootstrap) as admin:
        admin.create_topic(topic, 1)
    path = segment_path(broker.data_dir, topic)
    produce(broker, topic, [b"a", b"b", b"c"])
    first = os.path.getsize(path)
    produce(broker, topic, [b"d", b"e"])
    return path, first, os.path.getsize(path)


@pytest.mark.timeout(60)
def test_topic_create_and_delete_are_events(captured: Captured) -> None:
    topic = f"ev-{random.randrange(1 << 30)}"
    with EmbeddedBroker() as broker, Admin(broker.bootstrap) as admin:
        admin.create_topic(topic, 3)
        admin.delete_topics([topic])
    (created,) = [r for r in captured.events("topic_created") if getattr(r, "topic", None) == topic]
    assert created.levelno == logging.INFO and getattr(created, "partitions", None) == 3
    (deleted,) = [r for r in captured.events("topic_deleted") if getattr(r, "topic", None) == topic]
    assert getattr(deleted, "partitions", None) == 3


@pytest.mark.timeout(120)
@pytest.mark.parametrize("damage", ["torn", "corrupt"])
def test_recovery_truncation_says_how_many_bytes_and_batches(tmp_path: object, captured: Captured,
                                                             damage: str) -> None:
    """After the acknowledged records, a crash left either a torn batch (its body cut short: no
    whole batch to count) or a whole batch that fails its check (counted)."""
    topic = "damaged"
    broker = EmbeddedBroker(str(tmp_path))
    broker.start()
    try:
        path, first, second = two_batches(broker, topic)
        broker.stop()
        with open(path, "rb") as f:
            last_batch = bytearray(f.read()[first:second])
        if damage == "torn":
            tail = bytes(last_batch[:-8])
        else:
            last_batch[-1] ^= 0xFF
            tail = bytes(last_batch)
        with open(path, "ab") as f:
            f.write(tail)
        os.remove(os.path.join(os.path.dirname(path), CLEAN_SHUTDOWN_FILE))
        captured.records.clear()
        broker.start()
        (cut,) = captured.events("recovery_truncated")
        batches = 0 if damage == "torn" else 1
        assert getattr(cut, "bytes", None) == len(tail)
        assert getattr(cut, "batches", None) == batches
        assert getattr(cut, "position", None) == second
        assert getattr(cut, "first_offset", None) == 5
        assert f"{len(tail)} bytes, {batches} batches" in cut.getMessage()
        online = [r for r in captured.events("partition_online") if getattr(r, "topic", None) == topic]
        assert len(online) == 1
        assert getattr(online[0], "log_end_offset", None) == 5
        assert getattr(online[0], "clean_shutdown", None) is False
    finally:
        broker.close()


@pytest.mark.timeout(120)
def test_a_corrupt_acknowledged_batch_takes_the_partition_offline_with_an_event(
    tmp_path: object, captured: Captured
) -> None:
    topic = "corrupt"
    port = free_port()
    broker = EmbeddedBroker(str(tmp_path), overrides={"metrics_port": port})
    broker.start()
    try:
        path, first, second = two_batches(broker, topic)
        assert scrape(port)[("logstore_offline_partitions", ())] == 0
        broker.stop()
        with open(path, "r+b") as f:  # flip the last byte of the second (acknowledged) batch
            f.seek(second - 1)
            last = f.read(1)
            f.seek(second - 1)
            f.write(bytes([last[0] ^ 0xFF]))
        os.remove(os.path.join(os.path.dirname(path), CLEAN_SHUTDOWN_FILE))
        captured.records.clear()
        broker.start()
        (offline,) = captured.events("partition_offline")
        assert (getattr(offline, "topic", None), getattr(offline, "partition", None)) == (topic, 0)
        assert offline.levelno == logging.ERROR
        assert "partitions recover" in getattr(offline, "reason", "")
        assert not [r for r in captured.events("partition_online") if getattr(r, "topic", None) == topic]
        assert scrape(port)[("logstore_offline_partitions", ())] == 1
    finally:
        broker.close()


def test_formatters_write_one_line_per_event() -> None:
    try:
        raise ValueError("boom\nsecond line")
    except ValueError:
        exc = sys.exc_info()
    record = logging.LogRecord("logstore.storage.log_manager", logging.INFO, __file__, 1,
                               "topic %s created: %d partitions", ("orders", 3), exc)
    record.event, record.topic, record.partitions = "topic_created", "orders", 3
    line = JsonFormatter().format(record)
    assert "\n" not in line
    doc = json.loads(line)
    assert doc["level"] == "INFO" and doc["logger"] == "logstore.storage.log_manager"
    assert doc["message"] == "topic orders created: 3 partitions"
    assert (doc["event"], doc["topic"], doc["partitions"]) == ("topic_created", "orders", 3)
    assert doc["ts"].endswith("Z") and "ValueError: boom" in doc["exc"]
    record.exc_info = None
    text = TextFormatter().format(record)
    assert text.endswith("topic orders created: 3 partitions [event=topic_created topic=orders partitions=3]")


@pytest.mark.timeout(120)
@pytest.mark.parametrize("how", ["flag", "env"])
def test_a_json_broker_log_is_one_json_object_a_line(tmp_path: object, how: str) -> None:
    cmd = [sys.executable, "-m", "logstore.broker", "--data-dir", str(tmp_path), "--port", "0"]
    env = {**os.environ, "LOGSTORE_LOG_LEVEL": "INFO"}
    if how == "flag":
        cmd += ["--log-format", "json"]
    else:
        env["LOGSTORE_LOG_FORMAT"] = "json"
    proc = sp.Popen(cmd, stdout=sp.PIPE, stderr=sp.PIPE, text=True, env=env)
    try:
        assert proc.stdout is not None
        line = proc.stdout.readline()
        assert line.startswith("listening on "), line
        bootstrap = line.split()[-1]
        with Admin(bootstrap) as admin:
            admin.create_topic("json-events", 2)
    finally:
        proc.send_signal(signal.SIGTERM)
        _, err = proc.communicate(timeout=60)
    assert proc.returncode == 0, err
    docs = [json.loads(raw) for raw in err.splitlines()]  # every line parses
    assert docs and all({"ts", "level", "logger", "message"} <= d.keys() for d in docs)
    created = [d for d in docs if d.get("event") == "topic_created" and not d["topic"].startswith("__")]
    assert [(d["topic"], d["partitions"]) for d in created] == [("json-events", 2)]
    assert any("serving on" in d["message"] for d in docs)
