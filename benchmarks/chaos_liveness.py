"""The long liveness run (``make chaos-liveness``): clients that recover by themselves under faults.

Runs :func:`liveness_harness.run_liveness` (tests/support/liveness_harness.py): 3 brokers + etcd with
TCP proxies, one idempotent ``acks=all`` producer and one transactional producer kept for the
whole run (never replaced), a consumer in a group, and a nemesis that SIGKILLs leaders and
coordinators, SIGSTOPs brokers past their session and cuts links, one fault at a time. It
prints one line per fault, then the verdict: nothing lost or duplicated, every committed
transaction whole and no aborted one visible, the group given every acknowledged record, and
the longest time a producer was unable to write after a fault healed, against the bound of
one session timeout (issue 22). Not a timing benchmark: the load average is printed because
a loaded machine makes faults and recoveries slower.

    python benchmarks/chaos_liveness.py --faults 40 [--seed S] [--data-dir DIR] [--keep]
"""

from __future__ import annotations

import argparse
import shutil
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "tests" / "support"))

from benchutil import machine_line  # noqa: E402
from liveness_harness import run_liveness  # noqa: E402


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--faults", type=int, default=40)
    parser.add_argument("--seed", type=int, default=int(time.time()) % 100_000)
    parser.add_argument("--session-timeout-ms", type=int, default=6000)
    parser.add_argument("--data-dir", type=Path, default=None)
    parser.add_argument("--keep", action="store_true", help="keep the data directory (logs, segments)")
    args = parser.parse_args(argv)
    print(machine_line(), flush=True)
    print(f"liveness    seed {args.seed}  faults {args.faults}  session {args.session_timeout_ms} ms", flush=True)
    data_dir = args.data_dir or Path(tempfile.mkdtemp(prefix="logstore-liveness-"))
    report = None
    try:
        report = run_liveness(data_dir / "cluster", faults=args.faults, seed=args.seed,
                              session_timeout_ms=args.session_timeout_ms, log=lambda line: print(line, flush=True))
    except Exception as e:  # the run could not finish: no verdict, the logs are kept
        print(f"ERROR       the run stopped: {type(e).__name__}: {e}", flush=True)
    ok = report is not None and report.ok
    if report is not None:
        for ack in report.result.lost[:20]:
            print(f"LOST        partition {ack.partition} offset {ack.offset} value {ack.value!r}")
        for problem in report.txn_problems[:20]:
            print(f"TXN         {problem}")
        for error in report.fatal:
            print(f"FATAL       {error}")
        for stall in report.worst:
            flag = "STUCK " if stall.seconds > report.bound_s else "stall "
            print(f"{flag}      {stall.what}: {stall.seconds:.1f} s after {stall.fault.kind} {stall.fault.target}")
        print(report.summary())
    print(machine_line())
    if args.keep or args.data_dir is not None or not ok:
        print(f"data        {data_dir} (broker logs: cluster/broker-N.log)")
    else:
        shutil.rmtree(data_dir, ignore_errors=True)
    print("PASS" if ok else "FAIL")
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
