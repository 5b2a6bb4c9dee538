"""``logstore consume --group`` leaves its group on SIGTERM and on SIGINT (Ctrl-C).

Two consumers of one group run as real ``logstore consume`` processes against a
real embedded broker. One is stopped with a signal: it must exit cleanly (exit
code 0, no traceback) and its partitions must move to the other member at once
(within a few heartbeats), not after the 45 s session timeout a consumer that
dies without leaving costs. Records produced afterwards to every partition then
reach the survivor.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import IO

import pytest

from logstore import Admin, NewTopic, Producer, TopicPartition
from logstore.broker.embedded import EmbeddedBroker
from logstore.errors import GroupIdNotFoundError

pytestmark = pytest.mark.timeout(120)

REPO = Path(__file__).resolve().parents[2]
PARTITIONS = 4
SESSION_TIMEOUT_S = 45  # the broker's default group_session_timeout_ms
# Leaving must move the partitions well before the session would have expired.
MOVE_WITHIN_S = 15


@pytest.fixture(scope="module")
def broker() -> Iterator[EmbeddedBroker]:
    with EmbeddedBroker() as b:
        yield b


def wait_until(what: str, check: Callable[[], bool], timeout_s: float) -> float:
    """Poll ``check`` until true; return how long it took (fails after ``timeout_s``)."""
    started = time.monotonic()
    while not check():
        if time.monotonic() - started > timeout_s:
            raise AssertionError(f"timed out after {timeout_s} s waiting for {what}")
        time.sleep(0.1)
    return time.monotonic() - started


def start_consumer(bootstrap: str, topic: str, group: str, out: IO[bytes], err: IO[bytes]) -> subprocess.Popen[bytes]:
    code = "from logstore.cli import main; main()"
    env = {**os.environ, "PYTHONPATH": str(REPO)}
    return subprocess.Popen(
        [sys.executable, "-c", code, "consume", topic, "--group", group, "--format", "json", "-b", bootstrap],
        stdout=out, stderr=err, env=env, cwd=REPO,
    )


def owners(admin: Admin, group: str) -> list[frozenset[TopicPartition]]:
    """The assignment of each active member of ``group`` (none before it exists or once it is gone)."""
    try:
        return [m.assignment for m in admin.describe_group(group).members if not m.left]
    except GroupIdNotFoundError:
        return []


@pytest.mark.parametrize("signum", [signal.SIGTERM, signal.SIGINT], ids=["SIGTERM", "SIGINT"])
def test_a_signalled_member_leaves_its_group_at_once(broker: EmbeddedBroker, tmp_path: Path,
                                                     signum: signal.Signals) -> None:
    topic = f"signals-{signum.name.lower()}"
    group = f"g-{topic}"
    every = frozenset(TopicPartition(topic, p) for p in range(PARTITIONS))
    with Admin(broker.bootstrap) as admin:
        admin.create_topics([NewTopic(topic, PARTITIONS)])
        outs = [open(tmp_path / f"out{i}", "wb") for i in range(2)]  # noqa: SIM115 - closed below
        errs = [open(tmp_path / f"err{i}", "wb") for i in range(2)]  # noqa: SIM115
        procs = [start_consumer(broker.bootstrap, topic, group, outs[i], errs[i]) for i in range(2)]
        try:
            wait_until("two members sharing the partitions", lambda: (
                len(a := owners(admin, group)) == 2 and all(a) and frozenset().union(*a) == every), 60)
            stopped, survivor = procs
            stopped.send_signal(signum)
            assert stopped.wait(timeout=30) == 0, (tmp_path / "err0").read_text()
            took = wait_until("the survivor owning every partition",
                              lambda: owners(admin, group) == [every], MOVE_WITHIN_S)
            assert took < SESSION_TIMEOUT_S
            with Producer(broker.bootstrap) as producer:
                for p in range(PARTITIONS):
                    producer.send(topic, f"after-{p}".encode(), partition=p)
                producer.flush()

            def survivor_got_them() -> bool:
                outs[1].flush()
                lines = (tmp_path / "out1").read_text().splitlines()
                return {json.loads(line)["value"] for line in lines} >= {f"after-{p}" for p in range(PARTITIONS)}

            wait_until("the survivor printing the new records", survivor_got_them, 30)
            assert survivor.poll() is None, "the survivor still runs"
        finally:
            for proc in procs:
                if proc.poll() is None:
                    proc.send_signal(signal.SIGTERM)
            for proc in procs:
                try:
                    proc.wait(timeout=30)
                except subprocess.TimeoutExpired:
                    proc.kill()
                    proc.wait()
            for f in outs + errs:
                f.close()
        errors = (tmp_path / "err0").read_text()
        assert "Traceback" not in errors and "Aborted" not in errors, errors
        # Both stopped by a signal: each left; the group is empty, nothing is owned any more.
        assert procs[1].returncode == 0, (tmp_path / "err1").read_text()
        wait_until("an empty group", lambda: owners(admin, group) == [], MOVE_WITHIN_S)


def test_the_first_signal_asks_the_loop_to_stop_and_a_second_interrupts() -> None:
    """In process: the first SIGTERM/SIGINT only sets the event the poll loop checks (raising at an
    arbitrary point could leave the client's locks and futures inconsistent); a second one raises
    KeyboardInterrupt at once; the previous handlers are back afterwards."""
    from logstore.cli.consume import _stop_on_signals

    before = {s: signal.getsignal(s) for s in (signal.SIGINT, signal.SIGTERM)}
    with _stop_on_signals() as stop:
        os.kill(os.getpid(), signal.SIGTERM)
        assert stop.wait(5), "the first signal set the event"
        with pytest.raises(KeyboardInterrupt):
            os.kill(os.getpid(), signal.SIGINT)
            time.sleep(5)  # the handler raises here, in the main thread
    assert {s: signal.getsignal(s) for s in (signal.SIGINT, signal.SIGTERM)} == before
