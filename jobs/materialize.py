"""Materialized Delta views of a topic: the latest value per key, kept by a streaming query.

A *view* of topic ``T`` is a Delta table with one row per live key of ``T``:
the value of the key's newest record, unless that record is a tombstone
(null value), in which case the key has no row. A Structured Streaming query
reads ``T`` from offset 0 (``startingOffsets=earliest``) and, per micro-batch
(``foreachBatch``):

1. drops records without a key (a view is keyed; compacted topics refuse them
   in Kafka too) and projects each record to the view's columns;
2. reduces the batch to the newest record per key (:func:`latest_per_key`);
3. ``MERGE``\\ s that into the table: insert new keys, update keys whose stored
   record is older, delete keys whose newest record is a tombstone.

Table layout (a view's columns, in this order)::

    key         binary      the record key (the MERGE key)
    <values>                untyped topic: value binary
                            typed topic:   the topic's value columns, by name and type
                            json_schema:   the parsed columns of a JSON value
    _partition  int         source partition of the stored record
    _offset     long        its offset in that partition
    _timestamp  timestamp   its timestamp

The table's property ``logstore.topic`` names the topic; a view refuses to
write into a table made for another topic.

Order and exactly-once
----------------------
"Newer" is decided per key by the stored ``(_partition, _offset,
_timestamp)``: within one partition the higher offset is newer (the log's
order). With the default partitioner a key lives in one partition, so that is
the whole story; a key written to several partitions (explicit partition
numbers) is resolved by record timestamp, then partition number, the same way
in the batch reduction and in the MERGE, so the result does not depend on how
records fall into micro-batches.

The MERGE only changes a row when the incoming record is newer than the
stored one, so applying a batch twice, or applying an older batch after a
newer one, never overwrites a newer value. Spark replays at most the last
batch after a crash (the one whose offsets were logged but whose commit was
not), with the same offsets: the MERGE is idempotent and the view stays
exactly "latest non-tombstone value per key up to the committed offsets".
Each MERGE commit carries, as Delta ``userMetadata``, the batch id and the
highest offset per partition it applied (JSON, see :func:`committed_offsets`),
so a view says how far it has read. Deletes are not guarded by an offset (the
row is gone); re-running an *old* checkpoint against a newer table can thus
briefly resurrect a deleted key until the tombstone's batch is replayed.

Typed-topic tombstones: the Spark source exposes a typed topic's value
columns, and a tombstone as all of them null; a view therefore treats a
record whose value columns are all null as a tombstone.

Usage::

    from jobs.materialize import materialize
    q = materialize(spark, bootstrap="127.0.0.1:9392", topic="users",
                    table="/data/views/users", checkpoint="/data/checkpoints/users")
    q.awaitTermination()

or ``logstore jobs materialize --topic users --table /data/views/users`` (also
``python -m jobs.cli materialize ...``; the command is in :mod:`jobs.cli`).

Thread-safety: :func:`materialize` may be called from several threads of one
SparkSession (each query works in Spark's per-query session clone, where the
per-batch Delta settings are set).
"""

from __future__ import annotations

import json
import logging
import os
import re
import shutil
import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any
from urllib.parse import unquote, urlparse

from pyspark.sql import Column, DataFrame, SparkSession, Window
from pyspark.sql import functions as F
from pyspark.sql.streaming import StreamingQuery
from pyspark.sql.types import (
    BinaryType,
    IntegerType,
    LongType,
    StructField,
    StructType,
    TimestampType,
)

from logstore.defaults import default_bootstrap
from logstore.errors import InvalidConfigError, LogstoreError, UnknownTopicOrPartitionError

__all__ = [
    "materialize",
    "MaterializeConfigError",
    "TableRef",
    "table_ref",
    "parse_json_schema",
    "view_schema",
    "project_batch",
    "latest_per_key",
    "merge_latest",
    "ensure_table",
    "committed_offsets",
    "check_value_names",
    "METADATA_COLUMNS",
    "TOPIC_PROPERTY",
]

log = logging.getLogger("logstore.jobs.materialize")

METADATA_COLUMNS = ("_partition", "_offset", "_timestamp")
# A helper column of the reduced batch; never stored.
_TOMBSTONE = "_tombstone"
_RESERVED = ("key", *METADATA_COLUMNS, _TOMBSTONE)
TOPIC_PROPERTY = "logstore.topic"
_USER_METADATA_CONF = "spark.databricks.delta.commitInfo.userMetadata"
_USER_METADATA_KIND = "logstore.materialize"

# "Is s newer than t", for the MERGE: by offset within a partition, by
# (timestamp, partition) across partitions. latest_per_key orders the same way.
_NEWER = (
    "((s._partition = t._partition AND s._offset > t._offset) OR "
    "(s._partition <> t._partition AND (s._timestamp > t._timestamp OR "
    "(s._timestamp = t._timestamp AND s._partition > t._partition))))"
)


class MaterializeConfigError(InvalidConfigError):
    """A materialization's arguments are unusable (bad JSON schema, wrong table, unknown topic...)."""


# --------------------------------------------------------------------------- table and schema


@dataclass(frozen=True, slots=True)
class TableRef:
    """A Delta table named by a path (``is_path``) or by a catalog name."""

    value: str
    is_path: bool

    def __str__(self) -> str:
        return self.value

    def delta_table(self, spark: SparkSession) -> Any:
        from delta.tables import DeltaTable

        if self.is_path:
            return DeltaTable.forPath(spark, self.value)
        return DeltaTable.forName(spark, self.value)


def local_path(location: str) -> str:
    """A local path (relative or absolute) or ``file:`` URI as the one absolute path with
    ``..`` and symbolic links resolved, as every log line of a view names it; other URIs
    (``s3a://...``) unchanged."""
    parsed = urlparse(location)
    if parsed.scheme == "file":
        return os.path.realpath(unquote(parsed.path))
    if parsed.scheme and not re.match(r"^[A-Za-z]:[\\/]", location):
        return location
    return os.path.realpath(location)


def table_ref(table: str) -> TableRef:
    """``table`` as a path (it contains ``/`` or ``\\``, or a URI scheme) or a catalog name.

    A catalog name is ``name``, ``db.name`` or ``catalog.db.name`` (backticks
    allowed); anything with a path separator is a path. Local paths are made
    absolute (relative to the current directory) and resolved (:func:`local_path`).
    """
    text = table.strip()
    if not text:
        raise MaterializeConfigError("the table is empty; give a path or a table name")
    if re.match(r"^[A-Za-z][A-Za-z0-9+.-]*:", text) and not re.match(r"^[A-Za-z]:[\\/]", text):
        return TableRef(text, is_path=True)   # a URI: s3a://..., file:/...
    if "/" in text or "\\" in text:
        # Delta's table builder refuses relative locations: make local paths absolute.
        return TableRef(local_path(text), is_path=True)
    if not re.fullmatch(r"(`[^`]+`|[A-Za-z_][A-Za-z0-9_]*)(\.(`[^`]+`|[A-Za-z_][A-Za-z0-9_]*)){0,2}", text):
        raise MaterializeConfigError(
            f"table {table!r} is neither a path (use ./{text} for a relative path) "
            "nor a table name like db.name"
        )
    return TableRef(text, is_path=False)


def parse_json_schema(text: str | StructType) -> StructType:
    """The columns of a JSON value: Spark DDL (``"id long, name string"``) or Arrow schema JSON.

    Raises :class:`MaterializeConfigError` for unparseable text and for names a
    view reserves (``key``, ``_partition``, ``_offset``, ``_timestamp``, ``_tombstone``).
    """
    if isinstance(text, StructType):
        schema = text
    else:
        from pyspark.sql.pandas.types import from_arrow_schema

        from logstore.schema_text import parse_schema

        try:
            arrow = parse_schema(text)
        except LogstoreError as e:
            raise MaterializeConfigError(f"json schema {text!r}: {e.message}") from None
        schema = from_arrow_schema(arrow, prefer_timestamp_ntz=False)
        # JSON may omit any field: every parsed column is nullable.
        schema = StructType([StructField(f.name, f.dataType, True) for f in schema.fields])
    check_value_names([f.name for f in schema.fields], what="json schema")
    return schema


def check_value_names(names: Sequence[str], *, what: str) -> None:
    """Raise :class:`MaterializeConfigError` when ``names`` is empty or takes a name a view reserves."""
    clash = [n for n in names if n.lower() in _RESERVED]
    if clash:
        raise MaterializeConfigError(
            f"{what} has columns {clash} whose names a view reserves "
            f"({', '.join(_RESERVED)}); rename them"
        )
    if not names:
        raise MaterializeConfigError(f"{what} has no columns")


_SOURCE_COLUMNS = ("key", "topic", "partition", "offset", "timestamp", "timestampType", "headers")


def source_value_columns(source_schema: StructType) -> list[StructField]:
    """The value columns of the source's schema: ``value`` (untyped) or a typed topic's columns."""
    return [f for f in source_schema.fields if f.name not in _SOURCE_COLUMNS]


def _typed(source_schema: StructType) -> bool:
    fields = source_value_columns(source_schema)
    return not (len(fields) == 1 and fields[0].name == "value" and isinstance(fields[0].dataType, BinaryType))


def view_schema(source_schema: StructType, json_schema: StructType | None) -> StructType:
    """The view's columns (see the module docstring) for a source schema and optional JSON schema."""
    if json_schema is not None:
        values = list(json_schema.fields)
    else:
        values = [StructField(f.name, f.dataType, True) for f in source_value_columns(source_schema)]
        check_value_names([f.name for f in values], what="the topic's value schema")
    return StructType(
        [StructField("key", BinaryType(), False), *values,
         StructField("_partition", IntegerType(), False),
         StructField("_offset", LongType(), False),
         StructField("_timestamp", TimestampType(), True)]
    )


def ensure_table(spark: SparkSession, ref: TableRef, schema: StructType, *, topic: str) -> None:
    """Create the view's Delta table if missing; check (and extend) an existing one.

    An existing table must be a view of ``topic`` (table property
    ``logstore.topic``) whose columns have the view's types; columns the view
    has and the table lacks (a typed topic gained a column) are added.
    Raises :class:`MaterializeConfigError` otherwise.
    """
    from delta.tables import DeltaTable

    exists = (DeltaTable.isDeltaTable(spark, ref.value) if ref.is_path
              else spark.catalog.tableExists(ref.value))
    if ref.is_path and not exists and _non_empty_dir(ref.value):
        raise MaterializeConfigError(
            f"{ref.value} exists and is not a Delta table; give an empty or new directory"
        )
    if not exists:
        builder = DeltaTable.createIfNotExists(spark)
        builder = builder.location(ref.value) if ref.is_path else builder.tableName(ref.value)
        (builder.addColumns(schema)
         .property(TOPIC_PROPERTY, topic)
         .comment(f"logstore materialized view of topic {topic}: latest value per key")
         .execute())
        log.info("created Delta table %s for a view of topic %s", ref, topic)
        return
    table = ref.delta_table(spark)
    props = table.detail().select("properties").first()[0] or {}
    owner = props.get(TOPIC_PROPERTY)
    if owner is None:
        raise MaterializeConfigError(
            f"table {ref} exists but is not a logstore view (no {TOPIC_PROPERTY} property); "
            "give a new table"
        )
    if owner != topic:
        raise MaterializeConfigError(
            f"table {ref} is a view of topic {owner!r}, not {topic!r}; give another table"
        )
    have = {f.name.lower(): f for f in table.toDF().schema.fields}
    missing = []
    for f in schema.fields:
        old = have.get(f.name.lower())
        if old is None:
            missing.append(f)
        elif old.dataType != f.dataType:
            raise MaterializeConfigError(
                f"column {f.name} of table {ref} is {old.dataType.simpleString()}, but the view "
                f"needs {f.dataType.simpleString()}; give a new table"
            )
    if missing:
        target = f"delta.`{ref.value}`" if ref.is_path else ref.value
        cols = ", ".join(f"`{f.name}` {f.dataType.simpleString()}" for f in missing)
        spark.sql(f"ALTER TABLE {target} ADD COLUMNS ({cols})")
        log.info("added columns %s to %s", [f.name for f in missing], ref)


def _non_empty_dir(path: str) -> bool:
    local = path[len("file:"):] if path.startswith("file:") else path
    return os.path.isdir(local) and bool(os.listdir(local))


# --------------------------------------------------------------------------- per batch


def project_batch(batch: DataFrame, json_schema: StructType | None) -> DataFrame:
    """Source rows → view columns plus ``_tombstone``; records without a key are dropped."""
    values = source_value_columns(batch.schema)
    if json_schema is not None:
        parsed = F.from_json(F.col("value").cast("string"), json_schema)
        value_cols = [parsed.getField(f.name).alias(f.name) for f in json_schema.fields]
        tombstone: Column = F.col("value").isNull()
    elif _typed(batch.schema):
        value_cols = [F.col(f"`{f.name}`") for f in values]
        tombstone = F.lit(True)
        for f in values:
            tombstone = tombstone & F.col(f"`{f.name}`").isNull()
    else:
        value_cols = [F.col("value")]
        tombstone = F.col("value").isNull()
    return batch.where(F.col("key").isNotNull()).select(
        F.col("key"), *value_cols,
        F.col("partition").alias("_partition"), F.col("offset").alias("_offset"),
        F.col("timestamp").alias("_timestamp"), tombstone.alias(_TOMBSTONE),
    )


def latest_per_key(projected: DataFrame) -> DataFrame:
    """The newest record per key: highest offset within a partition, then (timestamp, partition)."""
    in_partition = Window.partitionBy("key", "_partition").orderBy(F.col("_offset").desc())
    across = Window.partitionBy("key").orderBy(F.col("_timestamp").desc_nulls_last(),
                                               F.col("_partition").desc())
    return (projected.withColumn("_rank", F.row_number().over(in_partition)).where("_rank = 1")
            .withColumn("_rank", F.row_number().over(across)).where("_rank = 1").drop("_rank"))


def merge_latest(spark: SparkSession, ref: TableRef, latest: DataFrame) -> None:
    """MERGE a batch reduced by :func:`latest_per_key` into the view (offset-guarded, idempotent)."""
    columns = [c for c in latest.columns if c != _TOMBSTONE]
    assign = {f"`{c}`": f"s.`{c}`" for c in columns}
    (ref.delta_table(spark).alias("t")
     .merge(latest.alias("s"), "t.key = s.key")
     .whenMatchedDelete(condition=f"s.{_TOMBSTONE} AND {_NEWER}")
     .whenMatchedUpdate(condition=f"NOT s.{_TOMBSTONE} AND {_NEWER}", set=assign)
     .whenNotMatchedInsert(condition=f"NOT s.{_TOMBSTONE}", values=assign)
     .execute())


class _BatchWriter:
    """The ``foreachBatch`` function of one view. Runs on the driver, one batch at a time."""

    def __init__(self, *, topic: str, ref: TableRef, json_schema: StructType | None) -> None:
        self.topic = topic
        self.ref = ref
        self.json_schema = json_schema

    def __call__(self, batch: DataFrame, batch_id: int) -> None:
        started = time.monotonic()
        # The per-query session clone: its conf is this query's alone.
        session = batch.sparkSession
        latest = latest_per_key(project_batch(batch, self.json_schema)).persist()
        try:
            stats = (latest.groupBy("_partition")
                     .agg(F.max("_offset").alias("max_offset"), F.count(F.lit(1)).alias("keys"),
                          F.sum(F.col(_TOMBSTONE).cast("int")).alias("tombstones"))
                     .collect())
            if not stats:
                log.info("view %s <- %s: batch %d: no keyed records (%.1fs)",
                         self.ref, self.topic, batch_id, time.monotonic() - started)
                return
            max_offsets = {int(r["_partition"]): int(r["max_offset"]) for r in stats}
            meta = {"kind": _USER_METADATA_KIND, "topic": self.topic, "batch_id": batch_id,
                    "max_offsets": {str(p): o for p, o in sorted(max_offsets.items())}}
            session.conf.set(_USER_METADATA_CONF, json.dumps(meta, separators=(",", ":")))
            try:
                merge_latest(session, self.ref, latest)
            finally:
                session.conf.unset(_USER_METADATA_CONF)
        finally:
            latest.unpersist()
        keys = sum(int(r["keys"]) for r in stats)
        tombstones = sum(int(r["tombstones"]) for r in stats)
        log.info("view %s <- %s: batch %d: %d keys (%d tombstones), max offsets %s (%.1fs)",
                 self.ref, self.topic, batch_id, keys, tombstones,
                 dict(sorted(max_offsets.items())), time.monotonic() - started)


def committed_offsets(spark: SparkSession, table: str) -> dict[int, int]:
    """How far the view has read: per partition, the highest offset any MERGE applied.

    Read from the ``userMetadata`` of the table's commits; ``{}`` for a view
    that has applied nothing. Records above these offsets (per partition) are
    not reflected in the table; those at or below are. Only commits still in
    the table's history count (``delta.logRetentionDuration``, 30 days by
    default): a partition without records for longer may be missing.
    """
    ref = table_ref(table)
    out: dict[int, int] = {}
    for row in ref.delta_table(spark).history().select("userMetadata").collect():
        text = row["userMetadata"]
        if not text:
            continue
        try:
            meta = json.loads(text)
        except ValueError:
            continue
        if not isinstance(meta, dict) or meta.get("kind") != _USER_METADATA_KIND:
            continue
        for p, o in meta.get("max_offsets", {}).items():
            out[int(p)] = max(out.get(int(p), -1), int(o))
    return out


# --------------------------------------------------------------------------- the query


def _forget_unfinished_first_batch(checkpoint: str) -> None:
    """Let a view killed during its very first batch start again.

    Spark 4.2 refuses to restart a query whose ``offsets`` directory holds files but
    no batch (``STATE_STORE_CHECKPOINT_LOCATION_NOT_EMPTY``): a SIGKILL while batch 0's
    offsets were being written leaves only their temporary file, and the view could
    never start again (seen in the view's kill test). For a
    view, starting afresh from offset 0 is exact: batch 0's MERGE is guarded by the
    records' offsets, so applying it again never overwrites anything newer. Local
    checkpoints only (a remote one is left to Spark).
    """
    parsed = urlparse(checkpoint)
    if parsed.scheme not in ("", "file"):
        return
    path = Path(parsed.path if parsed.scheme else checkpoint)
    offsets = path / "offsets"
    # Spark's check: an offsets directory that is not empty although no batch was planned in
    # full (a kill while writing offsets/0 leaves only its temporary file) and none committed.
    started = offsets.is_dir() and any(offsets.iterdir())
    if (started and not any(offsets.glob("[0-9]*"))
            and not any((path / "commits").glob("[0-9]*"))):
        log.warning("checkpoint %s has a first batch planned but never committed (the view was "
                    "stopped during it): starting the query afresh; the MERGE makes the replay exact",
                    checkpoint)
        shutil.rmtree(path)


def _describe_topic(bootstrap: str, topic: str, source_options: Mapping[str, str] | None) -> Any:
    from logstore.client.admin import Admin
    from logstore.client.security import security_from_prefixed_options

    # A secured broker: the same logstore.security.* / ssl.* / sasl.* options the source gets.
    security, _ = security_from_prefixed_options({k.lower(): str(v) for k, v in (source_options or {}).items()})
    with Admin(bootstrap, security=security) as admin:
        try:
            return admin.describe_topics([topic])[topic]
        except UnknownTopicOrPartitionError:
            raise MaterializeConfigError(
                f"topic {topic!r} does not exist on {bootstrap}; create it first"
            ) from None


def materialize(
    spark: SparkSession,
    *,
    bootstrap: str | None = None,
    topic: str,
    table: str,
    checkpoint: str | None = None,
    available_now: bool = False,
    json_schema: str | StructType | None = None,
    trigger_interval: str | None = None,
    max_offsets_per_trigger: int | None = None,
    source_options: Mapping[str, str] | None = None,
    query_name: str | None = None,
    timeout_s: float | None = None,
    wait: bool = True,
) -> StreamingQuery:
    """Keep the Delta table ``table`` equal to the latest non-tombstone value per key of ``topic``.

    * ``bootstrap`` — broker ``host:port`` (default ``$LOGSTORE_BOOTSTRAP`` or the default broker);
    * ``table`` — a path (contains ``/``) or a catalog table name; created if missing;
    * ``checkpoint`` — the query's checkpoint directory (default: ``_logstore_checkpoint``
      inside the table's directory). Keep it: it holds the position in the topic. Local
      paths of the table and the checkpoint are made absolute and resolved
      (:func:`local_path`): every log line names them so;
    * ``available_now`` — read what is in the topic now (several batches if
      ``max_offsets_per_trigger`` limits them), then stop; the call returns after
      the query ended (raising its error, if any). Otherwise the query runs on and
      is returned at once;
    * ``json_schema`` — for untyped topics whose values are JSON: Spark DDL such as
      ``"id long, name string"`` (or a ``StructType``); the view stores the parsed
      columns instead of ``value``. Malformed JSON gives null columns;
    * ``trigger_interval`` — e.g. ``"10 seconds"``: a batch at most this often
      (default: as soon as the previous one ended, which polls the broker often);
    * ``max_offsets_per_trigger`` — cap a batch (the source's ``maxOffsetsPerTrigger``);
    * ``source_options`` — further options of the ``logstore`` source (e.g. ``failOnDataLoss``);
    * ``timeout_s`` — with ``available_now``: stop and raise :class:`TimeoutError` after this long;
    * ``wait=False`` — with ``available_now``: return the running query at once (the caller
      waits, e.g. to draw progress or to stop it on Ctrl-C; ``logstore jobs materialize`` does).

    Returns the :class:`StreamingQuery` (terminated, with ``available_now``).
    Raises :class:`MaterializeConfigError` for a missing topic, a bad JSON
    schema, a table that belongs to another topic, or contradictory arguments.
    """
    import spark_source

    if available_now and trigger_interval:
        raise MaterializeConfigError("give either available_now or trigger_interval, not both")
    bootstrap = bootstrap or default_bootstrap()
    ref = table_ref(table)
    parsed_json = parse_json_schema(json_schema) if json_schema is not None else None
    description = _describe_topic(bootstrap, topic, source_options)
    if parsed_json is not None and description.typed:
        raise MaterializeConfigError(
            f"topic {topic!r} is typed (its values are columns already); json_schema applies "
            "to untyped topics only"
        )
    spark_source.register(spark)
    reader = (spark.readStream.format("logstore")
              .option("logstore.bootstrap.servers", bootstrap)
              .option("subscribe", topic)
              .option("startingOffsets", "earliest"))
    if max_offsets_per_trigger is not None:
        reader = reader.option("maxOffsetsPerTrigger", str(int(max_offsets_per_trigger)))
    for k, v in (source_options or {}).items():
        if k.lower() in ("subscribe", "subscribepattern", "assign", "startingoffsets",
                         "logstore.bootstrap.servers"):
            raise MaterializeConfigError(
                f"source option {k} is set by the view itself (one topic, from offset 0)"
            )
        reader = reader.option(k, str(v))
    source = reader.load()
    schema = view_schema(source.schema, parsed_json)
    ensure_table(spark, ref, schema, topic=topic)
    if checkpoint is None:  # Delta's location is a URI (file:/...): the log names the path
        location = str(ref.delta_table(spark).detail().select("location").first()[0])
        checkpoint = location.rstrip("/") + "/_logstore_checkpoint"
    checkpoint = local_path(checkpoint)
    _forget_unfinished_first_batch(checkpoint)
    writer = (source.writeStream
              .foreachBatch(_BatchWriter(topic=topic, ref=ref, json_schema=parsed_json))
              .option("checkpointLocation", checkpoint))
    if query_name:
        writer = writer.queryName(query_name)
    if available_now:
        writer = writer.trigger(availableNow=True)
    elif trigger_interval:
        writer = writer.trigger(processingTime=trigger_interval)
    query = writer.start()
    log.info("view %s <- %s started (checkpoint %s, %s)", ref, topic, checkpoint,
             "available-now" if available_now else f"trigger {trigger_interval or 'continuous'}")
    if available_now and wait:
        if timeout_s is None:
            query.awaitTermination()
        elif not query.awaitTermination(timeout_s):  # type: ignore[arg-type]  # seconds, float is fine
            query.stop()
            raise TimeoutError(f"the view of {topic} did not catch up within {timeout_s} s")
        error = query.exception()
        if error is not None:
            raise error
    return query
