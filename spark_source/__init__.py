"""The ``logstore`` Spark data source.

``register(spark)`` makes format ``logstore`` available on a SparkSession for
reading (``spark.read`` / ``spark.readStream``) and, when the sink package is
installed alongside, for writing (``df.write`` / ``df.writeStream``) — one
format name, one call::

    import spark_source
    spark_source.register(spark)
    df = (spark.readStream.format("logstore")
          .option("logstore.bootstrap.servers", "127.0.0.1:9392")
          .option("subscribe", "orders")
          .load())
"""

from __future__ import annotations

from pyspark.sql import SparkSession

from spark_source.options import SourceOptionError, SourceOptions, parse_source_options
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
    "parse_source_options",
    "register",
    "data_source_class",
]


def data_source_class() -> type[LogstoreDataSource]:
    """The class registered as format ``logstore``: with the sink's writers when available."""
    try:
        from spark_sink.sink import LogstoreReadWriteDataSource
    except ImportError:
        return LogstoreDataSource
    return LogstoreReadWriteDataSource


def register(spark: SparkSession) -> None:
    """Register format ``logstore`` (read and, with ``spark_sink``, write) on ``spark``."""
    spark.dataSource.register(data_source_class())
