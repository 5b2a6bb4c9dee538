"""``bench_produce.py --kafka``: our producer and confluent-kafka's against Apache Kafka, same run.

Four shapes, each run on both systems alternately, best of ``--repeats``, acks=1,
no idempotence (librdkafka's default; ours set off), linger 5 ms on both (both
defaults), a new topic per run:

(k1) per record, 100 B, 1 partition      our ``send()`` vs ``produce()``, records/s;
(k2) per record, 100 B, 6 partitions     the same with a key per record (10,000
                                         distinct 10-byte keys), records/s;
(k3) columnar vs per record, 100 B, 1 p. our ``send_batch`` (tables of 200,000 rows)
                                         vs ``produce()``, records/s;
(k4) 1 KiB values, 1 partition           our ``send_batch`` vs ``produce()``, MB/s of values.

Our broker is ``EmbeddedBroker(subprocess=True)`` (no fsync at acks=1); Kafka's is
:class:`kafka_server.KafkaServer` (never fsyncs by default). Both run in child
processes on this machine; the client runs here. Every record is checked: our
topics' end offsets, Kafka's high watermarks.

Targets (issue 16): (k1) >= 0.5x, (k2) >= 1.0x, (k3) >= 2,500,000 records/s,
(k4) >= 1.0x.
"""

from __future__ import annotations

import argparse

import numpy as np
import pyarrow as pa
from benchutil import Timer, machine_line, verdict
from kafka_clients import end_offsets_sum, produce
from kafka_server import KafkaServer, maybe_kafka

from logstore.broker.embedded import EmbeddedBroker
from logstore.client.admin import Admin
from logstore.client.producer import Producer
from logstore.types import TopicPartition

TABLE_ROWS = 200_000
KEYS = 10_000


def values_of(records: int, size: int, seed: int) -> list[bytes]:
    data = np.random.default_rng(seed).bytes(records * size)
    return [data[i:i + size] for i in range(0, len(data), size)]


def keys_of(records: int) -> list[bytes]:
    distinct = [b"key-%06d" % i for i in range(KEYS)]
    return [distinct[i % KEYS] for i in range(records)]


def tables_of(values: list[bytes]) -> list[pa.Table]:
    return [pa.table({"value": pa.array(values[i:i + TABLE_ROWS], pa.binary())})
            for i in range(0, len(values), TABLE_ROWS)]


class Ours:
    """Runs of our producer, each on a new topic deleted afterwards."""

    def __init__(self, bootstrap: str) -> None:
        self.bootstrap = bootstrap
        self.admin = Admin(bootstrap)
        self.count = 0

    def _topic(self, partitions: int) -> str:
        self.count += 1
        name = f"vs-kafka-{self.count}"
        self.admin.create_topic(name, partitions)
        return name

    def _check(self, topic: str, partitions: int, expected: int) -> None:
        ends = self.admin.list_offsets({TopicPartition(topic, p): "latest" for p in range(partitions)})
        appended = sum(o.offset or 0 for o in ends.values())
        assert appended == expected, f"{topic}: {appended} records appended, expected {expected}"
        self.admin.delete_topics([topic])

    def send(self, values: list[bytes], keys: list[bytes] | None, partitions: int) -> float:
        topic = self._topic(partitions)
        with Producer(self.bootstrap, acks=1, enable_idempotence=False) as producer:
            producer.send(topic, values[0], key=keys[0] if keys else None).result()
            send = producer.send
            with Timer() as t:
                if keys is None:
                    for v in values:
                        send(topic, v)
                else:
                    for k, v in zip(keys, values, strict=True):
                        send(topic, v, key=k)
                producer.flush()
        self._check(topic, partitions, len(values) + 1)
        return t.wall

    def send_batch(self, tables: list[pa.Table]) -> float:
        topic = self._topic(1)
        records = sum(t.num_rows for t in tables)
        with Producer(self.bootstrap, acks=1, enable_idempotence=False) as producer:
            producer.send_batch(topic, tables[0].slice(0, 1)).result()
            with Timer() as t:
                for table in tables:
                    producer.send_batch(topic, table)
                producer.flush()
        self._check(topic, 1, records + 1)
        return t.wall


class Theirs:
    """Runs of confluent-kafka's producer against the Kafka server, a new topic per run."""

    def __init__(self, kafka: KafkaServer) -> None:
        self.kafka = kafka
        self.count = 0

    def produce(self, values: list[bytes], keys: list[bytes] | None, partitions: int) -> float:
        self.count += 1
        topic = f"vs-logstore-{self.count}"
        self.kafka.create_topic(topic, partitions)
        run = produce(self.kafka.bootstrap, topic, values, keys=keys, acks=1)
        appended = end_offsets_sum(self.kafka.bootstrap, topic, partitions)
        assert appended == len(values) + 1, f"{topic}: {appended} records, expected {len(values) + 1}"
        self.kafka.delete_topic(topic)
        return run.wall


def compare(args: argparse.Namespace) -> None:
    """The Kafka section of bench_produce.py (its own brokers, after the usual runs)."""
    print()
    print("== the same producer shapes against Apache Kafka (bench_produce.py --kafka)")
    print(machine_line(), flush=True)
    with maybe_kafka(True) as kafka:
        if kafka is None:
            return
        per_record = args.send_records
        batch_records = min(args.records, 1_000_000)
        kib_records = max(1, batch_records // 4)
        print(f"preparing the data (not timed): {per_record:,} x 100 B per record, "
              f"{batch_records:,} x 100 B and {kib_records:,} x 1 KiB for the columnar runs", flush=True)
        small = values_of(max(per_record, batch_records), 100, seed=5)
        keys = keys_of(per_record)
        small_tables = tables_of(small[:batch_records])
        kib = values_of(kib_records, 1024, seed=6)
        kib_tables = tables_of(kib)
        best: dict[str, float] = {}

        def keep(key: str, seconds: float) -> float:
            best[key] = min(best.get(key, float("inf")), seconds)
            return seconds

        with EmbeddedBroker(subprocess=True) as broker:
            ours, theirs = Ours(broker.bootstrap), Theirs(kafka)
            ours.send(small[:1000], None, 1)  # warm-ups, not reported
            theirs.produce(small[:1000], None, 1)
            for i in range(args.repeats):
                a = keep("k1 ours", ours.send(small[:per_record], None, 1))
                b = keep("k1 kafka", theirs.produce(small[:per_record], None, 1))
                c = keep("k2 ours", ours.send(small[:per_record], keys, 6))
                d = keep("k2 kafka", theirs.produce(small[:per_record], keys, 6))
                e = keep("k3 ours", ours.send_batch(small_tables))
                f = keep("k3 kafka", theirs.produce(small[:batch_records], None, 1))
                g = keep("k4 ours", ours.send_batch(kib_tables))
                h = keep("k4 kafka", theirs.produce(kib, None, 1))
                print(f"  run {i + 1}/{args.repeats}: send() {a:.2f}s vs produce() {b:.2f}s; keyed, 6 "
                      f"partitions {c:.2f}s vs {d:.2f}s; send_batch {e:.2f}s vs produce() {f:.2f}s; "
                      f"1 KiB {g:.2f}s vs {h:.2f}s", flush=True)

    rows = [
        ("(k1) 100 B, 1 partition", "send()", "k1", per_record, 100),
        ("(k2) 100 B, 6 partitions, keyed", "send(key=)", "k2", per_record, 100),
        ("(k3) 100 B, 1 partition", "send_batch", "k3", batch_records, 100),
        ("(k4) 1 KiB, 1 partition", "send_batch", "k4", kib_records, 1024),
    ]
    print()
    print(f"{'best of ' + str(args.repeats):<34}{'logstore':>12}{'records/s':>13}{'MB/s':>9}"
          f"{'Kafka produce() rec/s':>23}{'MB/s':>9}{'ratio':>8}")
    ratios: dict[str, float] = {}
    for name, ours_call, key, n, size in rows:
        ours_s, kafka_s = best[f"{key} ours"], best[f"{key} kafka"]
        ratios[key] = kafka_s / ours_s
        print(f"{name:<34}{ours_call:>12}{n / ours_s:>13,.0f}{n * size / ours_s / 1e6:>9.1f}"
              f"{n / kafka_s:>23,.0f}{n * size / kafka_s / 1e6:>9.1f}{ratios[key]:>7.2f}x")
    k3 = batch_records / best["k3 ours"]
    print("(ratio = logstore / Kafka, records/s or MB/s alike; acks=1, no idempotence, linger 5 ms both; "
          "Kafka does not fsync, nor does our broker at acks=1)")
    print(f"send() vs produce(), 1 partition = {ratios['k1']:.2f}x   target >= 0.5x: "
          f"{verdict(ratios['k1'] >= 0.5)}")
    print(f"send(key=) vs produce(key), 6 partitions = {ratios['k2']:.2f}x   target >= 1.0x: "
          f"{verdict(ratios['k2'] >= 1.0)}")
    print(f"send_batch 100 B = {k3:,.0f} records/s ({ratios['k3']:.2f}x produce())   target >= 2,500,000: "
          f"{verdict(k3 >= 2_500_000)}")
    print(f"send_batch 1 KiB vs produce() MB/s = {ratios['k4']:.2f}x   target >= 1.0x: "
          f"{verdict(ratios['k4'] >= 1.0)}")
