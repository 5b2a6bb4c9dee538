"""An embedded broker for tests, notebooks and the demo.

``EmbeddedBroker`` starts a real broker on a free (or given) port with a
temporary (or given) data directory, either in this process (a background
thread running the broker's event loop) or as a child process
(``subprocess=True``), which a test can :meth:`~EmbeddedBroker.kill` with
SIGKILL to prove durability::

    with EmbeddedBroker() as broker:
        producer = Producer(broker.bootstrap)

With ``kafka_listener="127.0.0.1:0"`` it also serves Kafka's wire protocol
(:mod:`logstore.broker.kafka`) on a free port: :attr:`~EmbeddedBroker.kafka_bootstrap`
is what a Kafka client's ``bootstrap.servers`` names.

Thread-safety: start/stop/kill/restart are meant for one controlling thread.
"""

from __future__ import annotations

import asyncio
import os
import shutil
import signal
import subprocess as sp
import sys
import tempfile
import threading
from typing import Any

from logstore.broker.config import BrokerConfig, load_broker_config
from logstore.broker.server import serve
from logstore.defaults import DEFAULT_HOST

__all__ = ["EmbeddedBroker"]

_START_TIMEOUT_S = 60.0


class EmbeddedBroker:
    """A broker you can start, stop, restart and (as a child process) kill -9."""

    def __init__(
        self,
        data_dir: str | None = None,
        *,
        port: int = 0,
        host: str = DEFAULT_HOST,
        subprocess: bool = False,
        config_path: str | None = None,
        overrides: dict[str, Any] | None = None,
        topic_defaults: dict[str, Any] | None = None,
        max_open_files: int | None = None,
        kafka_listener: str | None = None,
    ) -> None:
        """``max_open_files`` (child broker only) is the child's descriptor limit
        (``RLIMIT_NOFILE``), for tests of descriptor pressure. ``kafka_listener``
        ("HOST:PORT", port 0 for a free one) adds the Kafka protocol listener; it keeps
        its port across restarts once bound."""
        self._own_dir = data_dir is None
        self.data_dir = data_dir or tempfile.mkdtemp(prefix="logstore-")
        self.host = host
        self.port = port
        self.subprocess = subprocess
        self.config_path = config_path
        self.overrides = dict(overrides or {})
        self.topic_defaults = dict(topic_defaults or {})
        self.max_open_files = max_open_files
        self.kafka_listener = kafka_listener
        self.kafka_port = 0
        self._thread: threading.Thread | None = None
        self._loop: asyncio.AbstractEventLoop | None = None
        self._stop_event: asyncio.Event | None = None
        self._proc: sp.Popen[str] | None = None
        self._error: BaseException | None = None

    @property
    def bootstrap(self) -> str:
        return f"{self.host}:{self.port}"

    @property
    def kafka_bootstrap(self) -> str:
        """HOST:PORT of the Kafka listener (``bootstrap.servers`` for a Kafka client)."""
        if not self.kafka_listener or not self.kafka_port:
            raise RuntimeError("the broker has no Kafka listener (give kafka_listener=, and start it)")
        return f"{self.kafka_listener.rsplit(':', 1)[0]}:{self.kafka_port}"

    def _kafka_address(self) -> str | None:
        """The listener to bind: the one given, at the port bound before (a restart keeps it)."""
        if not self.kafka_listener:
            return None
        host, _, port = self.kafka_listener.rpartition(":")
        return f"{host}:{self.kafka_port or port}"

    @property
    def pid(self) -> int:
        """The broker's process id: the child's with ``subprocess=True``, else this process's."""
        if self.subprocess:
            if self._proc is None:
                raise RuntimeError("the broker is not started")
            return self._proc.pid
        return os.getpid()

    @property
    def running(self) -> bool:
        if self.subprocess:
            return self._proc is not None and self._proc.poll() is None
        return self._thread is not None and self._thread.is_alive()

    # ------------------------------------------------------------------ start

    def start(self) -> EmbeddedBroker:
        if self.running:
            return self
        if self.subprocess:
            self._start_child()
        else:
            self._start_thread()
        return self

    def _config(self) -> BrokerConfig:
        overrides: dict[str, Any] = {"data_dir": self.data_dir, "host": self.host, "port": self.port,
                                     "kafka_listener": self._kafka_address(), **self.overrides}
        if self.topic_defaults:
            overrides["topic_defaults"] = self.topic_defaults
        return load_broker_config(self.config_path, overrides=overrides, env={})

    def _start_thread(self) -> None:
        config = self._config()
        bound = threading.Event()

        def ready(port: int) -> None:
            self.port = port
            bound.set()

        def kafka_ready(port: int) -> None:
            self.kafka_port = port

        def run() -> None:
            loop = asyncio.new_event_loop()
            self._loop = loop
            self._stop_event = asyncio.Event()
            try:
                loop.run_until_complete(serve(config, ready=ready, stop_event=self._stop_event,
                                              kafka_ready=kafka_ready))
            except BaseException as e:  # surfaced to start()
                self._error = e
                bound.set()
            finally:
                loop.close()

        self._error = None
        self._thread = threading.Thread(target=run, name="logstore-embedded-broker", daemon=True)
        self._thread.start()
        if not bound.wait(_START_TIMEOUT_S):
            raise TimeoutError(f"embedded broker did not start within {_START_TIMEOUT_S}s")
        if self._error is not None:
            raise self._error

    def _start_child(self) -> None:
        cmd = [sys.executable, "-m", "logstore.broker", "--data-dir", self.data_dir,
               "--host", self.host, "--port", str(self.port)]
        if self.config_path:
            cmd += ["--config", self.config_path]
        kafka_address = self._kafka_address()
        if kafka_address:
            cmd += ["--kafka-listener", kafka_address]
        env = dict(os.environ)
        env.setdefault("LOGSTORE_LOG_LEVEL", "WARNING")
        for key, value in self.overrides.items():
            env[f"LOGSTORE_{key.upper()}"] = str(value)
        if self.topic_defaults:
            raise ValueError("topic_defaults for a child broker go in a config file (config_path)")
        if self.max_open_files is not None:
            cmd = with_open_file_limit(cmd, self.max_open_files)
        self._proc = sp.Popen(cmd, stdout=sp.PIPE, text=True, env=env)
        line = _readline_with_timeout(self._proc, _START_TIMEOUT_S)
        if line.startswith("kafka listener on "):
            self.kafka_port = int(line.rsplit(":", 1)[1])
            line = _readline_with_timeout(self._proc, _START_TIMEOUT_S)
        if not line.startswith("listening on "):
            self._proc.kill()
            raise RuntimeError(f"child broker failed to start (said {line!r}, exit status "
                               f"{self._proc.wait()}); see its stderr")
        self.port = int(line.rsplit(":", 1)[1])

    # ------------------------------------------------------------------ stop

    def stop(self, timeout_s: float = 30.0) -> None:
        """Graceful shutdown (SIGTERM for a child): logs are closed with the clean marker."""
        if self.subprocess:
            if self._proc is not None and self._proc.poll() is None:
                self._proc.send_signal(signal.SIGTERM)
                try:
                    self._proc.wait(timeout_s)
                except sp.TimeoutExpired:
                    self._proc.kill()
                    self._proc.wait(timeout_s)
            self._close_pipes()
            return
        if self._loop is not None and self._stop_event is not None and self.running:
            self._loop.call_soon_threadsafe(self._stop_event.set)
        if self._thread is not None:
            self._thread.join(timeout_s)
            if self._thread.is_alive():
                raise TimeoutError("embedded broker did not stop in time")
        self._thread = None

    def kill(self) -> None:
        """SIGKILL the child broker (subprocess mode only): no clean shutdown."""
        if not self.subprocess:
            raise RuntimeError("kill() needs EmbeddedBroker(subprocess=True)")
        if self._proc is not None and self._proc.poll() is None:
            self._proc.send_signal(signal.SIGKILL)
            self._proc.wait(30)
        self._close_pipes()

    def _close_pipes(self) -> None:
        if self._proc is not None and self._proc.stdout is not None:
            self._proc.stdout.close()

    def restart(self) -> EmbeddedBroker:
        """Stop (if running) and start again on the same port and data directory."""
        self.stop()
        return self.start()

    def close(self) -> None:
        self.stop()
        if self._own_dir:
            shutil.rmtree(self.data_dir, ignore_errors=True)

    def __enter__(self) -> EmbeddedBroker:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.close()


# Sets the limit, then execs the broker: no Python runs in a forked copy of this process.
_LIMIT_THEN_EXEC = ("import os, resource, sys; n = int(sys.argv[1]); "
                    "resource.setrlimit(resource.RLIMIT_NOFILE, (n, n)); os.execv(sys.argv[2], sys.argv[2:])")


def with_open_file_limit(cmd: list[str], limit: int) -> list[str]:
    """``cmd`` run with its descriptor limit lowered to ``limit``.

    Not ``preexec_fn``: that forks this process and runs Python in the child
    before exec, and when gRPC threads are busy here, gRPC's fork handlers
    abort the child (SIGABRT, about 1 start in 100) before it says a word.
    """
    return [sys.executable, "-c", _LIMIT_THEN_EXEC, str(limit), *cmd]


def _readline_with_timeout(proc: sp.Popen[str], timeout_s: float) -> str:
    result: list[str] = []
    reader = threading.Thread(target=lambda: result.append(proc.stdout.readline() if proc.stdout else ""),
                              daemon=True)
    reader.start()
    reader.join(timeout_s)
    if not result:
        proc.kill()
        raise TimeoutError(f"child broker did not report its port within {timeout_s}s")
    return result[0].strip()
