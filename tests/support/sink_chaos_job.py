"""Log→log streaming queries for the exactly-once kill tests (run as a child process).

Each ``--pipeline MODE IN OUT CHECKPOINT`` is one query: it reads topic IN, maps each
record to ``<partition>:<offset>:<value>`` and writes it to topic OUT, either with the
sink (``sink``) or with the foreachBatch helper (``foreach``), from its own checkpoint.
Every pipeline runs in this one process (one SparkSession, one JVM), so a SIGKILL
kills them all at once. With ``--fail-first-attempts`` a task's first attempt fails
after it started writing, so Spark retries it (master local[2,4]).

Usage: python tests/support/sink_chaos_job.py BOOTSTRAP --pipeline sink|foreach IN OUT CHECKPOINT
       [--pipeline ...] [--available-now] [--max-offsets-per-trigger N (40)] [--fail-first-attempts]
"""

from __future__ import annotations

import argparse
import os
import sys

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__)))))


def main() -> int:
    parser = argparse.ArgumentParser()
    parser.add_argument("bootstrap")
    parser.add_argument("--pipeline", nargs=4, action="append", required=True,
                        metavar=("MODE", "IN", "OUT", "CHECKPOINT"))
    parser.add_argument("--available-now", action="store_true")
    parser.add_argument("--max-offsets-per-trigger", default="40")
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

    def start(mode: str, source: str, sink: str, checkpoint: str):  # type: ignore[no-untyped-def]
        if mode not in ("sink", "foreach"):
            raise SystemExit(f"unknown mode {mode!r}")
        stream = (spark.readStream.format("logstore").option("logstore.bootstrap.servers", args.bootstrap)
                  .option("subscribe", source).option("startingOffsets", "earliest")
                  .option("maxOffsetsPerTrigger", args.max_offsets_per_trigger).load()
                  .mapInArrow(transform, "key binary, value binary"))
        if mode == "sink":
            writer = (stream.writeStream.format("logstore").option("logstore.bootstrap.servers", args.bootstrap)
                      .option("topic", sink))
        else:
            app_id = "chaos-" + os.path.basename(checkpoint)

            def each(batch_df, batch_id):  # type: ignore[no-untyped-def]
                spark_sink.write_transactional(batch_df, batch_id, app_id=app_id, topic=sink,
                                               bootstrap=args.bootstrap)

            writer = stream.writeStream.foreachBatch(each)
        writer = writer.option("checkpointLocation", checkpoint).queryName(f"{mode}-{os.path.basename(checkpoint)}")
        writer = writer.trigger(availableNow=True) if args.available_now else writer.trigger(processingTime="300 milliseconds")
        return writer.start()

    queries = [start(*pipeline) for pipeline in args.pipeline]
    print("started", flush=True)
    if not args.available_now:  # run until killed; a query that fails ends the run (it is restarted)
        spark.streams.awaitAnyTermination()
    for query in queries:  # an AvailableNow query ends by itself; a failed one raises here
        query.awaitTermination()
    return 0


if __name__ == "__main__":
    sys.exit(main())
