"""Replication: throughput, latency, follower lag and fail-over of a 3-broker cluster (issue 11).

Measured in one run, against ``logstore.dev.local_cluster.LocalCluster(3,
session_timeout_ms=2000)``: etcd and three brokers, each its own process on loopback,
and, as a further baseline, the single embedded broker (``EmbeddedBroker(subprocess=True)``)
running alongside. Every topic is new (deleted after its run); RF=3 topics have
``min.insync.replicas=2``.

(1) throughput   one ``Producer`` (idempotent, linger 5 ms) writes 100-byte values to a
                 topic of ``--partitions`` partitions (default 3: one leader per broker),
                 with ``send_batch`` of 1,000-row Arrow tables (``--records``) and with
                 per-record ``send()`` (``--send-records``), then ``flush()``; every
                 record's outcome is checked. Configurations, alternating within each of
                 ``--repeats`` rounds (best run reported): RF=3 acks=all and RF=1 acks=1
                 on the cluster, acks=1 on the single broker. acks=1 does not fsync;
                 RF=3 acks=all waits for the ISR (no fsync: the quorum is the durability).
(2) latency      a producer paced at 1,000 records/s (one 100-byte record per ms tick)
                 and a long-polling consumer in this process, as ``bench_latency.py``
                 does (the same code); latency = the time the consumer's poll returned the
                 record - the time just before ``send``. One partition each: RF=3 acks=all
                 next to RF=1 acks=1 on the cluster, both with linger 0 (as
                 ``bench_latency.py``), then RF=3 acks=all with the producer's default
                 linger of 5 ms.
(3) follower lag a producer sends 1,000 records/s with acks=1 (default linger of 5 ms) to an
                 RF=3 one-partition topic while a sampler asks each replica's broker for its
                 own log end offset (Metadata to that broker: the partition's
                 ``log_end_offset`` is the local replica's) every ~10 ms. A follower with LEO
                 ``F`` at time ``t`` misses records from offset ``F`` on; its lag is how long
                 record ``F`` had been on the leader at ``t`` (0 if the leader had not
                 acknowledged it yet), Kafka's notion of replica lag time. "On the leader"
                 is the time the producer got the acks=1 answer (an underestimate: the
                 append happened before) and, as an upper bound, the time ``send`` was
                 called (which includes the linger). The same for the leader's high-water
                 mark: how long the oldest record not yet on every ISR replica had been on
                 the leader. ``t`` is the midpoint of the Metadata call.
(4) fail-over    two producers each send 500 records/s with acks=all to the same RF=3
                 one-partition topic, one with the default retry backoff (100 ms doubling
                 to 1 s, as Kafka's), one with it capped at 200 ms; the partition's leader
                 gets SIGKILL; fail-over = from just before the kill to the first
                 acknowledgement of a record sent after the kill (only the new leader can
                 have appended it). Also printed: when a surviving broker's metadata first
                 named the new leader (polled every 10 ms), which splits the time into the
                 election (session expiry, controller) and the rest (the client's backoff and
                 metadata refresh, the new leader's first produce: docs/benchmarks.md "Replication"). ``--failovers`` repetitions (default 5); between them
                 the killed broker is restarted and the ISR is full again before the next.

Targets (issue 11, "Performance"): RF=3 acks=all >= 0.5x RF=1 acks=1 throughput; p99 <=
15 ms at 1,000 records/s with RF=3 acks=all; follower lag < 10 ms at steady state;
fail-over <= 3 s with a 2 s broker session. Absolute figures on a shared 2-core machine
drift: the ratios and the load average printed before and after say how far to trust them.

Run: ``make bench-replication`` or ``.venv/bin/python benchmarks/bench_replication.py
[--quick]`` (``--quick``: small sizes and one fail-over, ~50 s, what
``tests/project/test_bench_replication.py`` runs). Needs an etcd server binary (``make etcd``).
"""

from __future__ import annotations

import argparse
import itertools
import os
import sys
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field

import numpy as np
import pyarrow as pa
from bench_latency import Result, percentiles, run_produce_consume
from benchutil import Timer, machine_line, process_cpu_s, value_tables, verdict

from logstore.broker.embedded import EmbeddedBroker
from logstore.client.admin import Admin
from logstore.client.producer import Producer
from logstore.dev.local_cluster import LocalCluster
from logstore.errors import LogstoreError
from logstore.types import NewTopic, PartitionInfo

VALUE_BYTES = 100
TABLE_ROWS = 1_000
SESSION_MS = 2_000
LAG_RATE = 1_000
FAILOVER_RATE = 500
FAST_BACKOFF_MAX_MS = 200
SAMPLE_INTERVAL_S = 0.010
_names = itertools.count(1)


# ---------------------------------------------------------------------------- topics


def new_topic(admin: Admin, partitions: int, rf: int | None) -> str:
    """Create a fresh topic; ``rf`` None: the single broker (no replication factor to give)."""
    name = f"bench-repl-{next(_names)}"
    configs = {"min.insync.replicas": "2"} if rf == 3 else {}
    admin.create_topics([NewTopic(name, partitions, configs=configs, replication_factor=rf)])
    return name


def wait_until(what: str, check: Callable[[], object], timeout_s: float, interval_s: float = 0.05) -> object:
    """Poll ``check`` until it returns something truthy; raise after ``timeout_s``."""
    deadline = time.monotonic() + timeout_s
    last: object = None
    while time.monotonic() < deadline:
        try:
            last = check()
        except LogstoreError as e:  # a broker restarting, a leader moving: ask again
            last = e
        if last and not isinstance(last, Exception):
            return last
        time.sleep(interval_s)
    raise TimeoutError(f"{what}: not within {timeout_s:.0f} s (last answer {last!r})")


def partitions_of(admin: Admin, topic: str) -> tuple[PartitionInfo, ...]:
    return admin.describe_topics([topic])[topic].partitions


def wait_full_isr(admin: Admin, topic: str, timeout_s: float = 60.0) -> tuple[PartitionInfo, ...]:
    """Every partition has a leader and its whole replica set in the ISR."""
    def full() -> tuple[PartitionInfo, ...] | None:
        parts = partitions_of(admin, topic)
        return parts if all(p.leader >= 0 and set(p.isr) == set(p.replicas) for p in parts) else None
    result = wait_until(f"{topic}: a leader and a full ISR", full, timeout_s)
    assert isinstance(result, tuple)
    return result


# ---------------------------------------------------------------------------- (1) throughput


@dataclass
class Run:
    """One timed produce run: wall seconds, CPU seconds of this process and of the brokers."""

    wall: float
    client_cpu: float
    broker_cpu: float
    records: int


@dataclass
class Throughput:
    label: str
    runs: dict[str, list[Run]] = field(default_factory=lambda: {"send_batch": [], "send()": []})

    def best(self, mode: str) -> Run:
        return min(self.runs[mode], key=lambda r: r.wall)

    def rate(self, mode: str) -> float:
        best = self.best(mode)
        return best.records / best.wall


def produce_run(bootstrap: str, admin: Admin, broker_pids: list[int | None], *, mode: str, rf: int | None,
                acks: int | str, partitions: int, tables: list[pa.Table], values: list[bytes]) -> Run:
    """One timed run on a new topic. Metadata and the producer id come before the clock."""
    topic = new_topic(admin, partitions, rf)
    try:
        if rf is not None:
            wait_full_isr(admin, topic)
        with Producer(bootstrap, acks=acks) as producer:
            producer.send(topic, values[0]).result()
            broker0 = sum(process_cpu_s(pid) for pid in broker_pids)
            if mode == "send_batch":
                records = sum(t.num_rows for t in tables)
                with Timer() as t:
                    futures = [producer.send_batch(topic, table) for table in tables]
                    producer.flush()
                sent = sum(f.result().record_count for f in futures)
            else:
                records = len(values)
                send = producer.send
                with Timer() as t:
                    futures_1 = [send(topic, v) for v in values]
                    producer.flush()
                sent = sum(1 for f in futures_1 if f.result().offset >= 0)
            broker = sum(process_cpu_s(pid) for pid in broker_pids) - broker0
        assert sent == records, (mode, sent, records)
    finally:
        admin.delete_topics([topic])
    return Run(t.wall, t.cpu, broker, records)


# ---------------------------------------------------------------------------- (3) follower lag


@dataclass
class Lag:
    leader: int
    follower_ack_ms: np.ndarray
    follower_send_ms: np.ndarray
    hwm_ack_ms: np.ndarray
    behind: np.ndarray
    samples: int
    rounds_per_s: float


def measure_lag(cluster: LocalCluster, admin: Admin, seconds: float) -> Lag:
    topic = new_topic(admin, 1, 3)
    parts = wait_full_isr(admin, topic)
    leader = parts[0].leader
    followers = [n for n in parts[0].replicas if n != leader]
    direct = {n: Admin(cluster.address(n)) for n in parts[0].replicas}
    on_leader: dict[int, tuple[int, int]] = {}  # offset -> (send ns, ack ns)
    samples: list[tuple[int, int, int, int]] = []  # (t ns, node, LEO, HWM)
    stop = threading.Event()

    def sample() -> None:
        tick = time.perf_counter()
        while not stop.is_set():
            for n in (leader, *followers):
                t0 = time.perf_counter_ns()
                p = partitions_of(direct[n], topic)[0]
                samples.append(((t0 + time.perf_counter_ns()) // 2, n, p.log_end_offset, p.high_watermark))
            tick += SAMPLE_INTERVAL_S
            time.sleep(max(0.0, tick - time.perf_counter()))

    value = b"\1" * VALUE_BYTES
    total = int(seconds * LAG_RATE)
    with Producer(cluster.bootstrap, acks=1) as producer:
        producer.send(topic, value, partition=0).result()
        sampler = threading.Thread(target=sample, name="lag-sampler", daemon=True)
        start_ns = time.perf_counter_ns()
        sampler.start()
        start = time.perf_counter()
        for seq in range(total):
            delay = start + seq / LAG_RATE - time.perf_counter()
            if delay > 0:
                time.sleep(delay)
            sent = time.perf_counter_ns()

            def acked(err: LogstoreError | None, md: object, sent: int = sent) -> None:
                if err is None:
                    on_leader[md.offset] = (sent, time.perf_counter_ns())  # type: ignore[attr-defined]
            producer.send(topic, value, partition=0, on_delivery=acked)
        producer.flush()
        stop.set()
        sampler.join(10)
    for a in direct.values():
        a.close()
    admin.delete_topics([topic])
    if len(on_leader) != total:
        raise RuntimeError(f"lag run: {len(on_leader)} of {total} records acknowledged")

    steady_ns = start_ns + 500_000_000  # the first 0.5 s are not counted
    end_ns = start_ns + int(seconds * 1e9)
    f_ack, f_send, h_ack, behind = [], [], [], []
    leader_leo = 0
    for t, n, leo, hwm in samples:
        if n == leader:
            leader_leo = leo
        if not steady_ns <= t <= end_ns:
            continue
        oldest = hwm if n == leader else leo  # the first record this view is missing
        send_ns, ack_ns = on_leader.get(oldest, (t, t))
        ack_lag = max(0, t - ack_ns) / 1e6
        send_lag = max(0, t - send_ns) / 1e6
        if n == leader:
            h_ack.append(ack_lag)
        else:
            f_ack.append(ack_lag)
            f_send.append(send_lag)
            behind.append(max(0, leader_leo - leo))
    rounds = sum(1 for _, n, _, _ in samples if n == leader)
    return Lag(leader, np.array(f_ack), np.array(f_send), np.array(h_ack), np.array(behind), len(f_ack),
               rounds / seconds)


# ---------------------------------------------------------------------------- (4) fail-over


@dataclass
class Failover:
    killed: int
    new_leader: int
    elected_ms: float
    first_ack_ms: float  # the producer with default retry settings
    first_ack_fast_ms: float  # the producer with retry_backoff_max_ms=FAST_BACKOFF_MAX_MS


class PacedSender(threading.Thread):
    """Sends one record every 1/``rate`` s with acks=all and keeps each one's send and ack times."""

    def __init__(self, bootstrap: str, topic: str, rate: int, **producer_config: int) -> None:
        super().__init__(name="failover-sender", daemon=True)
        self.producer = Producer(bootstrap, acks="all", **producer_config)
        self.topic, self.rate = topic, rate
        self.sent_ns: list[int] = []
        self.acked_ns: dict[int, int] = {}
        self.errors: list[LogstoreError] = []
        self.stop = threading.Event()
        self._mark_ns = 1 << 62  # acks of records sent after this count for first_ack_ns
        self.first_ack_ns: int | None = None

    def arm(self, mark_ns: int) -> None:
        """From now on, :attr:`first_ack_ns` is the earliest ack of a record sent after ``mark_ns``."""
        self.first_ack_ns = None
        self._mark_ns = mark_ns

    def run(self) -> None:
        start = time.perf_counter()
        for seq in itertools.count():
            if self.stop.is_set():
                break
            delay = start + seq / self.rate - time.perf_counter()
            if delay > 0:
                time.sleep(delay)
            self.sent_ns.append(time.perf_counter_ns())

            def done(err: LogstoreError | None, md: object, seq: int = seq) -> None:
                if err is None:
                    now = self.acked_ns[seq] = time.perf_counter_ns()
                    if self.sent_ns[seq] > self._mark_ns and (self.first_ack_ns is None or now < self.first_ack_ns):
                        self.first_ack_ns = now
                else:
                    self.errors.append(err)
            self.producer.send(self.topic, b"\2" * VALUE_BYTES, partition=0, on_delivery=done)

    def close(self) -> None:
        self.stop.set()
        self.join(10)
        self.producer.flush()
        self.producer.close()


def measure_failovers(cluster: LocalCluster, admin: Admin, repetitions: int,
                      progress: Callable[[str], None]) -> tuple[list[Failover], list[PacedSender]]:
    """Two producers write to the same partition at once, one with the default retry backoff
    (100 ms doubling to 1 s), one with it capped at FAST_BACKOFF_MAX_MS: each kill measures both."""
    topic = new_topic(admin, 1, 3)
    wait_full_isr(admin, topic)
    senders = [PacedSender(cluster.bootstrap, topic, FAILOVER_RATE),
               PacedSender(cluster.bootstrap, topic, FAILOVER_RATE, retry_backoff_max_ms=FAST_BACKOFF_MAX_MS)]
    for sender in senders:
        sender.start()
    out: list[Failover] = []
    try:
        for _ in range(repetitions):
            leader = wait_full_isr(admin, topic)[0].leader
            survivor = next(n for n in cluster.node_ids if n != leader)
            watcher = Admin(cluster.address(survivor))
            time.sleep(1.0)  # steady sending first
            failed = [e for sender in senders for e in sender.errors]
            if failed:
                raise RuntimeError(f"fail-over: a send failed before the kill: {failed[0]!r}")
            kill_ns = time.perf_counter_ns()
            for sender in senders:
                sender.arm(kill_ns)
            cluster.kill(leader)

            def moved(leader: int = leader, watcher: Admin = watcher) -> int | None:
                p = partitions_of(watcher, topic)[0]
                return p.leader if p.leader not in (leader, -1) else None
            new_leader = wait_until("a new leader", moved, 30, interval_s=0.01)
            elected_ns = time.perf_counter_ns()
            firsts = [wait_until("an ack from the new leader", lambda s=s: s.first_ack_ns, 60, 0.005)
                      for s in senders]
            watcher.close()
            assert isinstance(new_leader, int) and all(isinstance(f, int) for f in firsts)
            out.append(Failover(leader, new_leader, (elected_ns - kill_ns) / 1e6,
                                *((f - kill_ns) / 1e6 for f in firsts)))  # type: ignore[operator]
            progress(f"  fail-over {len(out)}/{repetitions}: killed broker {leader}, broker {new_leader} leads; "
                     f"first ack {out[-1].first_ack_ms:,.0f} ms after the kill")
            cluster.start(leader)
    finally:
        for sender in senders:
            sender.close()
    return out, senders


# ---------------------------------------------------------------------------- the run


def ms(x: float) -> str:
    return f"{x:,.1f}"


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n", 1)[0])
    parser.add_argument("--quick", action="store_true", help="a smoke run (~50 s): small sizes, one fail-over")
    parser.add_argument("--records", type=int, default=1_000_000, help="records of a send_batch run")
    parser.add_argument("--send-records", type=int, default=100_000, help="records of a send() run")
    parser.add_argument("--partitions", type=int, default=3)
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--seconds", type=float, default=15.0, help="length of each latency run")
    parser.add_argument("--lag-seconds", type=float, default=15.0)
    parser.add_argument("--failovers", type=int, default=5)
    args = parser.parse_args(argv)
    if args.quick:
        args.records, args.send_records, args.repeats = 50_000, 5_000, 1
        args.seconds, args.lag_seconds, args.failovers = 2.0, 2.0, 1
    warmup = min(1000, int(args.seconds * 100))
    load_before = os.getloadavg()

    def say(line: str) -> None:
        print(line, flush=True)

    say(f"logstore replication benchmark: 3 brokers + etcd as processes on loopback (broker session "
        f"{SESSION_MS} ms), {VALUE_BYTES}-byte values, RF=3 topics with min.insync.replicas=2")
    say(machine_line())
    tables = list(value_tables(args.records, rows=TABLE_ROWS))
    values = [bytes(v) for v in np.frombuffer(np.random.default_rng(2).bytes(args.send_records * VALUE_BYTES),
                                              dtype=f"S{VALUE_BYTES}")]
    configs = [("RF=3 acks=all", 3, "all"), ("RF=1 acks=1", 1, 1), ("single broker acks=1", None, 1)]
    results = {label: Throughput(label) for label, _, _ in configs}

    with LocalCluster(3, session_timeout_ms=SESSION_MS) as cluster, EmbeddedBroker(subprocess=True) as single, \
            Admin(cluster.bootstrap) as admin, Admin(single.bootstrap) as single_admin:
        say(f"cluster up: bootstrap {cluster.bootstrap}; single broker {single.bootstrap}")
        cluster_pids = [cluster.pid(n) for n in cluster.node_ids]
        for i in range(args.repeats):
            for mode in ("send_batch", "send()"):
                for label, rf, acks in configs:
                    on_single = rf is None
                    run = produce_run(single.bootstrap if on_single else cluster.bootstrap,
                                      single_admin if on_single else admin,
                                      [single.pid] if on_single else cluster_pids, mode=mode, rf=rf, acks=acks,
                                      partitions=args.partitions, tables=tables, values=values)
                    results[label].runs[mode].append(run)
            say(f"  throughput round {i + 1}/{args.repeats} done")

        latency: list[Result] = []
        for rf, acks, linger in ((3, "all", 0), (1, 1, 0), (3, "all", 5)):
            topic = new_topic(admin, 1, rf)
            wait_full_isr(admin, topic)
            r = run_produce_consume(cluster.bootstrap, topic, acks=acks, seconds=args.seconds, warmup=warmup,
                                    linger_ms=linger)
            r.name = f"RF={rf} acks={acks} linger {linger}"
            latency.append(r)
            admin.delete_topics([topic])
            say(f"  latency {r.name} done")

        lag = measure_lag(cluster, admin, args.lag_seconds)
        say(f"  follower lag done ({lag.samples} follower samples, {lag.rounds_per_s:.0f} rounds/s)")
        failovers, senders = measure_failovers(cluster, admin, args.failovers, say)

    # ------------------------------------------------------------------ report
    say("")
    say(f"(1) produce throughput, best of {args.repeats}, {args.partitions} partitions, idempotent producer")
    say(f"{'':<32}{'records/s':>11}{'MB/s':>7}{'client CPU':>12}{'broker CPU':>12}  (CPU: us per record)")
    for mode in ("send_batch", "send()"):
        for label, _, _ in configs:
            b = results[label].best(mode)
            say(f"{mode + ' ' + label:<32}{b.records / b.wall:>11,.0f}{b.records * VALUE_BYTES / b.wall / 1e6:>7.1f}"
                f"{b.client_cpu / b.records * 1e6:>12.2f}{b.broker_cpu / b.records * 1e6:>12.2f}")
    rf3, rf1, one = (results[label] for label, _, _ in configs)
    ratio_batch = rf3.rate("send_batch") / rf1.rate("send_batch")
    ratio_send = rf3.rate("send()") / rf1.rate("send()")
    say(f"(send_batch: {len(tables)} tables of {TABLE_ROWS:,} rows = {args.records:,} records; send(): "
        f"{args.send_records:,} records; MB/s counts the values)")
    for mode in ("send_batch", "send()"):
        cpu3, cpu1 = ((r.best(mode).client_cpu + r.best(mode).broker_cpu) / r.best(mode).records for r in (rf3, rf1))
        say(f"{mode}: RF=3 acks=all takes {cpu3 / cpu1:.2f}x the CPU per record of RF=1 acks=1 (all processes); "
            f"on a machine its cores bound, that caps the ratio at {cpu1 / cpu3:.2f}x")
    say(f"ratio RF=1 acks=1 / single broker: send_batch {rf1.rate('send_batch') / one.rate('send_batch'):.2f}x, "
        f"send() {rf1.rate('send()') / one.rate('send()'):.2f}x")

    say("")
    say(f"(2) end-to-end latency at {1000:,} records/s, one partition, {args.seconds:g} s per run "
        f"({warmup} warm-up records not counted)")
    say(f"{'latency, ms':<24}{'p50':>10}{'p99':>10}{'p99.9':>10}{'max':>10}{'received':>13}")
    for r in latency:
        say(f"{r.name:<24}{r.p['p50']:>10.2f}{r.p['p99']:>10.2f}{r.p['p99.9']:>10.2f}{r.p['max']:>10.2f}"
            f"{f'{r.received}/{r.sent}':>13}")
    lat3, lat1, lat3_linger = latency
    for r in latency:
        if r.lateness is not None:
            say(f"{r.name}: the producer reached its ticks late by p99 {r.lateness['p99']:.2f} ms, "
                f"max {r.lateness['max']:.2f} ms")
    say(f"ratio RF=3 acks=all / RF=1 acks=1: p50 {lat3.p['p50'] / lat1.p['p50']:.2f}x, "
        f"p99 {lat3.p['p99'] / lat1.p['p99']:.2f}x")

    say("")
    say(f"(3) follower lag at {LAG_RATE:,} records/s (acks=1, linger 5 ms, RF=3, leader broker {lag.leader}); "
        f"{lag.samples} samples of the 2 followers, {lag.rounds_per_s:.0f} sampling rounds/s")
    f_ack, f_send, h_ack = (percentiles(a / 1e3) for a in (lag.follower_ack_ms, lag.follower_send_ms, lag.hwm_ack_ms))
    behind = np.percentile(lag.behind, [50, 99]) if len(lag.behind) else [float("nan")] * 2
    say(f"follower LEO lag, ms (since the leader's ack)    p50 {f_ack['p50']:>6.2f}  p99 {f_ack['p99']:>6.2f}  "
        f"max {f_ack['max']:>7.2f}")
    say(f"follower LEO lag, ms (since send: upper bound)   p50 {f_send['p50']:>6.2f}  p99 {f_send['p99']:>6.2f}  "
        f"max {f_send['max']:>7.2f}")
    say(f"leader HWM lag, ms (on every ISR replica)        p50 {h_ack['p50']:>6.2f}  p99 {h_ack['p99']:>6.2f}  "
        f"max {h_ack['max']:>7.2f}")
    say(f"follower records behind the leader's LEO         p50 {behind[0]:>6.0f}  p99 {behind[1]:>6.0f}")

    say("")
    say(f"(4) fail-over: SIGKILL of the leader while two producers send {FAILOVER_RATE} records/s each with "
        f"acks=all (broker session {SESSION_MS} ms); retry backoff 100 ms doubling to 1 s (default) "
        f"and to {FAST_BACKOFF_MAX_MS} ms")
    for i, f in enumerate(failovers, 1):
        say(f"  run {i}: killed {f.killed} -> leader {f.new_leader}: new leader in metadata after "
            f"{ms(f.elected_ms)} ms, first ack after {ms(f.first_ack_ms)} ms (default backoff), "
            f"{ms(f.first_ack_fast_ms)} ms (backoff <= {FAST_BACKOFF_MAX_MS} ms)")
    firsts = [f.first_ack_ms for f in failovers]
    fast = [f.first_ack_fast_ms for f in failovers]
    elected = [f.elected_ms for f in failovers]
    errors = [e for s in senders for e in s.errors]
    say(f"fail-over, ms: median {ms(float(np.median(firsts)))}, worst {ms(max(firsts))}; with backoff <= "
        f"{FAST_BACKOFF_MAX_MS} ms median {ms(float(np.median(fast)))}, worst {ms(max(fast))}; new leader named: "
        f"median {ms(float(np.median(elected)))}, worst {ms(max(elected))}")
    say(f"records sent {sum(len(s.sent_ns) for s in senders):,}, acknowledged "
        f"{sum(len(s.acked_ns) for s in senders):,}, failed {len(errors)}")
    say(f"ratio fail-over / broker session: median {np.median(firsts) / SESSION_MS:.2f}x, "
        f"worst {max(firsts) / SESSION_MS:.2f}x (backoff <= {FAST_BACKOFF_MAX_MS} ms: worst "
        f"{max(fast) / SESSION_MS:.2f}x)")

    say("")
    complete = all(r.received == r.sent for r in latency) and not errors
    say(f"RF=3/RF=1 throughput: send_batch {ratio_batch:.2f}x   target >= 0.5x: {verdict(ratio_batch >= 0.5)}")
    say(f"RF=3/RF=1 throughput: send()     {ratio_send:.2f}x   target >= 0.5x: {verdict(ratio_send >= 0.5)}")
    for r in (lat3, lat3_linger):
        say(f"{r.name}: p99 = {r.p['p99']:.2f} ms   target <= 15 ms: "
            f"{verdict(r.p['p99'] <= 15.0 and r.received == r.sent)}")
    say(f"follower lag p99 = {f_ack['p99']:.2f} ms   target < 10 ms: {verdict(f_ack['p99'] < 10.0)}")
    say(f"fail-over worst = {ms(max(firsts))} ms   target <= 3,000 ms: {verdict(max(firsts) <= 3000 and not errors)}")
    say(f"fail-over worst, backoff <= {FAST_BACKOFF_MAX_MS} ms = {ms(max(fast))} ms   target <= 3,000 ms: "
        f"{verdict(max(fast) <= 3000 and not errors)}")
    after = os.getloadavg()
    say(f"load average before {load_before[0]:.2f}, after {after[0]:.2f} (2 cores: above ~1 the figures "
        f"measure the machine's other work too){'' if complete else '; SOME RECORDS MISSING OR FAILED'}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
