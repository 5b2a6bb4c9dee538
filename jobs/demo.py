"""``make demo``: logstore end to end on one machine, in well under a minute.

The demo is a list of steps (:data:`STEPS`), each a function of the shared
:class:`Demo` state, run in order by :func:`main`:

1. start an embedded broker (port 9392 if free, else a free one; data in
   ``./demo-data``, wiped first);
2. create ``orders`` (3 partitions, untyped: JSON values keyed by customer
   id) and ``customers`` (compacted, typed: ``customer_id long, name string,
   tier string``);
3. produce a few thousand orders and ~50 customers plus updates of some of
   them (same key, newer tier) with :meth:`Producer.send_batch`;
4. read everything back and print counts per partition, sample records and
   the partitions' offsets;
5. start Spark (``local[2]``, or ``--master``, e.g. ``spark://HOST:7077``,
   with Delta) and run a Structured Streaming pipeline:
   read ``orders`` with format ``logstore``, parse the JSON, aggregate per
   customer and write the result to ``customer-order-stats`` with the
   exactly-once sink (``Trigger.AvailableNow``); read it back;
6. compact ``customers`` with the Spark compaction job (older versions of
   updated customers are removed; offsets of survivors do not change);
7. materialize ``customers`` into a Delta table (latest value per key, the
   tombstoned customer deleted) and print it.
"""

from __future__ import annotations

import argparse
import json
import random
import shutil
import socket
import sys
import time
from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pyarrow as pa
import pyarrow.compute as pc
from rich.console import Console
from rich.table import Table

from logstore import Admin, Consumer, NewTopic, Producer, SendBatchResult, TopicPartition
from logstore.broker.embedded import EmbeddedBroker
from logstore.defaults import DEFAULT_HOST, DEFAULT_PORT
from logstore.schema_text import format_schema, parse_schema
from logstore.types import BatchMetadata

__all__ = ["Demo", "STEPS", "main"]

DATA_DIR = Path("demo-data")
ORDERS = "orders"
CUSTOMERS = "customers"
ORDER_STATS = "customer-order-stats"
# Small segments, so the customers' history spans closed segments the cleaner can compact.
CUSTOMER_SEGMENT_BYTES = 1024
ORDER_PARTITIONS = 3
NUM_ORDERS = 3000
NUM_CUSTOMERS = 50
NUM_CUSTOMER_UPDATES = 20
CUSTOMER_SCHEMA = parse_schema("customer_id long NOT NULL, name string, tier string")
READ_TIMEOUT_S = 30.0

_FIRST = ["Ada", "Ben", "Cleo", "Dev", "Eli", "Fay", "Gus", "Hana", "Ivo", "Jun"]
_LAST = ["Lovelace", "Okafor", "Silva", "Nguyen", "Kowalski"]
_ITEMS = ["keyboard", "monitor", "mouse", "laptop", "headset", "webcam", "dock", "cable"]
_TIERS = ["bronze", "silver", "gold", "platinum"]


@dataclass
class Demo:
    """State shared by the steps."""

    console: Console
    data_dir: Path
    rng: random.Random = field(default_factory=lambda: random.Random(42))
    broker: EmbeddedBroker | None = None
    spark: Any = None
    master: str = "local[2]"
    produced: dict[str, int] = field(default_factory=dict)
    deleted_customer: int = -1
    read: dict[str, dict[TopicPartition, pa.Table]] = field(default_factory=dict)

    @property
    def bootstrap(self) -> str:
        assert self.broker is not None, "start_broker runs first"
        return self.broker.bootstrap


# --------------------------------------------------------------------------- steps


def start_broker(demo: Demo) -> None:
    """An embedded broker on 9392 if free (so `logstore ...` finds it), else any free port."""
    shutil.rmtree(demo.data_dir, ignore_errors=True)
    demo.data_dir.mkdir(parents=True)
    port = DEFAULT_PORT if _port_free(DEFAULT_HOST, DEFAULT_PORT) else 0
    demo.broker = EmbeddedBroker(str(demo.data_dir), port=port).start()
    demo.console.print(f"broker listening on [bold]{demo.bootstrap}[/bold], data in {demo.data_dir}/")


def create_topics(demo: Demo) -> None:
    with Admin(demo.bootstrap) as admin:
        admin.create_topics([
            NewTopic(ORDERS, ORDER_PARTITIONS),
            NewTopic(CUSTOMERS, 1, value_schema=CUSTOMER_SCHEMA,
                     configs={"cleanup.policy": "compact", "segment.bytes": str(CUSTOMER_SEGMENT_BYTES)}),
            NewTopic(ORDER_STATS, ORDER_PARTITIONS),
        ])
    demo.console.print(f"created [bold]{ORDERS}[/bold] ({ORDER_PARTITIONS} partitions, JSON values) and "
                       f"[bold]{CUSTOMERS}[/bold] (compacted, typed: {format_schema(CUSTOMER_SCHEMA)})")


def produce_orders(demo: Demo) -> None:
    """Orders as JSON values keyed by customer id: one Arrow table, one send_batch call."""
    now_ms = int(time.time() * 1000)
    rows = []
    for order_id in range(1, NUM_ORDERS + 1):
        customer_id = demo.rng.randint(1, NUM_CUSTOMERS)
        rows.append({
            "order_id": order_id,
            "customer_id": customer_id,
            "item": demo.rng.choice(_ITEMS),
            "quantity": demo.rng.randint(1, 5),
            "amount": round(demo.rng.uniform(5, 500), 2),
        })
    table = pa.table({
        "key": pa.array([str(r["customer_id"]) for r in rows]),
        "value": pa.array([json.dumps(r, separators=(",", ":")) for r in rows]),
        # A spread of create times over the last hour, in order.
        "timestamp": pa.array([now_ms - (NUM_ORDERS - i) * 1000 for i in range(NUM_ORDERS)], pa.int64()),
    })
    result = _send(demo, ORDERS, table)
    _print_sent(demo, ORDERS, result)


def produce_customers(demo: Demo) -> None:
    """Customers (typed rows keyed by customer_id), then tier changes of some: same keys again."""
    ids = list(range(1, NUM_CUSTOMERS + 1))
    names = [f"{demo.rng.choice(_FIRST)} {demo.rng.choice(_LAST)}" for _ in ids]
    tiers = [demo.rng.choice(_TIERS[:2]) for _ in ids]
    updated = sorted(demo.rng.sample(ids, NUM_CUSTOMER_UPDATES))
    first = pa.table({"customer_id": pa.array(ids, pa.int64()), "name": names, "tier": tiers},
                     schema=CUSTOMER_SCHEMA)
    updates = pa.table({
        "customer_id": pa.array(updated, pa.int64()),
        "name": [names[i - 1] for i in updated],
        "tier": [demo.rng.choice(_TIERS[2:]) for _ in updated],
    }, schema=CUSTOMER_SCHEMA)
    result = _send(demo, CUSTOMERS, first, key_column="customer_id")
    more = _send(demo, CUSTOMERS, updates, key_column="customer_id")
    # One customer closes the account: a tombstone (null value) for its key.
    gone = updated[0]
    with Producer(demo.bootstrap) as producer:
        md = producer.send(CUSTOMERS, None, key=str(gone).encode()).result(timeout=60)
    demo.produced[CUSTOMERS] += 1
    # A last update lands in the active segment, which compaction never touches.
    last = _send(demo, CUSTOMERS, pa.table({"customer_id": pa.array([updated[-1]], pa.int64()),
                                            "name": [names[updated[-1] - 1]], "tier": ["platinum"]},
                                           schema=CUSTOMER_SCHEMA), key_column="customer_id")
    tomb = BatchMetadata(CUSTOMERS, md.partition, md.offset, 1)
    _print_sent(demo, CUSTOMERS, SendBatchResult(result.batches + more.batches + (tomb,) + last.batches))
    demo.deleted_customer = gone
    demo.console.print(f"  {NUM_CUSTOMERS} customers, {NUM_CUSTOMER_UPDATES} of them updated, customer "
                       f"{gone} deleted (tombstone): {demo.produced[CUSTOMERS]} records")


def read_back(demo: Demo) -> None:
    """Read every partition of both topics from the beginning; print counts and samples."""
    for topic in (ORDERS, CUSTOMERS):
        demo.read[topic] = _read_all(demo, topic, demo.produced[topic])
    orders = demo.read[ORDERS]
    table = Table(title=f"read back from {ORDERS}", title_justify="left")
    for name in ("partition", "records", "offsets", "customers (keys)"):
        table.add_column(name, justify="right")
    for tp in sorted(orders):
        t = orders[tp]
        offsets = t.column("offset")
        table.add_row(str(tp.partition), str(t.num_rows),
                      f"{pc.min(offsets).as_py()}..{pc.max(offsets).as_py()}",
                      str(len(pc.unique(t.column("key")))))
    demo.console.print(table)
    demo.console.print(f"  every key is in one partition: "
                       f"{_keys_disjoint(orders)}; total {sum(t.num_rows for t in orders.values())} orders")
    samples = Table(title="sample orders", title_justify="left")
    for name in ("partition", "offset", "key", "value"):
        samples.add_column(name)
    for tp in sorted(orders):
        t = orders[tp].slice(0, 2)
        for offset, key, value in zip(t.column("offset").to_pylist(), t.column("key").to_pylist(),
                                      t.column("value").to_pylist(), strict=True):
            samples.add_row(str(tp.partition), str(offset), key.decode(), value.decode())
    demo.console.print(samples)

    [customers] = demo.read[CUSTOMERS].values()
    customers = customers.filter(pc.is_valid(customers.column("value")))  # leave the tombstone out
    values = customers.column("value").flatten()  # customer_id, name, tier
    by_id = Counter(values[0].to_pylist())
    latest: dict[int, str] = dict(zip(values[0].to_pylist(), values[2].to_pylist(), strict=True))
    demo.console.print(
        f"{CUSTOMERS}: {customers.num_rows} records for {len(by_id)} keys; "
        f"{sum(1 for c in by_id.values() if c > 1)} keys have more than one record "
        f"(compaction will keep the latest of each); latest tiers: "
        + ", ".join(f"{tier} {n}" for tier, n in sorted(Counter(latest.values()).items()))
    )
    rows = Table(title="an updated customer's records", title_justify="left")
    for name in ("offset", "customer_id", "name", "tier"):
        rows.add_column(name)
    updated = next(cid for cid, n in sorted(by_id.items()) if n > 1)
    for i in range(customers.num_rows):
        if values[0][i].as_py() == updated:
            rows.add_row(str(customers.column("offset")[i].as_py()), str(updated),
                         values[1][i].as_py(), values[2][i].as_py())
    demo.console.print(rows)


def show_offsets(demo: Demo) -> None:
    with Admin(demo.bootstrap) as admin:
        described = admin.describe_topics([ORDERS, CUSTOMERS])
    table = Table(title="offsets", title_justify="left")
    for name in ("partition", "log start", "LEO", "HWM", "LSO", "bytes"):
        table.add_column(name, justify="right")
    for topic in (ORDERS, CUSTOMERS):
        for p in described[topic].partitions:
            table.add_row(f"{topic}-{p.partition}", str(p.log_start_offset), str(p.log_end_offset),
                          str(p.high_watermark), str(p.last_stable_offset), str(p.size_bytes))
    demo.console.print(table)
    port = demo.bootstrap.rsplit(":", 1)[1]
    default = port == str(DEFAULT_PORT)
    demo.console.print(
        "the data stays in ./demo-data; to look at it: [bold]logstore broker start --data-dir "
        f"demo-data{'' if default else ' --port ' + port}[/bold], then e.g. [bold]logstore consume "
        f"{ORDERS} --from-beginning --max-records 5{'' if default else ' --bootstrap ' + demo.bootstrap}"
        "[/bold]"
    )


def start_spark(demo: Demo) -> None:
    """A local SparkSession with format ``logstore`` (read and write) and Delta."""
    import spark_source
    from jobs.spark_session import local_session

    started = time.monotonic()
    demo.spark = local_session("logstore-demo", master=demo.master, delta=True)
    spark_source.register(demo.spark)
    demo.console.print(f"Spark {demo.spark.version} on {demo.master} with Delta, in {time.monotonic() - started:.0f}s")


def spark_pipeline(demo: Demo) -> None:
    """orders → per-customer totals → customer-order-stats, exactly once (AvailableNow)."""
    from pyspark.sql import functions as F

    spark = demo.spark
    checkpoint = str((demo.data_dir / "checkpoints" / "order-stats").resolve())
    orders = (spark.readStream.format("logstore")
              .option("logstore.bootstrap.servers", demo.bootstrap)
              .option("subscribe", ORDERS)
              .option("startingOffsets", "earliest")
              .option("maxOffsetsPerTrigger", "1000")
              .load())
    parsed = orders.select(
        "key", F.from_json(F.col("value").cast("string"),
                           "order_id long, customer_id long, item string, quantity int, amount double").alias("o"))

    def each(batch_df: Any, batch_id: int) -> None:
        stats = (batch_df.groupBy("key")
                 .agg(F.count("*").alias("orders"), F.sum("o.quantity").alias("items"),
                      F.round(F.sum("o.amount"), 2).alias("amount"))
                 .select("key", F.to_json(F.struct("orders", "items", "amount")).cast("binary").alias("value")))
        import spark_sink

        spark_sink.write_transactional(stats, batch_id, app_id="demo-order-stats", topic=ORDER_STATS,
                                       bootstrap=demo.bootstrap)

    query = (parsed.writeStream.foreachBatch(each).option("checkpointLocation", checkpoint)
             .trigger(availableNow=True).start())
    query.awaitTermination(600)
    batches = [p["numInputRows"] for p in query.recentProgress if p["numInputRows"]]
    demo.console.print(f"read {sum(batches)} orders in {len(batches)} micro-batches of at most 1000 "
                       f"(maxOffsetsPerTrigger); each batch's totals written to [bold]{ORDER_STATS}[/bold] "
                       "in one transaction (read_committed readers see a batch whole or not at all)")
    stats = (spark.read.format("logstore").option("logstore.bootstrap.servers", demo.bootstrap)
             .option("subscribe", ORDER_STATS).load()
             .select(F.col("key").cast("string").alias("customer"),
                     F.from_json(F.col("value").cast("string"), "orders long, items long, amount double").alias("s"))
             .groupBy("customer").agg(F.sum("s.orders").alias("orders"), F.sum("s.amount").alias("amount"))
             .orderBy(F.desc("amount")))
    table = Table(title=f"top customers, from {ORDER_STATS}", title_justify="left")
    for name in ("customer", "orders", "amount"):
        table.add_column(name, justify="right")
    rows = stats.collect()
    for r in rows[:5]:
        table.add_row(r["customer"], str(r["orders"]), f"{r['amount']:.2f}")
    demo.console.print(table)
    total = sum(r["orders"] for r in rows)
    demo.console.print(f"  orders counted: {total} of {demo.produced[ORDERS]} (each exactly once)")


def compact_customers(demo: Demo) -> None:
    """The Spark compaction job: latest record per key in the closed segments, offsets kept."""
    from compaction.job import run_compaction

    with Admin(demo.bootstrap) as admin:
        before = admin.describe_topics([CUSTOMERS])[CUSTOMERS].partitions[0]
    summary = run_compaction(demo.spark, bootstrap=demo.bootstrap, topic=CUSTOMERS, force=True)
    with Admin(demo.bootstrap) as admin:
        after = admin.describe_topics([CUSTOMERS])[CUSTOMERS].partitions[0]
    removed = summary.records_removed
    demo.console.print(
        f"compacted {len(summary.compacted)} partition(s) of [bold]{CUSTOMERS}[/bold] in "
        f"{summary.duration_s:.1f}s: {removed} superseded records removed; bytes {before.size_bytes} → "
        f"{after.size_bytes}; log end offset still {after.log_end_offset} (offsets are never renumbered)"
    )
    if summary.failed:
        demo.console.print(f"  [red]failed: {[str(r.error) for r in summary.failed]}[/red]")


def materialize_customers(demo: Demo) -> None:
    """A Delta table equal to the latest value per key of ``customers``."""
    from pyspark.sql import functions as F

    from jobs.materialize import materialize

    table = str((demo.data_dir / "views" / "customers").resolve())
    materialize(demo.spark, bootstrap=demo.bootstrap, topic=CUSTOMERS, table=table, available_now=True)
    view = demo.spark.read.format("delta").load(table)
    rows = view.orderBy("customer_id").collect()
    out = Table(title=f"Delta table {table} (first rows)", title_justify="left")
    for name in ("customer_id", "name", "tier", "_offset"):
        out.add_column(name)
    for r in rows[:8]:
        out.add_row(str(r["customer_id"]), r["name"], r["tier"], str(r["_offset"]))
    demo.console.print(out)
    tiers = view.groupBy("tier").count().orderBy("tier").collect()
    deleted = view.filter(F.col("customer_id") == demo.deleted_customer).count() == 0
    demo.console.print(
        f"  {len(rows)} customers (one row per key; customer {demo.deleted_customer} deleted: {deleted}); "
        "tiers: " + ", ".join(f"{r['tier']} {r['count']}" for r in tiers)
    )


def stop_spark(demo: Demo) -> None:
    if demo.spark is not None:
        demo.spark.stop()
        demo.spark = None


# The demo, in order.
STEPS: list[Callable[[Demo], None]] = [
    start_broker,
    create_topics,
    produce_orders,
    produce_customers,
    read_back,
    show_offsets,
    start_spark,
    spark_pipeline,
    compact_customers,
    materialize_customers,
    stop_spark,
]


# --------------------------------------------------------------------------- helpers


def _port_free(host: str, port: int) -> bool:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        try:
            s.bind((host, port))
        except OSError:
            return False
    return True


def _send(demo: Demo, topic: str, table: pa.Table, *, key_column: str | None = None) -> SendBatchResult:
    with Producer(demo.bootstrap) as producer:
        result = producer.send_batch(topic, table, key_column=key_column).result(timeout=60)
    demo.produced[topic] = demo.produced.get(topic, 0) + result.record_count
    return result


def _print_sent(demo: Demo, topic: str, result: SendBatchResult) -> None:
    parts = []
    for tp, batches in sorted(result.by_partition().items()):
        count = sum(b.record_count for b in batches)
        parts.append(f"{tp.partition}: {count} (offsets {batches[0].base_offset}..{batches[-1].end_offset - 1})")
    demo.console.print(f"produced {result.record_count} records to [bold]{topic}[/bold] in "
                       f"{len(result.batches)} batches; by partition: {'; '.join(parts)}")


def _read_all(demo: Demo, topic: str, expected: int) -> dict[TopicPartition, pa.Table]:
    with Admin(demo.bootstrap) as admin:
        n = admin.describe_topics([topic])[topic].num_partitions
    tables: dict[TopicPartition, list[pa.Table]] = {}
    deadline = time.monotonic() + READ_TIMEOUT_S
    count = 0
    with Consumer(demo.bootstrap, auto_offset_reset="earliest") as consumer:
        consumer.assign([TopicPartition(topic, p) for p in range(n)])
        while count < expected:
            if time.monotonic() > deadline:
                raise TimeoutError(f"read {count} of {expected} records of {topic} in {READ_TIMEOUT_S}s")
            for tp, t in consumer.poll_arrow(timeout_ms=500).items():
                tables.setdefault(tp, []).append(t)
                count += t.num_rows
    return {tp: pa.concat_tables(ts) for tp, ts in tables.items()}


def _keys_disjoint(tables: dict[TopicPartition, pa.Table]) -> bool:
    seen: set[bytes] = set()
    for t in tables.values():
        keys = set(pc.unique(t.column("key")).to_pylist())
        if seen & keys:
            return False
        seen |= keys
    return True


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m jobs.demo", description="logstore end to end on one machine.")
    parser.add_argument("--master", default="local[2]",
                        help="Spark master of the Spark steps (default local[2]), e.g. spark://HOST:7077")
    args = parser.parse_args(argv)
    console = Console(highlight=False)
    demo = Demo(console=console, data_dir=DATA_DIR, master=args.master)
    started = time.monotonic()
    try:
        for step in STEPS:
            console.rule(step.__name__.replace("_", " "))
            step(demo)
    finally:
        stop_spark(demo)
        if demo.broker is not None:
            demo.broker.stop()
    console.rule()
    console.print(f"demo finished in {time.monotonic() - started:.1f}s")
    return 0


if __name__ == "__main__":
    sys.exit(main())
