"""The Kafka listener next to Apache Kafka and next to our gRPC front end, same run (issue 25).

One embedded broker with ``kafka_listener``; per value size (``--sizes``, default 100 and
1024 bytes), ``--records`` records (default 300,000; a third of that for values over 512
bytes) with 8-byte keys, one partition, best of ``--repeats`` (default 2):

(a) gRPC produce     our ``Producer.send_batch`` (Arrow tables of 50,000 rows)
(b) Kafka produce    confluent-kafka ``produce()`` through the Kafka listener
                     (linger.ms 20, batch.size 1 MiB, no compression, acks=all)
(c) gRPC consume     our ``Consumer.poll_arrow`` from offset 0
(d) Kafka consume    confluent-kafka ``consume(10000)`` from offset 0 through the listener

and with ``--kafka`` the same client with the same settings against Apache Kafka (one KRaft
node started by ``kafka_server.py``): (e) produce and (f) consume. The targets are the
issue's: (b)/(e) >= 0.7 for 100-byte values and >= 0.9 for 1 KiB; (d)/(f) >= 0.7.

Then end-to-end latency through the listener (``--latency-seconds``, default 10; 0 skips
it): ``kafka_clients.latency_run``, the load ``bench_latency.py --kafka`` puts on Apache
Kafka (1,000 records/s of 100 bytes, ``linger.ms`` 0, a consumer thread long-polling),
with acks=1 and acks=all, against the listener and with ``--kafka`` against Apache Kafka
after one untimed warm-up run each. Target: our p99 <= 2x Kafka's with acks=1 (the same
durability: on one broker Kafka's acks=all does not fsync and ours does).
(b)/(a) and (d)/(c) say what speaking Kafka costs against our own protocol on the same
data plane (each Kafka batch is converted to an Arrow batch on produce and back on fetch,
a batch at a time: :mod:`logstore.broker.kafka.record_vectors`).

Run: ``.venv/bin/python benchmarks/bench_kafka_listener.py [--kafka] [--records N]``.
"""

from __future__ import annotations

import argparse
import sys

import numpy as np
import pyarrow as pa
from benchutil import Timer, machine_line
from kafka_clients import latency_run
from kafka_server import add_kafka_flag, maybe_kafka

from logstore.broker.embedded import EmbeddedBroker
from logstore.client.admin import Admin
from logstore.client.consumer import Consumer
from logstore.client.producer import Producer
from logstore.types import NewTopic, TopicPartition

TABLE_ROWS = 50_000
TARGETS = {"produce": {100: 0.7, 1024: 0.9}, "consume": 0.7}
LATENCY_TARGET = 2.0  # our p99 / Kafka's, acks=1


def _values(n: int, size: int) -> tuple[list[bytes], list[bytes]]:
    rng = np.random.default_rng(1)
    blob = rng.integers(0, 256, size=n * size, dtype=np.uint8).tobytes()
    return ([blob[i * size:(i + 1) * size] for i in range(n)], [b"%08d" % i for i in range(n)])


def _grpc_produce(broker: EmbeddedBroker, topic: str, values: list[bytes], keys: list[bytes]) -> None:
    with Producer(broker.bootstrap) as producer:
        for start in range(0, len(values), TABLE_ROWS):
            producer.send_batch(topic, pa.table({
                "key": pa.array(keys[start:start + TABLE_ROWS], pa.binary()),
                "value": pa.array(values[start:start + TABLE_ROWS], pa.binary())}), partition=0)
        producer.flush()


def _kafka_produce(bootstrap: str, topic: str, values: list[bytes], keys: list[bytes]) -> None:
    import confluent_kafka as ck
    producer = ck.Producer({"bootstrap.servers": bootstrap, "enable.idempotence": False,
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


def _kafka_consume(bootstrap: str, topic: str, n: int) -> None:
    import confluent_kafka as ck
    consumer = ck.Consumer({"bootstrap.servers": bootstrap, "group.id": "bench",
                            "enable.auto.commit": False})
    try:
        consumer.assign([ck.TopicPartition(topic, 0, 0)])
        got = 0
        while got < n:
            got += sum(1 for m in consumer.consume(10_000, 1.0) if m.error() is None)
    finally:
        consumer.close()


def _measure(broker: EmbeddedBroker, kafka: object | None, size: int, n: int, repeats: int) -> dict[str, float]:
    """Best seconds per row (a)-(f) for ``n`` records of ``size``-byte values."""
    values, keys = _values(n, size)
    best: dict[str, float] = {}

    def keep(key: str, fn: object, *args: object) -> None:
        with Timer() as t:
            fn(*args)  # type: ignore[operator]
        best[key] = min(best.get(key, float("inf")), t.wall)

    for run in range(repeats):
        topics = {k: f"bench-{k}-{size}-{run}" for k in ("grpc", "kafka", "apache")}
        with Admin(broker.bootstrap) as admin:
            admin.create_topics([NewTopic(topics["grpc"]), NewTopic(topics["kafka"])])
        keep("a", _grpc_produce, broker, topics["grpc"], values, keys)
        keep("b", _kafka_produce, broker.kafka_bootstrap, topics["kafka"], values, keys)
        keep("c", _grpc_consume, broker, topics["grpc"], n)
        keep("d", _kafka_consume, broker.kafka_bootstrap, topics["kafka"], n)
        if kafka is not None:
            kafka.create_topic(topics["apache"], 1)  # type: ignore[attr-defined]
            keep("e", _kafka_produce, kafka.bootstrap, topics["apache"], values, keys)  # type: ignore[attr-defined]
            keep("f", _kafka_consume, kafka.bootstrap, topics["apache"], n)  # type: ignore[attr-defined]
        print(f"  {size} B run {run + 1}: " + "  ".join(f"({k}) {n / v:,.0f}/s" for k, v in sorted(best.items())),
              flush=True)
    return best


def _report(size: int, n: int, best: dict[str, float]) -> None:
    names = {"a": "(a) gRPC produce (send_batch)", "b": "(b) Kafka produce (confluent)",
             "c": "(c) gRPC consume (poll_arrow)", "d": "(d) Kafka consume (confluent)",
             "e": "(e) Apache Kafka produce (confluent)", "f": "(f) Apache Kafka consume (confluent)"}
    print()
    print(f"{size}-byte values, {n:,} records, best of runs{'seconds':>8}{'records/s':>13}{'MB/s':>8}")
    for key, name in names.items():
        if key in best:
            print(f"{name:<42}{best[key]:>8.2f}{n / best[key]:>13,.0f}{n * size / best[key] / 1e6:>8.1f}")
    print(f"ratio (b)/(a) Kafka produce vs gRPC produce = {best['a'] / best['b']:.2f}x")
    print(f"ratio (d)/(c) Kafka consume vs gRPC consume = {best['c'] / best['d']:.2f}x")
    for ours, theirs, what in (("b", "e", "produce"), ("d", "f", "consume")):
        if theirs not in best:
            continue
        ratio = best[theirs] / best[ours]
        target = TARGETS[what] if what == "consume" else TARGETS["produce"].get(size)  # type: ignore[union-attr]
        verdict = "" if target is None else f"   target >= {target}: {'ok' if ratio >= target else 'MISS'}"
        print(f"ratio ({ours})/({theirs}) {what} through our Kafka listener vs Apache Kafka = {ratio:.2f}x{verdict}")


def _latencies(bootstrap: str, create: object, seconds: float, who: str) -> dict[str, dict[str, float]]:
    """p50/p99/p99.9/max in ms per acks setting of ``latency_run`` against ``bootstrap``."""
    from bench_latency import percentiles

    create("bench-listener-latency-warmup")  # type: ignore[operator]
    latency_run(bootstrap, "bench-listener-latency-warmup", acks=1, seconds=min(seconds, 5.0), warmup=0)
    out = {}
    for acks in (1, "all"):
        topic = f"bench-listener-latency-{acks}"
        create(topic)  # type: ignore[operator]
        run = latency_run(bootstrap, topic, acks=acks, seconds=seconds, warmup=200)
        if run.received != run.sent:
            raise RuntimeError(f"{who} acks={acks}: {run.received} of {run.sent} records arrived")
        out[f"acks={acks}"] = percentiles(run.latencies_s)
        print(f"  latency {who} acks={acks}: done", flush=True)
    return out


def _report_latency(ours: dict[str, dict[str, float]], theirs: dict[str, dict[str, float]] | None) -> None:
    print()
    print(f"{'latency, ms, 1,000 records/s of 100 B':<40}{'p50':>10}{'p99':>10}{'p99.9':>10}{'max':>10}")
    for who, rows in (("our Kafka listener", ours), ("Apache Kafka", theirs or {})):
        for name, p in rows.items():
            print(f"{who + ', ' + name:<40}{p['p50']:>10.2f}{p['p99']:>10.2f}{p['p99.9']:>10.2f}{p['max']:>10.2f}")
    if theirs:
        for name in ours:
            ratio = ours[name]["p99"] / theirs[name]["p99"]
            target = f"   target <= {LATENCY_TARGET}x: {'ok' if ratio <= LATENCY_TARGET else 'MISS'}" \
                if name == "acks=1" else "   (ours fsyncs, Kafka's does not)"
            print(f"{name}: our p99 / Kafka's p99 = {ratio:.2f}x{target}")


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--records", type=int, default=300_000)
    parser.add_argument("--sizes", default="100,1024", help="value sizes in bytes, comma-separated")
    parser.add_argument("--repeats", type=int, default=2)
    parser.add_argument("--latency-seconds", type=float, default=10.0)
    add_kafka_flag(parser)
    args = parser.parse_args(argv)
    try:
        import confluent_kafka  # noqa: F401
    except ImportError:
        print("confluent-kafka is not installed (pip install 'logstore[dev]'): nothing to compare", file=sys.stderr)
        return 0
    sizes = [int(s) for s in args.sizes.split(",")]
    print(f"Kafka listener benchmark: value sizes {sizes} B, 8-byte keys, 1 partition", flush=True)
    print(machine_line(), flush=True)
    with maybe_kafka(args.kafka) as kafka, EmbeddedBroker(kafka_listener="127.0.0.1:0") as broker:
        results = {}
        for size in sizes:
            n = args.records if size <= 512 else max(args.records // 3, 1)
            results[size] = (n, _measure(broker, kafka, size, n, args.repeats))
        ours = theirs = None
        if args.latency_seconds > 0:
            def create_ours(topic: str) -> None:
                with Admin(broker.bootstrap) as admin:
                    admin.create_topics([NewTopic(topic)])
            ours = _latencies(broker.kafka_bootstrap, create_ours, args.latency_seconds, "listener")
            if kafka is not None:
                theirs = _latencies(kafka.bootstrap, lambda t: kafka.create_topic(t, 1), args.latency_seconds,
                                    "Apache Kafka")
    for size, (n, best) in results.items():
        _report(size, n, best)
    if ours is not None:
        _report_latency(ours, theirs)
    print(machine_line(), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
