"""The Kafka side of the client benchmarks: what confluent-kafka (librdkafka) and Kafka's Java
consumer measure against a :class:`kafka_server.KafkaServer`, shaped like our own runs.

* :func:`produce` — confluent-kafka ``Producer.produce()`` once per record (the
  issue's "per-record produce()"), then ``flush()``; no delivery callback, as our
  ``send()`` runs keep no futures: what arrived is checked afterwards from the
  partitions' high watermarks (:func:`end_offsets_sum`).
* :func:`consume` — ``Consumer.poll()`` once per record (or ``consume(n)`` in
  batches) from offset 0 of an assigned topic until every record came back, each
  record's ``value()`` touched, as ``Consumer.poll()`` of ours returns records;
  8 MiB per partition fetch, as ours (:data:`CONSUMER_FETCH`).
* :func:`java_consumer_records_per_s` — ``org.apache.kafka.tools.ConsumerPerformance``
  (``kafka-consumer-perf-test``) in its own JVM, ``--fetch-size`` 8 MiB: Kafka's
  Java consumer, the baseline of our ``poll_arrow``.
* :func:`latency_run` — one record of ``value_bytes`` per millisecond tick with
  ``linger.ms=0``, stamped with its send time, read back by a long-polling
  consumer thread in this process: the Kafka twin of ``bench_latency.py``'s runs.

librdkafka's defaults are kept except where a run says otherwise; every run
prints the settings that differ. Thread-safety: none needed, each call makes its
own clients.
"""

from __future__ import annotations

import re
import struct
import subprocess
import threading
import time
import uuid
from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np
from benchutil import Timer
from kafka_server import KafkaServer

# Enough room that produce() never raises BufferError in a run: the queue is not the subject.
PRODUCER_QUEUE = {"queue.buffering.max.messages": 2_000_000, "queue.buffering.max.kbytes": 4 << 20}
# Fetch up to 8 MiB per partition, as our Consumer does (max_partition_fetch_bytes), and keep
# a million records prefetched. librdkafka's 1 MiB default makes one partition fetch-bound:
# measured here, 189 k records/s with it and 696 k/s with these, poll() for poll().
PARTITION_FETCH_BYTES = 8 << 20
CONSUMER_FETCH = {"fetch.message.max.bytes": PARTITION_FETCH_BYTES, "queued.min.messages": 1_000_000}


def _confluent():
    import confluent_kafka

    return confluent_kafka


def end_offsets_sum(bootstrap: str, topic: str, partitions: int) -> int:
    """Sum of the high watermarks of ``topic``'s partitions (records appended, from offset 0)."""
    ck = _confluent()
    consumer = ck.Consumer({"bootstrap.servers": bootstrap, "group.id": f"watermarks-{uuid.uuid4()}",
                            "enable.auto.commit": False})
    try:
        return sum(consumer.get_watermark_offsets(ck.TopicPartition(topic, p), timeout=30)[1]
                   for p in range(partitions))
    finally:
        consumer.close()


@dataclass
class ProduceRun:
    wall: float
    cpu: float
    records: int
    value_bytes: int


def produce(bootstrap: str, topic: str, values: Sequence[bytes], *, keys: Sequence[bytes] | None = None,
            acks: int | str = 1, config: dict[str, object] | None = None) -> ProduceRun:
    """``produce()`` every value (with its key, when given) then ``flush()``; timed from the first
    produce to the end of flush. A one-record produce before the clock fetches metadata."""
    ck = _confluent()
    conf: dict[str, object] = {"bootstrap.servers": bootstrap, "acks": str(acks), **PRODUCER_QUEUE,
                               **(config or {})}
    producer = ck.Producer(conf)
    producer.produce(topic, values[0], key=keys[0] if keys else None)
    producer.flush(30)
    produce_one = producer.produce
    with Timer() as t:
        if keys is None:
            for v in values:
                try:
                    produce_one(topic, v)
                except BufferError:
                    producer.poll(0.05)
                    produce_one(topic, v)
        else:
            for k, v in zip(keys, values, strict=True):
                try:
                    produce_one(topic, v, k)
                except BufferError:
                    producer.poll(0.05)
                    produce_one(topic, v, k)
        left = producer.flush(120)
    assert left == 0, f"{left} records still queued after flush"
    return ProduceRun(t.wall, t.cpu, len(values), len(values[0]))


def consume(bootstrap: str, topic: str, partitions: int, records: int, *, batch: int = 0,
            config: dict[str, object] | None = None) -> Timer:
    """Read ``records`` records from offset 0 of every partition; ``batch`` 0 means one
    ``poll()`` per record, else ``consume(batch)``. Times from the first call; a consumer
    that sees an error record raises."""
    ck = _confluent()
    consumer = ck.Consumer({"bootstrap.servers": bootstrap, "group.id": f"bench-{uuid.uuid4()}",
                            "enable.auto.commit": False, "auto.offset.reset": "earliest",
                            "enable.partition.eof": False, **CONSUMER_FETCH, **(config or {})})
    consumer.assign([ck.TopicPartition(topic, p, 0) for p in range(partitions)])
    got = 0
    size = 0
    deadline = time.monotonic() + 300
    try:
        with Timer() as t:
            if batch:
                while got < records and time.monotonic() < deadline:
                    # Never ask for more than is left: consume(n) waits out its timeout
                    # for a batch that cannot fill (1 s per run, measured).
                    for msg in consumer.consume(min(batch, records - got), 1.0):
                        if msg.error():
                            raise RuntimeError(f"consume error: {msg.error()}")
                        size += len(msg.value())
                        got += 1
            else:
                poll = consumer.poll
                while got < records:
                    msg = poll(1.0)
                    if msg is None:
                        if time.monotonic() > deadline:
                            break
                        continue
                    if msg.error():
                        raise RuntimeError(f"poll error: {msg.error()}")
                    size += len(msg.value())
                    got += 1
    finally:
        consumer.close()
    assert got == records, f"read {got} of {records} records from Kafka topic {topic}"
    return t


def java_consumer_records_per_s(kafka: KafkaServer, topic: str, records: int) -> float:
    """Kafka's Java consumer reading ``records`` records from the start of ``topic``:
    ``ConsumerPerformance`` (kafka-consumer-perf-test) in its own JVM, -Xmx512m. The
    figure is its own ``fetch.nMsg.sec`` (records/s from the first fetch, so the JVM's
    start and the group join are not counted)."""
    cmd = kafka.java_command("org.apache.kafka.tools.ConsumerPerformance", "--bootstrap-server",
                             kafka.bootstrap, "--topic", topic, "--messages", str(records),
                             "--group", f"bench-perf-{uuid.uuid4()}", "--timeout", "60000",
                             "--fetch-size", str(PARTITION_FETCH_BYTES), "--hide-header", heap="512m")
    done = subprocess.run(cmd, capture_output=True, text=True, timeout=300)
    if done.returncode != 0:
        raise RuntimeError(f"ConsumerPerformance failed ({done.returncode}): {done.stderr[-2000:]}")
    # start.time, end.time, data.consumed.in.MB, MB.sec, data.consumed.in.nMsg, nMsg.sec,
    # rebalance.time.ms, fetch.time.ms, fetch.MB.sec, fetch.nMsg.sec
    rows = [line for line in done.stdout.splitlines() if re.match(r"^\d{4}-", line.strip())]
    if not rows:
        raise RuntimeError(f"no result line from ConsumerPerformance: {done.stdout[-2000:]}")
    fields = [f.strip() for f in rows[-1].split(",")]
    consumed = int(fields[4])
    assert consumed >= records, f"ConsumerPerformance read {consumed} of {records} records"
    return float(fields[9])


_STAMP = struct.Struct("<qq")  # send time (ns), sequence number: bench_latency.py's layout


@dataclass
class LatencyRun:
    latencies_s: np.ndarray
    sent: int
    received: int
    lateness_s: list[float]


def latency_run(bootstrap: str, topic: str, *, acks: int | str, seconds: float, warmup: int,
                rate_per_s: int = 1_000, value_bytes: int = 100) -> LatencyRun:
    """1,000 records/s of 100 bytes to partition 0 with ``linger.ms=0``; a consumer thread
    long-polls (``fetch.wait.max.ms`` 50, ``fetch.min.bytes`` 1: the broker answers as soon
    as a record arrives) and stamps each record when ``poll()`` returns it. The same
    clock, ticks, warm-up and accounting as ``bench_latency.run_produce_consume``."""
    ck = _confluent()
    total = int(seconds * rate_per_s) + warmup
    sent_at = np.zeros(total, dtype=np.int64)
    received_at = np.zeros(total, dtype=np.int64)
    lateness: list[float] = []
    failures: list[BaseException] = []
    done = threading.Event()
    consumer = ck.Consumer({"bootstrap.servers": bootstrap, "group.id": f"latency-{uuid.uuid4()}",
                            "enable.auto.commit": False, "fetch.wait.max.ms": 50,
                            "fetch.min.bytes": 1, "enable.partition.eof": False})
    consumer.assign([ck.TopicPartition(topic, 0, ck.OFFSET_END)])
    ready = threading.Event()

    def read() -> None:
        got = 0
        try:
            while got < total and not done.is_set():
                msg = consumer.poll(0.2)
                ready.set()
                if msg is None:
                    continue
                now = time.perf_counter_ns()
                if msg.error():
                    raise RuntimeError(f"poll error: {msg.error()}")
                _, seq = _STAMP.unpack_from(msg.value())
                if seq >= 0:
                    received_at[seq] = now
                    got += 1
        except BaseException as e:  # reported by the caller
            failures.append(e)

    reader = threading.Thread(target=read, name="bench-kafka-consumer", daemon=True)
    reader.start()
    padding = b"\0" * (value_bytes - _STAMP.size)
    producer = ck.Producer({"bootstrap.servers": bootstrap, "acks": str(acks), "linger.ms": 0})
    # Before the clock: metadata, the partition's first append, the consumer's position.
    producer.produce(topic, _STAMP.pack(0, -1) + padding, partition=0)
    producer.flush(30)
    ready.wait(30)
    time.sleep(0.5)  # the consumer's first fetch has resolved OFFSET_END
    start = time.perf_counter() + 0.05
    for seq in range(total):
        tick = start + seq / rate_per_s
        delay = tick - time.perf_counter()
        if delay > 0:
            time.sleep(delay)
        lateness.append(max(0.0, -delay))
        now = time.perf_counter_ns()
        sent_at[seq] = now
        producer.produce(topic, _STAMP.pack(now, seq) + padding, partition=0)
        producer.poll(0)  # serve delivery reports, as an application's loop does
    producer.flush(30)
    reader.join(timeout=30)
    done.set()
    reader.join(timeout=5)
    consumer.close()
    if failures:
        raise failures[0]
    counted = np.arange(total) >= warmup
    arrived = received_at > 0
    latencies = (received_at[counted & arrived] - sent_at[counted & arrived]) / 1e9
    return LatencyRun(latencies, int(counted.sum()), int((counted & arrived).sum()), lateness[warmup:])
