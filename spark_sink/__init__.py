"""The exactly-once ``logstore`` Spark sink and the transactional ``foreachBatch`` helper.

Writing needs no separate registration: ``spark_source.register(spark)``
registers format ``logstore`` with these writers (:class:`LogstoreSinkDataSource`,
found through the ``logstore.spark`` entry point ``sink``; this package never
imports ``spark_source``). See :mod:`spark_sink.sink` for how a micro-batch
becomes visible atomically and exactly once.
"""

from __future__ import annotations

from pyspark.sql import DataFrame

from spark_sink.options import SinkOptionError, SinkOptions, parse_sink_options
from spark_sink.sink import (
    FORMAT_NAME,
    LogstoreBatchWriter,
    LogstoreSinkDataSource,
    LogstoreStreamWriter,
    SinkCommit,
)

__all__ = [
    "FORMAT_NAME",
    "LogstoreBatchWriter",
    "LogstoreSinkDataSource",
    "LogstoreStreamWriter",
    "SinkCommit",
    "SinkOptionError",
    "SinkOptions",
    "parse_sink_options",
    "write_transactional",
]


def write_transactional(
    batch_df: DataFrame,
    batch_id: int,
    *,
    app_id: str,
    topic: str | None = None,
    bootstrap: str | None = None,
    **options: str,
) -> None:
    """Write one ``foreachBatch`` micro-batch to the log exactly once.

    Rows go to ``topic``, or row by row to their ``topic`` column — so one
    call writes a batch to several topics atomically. ``app_id`` names the
    writer (use one per query, stable across restarts); the log remembers
    the last ``batch_id`` committed for it, so when Spark replays a batch
    after a failure the repeated call is a no-op. Other ``options`` are the
    sink's (``compression``, ``batch.size``, ...)::

        def each(batch_df, batch_id):
            spark_sink.write_transactional(batch_df, batch_id, app_id="orders-enricher",
                                           topic="orders-enriched")
        query = stream.writeStream.foreachBatch(each).option("checkpointLocation", ck).start()
    """
    writer = batch_df.write.format(FORMAT_NAME).mode("append").option("sinkId", app_id)
    writer = writer.option("batchId", str(batch_id))
    if topic is not None:
        writer = writer.option("topic", topic)
    if bootstrap is not None:
        writer = writer.option("logstore.bootstrap.servers", bootstrap)
    for key, value in options.items():
        writer = writer.option(key, value)
    writer.save()
