"""The cost of the ACL authorizer on the produce path (issue 12): off vs on, one run.

Two embedded brokers (child processes) on loopback: one without the authorizer, one with
it on and 1,000 ACLs (the client's WRITE on the topic among 999 others: other principals,
other topics, 100 prefixed), so every produce pays the checks a real deployment pays (WRITE
on the topic, the idempotent producer id's owner). Measured in rounds, the modes
interleaved (a burst of load on this shared machine hits both alike):

* **throughput** — ``Producer.send_batch`` of Arrow batches (``--batch-rows`` rows of
  ``--value-bytes`` values, acks=1) for ``--seconds``: MB/s and records/s;
* **latency** — one-record ``send().result()`` round trips (acks=1, linger 0): p50, p99;
* **one check** — the authorizer's decision alone, in-process, over ``--check-acls`` ACLs
  (10,000 by default, a tenth of them prefixed: a check scans the prefixed ones): µs per check.

Printed as ratios of "on" to "off" measured in the same run, with the load average. The
client connects in plaintext (principal ``User:ANONYMOUS``; the "on" broker's
``allow_everyone_if_no_acl_found`` lets it manage ACLs, the topic's own ACLs decide the
produce): TLS and SCRAM costs are ``bench_security.py``'s.

    python benchmarks/bench_authorizer.py [--seconds 5] [--rounds 2] [--quick]
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import time
from pathlib import Path

import numpy as np
import pyarrow as pa

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from benchutil import machine_line  # noqa: E402

from logstore import Admin, Producer  # noqa: E402
from logstore.acl import AclBinding  # noqa: E402
from logstore.broker.embedded import EmbeddedBroker  # noqa: E402
from logstore.broker.security.acls import Authorizer  # noqa: E402

TOPIC = "bench"
MODES = ("off", "on")


def _batch(rows: int, value_bytes: int) -> pa.Table:
    values = np.random.default_rng(7).integers(0, 256, rows * value_bytes, dtype=np.uint8).tobytes()
    offsets = pa.array(np.arange(0, (rows + 1) * value_bytes, value_bytes, dtype=np.int32))
    value = pa.BinaryArray.from_buffers(pa.binary(), rows, [None, offsets.buffers()[1], pa.py_buffer(values)])
    return pa.table({"value": value})


def _acls(count: int = 1000) -> list[AclBinding]:
    """The client's WRITE on the topic among ``count - 1`` others, a tenth of them prefixed."""
    prefixed = count // 10
    mine = AclBinding.create(resource_type="TOPIC", resource_name=TOPIC, principal="User:ANONYMOUS",
                             operation="WRITE")
    noise = [AclBinding.create(resource_type="TOPIC", resource_name=f"t{i}", principal=f"User:u{i % 50}",
                               operation="READ") for i in range(count - 1 - prefixed)]
    noise += [AclBinding.create(resource_type="TOPIC", resource_name=f"p{i}-", principal=f"User:u{i}",
                                operation="WRITE", pattern_type="PREFIXED") for i in range(prefixed)]
    return [mine, *noise]


def _check_cost_us(acl_count: int, checks: int = 20_000) -> float:
    """Microseconds per authorizer decision over ``acl_count`` ACLs (the produce's WRITE check)."""
    authorizer = Authorizer(frozenset(_acls(acl_count)))
    assert authorizer.authorize("User:ANONYMOUS", "127.0.0.1", "WRITE", "TOPIC", TOPIC)
    start = time.perf_counter()
    for _ in range(checks):
        authorizer.authorize("User:ANONYMOUS", "127.0.0.1", "WRITE", "TOPIC", TOPIC)
    return (time.perf_counter() - start) / checks * 1e6


def _throughput(bootstrap: str, table: pa.Table, seconds: float) -> tuple[float, float]:
    with Producer(bootstrap, acks=1, linger_ms=5) as producer:
        producer.send_batch(TOPIC, table).result(timeout=60)  # warm
        sent, futures = 0, []
        start = time.perf_counter()
        while time.perf_counter() - start < seconds:
            futures.append(producer.send_batch(TOPIC, table))
            sent += table.num_rows
            if len(futures) >= 8:
                futures.pop(0).result(timeout=60)
        for f in futures:
            f.result(timeout=60)
        elapsed = time.perf_counter() - start
    value_bytes = len(table.column("value")[0].as_py())
    return sent * value_bytes / elapsed / 1e6, sent / elapsed


def _latency(bootstrap: str, count: int) -> tuple[float, float]:
    with Producer(bootstrap, acks=1, linger_ms=0) as producer:
        producer.send(TOPIC, value=b"x" * 100).result(timeout=30)  # warm
        samples = []
        for _ in range(count):
            t0 = time.perf_counter()
            producer.send(TOPIC, value=b"x" * 100).result(timeout=30)
            samples.append(time.perf_counter() - t0)
    ms = np.array(samples) * 1000
    return float(np.percentile(ms, 50)), float(np.percentile(ms, 99))


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--seconds", type=float, default=5.0, help="throughput run per mode and round")
    parser.add_argument("--rounds", type=int, default=2)
    parser.add_argument("--latency-count", type=int, default=1000)
    parser.add_argument("--batch-rows", type=int, default=10_000)
    parser.add_argument("--value-bytes", type=int, default=100)
    parser.add_argument("--check-acls", type=int, default=10_000, help="ACLs behind the one-check figure")
    parser.add_argument("--quick", action="store_true", help="1 round of 1 s, 200 latency samples")
    args = parser.parse_args(argv)
    if args.quick:
        args.seconds, args.rounds, args.latency_count = 1.0, 1, 200
    print(machine_line())
    table = _batch(args.batch_rows, args.value_bytes)
    results: dict[str, dict[str, list[float]]] = {m: {"mb_s": [], "rec_s": [], "p50": [], "p99": []} for m in MODES}
    configs = {"off": {}, "on": {"authorizer": True, "allow_everyone_if_no_acl_found": True}}
    brokers = {m: EmbeddedBroker(subprocess=True, overrides=configs[m]).start() for m in MODES}
    try:
        for mode, broker in brokers.items():
            with Admin(broker.bootstrap) as admin:
                admin.create_topic(TOPIC, num_partitions=1)
                if mode == "on":
                    admin.create_acls(_acls())
                    assert len(admin.describe_acls()) == 1000
        for r in range(args.rounds):
            for mode in MODES:
                mb_s, rec_s = _throughput(brokers[mode].bootstrap, table, args.seconds)
                p50, p99 = _latency(brokers[mode].bootstrap, args.latency_count)
                for key, value in (("mb_s", mb_s), ("rec_s", rec_s), ("p50", p50), ("p99", p99)):
                    results[mode][key].append(value)
                print(f"round {r + 1} {mode:>3}: {mb_s:8.1f} MB/s {rec_s:12,.0f} rec/s   "
                      f"latency p50 {p50:6.2f} ms p99 {p99:6.2f} ms", flush=True)
    finally:
        for broker in brokers.values():
            broker.close()
    med = {m: {k: statistics.median(v) for k, v in results[m].items()} for m in MODES}
    off, on = med["off"], med["on"]
    print(f"authorizer on / off: throughput x{on['mb_s'] / off['mb_s']:.2f}, "
          f"latency p50 x{on['p50'] / off['p50']:.2f}, p99 x{on['p99'] / off['p99']:.2f} "
          f"(medians of {args.rounds} round(s); load average {' '.join(f'{x:.1f}' for x in os.getloadavg())})")
    print(f"one check: {_check_cost_us(args.check_acls):.1f} us with {args.check_acls:,} ACLs "
          f"({args.check_acls // 10:,} prefixed), {_check_cost_us(1000):.1f} us with 1,000")
    return 0


if __name__ == "__main__":
    sys.exit(main())
