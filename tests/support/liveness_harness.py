"""Liveness under faults (issue 22): clients that recover by themselves, on a 3-broker cluster.

:mod:`cluster_harness` proves that nothing acknowledged is lost; its writer replaces a
producer whose send failed, as an application would have to when a producer stays stuck.
This harness keeps **one** producer of each kind for the whole run and measures how long
each was unable to write after a fault healed:

* :class:`TimedWriter` — the idempotent ``acks=all`` writer of :mod:`cluster_harness`, never
  replaced (``renew_producer=False``), with the time of every acknowledgement;
* :class:`TxnWriter` — one transactional producer writing transactions of a few records to a
  second topic, aborting after an error and going on with the same producer; it remembers
  each transaction's values and outcome (committed, aborted, unknown) and when commits
  returned;
* :class:`GroupReader` — a consumer in a group (``read_committed``, auto commit) reading the
  writer's topic, remembering every value it was given;
* :func:`stalls` — for each healed fault, how long until the next acknowledged write of each
  partition (or the next commit): the worst is what "unable to write" measured.

:func:`run_liveness` wires them with :class:`cluster_harness.Nemesis` (leader and
coordinator SIGKILLs, SIGSTOPs past the session, cut links) and checks, besides the stall
bound: every acknowledged record once at its offset (:func:`cluster_harness.check_reads`),
every committed transaction whole and no aborted one visible under ``read_committed``, and
the group given every acknowledged record.

Thread-safety: the writers, the reader and the nemesis are threads of their own; everything
else runs in the controlling thread.
"""

from __future__ import annotations

import threading
import time
from collections import Counter
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from cluster_harness import (
    CheckResult,
    Fault,
    Log,
    Nemesis,
    Writer,
    _quiet,
    check_reads,
    compare_replicas,
    create_topic,
    read_everything,
    wait_fully_replicated,
)

from logstore import Consumer, Producer
from logstore._proto import logstore_pb2 as pb
from logstore.dev.local_cluster import LocalCluster
from logstore.errors import LogstoreError

__all__ = ["TimedWriter", "TxnWriter", "GroupReader", "Stall", "stalls", "LivenessReport", "run_liveness"]


class TimedWriter(Writer):
    """:class:`cluster_harness.Writer` with one producer for the run and ack times."""

    def __init__(self, bootstrap: str, topic: str, partitions: int, **kw: Any) -> None:
        super().__init__(bootstrap, topic, partitions, renew_producer=False, **kw)
        self.ack_times: dict[int, list[float]] = {p: [] for p in range(partitions)}

    def _on_delivery(self, value: bytes) -> Callable[[Exception | None, Any], None]:
        record = super()._on_delivery(value)

        def done(error: Exception | None, metadata: Any) -> None:
            if error is None:
                with self._lock:
                    self.ack_times[metadata.partition].append(time.monotonic())
            record(error, metadata)
        return done


@dataclass
class Txn:
    values: list[bytes]
    outcome: str = "open"  # committed | aborted | unknown (the commit raised: either may be true)
    error: str = ""


class TxnWriter(threading.Thread):
    """One transactional producer for the whole run: transactions of ``size`` records to the
    partitions of ``topic``; after an error it aborts and goes on with the same producer."""

    def __init__(self, bootstrap: str, topic: str, partitions: int, *, transactional_id: str,
                 size: int = 4, pause_s: float = 0.02, log: Log = _quiet, **producer_config: Any) -> None:
        super().__init__(name="harness-txn-writer", daemon=True)
        self.bootstrap, self.topic, self.partitions, self.size = bootstrap, topic, partitions, size
        self.transactional_id, self.pause_s, self.log = transactional_id, pause_s, log
        self.producer_config = {"request_timeout_ms": 5_000, "delivery_timeout_ms": 30_000, **producer_config}
        self.txns: list[Txn] = []
        self.commit_times: list[float] = []
        self.fatal: list[str] = []  # errors after which the producer could not go on (must stay empty)
        self._stopping = threading.Event()
        self.error: BaseException | None = None

    def run(self) -> None:
        try:
            self._run()
        except BaseException as e:  # surfaced by stop()
            self.error = e

    def _run(self) -> None:
        producer = Producer(self.bootstrap, transactional_id=self.transactional_id, **self.producer_config)
        try:
            producer.init_transactions()
            seq = 0
            while not self._stopping.is_set():
                txn = Txn([b"t%09d" % (seq + i) for i in range(self.size)])
                seq += self.size
                self.txns.append(txn)
                try:
                    producer.begin_transaction()
                    for i, value in enumerate(txn.values):
                        producer.send(self.topic, value, partition=(seq + i) % self.partitions)
                except LogstoreError as e:
                    self._abort(producer, txn, f"send: {e}")
                    continue
                try:
                    producer.commit_transaction()
                except LogstoreError as e:
                    txn.outcome, txn.error = "unknown", f"commit: {e}"
                    self._abort(producer, txn, None)
                    continue
                txn.outcome = "committed"
                self.commit_times.append(time.monotonic())
                self._stopping.wait(self.pause_s)
        finally:
            producer.close(timeout=35)

    def _abort(self, producer: Producer, txn: Txn, error: str | None) -> None:
        if error is not None:
            txn.outcome, txn.error = "aborted", error
        deadline = time.monotonic() + 30
        while True:
            try:
                producer.abort_transaction()
                break
            except LogstoreError as e:
                if e.retriable and time.monotonic() < deadline:  # as Kafka's docs say: safe to retry
                    self._stopping.wait(0.2)
                    continue
                # The producer cannot go on: the harness records it (the check fails) and stops.
                self.fatal.append(f"abort after {txn.error}: {type(e).__name__}: {e}")
                self.log(f"txn writer: abort failed, the producer is stuck: {e}")
                self._stopping.set()
                break
        self._stopping.wait(0.1)

    def stop(self, timeout_s: float = 60.0) -> None:
        self._stopping.set()
        self.join(timeout_s)
        if self.is_alive():
            raise TimeoutError(f"the transactional writer did not stop within {timeout_s} s")
        if self.error is not None:
            raise self.error


class GroupReader(threading.Thread):
    """A consumer of group ``group_id`` on ``topic`` (read_committed, auto commit)."""

    def __init__(self, bootstrap: str, topic: str, *, group_id: str) -> None:
        super().__init__(name="harness-group-reader", daemon=True)
        self.bootstrap, self.topic, self.group_id = bootstrap, topic, group_id
        self.values: set[bytes] = set()
        self._lock = threading.Lock()
        self._stopping = threading.Event()
        self.error: BaseException | None = None

    def run(self) -> None:
        try:
            with Consumer(self.bootstrap, group_id=self.group_id, subscribe=[self.topic],
                          auto_offset_reset="earliest", auto_commit_interval_ms=1000,
                          request_timeout_ms=5_000) as consumer:
                while not self._stopping.is_set():
                    try:
                        records = consumer.poll(timeout=0.5)
                    except LogstoreError:
                        continue  # retriable trouble during a fault: poll again
                    with self._lock:
                        self.values.update(r.value for r in records if isinstance(r.value, bytes))
        except BaseException as e:  # surfaced by stop()
            self.error = e

    def seen(self) -> set[bytes]:
        with self._lock:
            return set(self.values)

    def stop(self, timeout_s: float = 30.0) -> None:
        self._stopping.set()
        self.join(timeout_s)
        if self.error is not None:
            raise self.error


@dataclass(frozen=True)
class Stall:
    """After ``fault`` healed, ``what`` (a partition, or the transactions) went ``seconds``
    without an acknowledged write (or a commit)."""

    fault: Fault
    what: str
    seconds: float


def stalls(faults: Sequence[Fault], t0: float, times: Mapping[str, Sequence[float]], *, until: float) -> list[Stall]:
    """For every fault (times relative to ``t0``, a monotonic instant) and every series of
    success times in ``times``: how long from the fault's end to the series' next success, but
    no longer than until the next fault began (from then on the next fault's own stall counts:
    the cluster was not healthy) or ``until`` (the end of the run)."""
    out = []
    for i, fault in enumerate(faults):
        healed = t0 + fault.ended
        cut = min(until, t0 + faults[i + 1].started) if i + 1 < len(faults) else until
        for what, series in times.items():
            after = [t for t in series if t >= healed]
            out.append(Stall(fault, what, min(min(after) if after else cut, cut) - healed))
    return out


@dataclass
class LivenessReport:
    faults: list[Fault]
    result: CheckResult
    worst: list[Stall]  # the longest stall of each series, longest first
    bound_s: float
    txns: Counter[str]
    txn_problems: list[str] = field(default_factory=list)
    group_missing: int = 0
    fatal: list[str] = field(default_factory=list)
    seconds: float = 0.0

    @property
    def stuck(self) -> list[Stall]:
        return [s for s in self.worst if s.seconds > self.bound_s]

    @property
    def ok(self) -> bool:
        return (self.result.ok and not self.stuck and not self.txn_problems and not self.group_missing
                and not self.fatal)

    def summary(self) -> str:
        kinds = Counter(f.kind for f in self.faults)
        longest = self.worst[0] if self.worst else None
        return (f"faults run {len(self.faults)} ({', '.join(f'{k} {c}' for k, c in sorted(kinds.items()))}); "
                f"{self.result.summary()}; transactions {dict(sorted(self.txns.items()))}, "
                f"{len(self.txn_problems)} not whole or visible when aborted; group missed "
                f"{self.group_missing}; fatal producer errors {len(self.fatal)}; longest stall after a "
                f"heal {longest.seconds if longest else 0:.1f} s ({longest.what if longest else '-'}), "
                f"bound {self.bound_s:g} s, {len(self.stuck)} over it; {self.seconds:.0f} s")


def check_transactions(txns: Sequence[Txn], read: Mapping[int, Mapping[int, bytes]]) -> list[str]:
    """Committed transactions whole, aborted ones invisible, unknown ones all or nothing, no
    value twice, in a ``read_committed`` read of the transactions' topic."""
    counts = Counter(v for part in read.values() for v in part.values())
    problems = [f"{v!r} read {c} times" for v, c in counts.items() if c > 1]
    for txn in txns:
        present = sum(1 for v in txn.values if v in counts)
        if txn.outcome == "committed" and present != len(txn.values):
            problems.append(f"committed {txn.values[0]!r}..: {present} of {len(txn.values)} visible")
        elif txn.outcome == "aborted" and present:
            problems.append(f"aborted {txn.values[0]!r}.. ({txn.error}): {present} visible")
        elif txn.outcome == "unknown" and present not in (0, len(txn.values)):
            problems.append(f"unknown {txn.values[0]!r}.. ({txn.error}): {present} of {len(txn.values)} visible")
    return problems


def run_liveness(data_dir: Path, *, faults: int, seed: int, partitions: int = 3, rate: float = 200.0,
                 session_timeout_ms: int = 6000, replica_lag_time_max_ms: int = 2000,
                 delivery_timeout_ms: int = 5000, log: Log = _quiet) -> LivenessReport:
    """A 3-broker cluster with proxies in ``data_dir`` (new or empty), the writers and the reader
    of the module docstring through ``faults`` faults, then the checks. The stall bound is one
    session timeout after each fault healed."""
    if data_dir.exists() and any(data_dir.iterdir()):
        raise ValueError(f"{data_dir} is not empty: a liveness run needs a fresh data directory")
    topic, txn_topic, group, txn_id = f"live-{seed}", f"live-txn-{seed}", f"live-group-{seed}", f"live-tx-{seed}"
    started = time.monotonic()
    with LocalCluster(3, data_dir, session_timeout_ms=session_timeout_ms,
                      replica_lag_time_max_ms=replica_lag_time_max_ms, proxies=True) as cluster:
        log(f"cluster up: bootstrap {cluster.bootstrap}, data {data_dir}")
        for name in (topic, txn_topic):
            create_topic(cluster, name, partitions, segment_bytes=1 << 20)
            if wait_fully_replicated(cluster, name, 30) is None:
                raise RuntimeError(f"{name} did not get leaders and full ISRs within 30 s")
        # Delivery timeouts shorter than the longer faults (a SIGSTOP past the session): batches
        # expire, and the producers must go on by themselves (KIP-360's epoch bump).
        timeouts = {"request_timeout_ms": 2_000, "delivery_timeout_ms": delivery_timeout_ms}
        writer = TimedWriter(cluster.bootstrap, topic, partitions, rate=rate, log=log, **timeouts)
        txn_writer = TxnWriter(cluster.bootstrap, txn_topic, partitions, transactional_id=txn_id, log=log,
                               **timeouts)
        reader = GroupReader(cluster.bootstrap, topic, group_id=group)
        nemesis = Nemesis(cluster, topic, faults=faults, seed=seed, log=log, topics=(topic, txn_topic),
                          kinds=("kill_leader", "pause", "cut_link", "kill_coordinator"),
                          coordinator_of=((pb.TRANSACTION, txn_id), (pb.GROUP, group)))
        for thread in (writer, txn_writer, reader):
            thread.start()
        time.sleep(2.0)
        nemesis.start()
        try:
            nemesis.join_and_check(timeout_s=60 + faults * 40)
            time.sleep(session_timeout_ms / 1000 + 2.0)  # room to show the last fault's recovery
        finally:
            until = time.monotonic()
            writer.stop()
            txn_writer.stop()
        log(f"writers stopped: {len(writer.acks)} acknowledged, {len(writer.failures)} failed sends, "
            f"{len(txn_writer.commit_times)} commits")
        series: dict[str, list[float]] = {f"{topic}-{p}": t for p, t in writer.ack_times.items()}
        series["transactions"] = txn_writer.commit_times
        measured = stalls(nemesis.done, nemesis._t0, series, until=until)
        worst_by: dict[str, Stall] = {}
        for s in measured:
            if s.what not in worst_by or s.seconds > worst_by[s.what].seconds:
                worst_by[s.what] = s
        healed = {name: wait_fully_replicated(cluster, name, 60) for name in (topic, txn_topic)}
        for name, md in healed.items():
            if md is None:
                raise RuntimeError(f"{name} did not get back to full ISRs within 60 s after healing")
        result = check_reads(writer.acks, len(writer.failures), read_everything(cluster.bootstrap, topic, partitions))
        txn_problems = check_transactions(txn_writer.txns, read_everything(cluster.bootstrap, txn_topic, partitions,
                                                                      isolation_level="read_committed"))
        acked = {a.value for a in writer.acks}
        deadline = time.monotonic() + 60
        while not acked <= reader.seen() and time.monotonic() < deadline:
            time.sleep(0.5)
        reader.stop()
        missing = len(acked - reader.seen())
        for n in cluster.node_ids:  # the files quiet: every ISR replica as its leader, byte for byte
            cluster.stop(n)
        for md in healed.values():
            assert md is not None
            replicas = compare_replicas(cluster.broker_data_dir, md)
            result.replica_mismatches += replicas.problems
            result.replica_batches_compared += replicas.batches
    return LivenessReport(
        faults=nemesis.done, result=result,
        worst=sorted(worst_by.values(), key=lambda s: -s.seconds), bound_s=session_timeout_ms / 1000,
        txns=Counter(t.outcome for t in txn_writer.txns), txn_problems=txn_problems, group_missing=missing,
        fatal=txn_writer.fatal, seconds=time.monotonic() - started)
