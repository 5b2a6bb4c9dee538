"""The liveness harness (tests/support/liveness_harness.py): its checks catch what they must.

The long run is ``make chaos-liveness`` (benchmarks/chaos_liveness.py).
"""

from __future__ import annotations

from pathlib import Path

import pytest
from cluster_harness import Fault
from liveness_harness import Txn, check_transactions, run_liveness, stalls


def test_stalls_measure_from_each_heal_to_the_next_success() -> None:
    faults = [Fault(1.0, 3.0, "pause", "broker 1"), Fault(10.0, 12.0, "kill_leader", "broker 2")]
    t0 = 100.0
    times = {"p0": [100.5, 103.5, 104.0, 112.2], "p1": [101.0, 103.0]}
    got = {(s.fault.kind, s.what): round(s.seconds, 3) for s in stalls(faults, t0, times, until=120.0)}
    assert got == {("pause", "p0"): 0.5, ("pause", "p1"): 0.0,
                   ("kill_leader", "p0"): 0.2, ("kill_leader", "p1"): 8.0}  # p1 never wrote again
    # A fault that begins before a series recovered cuts the stall of the one before it.
    faults.append(Fault(14.0, 15.0, "cut_link", "1<->2"))
    got = {(s.fault.kind, s.what): round(s.seconds, 3) for s in stalls(faults, t0, times, until=120.0)}
    assert got[("kill_leader", "p1")] == 2.0 and got[("cut_link", "p1")] == 5.0


def test_transactions_must_be_whole_and_aborted_ones_invisible() -> None:
    txns = [Txn([b"a1", b"a2"], "committed"), Txn([b"b1", b"b2"], "committed"),
            Txn([b"c1", b"c2"], "aborted", "send: x"), Txn([b"d1", b"d2"], "unknown", "commit: y"),
            Txn([b"e1", b"e2"], "unknown", "commit: z")]
    read = {0: {0: b"a1", 1: b"b1", 2: b"c1", 3: b"d1", 4: b"e1", 5: b"a1"}, 1: {0: b"a2", 1: b"e2"}}
    problems = check_transactions(txns, read)
    assert any("read 2 times" in p for p in problems)
    assert any(p.startswith("committed b'b1'") for p in problems)
    assert any(p.startswith("aborted b'c1'") for p in problems)
    assert any(p.startswith("unknown b'd1'") for p in problems)
    assert not any("e1" in p for p in problems)  # unknown, and whole: fine
    assert len(problems) == 4, problems
    assert check_transactions(txns[:1] + txns[4:], {0: {0: b"a1", 1: b"a2", 2: b"e1", 3: b"e2"}}) == []


@pytest.mark.timeout(420)
def test_one_producer_of_each_kind_recovers_from_every_kind_of_fault(tmp_path: Path) -> None:
    """A bounded liveness run: one idempotent and one transactional producer, never replaced,
    and a group, through one fault of each kind (a SIGSTOPped broker, leader and coordinator
    SIGKILLs, a cut link) with delivery timeouts shorter than the longest fault. After each
    heal every partition and the transactions succeed again within one session timeout;
    nothing is lost, no aborted transaction is visible, the group gets every record."""
    report = run_liveness(tmp_path / "cluster", faults=4, seed=7, session_timeout_ms=6000)
    assert report.ok, report.summary() + "".join(
        f"\n{s.what}: {s.seconds:.1f} s after {s.fault.kind} {s.fault.target}" for s in report.worst)
    assert {f.kind for f in report.faults} == {"pause", "kill_leader", "kill_coordinator", "cut_link"}
    assert report.result.replica_batches_compared > 0, report.summary()
