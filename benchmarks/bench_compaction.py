"""Compaction benchmark: the Spark compaction job against in-run baselines (DESIGN §7).

Data: ``--size`` MB (default 1024) of keyed records — 100-byte random values,
16-byte keys drawn uniformly from ``records * --unique`` distinct keys (default
10 %) — produced with the Producer's ``send_batch`` fast path into a compacted
topic of ``--partitions`` partitions (segment.bytes 64 MiB, less for small
runs) on a broker running
as a child process with its data directory on local disk (``--data-dir``,
default a temporary directory).

Measured, in one run:

(a) compaction   :func:`compaction.job.run_compaction` with ``force``: plan,
                 Spark key scan (latest offset per key), rewrite and atomic
                 swap of every closed segment. MB/s = bytes of the replaced
                 segments / wall time of the whole run. An untimed warm-up
                 compaction of a small topic runs first (as for (b)): a
                 scheduler's SparkSession is long-lived;
(b) Spark on Parquet   the same records (partition, offset, timestamp, key,
                 value) in a Parquet copy, "compacted" by Spark the obvious way:
                 read, latest offset per (partition, key), join back, write the
                 survivors as Parquet. MB/s = the same logstore bytes as (a) /
                 its wall time, so the two rates compare the same work;
(c) raw copy     the segment files (before compaction) copied with
                 ``shutil.copyfile`` (read + write of every byte, page cache
                 warm) — an upper bound for any rewrite.

Prints the three rates, the ratios (a)/(b) and (a)/(c), the load average, and
for (a) and (b) the CPU seconds used by every process involved (this process,
the broker child, Spark's JVM and Python workers): on a shared machine the
wall-clock rates move with other programs' load, the CPU cost much less.
Target from the compaction issue: (a) >= 50 MB/s on 2 cores.

Run: ``.venv/bin/python benchmarks/bench_compaction.py [--size MB] [--partitions N]``.
"""

from __future__ import annotations

import argparse
import glob
import logging
import os
import platform
import shutil
import sys
import tempfile
import time

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq

from compaction.job import run_compaction
from logstore.broker.embedded import EmbeddedBroker
from logstore.client.admin import Admin
from logstore.client.producer import Producer

VALUE_BYTES = 100
KEY_BYTES = 16
CHUNK_RECORDS = 200_000
NOW_MS = 1_700_000_000_000


def _binary(rng: np.random.Generator, n: int, width: int) -> pa.Array:
    offsets = np.arange(0, (n + 1) * width, width, dtype=np.int32)
    return pa.Array.from_buffers(pa.binary(), n, [None, pa.py_buffer(offsets), pa.py_buffer(rng.bytes(n * width))])


def make_chunks(records: int, unique: int, partitions: int, seed: int = 1):  # type: ignore[no-untyped-def]
    """Tables of (partition, key, value, timestamp), CHUNK_RECORDS rows each."""
    rng = np.random.default_rng(seed)
    key_table = rng.bytes(unique * KEY_BYTES)
    for start in range(0, records, CHUNK_RECORDS):
        n = min(CHUNK_RECORDS, records - start)
        ids = rng.integers(0, unique, n)
        key_bytes = np.frombuffer(key_table, dtype=np.uint8).reshape(unique, KEY_BYTES)[ids].tobytes()
        keys = pa.Array.from_buffers(
            pa.binary(), n,
            [None, pa.py_buffer(np.arange(0, (n + 1) * KEY_BYTES, KEY_BYTES, dtype=np.int32)), pa.py_buffer(key_bytes)],
        )
        yield pa.table({
            "partition": pa.array((ids % partitions).astype(np.int32)),
            "key": keys,
            "value": _binary(rng, n, VALUE_BYTES),
            "timestamp": pa.array(np.full(n, NOW_MS, dtype=np.int64)),
        })


def produce(bootstrap: str, topic: str, records: int, unique: int, partitions: int,
            parquet_dir: str | None) -> float:
    """Produce the records (and write their Parquet copy, untimed); return produce seconds."""
    next_offset = [0] * partitions
    produce_s = 0.0
    with Producer(bootstrap, acks=1, linger_ms=5, batch_size=1 << 20) as producer:
        for i, table in enumerate(make_chunks(records, unique, partitions)):
            t0 = time.perf_counter()
            producer.send_batch(topic, table)
            produce_s += time.perf_counter() - t0
            if parquet_dir is None:
                continue
            parts = table.column("partition").to_numpy()
            offsets = np.empty(len(parts), dtype=np.int64)
            for p in range(partitions):
                here = parts == p
                count = int(here.sum())
                offsets[here] = np.arange(next_offset[p], next_offset[p] + count)
                next_offset[p] += count
            pq.write_table(table.append_column("offset", pa.array(offsets)),
                           os.path.join(parquet_dir, f"part-{i:05d}.parquet"), compression="none")
        t0 = time.perf_counter()
        producer.flush()
        produce_s += time.perf_counter() - t0
    return produce_s


def warmup(spark, bootstrap: str, partitions: int) -> None:  # type: ignore[no-untyped-def]
    with Admin(bootstrap) as admin:
        admin.create_topic("warmup", partitions, configs={"cleanup.policy": "compact",
                                                          "segment.bytes": str(1 << 20)})
    produce(bootstrap, "warmup", 100_000, 10_000, partitions, None)
    run_compaction(spark, bootstrap=bootstrap, topic="warmup", force=True, now_ms=NOW_MS)


_TICK = os.sysconf("SC_CLK_TCK")


def tree_cpu_s() -> float:
    """CPU seconds (user + system) used so far by this process and every live descendant:
    the broker child, Spark's JVM and its Python workers. A load-independent cost: other
    programs running at the same time do not change it (much)."""
    parent: dict[int, list[int]] = {}
    for name in os.listdir("/proc"):
        if name.isdigit():
            try:
                with open(f"/proc/{name}/stat") as f:
                    fields = f.read().rsplit(")", 1)[1].split()
                parent.setdefault(int(fields[1]), []).append(int(name))
            except OSError:
                pass
    total, todo = 0, [os.getpid()]
    while todo:
        pid = todo.pop()
        try:
            with open(f"/proc/{pid}/stat") as f:
                fields = f.read().rsplit(")", 1)[1].split()
            total += int(fields[11]) + int(fields[12])
        except OSError:
            pass
        todo += parent.get(pid, [])
    return total / _TICK


def parquet_compaction(spark, src: str, dst: str) -> float:  # type: ignore[no-untyped-def]
    from pyspark.sql import functions as F

    t0 = time.perf_counter()
    df = spark.read.parquet(src)
    latest = df.groupBy("partition", "key").agg(F.max("offset").alias("offset"))
    df.join(latest, ["partition", "key", "offset"]).write.mode("overwrite").parquet(dst)
    return time.perf_counter() - t0


def raw_copy(files: list[str], dst_dir: str) -> tuple[float, int]:
    for f in files:  # warm the page cache as (a) found it
        with open(f, "rb") as fh:
            while fh.read(16 << 20):
                pass
    t0 = time.perf_counter()
    total = 0
    for i, f in enumerate(files):
        shutil.copyfile(f, os.path.join(dst_dir, f"{i}.copy"))
        total += os.path.getsize(f)
    return time.perf_counter() - t0, total


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--size", type=int, default=1024, help="MB of records to produce (default 1024)")
    parser.add_argument("--partitions", type=int, default=2)
    parser.add_argument("--unique", type=float, default=0.10, help="distinct keys / records (default 0.10)")
    parser.add_argument("--data-dir", default=None, help="broker data directory (default: a temp dir)")
    parser.add_argument("--master", default="local[2]")
    parser.add_argument("--quiet", action="store_true", help="no progress lines")
    args = parser.parse_args(argv)
    logging.basicConfig(level=logging.WARNING if args.quiet else logging.INFO,
                        format="%(asctime)s %(message)s", datefmt="%H:%M:%S", stream=sys.stderr)
    logging.getLogger("py4j").setLevel(logging.WARNING)

    from jobs.spark_session import local_session

    record_bytes = VALUE_BYTES + KEY_BYTES + 8 + 8 + 4 + 4  # values, keys, offset, timestamp, 2 offsets
    records = args.size * 1_000_000 // record_bytes
    unique = max(1, int(records * args.unique))
    work = tempfile.mkdtemp(prefix="bench-compaction-", dir=args.data_dir)
    data_dir = os.path.join(work, "broker")
    parquet_src, parquet_dst = os.path.join(work, "parquet"), os.path.join(work, "parquet-out")
    copy_dir = os.path.join(work, "copy")
    for d in (parquet_src, copy_dir):
        os.makedirs(d)
    spark = local_session("bench-compaction", master=args.master,
                          conf={"spark.driver.memory": "4g", "spark.sql.shuffle.partitions": "4"})
    try:
        with EmbeddedBroker(data_dir, subprocess=True) as broker:
            with Admin(broker.bootstrap) as admin:
                # Segments of 64 MiB, smaller for small runs: most of the data in closed segments.
                segment_bytes = max(1 << 20, min(64 << 20, args.size * 1_000_000 // args.partitions // 8))
                admin.create_topic("bench", args.partitions, configs={
                    "cleanup.policy": "compact", "segment.bytes": str(segment_bytes),
                    "min.cleanable.dirty.ratio": "0.5",
                })
            print(f"producing {records:,} records ({args.size} MB logical, {unique:,} distinct keys) "
                  f"into {args.partitions} partition(s)...", file=sys.stderr, flush=True)
            produce_s = produce(broker.bootstrap, "bench", records, unique, args.partitions, parquet_src)
            # Measure data at rest: no writeback of the freshly produced gigabyte under (a) or (c).
            os.sync()
            seg_files = sorted(glob.glob(os.path.join(data_dir, "bench-[0-9]*", "*.arrow")))
            stored = sum(os.path.getsize(f) for f in seg_files)
            # (c) raw copy of the same segment files, before they are compacted
            copy_s, copied = raw_copy(seg_files, copy_dir)
            shutil.rmtree(copy_dir, ignore_errors=True)
            # (a) compaction, after an untimed warm-up run on a small topic (JIT, Python
            # workers), as (b) gets a warm-up run: a scheduler's SparkSession is long-lived.
            warmup(spark, broker.bootstrap, args.partitions)
            cpu0 = tree_cpu_s()
            summary = run_compaction(spark, bootstrap=broker.bootstrap, topic="bench", force=True, now_ms=NOW_MS)
            cpu_a = tree_cpu_s() - cpu0
            if not summary.ok or not summary.compacted:
                print(summary.format(), file=sys.stderr)
                return 1
        # (b) Spark on a Parquet copy of the same records
        parquet_compaction(spark, parquet_src, parquet_dst + "-warmup")  # JIT / caches, untimed
        cpu0 = tree_cpu_s()
        parquet_s = parquet_compaction(spark, parquet_src, parquet_dst)
        cpu_b = tree_cpu_s() - cpu0
        parquet_bytes = sum(os.path.getsize(f) for f in glob.glob(os.path.join(parquet_src, "*.parquet")))
    finally:
        spark.stop()
        shutil.rmtree(work, ignore_errors=True)

    mb = summary.bytes_before / 1e6
    a = mb / summary.duration_s
    b = mb / parquet_s
    c = copied / 1e6 / copy_s
    load = os.getloadavg()
    print(f"# bench_compaction  {platform.machine()}  {os.cpu_count()} cpus  Python {platform.python_version()}  "
          f"pyarrow {pa.__version__}  Spark master {args.master}  load average {load[0]:.1f} {load[1]:.1f} {load[2]:.1f}")
    print(f"data: {records:,} records, {unique:,} distinct keys ({args.unique:.0%}), {args.partitions} partitions, "
          f"{stored / 1e6:,.1f} MB of segments (produced at {stored / 1e6 / produce_s:,.0f} MB/s); "
          f"Parquet copy {parquet_bytes / 1e6:,.1f} MB")
    print(f"compacted: {mb:,.1f} MB in {sum(r.segments_before for r in summary.partitions)} segments -> "
          f"{summary.bytes_after / 1e6:,.1f} MB in {sum(r.segments_after for r in summary.partitions)}; "
          f"{summary.records_removed:,} of {summary.records_before:,} records removed")
    print(f"(a) compaction job        {summary.duration_s:7.2f} s  {a:8.1f} MB/s   "
          f"(Spark key scan {summary.scan_s:.2f} s, rewrite + swap {summary.duration_s - summary.scan_s:.2f} s; "
          f"{cpu_a:.1f} CPU-s, {mb / cpu_a:.1f} MB per CPU-s)")
    print(f"(b) Spark on Parquet copy {parquet_s:7.2f} s  {b:8.1f} MB/s   (same records: read, latest per key, "
          f"join, write; {cpu_b:.1f} CPU-s, {mb / cpu_b:.1f} MB per CPU-s)")
    print(f"(c) raw file copy         {copy_s:7.2f} s  {c:8.1f} MB/s   ({copied / 1e6:,.1f} MB)")
    print(f"ratios: (a)/(b) = {a / b:.2f} by wall time, {cpu_b / cpu_a:.2f} by CPU time   (a)/(c) = {a / c:.3f}   "
          f"target (a) >= 50 MB/s: {'met' if a >= 50 else 'NOT met'}"
          f"{'' if a >= 50 else f' (CPU-bound estimate on 2 idle cores: {2 * mb / cpu_a:.0f} MB/s)'}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
