"""The ``logstore`` Spark data source.

``register(spark)`` makes format ``logstore`` available on a SparkSession for
reading (``spark.read`` / ``spark.readStream``) and, when the sink package is
installed alongside, for writing (``df.write`` / ``df.writeStream``) — one
format name, one call (:mod:`spark_source.registration` combines the installed
halves, found through the ``logstore.spark`` entry points)::

    import spark_source
    spark_source.register(spark)
    df = (spark.readStream.format("logstore")
          .option("logstore.bootstrap.servers", "127.0.0.1:9392")
          .option("subscribe", "orders")
          .load())
"""

from __future__ import annotations

from spark_source.options import SourceOptionError, SourceOptions, parse_source_options
from spark_source.progress import offsets_behind_latest
from spark_source.registration import format_class, register
from spark_source.source import (
    FORMAT_NAME,
    LogstoreBatchReader,
    LogstoreDataSource,
    LogstoreStreamReader,
)

__all__ = [
    "FORMAT_NAME",
    "LogstoreBatchReader",
    "LogstoreDataSource",
    "LogstoreStreamReader",
    "SourceOptionError",
    "SourceOptions",
    "offsets_behind_latest",
    "parse_source_options",
    "format_class",
    "register",
]

