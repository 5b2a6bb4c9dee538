"""Group commit (logstore.broker.data_plane.group_fsync): acks=all produces share fsyncs, and lose nothing.

* the flusher against a real :class:`Log` and a real thread pool: waits that
  arrive together share one fsync; appends made during a flush get the next one;
* a real broker: many concurrent acks=all produces cost fewer fsyncs than produces;
* a child broker SIGKILLed while many producers send with acks=all: every
  acknowledged record is read back at its offset after the restart (DESIGN I6).
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import threading
import time
from collections.abc import Callable

import pytest
from storage_helpers import SCHEMA, config, simple_batch

from logstore import Admin, BrokerClient, NewTopic, Producer, TopicPartition
from logstore.broker.data_plane import group_fsync
from logstore.broker.data_plane.group_fsync import GroupCommit, fsync_appended, fsyncs_done
from logstore.broker.embedded import EmbeddedBroker
from logstore.client.fetcher import fetch_range
from logstore.errors import LogstoreError
from logstore.storage.log import Log


def _runner(pool: concurrent.futures.Executor) -> Callable[[Callable[[Log], int], Log], asyncio.Future[int]]:
    """The broker's ``_run``: a blocking call on a real thread pool."""
    def run(fn: Callable[[Log], int], log: Log) -> asyncio.Future[int]:
        return asyncio.get_running_loop().run_in_executor(pool, fn, log)
    return run


@pytest.mark.timeout(60)
def test_waits_that_arrive_together_share_one_fsync(tmp_path) -> None:  # type: ignore[no-untyped-def]
    log = Log.open(str(tmp_path / "t-0"), config=config(), schema=SCHEMA)
    with concurrent.futures.ThreadPoolExecutor(4) as pool:
        flusher = GroupCommit(log, _runner(pool))

        async def scenario() -> int:
            ends = []
            for _ in range(50):
                ends.append(log.append(simple_batch(2)).last_offset + 1)
            before = fsyncs_done()
            await asyncio.gather(*(flusher.wait_durable(end) for end in ends))
            return fsyncs_done() - before

        assert asyncio.run(scenario()) == 1
    assert flusher.durable_offset == 100 == log.log_end_offset
    log.close()


@pytest.mark.timeout(60)
def test_appends_during_a_flush_get_the_next_one(tmp_path, monkeypatch) -> None:  # type: ignore[no-untyped-def]
    """A flush covers only what was appended before it began; later appends share one more."""
    log = Log.open(str(tmp_path / "t-0"), config=config(), schema=SCHEMA)
    gate = threading.Event()
    real_fsync = group_fsync.os.fsync

    def slow_fsync(fd: int) -> None:  # the disk is busy until the test opens the gate
        assert gate.wait(10)
        real_fsync(fd)

    monkeypatch.setattr(group_fsync.os, "fsync", slow_fsync)
    with concurrent.futures.ThreadPoolExecutor(4) as pool:
        flusher = GroupCommit(log, _runner(pool))

        async def scenario() -> int:
            before = fsyncs_done()
            first = asyncio.ensure_future(flusher.wait_durable(log.append(simple_batch(3)).last_offset + 1))
            await asyncio.sleep(0.05)  # the first flush took end offset 3 and is in its fsync
            later_ends = [log.append(simple_batch(1)).last_offset + 1 for _ in range(20)]
            later = [asyncio.ensure_future(flusher.wait_durable(end)) for end in later_ends]
            await asyncio.sleep(0.05)
            assert not first.done() and not any(f.done() for f in later)
            gate.set()
            await first
            assert flusher.durable_offset == 3  # the appends made during the fsync are not claimed
            await asyncio.gather(*later)
            return fsyncs_done() - before

        assert asyncio.run(scenario()) == 2
    assert flusher.durable_offset == log.log_end_offset == 23
    log.close()


@pytest.mark.timeout(60)
def test_flush_takes_its_end_offset_before_the_fsync(tmp_path, monkeypatch) -> None:  # type: ignore[no-untyped-def]
    """An append that lands while the fsync runs is not claimed durable by that fsync."""
    log = Log.open(str(tmp_path / "t-0"), config=config(), schema=SCHEMA)
    log.append(simple_batch(5))
    real_fsync = group_fsync.os.fsync

    def fsync_with_append_meanwhile(fd: int) -> None:
        log.append(simple_batch(7))  # written after the end offset was taken
        real_fsync(fd)

    monkeypatch.setattr(group_fsync.os, "fsync", fsync_with_append_meanwhile)
    assert fsync_appended(log) == 5
    assert log.log_end_offset == 12
    log.close()


@pytest.mark.timeout(120)
def test_concurrent_acks_all_produces_share_fsyncs() -> None:
    """Many concurrent acks=all produces to one partition cost fewer fsyncs than produces."""
    threads, per_thread = 16, 20
    with EmbeddedBroker() as broker, Admin(broker.bootstrap) as admin:
        admin.create_topics([NewTopic("gc", 1)])
        acked: list[tuple[int, bytes]] = []
        lock = threading.Lock()
        barrier = threading.Barrier(threads)
        before = fsyncs_done()

        def send(t: int) -> None:
            with Producer(broker.bootstrap, acks="all", linger_ms=0) as producer:
                producer.send("gc", b"warm-%d" % t, partition=0).result(timeout=30)
                barrier.wait(timeout=30)
                for i in range(per_thread):
                    value = b"%d-%d" % (t, i)
                    meta = producer.send("gc", value, partition=0).result(timeout=30)
                    with lock:
                        acked.append((meta.offset, value))

        with concurrent.futures.ThreadPoolExecutor(threads) as pool:
            for f in [pool.submit(send, t) for t in range(threads)]:
                f.result(timeout=90)
        fsyncs = fsyncs_done() - before
        produces = threads * (per_thread + 1)  # linger 0, one record in flight: a request each
        assert 0 < fsyncs < produces, (fsyncs, produces)
        with BrokerClient(broker.bootstrap) as client:
            stored = {}
            for batch in fetch_range(client, TopicPartition("gc", 0), 0, produces):
                stored.update(zip(batch.column("offset").to_pylist(), batch.column("value").to_pylist(),
                                  strict=True))
        for offset, value in acked:
            assert stored[offset] == value
    print(f"{produces} acks=all produces, {fsyncs} fsyncs")


@pytest.mark.timeout(300)
def test_sigkill_loses_no_record_acknowledged_by_a_group_commit(tmp_path) -> None:  # type: ignore[no-untyped-def]
    """Concurrent acks=all producers, SIGKILL of the child broker mid-stream, restart:
    every acknowledged record is there at its acknowledged offset (DESIGN I6)."""
    broker = EmbeddedBroker(str(tmp_path), subprocess=True).start()
    try:
        with Admin(broker.bootstrap) as admin:
            admin.create_topics([NewTopic("durable", 1)])
        acked: dict[int, bytes] = {}
        lock = threading.Lock()
        for round_no in range(3):
            stop = threading.Event()

            def send(t: int, round_no: int = round_no, stop: threading.Event = stop) -> None:
                producer = Producer(broker.bootstrap, acks="all", linger_ms=0, retries=0,
                                    delivery_timeout_ms=5_000, request_timeout_ms=5_000)
                try:
                    i = 0
                    while not stop.is_set():
                        value = b"r%d-t%d-%d" % (round_no, t, i)
                        i += 1
                        try:
                            meta = producer.send("durable", value, partition=0).result(timeout=10)
                        except (LogstoreError, concurrent.futures.TimeoutError):
                            return  # the broker died: not acknowledged
                        with lock:
                            acked[meta.offset] = value
                finally:
                    producer.close(timeout=0)

            workers = [threading.Thread(target=send, args=(t,)) for t in range(8)]
            for w in workers:
                w.start()
            time.sleep(1.0 + round_no * 0.37)
            broker.kill()
            stop.set()
            for w in workers:
                w.join(timeout=30)
                assert not w.is_alive()
            broker.start()
        assert len(acked) > 100
        with BrokerClient(broker.bootstrap) as client:
            stored: dict[int, bytes] = {}
            end = max(acked) + 1
            for batch in fetch_range(client, TopicPartition("durable", 0), 0, end,
                                     isolation_level="read_uncommitted"):
                stored.update(zip(batch.column("offset").to_pylist(), batch.column("value").to_pylist(),
                                  strict=True))
        missing = {o: v for o, v in acked.items() if stored.get(o) != v}
        assert not missing, f"{len(missing)} acknowledged records lost, e.g. {list(missing.items())[:3]}"
    finally:
        broker.stop()


def test_a_flusher_does_not_keep_its_log_alive(tmp_path) -> None:  # type: ignore[no-untyped-def]
    """The broker keeps flushers in a WeakKeyDictionary by log: a deleted log must go."""
    import gc
    import weakref

    log = Log.open(str(tmp_path / "t-0"), config=config(), schema=SCHEMA)
    flushers: weakref.WeakKeyDictionary[Log, GroupCommit] = weakref.WeakKeyDictionary()
    with concurrent.futures.ThreadPoolExecutor(1) as pool:
        flushers[log] = GroupCommit(log, _runner(pool))
    log.close()
    del log
    gc.collect()
    assert len(flushers) == 0
