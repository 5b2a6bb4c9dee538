"""Consumer throughput: our ``poll()`` and ``poll_arrow`` next to Kafka's consumers, same run (issue 16).

Data: ``--records`` (default 2,000,000) records of 100-byte random values, no key,
in a topic of ``--partitions`` (default 1) partitions, written untimed by
``send_batch`` (ours) and by confluent-kafka ``produce()`` (Kafka). Measured, best
of ``--repeats``, runs alternating, each reading every record from offset 0 with a
new consumer (no group: partitions assigned), after one untimed warm-up each:

(a) poll()        our ``Consumer.poll()``, each returned record's ``value`` touched;
(b) poll_arrow    our ``Consumer.poll_arrow()``, the tables' rows counted;
(c) Kafka poll()  confluent-kafka ``Consumer.poll()``, one record per call, each
                  ``value()`` touched (the per-record baseline of (a));
(d) Kafka consume(500)  confluent-kafka ``consume(500)``, the same (for reference);
(e) Kafka Java    ``org.apache.kafka.tools.ConsumerPerformance`` (kafka-consumer-perf-test)
                  in its own JVM, its ``fetch.nMsg.sec`` (the baseline of (b)).

(c)-(e) run with ``--kafka`` only (``make bench-kafka``), against a single-node
Apache Kafka started by ``kafka_server.py``; without it the script prints (a) and
(b) and their ratio. Both brokers read from the page cache (data just written).
Targets (issue 16): (a)/(c) >= 1.0 and (b)/(e) >= 1.0.

Run: ``make bench-kafka`` or ``.venv/bin/python benchmarks/bench_consume_kafka.py [--kafka]``.
"""

from __future__ import annotations

import argparse
import contextlib
import sys

import numpy as np
import pyarrow as pa
from benchutil import Timer, child_pid, machine_line, process_cpu_s, verdict
from kafka_server import add_kafka_flag, maybe_kafka

from logstore.broker.embedded import EmbeddedBroker
from logstore.client.admin import Admin
from logstore.client.consumer import Consumer
from logstore.client.producer import Producer
from logstore.types import TopicPartition

VALUE_BYTES = 100
TABLE_ROWS = 200_000
TOPIC = "bench-consume"


def make_values(records: int, seed: int = 4) -> list[bytes]:
    data = np.random.default_rng(seed).bytes(records * VALUE_BYTES)
    return [data[i:i + VALUE_BYTES] for i in range(0, len(data), VALUE_BYTES)]


def fill_ours(bootstrap: str, values: list[bytes], partitions: int) -> None:
    with Admin(bootstrap) as admin:
        admin.create_topic(TOPIC, partitions)
    with Producer(bootstrap, acks=1) as producer:
        for start in range(0, len(values), TABLE_ROWS):
            producer.send_batch(TOPIC, pa.table({"value": pa.array(values[start:start + TABLE_ROWS],
                                                                   pa.binary())}))
        producer.flush()


def our_poll(bootstrap: str, partitions: int, records: int, *, arrow: bool) -> Timer:
    """Every record from offset 0 of every partition, with poll() or poll_arrow()."""
    consumer = Consumer(bootstrap, auto_offset_reset="earliest", isolation_level="read_uncommitted")
    consumer.assign([TopicPartition(TOPIC, p) for p in range(partitions)])
    got = 0
    size = 0
    try:
        with Timer() as t:
            if arrow:
                while got < records:
                    for table in consumer.poll_arrow(timeout_ms=1000).values():
                        got += table.num_rows
            else:
                poll = consumer.poll
                while got < records:
                    for record in poll(timeout_ms=1000):
                        size += len(record.value)
                        got += 1
    finally:
        consumer.close()
    assert got == records, (got, records)
    return t


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n", 1)[0])
    parser.add_argument("--records", type=int, default=2_000_000)
    parser.add_argument("--partitions", type=int, default=1)
    parser.add_argument("--repeats", type=int, default=3)
    add_kafka_flag(parser)
    args = parser.parse_args(argv)
    n = args.records

    print(f"consumer benchmark: {n:,} records of {VALUE_BYTES}-byte values, {args.partitions} "
          f"partition(s), read from offset 0 by one consumer; brokers in child processes")
    print(machine_line(), flush=True)
    values = make_values(n)
    best: dict[str, float] = {}

    def keep(key: str, t: Timer) -> float:
        best[key] = min(best.get(key, float("inf")), t.wall)
        return t.wall

    with contextlib.ExitStack() as stack:
        kafka = stack.enter_context(maybe_kafka(args.kafka))
        broker = stack.enter_context(EmbeddedBroker(subprocess=True))
        broker_pid = child_pid("logstore.broker")
        fill_ours(broker.bootstrap, values, args.partitions)
        print(f"  {n:,} records written to our broker (not timed)", flush=True)
        if kafka is not None:
            from kafka_clients import consume, end_offsets_sum, java_consumer_records_per_s, produce

            kafka.create_topic(TOPIC, args.partitions)
            produce(kafka.bootstrap, TOPIC, values)
            assert end_offsets_sum(kafka.bootstrap, TOPIC, args.partitions) == n + 1
            n_kafka = n + 1  # produce() sends one warm-up record first
            print(f"  {n_kafka:,} records written to Kafka (not timed)", flush=True)
        our_poll(broker.bootstrap, args.partitions, n, arrow=False)  # warm-ups, not reported
        our_poll(broker.bootstrap, args.partitions, n, arrow=True)
        if kafka is not None:
            consume(kafka.bootstrap, TOPIC, args.partitions, n_kafka)
        java: list[float] = []
        broker_cpu = {}
        for i in range(args.repeats):
            cpu0 = process_cpu_s(broker_pid)
            a = keep("a", our_poll(broker.bootstrap, args.partitions, n, arrow=False))
            broker_cpu["a"] = process_cpu_s(broker_pid) - cpu0
            b = keep("b", our_poll(broker.bootstrap, args.partitions, n, arrow=True))
            line = f"  run {i + 1}/{args.repeats}: poll() {a:.2f}s, poll_arrow {b:.2f}s"
            if kafka is not None:
                c = keep("c", consume(kafka.bootstrap, TOPIC, args.partitions, n_kafka))
                d = keep("d", consume(kafka.bootstrap, TOPIC, args.partitions, n_kafka, batch=500))
                line += f"; Kafka poll() {c:.2f}s, consume(500) {d:.2f}s"
                try:
                    java.append(java_consumer_records_per_s(kafka, TOPIC, n_kafka))
                    line += f", Java consumer {java[-1]:,.0f} records/s"
                except (RuntimeError, AssertionError, OSError) as e:
                    line += f", Java consumer failed: {e}"
            print(line, flush=True)

    print()
    print(f"{'best of ' + str(args.repeats):<34}{'seconds':>9}{'records/s':>13}{'MB/s values':>13}")
    rows = [("a", "(a) poll()", n), ("b", "(b) poll_arrow", n)]
    if "c" in best:
        rows += [("c", "(c) Kafka poll(), confluent-kafka", n_kafka),
                 ("d", "(d) Kafka consume(500)", n_kafka)]
    for key, name, count in rows:
        print(f"{name:<34}{best[key]:>9.2f}{count / best[key]:>13,.0f}"
              f"{count * VALUE_BYTES / best[key] / 1e6:>13.1f}")
    if java:
        print(f"{'(e) Kafka Java consumer':<34}{'-':>9}{max(java):>13,.0f}"
              f"{max(java) * VALUE_BYTES / 1e6:>13.1f}   (its fetch.nMsg.sec)")
    print()
    print(f"(our broker's CPU during the last poll() run: {broker_cpu['a']:.2f}s)")
    print(f"ratio (a)/(b) poll() / poll_arrow records/s = {best['b'] / best['a']:.2f}")
    if "c" in best:
        ratio_ac = (n / best["a"]) / (n_kafka / best["c"])
        print(f"ratio (a)/(c) poll() vs Kafka poll() = {ratio_ac:.2f}x   target >= 1.0: "
              f"{verdict(ratio_ac >= 1.0)}")
        print(f"ratio (a)/(d) poll() vs Kafka consume(500) = {(n / best['a']) / (n_kafka / best['d']):.2f}x")
    if java:
        ratio_be = (n / best["b"]) / max(java)
        print(f"ratio (b)/(e) poll_arrow vs Kafka's Java consumer = {ratio_be:.2f}x   target >= 1.0: "
              f"{verdict(ratio_be >= 1.0)}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
