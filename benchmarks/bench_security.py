"""The cost of security on the produce path (issue 12): plaintext vs TLS vs mTLS, one run.

Three embedded brokers (child processes) on loopback, one per mode, are measured
back to back, in rounds (modes interleaved, so a burst of load on this shared
machine hits every mode alike):

* **throughput** — ``Producer.send_batch`` of Arrow batches (``--batch-rows`` rows of
  ``--value-bytes`` values, acks=1) for ``--seconds``: MB/s and records/s;
* **latency** — one-record ``send().result()`` round trips (acks=1, linger 0):
  p50 and p99 in ms.

Each round starts with the next mode (plaintext, TLS, mTLS, then TLS, mTLS, plaintext, ...),
so no mode is always measured first.

Printed as ratios against plaintext measured in the same run, with the machine's load
average (absolute numbers drift on a shared machine; the ratios are the result).

``--authorizer`` adds a mode with the ACL authorizer on (mTLS + an ACL allowing the
client's certificate principal to write the topic), with sec-acl's broker keys
(``authorizer``, ``allow_everyone_if_no_acl_found``) and ``logstore.acl.AclBinding``; on a
broker without an ``authorizer`` key the mode is skipped with a line saying so. (Written
against sec-acl's branch; run on the merge for the Security benchmark of docs/benchmarks.md.)

    python benchmarks/bench_security.py [--seconds 5] [--rounds 2] [--quick]
"""

from __future__ import annotations

import argparse
import dataclasses
import os
import statistics
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import numpy as np
import pyarrow as pa

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "tests" / "support"))

from benchutil import machine_line  # noqa: E402
from security_helpers import make_certificates  # noqa: E402

from logstore import Admin, Producer  # noqa: E402
from logstore.broker.config import BrokerConfig  # noqa: E402
from logstore.broker.embedded import EmbeddedBroker  # noqa: E402

MODES = ("plaintext", "tls", "mtls")


@dataclasses.dataclass
class Sample:
    mb_s: list[float] = dataclasses.field(default_factory=list)
    rec_s: list[float] = dataclasses.field(default_factory=list)
    p50_ms: list[float] = dataclasses.field(default_factory=list)
    p99_ms: list[float] = dataclasses.field(default_factory=list)


def _batch(rows: int, value_bytes: int) -> pa.Table:
    values = np.random.default_rng(7).integers(0, 256, rows * value_bytes, dtype=np.uint8).tobytes()
    offsets = pa.array(np.arange(0, (rows + 1) * value_bytes, value_bytes, dtype=np.int32))
    value = pa.BinaryArray.from_buffers(pa.binary(), rows, [None, offsets.buffers()[1], pa.py_buffer(values)])
    return pa.table({"value": value})


def _broker_config(mode: str, certs: Any) -> dict[str, Any]:
    if mode == "plaintext":
        return {}
    config = {"tls_cert": certs.server_cert, "tls_key": certs.server_key}
    if mode in ("mtls", "authorizer"):
        config["tls_client_ca"] = certs.ca
    if mode == "authorizer":
        # sec-acl's keys: the authorizer on; with no ACL on a resource everyone may, so the
        # client may create the topic; the topic's own ACL (_grant) then decides, as in
        # benchmarks/bench_authorizer.py.
        config.update({"authorizer": True, "allow_everyone_if_no_acl_found": True})
    return config


def _grant(admin: Admin, principal: str) -> None:
    """ACLs of the authorizer mode: WRITE on the topic for the client (sec-acl's model)."""
    from logstore.acl import AclBinding  # type: ignore[import-not-found]  # sec-acl's module

    admin.create_acls([AclBinding.create(resource_type="TOPIC", resource_name="bench",
                                         principal=principal, operation="WRITE")])


def _client_options(mode: str, certs: Any) -> dict[str, Any]:
    if mode == "plaintext":
        return {}
    options = {"security_protocol": "SSL", "ssl_cafile": certs.ca}
    if mode in ("mtls", "authorizer"):
        options["ssl_certfile"], options["ssl_keyfile"] = certs.client("admin")
    return options


def _throughput(bootstrap: str, client: dict[str, Any], table: pa.Table, seconds: float) -> tuple[float, float]:
    with Producer(bootstrap, acks=1, linger_ms=5, **client) as producer:
        producer.send_batch("bench", table).result(timeout=60)  # warm: connection, handshake
        sent = 0
        start = time.perf_counter()
        futures = []
        while time.perf_counter() - start < seconds:
            futures.append(producer.send_batch("bench", table))
            sent += table.num_rows
            if len(futures) >= 8:
                futures.pop(0).result(timeout=60)
        for f in futures:
            f.result(timeout=60)
        elapsed = time.perf_counter() - start
    nbytes = sent * len(table.column("value")[0].as_py())
    return nbytes / elapsed / 1e6, sent / elapsed


def _latency(bootstrap: str, client: dict[str, Any], count: int) -> tuple[float, float]:
    with Producer(bootstrap, acks=1, linger_ms=0, **client) as producer:
        producer.send("bench", value=b"x" * 100).result(timeout=30)  # warm: connection, handshake
        samples = []
        for _ in range(count):
            t0 = time.perf_counter()
            producer.send("bench", value=b"x" * 100).result(timeout=30)
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
    parser.add_argument("--authorizer", action="store_true", help="add mTLS + the ACL authorizer")
    parser.add_argument("--quick", action="store_true", help="1 round of 1 s, 200 latency samples")
    args = parser.parse_args(argv)
    if args.quick:
        args.seconds, args.rounds, args.latency_count = 1.0, 1, 200
    modes = list(MODES)
    if args.authorizer:
        if "authorizer" in {f.name for f in dataclasses.fields(BrokerConfig)}:
            modes.append("authorizer")
        else:
            print("authorizer: skipped: this broker has no `authorizer` config key yet (sec-acl's branch)")
    print(machine_line())
    table = _batch(args.batch_rows, args.value_bytes)
    results = {mode: Sample() for mode in modes}
    with tempfile.TemporaryDirectory(prefix="bench-security-") as tmp:
        certs = make_certificates(Path(tmp) / "certs")
        brokers = {}
        try:
            for mode in modes:
                brokers[mode] = EmbeddedBroker(os.path.join(tmp, mode), subprocess=True,
                                               overrides=_broker_config(mode, certs)).start()
                with Admin(brokers[mode].bootstrap, **_client_options(mode, certs)) as admin:
                    admin.create_topic("bench", num_partitions=1)
                    if mode == "authorizer":
                        _grant(admin, "User:admin")  # the mTLS client certificate's principal
            for round_no in range(args.rounds):
                # Each round starts with another mode: no mode always runs first (warm-up, load).
                for mode in modes[round_no % len(modes):] + modes[:round_no % len(modes)]:
                    client = _client_options(mode, certs)
                    mb_s, rec_s = _throughput(brokers[mode].bootstrap, client, table, args.seconds)
                    p50, p99 = _latency(brokers[mode].bootstrap, client, args.latency_count)
                    sample = results[mode]
                    sample.mb_s.append(mb_s)
                    sample.rec_s.append(rec_s)
                    sample.p50_ms.append(p50)
                    sample.p99_ms.append(p99)
                    print(f"round {round_no + 1} {mode:<10} {mb_s:8.1f} MB/s {rec_s:12,.0f} rec/s "
                          f"p50 {p50:6.2f} ms p99 {p99:6.2f} ms", flush=True)
        finally:
            for broker in brokers.values():
                broker.stop()
    base = results["plaintext"]
    print()
    print(f"{'mode':<12}{'MB/s':>9}{'records/s':>13}{'x plain':>9}{'p50 ms':>9}{'x plain':>9}"
          f"{'p99 ms':>9}{'x plain':>9}   (median of {args.rounds} round(s))")
    for mode, s in results.items():
        mb, rec, p50, p99 = (statistics.median(v) for v in (s.mb_s, s.rec_s, s.p50_ms, s.p99_ms))
        bmb, bp50, bp99 = (statistics.median(v) for v in (base.mb_s, base.p50_ms, base.p99_ms))
        print(f"{mode:<12}{mb:9.1f}{rec:13,.0f}{mb / bmb:9.2f}{p50:9.2f}{p50 / bp50:9.2f}{p99:9.2f}{p99 / bp99:9.2f}")
    print(f"load average at the end: {' '.join(f'{x:.2f}' for x in os.getloadavg())}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
