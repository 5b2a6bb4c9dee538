"""SparkSession construction shared by the jobs, the demo and the tests.

Python workers must run the same interpreter (and so the same virtualenv)
as the driver: classes of ``spark_source`` / ``spark_sink`` are pickled by
reference and imported on executors. ``local_session`` sets that
(``PYSPARK_PYTHON``, unless set: on a cluster the same virtualenv path must
exist on every worker node), uses small shuffle partitions and, with
``delta=True``, adds Delta Lake's JVM package (resolved from Maven Central into
Ivy's cache on first use, versions chosen by ``delta-spark`` to match PySpark)
and its SQL extensions.

``master`` is any Spark master. With ``local[N]`` the default parallelism is
pinned to 2 (small test data), and so are the partitions Delta rebuilds a
table's snapshot in (``spark.databricks.delta.snapshotPartitions``, 50 by
default: 50 tasks on 2 cores in every MERGE of a view's micro-batch); with a
cluster master (``spark://HOST:7077``)
it is left to Spark (the executors' cores), and the Delta package named in
``spark.jars.packages`` is resolved by the driver and fetched by every
executor from the driver's file server, so workers need no Ivy cache or
network of their own. ``conf`` (e.g. from :mod:`jobs.spark_options`) is
applied last and wins.

Quiet by construction, so a job prints its own progress and result only:

* the driver JVM starts with ``-Dlog4j2.configurationFile`` pointing at
  ``jobs/log4j2-quiet.properties`` (Spark and Delta log errors only, from the
  JVM's first line; ``$LOGSTORE_SPARK_LOG4J`` names another file), given as a
  ``file:`` URI because Spark splits the driver's Java options at spaces;
* ``spark.ui.showConsoleProgress=false``: no ``[Stage 3:> (0 + 2) / 2]`` bars
  (the jobs draw their own, :mod:`jobs.progress`);
* with a ``local`` master, ``SPARK_LOCAL_IP=127.0.0.1`` (unless set): a local
  driver needs no other address, and Spark otherwise warns that the host name
  resolves to a loopback address;
* what the JVM and SparkSubmit's Ivy report print before log4j applies is
  filtered by :func:`jobs.jvm_stderr.capturing_jvm_stderr` (errors still show;
  ``LOGSTORE_SPARK_VERBOSE=1`` shows everything).

A JVM that exits while starting raises :class:`SparkStartError` quoting its
last lines ("Could not find or load main class ...", an unresolved package),
where PySpark says only that the gateway exited.
"""

from __future__ import annotations

import os
import sys
from pathlib import Path

from pyspark.errors import PySparkRuntimeError
from pyspark.sql import SparkSession

from jobs.jvm_stderr import capturing_jvm_stderr

__all__ = ["local_session", "LOG4J_CONFIG", "SparkStartError"]

LOG4J_CONFIG = Path(__file__).with_name("log4j2-quiet.properties")


class SparkStartError(RuntimeError):
    """The driver JVM did not start; the message quotes what it printed (not only Py4J's words)."""


def _java_options(conf: dict[str, str]) -> str:
    """``spark.driver.extraJavaOptions`` with our log4j2 file, unless the caller named one."""
    given = conf.get("spark.driver.extraJavaOptions", "")
    if "log4j2.configurationFile" in given or "log4j.configurationFile" in given:
        return given
    path = Path(os.environ.get("LOGSTORE_SPARK_LOG4J") or LOG4J_CONFIG).resolve()
    # A URI, so a space or quote in the path is escaped: Spark splits these options at spaces.
    return f"{given} -Dlog4j2.configurationFile={path.as_uri()}".strip()


def local_session(
    app_name: str,
    *,
    master: str = "local[2]",
    delta: bool = False,
    conf: dict[str, str] | None = None,
) -> SparkSession:
    os.environ.setdefault("PYSPARK_PYTHON", sys.executable)
    os.environ.setdefault("PYSPARK_DRIVER_PYTHON", sys.executable)
    if master.startswith("local"):
        os.environ.setdefault("SPARK_LOCAL_IP", "127.0.0.1")
    extra = ({"spark.default.parallelism": "2", "spark.databricks.delta.snapshotPartitions": "2"}
             if master.startswith("local") else {})
    extra.update(conf or {})
    extra["spark.driver.extraJavaOptions"] = _java_options(extra)
    builder = (
        SparkSession.builder.master(master)
        .appName(app_name)
        .config("spark.ui.showConsoleProgress", "false")
        .config("spark.ui.enabled", "false")
        .config("spark.sql.shuffle.partitions", "2")
        .config("spark.sql.session.timeZone", "UTC")
        .config("spark.driver.memory", "2g")
        .config("spark.sql.streaming.stopGracefullyOnShutdown", "true")
    )
    for key, value in extra.items():
        builder = builder.config(key, value)
    if delta:
        from delta import configure_spark_with_delta_pip

        builder = (
            builder.config("spark.sql.extensions", "io.delta.sql.DeltaSparkSessionExtension")
            .config("spark.sql.catalog.spark_catalog", "org.apache.spark.sql.delta.catalog.DeltaCatalog")
        )
        builder = configure_spark_with_delta_pip(builder)
    try:
        with capturing_jvm_stderr() as startup:
            spark = builder.getOrCreate()
    except PySparkRuntimeError as error:
        if error.getCondition() != "JAVA_GATEWAY_EXITED":
            raise
        said = startup.tail() or "(nothing; LOGSTORE_SPARK_VERBOSE=1 shows all it prints)"
        raise SparkStartError(f"the Spark driver JVM exited while starting; it said:\n{said}") from error
    spark.sparkContext.setLogLevel("ERROR")
    return spark
