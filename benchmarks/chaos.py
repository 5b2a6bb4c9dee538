"""The long fault-harness run (``make chaos``): 3 brokers + etcd, a writer, ``--faults`` faults.

Runs :func:`cluster_harness.run_chaos` (tests/support/cluster_harness.py): a 3-broker cluster on
loopback with TCP proxies between the brokers, a topic with RF=3 and
``min.insync.replicas=2``, an ``acks=all`` writer, and a nemesis that SIGKILLs leaders
(and restarts them), SIGSTOPs brokers past their session and cuts links between two
brokers, one fault at a time. At the end it checks every acknowledged record is read
exactly once at its acknowledged offset and that the replicas are byte-identical below
the HWM. Prints one line per fault, then::

    faults run 100 (...); acknowledged N, failed sends F, read R, lost 0, duplicated 0, ...

Exit code 0 when nothing was lost, duplicated or diverged, 1 otherwise, 2 when the run could
not finish (e.g. a broker did not restart; its log is kept). The issue asks for
at least 100 faults with zero loss. Not a timing benchmark: it prints the load average
because a loaded machine makes faults last longer, not because a number is claimed.

    python benchmarks/chaos.py --faults 100 [--seed S] [--data-dir DIR] [--keep]
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
from cluster_harness import run_chaos  # noqa: E402


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--faults", type=int, default=100)
    parser.add_argument("--seed", type=int, default=int(time.time()) % 100_000)
    parser.add_argument("--partitions", type=int, default=3)
    parser.add_argument("--rate", type=float, default=300.0, help="records/s the writer aims at")
    parser.add_argument("--data-dir", type=Path, default=None,
                        help="where the cluster lives (default: a temporary directory)")
    parser.add_argument("--keep", action="store_true", help="keep the data directory (logs, segments)")
    args = parser.parse_args(argv)
    print(machine_line(), flush=True)
    print(f"chaos       seed {args.seed}  faults {args.faults}  partitions {args.partitions}  "
          f"rate {args.rate:.0f}/s", flush=True)
    data_dir = args.data_dir or Path(tempfile.mkdtemp(prefix="logstore-chaos-"))
    keep = args.keep or args.data_dir is not None
    report = None
    stopped: BaseException | None = None
    try:
        report = run_chaos(data_dir / "cluster", faults=args.faults, seed=args.seed,
                           partitions=args.partitions, rate=args.rate,
                           log=lambda line: print(line, flush=True))
    except Exception as e:  # the run could not finish: no verdict on loss, and the logs are kept
        stopped = e
        print(f"ERROR       the run stopped: {type(e).__name__}: {e}", flush=True)
    finally:
        ok = report is not None and report.result.ok
        if report is not None:
            result = report.result
            for ack in result.lost[:20]:
                print(f"LOST        partition {ack.partition} offset {ack.offset} value {ack.value!r}")
            for value in result.duplicated[:20]:
                print(f"DUPLICATED  {value!r}")
            for partition, offset in result.conflicting[:20]:
                print(f"CONFLICT    partition {partition} offset {offset} acknowledged twice")
            for problem in result.replica_mismatches:
                print(f"DIVERGED    {problem}")
            print(report.summary())
            print(f"producers   {report.producers_created} (a new one after each send that failed for good)")
        print(machine_line())
        if keep or not ok:
            print(f"data        {data_dir} (broker logs: cluster/broker-N.log)")
        else:
            shutil.rmtree(data_dir, ignore_errors=True)
    print("PASS: zero acknowledged records lost or duplicated, replicas identical" if ok else "FAIL")
    return 0 if ok else (2 if stopped is not None else 1)


if __name__ == "__main__":
    sys.exit(main())
