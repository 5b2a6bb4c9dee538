"""A full disk heals without a restart (issue 14, finding 5).

Each test mounts its own small tmpfs (root only; skipped with the reason
where mounting is not permitted), fills it with a junk file until appends
fail, checks the error, frees the space and checks that appends succeed
again and every acknowledged record is readable — in the log and after a
restart.
"""

from __future__ import annotations

import contextlib
import errno
import logging
import os
import subprocess
import time
from collections.abc import Iterator

import pytest
from storage_helpers import produced, read_all, simple_batch

from logstore import Admin, Consumer, NewTopic, Producer, TopicPartition
from logstore.errors import StorageError
from logstore.storage.config import LogConfig
from logstore.storage.log_manager import LogManager


@pytest.fixture
def small_disk(tmp_path) -> Iterator[str]:
    """A 1 MiB tmpfs mounted on a temp dir for this test only."""
    mnt = str(tmp_path / "disk")
    os.makedirs(mnt)
    try:
        proc = subprocess.run(["mount", "-t", "tmpfs", "-o", "size=1m", "tmpfs", mnt],
                              capture_output=True, timeout=20)
    except (FileNotFoundError, subprocess.TimeoutExpired) as e:
        pytest.skip(f"cannot mount a tmpfs for the disk-full test: {e}")
    if proc.returncode != 0:
        pytest.skip("cannot mount a tmpfs for the disk-full test (needs root or CAP_SYS_ADMIN): "
                    + proc.stderr.decode().strip())
    try:
        yield mnt
    finally:
        subprocess.run(["umount", "-l", mnt], capture_output=True, timeout=20)


def _fill(path: str) -> None:
    """Write ``path`` until the filesystem has no space left."""
    chunk = b"\0" * 4096
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o644)
    try:
        while True:
            try:
                if os.write(fd, chunk) == 0:
                    return
            except OSError as e:
                if e.errno == errno.ENOSPC:
                    return
                raise
    finally:
        os.close(fd)



@pytest.mark.timeout(60)
def test_partition_accepts_appends_again_when_space_returns(small_disk: str, caplog) -> None:
    data_dir = os.path.join(small_disk, "data")
    lm = LogManager(data_dir, topic_defaults=LogConfig.from_properties({"segment.bytes": "65536"}))
    lm.startup()
    lm.create_topic("t", partitions=1, configs={}, value_schema=None)
    part = lm.partition("t", 0)
    acked: list[int] = []  # base offsets of acknowledged batches of 20 records each
    for _ in range(3):
        acked.append(part.append(*produced(simple_batch(20, tag=b"x" * 40)), fsync=True)[0])
    junk = os.path.join(small_disk, "junk")
    _fill(junk)
    with caplog.at_level(logging.WARNING, logger="logstore.storage.log"):
        failure: StorageError | None = None
        for _ in range(2000):
            try:
                acked.append(part.append(*produced(simple_batch(20, tag=b"x" * 40)), fsync=True)[0])
            except StorageError as e:
                failure = e
                break
        assert failure is not None, "the disk never filled"
        assert failure.code == "KAFKA_STORAGE_ERROR"
        assert failure.retriable
        assert "disk full" in failure.message
        # Still full (what the failed write took is filled too): refused again after
        # the retry interval, and reads go on.
        time.sleep(0.3)
        _fill(junk)
        with pytest.raises(StorageError) as again:
            part.append(*produced(simple_batch(400, tag=b"x" * 40)), fsync=True)
        assert again.value.code == "KAFKA_STORAGE_ERROR"
        expected_end = acked[-1] + 20
        assert part.log.log_end_offset == expected_end
        assert [r[0] for r in read_all(part.log)] == list(range(expected_end))

        os.remove(junk)
        deadline = time.monotonic() + 10
        while True:
            try:
                base, _ = part.append(*produced(simple_batch(20, tag=b"y")), fsync=True)
                break
            except StorageError:
                assert time.monotonic() < deadline, "appends still fail after space was freed"
                time.sleep(0.05)
    assert base == expected_end, "an offset of a failed append was used or skipped"
    acked.append(base)
    assert any("writable again" in r.getMessage() for r in caplog.records)
    records = read_all(part.log)
    assert [r[0] for r in records] == list(range(base + 20))
    assert records[-1][3] == b"y19"
    lm.shutdown()

    lm = LogManager(data_dir, topic_defaults=LogConfig())
    lm.startup()
    records = read_all(lm.partition("t", 0).log)
    assert [r[0] for r in records] == list(range(base + 20))
    lm.shutdown()


@pytest.mark.timeout(60)
def test_producer_succeeds_after_disk_full_through_broker(small_disk: str) -> None:
    """Through a broker: produces fail with a retriable storage error, then succeed once space returns."""
    from logstore.broker.embedded import EmbeddedBroker

    data_dir = os.path.join(small_disk, "data")
    with EmbeddedBroker(data_dir=data_dir) as broker:
        with Admin(broker.bootstrap) as admin:
            admin.create_topics([NewTopic("t", 1)])
        junk = os.path.join(small_disk, "junk")
        ok: list[tuple[int, bytes]] = []
        with Producer(broker.bootstrap, acks="all", retries=0, linger_ms=0, enable_idempotence=False) as producer:
            ok.append((producer.send("t", b"before").result(timeout=10).offset, b"before"))
            _fill(junk)
            failed = 0
            for i in range(200):
                value = b"full-%d-" % i + b"z" * 2000
                try:
                    ok.append((producer.send("t", value).result(timeout=10).offset, value))
                except StorageError as e:
                    assert e.code == "KAFKA_STORAGE_ERROR"
                    failed += 1
                    if failed >= 3:
                        break
            assert failed >= 3, "the disk never filled"
            os.remove(junk)
        with Producer(broker.bootstrap, acks="all", linger_ms=0) as producer:
            deadline = time.monotonic() + 15
            while True:
                with contextlib.suppress(StorageError):
                    ok.append((producer.send("t", b"after").result(timeout=10).offset, b"after"))
                    break
                assert time.monotonic() < deadline, "produces still fail after space was freed"
                time.sleep(0.05)
        with Consumer(broker.bootstrap, auto_offset_reset="earliest") as consumer:
            consumer.assign([TopicPartition("t", 0)])
            got: dict[int, bytes] = {}
            deadline = time.monotonic() + 15
            while len(got) < ok[-1][0] + 1 and time.monotonic() < deadline:
                for record in consumer.poll(timeout_ms=500):
                    got[record.offset] = record.value
        for offset, value in ok:
            assert got.get(offset) == value
        assert sorted(got) == list(range(ok[-1][0] + 1)), "offsets must stay contiguous"
