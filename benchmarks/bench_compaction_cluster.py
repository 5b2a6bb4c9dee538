"""Compaction on a Spark standalone cluster: 1 worker vs 2 workers, and Spark on Parquet.

Does the compaction job scale with executors rather than with the driver? One run
starts a Spark standalone master from the pip-installed PySpark
(``tests/support/spark_standalone.py``) and a broker as a child process, produces
``--size`` MB (default 512) of keyed records twice, into topics ``bench-1`` and
``bench-2`` (the same records: :func:`bench_compaction.make_chunks`, 100-byte
values, 10 % distinct keys), with a Parquet copy of them, then:

1. with **one worker** of one core: an untimed warm-up compaction of a small
   topic, then (a1) ``run_compaction(force=True)`` of ``bench-1`` and (b1) Spark
   on the Parquet copy (read, latest offset per (partition, key), join back,
   write Parquet; after an untimed warm-up run);
2. a **second worker** (one core) joins; a new application gets both, and
   the same on ``bench-2``: (a2) and (b2).

MB/s = the bytes of the replaced segments / the wall time (for Parquet the same
logstore bytes, so the rates compare the same work). Printed: the four rates,
the 2-vs-1 speed-up of the job (target >= 1.6x) and of Parquet, our ratio to
Parquet on 2 workers (target >= 2x), the split of each job run into Spark key
scan (executors) and rewrite + swap (the driver streaming to the broker's
ReplaceSegments), and the load average: a loaded machine's numbers are not a
claim (2 cores shared with the driver, the broker and other programs).

Run: ``.venv/bin/python benchmarks/bench_compaction_cluster.py [--size MB] [--partitions N]``
(``make bench-compaction-cluster``).
"""

from __future__ import annotations

import argparse
import logging
import os
import platform
import shutil
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import pyarrow as pa

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "tests" / "support"))
sys.path.insert(0, str(Path(__file__).resolve().parent))

from bench_compaction import KEY_BYTES, NOW_MS, VALUE_BYTES, parquet_compaction, produce  # noqa: E402
from benchutil import cpu_by_role  # noqa: E402
from spark_standalone import SparkStandalone  # noqa: E402

from compaction.job import CompactionSummary, run_compaction  # noqa: E402
from logstore.broker.embedded import EmbeddedBroker  # noqa: E402
from logstore.client.admin import Admin  # noqa: E402

_EXECUTOR_MEMORY = "1536m"
_WORKER_MEMORY = "2g"


def _session(master: str, name: str, executors: int) -> Any:
    """A SparkSession on the cluster, returned once ``executors`` executors registered."""
    from jobs.spark_session import local_session

    spark = local_session(name, master=master, conf={
        "spark.executor.memory": _EXECUTOR_MEMORY, "spark.driver.memory": "2g",
        "spark.sql.shuffle.partitions": "4"})
    deadline = time.monotonic() + 120
    while spark.sparkContext._jsc.sc().getExecutorMemoryStatus().size() - 1 < executors:
        if time.monotonic() > deadline:
            raise TimeoutError(f"{executors} executor(s) did not register")
        time.sleep(0.5)
    return spark


def _warm_up(spark: Any, bootstrap: str, topic: str, partitions: int, parquet_src: str, parquet_dst: str) -> None:
    """Untimed: JIT, Python workers, the executors' first connections (a scheduler's session is long-lived)."""
    with Admin(bootstrap) as admin:
        admin.create_topic(topic, partitions, configs={"cleanup.policy": "compact", "segment.bytes": str(1 << 20)})
    produce(bootstrap, topic, 100_000, 10_000, partitions, None)
    run_compaction(spark, bootstrap=bootstrap, topic=topic, force=True, now_ms=NOW_MS)
    parquet_compaction(spark, parquet_src, parquet_dst)


# Who spends the CPU of the key scan: the command-line word of each kind of process.
_ROLES = {"broker": "logstore.broker", "executor JVMs": "CoarseGrainedExecutorBackend",
          "executor Python": "pyspark.daemon", "driver JVM": "SparkSubmit"}


class _ScanProfile:
    """CPU seconds per role during the key scan (a listener: planned → scanned)."""

    def __init__(self) -> None:
        self.cpu: dict[str, float] = {}
        self._at_plan: dict[str, float] = {}

    def planned(self, plans: Any) -> None:
        self._at_plan = cpu_by_role(_ROLES)

    def scanned(self) -> None:
        now = cpu_by_role(_ROLES)
        self.cpu = {role: now[role] - self._at_plan.get(role, 0.0) for role in now}

    def progress(self, tp: Any, done: int, total: int, removed: int) -> None:
        pass

    def format(self) -> str:
        return ", ".join(f"{role} {s:.1f} s" for role, s in self.cpu.items())


class _Round:
    """One configuration's figures: the job's summary, the Parquet job's seconds, the key scan's
    CPU per role, and the CPU-seconds of every process on the machine during each job."""

    def __init__(self, summary: CompactionSummary, parquet_s: float, profile: _ScanProfile,
                 job_cpu_s: float, parquet_cpu_s: float) -> None:
        self.summary, self.parquet_s, self.profile = summary, parquet_s, profile
        self.job_cpu_s, self.parquet_cpu_s = job_cpu_s, parquet_cpu_s


def _cpu_s() -> float:
    return sum(cpu_by_role(_ROLES).values())


def _round(spark: Any, bootstrap: str, topic: str, parquet_src: str, parquet_dst: str) -> _Round:
    profile = _ScanProfile()
    before = _cpu_s()
    summary = run_compaction(spark, bootstrap=bootstrap, topic=topic, force=True, now_ms=NOW_MS, listener=profile)
    job_cpu_s = _cpu_s() - before
    if not summary.ok or not summary.compacted:
        raise RuntimeError(summary.format())
    before = _cpu_s()
    parquet_s = parquet_compaction(spark, parquet_src, parquet_dst)
    return _Round(summary, parquet_s, profile, job_cpu_s, _cpu_s() - before)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--size", type=int, default=512, help="MB of records per topic (default 512)")
    parser.add_argument("--partitions", type=int, default=2)
    parser.add_argument("--unique", type=float, default=0.10, help="distinct keys / records (default 0.10)")
    parser.add_argument("--data-dir", default=None, help="where the broker, Parquet and Spark dirs go (temp dir)")
    parser.add_argument("--quiet", action="store_true", help="no progress lines")
    args = parser.parse_args(argv)
    logging.basicConfig(level=logging.WARNING if args.quiet else logging.INFO,
                        format="%(asctime)s %(message)s", datefmt="%H:%M:%S", stream=sys.stderr)
    logging.getLogger("py4j").setLevel(logging.WARNING)
    os.environ.setdefault("SPARK_LOCAL_IP", "127.0.0.1")  # the driver, as the workers: loopback

    record_bytes = VALUE_BYTES + KEY_BYTES + 8 + 8 + 4 + 4
    records = args.size * 1_000_000 // record_bytes
    unique = max(1, int(records * args.unique))
    work = tempfile.mkdtemp(prefix="bench-compaction-cluster-", dir=args.data_dir)
    parquet_src = os.path.join(work, "parquet")
    os.makedirs(parquet_src)
    out = os.path.join(work, "parquet-out")
    runs: dict[int, _Round] = {}
    load_before = os.getloadavg()
    try:
        with EmbeddedBroker(os.path.join(work, "broker"), subprocess=True) as broker, \
                SparkStandalone(Path(work) / "spark", workers=1, cores=1, memory=_WORKER_MEMORY) as cluster:
            segment_bytes = max(1 << 20, min(64 << 20, args.size * 1_000_000 // args.partitions // 8))
            with Admin(broker.bootstrap) as admin:
                for topic in ("bench-1", "bench-2"):
                    admin.create_topic(topic, args.partitions, configs={
                        "cleanup.policy": "compact", "segment.bytes": str(segment_bytes)})
            print(f"producing {records:,} records ({args.size} MB, {unique:,} distinct keys) twice into "
                  f"{args.partitions} partition(s)...", file=sys.stderr, flush=True)
            produce(broker.bootstrap, "bench-1", records, unique, args.partitions, parquet_src)
            produce(broker.bootstrap, "bench-2", records, unique, args.partitions, None)
            os.sync()
            for workers in (1, 2):
                if workers == 2:
                    cluster.add_worker()
                spark = _session(cluster.master_url, f"bench-compaction-{workers}w", workers)
                try:
                    _warm_up(spark, broker.bootstrap, f"warmup-{workers}", args.partitions, parquet_src,
                             f"{out}-warmup-{workers}")
                    runs[workers] = _round(spark, broker.bootstrap, f"bench-{workers}", parquet_src,
                                           f"{out}-{workers}")
                finally:
                    spark.stop()
                print(f"{workers} worker(s): job {runs[workers].summary.duration_s:.1f} s, Parquet "
                      f"{runs[workers].parquet_s:.1f} s", file=sys.stderr, flush=True)
    finally:
        shutil.rmtree(work, ignore_errors=True)

    load = os.getloadavg()
    print(f"# bench_compaction_cluster  {platform.machine()}  {os.cpu_count()} cpus  Python "
          f"{platform.python_version()}  pyarrow {pa.__version__}  Spark standalone, workers of 1 core / "
          f"{_WORKER_MEMORY}  load average before {load_before[0]:.1f}, after {load[0]:.1f} {load[1]:.1f} {load[2]:.1f}")
    mb = runs[1].summary.bytes_before / 1e6
    print(f"data: {records:,} records, {unique:,} distinct keys, {args.partitions} partitions, {mb:,.1f} MB of "
          f"segments per topic")
    rate: dict[str, float] = {}
    for workers, run in runs.items():
        summary, parquet_s = run.summary, run.parquet_s
        rate[f"a{workers}"] = summary.bytes_before / 1e6 / summary.duration_s
        rate[f"b{workers}"] = summary.bytes_before / 1e6 / parquet_s
        print(f"{workers} worker(s): (a) compaction job {summary.duration_s:7.2f} s {rate[f'a{workers}']:7.1f} MB/s "
              f"(Spark key scan {summary.scan_s:.2f} s, rewrite + swap on the driver "
              f"{summary.duration_s - summary.scan_s:.2f} s)   (b) Spark on Parquet {parquet_s:7.2f} s "
              f"{rate[f'b{workers}']:7.1f} MB/s")
    for workers, run in runs.items():
        print(f"{workers} worker(s): CPU during the {run.summary.scan_s:.2f} s key scan (of {os.cpu_count()} cores): "
              f"{run.profile.format()}")
    # Per-core efficiency: MB compacted per CPU-second of every process on the machine (broker,
    # driver, executors, their Python workers), whatever the number of cores they had.
    per_cpu: dict[str, float] = {}
    for workers, run in runs.items():
        mb_run = run.summary.bytes_before / 1e6
        per_cpu[f"a{workers}"] = mb_run / run.job_cpu_s
        per_cpu[f"b{workers}"] = mb_run / run.parquet_cpu_s
        print(f"{workers} worker(s): CPU of all processes: (a) job {run.job_cpu_s:6.1f} CPU-s "
              f"{per_cpu[f'a{workers}']:6.1f} MB per CPU-s   (b) Spark on Parquet {run.parquet_cpu_s:6.1f} CPU-s "
              f"{per_cpu[f'b{workers}']:6.1f} MB per CPU-s")
    print(f"MB per CPU-s, 2 vs 1 worker: job {per_cpu['a2'] / per_cpu['a1']:.2f}x, Parquet "
          f"{per_cpu['b2'] / per_cpu['b1']:.2f}x;   job / Parquet: {per_cpu['a1'] / per_cpu['b1']:.2f}x on 1 worker, "
          f"{per_cpu['a2'] / per_cpu['b2']:.2f}x on 2")
    speed_up = rate["a2"] / rate["a1"]
    scan_speed_up = runs[1].summary.scan_s / runs[2].summary.scan_s
    vs_parquet = rate["a2"] / rate["b2"]
    # The run itself keeps both cores busy: only the load before it says whether others did.
    loaded = load_before[0] > 1
    verdict = "not claimed: the machine was loaded before the run (load average > 1)" if loaded else (
        f"speed-up {'met' if speed_up >= 1.6 else 'NOT met'}, vs Parquet {'met' if vs_parquet >= 2 else 'NOT met'}")
    print(f"2 vs 1 worker: job {speed_up:.2f}x (target >= 1.6x; its Spark key scan alone {scan_speed_up:.2f}x), "
          f"Parquet {rate['b2'] / rate['b1']:.2f}x;   job / Parquet on 2 workers: {vs_parquet:.2f}x (target >= 2x), "
          f"on 1 worker {rate['a1'] / rate['b1']:.2f}x;   {verdict}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
