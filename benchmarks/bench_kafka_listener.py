"""The Kafka listener's throughput next to our gRPC front end, same broker, same run (issue 25).

One embedded broker with ``kafka_listener``; ``--records`` (default 300,000) records of
100-byte values with 8-byte keys, one partition, best of ``--repeats`` (default 2):

(a) gRPC produce     our ``Producer.send_batch`` (Arrow tables of 50,000 rows)
(b) Kafka produce    confluent-kafka ``produce()`` through the Kafka listener
                     (linger.ms 20, batch.size 1 MiB, no compression, acks=all)
(c) gRPC consume     our ``Consumer.poll_arrow`` from offset 0
(d) Kafka consume    confluent-kafka ``consume(10000)`` from offset 0 through the listener

The ratios (b)/(a) and (d)/(c) say what speaking Kafka costs against our own protocol on
the same data plane: each Kafka batch is converted to an Arrow batch on produce and back
on fetch, one record at a time in Python (:mod:`logstore.broker.kafka.record_batch`), so
they are expected below 1. No target yet: this is the baseline for the next step.

Run: ``.venv/bin/python benchmarks/bench_kafka_listener.py [--records N]``.
"""

from __future__ import annotations

import argparse
import sys

import numpy as np
import pyarrow as pa
from benchutil import Timer, machine_line

from logstore.broker.embedded import EmbeddedBroker
from logstore.client.admin import Admin
from logstore.client.consumer import Consumer
from logstore.client.producer import Producer
from logstore.types import NewTopic, TopicPartition

TABLE_ROWS = 50_000
VALUE_BYTES = 100


def _values(n: int) -> tuple[list[bytes], list[bytes]]:
    rng = np.random.default_rng(1)
    blob = rng.integers(0, 256, size=n * VALUE_BYTES, dtype=np.uint8).tobytes()
    return ([blob[i * VALUE_BYTES:(i + 1) * VALUE_BYTES] for i in range(n)], [b"%08d" % i for i in range(n)])


def _grpc_produce(broker: EmbeddedBroker, topic: str, values: list[bytes], keys: list[bytes]) -> None:
    with Producer(broker.bootstrap) as producer:
        for start in range(0, len(values), TABLE_ROWS):
            producer.send_batch(topic, pa.table({
                "key": pa.array(keys[start:start + TABLE_ROWS], pa.binary()),
                "value": pa.array(values[start:start + TABLE_ROWS], pa.binary())}), partition=0)
        producer.flush()


def _kafka_produce(broker: EmbeddedBroker, topic: str, values: list[bytes], keys: list[bytes]) -> None:
    import confluent_kafka as ck
    producer = ck.Producer({"bootstrap.servers": broker.kafka_bootstrap, "enable.idempotence": False,
                            "linger.ms": 20, "batch.size": 1 << 20, "acks": "all"})
    for key, value in zip(keys, values, strict=True):
        while True:
            try:
                producer.produce(topic, value=value, key=key, partition=0)
                break
            except BufferError:
                producer.poll(0.01)
    if producer.flush(120):
        raise RuntimeError("Kafka produce did not finish in 120 s")


def _grpc_consume(broker: EmbeddedBroker, topic: str, n: int) -> None:
    with Consumer(broker.bootstrap, auto_offset_reset="earliest") as consumer:
        consumer.assign([TopicPartition(topic, 0)])
        got = 0
        while got < n:
            for table in consumer.poll_arrow(timeout_ms=1000).values():
                got += table.num_rows


def _kafka_consume(broker: EmbeddedBroker, topic: str, n: int) -> None:
    import confluent_kafka as ck
    consumer = ck.Consumer({"bootstrap.servers": broker.kafka_bootstrap, "group.id": "bench",
                            "enable.auto.commit": False})
    try:
        consumer.assign([ck.TopicPartition(topic, 0, 0)])
        got = 0
        while got < n:
            got += sum(1 for m in consumer.consume(10_000, 1.0) if m.error() is None)
    finally:
        consumer.close()


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--records", type=int, default=300_000)
    parser.add_argument("--repeats", type=int, default=2)
    args = parser.parse_args(argv)
    try:
        import confluent_kafka  # noqa: F401
    except ImportError:
        print("confluent-kafka is not installed (pip install 'logstore[dev]'): nothing to compare", file=sys.stderr)
        return 0
    n = args.records
    print(f"Kafka listener benchmark: {n:,} records of {VALUE_BYTES}-byte values, 1 partition", flush=True)
    print(machine_line(), flush=True)
    values, keys = _values(n)
    best = {"a": float("inf"), "b": float("inf"), "c": float("inf"), "d": float("inf")}
    with EmbeddedBroker(kafka_listener="127.0.0.1:0") as broker:
        for run in range(args.repeats):
            topics = {k: f"bench-{k}-{run}" for k in ("grpc", "kafka")}
            with Admin(broker.bootstrap) as admin:
                admin.create_topics([NewTopic(t) for t in topics.values()])
            for key, fn, topic in (("a", _grpc_produce, topics["grpc"]), ("b", _kafka_produce, topics["kafka"])):
                with Timer() as t:
                    fn(broker, topic, values, keys)
                best[key] = min(best[key], t.wall)
            for key, fn, topic in (("c", _grpc_consume, topics["grpc"]), ("d", _kafka_consume, topics["kafka"])):
                with Timer() as t:
                    fn(broker, topic, n)
                best[key] = min(best[key], t.wall)
            print(f"  run {run + 1}: " + "  ".join(f"({k}) {n / best[k]:,.0f}/s" for k in "abcd"), flush=True)
    names = {"a": "(a) gRPC produce (send_batch)", "b": "(b) Kafka produce (confluent)",
             "c": "(c) gRPC consume (poll_arrow)", "d": "(d) Kafka consume (confluent)"}
    print()
    print(f"{'best of ' + str(args.repeats):<34}{'seconds':>9}{'records/s':>13}")
    for key, name in names.items():
        print(f"{name:<34}{best[key]:>9.2f}{n / best[key]:>13,.0f}")
    print()
    print(f"ratio (b)/(a) Kafka produce vs gRPC produce = {best['a'] / best['b']:.2f}x")
    print(f"ratio (d)/(c) Kafka consume vs gRPC consume = {best['c'] / best['d']:.2f}x")
    return 0


if __name__ == "__main__":
    sys.exit(main())
