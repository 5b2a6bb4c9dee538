"""Reassignment: moving a topic's data to another broker with a replication throttle (issue 15).

Measured in one run against ``logstore.dev.local_cluster.LocalCluster(3)`` on loopback:

(a) raw disk write  ``--size`` MB written sequentially to a file in the cluster's data
                    directory and fsynced: the rate the disk itself takes (the baseline).
(b) move            a one-partition RF=1 topic filled with ``--size`` MB (100-byte values in
                    Arrow batches) gets a second replica on another broker
                    (``Admin.alter_partition_reassignments``, throttle ``--throttle`` MB/s);
                    time until the move completes, the copy rate (bytes / time) and its
                    ratio to the throttle and to (a).
(c) produce p99     a producer paced at ``--rate`` records/s (acks=all) to an RF=2 topic led
                    by the broker being copied from: send→ack latency percentiles for
                    ``--before`` seconds before the move and during the move.

Target (issue 15): the move does not starve producers: p99 during the move stays within a
small factor of p99 before it, and the copy rate stays at or below the throttle. Absolute
figures on a shared 2-core machine drift: the load average printed before and after says how
far to trust them.

Run: ``.venv/bin/python benchmarks/bench_reassign.py [--size 1024] [--throttle 50]``. Needs an
etcd server binary (``make etcd``).
"""

from __future__ import annotations

import argparse
import os
import threading
import time

from benchutil import machine_line, value_tables, verdict

from logstore.client.admin import Admin
from logstore.client.producer import Producer
from logstore.dev.local_cluster import LocalCluster
from logstore.types import NewTopic, TopicPartition

VALUE_BYTES = 100
MB = 1 << 20


def raw_write_mb_s(directory: str, size_mb: int) -> float:
    """Write ``size_mb`` MB sequentially (1 MB writes) and fsync; MB/s."""
    path = os.path.join(directory, "raw.bin")
    block = os.urandom(MB)
    started = time.perf_counter()
    with open(path, "wb") as f:
        for _ in range(size_mb):
            f.write(block)
        f.flush()
        os.fsync(f.fileno())
    took = time.perf_counter() - started
    os.remove(path)
    return size_mb / took


class Paced(threading.Thread):
    """Sends one record every 1/rate s; keeps (send time, latency) of each acknowledgement."""

    def __init__(self, bootstrap: str, topic: str, rate: int) -> None:
        super().__init__(daemon=True)
        self.producer = Producer(bootstrap, acks="all", linger_ms=0)
        self.topic, self.rate = topic, rate
        self.samples: list[tuple[float, float]] = []
        self.stopping = threading.Event()

    def run(self) -> None:
        interval = 1.0 / self.rate
        next_at = time.monotonic()
        while not self.stopping.is_set():
            sent = time.monotonic()

            def done(err: object, md: object, sent: float = sent) -> None:
                if err is None:
                    self.samples.append((sent, time.monotonic() - sent))
            self.producer.send(self.topic, b"x" * VALUE_BYTES, partition=0, on_delivery=done)
            next_at += interval
            self.stopping.wait(max(next_at - time.monotonic(), 0))

    def close(self) -> None:
        self.stopping.set()
        self.join(10)
        self.producer.close(timeout=10)


def p(latencies: list[float], q: float) -> float:
    xs = sorted(latencies)
    return xs[min(len(xs) - 1, int(q * len(xs)))] * 1000 if xs else float("nan")


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--size", type=int, default=1024, help="MB to move (default 1024)")
    ap.add_argument("--throttle", type=float, default=50.0, help="MB/s (default 50)")
    ap.add_argument("--rate", type=int, default=200, help="paced producer records/s (default 200)")
    ap.add_argument("--before", type=float, default=10.0, help="seconds of p99 before the move")
    args = ap.parse_args(argv)
    print(f"bench_reassign  size {args.size} MB  throttle {args.throttle:g} MB/s  producer {args.rate}/s")
    print(machine_line())
    with LocalCluster(3, session_timeout_ms=2000, replica_lag_time_max_ms=5000) as cluster:
        raw = raw_write_mb_s(str(cluster.data_dir), min(args.size, 512))
        print(f"(a) raw disk write        {raw:8.1f} MB/s")
        with Admin(cluster.bootstrap) as admin:
            admin.create_topics([NewTopic("moving", 1, replication_factor=1)])
            source = admin.describe_topics(["moving"])["moving"].partitions[0].replicas[0]
            others = [n for n in cluster.node_ids if n != source]
            records = args.size * MB // VALUE_BYTES
            started = time.perf_counter()
            with Producer(cluster.bootstrap, acks="1", linger_ms=5) as producer:
                for table in value_tables(records, rows=20_000, value_bytes=VALUE_BYTES):
                    producer.send_batch("moving", table, partition=0)
                producer.flush(600)
            print(f"    filled {args.size} MB in {time.perf_counter() - started:.1f} s")
            admin.create_topics([NewTopic("live", 1, replication_factor=2)])
            live = admin.describe_topics(["live"])["live"].partitions[0]
            if live.leader != source:  # the producer's leader is the broker the copy reads from
                admin.alter_partition_reassignments({TopicPartition("live", 0): [source, others[0]]})
                while admin.list_partition_reassignments(["live"]):
                    time.sleep(0.2)
                admin.elect_leaders("preferred", [TopicPartition("live", 0)])
            paced = Paced(cluster.bootstrap, "live", args.rate)
            paced.start()
            time.sleep(args.before)
            move_started = time.monotonic()
            throttle = int(args.throttle * MB)
            admin.alter_partition_reassignments({TopicPartition("moving", 0): [source, others[1]]},
                                                throttle_bytes_per_sec=throttle)
            while admin.list_partition_reassignments(["moving"]):
                time.sleep(0.2)
            move_s = time.monotonic() - move_started
            paced.close()
            total = admin.describe_topics(["moving"])["moving"].partitions[0].size_bytes or args.size * MB
    before = [lat for t, lat in paced.samples if t < move_started]
    during = [lat for t, lat in paced.samples if move_started <= t < move_started + move_s]
    rate = total / MB / move_s
    print(f"(b) move {total / MB:.0f} MB            {move_s:8.1f} s  = {rate:.1f} MB/s "
          f"({rate / args.throttle:.2f}x the throttle, {rate / raw:.2f}x raw disk write)")
    print(f"(c) produce p50/p99 before {p(before, 0.5):6.1f} / {p(before, 0.99):6.1f} ms  ({len(before)} acks)")
    print(f"    produce p50/p99 during {p(during, 0.5):6.1f} / {p(during, 0.99):6.1f} ms  ({len(during)} acks)"
          f"  p99 ratio {p(during, 0.99) / p(before, 0.99):.2f}x")
    print(f"copy rate <= 1.1x throttle: {verdict(rate <= 1.1 * args.throttle)}")
    print(machine_line())
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
