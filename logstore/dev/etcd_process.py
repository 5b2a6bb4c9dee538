"""A real etcd server as a child process: the cluster's metadata store for tests, benchmarks and
``logstore dev cluster`` (DESIGN.md §4b).

The cluster keeps its metadata in etcd rather than in a consensus protocol of ours, so
everything that runs a cluster on one machine needs an etcd server it can start and stop:
:class:`EtcdServer` runs one single-member etcd on free loopback ports with its own data
directory and waits until it answers.

Where the binary comes from (:func:`find_etcd`, first hit wins):

1. the environment variable ``LOGSTORE_ETCD_BIN``;
2. ``.tools/bin/etcd`` under the repository root, which ``make etcd`` builds from the Go
   module proxy (``make test`` runs it first);
3. ``etcd`` on ``PATH`` (e.g. Debian's ``etcd-server`` package).

Ports: both the client and the peer port are picked free by binding port 0 and closing the
socket just before etcd starts. Another process may take a port in between; etcd then exits at
once, and :meth:`EtcdServer.start` retries with new ports (a few times) before giving up.

Crash behaviour: etcd fsyncs its WAL before it answers a write, so a SIGKILLed server
restarted on the same data directory (``EtcdServer(data_dir=...)``) has every acknowledged
write; leases survive too, with their TTL restarted (etcd's rule on a leader change).

Process group: etcd runs in a session of its own, so a Ctrl-C in the terminal reaches the
Python process only and it can stop brokers before etcd (``logstore dev cluster`` relies on
this). Servers still running when the interpreter exits are stopped by an ``atexit`` hook; only
a SIGKILLed parent leaves its etcd behind.

Thread-safety: an :class:`EtcdServer` is driven by one thread.
"""

from __future__ import annotations

import atexit
import contextlib
import os
import shutil
import signal
import socket
import ssl
import subprocess
import tempfile
import time
import urllib.error
import urllib.request
import weakref
from pathlib import Path
from types import TracebackType
from typing import IO

__all__ = ["EtcdNotFoundError", "EtcdServer", "find_etcd"]

_REPO_ROOT = Path(__file__).resolve().parents[2]
_TOOLS_ETCD = _REPO_ROOT / ".tools" / "bin" / "etcd"
_ENV_BIN = "LOGSTORE_ETCD_BIN"
_RUNNING: weakref.WeakSet[EtcdServer] = weakref.WeakSet()


@atexit.register
def _stop_all() -> None:
    for server in list(_RUNNING):
        server.stop()


class EtcdNotFoundError(RuntimeError):
    """No etcd server binary was found where :func:`find_etcd` looks."""


def find_etcd() -> str:
    """The path of the etcd server binary to run (see the module docstring for the order)."""
    env = os.environ.get(_ENV_BIN)
    if env:
        if not (os.path.isfile(env) and os.access(env, os.X_OK)):
            raise EtcdNotFoundError(f"{_ENV_BIN}={env} is not an executable file")
        return env
    if _TOOLS_ETCD.is_file() and os.access(_TOOLS_ETCD, os.X_OK):
        return str(_TOOLS_ETCD)
    on_path = shutil.which("etcd")
    if on_path:
        return on_path
    raise EtcdNotFoundError(
        f"no etcd server binary: run `make etcd` (builds {_TOOLS_ETCD}), install etcd on PATH, "
        f"or set {_ENV_BIN}")


def _free_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


class EtcdServer:
    """One single-member etcd server on loopback; a context manager.

    ``data_dir`` None makes a temporary directory that :meth:`stop` removes; a given directory
    is kept (restart a server on it to test recovery). etcd's own log goes to
    ``<data_dir>/etcd.log``. ``client_port`` 0 picks a free port; pass the old port to restart
    a killed server where its clients expect it.
    """

    def __init__(self, data_dir: str | os.PathLike[str] | None = None, *, client_port: int = 0,
                 name: str = "logstore-etcd", start_timeout_s: float = 20.0,
                 binary: str | None = None, tls: tuple[str, str, str] | None = None) -> None:
        """``tls`` = (CA, certificate, key) PEM paths: serve clients over https and require client
        certificates signed by the CA (``--client-cert-auth``); the health check presents the
        same certificate."""
        self.tls = tls
        self._given_dir = data_dir is not None
        self._data_dir = Path(data_dir) if data_dir is not None else None
        self._want_port = client_port
        self._name = name
        self._start_timeout_s = start_timeout_s
        self._binary = binary
        self._proc: subprocess.Popen[bytes] | None = None
        self._want_peer_port = 0
        self._log: IO[bytes] | None = None
        self.client_port = 0
        self.peer_port = 0

    # ------------------------------------------------------------------ addresses

    @property
    def endpoint(self) -> str:
        """``127.0.0.1:PORT``: what :meth:`MetadataStore.connect` takes."""
        return f"127.0.0.1:{self.client_port}"

    @property
    def url(self) -> str:
        """``etcd://127.0.0.1:PORT``: what ``--metadata`` takes."""
        return f"etcd://{self.endpoint}"

    @property
    def data_dir(self) -> Path:
        assert self._data_dir is not None, "the server has not been started"
        return self._data_dir

    @property
    def log_path(self) -> Path:
        return self.data_dir / "etcd.log"

    @property
    def pid(self) -> int:
        assert self._proc is not None, "the server is not running"
        return self._proc.pid

    def running(self) -> bool:
        return self._proc is not None and self._proc.poll() is None

    # ------------------------------------------------------------------ lifecycle

    def start(self) -> EtcdServer:
        """Start etcd and return once it answers ``/health``; raise with its log's tail if not."""
        binary = self._binary or find_etcd()
        if self._data_dir is None:
            self._data_dir = Path(tempfile.mkdtemp(prefix="logstore-etcd-"))
        self._data_dir.mkdir(parents=True, exist_ok=True)
        last_error = ""
        for _ in range(5):
            self.client_port = self._want_port or _free_port()
            self.peer_port = self._want_peer_port or _free_port()
            self._spawn(binary)
            error = self._wait_healthy()
            if error is None:
                _RUNNING.add(self)
                return self
            last_error = error
            self._terminate(signal.SIGKILL)
            if self._want_port:
                break  # a fixed port that is taken will stay taken: no point retrying
        raise RuntimeError(f"etcd did not start on 127.0.0.1:{self.client_port}: {last_error}\n"
                           f"--- {self.log_path} (tail) ---\n{self._log_tail()}")

    def _spawn(self, binary: str) -> None:
        client = f"{'https' if self.tls else 'http'}://127.0.0.1:{self.client_port}"
        peer = f"http://127.0.0.1:{self.peer_port}"
        args = [binary, "--name", self._name, "--data-dir", str(self.data_dir / "member-data"),
                "--listen-client-urls", client, "--advertise-client-urls", client,
                "--listen-peer-urls", peer, "--initial-advertise-peer-urls", peer,
                "--initial-cluster", f"{self._name}={peer}", "--initial-cluster-state", "new",
                # etcd's shortest lease is 1.5 election timeouts rounded up to whole seconds:
                # 2 s with the default 1 s; 500 ms lets tests use 1 s broker sessions. A single
                # member holds no elections, so the shorter timeout costs nothing.
                "--heartbeat-interval", "50", "--election-timeout", "500",
                # create_topic writes a topic and all its partitions in one transaction.
                "--max-txn-ops", "10000",
                "--log-level", "warn", "--log-outputs", "stderr"]
        if self.tls is not None:
            ca, cert, key = self.tls
            args += ["--trusted-ca-file", ca, "--cert-file", cert, "--key-file", key, "--client-cert-auth"]
        log = open(self.log_path, "ab")  # noqa: SIM115 - closed in _terminate
        self._log = log
        self._proc = subprocess.Popen(args, stdout=log, stderr=subprocess.STDOUT,
                                      stdin=subprocess.DEVNULL, start_new_session=True)

    def _wait_healthy(self) -> str | None:
        """None once etcd reports healthy; else why not (exited, or timed out)."""
        deadline = time.monotonic() + self._start_timeout_s
        url = f"{'https' if self.tls else 'http'}://127.0.0.1:{self.client_port}/health"
        context = None
        if self.tls is not None:
            context = ssl.create_default_context(cafile=self.tls[0])
            context.load_cert_chain(self.tls[1], self.tls[2])
        last = "no answer"
        while time.monotonic() < deadline:
            assert self._proc is not None
            code = self._proc.poll()
            if code is not None:
                return f"etcd exited with code {code}"
            try:
                with urllib.request.urlopen(url, timeout=1.0, context=context) as resp:
                    body = resp.read()
                if b'"health":"true"' in body:
                    return None
                last = body.decode(errors="replace")
            except (urllib.error.URLError, OSError) as e:
                last = str(e)
            time.sleep(0.05)
        return f"not healthy after {self._start_timeout_s:.0f} s ({last})"

    def _log_tail(self, lines: int = 20) -> str:
        try:
            return "\n".join(self.log_path.read_text(errors="replace").splitlines()[-lines:])
        except OSError:
            return "(no log)"

    def _terminate(self, sig: int, timeout_s: float = 10.0) -> None:
        _RUNNING.discard(self)
        proc, self._proc = self._proc, None
        if proc is not None and proc.poll() is None:
            with contextlib.suppress(ProcessLookupError):
                proc.send_signal(sig)
            try:
                proc.wait(timeout=timeout_s)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait(timeout=timeout_s)
        log, self._log = self._log, None
        if log is not None:
            log.close()

    def stop(self) -> None:
        """SIGTERM etcd, wait for it, and remove a temporary data directory."""
        self._terminate(signal.SIGTERM)
        if not self._given_dir and self._data_dir is not None:
            shutil.rmtree(self._data_dir, ignore_errors=True)
            self._data_dir = None

    def kill(self) -> None:
        """SIGKILL etcd (its data directory is kept: :meth:`restart` brings it back)."""
        self._terminate(signal.SIGKILL)

    def pause(self) -> None:
        """SIGSTOP etcd: it stops answering but keeps its sockets (clients time out)."""
        assert self._proc is not None
        self._proc.send_signal(signal.SIGSTOP)

    def resume(self) -> None:
        """SIGCONT a paused etcd."""
        assert self._proc is not None
        self._proc.send_signal(signal.SIGCONT)

    def restart(self) -> None:
        """Start etcd again on the same data directory and client port (after kill or stop of a
        given data directory)."""
        self._terminate(signal.SIGTERM)
        self._want_port, self._want_peer_port = self.client_port, self.peer_port
        self.start()

    def __enter__(self) -> EtcdServer:
        return self.start()

    def __exit__(self, exc_type: type[BaseException] | None, exc: BaseException | None,
                 tb: TracebackType | None) -> None:
        self.stop()
