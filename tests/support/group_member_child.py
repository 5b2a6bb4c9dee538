"""A consumer group member in its own process, for tests that SIGKILL members.

Usage: ``python tests/support/group_member_child.py --bootstrap H:P --group G --topic T [--instance-id I]
[--auto-commit-ms N] [--hold]``. With ``--hold`` the process starts (and imports) but creates its
consumer only when a line arrives on stdin, so a test can time a member's arrival without the
seconds a Python start takes on a loaded machine. Prints one JSON document per line on stdout (flushed), with ``t`` =
``time.monotonic()`` (the same clock in every process of the machine):

* ``{"ev": "ready", "member_id": ...}`` once the consumer exists;
* ``{"ev": "assigned" | "revoked" | "lost", "tps": [partition, ...], "t": ...}`` from the
  rebalance callbacks (revoked: after the positions were committed, before they are given up);
* ``{"ev": "records", "p": partition, "offsets": [...], "t": ...}`` for what each poll returned;
* ``{"ev": "closed"}`` after a graceful shutdown (SIGTERM: commit, leave the group).
"""

from __future__ import annotations

import argparse
import json
import signal
import sys
import threading
import time
from typing import Any

from logstore import Consumer, TopicPartition


def emit(doc: dict[str, Any]) -> None:
    sys.stdout.write(json.dumps(doc, separators=(",", ":")) + "\n")
    sys.stdout.flush()


def main() -> int:
    parser = argparse.ArgumentParser()
    parser.add_argument("--bootstrap", required=True)
    parser.add_argument("--group", required=True)
    parser.add_argument("--topic", required=True)
    parser.add_argument("--instance-id", default=None)
    parser.add_argument("--auto-commit-ms", type=int, default=300)
    parser.add_argument("--hold", action="store_true")
    args = parser.parse_args()
    stop = threading.Event()
    signal.signal(signal.SIGTERM, lambda *_: stop.set())

    def callback(ev: str) -> Any:
        def fn(tps: set[TopicPartition]) -> None:
            emit({"ev": ev, "tps": sorted(tp.partition for tp in tps), "t": time.monotonic()})
        return fn

    if args.hold:
        emit({"ev": "held"})
        sys.stdin.readline()
    consumer = Consumer(
        args.bootstrap, group_id=args.group, subscribe=[args.topic], group_instance_id=args.instance_id,
        auto_offset_reset="earliest", auto_commit_interval_ms=args.auto_commit_ms, fetch_max_wait_ms=200,
        on_partitions_assigned=callback("assigned"), on_partitions_revoked=callback("revoked"),
        on_partitions_lost=callback("lost"), client_id=f"child-{args.instance_id or 'dynamic'}",
    )
    emit({"ev": "ready", "member_id": consumer.member_id})
    while not stop.is_set():
        records = consumer.poll(timeout_ms=100)
        by_partition: dict[int, list[int]] = {}
        for r in records:
            by_partition.setdefault(r.partition, []).append(r.offset)
        now = time.monotonic()
        for p, offsets in sorted(by_partition.items()):
            emit({"ev": "records", "p": p, "offsets": offsets, "t": now})
    consumer.close()
    emit({"ev": "closed"})
    return 0


if __name__ == "__main__":
    sys.exit(main())
