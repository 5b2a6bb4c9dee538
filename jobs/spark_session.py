"""SparkSession construction shared by the jobs, the demo and the tests.

Python workers must run the same interpreter (and so the same virtualenv)
as the driver: classes of ``spark_source`` / ``spark_sink`` are pickled by
reference and imported on executors. ``local_session`` sets that, keeps the
console quiet and uses small shuffle partitions; with ``delta=True`` it adds
Delta Lake's JVM package (resolved from Maven Central into Ivy's cache on
first use, versions chosen by ``delta-spark`` to match PySpark) and its
SQL extensions.
"""

from __future__ import annotations

import os
import sys

from pyspark.sql import SparkSession

__all__ = ["local_session"]


def local_session(
    app_name: str,
    *,
    master: str = "local[2]",
    delta: bool = False,
    conf: dict[str, str] | None = None,
) -> SparkSession:
    os.environ.setdefault("PYSPARK_PYTHON", sys.executable)
    os.environ.setdefault("PYSPARK_DRIVER_PYTHON", sys.executable)
    builder = (
        SparkSession.builder.master(master)
        .appName(app_name)
        .config("spark.ui.showConsoleProgress", "false")
        .config("spark.ui.enabled", "false")
        .config("spark.sql.shuffle.partitions", "2")
        .config("spark.default.parallelism", "2")
        .config("spark.sql.session.timeZone", "UTC")
        .config("spark.driver.memory", "2g")
        .config("spark.sql.streaming.stopGracefullyOnShutdown", "true")
    )
    for key, value in (conf or {}).items():
        builder = builder.config(key, value)
    if delta:
        from delta import configure_spark_with_delta_pip

        builder = (
            builder.config("spark.sql.extensions", "io.delta.sql.DeltaSparkSessionExtension")
            .config("spark.sql.catalog.spark_catalog", "org.apache.spark.sql.delta.catalog.DeltaCatalog")
        )
        builder = configure_spark_with_delta_pip(builder)
    spark = builder.getOrCreate()
    spark.sparkContext.setLogLevel("ERROR")
    return spark
