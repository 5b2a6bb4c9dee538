"""Helpers of the consumer group tests: member processes (tests/support/group_member_child.py), a producer
that keeps writing, bounded waits, and the exclusive-ownership check over what members reported.
"""

from __future__ import annotations

import contextlib
import json
import os
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Iterable
from pathlib import Path
from typing import Any

from logstore import Producer, TopicPartition

HERE = Path(__file__).resolve().parent
REPO = HERE.parents[1]


def wait_until(what: str, predicate: Callable[[], Any], timeout_s: float = 20.0, interval_s: float = 0.02) -> Any:
    """Poll ``predicate`` until it returns something truthy; fail after ``timeout_s`` saying ``what``."""
    deadline = time.monotonic() + timeout_s
    while True:
        value = predicate()
        if value:
            return value
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out after {timeout_s} s waiting for {what}")
        time.sleep(interval_s)


class MemberProcess:
    """A group member in a child process; its JSON event lines are collected by a thread."""

    def __init__(self, name: str, bootstrap: str, group: str, topic: str, *,
                 instance_id: str | None = None, auto_commit_ms: int = 300, hold: bool = False) -> None:
        """``hold``: the child starts but joins only at :meth:`go` (see the child's ``--hold``)."""
        self.name = name
        cmd = [sys.executable, str(HERE / "group_member_child.py"), "--bootstrap", bootstrap, "--group", group,
               "--topic", topic, "--auto-commit-ms", str(auto_commit_ms)]
        if instance_id:
            cmd += ["--instance-id", instance_id]
        if hold:
            cmd.append("--hold")
        env = dict(os.environ, PYTHONPATH=str(REPO))
        self.proc = subprocess.Popen(cmd, stdin=subprocess.PIPE if hold else subprocess.DEVNULL,
                                     stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env)
        self.events: list[dict[str, Any]] = []
        self.stderr: list[str] = []
        self._lock = threading.Lock()
        self.killed_at: float | None = None
        self._threads = [threading.Thread(target=self._read, daemon=True),
                         threading.Thread(target=self._read_err, daemon=True)]
        for t in self._threads:
            t.start()

    def _read(self) -> None:
        assert self.proc.stdout is not None
        for line in self.proc.stdout:
            with contextlib.suppress(ValueError):
                doc = json.loads(line)
                with self._lock:
                    self.events.append(doc)

    def _read_err(self) -> None:
        assert self.proc.stderr is not None
        for line in self.proc.stderr:
            self.stderr.append(line)

    def snapshot(self) -> list[dict[str, Any]]:
        with self._lock:
            return list(self.events)

    @property
    def owned(self) -> set[int]:
        """The partitions it consumes now, from its assigned/revoked/lost events."""
        out: set[int] = set()
        for e in self.snapshot():
            if e["ev"] == "assigned":
                out |= set(e["tps"])
            elif e["ev"] in ("revoked", "lost"):
                out -= set(e["tps"])
        return out

    def consumed(self, partition: int) -> list[int]:
        return [o for e in self.snapshot() if e["ev"] == "records" and e["p"] == partition for o in e["offsets"]]

    def records_after(self, t: float, partition: int) -> list[int]:
        return [o for e in self.snapshot() if e["ev"] == "records" and e["p"] == partition and e["t"] >= t
                for o in e["offsets"]]

    def first_event(self, ev: str, after: float = 0.0, partition: int | None = None) -> dict[str, Any] | None:
        for e in self.snapshot():
            if e["ev"] == ev and e.get("t", 0.0) >= after and (partition is None or partition in e["tps"]):
                return e
        return None

    def ready(self) -> bool:
        return self.started("ready")

    def go(self) -> None:
        """Let a held member join now (it must have printed ``held``: started and imported)."""
        wait_until(f"member {self.name} to start", lambda: self.started("held"), 60)
        assert self.proc.stdin is not None
        self.proc.stdin.write("go\n")
        self.proc.stdin.flush()

    def started(self, ev: str) -> bool:
        self.check_alive()
        return any(e["ev"] == ev for e in self.snapshot())

    def check_alive(self) -> None:
        if self.killed_at is None and self.proc.poll() is not None and not any(
                e["ev"] == "closed" for e in self.snapshot()):
            raise AssertionError(f"member {self.name} exited ({self.proc.returncode}):\n{''.join(self.stderr[-30:])}")

    def pause(self) -> float:
        """SIGSTOP: frozen, so no commit and no heartbeat until :meth:`resume`. Returns the
        monotonic time of the stop."""
        stopped_at = time.monotonic()
        self.proc.send_signal(signal.SIGSTOP)
        return stopped_at

    def resume(self) -> None:
        self.proc.send_signal(signal.SIGCONT)

    def kill(self) -> float:
        """SIGKILL: no commit, no leave. Returns the monotonic time of the kill."""
        self.killed_at = time.monotonic()
        with contextlib.suppress(ProcessLookupError):
            self.proc.send_signal(signal.SIGKILL)
        self.proc.wait(30)
        return self.killed_at

    def terminate(self, timeout_s: float = 20.0) -> None:
        """SIGTERM: the child commits, leaves the group and prints closed."""
        self.proc.send_signal(signal.SIGTERM)
        try:
            self.proc.wait(timeout_s)
        except subprocess.TimeoutExpired:
            self.kill()
            raise AssertionError(f"member {self.name} did not stop on SIGTERM:\n{''.join(self.stderr[-30:])}") from None
        for t in self._threads:
            t.join(5)
        assert any(e["ev"] == "closed" for e in self.snapshot()), "".join(self.stderr[-30:])

    def stop(self) -> None:
        if self.proc.poll() is None:
            with contextlib.suppress(ProcessLookupError):
                self.proc.send_signal(signal.SIGKILL)
            self.proc.wait(30)


def ownership_intervals(members: Iterable[MemberProcess], end: float) -> dict[int, list[tuple[float, float, str]]]:
    """Per partition, the ``(start, end, member)`` spans during which a member consumed it
    (from its assigned event to its revoked/lost event, its kill, or ``end``)."""
    out: dict[int, list[tuple[float, float, str]]] = {}
    for m in members:
        start: dict[int, float] = {}
        for e in m.snapshot():
            if e["ev"] == "assigned":
                for p in e["tps"]:
                    start[p] = e["t"]
            elif e["ev"] in ("revoked", "lost"):
                for p in e["tps"]:
                    if p in start:
                        out.setdefault(p, []).append((start.pop(p), e["t"], m.name))
        for p, t in start.items():
            out.setdefault(p, []).append((t, m.killed_at if m.killed_at is not None else end, m.name))
    return out


def assert_exclusive(members: Iterable[MemberProcess], end: float) -> None:
    """No two members consumed the same partition at the same time (DESIGN: a partition is
    revoked from one member before another gets it). A killed member's span ends at its kill."""
    for p, spans in ownership_intervals(members, end).items():
        spans.sort()
        for (_s1, e1, m1), (s2, _e2, m2) in zip(spans, spans[1:], strict=False):
            assert e1 <= s2, f"partition {p}: {m1} held it until {e1:.3f} but {m2} got it at {s2:.3f}"


class BackgroundProducer:
    """Keeps producing one record to every partition of a topic each ``interval_s``."""

    def __init__(self, bootstrap: str, topic: str, partitions: int, interval_s: float = 0.02) -> None:
        self._stop = threading.Event()
        self._producer = Producer(bootstrap, linger_ms=1)
        self._topic = topic
        self._partitions = partitions
        self._interval_s = interval_s
        self.sent = 0
        self._thread = threading.Thread(target=self._run, daemon=True)
        self._thread.start()

    def _run(self) -> None:
        while not self._stop.is_set():
            for p in range(self._partitions):
                self._producer.send(self._topic, b"v%d" % self.sent, partition=p)
                self.sent += 1
            self._producer.flush(30)
            self._stop.wait(self._interval_s)

    def close(self) -> None:
        self._stop.set()
        self._thread.join(30)
        self._producer.close()


def produce(bootstrap: str, topic: str, per_partition: dict[int, int]) -> None:
    with Producer(bootstrap, linger_ms=2) as producer:
        futures = [producer.send(topic, b"x%d" % i, partition=p)
                   for p, n in per_partition.items() for i in range(n)]
        producer.flush(60)
        for f in futures:
            f.result(timeout=60)


def tps(topic: str, partitions: Iterable[int]) -> list[TopicPartition]:
    return [TopicPartition(topic, p) for p in partitions]
