"""benchmarks/bench_replication.py --quick runs end to end and prints every figure of issue 11.

The numbers are not checked (a shared machine makes them drift; docs/benchmarks.md quotes a
full run): only that each figure's line is there, with its baseline, ratio and verdict, so the
benchmark cannot rot between the runs that produce the figures docs/benchmarks.md quotes. It
starts a real LocalCluster (etcd + 3 brokers) and the single embedded broker, like the full run.
"""

from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]

# One pattern per figure line docs/benchmarks.md quotes; a verdict is PASS or MISS.
EXPECTED = [
    r"^machine +os\.cpu_count\(\)=\d+ +load average",
    r"^send_batch RF=3 acks=all +[\d,]+ +[\d.]+",
    r"^send_batch RF=1 acks=1 +[\d,]+",
    r"^send_batch single broker acks=1 +[\d,]+",
    r"^send\(\) RF=3 acks=all +[\d,]+",
    r"^send\(\) RF=1 acks=1 +[\d,]+",
    r"^send\(\) single broker acks=1 +[\d,]+",
    r"^RF=3 acks=all linger 0 +[\d.]+ +[\d.]+ +[\d.]+ +[\d.]+ +\d+/\d+",
    r"^RF=1 acks=1 linger 0 +[\d.]+ +[\d.]+",
    r"^RF=3 acks=all linger 5 +[\d.]+ +[\d.]+",
    r"^ratio RF=3 acks=all / RF=1 acks=1: p50 [\d.]+x, p99 [\d.]+x",
    r"^follower LEO lag, ms \(since the leader's ack\) +p50 +[\d.]+ +p99 +[\d.]+",
    r"^leader HWM lag, ms .* p50 +[\d.]+ +p99 +[\d.]+",
    r"^  run 1: killed \d -> leader \d: new leader in metadata after [\d,.]+ ms, first ack after [\d,.]+ ms "
    r"\(default backoff\), [\d,.]+ ms",
    r"^RF=3/RF=1 throughput: send_batch +[\d.]+x +target >= 0\.5x: (PASS|MISS)",
    r"^RF=3/RF=1 throughput: send\(\) +[\d.]+x +target >= 0\.5x: (PASS|MISS)",
    r"^RF=3 acks=all linger 0: p99 = [\d.]+ ms +target <= 15 ms: (PASS|MISS)",
    r"^follower lag p99 = [\d.]+ ms +target < 10 ms: (PASS|MISS)",
    r"^fail-over worst = [\d,.]+ ms +target <= 3,000 ms: (PASS|MISS)",
    r"^fail-over worst, backoff <= 200 ms = [\d,.]+ ms +target <= 3,000 ms: (PASS|MISS)",
    r"^load average before [\d.]+, after [\d.]+",
]


@pytest.mark.timeout(300)
def test_quick_run_prints_every_figure_with_its_baseline_and_verdict() -> None:
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(REPO), os.environ.get("PYTHONPATH", "")])}
    proc = subprocess.run([sys.executable, str(REPO / "benchmarks" / "bench_replication.py"), "--quick"],
                          cwd=REPO, env=env, capture_output=True, text=True, timeout=280)
    output = proc.stdout + proc.stderr
    assert proc.returncode == 0, output
    missing = [p for p in EXPECTED if not re.search(p, proc.stdout, re.MULTILINE)]
    assert not missing, f"lines not printed: {missing}\n{output}"
    assert "SOME RECORDS MISSING OR FAILED" not in proc.stdout, output
