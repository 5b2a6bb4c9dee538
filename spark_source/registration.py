"""The one registration point of format ``logstore``: the reader and the writer, combined.

The reader (:class:`spark_source.source.LogstoreDataSource`) and the writers
(:class:`spark_sink.sink.LogstoreSinkDataSource`) live in sibling packages
that never import each other. Each declares its half of PySpark's
``DataSource`` contract as a Python entry point of the group
``logstore.spark`` (``pyproject.toml``)::

    [project.entry-points."logstore.spark"]
    source = "spark_source.source:LogstoreDataSource"     # name, schema, reader, streamReader
    sink = "spark_sink.sink:LogstoreSinkDataSource"       # writer, streamWriter

:func:`format_class` loads the installed halves (sorted by entry-point name;
the first of several with one name wins; the reader half is always there,
installed or not) and combines them into one ``DataSource`` subclass named
``logstore``; :func:`register` registers it on a SparkSession. A half that
fails to load, or is not a ``DataSource`` subclass, is left out with a
warning on the ``logstore.spark_source`` logger (format ``logstore`` then
lacks its methods: e.g. ``df.write`` fails with Spark's "not implemented").

Pickling: Spark sends the registered class to its Python workers with
cloudpickle. The combined class is this module's attribute
:data:`LogstoreFormat` (``__module__``/``__qualname__`` say so), made on
first access by the module's ``__getattr__``, so it pickles *by reference*
and a worker rebuilds the same class from the same installed entry points
(workers run the driver's interpreter, see :mod:`jobs.spark_session`).

Thread-safety: the class is built once per process under a lock.
"""

from __future__ import annotations

import logging
import threading
import types
from importlib import metadata
from typing import Any

from pyspark.sql import SparkSession
from pyspark.sql.datasource import DataSource

from spark_source.source import FORMAT_NAME, LogstoreDataSource

__all__ = ["ENTRY_POINT_GROUP", "FILTER_PUSHDOWN", "HIDE_TRACEBACK", "format_class", "register"]

ENTRY_POINT_GROUP = "logstore.spark"
_CLASS_NAME = "LogstoreFormat"
log = logging.getLogger("logstore.spark_source")

_lock = threading.Lock()
_combined: type[DataSource] | None = None


def _entry_points() -> list[metadata.EntryPoint]:
    try:
        found = list(metadata.entry_points(group=ENTRY_POINT_GROUP))
    except Exception:  # noqa: BLE001 - broken package metadata must not break reading
        return []
    first: dict[str, metadata.EntryPoint] = {}
    for ep in found:
        first.setdefault(ep.name, ep)
    return [first[name] for name in sorted(first)]


def _halves() -> list[type[DataSource]]:
    """The installed halves of format ``logstore``, the reader first if it was not installed."""
    halves: list[type[DataSource]] = []
    for ep in _entry_points():
        try:
            half = ep.load()
        except Exception as e:  # noqa: BLE001 - one broken half must not hide the other
            log.warning("format %s: entry point %s = %s failed to load (%s: %s); left out",
                        FORMAT_NAME, ep.name, ep.value, type(e).__name__, e)
            continue
        if not (isinstance(half, type) and issubclass(half, DataSource)):
            log.warning("format %s: entry point %s = %s is not a DataSource subclass; left out",
                        FORMAT_NAME, ep.name, ep.value)
            continue
        if half not in halves:
            halves.append(half)
    if LogstoreDataSource not in halves:
        halves.insert(0, LogstoreDataSource)
    return halves


def _name(cls: type[DataSource]) -> str:
    return FORMAT_NAME


def format_class() -> type[DataSource]:
    """The class registered as format ``logstore``: every installed half, combined (built once)."""
    global _combined
    with _lock:
        if _combined is None:
            halves = _halves()
            namespace = {
                "__module__": __name__,
                "__qualname__": _CLASS_NAME,
                "__doc__": "Format ``logstore``, combined from: "
                           + ", ".join(f"{h.__module__}.{h.__qualname__}" for h in halves) + ".",
                "name": classmethod(_name),
            }
            _combined = types.new_class(_CLASS_NAME, tuple(halves), exec_body=lambda ns: ns.update(namespace))
        return _combined


# Spark's switch for Python tracebacks in worker errors: with it, a data source's error reaches
# the user as Spark's prefix and the exception's one line ("[INVALID_CONFIG] option ..."),
# not an 8-44 line traceback with that line last.
HIDE_TRACEBACK = "spark.sql.execution.pyspark.udf.hideTraceback.enabled"

# Spark's switch for DataSourceReader.pushFilters (off by default in 4.2): without it Spark never
# offers a Python data source its filters, and a batch read scans every offset it planned.
FILTER_PUSHDOWN = "spark.sql.python.filterPushdown.enabled"


def register(spark: SparkSession) -> None:
    """Register format ``logstore`` (read, and write when :mod:`spark_sink` is installed) on ``spark``.

    Also turns on, unless the session set them already: :data:`HIDE_TRACEBACK`, so the format's
    errors are one line (it applies to the session's Python UDFs too: set it to ``false`` to see
    their tracebacks again); and :data:`FILTER_PUSHDOWN`, so batch reads get their filters
    (:mod:`spark_source.pushdown`; it applies to every Python data source of the session, and
    one without ``pushFilters`` keeps all its filters in Spark, as before).
    """
    spark.dataSource.register(format_class())
    for key in (HIDE_TRACEBACK, FILTER_PUSHDOWN):
        if spark.conf.get(key, None) is None:  # None: the session never set it
            spark.conf.set(key, "true")


def __getattr__(name: str) -> Any:
    # What pickle (by reference) looks up on a Spark worker: the class, built there on first use.
    if name == _CLASS_NAME:
        return format_class()
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
