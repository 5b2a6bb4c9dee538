"""A log→log streaming query for the exactly-once kill tests (run as a child process).

Reads topic IN, maps each record to ``<partition>:<offset>:<value>`` and writes it
to topic OUT, either with the sink (``--mode sink``) or with the foreachBatch
helper (``--mode foreach``). With ``--fail-first-attempts`` a task's first attempt
fails after it started writing, so Spark retries it (master local[2,4]).

Usage: python tests/sink_chaos_job.py BOOTSTRAP IN OUT CHECKPOINT --mode sink|foreach
       [--available-now] [--fail-first-attempts]
"""

from __future__ import annotations

import argparse
import os
import sys

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


def main() -> int:
    parser = argparse.ArgumentParser()
    parser.add_argument("bootstrap")
    parser.add_argument("source")
    parser.add_argument("sink")
    parser.add_argument("checkpoint")
    parser.add_argument("--mode", choices=["sink", "foreach"], required=True)
    parser.add_argument("--available-now", action="store_true")
    parser.add_argument("--fail-first-attempts", action="store_true")
    args = parser.parse_args()

    import pyarrow as pa
    import pyarrow.compute as pc

    import spark_sink
    import spark_source
    from jobs.spark_session import local_session

    spark = local_session("sink-chaos", master="local[2,4]")
    spark_source.register(spark)
    fail = args.fail_first_attempts

    def transform(batches):  # type: ignore[no-untyped-def]
        from pyspark import TaskContext

        ctx = TaskContext.get()
        for b in batches:
            if fail and ctx is not None and ctx.attemptNumber() == 0 and b.num_rows and ctx.partitionId() % 2 == 0:
                raise RuntimeError("injected failure on a task's first attempt")
            text = pc.binary_join_element_wise(
                pc.cast(b.column("partition"), pa.string()), pc.cast(b.column("offset"), pa.string()),
                pc.cast(b.column("value"), pa.string()), ":")
            yield pa.RecordBatch.from_arrays([b.column("key"), pc.cast(text, pa.binary())], names=["key", "value"])

    stream = (spark.readStream.format("logstore").option("logstore.bootstrap.servers", args.bootstrap)
              .option("subscribe", args.source).option("startingOffsets", "earliest")
              .option("maxOffsetsPerTrigger", "40").load()
              .mapInArrow(transform, "key binary, value binary"))
    if args.mode == "sink":
        writer = (stream.writeStream.format("logstore").option("logstore.bootstrap.servers", args.bootstrap)
                  .option("topic", args.sink))
    else:
        def each(batch_df, batch_id):  # type: ignore[no-untyped-def]
            spark_sink.write_transactional(batch_df, batch_id, app_id="chaos-" + os.path.basename(args.checkpoint),
                                           topic=args.sink, bootstrap=args.bootstrap)

        writer = stream.writeStream.foreachBatch(each)
    writer = writer.option("checkpointLocation", args.checkpoint)
    writer = writer.trigger(availableNow=True) if args.available_now else writer.trigger(processingTime="300 milliseconds")
    query = writer.start()
    print("started", flush=True)
    query.awaitTermination()
    return 0


if __name__ == "__main__":
    sys.exit(main())
