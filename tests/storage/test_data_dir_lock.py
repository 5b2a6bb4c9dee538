"""One process at a time on a data directory (logstore.storage.dir_lock): a second broker
or an offline recovery beside a running broker fails at once naming the holder; a broker
killed with SIGKILL leaves nothing that blocks its restart."""

from __future__ import annotations

import os
import subprocess
import sys
import time
from pathlib import Path

import pytest

from logstore.broker.embedded import EmbeddedBroker
from logstore.client.admin import Admin
from logstore.storage.config import LogConfig
from logstore.storage.dir_lock import LOCK_FILE, DataDirLock, DataDirLockedError
from logstore.storage.log_manager import LogManager

pytestmark = pytest.mark.timeout(120)


def _cli(*args: str, timeout: float = 60) -> subprocess.CompletedProcess[str]:
    script = Path(sys.executable).parent / "logstore"
    return subprocess.run([str(script), *args], capture_output=True, text=True, timeout=timeout)


def test_a_second_taker_fails_at_once_naming_the_holder(tmp_path: Path) -> None:
    first = DataDirLock.acquire(str(tmp_path))
    started = time.monotonic()
    with pytest.raises(DataDirLockedError) as caught:
        DataDirLock.acquire(str(tmp_path))  # another open file description: flock conflicts
    assert time.monotonic() - started < 1
    assert f"pid {os.getpid()}" in caught.value.message and str(tmp_path) in caught.value.message
    assert not caught.value.retriable
    first.release()
    again = DataDirLock.acquire(str(tmp_path))
    again.release()
    assert os.path.exists(tmp_path / LOCK_FILE)


def test_a_log_manager_holds_the_lock_until_shutdown(tmp_path: Path) -> None:
    lm = LogManager(str(tmp_path), topic_defaults=LogConfig())
    lm.startup()
    other = LogManager(str(tmp_path), topic_defaults=LogConfig())
    with pytest.raises(DataDirLockedError):
        other.startup()
    lm.shutdown()
    other.startup()
    other.shutdown()


def test_a_second_broker_on_a_running_brokers_data_dir_exits_with_one_line(tmp_path: Path) -> None:
    data_dir = str(tmp_path / "data")
    with EmbeddedBroker(data_dir, subprocess=True) as running:
        with Admin(running.bootstrap) as admin:
            admin.create_topic("kept", 1)
        second = _cli("broker", "start", "--data-dir", data_dir, "--port", "0")
        assert second.returncode != 0
        assert "Traceback" not in second.stderr + second.stdout
        errors = [line for line in (second.stderr + second.stdout).splitlines() if "in use" in line]
        assert len(errors) == 1 and f"pid {running.pid}" in errors[0], second.stderr + second.stdout
        # Offline recovery is refused beside it, too.
        recover = _cli("partitions", "recover", "--data-dir", data_dir, "--topic", "kept", "--partition", "0")
        assert recover.returncode != 0 and "in use" in recover.stderr + recover.stdout
        # The running broker was not disturbed: no clean-shutdown marker was written into its partition.
        assert "clean-shutdown" not in os.listdir(os.path.join(data_dir, "kept-0"))
        with Admin(running.bootstrap) as admin:
            assert "kept" in admin.list_topics()


def test_a_broker_on_a_port_in_use_is_one_line_and_touches_no_file(tmp_path: Path) -> None:
    with EmbeddedBroker(str(tmp_path / "first"), subprocess=True) as running:
        data_dir = tmp_path / "second"
        second = _cli("broker", "start", "--data-dir", str(data_dir), "--port", str(running.port))
    out = second.stderr + second.stdout
    assert second.returncode != 0
    assert [line for line in out.splitlines() if not line.startswith("20")] == [  # log lines aside
        f"error: [BROKER_START_FAILED] cannot start the broker: cannot listen on 127.0.0.1:{running.port}: "
        "the address is in use (another broker, or another program, listens there)"], out
    assert not data_dir.exists()  # refused before the logs were opened or created


def test_a_killed_broker_does_not_block_its_restart(tmp_path: Path) -> None:
    data_dir = str(tmp_path / "data")
    broker = EmbeddedBroker(data_dir, subprocess=True)
    broker.start()
    broker.kill()  # SIGKILL: the kernel drops the lock, the file stays
    assert os.path.exists(os.path.join(data_dir, LOCK_FILE))
    with EmbeddedBroker(data_dir, subprocess=True) as restarted, Admin(restarted.bootstrap) as admin:
        admin.create_topic("after", 1)
        assert "after" in admin.list_topics()
