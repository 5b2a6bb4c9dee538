"""Filter pushdown of batch reads against a real embedded broker (issue 26).

The rule checked everywhere: a query with pushdown on returns exactly the rows
Spark's own evaluation of the same predicate returns on the same data read with
pushdown off. The data has null keys, tombstones, out-of-order CreateTime
timestamps, an aborted transaction (read_committed drops it), and a typed topic;
a property-based test generates data and predicates. Separately: what is pushed
shows in the plan, and partition, offset and timestamp predicates narrow what is
planned (fewer tasks), while filters the source cannot evaluate exactly stay with
Spark.
"""

from __future__ import annotations

import datetime as dt
import random
import re
import uuid
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass

import pyarrow as pa
import pytest
from compaction_helpers import compact_topic, compact_without_spark, produce_batches
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from pyspark.sql import DataFrame, SparkSession

from logstore import Producer
from logstore.client.admin import Admin
from logstore.client.rpc import BrokerClient
from logstore.record import build_batch, encode_batch, encode_schema, typed_schema, untyped_schema
from logstore.types import NewTopic, TopicPartition
from spark_source.registration import FILTER_PUSHDOWN

pytestmark = pytest.mark.timeout(240)

BASE_MS = 1_700_000_000_000


# ---------------------------------------------------------------- helpers


def new_topic(client: BrokerClient, prefix: str, partitions: int, *, value_schema: pa.Schema | None = None) -> str:
    name = f"{prefix}-{uuid.uuid4().hex[:12]}"
    errors = client.create_topics([NewTopic(name, num_partitions=partitions, value_schema=value_schema)])
    assert errors[name] is None, errors
    return name


def append(client: BrokerClient, topic: str, partition: int, *, values: Sequence[object] | pa.Array,
           keys: Sequence[bytes | None], stamps_ms: Sequence[int], schema: pa.Schema | None = None) -> None:
    """One batch with these keys, values (None = tombstone) and CreateTime timestamps."""
    schema = schema or untyped_schema()
    batch = build_batch(schema, values=values, timestamps_ms=list(stamps_ms), keys=list(keys))
    data = encode_schema(schema) + encode_batch(batch, base_offset=0).to_bytes()
    (result,) = client.produce([(TopicPartition(topic, partition), data)], acks=-1)
    assert result.error is None, result.error


def ts_sql(ms: int, micros: int = 0) -> str:
    """A TIMESTAMP literal (the test session's time zone is UTC) ``micros`` after ``ms``."""
    moment = dt.datetime(1970, 1, 1) + dt.timedelta(milliseconds=ms, microseconds=micros)
    return f"TIMESTAMP '{moment.isoformat(sep=' ')}'"


@contextmanager
def pushdown(spark: SparkSession, on: bool) -> Iterator[None]:
    before = spark.conf.get(FILTER_PUSHDOWN, None)
    spark.conf.set(FILTER_PUSHDOWN, "true" if on else "false")
    try:
        yield
    finally:
        spark.conf.set(FILTER_PUSHDOWN, before if before is not None else "true")


def table(df: DataFrame) -> pa.Table:
    return df.toArrow().sort_by([("topic", "ascending"), ("partition", "ascending"), ("offset", "ascending")])


def plan_text(df: DataFrame) -> str:
    return df._sc._jvm.PythonSQLUtils.explainString(df._jdf.queryExecution(), "formatted")  # type: ignore[attr-defined]


def pushed(df: DataFrame) -> str:
    """The ``PushedFilters: [...]`` of the scan in the formatted plan ('' when none are listed)."""
    m = re.search(r"PushedFilters: \[(.*)\]", plan_text(df))
    return m.group(1) if m else ""


@dataclass
class Checked:
    rows: pa.Table
    pushed: str
    tasks: int


def check(spark: SparkSession, load: Callable[[bool], DataFrame], where: str, *, tasks: bool = False) -> Checked:
    """Read ``load(push).where(where)`` with pushdown on and off; the rows must be the same.

    With ``tasks``, also count the Spark tasks the pushed read plans (-1 otherwise)."""
    df = load(True).where(where)
    got, text = table(df), pushed(df)
    want = table(load(False).where(where))
    assert got.equals(want), (
        f"WHERE {where}: pushdown on gave {got.num_rows} rows, off {want.num_rows}\n"
        f"on:  {got.select(['partition', 'offset']).to_pylist()}\n"
        f"off: {want.select(['partition', 'offset']).to_pylist()}"
    )
    return Checked(got, text, df.rdd.getNumPartitions() if tasks else -1)


# ---------------------------------------------------------------- data


@dataclass
class Topics:
    boot: str
    untyped: str
    typed: str

    def load(self, spark: SparkSession, topic: str, **options: str) -> Callable[[bool], DataFrame]:
        """``make(push)``: a DataFrame reading ``topic``, with pushdown (``push``) or without."""
        def make(push: bool) -> DataFrame:
            r = (spark.read.format("logstore").option("logstore.bootstrap.servers", self.boot)
                 .option("subscribe", topic).option("pushFilters", str(push).lower()))
            for k, v in options.items():
                r = r.option(k, v)
            return r.load()
        return make


TYPED_VALUES = pa.schema([("amount", pa.int64()), ("region", pa.string()), ("flag", pa.bool_()),
                          ("price", pa.float64())])


@pytest.fixture(scope="module")
def topics(shared_broker) -> Topics:  # type: ignore[no-untyped-def]
    rng = random.Random(26)
    boot = shared_broker.bootstrap
    with BrokerClient(boot) as client:
        untyped = new_topic(client, "pd", 3)
        # Partition 0: null keys, tombstones, CreateTime timestamps out of order within and across batches.
        stamps = [BASE_MS + 1000 * i for i in range(36)]
        rng.shuffle(stamps)
        for b in range(3):
            n = range(12 * b, 12 * b + 12)
            append(client, untyped, 0, keys=[None if i % 7 == 3 else b"k%d" % (i % 5) for i in n],
                   values=[None if i % 5 == 4 else b"v%d" % i for i in n], stamps_ms=stamps[12 * b:12 * b + 12])
        # Partition 2: one record per batch, timestamps increasing.
        for i in range(20):
            append(client, untyped, 2, keys=[b"k%d" % (i % 5)], values=[b"w%d" % i], stamps_ms=[BASE_MS + 1000 * i])
        typed = new_topic(client, "pdt", 2, value_schema=TYPED_VALUES)
        vtype = typed_schema(TYPED_VALUES).field("value").type
        for p in range(2):
            rows = [None if i % 6 == 5 else
                    {"amount": None if i % 4 == 1 else i * 3 % 17, "region": [None, "eu", "us", "east"][i % 4],
                     "flag": None if i % 5 == 2 else i % 2 == 0, "price": i / 2} for i in range(18)]
            append(client, typed, p, values=pa.array(rows, vtype), keys=[b"t%d" % (i % 3) for i in range(18)],
                   stamps_ms=[BASE_MS + 500 * i for i in range(18)], schema=typed_schema(TYPED_VALUES))
    # Partition 1: committed, aborted, committed transactions (timestamps out of order too).
    with Producer(boot, transactional_id=f"pd-{random.randrange(1 << 30)}") as producer:
        producer.init_transactions()
        for txn, fate in enumerate(("commit", "abort", "commit")):
            producer.begin_transaction()
            for i in range(6):
                producer.send(untyped, None if i == 2 else f"{fate}-{txn}-{i}".encode(), key=b"k%d" % (i % 5),
                              partition=1, timestamp_ms=BASE_MS + 1000 * ((i * 7 + txn * 5) % 36))
            if fate == "commit":
                producer.commit_transaction()
            else:
                producer.abort_transaction()
    return Topics(boot, untyped, typed)


# ---------------------------------------------------------------- every kind of pushed predicate

UNTYPED_WHERES = [
    "partition = 1",
    "partition in (0, 2) and key is not null",
    "NOT (partition = 0) and partition < 2",
    "offset >= 5 and offset < 9",
    "offset in (0, 3, 11, 40)",
    "offset > 2 and offset <= 9 and NOT (offset = 4)",
    f"timestamp >= {ts_sql(BASE_MS + 17_000)}",
    f"timestamp > {ts_sql(BASE_MS + 9_000)} and timestamp <= {ts_sql(BASE_MS + 21_000)}",
    f"timestamp > {ts_sql(BASE_MS + 9_000, 500)}",
    f"timestamp in ({ts_sql(BASE_MS + 3_000)}, {ts_sql(BASE_MS + 33_000)})",
    "key = X'6b31'",
    "key in (X'6b31', X'6b33')",
    "key <> X'6b31' and offset < 20",
    "NOT (key in (X'6b31', X'6b32'))",
    "key is null",
    "value is null and key is not null",
    "value is not null and key > X'6b32'",
    "timestampType = 0 and topic like 'pd%'",
    "timestampType = 1",
]


@pytest.mark.parametrize("where", UNTYPED_WHERES)
def test_pushed_predicates_keep_exactly_the_matching_rows(spark: SparkSession, topics: Topics, where: str) -> None:
    result = check(spark, topics.load(spark, topics.untyped), where)
    assert result.pushed, f"WHERE {where}: nothing was pushed"


TYPED_WHERES = [
    "amount > 10",
    "amount in (0, 3, 6) and flag",
    "NOT flag",
    "amount <=> 6",
    "NOT (amount <=> 6)",
    "region = 'eu' and amount is not null",
    "region like 'e%'",
    "region like '%st'",
    "region like '%s%'",
    "NOT (region in ('us', 'east'))",
    "amount is null",
    "region is null and flag is null",
]


@pytest.mark.parametrize("where", TYPED_WHERES)
def test_pushed_predicates_on_typed_columns(spark: SparkSession, topics: Topics, where: str) -> None:
    result = check(spark, topics.load(spark, topics.typed), where)
    assert result.pushed, f"WHERE {where}: nothing was pushed"


def test_read_uncommitted_sees_the_aborted_records_with_or_without_pushdown(spark: SparkSession, topics: Topics) -> None:
    load = topics.load(spark, topics.untyped, isolationLevel="read_uncommitted")
    result = check(spark, load, f"partition = 1 and timestamp >= {ts_sql(BASE_MS + 10_000)}")
    values = {v for v in result.rows.column("value").to_pylist() if v is not None}
    assert any(v.startswith(b"abort") for v in values), values
    committed = check(spark, topics.load(spark, topics.untyped), f"partition = 1 and timestamp >= {ts_sql(BASE_MS + 10_000)}")
    assert not any((v or b"").startswith(b"abort") for v in committed.rows.column("value").to_pylist())


def test_filters_the_source_cannot_evaluate_exactly_stay_with_spark(spark: SparkSession, topics: Topics) -> None:
    df = topics.load(spark, topics.typed)(True).where("price > 3.0 and amount > 2")
    plan = plan_text(df)
    # IS NOT NULL is exact on any column; a comparison of doubles is not (NaN): Spark keeps it.
    assert "PushedFilters: [IsNotNull(price), IsNotNull(amount), GreaterThan(amount,2)]" in plan, plan
    assert re.search(r"Condition : \(price#\d+ > 3\.0\)", plan), plan
    check(spark, topics.load(spark, topics.typed), "price > 3.0 and amount > 2")


def test_a_compacted_topic_with_gaps(spark: SparkSession, shared_broker) -> None:  # type: ignore[no-untyped-def]
    boot = shared_broker.bootstrap
    with Admin(boot) as admin:
        topic = compact_topic(admin, "pdc", segment_bytes=2048)
    rng = random.Random(7)
    stamps = [BASE_MS + 1000 * i for i in range(120)]
    rng.shuffle(stamps)  # out of order across the segments the cleaner rewrites
    with Producer(boot, linger_ms=0) as producer:
        produce_batches(producer, topic, [
            [(stamps[10 * b + i], b"k%d" % ((b * 10 + i) % 5), None if i == 9 else b"v%d" % (b * 10 + i))
             for i in range(10)] for b in range(12)])
    [result] = compact_without_spark(boot, topic, now_ms=BASE_MS)
    assert result.error is None and result.records_removed > 0, result
    load = Topics(boot, topic, "").load(spark, topic)
    for where in (f"timestamp >= {ts_sql(BASE_MS + 60_000)}", "offset >= 30 and offset < 90",
                  "key = X'6b33' and value is not null", f"timestamp > {ts_sql(BASE_MS + 100_000)} and key <> X'6b31'"):
        check(spark, load, where)


# ---------------------------------------------------------------- what is planned


def test_partition_offset_and_timestamp_predicates_narrow_the_plan(spark: SparkSession, topics: Topics) -> None:
    load = topics.load(spark, topics.untyped, maxRecordsPerPartition="2")

    def tasks(where: str) -> int:  # planned only: the rows are compared with Spark's above
        return load(True).where(where).rdd.getNumPartitions()

    # Partition 2 holds offsets 0..19 with timestamps BASE + 1000 * offset: 10 tasks of 2.
    assert tasks("partition = 2") == 10
    assert tasks("partition = 2 and offset >= 12") == 4
    assert tasks("partition = 2 and offset >= 12 and offset < 16") == 2
    assert tasks(f"partition = 2 and timestamp >= {ts_sql(BASE_MS + 14_000)}") == 3
    assert tasks(f"partition = 2 and timestamp > {ts_sql(BASE_MS + 99_000)}") == 1  # Spark's one empty task
    # An upper bound on the timestamp cannot cut the range (CreateTime is not monotone).
    assert tasks(f"partition = 2 and timestamp < {ts_sql(BASE_MS + 2_000)}") == 10
    narrowed = load(True).where(f"partition = 2 and timestamp >= {ts_sql(BASE_MS + 14_000)}")
    assert [r.offset for r in narrowed.select("offset").collect()] == list(range(14, 20))


def test_explain_formatted_lists_the_pushed_filters(spark: SparkSession, topics: Topics) -> None:
    df = topics.load(spark, topics.untyped)(True).where("partition = 1 and offset > 3")
    plan = plan_text(df)
    assert "PushedFilters: [IsNotNull(partition), IsNotNull(offset), EqualTo(partition,1), GreaterThan(offset,3)]" in plan, plan


def test_with_the_session_flag_off_spark_refuses_pushdown_unless_the_read_opts_out(spark: SparkSession, topics: Topics) -> None:
    with pushdown(spark, False):
        with pytest.raises(Exception, match="filterPushdown.enabled"):
            topics.load(spark, topics.untyped)(True).where("partition = 1").count()
        df = topics.load(spark, topics.untyped)(False).where("partition = 1")
        assert df.count() == 12 and pushed(df) == ""  # 12 committed records in partition 1


# ---------------------------------------------------------------- generated data and predicates

KEYS = [None, b"a", b"b", b"c"]


LITERALS: dict[str, st.SearchStrategy[str]] = {
    "key": st.sampled_from([b"a", b"b", b"c", b"v1"]).map(lambda b: f"X'{b.hex()}'"),
    "value": st.sampled_from([b"a", b"v1", b"v2"]).map(lambda b: f"X'{b.hex()}'"),
    "timestamp": st.builds(lambda s, us: ts_sql(BASE_MS + 1000 * s, us), st.integers(0, 12), st.sampled_from([0, 1, 999])),
    "offset": st.integers(-1, 12).map(str),
    "partition": st.integers(0, 2).map(str),
}


@st.composite
def atoms(draw: st.DrawFn) -> str:
    column = draw(st.sampled_from(sorted(LITERALS)))
    literal = LITERALS[column]
    op = draw(st.sampled_from(["=", "<>", "<", "<=", ">", ">=", "in", "not in", "is null", "is not null"]))
    if op in ("is null", "is not null"):
        return f"{column} {op}"
    if op in ("in", "not in"):
        return f"{column} {op} ({', '.join(draw(st.lists(literal, min_size=1, max_size=3)))})"
    return f"{column} {op} {draw(literal)}"


@settings(max_examples=5, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(
    data=st.lists(st.tuples(st.integers(0, 1), st.sampled_from(KEYS), st.sampled_from([None, b"v1", b"v2"]),
                            st.integers(0, 12)), min_size=1, max_size=25),
    where=st.lists(atoms(), min_size=1, max_size=3).map(" and ".join),
)
def test_generated_predicates_match_sparks_filtering(spark: SparkSession, shared_broker, data, where) -> None:  # type: ignore[no-untyped-def]
    with BrokerClient(shared_broker.bootstrap) as client:
        topic = new_topic(client, "pdh", 2)
        for p in (0, 1):
            mine = [d for d in data if d[0] == p]
            for i in range(0, len(mine), 4):  # batches of up to 4, timestamps as drawn (out of order)
                chunk = mine[i:i + 4]
                append(client, topic, p, keys=[d[1] for d in chunk], values=[d[2] for d in chunk],
                       stamps_ms=[BASE_MS + 1000 * d[3] for d in chunk])
    check(spark, Topics(shared_broker.bootstrap, topic, "").load(spark, topic), where)
