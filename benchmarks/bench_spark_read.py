"""The Spark source: a batch read of a topic into a ``noop`` sink, next to Spark's Parquet reader (DESIGN §7).

Data: ``--records`` (default 5,000,000) records with 100-byte random values and no
key, produced with ``Producer.send_batch`` (acks=1) into a topic of
``--partitions`` (default 2) partitions on a broker in a child process
(``EmbeddedBroker(subprocess=True)``). The Parquet copy is written by Spark from
that topic (``spark.read.format("logstore") ... write.parquet``, uncompressed), so
both readers produce the same rows with the same schema: ``key, value, topic,
partition, offset, timestamp, timestampType``. Neither write is timed.

Measured, in one SparkSession (``jobs.spark_session.local_session``, ``local[2]``),
best of ``--repeats``, the two reads alternating, each after one untimed warm-up
read:

(a) logstore   ``spark.read.format("logstore").option("subscribe", topic)
               .load().write.format("noop").mode("overwrite").save()`` — planning on
               the driver, then one task per partition fetching Arrow batches from
               the broker;
(b) Parquet    ``spark.read.parquet(copy).write.format("noop")...save()``;
(c) floor      a trivial Python data source defined here: the same number of tasks,
               each yielding one pre-built Arrow batch of the source's output shape
               (8,000 rows, built once per task by ``spark_source.rows.to_output_batch``)
               over and over until it has yielded as many rows as (a) reads — what
               Spark's Python Data Source path costs with no fetching or decoding at all.

Both read from the page cache (the segments and the Parquet files were just
written). Prints records/s and MB/s (of the 100-byte values) and the ratios
(a)/(b) and (a)/(c); target (issue "Spark source"): (a)/(b) >= 0.5 on local[2].

Selective reads (issue 26, filter pushdown): ``--selective-records`` (default
2,000,000; 0 skips them) records of a second topic, ``--keys`` (default 100,000)
distinct keys, CreateTime timestamps spread evenly over 30 days (each up to a
minute out of order), the same 100-byte values. Each query is timed into a
``noop`` sink with pushdown (default) and with ``pushFilters=false`` (Spark
filters every row), best of ``--repeats``, and the ratio off/on printed:

* the last day (``timestamp >= end - 1 day``, ~3%): the time index skips the rest;
* a day in the middle (``timestamp`` in day 15): the time index skips what is
  older; an upper bound cannot cut the range (CreateTime is not monotone), so the
  newer half is read and filtered in the task;
* key equality (one of ``--keys`` keys): every batch is read, filtered in the task
  before the rows reach Spark.

``--quick`` shrinks everything (200,000 records of each, one repeat) to see that it runs.

With ``--kafka`` (``make bench-kafka``) a real Apache Kafka holds the same records
in a topic of as many partitions (produced untimed with confluent-kafka), and the
runs alternate with (d) ``spark.read.format("kafka")`` -> ``noop``, Spark's own Kafka
connector (``spark_vs_kafka.py``): the ratio (a)/(d) is printed, target (issue 25) >= 2.5.
The broker then also has a Kafka listener, and (e) is the same connector reading the
logstore topic through it: the ratio (e)/(d), target >= 0.8, says what a Spark job that
keeps ``format("kafka")`` gets when pointed at logstore.

Run: ``make bench`` or ``.venv/bin/python benchmarks/bench_spark_read.py [--records N] [--quick] [--kafka]``.
"""

from __future__ import annotations

import argparse
import contextlib
import datetime as dt
import shutil
import sys
import tempfile
import time

import numpy as np
import pyarrow as pa
from benchutil import Timer, child_pid, machine_line, process_cpu_s, value_tables, verdict
from kafka_server import add_kafka_flag, maybe_kafka
from pyspark.sql.datasource import DataSource, DataSourceReader, InputPartition

import spark_source
from logstore.broker.embedded import EmbeddedBroker
from logstore.client.admin import Admin
from logstore.client.producer import Producer

VALUE_BYTES = 100
TABLE_ROWS = 200_000
TOPIC = "bench-spark-read"
SELECTIVE_TOPIC = "bench-spark-read-30d"
DAY_MS = 86_400_000
END_MS = 1_767_225_600_000  # 2026-01-01 UTC: the newest timestamp of the 30 days
KAFKA_NOTE = "4.4.0, one KRaft node; Spark's connector with kafka-clients' defaults"


def produce(bootstrap: str, records: int, seed: int = 1) -> float:
    """Produce the records (100-byte random values, no key); return the seconds it took."""
    t0 = time.perf_counter()
    with Producer(bootstrap, acks=1) as producer:
        for table in value_tables(records, rows=TABLE_ROWS, value_bytes=VALUE_BYTES, seed=seed):
            producer.send_batch(TOPIC, table)
        producer.flush()
    return time.perf_counter() - t0


def produce_30_days(bootstrap: str, records: int, partitions: int, keys: int, seed: int = 2) -> float:
    """Records with keys ``customer-<n>`` (each of the ``keys`` equally often) and CreateTime
    spread over the 30 days before :data:`END_MS`, each up to a minute early or late; runs of
    2,000 rows per partition."""
    rng = np.random.default_rng(seed)
    span = 30 * DAY_MS
    t0 = time.perf_counter()
    with Producer(bootstrap, acks=1) as producer:
        done = 0
        for table in value_tables(records, rows=TABLE_ROWS, value_bytes=VALUE_BYTES, seed=seed):
            n = table.num_rows
            i = np.arange(done, done + n, dtype=np.int64)
            stamps = END_MS - span + i * span // records + rng.integers(-60_000, 60_000, n)
            names = pa.array([b"customer-%d" % k for k in (i * 7_919) % keys], pa.binary())  # each key as often
            producer.send_batch(SELECTIVE_TOPIC, table.append_column("key", names)
                                .append_column("timestamp", pa.array(np.minimum(stamps, END_MS)))
                                .append_column("partition", pa.array((i // 2_000) % partitions, pa.int32())))
            done += n
        producer.flush()
    return time.perf_counter() - t0


def _ts(ms: int) -> str:
    """A TIMESTAMP literal of ``ms`` in UTC (with its zone, whatever the session's)."""
    moment = dt.datetime.fromtimestamp(ms / 1000, tz=dt.timezone.utc)
    return f"TIMESTAMP '{moment.strftime('%Y-%m-%d %H:%M:%S')}+00:00'"


def selective_queries(keys: int) -> list[tuple[str, str]]:
    """(name, WHERE) of the selective reads; see the module docstring."""
    middle = END_MS - 15 * DAY_MS
    return [
        ("last day of 30", f"timestamp >= {_ts(END_MS - DAY_MS)}"),
        ("day 15 of 30", f"timestamp >= {_ts(middle - DAY_MS)} and timestamp < {_ts(middle)}"),
        (f"key = one of {keys:,}", f"key = X'{(b'customer-%d' % (keys // 2)).hex()}'"),
    ]


def run_selective(spark, bootstrap: str, args: argparse.Namespace) -> None:  # type: ignore[no-untyped-def]
    """Time each selective query with pushdown on and off; print rows, seconds and off/on."""
    def df(push: bool, where: str):  # type: ignore[no-untyped-def]
        return (spark.read.format("logstore").option("logstore.bootstrap.servers", bootstrap)
                .option("subscribe", SELECTIVE_TOPIC).option("pushFilters", str(push).lower())
                .load().where(where))

    def timed(push: bool, where: str) -> float:
        with Timer() as t:
            df(push, where).write.format("noop").mode("overwrite").save()
        return t.wall

    print()
    print(f"selective reads: {args.selective_records:,} records over 30 days, {args.keys:,} keys, "
          f"{args.partitions} partitions (best of {args.repeats})")
    print(f"{'query':<24}{'rows':>10}{'pushdown s':>12}{'off s':>9}{'off/on':>8}")
    for name, where in selective_queries(args.keys):
        rows_on, rows_off = df(True, where).count(), df(False, where).count()  # also warms up
        assert rows_on == rows_off, (name, rows_on, rows_off)
        on = off = float("inf")
        for _ in range(args.repeats):
            on = min(on, timed(True, where))
            off = min(off, timed(False, where))
        print(f"{name:<24}{rows_on:>10,}{on:>12.2f}{off:>9.2f}{off / on:>7.1f}x", flush=True)


class _FloorPartition(InputPartition):
    def __init__(self, partition: int, rows: int) -> None:
        self.partition = partition
        self.rows = rows


class _FloorReader(DataSourceReader):
    def __init__(self, partitions: int, records: int) -> None:
        self.parts = [_FloorPartition(p, records // partitions + (p < records % partitions))
                      for p in range(partitions)]

    def partitions(self) -> list[_FloorPartition]:
        return self.parts

    def read(self, partition: _FloorPartition):  # type: ignore[no-untyped-def]
        from logstore.record import build_batch, untyped_schema
        from spark_source.rows import OutputShape, to_output_batch

        n = 8_000
        offsets = np.arange(0, (n + 1) * VALUE_BYTES, VALUE_BYTES, dtype=np.int32)
        values = pa.Array.from_buffers(pa.binary(), n, [None, pa.py_buffer(offsets),
                                                        pa.py_buffer(b"\1" * (n * VALUE_BYTES))])
        stored = build_batch(untyped_schema(), values=values,
                             timestamps_ms=np.full(n, 1_700_000_000_000, dtype=np.int64))
        batch = to_output_batch(stored, OutputShape(None, include_headers=False), topic=TOPIC,
                                partition=partition.partition, timestamp_type=0)
        left = partition.rows
        while left > 0:
            yield batch if left >= n else batch.slice(0, left)
            left -= n


class FloorSource(DataSource):
    """(c): rows of the source's shape yielded from memory by a Python data source."""

    @classmethod
    def name(cls) -> str:
        return "bench_python_floor"

    def schema(self):  # type: ignore[no-untyped-def]
        from spark_source.rows import output_schema

        return output_schema(None, include_headers=False)

    def reader(self, schema) -> _FloorReader:  # type: ignore[no-untyped-def]
        return _FloorReader(int(self.options["partitions"]), int(self.options["records"]))


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n", 1)[0])
    parser.add_argument("--records", type=int, default=5_000_000)
    parser.add_argument("--partitions", type=int, default=2)
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--master", default="local[2]")
    parser.add_argument("--selective-records", type=int, default=2_000_000)
    parser.add_argument("--keys", type=int, default=100_000)
    parser.add_argument("--quick", action="store_true", help="200,000 records of each, one repeat")
    add_kafka_flag(parser)
    args = parser.parse_args(argv)
    if args.quick:
        args.records, args.selective_records, args.repeats = 200_000, 200_000, 1

    print(f"logstore Spark source benchmark: {args.records:,} records of {VALUE_BYTES}-byte values, "
          f"{args.partitions} partitions, {args.master}, noop sink")
    print(machine_line(), flush=True)
    work = tempfile.mkdtemp(prefix="logstore-bench-spark-read-")
    parquet_path = f"{work}/copy.parquet"
    spark = None
    kafka_stack = contextlib.ExitStack()
    with_kafka = False
    try:
        kafka = kafka_stack.enter_context(maybe_kafka(args.kafka))
        with EmbeddedBroker(subprocess=True, kafka_listener="127.0.0.1:0" if kafka is not None else None) as broker:
            broker_pid = child_pid("logstore.broker")
            with Admin(broker.bootstrap) as admin:
                admin.create_topic(TOPIC, args.partitions)
                if args.selective_records:
                    admin.create_topic(SELECTIVE_TOPIC, args.partitions)
            seconds = produce(broker.bootstrap, args.records)
            print(f"produced {args.records:,} records in {seconds:.1f}s (not part of the measurement)",
                  flush=True)
            from spark_vs_kafka import fill_topic, read_kafka, session

            spark, with_kafka = session("bench-spark-read", args.master, kafka)
            if kafka is not None and with_kafka:
                fill_topic(kafka, TOPIC, args.partitions,
                           value_tables(args.records, rows=TABLE_ROWS, value_bytes=VALUE_BYTES))
                print(f"Kafka topic {TOPIC}: the same {args.records:,} values (not timed)", flush=True)
            spark_source.register(spark)
            spark.dataSource.register(FloorSource)

            def logstore_df():  # type: ignore[no-untyped-def]
                return (spark.read.format("logstore")
                        .option("logstore.bootstrap.servers", broker.bootstrap)
                        .option("subscribe", TOPIC).load())

            logstore_df().write.mode("overwrite").option("compression", "none").parquet(parquet_path)
            copied = spark.read.parquet(parquet_path)
            count = copied.count()
            assert count == args.records, (count, args.records)
            print(f"Parquet copy written by Spark: {count:,} rows, schema "
                  f"{', '.join(f'{f.name} {f.dataType.simpleString()}' for f in copied.schema.fields)}",
                  flush=True)

            def read_logstore() -> Timer:
                with Timer() as t:
                    logstore_df().write.format("noop").mode("overwrite").save()
                return t

            def read_parquet() -> Timer:
                with Timer() as t:
                    spark.read.parquet(parquet_path).write.format("noop").mode("overwrite").save()
                return t

            def read_floor() -> Timer:
                with Timer() as t:
                    (spark.read.format("bench_python_floor").option("partitions", str(args.partitions))
                     .option("records", str(args.records)).load()
                     .write.format("noop").mode("overwrite").save())
                return t

            read_logstore()
            read_parquet()
            read_floor()  # warm-ups, not reported
            if kafka is not None and with_kafka:
                read_kafka(spark, kafka.bootstrap, TOPIC)
                read_kafka(spark, broker.kafka_bootstrap, TOPIC)
            best: dict[str, float] = {}
            best_broker_cpu: dict[str, float] = {}
            for i in range(args.repeats):
                cpu0 = process_cpu_s(broker_pid)
                a = read_logstore()
                broker_cpu = process_cpu_s(broker_pid) - cpu0
                b = read_parquet()
                c = read_floor()
                if a.wall < best.get("a", float("inf")):
                    best_broker_cpu["a"] = broker_cpu
                for key, t in (("a", a), ("b", b), ("c", c)):
                    best[key] = min(best.get(key, float("inf")), t.wall)
                print(f"  run {i + 1}/{args.repeats}: logstore {a.wall:.2f}s (broker CPU {broker_cpu:.2f}s), "
                      f"Parquet {b.wall:.2f}s, Python data source floor {c.wall:.2f}s", flush=True)
                if kafka is not None and with_kafka:
                    d = read_kafka(spark, kafka.bootstrap, TOPIC)
                    e = read_kafka(spark, broker.kafka_bootstrap, TOPIC)
                    best["d"] = min(best.get("d", float("inf")), d.wall)
                    best["e"] = min(best.get("e", float("inf")), e.wall)
                    print(f"  run {i + 1}/{args.repeats}: Kafka source (format kafka) {d.wall:.2f}s, "
                          f"the same from our Kafka listener {e.wall:.2f}s", flush=True)
            if args.selective_records:
                seconds = produce_30_days(broker.bootstrap, args.selective_records, args.partitions, args.keys)
                print(f"\nproduced {args.selective_records:,} records over 30 days in {seconds:.1f}s "
                      "(not part of the measurement)", flush=True)
                run_selective(spark, broker.bootstrap, args)
    finally:
        if spark is not None:
            spark.stop()
        kafka_stack.close()
        shutil.rmtree(work, ignore_errors=True)

    mb = args.records * VALUE_BYTES / 1e6
    print()
    print(f"{'best of ' + str(args.repeats):<32}{'seconds':>9}{'records/s':>14}{'MB/s values':>13}")
    for key, name in (("a", "(a) logstore source -> noop"), ("b", "(b) Parquet -> noop"),
                      ("c", "(c) Python data source floor")):
        print(f"{name:<32}{best[key]:>9.2f}{args.records / best[key]:>14,.0f}{mb / best[key]:>13.1f}")
    ratio = best["b"] / best["a"]
    print()
    print(f"(broker CPU during the best logstore read: {best_broker_cpu['a']:.2f}s)")
    print(f"ratio (a)/(b) = {ratio:.2f}   target >= 0.50: {verdict(ratio >= 0.5)}")
    print(f"ratio (a)/(c) = {best['c'] / best['a']:.2f}   (share of what Spark's Python data source path "
          "allows on this machine)")
    if "d" in best:
        print()
        print(f"{'(d) Kafka source -> noop':<32}{best['d']:>9.2f}"
              f"{args.records / best['d']:>14,.0f}{mb / best['d']:>13.1f}")
        print(f"{'(e) Kafka source <- our listener':<32}{best['e']:>9.2f}"
              f"{args.records / best['e']:>14,.0f}{mb / best['e']:>13.1f}")
        ratio_ad, ratio_ed = best["d"] / best["a"], best["d"] / best["e"]
        print(f"ratio (a)/(d) logstore source vs Spark's Kafka source = {ratio_ad:.2f}x   "
              f"target >= 2.5: {verdict(ratio_ad >= 2.5)}   (Kafka {KAFKA_NOTE})")
        print(f"ratio (e)/(d) Spark's Kafka source reading our Kafka listener vs reading Kafka = {ratio_ed:.2f}x   "
              f"target >= 0.8: {verdict(ratio_ed >= 0.8)}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
