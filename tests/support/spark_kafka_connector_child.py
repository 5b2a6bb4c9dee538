"""Spark's own Kafka connector against a logstore broker's Kafka listener, in its own JVM.

Run by ``tests/spark/test_spark_kafka_connector.py`` as a child process (the session-wide
SparkSession of the tests has no Kafka connector: its package must be given when the JVM
starts). Arguments: the Kafka listener's address, logstore's bootstrap, the topic, a
checkpoint directory. Prints one JSON object on stdout:

* ``batch``: ``spark.read.format("kafka")`` of the topic after a ``df.write.format("kafka")``
  of 10 keyed rows, as sorted ``[partition, offset, key, value]``;
* ``stream1`` / ``stream2``: the values each ``availableNow`` run of one streaming query saw
  (``foreachBatch``), the second resumed from the checkpoint after 5 more records were
  produced by logstore's own Producer.
"""

from __future__ import annotations

import json
import sys

import pyspark

from jobs.spark_session import local_session
from logstore import Producer

kafka, bootstrap, topic, checkpoint = sys.argv[1:5]
spark = local_session("kafka-connector", conf={
    "spark.jars.packages": f"org.apache.spark:spark-sql-kafka-0-10_2.13:{pyspark.__version__}"})
out: dict[str, object] = {}

(spark.createDataFrame([(f"k{i}", f"v{i}") for i in range(10)], "key string, value string")
 .write.format("kafka").option("kafka.bootstrap.servers", kafka).option("topic", topic).save())
batch = (spark.read.format("kafka").option("kafka.bootstrap.servers", kafka).option("subscribe", topic)
         .option("startingOffsets", "earliest").load())
out["batch"] = sorted([r.partition, r.offset, r.key.decode(), r.value.decode()] for r in batch.collect())

seen: list[str] = []


def run_stream() -> list[str]:
    seen.clear()
    query = (spark.readStream.format("kafka").option("kafka.bootstrap.servers", kafka).option("subscribe", topic)
             .option("startingOffsets", "earliest").load().selectExpr("CAST(value AS STRING) AS v")
             .writeStream.foreachBatch(lambda df, _: seen.extend(r.v for r in df.collect()))
             .option("checkpointLocation", checkpoint).trigger(availableNow=True).start())
    query.awaitTermination(300)
    if query.exception() is not None:
        raise RuntimeError(str(query.exception()))
    return sorted(seen)


out["stream1"] = run_stream()
with Producer(bootstrap) as producer:
    for i in range(10, 15):
        producer.send(topic, f"v{i}".encode(), key=f"k{i}".encode())
out["stream2"] = run_stream()
spark.stop()
print(json.dumps(out))
