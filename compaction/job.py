"""The compaction job: when and where. Plans, computes the latest record per key with
Spark, and has the broker swap compacted segments in, partition by partition.

Entry points:

* :func:`run_compaction` — what the scheduler and the ``logstore jobs compact``
  verb call; returns a :class:`CompactionSummary` and never raises for a
  partition that could not be compacted (it is in the summary, marked
  retriable when simply running again later may succeed);
* :func:`main` — ``spark-submit compaction/job.py --bootstrap H:P --topic T``
  or ``python -m compaction.job ...``: runs one compaction, prints the
  summary (a table, or JSON with ``--format json``), exits 0 when every
  planned partition was compacted, 1 otherwise.

Steps of a run:

1. **Plan** (:func:`compaction.planner.plan_cleaning`): partitions whose dirty
   ratio reaches ``min.cleanable.dirty.ratio`` (all with cleanable segments
   when ``force``), each with the closed segments below its cleanable end offset.
2. **Latest offset per key, with Spark.** The planned ranges are cut into
   Spark tasks (two per core, 8 to 64 MiB each, at segment boundaries;
   large segments are split by offsets). Each task reads its range from the
   broker as stored batches and emits only ``(partition, kind, key, v)`` rows
   (:func:`compaction.scan.key_rows`: ``v = offset * 2 + expired-tombstone``,
   values never reach the JVM), already reduced to ``max(v)`` per key of the
   task with Arrow's hash aggregation; Spark groups by ``(partition, kind,
   key)`` and keeps ``max(v)`` — a hash aggregate over longs — then drops
   expired tombstones; the driver collects the surviving ``(partition, kind,
   offset)`` rows as Arrow. The whole range below the cleanable end is
   scanned, clean and dirty parts alike: a key updated in the dirty part
   removes its older copy in the clean part.
3. **Rewrite and swap** (:func:`compaction.cleaner.clean_partition`): per
   partition (several in parallel threads), stream the compacted batches to
   the broker's ``ReplaceSegments``, which validates them and swaps them in
   atomically.

Progress: log lines on the ``logstore.compaction`` logger (``main`` prints
them to stderr): the plan, the Spark stage, and per partition at most one
line every few seconds with the share read and the records removed, then a
line per finished partition and one line for the run. A caller that draws
its own progress (``logstore jobs compact`` on a terminal, :mod:`jobs.progress`)
passes a :class:`CompactionListener`, which replaces the per-partition
percentage lines. The summary table is the caller's to print, once.

Failure and retry: a run that fails or is killed at any point changes
nothing it did not finish swapping (see :mod:`logstore.storage.segment_replacement`); nothing
is left marked or locked, so the next run plans again from scratch.

Known limits: the surviving offsets of a run are collected on the driver (8
bytes per distinct key of the compacted partitions); the rewrite streams
through the driver (one connection per partition in parallel).

Thread-safety: one run at a time per SparkSession is expected; a run is
safe against concurrent producers, consumers and other compaction runs
(a conflicting swap is refused and reported retriable).
"""

from __future__ import annotations

import argparse
import json
import logging
import math
import os
import sys
import time
from collections.abc import Callable, Iterator, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from typing import Any, Protocol

import pyarrow as pa

from compaction.cleaner import PartitionResult, clean_followers, clean_partition
from compaction.planner import PartitionPlan, Skipped, Survivors, plan_cleaning, survivors_from_rows
from compaction.scan import KEY_ROWS_DDL, KEY_ROWS_SCHEMA, KIND_PRODUCER, iter_range, key_rows
from logstore.byte_sizes import human_bytes
from logstore.client.rpc import BrokerClient
from logstore.client.security import ClientSecurity
from logstore.errors import LogstoreError
from logstore.types import TopicPartition

__all__ = ["CompactionListener", "CompactionSummary", "run_compaction", "compute_survivors", "scan_tasks",
           "main"]


log = logging.getLogger("logstore.compaction")

# Scan tasks: a partition is split only as far as the executors' cores need (see _task_bytes),
# never below this many bytes a task.
_TASK_BYTES_MIN = 8 << 20
_ROWS_PER_ARROW_BATCH = 1 << 16
_PRE_AGGREGATE_ROWS = 1 << 21
_READ_TIMEOUT_MS = 600_000
_PROGRESS_EVERY_S = 5.0


# --------------------------------------------------------------------------- summary


@dataclass(frozen=True, slots=True)
class CompactionSummary:
    """The outcome of one :func:`run_compaction`.

    ``partitions``: one result per planned partition (``error`` None when it
    was compacted); ``skipped``: partitions not planned, with the reason;
    ``scan_s``: the Spark stage; ``duration_s``: the whole run.
    """

    topic: str
    partitions: tuple[PartitionResult, ...]
    skipped: tuple[Skipped, ...]
    duration_s: float
    scan_s: float
    now_ms: int

    @property
    def compacted(self) -> tuple[PartitionResult, ...]:
        return tuple(r for r in self.partitions if r.error is None)

    @property
    def failed(self) -> tuple[PartitionResult, ...]:
        return tuple(r for r in self.partitions if r.error is not None)

    @property
    def ok(self) -> bool:
        """True when every planned partition was compacted (also when none was planned)."""
        return not self.failed

    @property
    def bytes_before(self) -> int:
        return sum(r.bytes_before for r in self.compacted)

    @property
    def bytes_after(self) -> int:
        return sum(r.bytes_after for r in self.compacted)

    @property
    def records_before(self) -> int:
        return sum(r.records_before for r in self.compacted)

    @property
    def records_removed(self) -> int:
        return sum(r.records_removed for r in self.compacted)

    @property
    def throughput_mb_s(self) -> float:
        """Replaced bytes per second of the whole run (MB = 10**6 bytes)."""
        return self.bytes_before / 1e6 / self.duration_s if self.duration_s > 0 else 0.0

    def to_dict(self) -> dict[str, Any]:
        """A JSON-able form (for ``--format json`` and schedulers)."""
        return {
            "topic": self.topic,
            "ok": self.ok,
            "duration_s": round(self.duration_s, 3),
            "scan_s": round(self.scan_s, 3),
            "bytes_before": self.bytes_before,
            "bytes_after": self.bytes_after,
            "records_before": self.records_before,
            "records_removed": self.records_removed,
            "partitions": [
                {"partition": r.partition, "ok": r.error is None, "error": r.error, "retriable": r.retriable,
                 "segments_before": r.segments_before, "segments_after": r.segments_after,
                 "bytes_before": r.bytes_before, "bytes_after": r.bytes_after,
                 "records_before": r.records_before, "records_removed": r.records_removed,
                 "duration_s": round(r.duration_s, 3)}
                for r in self.partitions
            ],
            "skipped": [{"partition": s.partition, "reason": s.reason} for s in self.skipped],
        }

    def format(self) -> str:
        """A plain-text report for people."""
        lines = [f"compaction of {self.topic!r}: {len(self.compacted)} partition(s) compacted, "
                 f"{len(self.failed)} failed, {len(self.skipped)} skipped, in {self.duration_s:.1f} s "
                 f"(Spark key scan {self.scan_s:.1f} s)"]
        if self.partitions:
            lines.append(f"  {'partition':>9} {'segments':>11} {'size before':>11} {'size after':>10} "
                         f"{'records':>10} {'removed':>10} {'seconds':>8}  result")
            for r in self.partitions:
                lines.append(
                    f"  {r.partition:>9} {f'{r.segments_before}->{r.segments_after}':>11} "
                    f"{human_bytes(r.bytes_before):>11} {human_bytes(r.bytes_after):>10} {r.records_before:>10} "
                    f"{r.records_removed:>10} {r.duration_s:>8.1f}  "
                    + ("ok" if r.error is None else
                       f"{'retry later' if r.retriable else 'FAILED'}: {r.error}")
                )
        for s in self.skipped:
            lines.append(f"  partition {s.partition} skipped: {s.reason}")
        if self.compacted:
            lines.append(f"  total: {human_bytes(self.bytes_before)} -> {human_bytes(self.bytes_after)}, "
                         f"{self.records_removed} of {self.records_before} records removed, "
                         f"{self.throughput_mb_s:.1f} MB/s")
        return "\n".join(lines)


# --------------------------------------------------------------------------- the Spark stage


def scan_tasks(plans: Sequence[PartitionPlan], *, task_bytes: int) -> list[tuple[int, int, int]]:
    """``(partition, start, end)`` offset ranges of about ``task_bytes`` each covering
    every plan's ``[start_offset, end_offset)``: cut at segment boundaries, a larger
    segment split evenly by offsets, consecutive small ones merged."""
    tasks: list[tuple[int, int, int]] = []
    for plan in plans:
        pieces: list[tuple[int, int, int]] = []  # (start, end, bytes)
        bounds = [s.base_offset for s in plan.segments[1:]] + [plan.end_offset]
        for seg, seg_end in zip(plan.segments, bounds, strict=True):
            start = max(seg.base_offset, plan.start_offset)
            if start >= seg_end:
                continue
            n = max(1, math.ceil(seg.size_bytes / task_bytes))
            step = math.ceil((seg_end - start) / n)
            for s in range(start, seg_end, step):
                pieces.append((s, min(s + step, seg_end), seg.size_bytes // n))
        current: list[int] | None = None  # [start, end, bytes]
        for start, end, size in pieces:
            if current is not None and current[2] + size <= task_bytes:
                current[1], current[2] = end, current[2] + size
                continue
            if current is not None:
                tasks.append((plan.partition, current[0], current[1]))
            current = [start, end, size]
        if current is not None:
            tasks.append((plan.partition, current[0], current[1]))
    return tasks


def _scan_function(
    bootstrap: str, topic: str, tasks: list[tuple[int, int, int]], horizons: dict[int, int],
    security: ClientSecurity | None = None,
) -> Callable[[Iterator[pa.RecordBatch]], Iterator[pa.RecordBatch]]:
    """The ``mapInArrow`` function of the key scan: task ids in, key rows out. The
    connection settings (``security`` included) travel in the function to the executors."""

    def scan(ids: Iterator[pa.RecordBatch]) -> Iterator[pa.RecordBatch]:
        with BrokerClient(bootstrap, security=security) as client:
            for id_batch in ids:
                for task_id in id_batch.column(0).to_pylist():
                    partition, start, end = tasks[task_id]
                    reduced: pa.Table | None = None
                    pending: list[pa.RecordBatch] = []
                    rows = 0
                    for batch in iter_range(client, TopicPartition(topic, partition), start, end,
                                            timeout_ms=_READ_TIMEOUT_MS):
                        for part in key_rows(batch, start=start, end=end, partition=partition,
                                             tombstone_horizon_ms=horizons[partition]):
                            pending.append(part)
                            rows += part.num_rows
                        if rows >= _PRE_AGGREGATE_ROWS:
                            reduced = _max_per_key(reduced, pending)
                            pending, rows = [], 0
                    if pending or reduced is not None:
                        yield from _max_per_key(reduced, pending).to_batches(_ROWS_PER_ARROW_BATCH)

    return scan


def _task_bytes(size: int, share: float) -> int:
    """Bytes per scan task for a partition range of ``size`` bytes: as many tasks as it holds
    cores' ``share``s (rounded, at least one), with 25 % slack so that segment boundaries do not
    leave a small extra task. Every task sends the JVM one row per distinct key it saw, and a
    partition's keys are its own, so each extra task of a partition repeats most of its keys:
    fixed 64 MB tasks made 8 tasks of 512 MB in 2 partitions where 2 do (bench_compaction_cluster:
    key scan on one 1-core worker 6.1 s then, 3.5 s now)."""
    pieces = max(1, round(size / share))
    return math.ceil(size / pieces * 1.25)


def _max_per_key(reduced: pa.Table | None, batches: list[pa.RecordBatch]) -> pa.Table:
    """``max(v)`` per ``(partition, kind, key)`` of ``reduced`` and ``batches`` with Arrow's
    hash aggregation: the task's share of the Spark aggregation, done before the rows
    reach the JVM (max is associative, so Spark's final max is unchanged)."""
    table = pa.Table.from_batches(batches, schema=KEY_ROWS_SCHEMA)
    if reduced is not None:
        table = pa.concat_tables([reduced, table])
    out = table.group_by(["partition", "kind", "key"], use_threads=False).aggregate([("v", "max")])
    return out.rename_columns(["partition", "kind", "key", "v"]).cast(KEY_ROWS_SCHEMA)


def compute_survivors(spark: Any, *, bootstrap: str, plans: Sequence[PartitionPlan],
                      security: ClientSecurity | None = None) -> dict[int, Survivors]:
    """The survivors of every plan's range, computed with Spark (step 2 of the module docstring)."""
    from pyspark.sql import functions as F

    if not plans:
        return {}
    topics = {p.topic for p in plans}
    if len(topics) != 1:
        raise ValueError(f"plans of one topic at a time, got {sorted(topics)}")
    total = sum(p.size_bytes for p in plans)
    parallelism = max(1, spark.sparkContext.defaultParallelism)
    share = max(total / parallelism, _TASK_BYTES_MIN)  # one core's share of the bytes
    tasks = [t for plan in plans for t in scan_tasks([plan], task_bytes=_task_bytes(plan.size_bytes, share))]
    horizons = {p.partition: p.tombstone_horizon_ms for p in plans}
    log.info("scanning the keys of %d partition(s), %.1f MB, in %d Spark task(s)",
             len(plans), total / 1e6, len(tasks))
    fn = _scan_function(bootstrap, plans[0].topic, tasks, horizons, security)
    rows = spark.range(0, len(tasks), 1, len(tasks)).mapInArrow(fn, KEY_ROWS_DDL)
    latest = (
        rows.groupBy("partition", "kind", "key").agg(F.max("v").alias("v"))
        .where((F.col("kind") == KIND_PRODUCER) | ((F.col("v") % 2) == 0))
        .select("partition", "kind", F.shiftright(F.col("v"), 1).alias("offset"))
    )
    return survivors_from_rows(latest.toArrow())


# --------------------------------------------------------------------------- the run


class CompactionListener(Protocol):
    """Follows a run, e.g. to draw a progress bar; called from the run's threads.

    ``planned`` once with the partitions to compact (before the Spark key
    scan), ``scanned`` once after it, then ``progress`` per partition from the
    rewrite threads (bytes read of the partition's planned bytes, records
    removed so far; ``done == total`` once at the end of a partition).
    Implementations must be thread-safe and must not raise.
    """

    def planned(self, plans: Sequence[PartitionPlan]) -> None: ...

    def scanned(self) -> None: ...

    def progress(self, tp: TopicPartition, done: int, total: int, removed: int) -> None: ...


class _Progress:
    """Per-partition progress as rate-limited log lines (when no listener draws it)."""

    def __init__(self) -> None:
        self._last: dict[TopicPartition, float] = {}

    def __call__(self, tp: TopicPartition, done: int, total: int, removed: int) -> None:
        now = time.monotonic()
        if done < total and now - self._last.get(tp, 0.0) < _PROGRESS_EVERY_S:
            return
        self._last[tp] = now
        log.info("%s: %3.0f%% (%.1f of %.1f MB read), %d records removed so far",
                 tp, 100 * min(done / total, 1.0), done / 1e6, total / 1e6, removed)


def _failed(plan: PartitionPlan, error: str, retriable: bool) -> PartitionResult:
    n = len(plan.segments)
    return PartitionResult(
        topic=plan.topic, partition=plan.partition, segments_before=n, segments_after=n,
        bytes_before=plan.size_bytes, bytes_after=plan.size_bytes, records_before=0, records_after=0,
        duration_s=0.0, error=error, retriable=retriable,
    )


def run_compaction(
    spark: Any,
    *,
    bootstrap: str,
    topic: str,
    partitions: Sequence[int] | None = None,
    force: bool = False,
    now_ms: int | None = None,
    listener: CompactionListener | None = None,
    security: ClientSecurity | None = None,
) -> CompactionSummary:
    """Compact the partitions of ``topic`` that need it; see the module docstring.

    ``partitions`` restricts the run (default: all); ``force`` compacts every
    partition with cleanable segments whatever its dirty ratio; ``now_ms``
    (default: now) is the clock for ``delete.retention.ms`` and
    ``min.compaction.lag.ms``; ``listener`` follows the run (see
    :class:`CompactionListener`); ``security`` is how the driver and the
    executors connect to a secured broker (TLS, SCRAM). Logs one line for the whole run; printing
    the summary (:meth:`CompactionSummary.format`) is the caller's. Raises only for a bad request (e.g.
    :class:`UnknownTopicOrPartitionError`, or a broker that cannot be reached
    while planning); per-partition failures are in the summary.
    """
    started = time.monotonic()
    now = int(time.time() * 1000) if now_ms is None else now_ms
    with BrokerClient(bootstrap, security=security) as client:
        plans, skipped = plan_cleaning(client, [topic], partitions=partitions, force=force, now_ms=now,
                                       security=security)
        for s in skipped:
            log.info("%s-%d: skipped: %s", s.topic, s.partition, s.reason)
        if not plans:
            log.info("nothing to compact in %r", topic)
            return CompactionSummary(topic, (), tuple(skipped), time.monotonic() - started, 0.0, now)
        for p in plans:
            log.info("%s-%d: compacting %d segment(s), %.1f MB below offset %d (dirty ratio %.2f)",
                     p.topic, p.partition, len(p.segments), p.size_bytes / 1e6, p.end_offset, p.dirty_ratio)
        if listener is not None:
            listener.planned(plans)
        scan_started = time.monotonic()
        try:
            survivors = compute_survivors(spark, bootstrap=bootstrap, plans=plans, security=security)
        except Exception as e:  # noqa: BLE001 - a failed Spark stage fails this run's partitions only
            retriable = any(code in str(e) for code in ("COMPACTION_CONFLICT", "BROKER_NOT_AVAILABLE",
                                                         "REQUEST_TIMED_OUT", "LOG_OFFLINE"))
            message = f"the Spark key scan failed: {str(e).strip().splitlines()[0][:500]}"
            log.error("%s", message)
            return CompactionSummary(topic, tuple(_failed(p, message, retriable) for p in plans),
                                     tuple(skipped), time.monotonic() - started,
                                     time.monotonic() - scan_started, now)
        scan_s = time.monotonic() - scan_started
        log.info("latest offsets per key computed in %.1f s: %d records survive",
                 scan_s, sum(len(s.keep_offsets) for s in survivors.values()))
        if listener is not None:
            listener.scanned()
        progress = _Progress() if listener is None else listener.progress

        def clean(plan: PartitionPlan) -> PartitionResult:
            kept = survivors.get(plan.partition, Survivors.empty())
            result = clean_partition(client, plan, kept, progress=progress)
            if result.error is None:
                for problem in clean_followers(client, plan, kept, security=security):
                    log.warning("%s-%d: %s (the next run compacts it)", plan.topic, plan.partition, problem)
                log.info("%s-%d: done: %s -> %s, %d of %d records removed, %.1f s",
                         plan.topic, plan.partition, human_bytes(result.bytes_before), human_bytes(result.bytes_after),
                         result.records_removed, result.records_before, result.duration_s)
            else:
                log.warning("%s-%d: not compacted (%s): %s", plan.topic, plan.partition,
                            "will be retried" if result.retriable else "failed", result.error)
            return result

        with ThreadPoolExecutor(max_workers=min(4, len(plans)), thread_name_prefix="compaction") as pool:
            results = list(pool.map(clean, plans))
    summary = CompactionSummary(topic, tuple(sorted(results, key=lambda r: r.partition)), tuple(skipped),
                                time.monotonic() - started, scan_s, now)
    # One line: the summary table itself is printed by the caller (printing it here too
    # showed it twice on a terminal, once on stderr and once on stdout).
    log.info("%s", summary.format().splitlines()[0])
    return summary


# --------------------------------------------------------------------------- main


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="compaction.job", description="Compact a logstore topic (latest record per key) with Spark.")
    parser.add_argument("--bootstrap", default=os.environ.get("LOGSTORE_BOOTSTRAP", "127.0.0.1:9392"),
                        help="HOST:PORT of a broker (default $LOGSTORE_BOOTSTRAP or 127.0.0.1:9392)")
    parser.add_argument("--topic", required=True)
    parser.add_argument("--partition", type=int, action="append", dest="partitions",
                        help="compact only this partition (repeatable)")
    parser.add_argument("--force", action="store_true",
                        help="compact partitions whose dirty ratio is below min.cleanable.dirty.ratio too")
    parser.add_argument("--now-ms", type=int, default=None, help=argparse.SUPPRESS)
    parser.add_argument("--master", default=None,
                        help="Spark master when not run by spark-submit (default local[*])")
    parser.add_argument("--format", choices=("table", "json"), default="table")
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    """Run one compaction from the command line; see the module docstring."""
    args = _parser().parse_args(argv)
    logging.basicConfig(level=os.environ.get("LOGSTORE_LOG_LEVEL", "INFO"),
                        format="%(asctime)s %(levelname)s %(name)s: %(message)s", stream=sys.stderr)
    logging.getLogger("py4j").setLevel(logging.WARNING)
    os.environ.setdefault("PYSPARK_PYTHON", sys.executable)
    from pyspark.sql import SparkSession

    builder = SparkSession.builder.appName(f"logstore-compaction-{args.topic}")
    if args.master:
        builder = builder.master(args.master)
    spark = builder.getOrCreate()
    try:
        summary = run_compaction(spark, bootstrap=args.bootstrap, topic=args.topic,
                                 partitions=args.partitions, force=args.force, now_ms=args.now_ms)
    except LogstoreError as e:
        print(f"error: {e}", file=sys.stderr)
        return 2
    if args.format == "json":
        print(json.dumps(summary.to_dict(), indent=2))
    else:
        print(summary.format())
    return 0 if summary.ok else 1


if __name__ == "__main__":
    sys.exit(main())
