"""Kill -9 during compaction (DESIGN I6): the cleaner or the Spark job killed at random
moments, and the broker crashing at each step of a swap. Afterwards a partition holds
either its old or its new segments — never a mix, no live record lost — nothing is left
behind or locked, and the next run compacts it.
"""

from __future__ import annotations

import os
import random
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
from compaction_helpers import (
    compact_topic,
    compact_without_spark,
    model_after_compaction,
    produce_batches,
    producer_last_batches,
    read_records,
)

from compaction.job import run_compaction
from logstore.broker.embedded import EmbeddedBroker
from logstore.client.admin import Admin
from logstore.client.producer import Producer
from logstore.client.rpc import BrokerClient
from logstore.naming import partition_dir_name
from logstore.types import TopicPartition

pytestmark = [pytest.mark.timeout(600), pytest.mark.slow]

NOW_MS = 1_700_000_000_000
DAY_MS = 86_400_000
SUPPORT_DIR = os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "support")


def fill(bootstrap: str, topic: str, *, batches: int, value_bytes: int, keys: int = 500) -> None:
    rng = random.Random(3)
    with Producer(bootstrap, linger_ms=0) as producer:
        produce_batches(producer, topic, [
            [(NOW_MS, b"key-%04d" % rng.randrange(keys), os.urandom(value_bytes)) for _ in range(100)]
            for _ in range(batches)
        ])


def expected(bootstrap: str, topic: str) -> tuple[list, list]:
    """The partition's records now, and after a compaction (the model)."""
    tp = TopicPartition(topic, 0)
    before = read_records(bootstrap, tp)
    with BrokerClient(bootstrap) as client:
        end = client.cleaning.describe_cleaning([topic], now_ms=NOW_MS)[topic].partitions[0].cleanable_end_offset
    want = model_after_compaction(before, cleanable_end=end, now_ms=NOW_MS, delete_retention_ms=DAY_MS,
                                  producer_last=producer_last_batches(bootstrap, tp, end))
    return before, want


def leftovers(directory: str) -> list[str]:
    return sorted(n for n in os.listdir(directory)
                  if n.endswith((".cleaned", ".swap")) or n.startswith("swap-manifest"))


def wait_released(bootstrap: str, topic: str, timeout_s: float = 20) -> None:
    deadline = time.monotonic() + timeout_s
    with BrokerClient(bootstrap) as client:
        while client.cleaning.describe_cleaning([topic])[topic].partitions[0].in_progress:
            assert time.monotonic() < deadline, "the broker still holds the partition's compaction"
            time.sleep(0.05)


_CLEANER = """
import sys
sys.path.insert(0, {tests!r})
from compaction_helpers import compact_without_spark
compact_without_spark({bootstrap!r}, {topic!r}, now_ms={now})
"""


def test_killed_cleaner_leaves_old_or_new_and_the_next_run_succeeds() -> None:
    rng = random.Random(5)
    with EmbeddedBroker() as broker, Admin(broker.bootstrap) as admin:
        topic = compact_topic(admin, "kill-cleaner", segment_bytes=1 << 20)
        fill(broker.bootstrap, topic, batches=1200, value_bytes=300)
        before, want = expected(broker.bootstrap, topic)
        directory = os.path.join(broker.data_dir, partition_dir_name(topic, 0))
        outcomes = []
        # From early (the child is still starting or streaming) to late (after the swap): a
        # compaction of this topic takes about a second on an idle machine since format 2.
        for delay in (0.3, 0.5, 0.8, 1.2, 1.6, 2.2, 3.0, 6.0):
            child = subprocess.Popen([sys.executable, "-c", _CLEANER.format(
                tests=SUPPORT_DIR, bootstrap=broker.bootstrap, topic=topic, now=NOW_MS)])
            time.sleep(delay * rng.uniform(0.8, 1.2))
            child.send_signal(signal.SIGKILL)
            child.wait(30)
            wait_released(broker.bootstrap, topic)
            assert leftovers(directory) == []
            got = read_records(broker.bootstrap, TopicPartition(topic, 0))
            assert got in (before, want), "a partition holds its old or its new segments"
            outcomes.append("new" if got == want else "old")
        [result] = compact_without_spark(broker.bootstrap, topic, now_ms=NOW_MS)
        assert result.error is None, result.error
        assert read_records(broker.bootstrap, TopicPartition(topic, 0)) == want
        assert "old" in outcomes, f"no kill landed before the swap: {outcomes}"


def test_killed_spark_job_is_simply_retried(spark) -> None:  # type: ignore[no-untyped-def]
    with EmbeddedBroker() as broker, Admin(broker.bootstrap) as admin:
        topic = compact_topic(admin, "kill-job", segment_bytes=1 << 20)
        fill(broker.bootstrap, topic, batches=120, value_bytes=300)
        before, want = expected(broker.bootstrap, topic)
        directory = os.path.join(broker.data_dir, partition_dir_name(topic, 0))
        child = subprocess.Popen(
            [sys.executable, "-m", "compaction.job", "--bootstrap", broker.bootstrap, "--topic", topic,
             "--master", "local[1]", "--now-ms", str(NOW_MS)],
            stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True, start_new_session=True,
        )
        # Kill it (driver, JVM and Python workers) once it has started scanning or rewriting.
        deadline = time.monotonic() + 180
        assert child.stderr is not None
        for line in child.stderr:
            if "scanning the keys" in line or "latest offsets per key computed" in line:
                break
            assert time.monotonic() < deadline
        time.sleep(random.uniform(0.0, 1.5))
        os.killpg(child.pid, signal.SIGKILL)
        child.wait(60)
        wait_released(broker.bootstrap, topic)
        assert leftovers(directory) == []
        assert read_records(broker.bootstrap, TopicPartition(topic, 0)) in (before, want)
        summary = run_compaction(spark, bootstrap=broker.bootstrap, topic=topic, now_ms=NOW_MS, force=True)
        assert summary.ok, summary.format()
        assert read_records(broker.bootstrap, TopicPartition(topic, 0)) == want


_BROKER = """
import os, sys
from logstore.storage.segment_swap import set_swap_hook
step = {step!r}
def crash(name):
    if name == step:
        os._exit(17)
set_swap_hook(crash)
from logstore.broker.server import main
sys.exit(main(["--data-dir", {data_dir!r}, "--host", "127.0.0.1", "--port", "0"]))
"""

# Before the commit point, the commit point, and after it (roll forward).
BROKER_STEPS = ["cleaned-written", "swap-renamed:0", "swap-renamed", "manifest-written",
                "final-renamed:0", "renamed", "checkpoint-written", "manifest-removed"]


def test_broker_crash_at_each_step_of_the_swap(tmp_path: Path) -> None:
    src = tmp_path / "src"
    with EmbeddedBroker(str(src)) as broker, Admin(broker.bootstrap) as admin:
        topic = compact_topic(admin, "crash-broker", segment_bytes=4096)
        with Producer(broker.bootstrap, linger_ms=0) as producer:
            produce_batches(producer, topic, [[(NOW_MS, b"k%d" % ((b * 5 + i) % 11), b"v%d" % b * 40)
                                               for i in range(5)] for b in range(60)])
        before, want = expected(broker.bootstrap, topic)
    committed = BROKER_STEPS.index("manifest-written")
    for i, step in enumerate(BROKER_STEPS):
        data_dir = tmp_path / f"step-{i}"
        shutil.copytree(src, data_dir)
        env = dict(os.environ, LOGSTORE_LOG_LEVEL="WARNING")
        proc = subprocess.Popen([sys.executable, "-c", _BROKER.format(step=step, data_dir=str(data_dir))],
                                stdout=subprocess.PIPE, text=True, env=env)
        assert proc.stdout is not None
        line = proc.stdout.readline()
        assert line.startswith("listening on "), line
        bootstrap = line.split()[-1]
        [result] = compact_without_spark(bootstrap, topic, now_ms=NOW_MS)
        assert proc.wait(30) == 17, step
        assert result.error is not None, step
        proc.stdout.close()
        with EmbeddedBroker(str(data_dir)) as restarted:
            got = read_records(restarted.bootstrap, TopicPartition(topic, 0))
            assert got == (before if i < committed else want), step
            assert leftovers(os.path.join(str(data_dir), partition_dir_name(topic, 0))) == [], step
            [again] = compact_without_spark(restarted.bootstrap, topic, now_ms=NOW_MS)
            assert again.error is None, (step, again.error)
            assert read_records(restarted.bootstrap, TopicPartition(topic, 0)) == want, step
