"""The kill run of a materialized view (DESIGN §7: claims come from kill tests).

The view runs in a child process (``python -m jobs.cli materialize``, its own
SparkSession, local[2]) that is SIGKILLed with its whole process group (the
Python driver, its JVM and Python workers) at random moments: during the
first batch, and at random delays after the k-th completed batch (so between
batches or in the middle of one). After every kill the Delta table must equal
the model "latest non-tombstone value per key up to the offsets the table has
committed", computed independently from the topic with the Python Consumer.
New records arrive between rounds. A final ``--available-now`` run from the
same checkpoint must leave the table equal to the model of the whole topic.
``tests/chaos/test_cluster_exactly_once.py`` runs it on a 3-broker cluster whose
partition leaders are killed meanwhile.
"""

from __future__ import annotations

import contextlib
import json
import os
import random
import re
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Callable
from contextlib import AbstractContextManager
from pathlib import Path

from materialize_helpers import model, new_topic, read_topic, read_view, send_all
from pyspark.sql import SparkSession

from jobs.materialize import committed_offsets

REPO = Path(__file__).resolve().parents[2]
BATCH_DONE = re.compile(r": batch \d+: ")
STARTED = re.compile(r" started \(checkpoint ")


class Child:
    """``python -m jobs.cli materialize ...`` in its own process group, its output collected by a thread."""

    def __init__(self, args: list[str], log_path: Path) -> None:
        self.lines: list[str] = []
        self.log = log_path.open("a")
        self.log.write(f"\n===== {' '.join(args)}\n")
        self.proc = subprocess.Popen(
            [sys.executable, "-m", "jobs.cli", "materialize", *args], cwd=REPO,
            stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, start_new_session=True,
        )
        self._reader = threading.Thread(target=self._read, daemon=True)
        self._reader.start()

    def _read(self) -> None:
        assert self.proc.stdout is not None
        for line in self.proc.stdout:
            self.lines.append(line)
            self.log.write(line)
            self.log.flush()

    def count(self, pattern: re.Pattern[str]) -> int:
        return sum(1 for line in list(self.lines) if pattern.search(line))

    def wait_for(self, pattern: re.Pattern[str], n: int, timeout_s: float) -> None:
        deadline = time.monotonic() + timeout_s
        while self.count(pattern) < n:
            if self.proc.poll() is not None:
                raise AssertionError(f"the child exited ({self.proc.returncode}):\n{''.join(self.lines[-40:])}")
            if time.monotonic() > deadline:
                raise AssertionError(f"no {pattern.pattern!r} x{n} within {timeout_s} s:\n{''.join(self.lines[-40:])}")
            time.sleep(0.05)

    def kill(self) -> None:
        """SIGKILL the child's process group (driver, JVM, Python workers) and reap the driver."""
        with contextlib.suppress(ProcessLookupError):
            os.killpg(self.proc.pid, signal.SIGKILL)
        self.proc.wait(timeout=60)
        self._reader.join(timeout=30)
        self.log.close()

    def wait(self, timeout_s: float) -> int:
        try:
            rc = self.proc.wait(timeout=timeout_s)
        except subprocess.TimeoutExpired:
            self.kill()
            raise AssertionError(f"the child did not finish within {timeout_s} s") from None
        self._reader.join(timeout=30)
        self.log.close()
        return rc


def json_value(v: bytes) -> tuple[int | None, str | None]:
    doc = json.loads(v)
    return doc.get("id"), doc.get("name")


def kill_run(spark: SparkSession, boot: str, tmp_path: Path,
             during: Callable[[str], AbstractContextManager[object]] | None = None) -> None:
    """Kill the view twice, finish it, compare with the model after each step. ``during(topic)``
    runs beside the kills (a nemesis on a cluster) and ends before the final run."""
    seed = int(os.environ.get("LOGSTORE_TEST_SEED", time.time_ns() % (1 << 32)))
    rng = random.Random(seed)
    topic = new_topic(boot, "mat-crash", 2)
    table, ck = str(tmp_path / "view"), str(tmp_path / "ck")
    keys = [b"user-%d" % i for i in range(60)]
    serial = iter(range(1 << 30))

    def chunk(n: int) -> list[tuple[bytes, bytes | None]]:
        out: list[tuple[bytes, bytes | None]] = []
        for _ in range(n):
            i = next(serial)
            value = None if rng.random() < 0.15 else json.dumps({"id": i, "name": f"n{i}"}).encode()
            out.append((rng.choice(keys), value))
        return out

    args = ["--bootstrap", boot, "--topic", topic, "--table", table, "--checkpoint", ck,
            "--parse-json-values", "id long, name string"]
    log_path = tmp_path / "children.log"
    with during(topic) if during is not None else contextlib.nullcontext():
        _kill_rounds(spark, boot, topic, table, args, log_path, rng, chunk, seed)
    send_all(boot, topic, chunk(100))
    final = Child([*args, "--available-now"], log_path)
    assert final.wait(timeout_s=400) == 0, "".join(final.lines[-40:])
    records = read_topic(boot, topic)
    want = model(records, value=json_value)
    assert read_view(spark, table, ["id", "name"]) == want
    assert committed_offsets(spark, table) == {
        p: max(r.offset for r in records if r.partition == p and r.key is not None)
        for p in {r.partition for r in records}
    }


def _kill_rounds(spark: SparkSession, boot: str, topic: str, table: str, args: list[str], log_path: Path,
                 rng: random.Random, chunk: Callable[[int], list[tuple[bytes, bytes | None]]], seed: int) -> None:
    for round_no in range(2):  # a kill during the first batch, then one after some batches
        send_all(boot, topic, chunk(300))
        child = Child([*args, "--max-offsets-per-trigger", "60"], log_path)
        try:
            if round_no == 0:
                # Anywhere from before the first batch to the middle of it.
                child.wait_for(STARTED, 1, timeout_s=240)
                time.sleep(rng.uniform(0.0, 4.0))
            else:
                child.wait_for(BATCH_DONE, rng.randint(1, 3), timeout_s=240)
                time.sleep(rng.uniform(0.0, 3.0))
        finally:
            child.kill()
        records = read_topic(boot, topic)
        upto = committed_offsets(spark, table)
        got = read_view(spark, table, ["id", "name"])
        assert got == model(records, upto=upto, value=json_value), (
            f"after kill {round_no + 1} the table is not the model up to its committed offsets {upto} "
            f"(seed {seed}; see {log_path})"
        )
