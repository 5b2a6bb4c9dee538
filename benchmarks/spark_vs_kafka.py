"""The Kafka side of the Spark benchmarks (``--kafka``): Spark's own Kafka connector on a real Kafka.

Spark's Kafka connector comes from Maven Central through ``spark.jars.packages``:
``org.apache.spark:spark-sql-kafka-0-10_2.13:<the installed pyspark version>``
(:func:`session`), resolved by Ivy on the session's start and cached in
``~/.ivy2.5.2``. The broker is a :class:`kafka_server.KafkaServer`; the topics have
the same partition count as ours and hold the same 100-byte values.

``bench_spark_write.py --kafka`` adds, best of ``--repeats`` after one warm-up each,
each run right after the script's own run of the same kind:

(e) Kafka batch write   ``spark.read.parquet(input).write.format("kafka")`` — the
                        baseline of (a), ``write.format("logstore")``;
(f) Kafka pipeline      ``spark.readStream.format("kafka")`` (startingOffsets
                        earliest) ``.select("key", "value").writeStream.format("kafka")``,
                        ``trigger(availableNow=True)``, a new checkpoint: Kafka source ->
                        Kafka sink, at-least-once — the baseline of (c), logstore source ->
                        logstore exactly-once sink.

``bench_spark_read.py --kafka`` adds (d) ``spark.read.format("kafka")`` -> ``noop``, the
baseline of (a), ``spark.read.format("logstore")`` -> ``noop``.

The connector's producer and consumer keep kafka-clients' defaults (acks=all and
idempotence on for the sink). Targets (issue 16): (a)/(e) >= 2.0 and (c)/(f) >= 1.5.
"""

from __future__ import annotations

import shutil
import tempfile
from collections.abc import Callable, Iterable

import pyarrow as pa
from benchutil import Timer, verdict
from kafka_clients import PRODUCER_QUEUE, end_offsets_sum
from kafka_server import KafkaServer


def connector_package() -> str:
    import pyspark

    return f"org.apache.spark:spark-sql-kafka-0-10_2.13:{pyspark.__version__}"


def session(app_name: str, master: str, kafka: KafkaServer | None):
    """``(spark, with_connector)``: a local session with Spark's Kafka connector when ``kafka``
    is running and Ivy resolves the package; else, saying why, one without it."""
    from jobs.spark_session import local_session

    if kafka is not None:
        try:
            return local_session(app_name, master=master,
                                 conf={"spark.jars.packages": connector_package()}), True
        except Exception as e:  # Ivy could not resolve it: no network, for instance
            print(f"Kafka side skipped: Spark's Kafka connector {connector_package()} did not load "
                  f"({str(e).splitlines()[0][:300]})", flush=True)
            from pyspark.sql import SparkSession

            active = SparkSession.getActiveSession()
            if active is not None:
                active.stop()
    return local_session(app_name, master=master), False


def fill_topic(kafka: KafkaServer, topic: str, partitions: int, tables: Iterable[pa.Table]) -> int:
    """Create ``topic`` and produce every table's ``value`` column into it (untimed); the count."""
    import confluent_kafka

    kafka.create_topic(topic, partitions)
    producer = confluent_kafka.Producer({"bootstrap.servers": kafka.bootstrap, "acks": "1",
                                         **PRODUCER_QUEUE})
    count = 0
    for table in tables:
        for value in table.column("value").to_pylist():
            try:
                producer.produce(topic, value)
            except BufferError:
                producer.poll(0.1)
                producer.produce(topic, value)
            count += 1
    assert producer.flush(120) == 0
    assert end_offsets_sum(kafka.bootstrap, topic, partitions) == count
    return count


class WriteRuns:
    """(e) and (f) of bench_spark_write.py, on the session of the script's own runs."""

    def __init__(self, spark, kafka: KafkaServer, *, input_path: str, records: int,
                 partitions: int, work: str, tables: Callable[[], Iterable[pa.Table]]) -> None:
        self.spark, self.kafka, self.input_path = spark, kafka, input_path
        self.n, self.partitions, self.work = records, partitions, work
        self.best: dict[str, float] = {}
        self.trigger_s: dict[str, float] = {}
        self.count = 0
        self.source = "bench-spark-write-kafka-source"
        fill_topic(kafka, self.source, partitions, tables())
        print(f"Kafka source topic {self.source}: {records:,} records (not timed)", flush=True)

    def _new_topic(self) -> str:
        self.count += 1
        name = f"bench-spark-write-kafka-{self.count}"
        self.kafka.create_topic(name, self.partitions)
        return name

    def _keep(self, key: str | None, t: Timer) -> float:
        if key and t.wall < self.best.get(key, float("inf")):
            self.best[key] = t.wall
            if "last" in self.trigger_s and key == "f":
                self.trigger_s["f"] = self.trigger_s["last"]
        return t.wall

    def batch(self, key: str | None) -> float:
        topic = self._new_topic()
        df = self.spark.read.parquet(self.input_path)
        with Timer() as t:
            (df.write.format("kafka").option("kafka.bootstrap.servers", self.kafka.bootstrap)
             .option("topic", topic).save())
        written = end_offsets_sum(self.kafka.bootstrap, topic, self.partitions)
        assert written == self.n, f"Kafka sink wrote {written} of {self.n} records"
        self.kafka.delete_topic(topic)
        return self._keep(key, t)

    def pipeline(self, key: str | None) -> float:
        topic = self._new_topic()
        checkpoint = tempfile.mkdtemp(dir=self.work, prefix="ck-kafka-")
        with Timer() as t:
            query = (self.spark.readStream.format("kafka")
                     .option("kafka.bootstrap.servers", self.kafka.bootstrap)
                     .option("subscribe", self.source).option("startingOffsets", "earliest").load()
                     .select("key", "value").writeStream.format("kafka")
                     .option("kafka.bootstrap.servers", self.kafka.bootstrap).option("topic", topic)
                     .option("checkpointLocation", checkpoint).trigger(availableNow=True).start())
            query.awaitTermination(600)
        if query.exception() is not None:
            raise RuntimeError(f"Kafka -> Kafka stream failed: {query.exception()}")
        batches = [p for p in query.recentProgress if p["numInputRows"]]
        self.trigger_s["last"] = sum(p["durationMs"]["triggerExecution"] for p in batches) / 1000
        written = end_offsets_sum(self.kafka.bootstrap, topic, self.partitions)
        assert written >= self.n, f"Kafka -> Kafka stream wrote {written} of {self.n} records"
        self.kafka.delete_topic(topic)
        shutil.rmtree(checkpoint, ignore_errors=True)
        return self._keep(key, t)

    def report(self, best: dict[str, float], trigger_s: dict[str, float]) -> None:
        """Rows (e), (f) and the ratios to (a) and (c) of the script's own ``best``."""
        n, mb = self.n, self.n * 100 / 1e6
        print()
        print(f"{'against Apache Kafka, best of runs':<40}{'seconds':>9}{'records/s':>13}{'MB/s values':>13}")
        for key, name in (("e", "(e) Kafka batch write (format kafka)"),
                          ("f", "(f) Kafka -> Kafka stream (AvailableNow)")):
            print(f"{name:<40}{self.best[key]:>9.2f}{n / self.best[key]:>13,.0f}{mb / self.best[key]:>13.1f}")
        print(f"{'    (f) its micro-batches alone':<40}{self.trigger_s['f']:>9.2f}"
              f"{n / self.trigger_s['f']:>13,.0f}{mb / self.trigger_s['f']:>13.1f}")
        ratio_ae = self.best["e"] / best["a"]
        ratio_cf = self.best["f"] / best["c"]
        print(f"ratio (a)/(e) logstore batch write vs Kafka's = {ratio_ae:.2f}x   target >= 2.0: "
              f"{verdict(ratio_ae >= 2.0)}   (ours exactly-once with fsync; Kafka's sink at-least-once)")
        print(f"ratio (c)/(f) logstore -> logstore exactly-once stream vs Kafka -> Kafka = {ratio_cf:.2f}x   "
              f"target >= 1.5: {verdict(ratio_cf >= 1.5)}   (whole queries)")
        print(f"ratio of the micro-batches alone (c)/(f) = {self.trigger_s['f'] / trigger_s['c']:.2f}x")


def read_kafka(spark, bootstrap: str, topic: str) -> Timer:
    """(d) and (e) of bench_spark_read.py: Spark's Kafka connector reading the whole topic
    into the ``noop`` sink from ``bootstrap`` (Apache Kafka's, or our Kafka listener's)."""
    with Timer() as t:
        (spark.read.format("kafka").option("kafka.bootstrap.servers", bootstrap)
         .option("subscribe", topic).load().write.format("noop").mode("overwrite").save())
    return t
