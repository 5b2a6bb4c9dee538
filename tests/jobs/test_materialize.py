"""Materialized Delta views (jobs.materialize) in this process, with the session ``spark``.

Each test checks the Delta table against a model computed from the topic
with the Python Consumer (tests/support/materialize_helpers.py): upsert of the latest
value per key, delete on tombstone, typed topics, JSON values, the
offset-guarded MERGE applied twice or out of order, the continuous mode, and
clear errors. The kill -9 test is test_cluster_exactly_once.py (with materialize_kill.py).
"""

from __future__ import annotations

import json
import logging
import os
import random
import time
from datetime import datetime, timezone
from pathlib import Path

import pyarrow as pa
import pytest
from click.testing import CliRunner
from materialize_helpers import model, new_topic, read_topic, read_view, send_all
from pyspark.sql import SparkSession
from pyspark.sql.types import (
    BinaryType,
    BooleanType,
    DoubleType,
    IntegerType,
    LongType,
    StringType,
    StructField,
    StructType,
    TimestampType,
)

from jobs.cli import materialize_command
from jobs.materialize import (
    MaterializeConfigError,
    committed_offsets,
    ensure_table,
    materialize,
    merge_latest,
    parse_json_schema,
    table_ref,
)

pytestmark = pytest.mark.timeout(300)


@pytest.fixture
def boot(shared_broker) -> str:  # type: ignore[no-untyped-def]
    return shared_broker.bootstrap


def run(spark: SparkSession, boot: str, topic: str, table: str, ck: str, **kw):  # type: ignore[no-untyped-def]
    return materialize(spark, bootstrap=boot, topic=topic, table=table, checkpoint=ck,
                       available_now=True, timeout_s=120, **kw)


# ---------------------------------------------------------------- untyped


def test_untyped_view_upserts_latest_and_deletes_on_tombstone(spark: SparkSession, boot: str, tmp_path) -> None:  # type: ignore[no-untyped-def]
    topic = new_topic(boot, "mat-untyped", 2)
    table, ck = str(tmp_path / "view"), str(tmp_path / "ck")
    send_all(boot, topic, [(b"k1", b"a"), (b"k2", b"b"), (b"k1", b"c"), (b"k3", b"d"),
                           (b"k2", None), (None, b"no key")])
    run(spark, boot, topic, table, ck)
    df = spark.read.format("delta").load(table)
    assert df.schema == StructType([
        StructField("key", BinaryType(), False), StructField("value", BinaryType(), True),
        StructField("_partition", IntegerType(), False), StructField("_offset", LongType(), False),
        StructField("_timestamp", TimestampType(), True),
    ])
    records = read_topic(boot, topic)
    got = read_view(spark, table, ["value"])
    assert {k: v for k, (_, _, v) in got.items()} == {b"k1": b"c", b"k3": b"d"}
    assert got == model(records)
    # Second run from the checkpoint: delete, re-insert after a delete, new key.
    send_all(boot, topic, [(b"k3", None), (b"k2", b"e"), (b"k4", b"f"), (b"k1", b"g")])
    run(spark, boot, topic, table, ck)
    records = read_topic(boot, topic)
    got = read_view(spark, table, ["value"])
    assert {k: v for k, (_, _, v) in got.items()} == {b"k1": b"g", b"k2": b"e", b"k4": b"f"}
    assert got == model(records)
    # The table says how far it has read: the highest keyed offset per partition.
    want: dict[int, int] = {}
    for r in records:
        if r.key is not None:
            want[r.partition] = max(want.get(r.partition, -1), r.offset)
    assert committed_offsets(spark, table) == want
    # Timestamps are the records' own.
    ts = {bytes(r["key"]): r["_timestamp"] for r in spark.read.format("delta").load(table).collect()}
    by_key = {r.key: r for r in records if r.key is not None}
    for k, t in ts.items():
        assert int(t.replace(tzinfo=timezone.utc).timestamp() * 1000) == by_key[k].timestamp_ms


def test_a_view_stopped_during_its_first_batch_starts_again(spark: SparkSession, boot: str, tmp_path) -> None:  # type: ignore[no-untyped-def]
    """A kill while batch 0's offsets are written leaves a temporary file in offsets/ and no
    commit, which Spark 4.2 refuses to restart (STATE_STORE_CHECKPOINT_LOCATION_NOT_EMPTY);
    the view starts afresh instead."""
    topic = new_topic(boot, "mat-first-batch", 1)
    table, ck = str(tmp_path / "view"), tmp_path / "ck"
    send_all(boot, topic, [(b"k1", b"a"), (b"k2", b"b")])
    run(spark, boot, topic, table, str(ck))
    for commit in (ck / "commits").iterdir():  # as if killed while writing batch 0's offsets:
        commit.unlink()
    for planned in (ck / "offsets").iterdir():  # only a temporary file is left of them
        planned.rename(ck / "offsets" / f".{planned.name}.{os.getpid()}.tmp")
    send_all(boot, topic, [(b"k1", b"c"), (b"k3", b"d")])
    run(spark, boot, topic, table, str(ck))
    got = read_view(spark, table, ["value"])
    assert {k: v for k, (_, _, v) in got.items()} == {b"k1": b"c", b"k2": b"b", b"k3": b"d"}
    assert got == model(read_topic(boot, topic))


def test_many_small_batches_match_the_model(spark: SparkSession, boot: str, tmp_path) -> None:  # type: ignore[no-untyped-def]
    """Random puts and tombstones over few keys, cut into batches that repeat keys: latest wins."""
    rng = random.Random(7)
    topic = new_topic(boot, "mat-model", 3)
    keys = [b"key-%d" % i for i in range(25)]
    ops = [(rng.choice(keys), None if rng.random() < 0.2 else b"v%d" % i) for i in range(400)]
    send_all(boot, topic, ops)
    table, ck = str(tmp_path / "view"), str(tmp_path / "ck")
    q = run(spark, boot, topic, table, ck, max_offsets_per_trigger=100)
    assert len([p for p in q.recentProgress if p["numInputRows"]]) >= 4
    assert read_view(spark, table, ["value"]) == model(read_topic(boot, topic))


# ---------------------------------------------------------------- typed and JSON


def test_typed_topic_maps_value_columns_to_table_columns(spark: SparkSession, boot: str, tmp_path) -> None:  # type: ignore[no-untyped-def]
    value_schema = pa.schema([("id", pa.int64()), ("name", pa.string()), ("price", pa.float64())])
    topic = new_topic(boot, "mat-typed", 2, value_schema=value_schema)
    send_all(boot, topic, [
        (b"1", {"id": 1, "name": "one", "price": 1.5}),
        (b"2", {"id": 2, "name": None, "price": 2.5}),
        (b"1", {"id": 1, "name": "uno", "price": 1.75}),
        (b"3", {"id": 3, "name": "three", "price": 3.0}),
        (b"3", None),
    ])
    table, ck = str(tmp_path / "view"), str(tmp_path / "ck")
    run(spark, boot, topic, table, ck)
    df = spark.read.format("delta").load(table)
    assert df.columns == ["key", "id", "name", "price", "_partition", "_offset", "_timestamp"]
    assert df.schema["id"].dataType == LongType() and df.schema["price"].dataType == DoubleType()
    assert df.schema["name"].dataType == StringType()
    cols = ["id", "name", "price"]
    got = read_view(spark, table, cols)
    assert {k: v for k, (_, _, v) in got.items()} == {b"1": (1, "uno", 1.75), b"2": (2, None, 2.5)}
    as_tuple = lambda v: tuple(v[c] for c in cols)  # noqa: E731
    assert got == model(read_topic(boot, topic), value=as_tuple)


def test_json_values_are_parsed_into_columns(spark: SparkSession, boot: str, tmp_path) -> None:  # type: ignore[no-untyped-def]
    topic = new_topic(boot, "mat-json", 2)
    send_all(boot, topic, [
        (b"a", json.dumps({"id": 1, "name": "x"}).encode()),
        (b"b", json.dumps({"id": 2, "name": "y", "extra": True}).encode()),
        (b"a", json.dumps({"id": 1, "name": "z"}).encode()),
        (b"c", json.dumps({"id": 3}).encode()),
        (b"d", b"not json"),
        (b"b", None),
    ])
    table, ck = str(tmp_path / "view"), str(tmp_path / "ck")
    run(spark, boot, topic, table, ck, json_schema="id long, name string")
    df = spark.read.format("delta").load(table)
    assert df.columns == ["key", "id", "name", "_partition", "_offset", "_timestamp"]
    got = {k: v for k, (_, _, v) in read_view(spark, table, ["id", "name"]).items()}
    # Malformed JSON is kept as a row of nulls (only a null value deletes).
    assert got == {b"a": (1, "z"), b"c": (3, None), b"d": (None, None)}


# ---------------------------------------------------------------- the MERGE itself


def test_merge_is_idempotent_and_never_overwrites_newer(spark: SparkSession, tmp_path) -> None:  # type: ignore[no-untyped-def]
    """Applying a batch twice, or an older batch after a newer one, changes nothing."""
    table = str(tmp_path / "view")
    ref = table_ref(table)
    schema = StructType([
        StructField("key", BinaryType(), False), StructField("value", BinaryType(), True),
        StructField("_partition", IntegerType(), False), StructField("_offset", LongType(), False),
        StructField("_timestamp", TimestampType(), True),
    ])
    ensure_table(spark, ref, schema, topic="t")
    batch_schema = StructType([*schema.fields, StructField("_tombstone", BooleanType(), False)])

    def ts(ms: int) -> datetime:
        return datetime.fromtimestamp(ms / 1000, tz=timezone.utc)

    def batch(rows):  # type: ignore[no-untyped-def]
        return spark.createDataFrame(
            [(k, v, p, o, ts(t), v is None) for k, v, p, o, t in rows], batch_schema)

    older = batch([(b"a", b"a1", 0, 1, 10), (b"b", b"b1", 0, 2, 11), (b"c", b"c1", 1, 3, 12)])
    newer = batch([(b"a", b"a2", 0, 5, 20), (b"b", None, 0, 6, 21), (b"d", b"d2", 1, 7, 22)])

    def view() -> dict[bytes, tuple[bytes, int]]:
        return {bytes(r["key"]): (bytes(r["value"]), r["_offset"])
                for r in spark.read.format("delta").load(table).collect()}

    merge_latest(spark, ref, older)
    merge_latest(spark, ref, newer)
    want = {b"a": (b"a2", 5), b"c": (b"c1", 3), b"d": (b"d2", 7)}
    assert view() == want
    merge_latest(spark, ref, newer)      # a replay
    assert view() == want
    merge_latest(spark, ref, older)      # an older batch: no value goes back (b returns: deletes are not guarded)
    assert {k: v for k, v in view().items() if k != b"b"} == want
    # A key written to two partitions: the later timestamp wins, whatever the order of application.
    merge_latest(spark, ref, batch([(b"x", b"late", 1, 1, 500), (b"y", b"early", 0, 900, 400)]))
    merge_latest(spark, ref, batch([(b"x", b"early", 0, 900, 400), (b"y", b"late", 1, 1, 500)]))
    assert view()[b"x"] == view()[b"y"] == (b"late", 1)


# ---------------------------------------------------------------- continuous mode


def test_continuous_view_follows_new_records(spark: SparkSession, boot: str, tmp_path) -> None:  # type: ignore[no-untyped-def]
    topic = new_topic(boot, "mat-cont", 2)
    send_all(boot, topic, [(b"k1", b"1"), (b"k2", b"2")])
    table = str(tmp_path / "view")
    # No checkpoint given: it lives inside the table's directory.
    q = materialize(spark, bootstrap=boot, topic=topic, table=table, trigger_interval="200 milliseconds")
    try:
        deadline = time.monotonic() + 90
        q.processAllAvailable()
        assert read_view(spark, table, ["value"]) == model(read_topic(boot, topic))
        send_all(boot, topic, [(b"k1", None), (b"k3", b"3"), (b"k2", b"22")])
        want = model(read_topic(boot, topic))
        got = None
        while time.monotonic() < deadline:
            q.processAllAvailable()
            got = read_view(spark, table, ["value"])
            if got == want:
                break
        assert got == want
    finally:
        q.stop()
    assert (tmp_path / "view" / "_logstore_checkpoint" / "offsets").is_dir()


def test_view_by_table_name(spark: SparkSession, boot: str, tmp_path) -> None:  # type: ignore[no-untyped-def]
    db = f"views_{random.randrange(1 << 30)}"
    spark.sql(f"CREATE DATABASE {db} LOCATION '{tmp_path / 'db'}'")
    topic = new_topic(boot, "mat-named", 1)
    send_all(boot, topic, [(b"k", b"v1"), (b"k", b"v2"), (b"j", b"w")])
    run(spark, boot, topic, f"{db}.users", str(tmp_path / "ck"))
    assert read_view(spark, f"{db}.users", ["value"]) == model(read_topic(boot, topic))


def test_view_log_lines_name_the_table_and_checkpoint_absolute_and_resolved(  # type: ignore[no-untyped-def]
        spark: SparkSession, boot: str, tmp_path, monkeypatch: pytest.MonkeyPatch,
        caplog: pytest.LogCaptureFixture) -> None:
    """A relative table and checkpoint (through a symbolic link), and a checkpoint taken from
    Delta's location (a file: URI): every line names the one absolute, resolved path."""
    (tmp_path / "real").mkdir()
    (tmp_path / "link").symlink_to(tmp_path / "real")
    monkeypatch.chdir(tmp_path)
    real = tmp_path.resolve() / "real"
    topic = new_topic(boot, "mat-paths", 1)
    send_all(boot, topic, [(b"k", b"v")])
    caplog.set_level(logging.INFO, logger="logstore.jobs.materialize")
    run(spark, boot, topic, "link/views/../views/given", "./link/ck")
    materialize(spark, bootstrap=boot, topic=topic, table="./link/views/derived", available_now=True,
                timeout_s=120)
    lines = [r.getMessage() for r in caplog.records if r.name == "logstore.jobs.materialize"]
    given, derived = str(real / "views" / "given"), str(real / "views" / "derived")
    assert any(line.startswith(f"view {given} <- {topic} started (checkpoint {real / 'ck'},")
               for line in lines), lines
    assert any(line.startswith(f"view {derived} <- {topic} started (checkpoint {derived}/_logstore_checkpoint,")
               for line in lines), lines
    assert any(line.startswith(f"created Delta table {given} ") for line in lines), lines
    assert any(line.startswith(f"view {derived} <- {topic}: batch 0:") for line in lines), lines
    assert not [line for line in lines if "link" in line or "file:" in line or ".." in line], lines


# ---------------------------------------------------------------- errors


def test_table_ref_tells_paths_from_names() -> None:
    assert table_ref("/data/views/users").is_path
    assert table_ref("./users").is_path
    assert table_ref("views/users").value == str(Path.cwd() / "views" / "users")  # Delta needs absolute
    assert table_ref("file:/data/users").value == "file:/data/users"
    assert table_ref("s3a://bucket/views/users").is_path
    assert not table_ref("users").is_path
    assert not table_ref("db.users").is_path
    assert not table_ref("cat.db.`my users`").is_path
    with pytest.raises(MaterializeConfigError, match="neither a path"):
        table_ref("my users")


def test_json_schema_errors_are_clear(spark: SparkSession) -> None:
    with pytest.raises(MaterializeConfigError, match="json schema 'id lng'"):
        parse_json_schema("id lng")
    with pytest.raises(MaterializeConfigError, match=r"\['_offset'\].*reserves"):
        parse_json_schema("id long, _offset long")
    assert parse_json_schema("id long, name string NOT NULL").fieldNames() == ["id", "name"]


def test_materialize_refuses_bad_arguments(spark: SparkSession, boot: str, tmp_path) -> None:  # type: ignore[no-untyped-def]
    with pytest.raises(MaterializeConfigError, match="does not exist"):
        run(spark, boot, "no-such-topic-xyz", str(tmp_path / "v0"), str(tmp_path / "c0"))
    typed = new_topic(boot, "mat-err-typed", 1, value_schema=pa.schema([("id", pa.int64())]))
    with pytest.raises(MaterializeConfigError, match="json_schema applies to untyped topics"):
        run(spark, boot, typed, str(tmp_path / "v1"), str(tmp_path / "c1"), json_schema="id long")
    # A table made for another topic.
    one = new_topic(boot, "mat-err-a", 1)
    two = new_topic(boot, "mat-err-b", 1)
    run(spark, boot, one, str(tmp_path / "v2"), str(tmp_path / "c2"))
    with pytest.raises(MaterializeConfigError, match=f"is a view of topic '{one}', not '{two}'"):
        run(spark, boot, two, str(tmp_path / "v2"), str(tmp_path / "c3"))
    # A directory that is not a Delta table.
    (tmp_path / "v3").mkdir()
    (tmp_path / "v3" / "file.txt").write_text("x")
    with pytest.raises(MaterializeConfigError, match="is not a Delta table"):
        run(spark, boot, one, str(tmp_path / "v3"), str(tmp_path / "c4"))
    with pytest.raises(MaterializeConfigError, match="either available_now or trigger_interval"):
        materialize(spark, bootstrap=boot, topic=one, table=str(tmp_path / "v4"),
                    available_now=True, trigger_interval="1 second")


def test_cli_rejects_bad_json_schema_before_starting_spark() -> None:
    result = CliRunner().invoke(materialize_command, [
        "--topic", "t", "--table", "/tmp/x", "--parse-json-values", "id long, key string"])
    assert result.exit_code == 2
    assert "--parse-json-values" in result.output and "reserves" in result.output
    result = CliRunner().invoke(materialize_command, [
        "--topic", "t", "--table", "/tmp/x", "--parse-json-values", "id lng"])
    assert result.exit_code == 2 and "lng" in result.output


# ---------------------------------------------------------------- docs-jobs.md, idempotent Delta writes


def test_docs_idempotent_append_and_update_skip_a_replayed_batch(spark: SparkSession, tmp_path) -> None:  # type: ignore[no-untyped-def]
    """What docs-jobs.md says of txnAppId/txnVersion: a replayed batch id writes nothing."""
    from delta.tables import DeltaTable

    path = str(tmp_path / "orders")

    def append_batch(batch_df, batch_id):  # type: ignore[no-untyped-def]  # as in the docs
        (batch_df.write.format("delta").option("txnAppId", "orders-to-delta")
         .option("txnVersion", batch_id).mode("append").save(path))

    rows = spark.createDataFrame([(b"k1", b"v1"), (b"k2", b"v2")], "key binary, value binary")
    append_batch(rows, 0)
    append_batch(rows, 0)            # the replay
    append_batch(rows, 1)
    assert spark.read.format("delta").load(path).count() == 4
    # DML (here UPDATE): the session confs, set on the batch's own session and unset after.
    session = rows.sparkSession.newSession()
    for _ in range(2):
        session.conf.set("spark.databricks.delta.write.txnAppId", "orders-merge")
        session.conf.set("spark.databricks.delta.write.txnVersion", "7")
        try:
            DeltaTable.forPath(session, path).update("key = X'6B31'", {"value": "concat(value, X'21')"})
        finally:
            session.conf.unset("spark.databricks.delta.write.txnAppId")
            session.conf.unset("spark.databricks.delta.write.txnVersion")
    values = sorted(bytes(r["value"]) for r in spark.read.format("delta").load(path).collect())
    assert values == [b"v1!", b"v1!", b"v2", b"v2"]
