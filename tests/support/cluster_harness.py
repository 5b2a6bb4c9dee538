"""The fault harness: a writer, a nemesis and a checker around a :class:`LocalCluster`.

What it proves (issue 11, DESIGN.md §1 I6): with ``acks=all``, RF=3 and
``min.insync.replicas=2``, no acknowledged record is lost or duplicated whatever the
nemesis does, and the replicas hold byte-identical batches below the high-water mark.

* :class:`Writer` — a thread producing unique values (``v<seq>``) round-robin to the
  partitions of one topic through the project's :class:`~logstore.Producer`
  (``bootstrap=cluster.bootstrap``), recording every acknowledged ``(partition, offset,
  value)`` and every failed send. A failed send is allowed (that is what the client is
  told); a lost acknowledged one is not.
* :class:`Nemesis` — one fault at a time, at random times, from a seeded RNG:
  ``kill_leader`` (SIGKILL the leader of a partition, restart it after a while),
  ``pause`` (SIGSTOP a broker for longer than its session, then SIGCONT), ``cut_link``
  (cut replication between two brokers through their proxies, reset or blackhole, then
  heal), ``kill_coordinator`` (SIGKILL the broker that coordinates a group or transactional
  id, found with FindCoordinator, and restart it). Every fault is logged (time, kind, target).
  A nemesis given ``faults=None`` runs until :meth:`Nemesis.stop`.
* :func:`check` — after healing everything and waiting for full ISRs: a full read with
  our :class:`~logstore.Consumer` (read_uncommitted, from the beginning to the end offsets)
  must hold every acknowledged record exactly once, at the offset it was acknowledged with;
  no two acknowledgements may name one offset. Then the cluster is stopped and every
  ISR replica's stored batch messages below the HWM are compared byte for byte
  (:func:`compare_replicas`, reading the Arrow IPC segment files).

:func:`run_chaos` wires them; ``tests/chaos/test_fault_harness.py`` runs it bounded and
``benchmarks/chaos.py`` (``make chaos``) for 100 faults or more.

Thread-safety: the writer and the nemesis are threads of their own; everything else runs in
the controlling thread.
"""

from __future__ import annotations

import random
import threading
import time
from collections import Counter
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import grpc

from logstore import Consumer, Producer, TopicPartition
from logstore._proto import logstore_pb2 as pb
from logstore._proto import logstore_pb2_grpc as pb_grpc
from logstore.dev.local_cluster import LocalCluster
from logstore.errors import CorruptRecordError, LogstoreError
from logstore.record import decode_schema
from logstore.record_reader import iter_batches

Log = Callable[[str], None]
FAULT_KINDS = ("kill_leader", "pause", "cut_link")


def _quiet(_: str) -> None:
    pass


# ---------------------------------------------------------------- metadata over raw gRPC


def _metadata_of(cluster: LocalCluster, node: int, topic: str, timeout_s: float) -> pb.MetadataResponse | None:
    broker = cluster.brokers[node]
    if not broker.running or broker.paused:
        return None
    with grpc.insecure_channel(cluster.address(node), options=[("grpc.use_local_subchannel_pool", 1)]) as ch:
        try:
            resp = pb_grpc.LogstoreStub(ch).Metadata(pb.MetadataRequest(topics=[topic]), timeout=timeout_s)
        except grpc.RpcError:
            return None
    if resp.topics and not resp.topics[0].error.code:
        return resp
    return None


def cluster_metadata(cluster: LocalCluster, topic: str, *, timeout_s: float = 2.0) -> pb.MetadataResponse | None:
    """Metadata(topic) as the cluster sees it, or None if no running broker answers.

    Partition states (leader, replicas, ISR) come from the first broker that answers; each
    partition's offsets (LEO, HWM) from that partition's leader, the broker that knows them
    (LEO -1 and HWM -2 when the leader did not answer).
    Raw gRPC on purpose: the harness must see the cluster's state whatever the client under
    test does."""
    answers: dict[int, pb.MetadataResponse] = {}
    first: pb.MetadataResponse | None = None
    for n in cluster.node_ids:
        resp = _metadata_of(cluster, n, topic, timeout_s)
        if resp is not None:
            answers[n] = resp
            first = first or resp
    if first is None:
        return None
    out = pb.MetadataResponse()
    out.CopyFrom(first)
    for p in out.topics[0].partitions:
        leader_view = answers.get(p.leader)
        if leader_view is None:  # offsets unknown: never "caught up"
            p.log_end_offset, p.high_watermark = -1, -2
            continue
        for q in leader_view.topics[0].partitions:
            if q.partition == p.partition:
                p.log_start_offset, p.log_end_offset = q.log_start_offset, q.log_end_offset
                p.high_watermark, p.last_stable_offset = q.high_watermark, q.last_stable_offset
    return out


def create_topic(cluster: LocalCluster, topic: str, partitions: int, *, replication_factor: int = 3,
                 min_insync_replicas: int = 2, segment_bytes: int | None = None) -> None:
    """Create ``topic`` through the first broker. ``segment_bytes``: the chaos topic uses small
    segments, so a SIGKILLed broker recovers (scans) only a small active segment at restart,
    and segment rolls happen under the nemesis too."""
    configs = {"min.insync.replicas": str(min_insync_replicas)}
    if segment_bytes is not None:
        configs["segment.bytes"] = str(segment_bytes)
    request = pb.CreateTopicsRequest(topics=[pb.NewTopic(
        name=topic, partitions=partitions, replication_factor=replication_factor, configs=configs)])
    with grpc.insecure_channel(cluster.address(cluster.node_ids[0])) as ch:
        resp = pb_grpc.LogstoreStub(ch).CreateTopics(request, timeout=30)
    error = resp.results[0].error
    if error.code:
        raise RuntimeError(f"cannot create {topic}: [{error.code}] {error.message}")


def find_coordinator(cluster: LocalCluster, key_type: int, key: str, *, timeout_s: float = 2.0) -> int | None:
    """The node id that coordinates ``key`` (a ``pb.CoordinatorType``), as the first running
    broker that answers FindCoordinator says; None when none knows."""
    for n in cluster.node_ids:
        broker = cluster.brokers[n]
        if not broker.running or broker.paused:
            continue
        with grpc.insecure_channel(cluster.address(n), options=[("grpc.use_local_subchannel_pool", 1)]) as ch:
            try:
                resp = pb_grpc.LogstoreStub(ch).FindCoordinator(
                    pb.FindCoordinatorRequest(key_type=key_type, keys=[key]), timeout=timeout_s)  # type: ignore[arg-type]
            except grpc.RpcError:
                continue
        for c in resp.coordinators:
            if c.key == key and not c.error.code:
                return c.node_id
    return None


def leaders(cluster: LocalCluster, topic: str) -> dict[int, int]:
    """partition → leader node id (-1: none), as a running broker sees it."""
    md = cluster_metadata(cluster, topic)
    if md is None:
        return {}
    return {p.partition: p.leader for p in md.topics[0].partitions}


def wait_fully_replicated(cluster: LocalCluster, topic: str, timeout_s: float) -> pb.MetadataResponse | None:
    """Wait until every partition has a leader, ISR == replicas, and HWM == LEO; return
    that metadata, or None at the deadline."""
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        md = cluster_metadata(cluster, topic)
        if md is not None and all(
            p.leader >= 0 and set(p.isr) == set(p.replicas) and p.high_watermark == p.log_end_offset
            for p in md.topics[0].partitions
        ):
            return md
        time.sleep(0.2)
    return None


# ---------------------------------------------------------------- the writer


@dataclass(frozen=True, slots=True)
class Ack:
    partition: int
    offset: int
    value: bytes


class Writer(threading.Thread):
    """Produces ``v<seq>`` values at about ``rate`` records/s; records acks and failures."""

    def __init__(self, bootstrap: str, topic: str, partitions: int, *, rate: float = 300.0,
                 log: Log = _quiet, renew_producer: bool = True, **producer_config: Any) -> None:
        """``renew_producer``: replace the producer after a failed send (False: keep it, as a
        producer that recovers by itself allows; see ``tests/support/liveness_harness.py``)."""
        super().__init__(name="harness-writer", daemon=True)
        self.renew_producer = renew_producer
        self.bootstrap = bootstrap
        self.topic = topic
        self.partitions = partitions
        self.rate = rate
        self.log = log
        self.producer_config = {"acks": "all", "linger_ms": 2, "request_timeout_ms": 5_000,
                                "delivery_timeout_ms": 30_000, **producer_config}
        self.acks: list[Ack] = []
        self.failures: list[tuple[bytes, str]] = []
        self.sent = 0
        self.producers_created = 0
        self._lock = threading.Lock()
        self._stopping = threading.Event()
        self._producer_failed = threading.Event()
        self.error: BaseException | None = None

    def _on_delivery(self, value: bytes) -> Callable[[Exception | None, Any], None]:
        def done(error: Exception | None, metadata: Any) -> None:
            with self._lock:
                if error is None:
                    self.acks.append(Ack(metadata.partition, metadata.offset, value))
                else:
                    self.failures.append((value, f"{type(error).__name__}: {error}"))
                    self._producer_failed.set()
        return done

    def _new_producer(self) -> Producer:
        self.producers_created += 1
        return Producer(self.bootstrap, **self.producer_config)

    def run(self) -> None:
        try:
            self._run()
        except BaseException as e:  # surfaced by stop()
            self.error = e

    def _run(self) -> None:
        producer = self._new_producer()
        interval = 1.0 / self.rate
        next_at = time.monotonic()
        seq = 0
        try:
            while not self._stopping.is_set():
                if self._producer_failed.is_set() and self.renew_producer:
                    # An idempotent producer whose batch failed for good fails the partition's
                    # later batches (a sequence gap): start a new one, as Kafka's users do.
                    producer.close(timeout=35)
                    self._producer_failed.clear()
                    producer = self._new_producer()
                    self.log(f"writer: new producer #{self.producers_created} after a failed send")
                value = b"v%09d" % seq
                try:
                    producer.send(self.topic, value, partition=seq % self.partitions,
                                  on_delivery=self._on_delivery(value))
                except LogstoreError as e:  # refused before queueing: never in the log
                    with self._lock:
                        self.failures.append((value, f"{type(e).__name__}: {e}"))
                    self._producer_failed.set()
                seq += 1
                self.sent = seq
                next_at += interval
                delay = next_at - time.monotonic()
                if delay > 0:
                    self._stopping.wait(delay)
                else:
                    next_at = time.monotonic()
        finally:
            producer.close(timeout=35)

    def stop(self, timeout_s: float = 60.0) -> None:
        """Stop sending, wait for every outstanding send to be acknowledged or failed."""
        self._stopping.set()
        self.join(timeout_s)
        if self.is_alive():
            raise TimeoutError(f"the writer did not finish its outstanding sends within {timeout_s} s")
        if self.error is not None:
            raise self.error


# ---------------------------------------------------------------- the nemesis


@dataclass(frozen=True, slots=True)
class Fault:
    started: float  # seconds since the nemesis started
    ended: float
    kind: str
    target: str


class Nemesis(threading.Thread):
    """Runs ``faults`` faults one after another, at random times, then heals everything."""

    def __init__(self, cluster: LocalCluster, topic: str, *, faults: int | None, seed: int, log: Log = _quiet,
                 kinds: tuple[str, ...] = FAULT_KINDS, gap_s: tuple[float, float] = (0.3, 1.5),
                 settle_s: float = 8.0, coordinator_of: tuple[tuple[int, str], ...] = (),
                 topics: tuple[str, ...] = ()) -> None:
        super().__init__(name="harness-nemesis", daemon=True)
        self.cluster = cluster
        self.topic = topic
        self.topics = topics or (topic,)  # kill_leader picks a partition leader of one of these
        self.coordinator_of = coordinator_of  # (CoordinatorType, key) pairs: kill_coordinator picks one
        self.faults = faults
        self._stopping = threading.Event()
        self.rng = random.Random(seed)
        self.log = log
        self.kinds = kinds
        self.gap_s = gap_s
        self.settle_s = settle_s
        self.done: list[Fault] = []
        self.error: BaseException | None = None
        self._t0 = time.monotonic()

    def run(self) -> None:
        try:
            round_kinds: list[str] = []
            i = 0
            while (self.faults is None or i < self.faults) and not self._stopping.is_set():
                # Mostly a fault on a healthy cluster (what each fault is meant to test); when
                # the ISR does not recover within settle_s, faults compound, which is fine too.
                for topic in self.topics:
                    wait_fully_replicated(self.cluster, topic, self.settle_s)
                if self._stopping.wait(self.rng.uniform(*self.gap_s)):
                    break
                if i % len(self.kinds) == 0:  # every kind once per round, in a random order
                    round_kinds = self.rng.sample(self.kinds, len(self.kinds))
                kind = round_kinds[i % len(self.kinds)]
                started = time.monotonic() - self._t0
                target = getattr(self, f"_{kind}")()
                fault = Fault(started, time.monotonic() - self._t0, kind, target)
                self.done.append(fault)
                self.log(f"fault {i + 1}/{self.faults or '-'} at {started:6.1f}s ({fault.ended - started:4.1f}s): "
                         f"{kind} {target}")
                i += 1
        except BaseException as e:  # surfaced by join_and_check()
            self.error = e
        finally:
            self._heal_everything()

    def _heal_everything(self) -> None:
        self.cluster.heal_all()
        for n in self.cluster.node_ids:
            if not self.cluster.running(n):
                self.cluster.start(n)

    def stop(self) -> None:
        """Start no further fault (a running one finishes); the thread then heals and ends."""
        self._stopping.set()

    def _kill_and_restart(self, node: int) -> None:
        self.cluster.kill(node)
        time.sleep(self.rng.uniform(0.5, 3.0))
        self.cluster.start(node)

    def _kill_coordinator(self) -> str:
        assert self.coordinator_of, "kill_coordinator needs coordinator_of"
        key_type, key = self.rng.choice(self.coordinator_of)
        node = find_coordinator(self.cluster, key_type, key)
        if node is None or node not in self.cluster.brokers:
            node = self.rng.choice(self.cluster.node_ids)
            what = f"broker {node} (no coordinator of {key!r} known)"
        else:
            what = f"broker {node} (coordinator of {key!r})"
        self._kill_and_restart(node)
        return what

    def _kill_leader(self) -> str:
        topic = self.rng.choice(self.topics)
        by_partition = leaders(self.cluster, topic)
        live = {p: n for p, n in by_partition.items() if n in self.cluster.brokers}
        if live:
            partition = self.rng.choice(sorted(live))
            node, what = live[partition], f"broker {live[partition]} (leader of {topic}-{partition})"
        else:
            node = self.rng.choice(self.cluster.node_ids)
            what = f"broker {node} (no leader known)"
        self._kill_and_restart(node)
        return what

    def _pause(self) -> str:
        node = self.rng.choice(self.cluster.node_ids)
        held = self.cluster.session_timeout_ms / 1000 * self.rng.uniform(1.3, 2.0)
        self.cluster.pause(node)
        time.sleep(held)
        self.cluster.resume(node)
        return f"broker {node} for {held:.1f}s"

    def _cut_link(self) -> str:
        a, b = self.rng.sample(self.cluster.node_ids, 2)
        mode = self.rng.choice(("reset", "blackhole"))
        held = self.rng.uniform(1.0, 2.0 * self.cluster.replica_lag_time_max_ms / 1000)
        self.cluster.cut_link(a, b, mode)
        time.sleep(held)
        self.cluster.heal_link(a, b)
        return f"{a}<->{b} {mode} for {held:.1f}s"

    def join_and_check(self, timeout_s: float) -> None:
        self.join(timeout_s)
        if self.is_alive():
            raise TimeoutError(f"the nemesis did not finish within {timeout_s} s")
        if self.error is not None:
            raise self.error


# ---------------------------------------------------------------- the checker


@dataclass
class CheckResult:
    acknowledged: int = 0
    failed_sends: int = 0
    read: int = 0
    lost: list[Ack] = field(default_factory=list)  # acked, not at its offset
    duplicated: list[bytes] = field(default_factory=list)  # a value read more than once
    conflicting: list[tuple[int, int]] = field(default_factory=list)  # (partition, offset) acked twice
    replica_mismatches: list[str] = field(default_factory=list)
    replica_batches_compared: int = 0

    @property
    def ok(self) -> bool:
        return not (self.lost or self.duplicated or self.conflicting or self.replica_mismatches)

    def summary(self) -> str:
        return (f"acknowledged {self.acknowledged}, failed sends {self.failed_sends}, read {self.read}, "
                f"lost {len(self.lost)}, duplicated {len(self.duplicated)}, conflicting offsets "
                f"{len(self.conflicting)}, replica mismatches {len(self.replica_mismatches)} "
                f"({self.replica_batches_compared} follower batches compared)")


def read_everything(bootstrap: str, topic: str, partitions: int, *, timeout_s: float = 60.0,
                    isolation_level: str = "read_uncommitted") -> dict[int, dict[int, bytes]]:
    """partition → offset → value, from the beginning to the end offsets (read_uncommitted
    unless told otherwise: ``read_committed`` leaves out aborted transactions)."""
    tps = [TopicPartition(topic, p) for p in range(partitions)]
    out: dict[int, dict[int, bytes]] = {p: {} for p in range(partitions)}
    seen: Counter[tuple[int, int]] = Counter()
    with Consumer(bootstrap, isolation_level=isolation_level, auto_offset_reset="earliest",
                  fetch_max_wait_ms=100) as consumer:
        consumer.assign(tps)
        consumer.seek_to_beginning(*tps)
        end = consumer.end_offsets(tps)
        deadline = time.monotonic() + timeout_s
        while any(consumer.position(tp) < end[tp] for tp in tps):
            if time.monotonic() > deadline:
                raise TimeoutError(f"the full read did not reach the end offsets {end} in {timeout_s} s")
            for record in consumer.poll(timeout=0.5):
                seen[(record.partition, record.offset)] += 1
                if record.offset < end[TopicPartition(topic, record.partition)]:
                    assert isinstance(record.value, bytes)
                    out[record.partition][record.offset] = record.value
    doubled = [k for k, c in seen.items() if c > 1]
    if doubled:
        raise AssertionError(f"the consumer returned offsets more than once: {doubled[:10]}")
    return out


def check_reads(acks: list[Ack], failures: int, log: dict[int, dict[int, bytes]]) -> CheckResult:
    result = CheckResult(acknowledged=len(acks), failed_sends=failures,
                         read=sum(len(v) for v in log.values()))
    by_offset: dict[tuple[int, int], bytes] = {}
    for ack in acks:
        key = (ack.partition, ack.offset)
        if key in by_offset and by_offset[key] != ack.value:
            result.conflicting.append(key)
        by_offset[key] = ack.value
        if log.get(ack.partition, {}).get(ack.offset) != ack.value:
            result.lost.append(ack)
    counts = Counter(v for part in log.values() for v in part.values())
    result.duplicated = sorted(v for v, c in counts.items() if c > 1)
    return result


def stored_batches(partition_dir: Path, below: int) -> Iterator[tuple[int, bytes]]:
    """(base offset, message bytes) of every stored batch whose last offset is below ``below``,
    in offset order, read from the partition's Arrow IPC segment files."""
    for segment in sorted(partition_dir.glob("*.arrow")):
        data = memoryview(segment.read_bytes())
        if not len(data):
            continue
        _, start = decode_schema(data, where=str(segment))
        try:
            for batch in iter_batches(data, start=start, where=str(segment)):
                last = batch.header.base_offset + batch.header.last_offset_delta
                if last >= below:
                    return
                yield batch.header.base_offset, bytes(batch.data)
        except CorruptRecordError:
            return  # a torn tail: whatever it is, it is past what was read so far


@dataclass
class ReplicaCheck:
    """What :func:`compare_replicas` found: problems (empty: none) and how much it compared."""

    problems: list[str] = field(default_factory=list)
    batches: int = 0  # batch messages compared with the leader's, all replicas together


def compare_replicas(data_dir_of: Callable[[int], Path], md: pb.MetadataResponse) -> ReplicaCheck:
    """Every ISR replica's batches below the HWM are byte-identical to the leader's.
    ``data_dir_of(node_id)`` is a broker's data directory.

    Call with the brokers stopped (files quiet) and ``md`` read before stopping them."""
    check = ReplicaCheck()
    topic = md.topics[0]
    for p in topic.partitions:
        copies: dict[int, list[tuple[int, bytes]]] = {}
        for node in p.isr:
            copies[node] = list(stored_batches(data_dir_of(node) / f"{topic.name}-{p.partition}",
                                               p.high_watermark))
        reference = copies.get(p.leader)
        if reference is None:
            check.problems.append(f"partition {p.partition}: leader {p.leader} is not in the ISR {list(p.isr)}")
            continue
        if p.high_watermark > 0 and not reference:
            check.problems.append(f"partition {p.partition}: the leader {p.leader} has no batch below HWM "
                                  f"{p.high_watermark}")
        for node, batches in copies.items():
            if node == p.leader:
                continue
            check.batches += min(len(batches), len(reference))
            if batches != reference:
                first = next((i for i, (x, y) in enumerate(zip(batches, reference, strict=False)) if x != y),
                             min(len(batches), len(reference)))
                check.problems.append(
                    f"partition {p.partition}: replica {node} differs from leader {p.leader} below HWM "
                    f"{p.high_watermark} at batch #{first} ({len(batches)} vs {len(reference)} batches)")
    return check


# ---------------------------------------------------------------- one run


@dataclass
class ChaosReport:
    faults: list[Fault]
    result: CheckResult
    seconds: float
    producers_created: int

    def summary(self) -> str:
        kinds = Counter(f.kind for f in self.faults)
        return (f"faults run {len(self.faults)} ({', '.join(f'{k} {c}' for k, c in sorted(kinds.items()))}); "
                f"{self.result.summary()}; {self.seconds:.0f} s")


def run_chaos(data_dir: Path, *, faults: int, seed: int, partitions: int = 3, rate: float = 300.0,
              session_timeout_ms: int = 2000, replica_lag_time_max_ms: int = 2000,
              segment_bytes: int = 1 << 20, log: Log = _quiet) -> ChaosReport:
    """Start a 3-broker cluster with proxies in ``data_dir`` (new or empty: an earlier run's
    etcd and partitions would be loaded and replicated too), write through ``faults``
    faults, check."""
    if data_dir.exists() and any(data_dir.iterdir()):
        raise ValueError(f"{data_dir} is not empty: a chaos run needs a fresh data directory")
    topic = f"chaos-{seed}"
    started = time.monotonic()
    with LocalCluster(3, data_dir, session_timeout_ms=session_timeout_ms,
                      replica_lag_time_max_ms=replica_lag_time_max_ms, proxies=True) as cluster:
        log(f"cluster up: bootstrap {cluster.bootstrap}, data {data_dir}")
        create_topic(cluster, topic, partitions, segment_bytes=segment_bytes)
        md = wait_fully_replicated(cluster, topic, 30)
        if md is None:
            raise RuntimeError(f"{topic} did not get leaders and full ISRs within 30 s")
        if any(len(p.replicas) != 3 for p in md.topics[0].partitions):  # else the run proves less
            raise RuntimeError(f"{topic} is not replicated 3 times: {md.topics[0].partitions}")
        writer = Writer(cluster.bootstrap, topic, partitions, rate=rate, log=log)
        nemesis = Nemesis(cluster, topic, faults=faults, seed=seed, log=log)
        writer.start()
        time.sleep(1.0)
        nemesis.start()
        try:
            nemesis.join_and_check(timeout_s=60 + faults * 30)
            time.sleep(1.0)  # some writes on the healed cluster
        finally:
            writer.stop()
        log(f"writer stopped: {len(writer.acks)} acknowledged, {len(writer.failures)} failed sends")
        md = wait_fully_replicated(cluster, topic, 60)
        if md is None:
            raise RuntimeError(f"{topic} did not get back to full ISRs within 60 s after healing: "
                               f"{cluster_metadata(cluster, topic)}")
        result = check_reads(writer.acks, len(writer.failures),
                             read_everything(cluster.bootstrap, topic, partitions))
        for n in cluster.node_ids:
            cluster.stop(n)
        replicas = compare_replicas(cluster.broker_data_dir, md)
        result.replica_mismatches, result.replica_batches_compared = replicas.problems, replicas.batches
    return ChaosReport(nemesis.done, result, time.monotonic() - started, writer.producers_created)
