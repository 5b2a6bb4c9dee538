"""``make fuzz``: the RPC fuzzer of ``tests/support/fuzz_rpc_helpers.py`` for a long time, with a report.

Usage: ``python tests/support/fuzz_driver.py [--minutes 20] [--seed 1] [--examples 50] [--mode plaintext|sasl]``.

Starts a broker as a child process (its data dir in a fresh temp parent), then
round after round sends every RPC ``--examples`` hostile requests drawn by
hypothesis (a different seed each round, no shrinking: findings are recorded,
not raised). A progress line every 30 s; at the end the broker must still
serve a good produce and fetch, and the report says: requests, distinct
answers (error codes), the broker's RSS at start and at most, crashes (a
broker that died is restarted and counted), files outside the data dir, and
every finding with the request that caused it. Exit status 1 on any finding,
crash or stray file.

Run it on an otherwise quiet machine; it prints the load average.
"""

from __future__ import annotations

import argparse
import os
import shutil
import sys
import tempfile
import time
from typing import Any

from fuzz_rpc_helpers import (
    METHODS,
    Caller,
    Tally,
    calls,
    ensure_topic,
    problems,
    rss_bytes,
    security_of,
    snapshot,
    start_fuzz_broker,
)
from hypothesis import HealthCheck, Phase, given, seed, settings

from logstore import Admin, Consumer, NewTopic, Producer, TopicPartition
from logstore.broker.embedded import EmbeddedBroker
from logstore.client.security import ClientSecurity

DEADLINE_S = 5.0


def alive(broker: EmbeddedBroker, topic: str, security: ClientSecurity | None) -> bool:
    """A good produce and fetch still work."""
    with Admin(broker.bootstrap, security=security) as admin:
        admin.create_topics([NewTopic(topic, 1)])
    with Producer(broker.bootstrap, security=security) as p:
        p.send(topic, b"still here").result(30)
    with Consumer(broker.bootstrap, auto_offset_reset="earliest", security=security) as c:
        c.assign([TopicPartition(topic, 0)])
        for _ in range(20):
            got = [r.value for r in c.poll(timeout_ms=500)]
            if got:
                return got == [b"still here"]
    return False


def make_run(method: Any, caller: Caller, tally: Tally, broker: EmbeddedBroker, args: argparse.Namespace,
             round_no: int, rss: list[int]) -> Any:
    """One round of ``method``: ``args.examples`` requests, findings recorded, not raised."""
    @seed(args.seed * 1_000_003 + round_no)
    @settings(max_examples=args.examples, deadline=None, database=None, phases=[Phase.generate],
              suppress_health_check=list(HealthCheck))
    @given(payload=calls(method))
    def run(payload: list[bytes]) -> None:
        out = caller.call(method, payload)
        found = problems(method, payload, out, DEADLINE_S)
        tally.add(method, payload, out, found, describe=lambda: f"for {[p[:160] for p in payload]!r}")
        rss[0] = max(rss[0], rss_bytes(broker.pid))
        if not broker.running:
            raise RuntimeError("broker died")
    return run


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--minutes", type=float, default=20.0)
    ap.add_argument("--seed", type=int, default=1)
    ap.add_argument("--examples", type=int, default=50, help="requests per RPC per round")
    ap.add_argument("--mode", choices=("plaintext", "sasl"), default="plaintext",
                    help="an unauthenticated broker, or SASL + authorizer (the fuzzer a super user; "
                         "every 8th call with a forged session token)")
    args = ap.parse_args(argv)
    with open("/proc/loadavg") as f:
        print(f"load average: {f.read().strip()}", flush=True)
    os.environ.setdefault("LOGSTORE_LOG_LEVEL", "CRITICAL")  # the child broker's refusals are expected
    parent = tempfile.mkdtemp(prefix="logstore-fuzz-")
    data_dir = os.path.join(parent, "data")
    os.mkdir(data_dir)
    before = snapshot([parent], data_dir, shallow=[os.getcwd()])
    security = security_of(args.mode)
    broker = start_fuzz_broker(data_dir, args.mode)
    caller = Caller(broker.bootstrap, DEADLINE_S, security=security)
    tally = Tally(echo=True)
    rss_start = rss_bytes(broker.pid)
    rss = [rss_start]  # the maximum seen, updated by each call
    rss_max = rss_start
    crashes = 0
    started = time.monotonic()
    end = started + args.minutes * 60
    last_progress = started
    round_no = 0
    try:
        while time.monotonic() < end:
            round_no += 1
            for method in METHODS:
                if time.monotonic() >= end:
                    break
                ensure_topic(broker.bootstrap, security)  # DeleteTopics may have deleted it

                run = make_run(method, caller, tally, broker, args, round_no, rss)
                try:
                    run()
                except RuntimeError:
                    crashes += 1
                    tally.findings.append(f"{method.name}: the broker died (round {round_no}); restarted")
                    broker.stop()
                    broker = start_fuzz_broker(data_dir, args.mode)
                    caller.close()
                    caller = Caller(broker.bootstrap, DEADLINE_S, security=security)
                rss_max = rss[0]
                now = time.monotonic()
                if now - last_progress >= 30:
                    last_progress = now
                    print(f"[{now - started:6.0f} s] round {round_no}: {tally.requests} requests, "
                          f"{len(tally.codes)} distinct answers, RSS {rss_bytes(broker.pid) >> 20} MiB "
                          f"(max {rss_max >> 20}), findings {len(tally.findings)}, crashes {crashes}; "
                          f"top answers {dict(tally.codes.most_common(8))}", flush=True)
        ok = alive(broker, "after-fuzz", security)
    finally:
        caller.close()
        broker.stop()
    stray = {p for p in snapshot([parent], data_dir, shallow=[os.getcwd()]) - before
             if "__pycache__" not in p and ".hypothesis" not in p}
    shutil.rmtree(parent, ignore_errors=True)
    elapsed = time.monotonic() - started
    print(f"\nfuzz report ({args.mode} broker): {tally.requests} requests in {elapsed / 60:.1f} min over {len(tally.per_method)} RPCs "
          f"({tally.requests / elapsed:.0f}/s), {len(tally.codes)} distinct answers, broker RSS "
          f"{rss_start >> 20} MiB at start, {rss_max >> 20} MiB at most; crashes {crashes}; findings "
          f"{len(tally.findings)}; files outside the data dir {len(stray)}; alive afterwards: {ok}")
    print("answers:", dict(tally.codes.most_common()))
    for p in sorted(stray)[:20]:
        print("STRAY FILE", p)
    return 0 if ok and not tally.findings and not crashes and not stray else 1


if __name__ == "__main__":
    sys.exit(main())
