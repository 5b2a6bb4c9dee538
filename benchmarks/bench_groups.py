"""Consumer group rebalance: a 10-member group on 100 partitions, one member joins (DESIGN §7).

Measured in one run against a broker in a child process (``EmbeddedBroker(subprocess=True)``,
the default group timeouts: session 45 s, heartbeat interval 5 s), members in this process
(one polling thread each, plus each consumer's heartbeat thread), a producer writing to every
partition all along:

(a) baseline    one ConsumerGroupHeartbeat round trip (an in-sync member, ``max_wait_ms=0``),
                the median of ``--rtt-samples`` calls;
(b) rebalance   from the moment the 11th member is created until every partition is owned
                again by exactly one member and the assignment is balanced (10 x 9 + 1 x 10),
                as the members' own rebalance callbacks report it; and how many partitions
                moved (were revoked from one member and assigned to another). Each moved
                partition pauses from its revocation at the old owner to its assignment at the
                new one; the others are never revoked (members that keep them are not stopped).

(b) runs ``--repeats`` times with the ``uniform`` (sticky) assignor, each on a fresh group, and
once with ``range`` for comparison. The ratio is (b)/(a): the rebalance in heartbeat round trips.

Target (issue "Consumer groups"): (b) <= 1 s with default timeouts, and only the moved
partitions pause (uniform: floor(100/11) = 9 move).

Run: ``.venv/bin/python benchmarks/bench_groups.py [--repeats 3]``.
"""

from __future__ import annotations

import argparse
import statistics
import sys
import threading
import time
import uuid
from dataclasses import dataclass, field

from benchutil import machine_line, verdict

from logstore import Admin, Consumer, Producer, TopicPartition
from logstore.broker.embedded import EmbeddedBroker
from logstore.client.rpc import BrokerClient

PARTITIONS = 100
MEMBERS = 10


@dataclass
class Ledger:
    """Who owns what, from the members' rebalance callbacks (timestamps: time.perf_counter())."""

    lock: threading.Lock = field(default_factory=threading.Lock)
    owned: dict[str, set[int]] = field(default_factory=dict)
    revoked_at: dict[int, float] = field(default_factory=dict)  # partition -> last revocation
    assigned_at: dict[int, float] = field(default_factory=dict)  # partition -> last assignment
    moved: set[int] = field(default_factory=set)
    revocations: int = 0
    done_at: float | None = None
    watching: bool = False
    changed: threading.Condition = field(init=False)

    def __post_init__(self) -> None:
        self.changed = threading.Condition(self.lock)

    def callbacks(self, name: str) -> dict[str, object]:
        self.owned[name] = set()

        def assigned(tps: set[TopicPartition]) -> None:
            now = time.perf_counter()
            with self.lock:
                self.owned[name] |= {tp.partition for tp in tps}
                for tp in tps:
                    self.assigned_at[tp.partition] = now
                    if self.watching and tp.partition in self.revoked_at:
                        self.moved.add(tp.partition)
                self._check(now)

        def revoked(tps: set[TopicPartition]) -> None:
            now = time.perf_counter()
            with self.lock:
                self.owned[name] -= {tp.partition for tp in tps}
                if self.watching:
                    self.revocations += len(tps)
                    for tp in tps:
                        self.revoked_at[tp.partition] = now
                self._check(now)

        return {"on_partitions_assigned": assigned, "on_partitions_revoked": revoked}

    def _check(self, now: float) -> None:
        sizes = [len(s) for s in self.owned.values()]
        union = set().union(*self.owned.values())
        if len(union) == PARTITIONS == sum(sizes) and max(sizes) - min(sizes) <= 1:
            if self.watching and self.done_at is None:
                self.done_at = now
            self.changed.notify_all()

    def wait_balanced(self, members: int, timeout_s: float) -> None:
        deadline = time.monotonic() + timeout_s
        with self.lock:
            while True:
                sizes = [len(s) for s in self.owned.values()]
                union = set().union(*self.owned.values()) if self.owned else set()
                if (len(sizes) == members and len(union) == PARTITIONS == sum(sizes)
                        and max(sizes) - min(sizes) <= 1 and (not self.watching or self.done_at is not None)):
                    return
                remaining = deadline - time.monotonic()
                if remaining <= 0:
                    raise TimeoutError(f"not balanced within {timeout_s} s: {sorted(sizes)}")
                self.changed.wait(remaining)


class Member:
    """A consumer polling in its own thread."""

    def __init__(self, bootstrap: str, group: str, topic: str, name: str, ledger: Ledger, assignor: str) -> None:
        self.consumer = Consumer(bootstrap, group_id=group, subscribe=[topic], auto_offset_reset="latest",
                                 fetch_max_wait_ms=500, group_remote_assignor=assignor, client_id=name,
                                 **ledger.callbacks(name))  # type: ignore[arg-type]
        self.records = 0
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name=f"member-{name}", daemon=True)
        self._thread.start()

    def _run(self) -> None:
        while not self._stop.is_set():
            self.records += len(self.consumer.poll(timeout_ms=100))

    def close(self) -> None:
        self._stop.set()
        self._thread.join(30)
        self.consumer.close()


class BackgroundProducer:
    def __init__(self, bootstrap: str, topic: str) -> None:
        self._stop = threading.Event()
        self._producer = Producer(bootstrap, linger_ms=5)
        self.sent = 0
        self._thread = threading.Thread(target=self._run, args=(topic,), daemon=True)
        self._thread.start()

    def _run(self, topic: str) -> None:
        while not self._stop.is_set():
            for p in range(PARTITIONS):
                self._producer.send(topic, b"x" * 100, partition=p)
            self.sent += PARTITIONS
            self._stop.wait(0.05)

    def close(self) -> None:
        self._stop.set()
        self._thread.join(30)
        self._producer.close()


@dataclass
class Result:
    assignor: str
    seconds: float
    moved: int
    revocations: int
    new_member: int
    pause_max_s: float
    pause_mean_s: float


def one_rebalance(bootstrap: str, topic: str, assignor: str) -> Result:
    group = f"bench-{assignor}-{uuid.uuid4().hex[:8]}"
    ledger = Ledger()
    members = [Member(bootstrap, group, topic, f"m{i}", ledger, assignor) for i in range(MEMBERS)]
    try:
        ledger.wait_balanced(MEMBERS, 120)
        time.sleep(0.5)  # settled: every member in sync, its heartbeat held by the broker
        with ledger.lock:
            ledger.watching = True
        start = time.perf_counter()
        members.append(Member(bootstrap, group, topic, "new", ledger, assignor))
        ledger.wait_balanced(MEMBERS + 1, 60)
        assert ledger.done_at is not None
        with ledger.lock:
            pauses = [ledger.assigned_at[p] - ledger.revoked_at[p] for p in ledger.moved]
            return Result(assignor, ledger.done_at - start, len(ledger.moved), ledger.revocations,
                          len(ledger.owned["new"]), max(pauses, default=0.0),
                          statistics.fmean(pauses) if pauses else 0.0)
    finally:
        for m in members:
            m.close()


def heartbeat_rtt(bootstrap: str, topic: str, samples: int) -> float:
    """Median round trip of a heartbeat of an in-sync member that is answered at once."""
    group = f"rtt-{uuid.uuid4().hex[:8]}"
    with BrokerClient(bootstrap) as client:
        first = client.groups.group_heartbeat_async(group, member_id="rtt", member_epoch=0, subscribed_topics=[topic],
                                             owned=[], request_seq=1).result(30)
        owned, epoch = first.assignment, first.member_epoch
        times = []
        for seq in range(2, samples + 2):
            t = time.perf_counter()
            answer = client.groups.group_heartbeat_async(group, member_id="rtt", member_epoch=epoch,
                                                  subscribed_topics=[topic], owned=owned, request_seq=seq,
                                                  max_wait_ms=0).result(30)
            times.append(time.perf_counter() - t)
            owned, epoch = answer.assignment, answer.member_epoch
        client.groups.group_heartbeat_async(group, member_id="rtt", member_epoch=-1, subscribed_topics=[], owned=[],
                                     request_seq=samples + 3).result(30)
    return statistics.median(times)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--rtt-samples", type=int, default=300)
    args = parser.parse_args(argv)
    print(machine_line())
    print(f"setup       {MEMBERS} members + 1 joining, {PARTITIONS} partitions, broker in a child process, "
          "default group timeouts (session 45 s, heartbeat interval 5 s)")
    with EmbeddedBroker(subprocess=True) as broker:
        topic = "bench-groups"
        with Admin(broker.bootstrap) as admin:
            admin.create_topic(topic, PARTITIONS)
        producer = BackgroundProducer(broker.bootstrap, topic)
        try:
            rtt = heartbeat_rtt(broker.bootstrap, topic, args.rtt_samples)
            print(f"(a) baseline  heartbeat round trip (median of {args.rtt_samples}): {rtt * 1000:.2f} ms")
            results = [one_rebalance(broker.bootstrap, topic, "uniform") for _ in range(args.repeats)]
            ranged = one_rebalance(broker.bootstrap, topic, "range")
        finally:
            producer.close()
    for i, r in enumerate(results, 1):
        print(f"(b) uniform   run {i}: every partition owned again after {r.seconds * 1000:7.1f} ms  "
              f"moved {r.moved:3d} (revoked {r.revocations}), new member has {r.new_member}, "
              f"pause of a moved partition max {r.pause_max_s * 1000:.1f} ms mean {r.pause_mean_s * 1000:.1f} ms")
    print(f"(b) range     run 1: every partition owned again after {ranged.seconds * 1000:7.1f} ms  "
          f"moved {ranged.moved:3d} (revoked {ranged.revocations}), new member has {ranged.new_member}, "
          f"pause of a moved partition max {ranged.pause_max_s * 1000:.1f} ms mean {ranged.pause_mean_s * 1000:.1f} ms")
    times = sorted(r.seconds for r in results)
    median = statistics.median(times)
    expected_moves = PARTITIONS // (MEMBERS + 1)
    only_moved = all(r.moved == r.revocations == expected_moves for r in results)
    print(f"rebalance   uniform median {median * 1000:.1f} ms, best {times[0] * 1000:.1f} ms, "
          f"worst {times[-1] * 1000:.1f} ms")
    print(f"ratio       (b)/(a) = {median / rtt:.0f} heartbeat round trips")
    print(f"target      rebalance <= 1000 ms: {verdict(times[-1] <= 1.0)}; only the {expected_moves} moved "
          f"partitions paused: {verdict(only_moved)} (range moved {ranged.moved})")
    return 0


if __name__ == "__main__":
    sys.exit(main())
