"""A Spark standalone cluster on loopback, started from the pip-installed PySpark.

What ``tests/e2e/test_spark_standalone.py`` and ``benchmarks/bench_compaction_cluster.py``
run the jobs against, so "runs on a Spark cluster" is tested rather than assumed::

    with SparkStandalone(workers=2, work_dir=tmp) as spark_cluster:
        subprocess.run([..., "logstore", "jobs", "compact", "--master", spark_cluster.master_url, ...])
        spark_cluster.completed_apps()   # the master's record of what ran where

The master and each worker are separate JVMs started with PySpark's own launcher
(``$SPARK_HOME/bin/spark-class``, ``SPARK_HOME`` = the ``pyspark`` package directory,
which the wheel ships with ``bin/`` and ``jars/``)::

    spark-class org.apache.spark.deploy.master.Master --host 127.0.0.1 --port P --webui-port W
    spark-class org.apache.spark.deploy.worker.Worker spark://127.0.0.1:P --cores 1 --memory 1g
        --host 127.0.0.1 --webui-port 0 --work-dir DIR/worker-N

Executors therefore run in their own JVMs (started by the workers, one per
application and worker) with their own Python workers: ``PYSPARK_PYTHON`` is the
driver's interpreter, as on a real cluster where the same virtualenv is installed on
every node. A worker is up when the master's JSON (``http://127.0.0.1:W/json``) lists
it ``ALIVE``.

Every JVM is started in its own session (process group); :meth:`SparkStandalone.close`
SIGTERMs then SIGKILLs the groups, so executors and Python workers go with their worker.
Each process's output is in ``DIR/master.log`` / ``DIR/worker-N.log``.

Thread-safety: one controlling thread.
"""

from __future__ import annotations

import contextlib
import json
import os
import signal
import socket
import subprocess
import sys
import time
import urllib.request
from pathlib import Path
from typing import IO, Any

import pyspark

__all__ = ["SparkStandalone", "spark_home"]

_HOST = "127.0.0.1"
_START_TIMEOUT_S = 90.0


def spark_home() -> Path:
    """The pip-installed PySpark's directory: a complete ``SPARK_HOME`` (``bin/``, ``jars/``)."""
    return Path(pyspark.__file__).resolve().parent


def _free_port() -> int:
    with socket.socket() as s:
        s.bind((_HOST, 0))
        return int(s.getsockname()[1])


class SparkStandalone:
    """A master and ``workers`` workers of ``cores`` cores and ``memory`` each (see the module docstring)."""

    def __init__(self, work_dir: Path, *, workers: int = 2, cores: int = 1, memory: str = "1g",
                 env: dict[str, str] | None = None) -> None:
        self.work_dir = Path(work_dir)
        self.cores, self.memory = cores, memory
        self._initial_workers = workers
        self.port, self.webui_port = _free_port(), _free_port()
        self._procs: list[tuple[str, subprocess.Popen[bytes], IO[bytes]]] = []
        self._env = {
            **os.environ,
            "SPARK_HOME": str(spark_home()),
            "SPARK_LOCAL_IP": _HOST,
            "PYSPARK_PYTHON": sys.executable,
            **(env or {}),
        }

    @property
    def master_url(self) -> str:
        """``spark://127.0.0.1:P``: what ``--master`` takes."""
        return f"spark://{_HOST}:{self.port}"

    # ---------------------------------------------------------------- processes

    def _launch(self, name: str, *args: str) -> None:
        self.work_dir.mkdir(parents=True, exist_ok=True)
        log = open(self.work_dir / f"{name}.log", "ab")  # noqa: SIM115 - closed in close()
        proc = subprocess.Popen(
            [str(spark_home() / "bin" / "spark-class"), *args], stdout=log, stderr=subprocess.STDOUT,
            stdin=subprocess.DEVNULL, env=self._env, start_new_session=True,
        )
        self._procs.append((name, proc, log))

    def start(self) -> SparkStandalone:
        """Start the master and the workers; return when every worker is registered."""
        try:
            self._launch("master", "org.apache.spark.deploy.master.Master", "--host", _HOST,
                         "--port", str(self.port), "--webui-port", str(self.webui_port))
            self._wait(lambda s: True, "the master's web UI")
            for _ in range(self._initial_workers):
                self.add_worker(wait=False)
            self._wait(lambda s: _alive(s) >= self._initial_workers, "the workers to register")
        except BaseException:
            self.close()
            raise
        return self

    def add_worker(self, *, wait: bool = True) -> None:
        """Start one more worker (``worker-N``); with ``wait``, return once the master lists it alive."""
        n = sum(1 for name, _, _ in self._procs if name.startswith("worker-")) + 1
        self._launch(f"worker-{n}", "org.apache.spark.deploy.worker.Worker", self.master_url,
                     "--cores", str(self.cores), "--memory", self.memory, "--host", _HOST,
                     "--webui-port", "0", "--work-dir", str(self.work_dir / f"worker-{n}"))
        if wait:
            self._wait(lambda s: _alive(s) >= n, f"worker-{n} to register")

    def _wait(self, ready: Any, what: str) -> None:
        deadline = time.monotonic() + _START_TIMEOUT_S
        while True:
            for name, proc, _ in self._procs:
                if proc.poll() is not None:
                    raise RuntimeError(f"spark {name} exited with {proc.returncode}:\n{self.log_tail(name)}")
            try:
                if ready(self.status()):
                    return
            except (OSError, ValueError):  # not listening yet, or an empty page while it starts
                pass
            if time.monotonic() > deadline:
                raise TimeoutError(f"waited {_START_TIMEOUT_S:.0f}s for {what}:\n{self.log_tail('master')}")
            time.sleep(0.3)

    def log_tail(self, name: str, lines: int = 30) -> str:
        path = self.work_dir / f"{name}.log"
        text = path.read_text(errors="replace") if path.exists() else ""
        return "\n".join(text.splitlines()[-lines:])

    # ---------------------------------------------------------------- the master's view

    def status(self) -> dict[str, Any]:
        """The master's JSON: ``workers``, ``activeapps``, ``completedapps``, ``aliveworkers``, ..."""
        with urllib.request.urlopen(f"http://{_HOST}:{self.webui_port}/json", timeout=5) as resp:
            return dict(json.load(resp))

    def alive_workers(self) -> int:
        return _alive(self.status())

    def completed_apps(self) -> list[dict[str, Any]]:
        return list(self.status().get("completedapps", []))

    def executor_logs(self, app_id: str) -> dict[str, str]:
        """What the executors of ``app_id`` logged, per worker (``worker-N``): their own
        ``stderr`` in ``worker-N/<app id>/<executor id>/``, at Spark's default INFO level."""
        logs: dict[str, str] = {}
        for path in sorted(self.work_dir.glob(f"worker-*/{app_id}/*/stderr")):
            worker = path.parent.parent.parent.name
            logs[worker] = logs.get(worker, "") + path.read_text(errors="replace")
        return logs

    def tasks_run(self, app_id: str) -> dict[str, int]:
        """Tasks that the executors of ``app_id`` ran, per worker (``Executor: Running task ...``
        lines of :meth:`executor_logs`)."""
        return {worker: text.count("Executor: Running task") for worker, text in self.executor_logs(app_id).items()}

    # ---------------------------------------------------------------- stop

    def close(self) -> None:
        """SIGTERM every process group (workers first), SIGKILL what is left after 3 s (nothing of theirs is kept)."""
        for _, proc, _ in reversed(self._procs):
            _signal_group(proc, signal.SIGTERM)
        deadline = time.monotonic() + 3
        for _, proc, log in reversed(self._procs):
            with contextlib.suppress(subprocess.TimeoutExpired):
                proc.wait(max(0.1, deadline - time.monotonic()))
            _signal_group(proc, signal.SIGKILL)  # executors and Python workers of the group too
            proc.wait()
            log.close()
        self._procs.clear()

    def __enter__(self) -> SparkStandalone:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.close()


def _alive(status: dict[str, Any]) -> int:
    return sum(1 for w in status.get("workers", []) if w.get("state") == "ALIVE")


def _signal_group(proc: subprocess.Popen[bytes], sig: int) -> None:
    with contextlib.suppress(ProcessLookupError):
        os.killpg(proc.pid, sig)
