"""The scheduler with the real planner, compaction job and views, against a real broker.

* one round (``--once``) in this process with the session ``spark``: the dirty
  compacted topic is compacted, a delete-policy topic in the list is not, a view of a
  missing topic fails without stopping anything, and the view of the compacted topic
  equals the model computed from the topic with the Python Consumer;
* ``python -m jobs.cli schedule`` as a child process: it starts its view, checks for
  dirty topics, and stops cleanly (exit 0) on SIGTERM.
"""

from __future__ import annotations

import os
import random
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest
from materialize_helpers import model, new_topic, read_topic, read_view, send_all
from pyspark.sql import SparkSession

from jobs.scheduler import Scheduler, spark_jobs
from jobs.scheduler_config import parse_config
from logstore import Admin

pytestmark = pytest.mark.timeout(600)

REPO = Path(__file__).resolve().parents[2]


def dirty_compacted_topic(bootstrap: str, prefix: str) -> str:
    """A compacted topic with small segments, many updates of few keys, and a tombstone."""
    name = f"{prefix}-{random.randrange(1 << 30)}"
    with Admin(bootstrap) as admin:
        admin.create_topic(name, 2, configs={"cleanup.policy": "compact", "segment.bytes": "1024",
                                             "min.cleanable.dirty.ratio": "0.01"})
    for round_no in range(25):  # one produce request per round: many small batches, many segments
        send_all(bootstrap, name, [(b"key-%d" % k, b"value-%d-%d-" % (round_no, k) + b"x" * 40)
                                   for k in range(8)])
    send_all(bootstrap, name, [(b"key-0", None)])
    return name


def test_one_round_compacts_the_dirty_topic_and_survives_a_failing_view(
        spark: SparkSession, shared_broker, tmp_path) -> None:  # type: ignore[no-untyped-def]
    boot = shared_broker.bootstrap
    topic = dirty_compacted_topic(boot, "sched-compact")
    plain = new_topic(boot, "sched-plain", 1, compacted=False)
    send_all(boot, plain, [(b"k", b"v%d" % i) for i in range(20)])
    before = read_topic(boot, topic)
    config = parse_config({
        "bootstrap": boot,
        "compaction": {"topics": [topic, plain], "interval": "1h"},
        "materialize": [
            {"topic": f"no-such-topic-{random.randrange(1 << 30)}", "table": str(tmp_path / "bad")},
            {"topic": topic, "table": str(tmp_path / "view"), "checkpoint": str(tmp_path / "ck")},
        ],
    }, source="test")
    plan, compact, start_view = spark_jobs(spark, config)
    scheduler = Scheduler(config, plan=plan, compact=compact, start_view=start_view)
    records = scheduler.run_round(once=True)
    summary = [(r.kind, r.name.split("[")[0], r.ok) for r in records]
    assert summary == [("plan", "compaction", True), ("compaction", topic, True),
                       ("view", f"{config.views[0].name}", False), ("view", config.views[1].name, True)], records
    assert f"due: {topic}[" in records[0].detail and plain not in records[0].detail
    assert "removed" in records[1].detail
    assert "does not exist" in records[2].detail
    after = read_topic(boot, topic)
    assert len(after) < len(before), "compaction removed nothing"
    assert model(after) == model(before)
    assert read_view(spark, str(tmp_path / "view"), ["value"]) == model(after)
    assert len(read_topic(boot, plain)) == 20


def test_scheduler_process_stops_cleanly_on_sigterm(shared_broker, tmp_path) -> None:  # type: ignore[no-untyped-def]
    boot = shared_broker.bootstrap
    topic = new_topic(boot, "sched-proc", 1)
    send_all(boot, topic, [(b"a", b"1"), (b"b", b"2")])
    cfg = tmp_path / "jobs.toml"
    cfg.write_text(f'''
bootstrap = "{boot}"
tick = "1s"
[compaction]
topics = ["{topic}"]
interval = "1h"
[[materialize]]
topic = "{topic}"
table = "{tmp_path / 'view'}"
trigger_interval = "1s"
''')
    proc = subprocess.Popen([sys.executable, "-m", "jobs.cli", "schedule", "--config", str(cfg)], cwd=REPO,
                            stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                            start_new_session=True)
    lines: list[str] = []
    reader = threading.Thread(target=lambda: lines.extend(proc.stdout or []), daemon=True)
    reader.start()
    try:
        deadline = time.monotonic() + 300
        want = (f"view {topic} -> {tmp_path / 'view'}: ok", "plan compaction: ok", ": batch 0: ")
        while not all(any(w in line for line in list(lines)) for w in want):
            assert proc.poll() is None, "".join(lines[-40:])
            assert time.monotonic() < deadline, "".join(lines[-40:])
            time.sleep(0.2)
        proc.send_signal(signal.SIGTERM)
        assert proc.wait(timeout=120) == 0, "".join(lines[-40:])
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait(timeout=60)
    reader.join(timeout=30)
    text = "".join(lines)
    assert "scheduler: stopped" in text and "Traceback" not in text, text[-4000:]
