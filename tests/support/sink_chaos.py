"""The exactly-once kill run of the Spark sink and the foreachBatch helper (shared by the tests).

:func:`run_sink_chaos` runs one or more *pipelines* — a log→log query from an input topic to
an output topic, each input record becoming ``<partition>:<offset>:<value>``, written by the
sink (``sink``) or by the foreachBatch helper (``foreach``) — together in one child process
(``tests/support/sink_chaos_job.py``: one JVM), while a thread feeds every input topic. It SIGKILLs
the child a few times at random points, each after every pipeline committed a micro-batch
of its own, then lets a final ``--available-now`` run finish. For each pipeline a
read_committed read of the output must then hold exactly one output per input record: none
missing, none twice, none invented.

``during(sink_ids)`` is what else happens to the cluster while the queries are being killed
(a nemesis that kills brokers, on a cluster), given the sinks' identities (their
transactions' coordinator keys): it is entered before the first round and left before the
final run, which therefore runs on a healed cluster.
"""

from __future__ import annotations

import contextlib
import os
import random
import signal
import subprocess
import sys
import tempfile
import threading
import time
from collections import Counter
from collections.abc import Callable, Sequence
from contextlib import AbstractContextManager
from dataclasses import dataclass

import pyarrow as pa

from logstore import Consumer, Producer
from logstore.client.admin import Admin
from logstore.types import NewTopic, TopicPartition
from spark_sink.options import sink_id_for_checkpoint

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
CHAOS_JOB = os.path.join(ROOT, "tests", "support", "sink_chaos_job.py")


def new_topic(boot: str, prefix: str, partitions: int = 2, value_schema: pa.Schema | None = None,
              *, replication_factor: int | None = None, configs: dict[str, str] | None = None) -> str:
    name = f"{prefix}-{random.randrange(1 << 30)}"
    with Admin(boot) as admin:
        admin.create_topics([NewTopic(name, num_partitions=partitions, value_schema=value_schema,
                                       replication_factor=replication_factor, configs=configs or {})])
    return name


def read_committed(boot: str, topic: str, partitions: int) -> list[tuple[int, int, bytes | None, object]]:
    """(partition, offset, key, value) of every visible record."""
    out = []
    with Consumer(boot, isolation_level="read_committed", fetch_max_wait_ms=50) as c:
        c.assign([TopicPartition(topic, p) for p in range(partitions)])
        c.seek_to_beginning()
        idle = 0
        while idle < 3:
            records = c.poll(timeout_ms=100)
            idle = 0 if records else idle + 1
            out.extend((r.partition, r.offset, r.key, r.value) for r in records)
    return out


@dataclass(frozen=True)
class Pipeline:
    """One query of the kill run: ``mode`` ``sink`` or ``foreach``, from topic ``src`` to ``dst``."""

    mode: str
    src: str
    dst: str


def run_sink_chaos(boot: str, pipelines: Sequence[Pipeline], *, rounds: int, seed: int,
                   during: Callable[[list[str]], AbstractContextManager[object]] | None = None,
                   more: Callable[[], bool] = lambda: False, max_rounds: int = 8) -> dict[Pipeline, int]:
    """Kill the queries ``rounds`` times (and while ``more()`` says so, up to ``max_rounds``),
    finish them, check exactly-once; per pipeline, the batches committed before the final run
    (so a caller can tell each query made progress under ``during``)."""
    rng = random.Random(seed)
    checkpoints = {p: tempfile.mkdtemp(prefix=f"chaos-{p.mode}-") for p in pipelines}
    produced = dict.fromkeys(pipelines, 0)
    stop = threading.Event()

    def feed() -> None:
        with Producer(boot, acks="all", delivery_timeout_ms=120_000) as producer:
            while not stop.is_set():
                for p in pipelines:
                    n, first = rng.randint(5, 30), produced[p]
                    producer.send_batch(p.src, pa.table({
                        "key": [f"k{first + i}" for i in range(n)],
                        "value": [b"v%d" % (first + i) for i in range(n)]})).result(timeout=150)
                    produced[p] += n
                time.sleep(0.05)

    feeder = threading.Thread(target=feed, daemon=True)
    feeder.start()
    env = dict(os.environ, PYTHONUNBUFFERED="1")
    base = [sys.executable, CHAOS_JOB, boot]
    for p in pipelines:
        base += ["--pipeline", p.mode, p.src, p.dst, checkpoints[p]]
    # Each sink's identity, as the job derives it: the sink from its checkpoint, the helper's app_id.
    sink_ids = [sink_id_for_checkpoint(checkpoints[p]) if p.mode == "sink" else "chaos-" + os.path.basename(checkpoints[p])
                for p in pipelines]
    child_log = os.path.join(tempfile.mkdtemp(prefix="chaos-driver-"), "stderr.log")

    def start_child(command: list[str]) -> subprocess.Popen[bytes]:
        with open(child_log, "wb") as err:  # this run's stderr, quoted when it ends by itself
            return subprocess.Popen(command, env=env, stdout=subprocess.DEVNULL, stderr=err)

    def why_it_ended() -> str:
        with open(child_log, "rb") as f:
            lines = f.read().decode("utf-8", "replace").splitlines()
        errors = [line for line in lines if "Error" in line or "Exception" in line]
        return " | ".join((errors or lines)[-3:])[:1500]

    with during(sink_ids) if during is not None else contextlib.nullcontext():
        try:
            i = 0
            while i < rounds or (more() and i < max_rounds):
                command = base + (["--fail-first-attempts"] if i % 2 == 0 else [])
                child = start_child(command)
                # Kill after every query of this run committed a micro-batch of its own: Spark 4.2
                # itself refuses to restart a checkpoint killed inside batch 0
                # (STATE_STORE_CHECKPOINT_LOCATION_NOT_EMPTY, "should be empty on batch 0"), whatever
                # the sink; and a run killed while its JVM still starts tests nothing. A run that
                # ends by itself first (seen: a query's start-up Metadata call timing out on a
                # broker the nemesis had just restarted; a query failing while the other runs on)
                # is started again within the same round, and says why.
                done_before = {p: _committed(ck) for p, ck in checkpoints.items()}
                deadline = time.monotonic() + 180
                while (any(_committed(ck) <= done_before[p] for p, ck in checkpoints.items())
                       and time.monotonic() < deadline):
                    if child.poll() is not None:
                        print(f"round {i + 1}: the driver ended by itself (exit {child.returncode}): "
                              f"{why_it_ended()}; started again", flush=True)
                        child = start_child(command)
                    time.sleep(0.1)
                time.sleep(rng.uniform(0, 8))  # then a few micro-batches
                child.send_signal(signal.SIGKILL)
                child.wait(30)
                i += 1
                print(f"kill round {i}: batches committed {[_committed(ck) for ck in checkpoints.values()]}, "
                      f"records fed {list(produced.values())}", flush=True)
        finally:
            stop.set()
            feeder.join(160)
    committed = {p: _committed(ck) for p, ck in checkpoints.items()}
    # The rest in large micro-batches: the kill rounds had the small ones (commit points to die between).
    final = subprocess.run(base + ["--available-now", "--max-offsets-per-trigger", "5000"], env=env, timeout=300,
                           stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
    assert final.returncode == 0, final.stderr[-3000:]
    print(f"final run: batches committed {[_committed(ck) for ck in checkpoints.values()]}", flush=True)
    for p in pipelines:
        _check_exactly_once(boot, p, produced[p])
    return committed


def _check_exactly_once(boot: str, p: Pipeline, produced: int) -> None:
    inputs = {f"{part}:{o}:{v.decode()}": 1 for part, o, _, v in read_committed(boot, p.src, 2)}  # type: ignore[union-attr]
    assert len(inputs) == produced > 0, p
    outputs = Counter(v.decode() for _, _, _, v in read_committed(boot, p.dst, 2))  # type: ignore[union-attr]
    duplicated = [k for k, n in outputs.items() if n > 1]
    missing = [k for k in inputs if k not in outputs]
    unexpected = [k for k in outputs if k not in inputs]
    assert not duplicated, f"{p.mode}: {len(duplicated)} outputs appear more than once, e.g. {duplicated[:5]}"
    assert not missing, f"{p.mode}: {len(missing)} inputs have no output, e.g. {missing[:5]}"
    assert not unexpected, f"{p.mode}: outputs without an input: {unexpected[:5]}"


def _committed(checkpoint: str) -> int:
    """How many micro-batches the query in ``checkpoint`` has committed."""
    commits = os.path.join(checkpoint, "commits")
    return len([n for n in os.listdir(commits) if n.isdigit()]) if os.path.isdir(commits) else 0
