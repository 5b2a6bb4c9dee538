"""The broker touches only what it created in its data directory (issue 14, finding 3).

Foreign directories and files — including ones named like a partition
(``project-1``) or like a deleted partition — survive start-up, topic creation
and deletion and restarts byte for byte; a topic deletion interrupted by
kill -9 is finished at the next start-up and the topic is gone.
"""

from __future__ import annotations

import hashlib
import logging
import os
import signal
import subprocess
import sys
import textwrap

import pytest
from storage_helpers import produced, simple_batch

from logstore.errors import InvalidTopicError
from logstore.storage.config import LogConfig
from logstore.storage.log_manager import LogManager
from logstore.storage.ownership import BROKER_FILES, PARTITION_MARKER_FILE

FOREIGN_DIRS = ("backup-2024", "project-1", "node-18", "old-3.0123456789abcdef0123456789abcdef-delete")



def ours(data_dir: str) -> list[str]:
    """The broker's own entries at the top of the data dir (meta/, the HWM checkpoint): must exist."""
    own = sorted(n for n in os.listdir(data_dir) if n in BROKER_FILES)
    assert "meta" in own
    return own

def _plant_foreign(data_dir: str) -> None:
    for d in FOREIGN_DIRS:
        os.makedirs(os.path.join(data_dir, d, "sub"))
        with open(os.path.join(data_dir, d, "notes.txt"), "wb") as f:
            f.write(b"precious " + d.encode())
        with open(os.path.join(data_dir, d, "sub", "00000000000000000000.arrow"), "wb") as f:
            f.write(os.urandom(100))
    with open(os.path.join(data_dir, "readme-7"), "wb") as f:
        f.write(b"a file, not a directory")


def _tree_digest(data_dir: str) -> dict[str, str]:
    """Path -> sha256 of everything outside meta/ and our own partition directories."""
    out: dict[str, str] = {}
    for top in [*FOREIGN_DIRS, "readme-7"]:
        full = os.path.join(data_dir, top)
        if os.path.isfile(full):
            with open(full, "rb") as f:
                out[top] = hashlib.sha256(f.read()).hexdigest()
            continue
        for root, _dirs, files in os.walk(full):
            rel = os.path.relpath(root, data_dir)
            out[rel + "/"] = "dir"
            for name in files:
                with open(os.path.join(root, name), "rb") as f:
                    out[os.path.join(rel, name)] = hashlib.sha256(f.read()).hexdigest()
    return out


def _manager(data_dir: str) -> LogManager:
    lm = LogManager(data_dir, topic_defaults=LogConfig())
    lm.startup()
    return lm


def test_foreign_entries_survive_startup_create_delete_restart(tmp_path, caplog) -> None:
    data_dir = str(tmp_path)
    _plant_foreign(data_dir)
    before = _tree_digest(data_dir)
    with caplog.at_level(logging.WARNING, logger="logstore.storage.ownership"):
        lm = _manager(data_dir)
    warnings = [r.getMessage() for r in caplog.records if r.name == "logstore.storage.ownership"]
    assert len(warnings) == 1, warnings
    for name in [*FOREIGN_DIRS, "readme-7"]:
        assert repr(name) in warnings[0]
    assert _tree_digest(data_dir) == before

    # A topic whose partition directory would be a foreign one is refused, the directory untouched.
    with pytest.raises(InvalidTopicError, match="project-1"):
        lm.create_topic("project", partitions=2, configs={}, value_schema=None)
    assert "project" not in [t.name for t in lm.topics()]
    assert not os.path.exists(os.path.join(data_dir, "project-0"))

    lm.create_topic("events", partitions=3, configs={}, value_schema=None)
    lm.create_topic("node", partitions=2, configs={}, value_schema=None)
    lm.partition("events", 1).append(*produced(simple_batch(3)), fsync=True)
    assert os.path.isfile(os.path.join(data_dir, "events-1", PARTITION_MARKER_FILE))
    lm.delete_topic("node")
    assert not os.path.exists(os.path.join(data_dir, "node-0"))
    assert _tree_digest(data_dir) == before
    lm.shutdown()

    lm = _manager(data_dir)
    assert [t.name for t in lm.topics()] == ["events"]
    assert lm.partition("events", 1).log.log_end_offset == 3
    lm.delete_topic("events")
    lm.shutdown()
    lm = _manager(data_dir)
    assert lm.topics() == []
    lm.shutdown()
    assert _tree_digest(data_dir) == before
    assert sorted(os.listdir(data_dir)) == sorted([*ours(data_dir), "readme-7", *FOREIGN_DIRS])


def test_partition_dirs_from_before_markers_stay_ours(tmp_path) -> None:
    """A data dir written before markers existed keeps working: a topic with metadata owns its dirs."""
    data_dir = str(tmp_path)
    lm = _manager(data_dir)
    lm.create_topic("legacy", partitions=2, configs={}, value_schema=None)
    lm.partition("legacy", 0).append(*produced(simple_batch(5)), fsync=True)
    lm.shutdown()
    for p in range(2):
        os.remove(os.path.join(data_dir, f"legacy-{p}", PARTITION_MARKER_FILE))
    lm = _manager(data_dir)
    assert lm.partition("legacy", 0).log.log_end_offset == 5
    assert os.path.isfile(os.path.join(data_dir, "legacy-0", PARTITION_MARKER_FILE))
    lm.delete_topic("legacy")
    lm.shutdown()
    assert sorted(os.listdir(data_dir)) == ours(data_dir)


def test_unmarked_dir_of_unknown_topic_is_left_but_marked_one_is_removed(tmp_path) -> None:
    data_dir = str(tmp_path)
    lm = _manager(data_dir)
    lm.create_topic("gone", partitions=1, configs={}, value_schema=None)
    lm.shutdown()
    # An unfinished creation: our partition directory, no topic metadata.
    os.remove(os.path.join(data_dir, "meta", "topics", "gone.json"))
    os.makedirs(os.path.join(data_dir, "stranger-0"))
    lm = _manager(data_dir)
    lm.shutdown()
    assert sorted(os.listdir(data_dir)) == sorted([*ours(data_dir), "stranger-0"])


_CHILD = textwrap.dedent(
    """
    import os, shutil, signal, sys
    from logstore.storage.config import LogConfig
    from logstore.storage.log_manager import LogManager
    from storage_helpers import produced, simple_batch

    data_dir = sys.argv[1]
    lm = LogManager(data_dir, topic_defaults=LogConfig())
    lm.startup()
    lm.create_topic("doomed", partitions=4, configs={}, value_schema=None)
    for p in range(4):
        lm.partition("doomed", p).append(*produced(simple_batch(10)), fsync=True)
    calls = []
    real_rmtree = shutil.rmtree

    def rmtree_then_die(path, *a, **k):
        calls.append(path)
        if len(calls) == 2:
            # Half of the tree is gone: die mid-removal of the second partition.
            for name in sorted(os.listdir(path))[:2]:
                os.remove(os.path.join(path, name))
            os.kill(os.getpid(), signal.SIGKILL)
        real_rmtree(path, *a, **k)

    shutil.rmtree = rmtree_then_die
    print("deleting", flush=True)
    lm.delete_topic("doomed")
    print("not killed", flush=True)
    """
)


@pytest.mark.timeout(60)
def test_kill_9_during_topic_delete_is_finished_at_restart(tmp_path) -> None:
    data_dir = str(tmp_path / "data")
    os.makedirs(data_dir)
    _plant_foreign(data_dir)
    before = _tree_digest(data_dir)
    repo = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
    support = os.path.join(repo, "tests", "support")
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([repo, support, os.environ.get("PYTHONPATH", "")])}
    proc = subprocess.run(
        [sys.executable, "-c", _CHILD, data_dir], env=env, capture_output=True, timeout=50, cwd=repo,
    )
    assert proc.returncode == -signal.SIGKILL, proc.stderr.decode()
    assert b"deleting" in proc.stdout
    left = sorted(os.listdir(data_dir))
    assert any(n.endswith("-delete") and n.startswith("doomed-") for n in left), left

    lm = _manager(data_dir)
    assert lm.topics() == []
    lm.create_topic("doomed", partitions=1, configs={}, value_schema=None)
    assert lm.partition("doomed", 0).log.log_end_offset == 0
    lm.shutdown()
    assert sorted(os.listdir(data_dir)) == sorted(["doomed-0", *ours(data_dir), "readme-7", *FOREIGN_DIRS])
    assert _tree_digest(data_dir) == before


@pytest.mark.timeout(60)
def test_foreign_entries_survive_a_real_broker(tmp_path) -> None:
    """The same through a broker: start, create and delete topics over gRPC, restart."""
    from logstore import Admin, NewTopic
    from logstore.broker.embedded import EmbeddedBroker

    data_dir = str(tmp_path)
    _plant_foreign(data_dir)
    before = _tree_digest(data_dir)
    broker = EmbeddedBroker(data_dir)
    broker.start()
    try:
        with Admin(broker.bootstrap) as admin:
            admin.create_topics([NewTopic("backup", 3), NewTopic("kept", 1)])
            admin.delete_topics(["backup"])
        broker.restart()
        with Admin(broker.bootstrap) as admin:
            assert "kept" in admin.list_topics()
            assert "backup" not in admin.list_topics()
    finally:
        broker.stop()
    assert _tree_digest(data_dir) == before
    internal = [n for n in os.listdir(data_dir) if n.startswith("__")]  # the broker's own topics
    assert sorted(os.listdir(data_dir)) == sorted(["kept-0", *ours(data_dir), "readme-7", *FOREIGN_DIRS, *internal])
