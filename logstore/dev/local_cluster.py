"""A cluster on one machine: etcd and N brokers, each its own process, on free loopback ports.

What the fault harness, the replication benchmarks and ``logstore dev cluster`` run::

    with LocalCluster(brokers=3, data_dir=tmp) as cluster:
        producer = Producer(cluster.bootstrap)
        cluster.kill(2)          # SIGKILL broker 2
        cluster.start(2)         # restart it on the same port and data directory

Layout of ``data_dir``::

    etcd/                 etcd's data directory (and etcd.log)
    broker-N/             broker N's data directory
    broker-N.log          broker N's stdout and stderr, appended across restarts
    broker-N.toml         broker N's config file (--config)

Brokers are numbered 1..N (``--node-id``) and started as ``python -m logstore.broker
--node-id N --metadata etcd://... --host 127.0.0.1 --port P --data-dir DIR/broker-N
--config DIR/broker-N.toml``; a broker is up when its log says ``listening on``. Ports are
chosen once, at :meth:`LocalCluster.start`, and kept, so a restarted broker is where clients
and peers expect it. With ``kafka=True`` each broker also serves Kafka's protocol
(``--kafka-listener 127.0.0.1:K``, K chosen and kept the same way):
:attr:`LocalCluster.kafka_bootstrap` is what Kafka clients take as ``bootstrap.servers``.

With ``proxies=True`` every ordered pair of brokers (a → b) gets its own
:class:`~logstore.dev.tcp_proxy.TcpProxy`, and broker a's config says
``peer_addresses = "b=127.0.0.1:<proxy port>,..."``: a reaches b through that proxy for
replication. :meth:`LocalCluster.cut_link` cuts both directions between two brokers (a
partition of replication traffic) while clients, which connect to the brokers directly,
still reach both.

Every child is started in its own session, so a Ctrl-C in the terminal reaches the process
that owns the cluster, which then stops the children in order (:meth:`close`); children
still alive when the owner is garbage-collected or exits are SIGKILLed.

Thread-safety: one controlling thread at a time (the harness's nemesis and its checker take
turns); :meth:`address`, :meth:`pid` and :attr:`bootstrap` are safe from any thread.
"""

from __future__ import annotations

import atexit
import contextlib
import os
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
import weakref
from collections.abc import Mapping
from pathlib import Path
from typing import IO, Any

from logstore.dev.etcd_process import EtcdServer
from logstore.dev.tcp_proxy import CutMode, ProxyRunner, TcpProxy

__all__ = ["LocalCluster", "BrokerProcess"]

_HOST = "127.0.0.1"
_START_TIMEOUT_S = 60.0
_STOP_TIMEOUT_S = 30.0


def _free_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind((_HOST, 0))
        return int(s.getsockname()[1])


def _toml_value(value: Any) -> str:
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, (int, float)):
        return repr(value)
    if isinstance(value, str):
        return '"' + value.replace("\\", "\\\\").replace('"', '\\"') + '"'
    if isinstance(value, Mapping):
        return "{ " + ", ".join(f"{_toml_value(str(k))} = {_toml_value(v)}" for k, v in value.items()) + " }"
    raise TypeError(f"cannot write {value!r} ({type(value).__name__}) to a broker config file")


def write_broker_toml(path: Path, config: Mapping[str, Any]) -> None:
    """Write ``config`` as TOML: scalars and inline tables at the top, ``topic_defaults`` as a
    table (its keys are Kafka's dotted names, quoted)."""
    lines = [f"{key} = {_toml_value(value)}" for key, value in config.items() if key != "topic_defaults"]
    topic_defaults = config.get("topic_defaults")
    if topic_defaults:
        lines.append("\n[topic_defaults]")
        lines += [f"{_toml_value(str(k))} = {_toml_value(v)}" for k, v in topic_defaults.items()]
    path.write_text("\n".join(lines) + "\n")


class BrokerProcess:
    """One broker child process: where it listens, its files, and the signals it gets."""

    def __init__(self, node_id: int, port: int, data_dir: Path, log_path: Path, config_path: Path,
                 kafka_port: int = 0) -> None:
        self.node_id = node_id
        self.port = port
        self.kafka_port = kafka_port  # 0: no Kafka listener
        self.data_dir = data_dir
        self.log_path = log_path
        self.config_path = config_path
        self.proc: subprocess.Popen[bytes] | None = None
        self.paused = False
        self._log: IO[bytes] | None = None

    @property
    def address(self) -> str:
        return f"{_HOST}:{self.port}"

    @property
    def kafka_address(self) -> str:
        if not self.kafka_port:
            raise RuntimeError(f"broker {self.node_id} has no Kafka listener (LocalCluster(kafka=True) gives one)")
        return f"{_HOST}:{self.kafka_port}"

    @property
    def running(self) -> bool:
        return self.proc is not None and self.proc.poll() is None

    def launch(self, metadata_url: str, env: Mapping[str, str]) -> None:
        """Start the process and return once its log says ``listening on`` (raise otherwise)."""
        if self.running:
            raise RuntimeError(f"broker {self.node_id} is already running (pid {self.proc.pid if self.proc else '?'})")
        self.data_dir.mkdir(parents=True, exist_ok=True)
        log = open(self.log_path, "ab")  # noqa: SIM115 - closed in _reap
        start = log.tell()
        cmd = [sys.executable, "-m", "logstore.broker", "--node-id", str(self.node_id),
               "--metadata", metadata_url, "--host", _HOST, "--port", str(self.port),
               "--data-dir", str(self.data_dir), "--config", str(self.config_path)]
        if self.kafka_port:
            cmd += ["--kafka-listener", self.kafka_address]
        self._log = log
        self.proc = subprocess.Popen(cmd, stdout=log, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL,
                                     env=dict(env), start_new_session=True)
        self.paused = False
        self._wait_listening(start)

    def _wait_listening(self, start: int) -> None:
        deadline = time.monotonic() + _START_TIMEOUT_S
        needle = f"listening on {_HOST}:{self.port}".encode()
        while time.monotonic() < deadline:
            with open(self.log_path, "rb") as f:
                f.seek(start)
                if needle in f.read():
                    return
            assert self.proc is not None
            if self.proc.poll() is not None:
                code = self.proc.returncode
                self._reap()
                raise RuntimeError(f"broker {self.node_id} exited with code {code} before listening; "
                                   f"{self.log_path} ends:\n{self.log_tail()}")
            time.sleep(0.05)
        self.signal(signal.SIGKILL)
        raise TimeoutError(f"broker {self.node_id} did not listen on {self.address} within "
                           f"{_START_TIMEOUT_S:.0f} s; {self.log_path} ends:\n{self.log_tail()}")

    def log_tail(self, lines: int = 30) -> str:
        try:
            return "\n".join(self.log_path.read_text(errors="replace").splitlines()[-lines:])
        except OSError:
            return "(no log)"

    def signal(self, sig: int) -> None:
        """Send ``sig``; for SIGKILL also wait for the process and close its log."""
        if not self.running:
            return
        assert self.proc is not None
        with contextlib.suppress(ProcessLookupError):
            if self.paused and sig not in (signal.SIGSTOP, signal.SIGCONT):
                self.proc.send_signal(signal.SIGCONT)  # a stopped process would hold SIGTERM
                self.paused = False
            self.proc.send_signal(sig)
        if sig == signal.SIGKILL:
            self.proc.wait(_STOP_TIMEOUT_S)
            self._reap()

    def terminate(self, timeout_s: float = _STOP_TIMEOUT_S) -> int | None:
        """SIGTERM (controlled shutdown) and wait; SIGKILL after ``timeout_s``. The exit code."""
        if self.proc is None:
            return None
        if self.running:
            self.signal(signal.SIGTERM)
            try:
                self.proc.wait(timeout_s)
            except subprocess.TimeoutExpired:
                self.signal(signal.SIGKILL)
        code = self.proc.returncode
        self._reap()
        return code

    def _reap(self) -> None:
        if self.proc is not None and self.proc.poll() is None:
            self.proc.wait(_STOP_TIMEOUT_S)
        log, self._log = self._log, None
        if log is not None:
            log.close()


def _kill_all(processes: list[BrokerProcess]) -> None:
    """Last resort when the owner goes away without :meth:`LocalCluster.close`."""
    for p in processes:
        if p.running and p.proc is not None:
            with contextlib.suppress(ProcessLookupError):
                p.proc.kill()


class LocalCluster:
    """etcd + ``brokers`` broker processes (node ids 1..N); a context manager."""

    def __init__(
        self,
        brokers: int = 3,
        data_dir: str | os.PathLike[str] | None = None,
        *,
        session_timeout_ms: int = 2000,
        replica_lag_time_max_ms: int = 2000,
        proxies: bool = False,
        extra_config: Mapping[str, Any] | None = None,
        racks: Mapping[int, str] | None = None,
        env: Mapping[str, str] | None = None,
        etcd_tls: tuple[str, str, str] | None = None,
        kafka: bool = False,
    ) -> None:
        """``extra_config`` goes into every broker's config file (``topic_defaults`` as its
        table); ``racks`` maps node ids to ``rack``; ``env`` is added to the children's
        environment (default ``LOGSTORE_LOG_LEVEL=INFO``). ``data_dir`` None: a temporary
        directory that :meth:`close` removes. ``etcd_tls`` = (CA, certificate, key): etcd serves
        https and requires client certificates; every broker gets them as etcd_ca/etcd_cert/etcd_key.
        ``kafka``: every broker also gets a Kafka listener on a free loopback port (Python 3.11+)."""
        if brokers < 1:
            raise ValueError(f"a cluster needs at least one broker, got {brokers}")
        self._own_dir = data_dir is None
        self.data_dir = Path(data_dir) if data_dir is not None else Path(tempfile.mkdtemp(prefix="logstore-cluster-"))
        self.size = brokers
        self.session_timeout_ms = session_timeout_ms
        self.replica_lag_time_max_ms = replica_lag_time_max_ms
        self.use_proxies = proxies
        self.extra_config = dict(extra_config or {})
        self.racks = dict(racks or {})
        self.etcd_tls = etcd_tls
        self.kafka = kafka
        self.env = {**os.environ, "LOGSTORE_LOG_LEVEL": "INFO", **(env or {})}
        self.etcd: EtcdServer | None = None
        self.brokers: dict[int, BrokerProcess] = {}
        self.links: dict[tuple[int, int], TcpProxy] = {}
        self._runner: ProxyRunner | None = None
        self._finalizer: weakref.finalize | None = None

    # ------------------------------------------------------------------ addresses

    @property
    def node_ids(self) -> list[int]:
        return list(range(1, self.size + 1))

    @property
    def bootstrap(self) -> str:
        """``host:port,host:port,...``: every broker, what clients take as ``bootstrap``."""
        return ",".join(self.brokers[n].address for n in self.node_ids)

    @property
    def kafka_bootstrap(self) -> str:
        """``host:port,...``: every broker's Kafka listener, what Kafka clients take as
        ``bootstrap.servers`` (a cluster started with ``kafka=True``)."""
        if not self.kafka:
            raise RuntimeError("the brokers have no Kafka listener: start the cluster with LocalCluster(kafka=True)")
        return ",".join(self.brokers[n].kafka_address for n in self.node_ids)

    def kafka_address(self, node_id: int) -> str:
        """Broker ``node_id``'s Kafka listener (a cluster started with ``kafka=True``)."""
        return self._broker(node_id).kafka_address

    @property
    def metadata_url(self) -> str:
        if self.etcd is None:
            raise RuntimeError("the cluster is not started")
        return self.etcd.url

    def address(self, node_id: int) -> str:
        return self._broker(node_id).address

    def pid(self, node_id: int) -> int | None:
        proc = self._broker(node_id).proc
        return proc.pid if proc is not None and proc.poll() is None else None

    def running(self, node_id: int) -> bool:
        return self._broker(node_id).running

    def log_path(self, node_id: int) -> Path:
        return self._broker(node_id).log_path

    def broker_data_dir(self, node_id: int) -> Path:
        return self._broker(node_id).data_dir

    def _broker(self, node_id: int) -> BrokerProcess:
        try:
            return self.brokers[node_id]
        except KeyError:
            raise ValueError(f"no broker {node_id} in this cluster (node ids {self.node_ids})") from None

    # ------------------------------------------------------------------ lifecycle

    def start_all(self) -> LocalCluster:
        """Start etcd, the proxies (if any) and every broker; return once all listen."""
        self.data_dir.mkdir(parents=True, exist_ok=True)
        try:
            self.etcd = EtcdServer(self.data_dir / "etcd", tls=self.etcd_tls).start()
            for n in self.node_ids:
                self.brokers[n] = BrokerProcess(n, _free_port(), self.data_dir / f"broker-{n}",
                                                self.data_dir / f"broker-{n}.log",
                                                self.data_dir / f"broker-{n}.toml",
                                                kafka_port=_free_port() if self.kafka else 0)
            self._finalizer = weakref.finalize(self, _kill_all, list(self.brokers.values()))
            atexit.register(self._finalizer)
            if self.use_proxies:
                self._runner = ProxyRunner()
                for a in self.node_ids:
                    for b in self.node_ids:
                        if a != b:
                            self.links[(a, b)] = self._runner.start_proxy(self.address(b))
            for n in self.node_ids:
                write_broker_toml(self.brokers[n].config_path, self._config_for(n))
            for n in self.node_ids:
                self.start(n)
        except BaseException:
            self.close()
            raise
        return self

    def _config_for(self, node_id: int) -> dict[str, Any]:
        config: dict[str, Any] = {
            "broker_session_timeout_ms": self.session_timeout_ms,
            "replica_lag_time_max_ms": self.replica_lag_time_max_ms,
        }
        if node_id in self.racks:
            config["rack"] = self.racks[node_id]
        if self.etcd_tls is not None:
            config["etcd_ca"], config["etcd_cert"], config["etcd_key"] = self.etcd_tls
        if self.use_proxies:
            config["peer_addresses"] = ",".join(f"{b}={self.links[(node_id, b)].address}"
                                                for b in self.node_ids if b != node_id)
        config.update(self.extra_config)
        return config

    def add_broker(self) -> int:
        """Start one more broker (node id ``size + 1``) on the running cluster; return its id. It
        joins with no replicas: partitions reach it only by reassignment (as in Kafka). Not with
        ``proxies`` (the links between the existing brokers are fixed at start)."""
        if self.etcd is None:
            raise RuntimeError("the cluster is not started")
        if self.use_proxies:
            raise ValueError("add_broker is not supported on a cluster started with proxies")
        self.size += 1
        n = self.size
        self.brokers[n] = BrokerProcess(n, _free_port(), self.data_dir / f"broker-{n}",
                                        self.data_dir / f"broker-{n}.log", self.data_dir / f"broker-{n}.toml",
                                        kafka_port=_free_port() if self.kafka else 0)
        if self._finalizer is not None:  # the kill-at-exit list must include the new one
            atexit.unregister(self._finalizer)
            self._finalizer.detach()
        self._finalizer = weakref.finalize(self, _kill_all, list(self.brokers.values()))
        atexit.register(self._finalizer)
        write_broker_toml(self.brokers[n].config_path, self._config_for(n))
        self.start(n)
        return n

    def start(self, node_id: int) -> None:
        """(Re)start broker ``node_id`` on its port and data directory; wait until it listens."""
        self._broker(node_id).launch(self.metadata_url, self.env)

    def kill(self, node_id: int) -> None:
        """SIGKILL broker ``node_id``: no controlled shutdown, no clean close of its logs."""
        self._broker(node_id).signal(signal.SIGKILL)

    def stop(self, node_id: int, timeout_s: float = _STOP_TIMEOUT_S) -> int | None:
        """SIGTERM broker ``node_id`` (controlled shutdown) and wait; its exit code."""
        return self._broker(node_id).terminate(timeout_s)

    def pause(self, node_id: int) -> None:
        """SIGSTOP broker ``node_id``: it holds its sockets and answers nothing, its etcd lease
        runs out after the session timeout."""
        broker = self._broker(node_id)
        broker.signal(signal.SIGSTOP)
        broker.paused = True

    def resume(self, node_id: int) -> None:
        """SIGCONT a paused broker."""
        broker = self._broker(node_id)
        broker.signal(signal.SIGCONT)
        broker.paused = False

    def cut_link(self, a: int, b: int, mode: CutMode = "reset") -> None:
        """Cut replication traffic between brokers ``a`` and ``b``, both directions."""
        for pair in ((a, b), (b, a)):
            self._link(pair).cut(mode)

    def heal_link(self, a: int, b: int) -> None:
        for pair in ((a, b), (b, a)):
            self._link(pair).heal()

    def heal_all(self) -> None:
        """Heal every link and resume every paused broker (the nemesis's clean-up)."""
        for proxy in self.links.values():
            proxy.heal()
        for n, broker in self.brokers.items():
            if broker.paused:
                self.resume(n)

    def _link(self, pair: tuple[int, int]) -> TcpProxy:
        if not self.use_proxies:
            raise RuntimeError("links can be cut only in a LocalCluster(proxies=True)")
        try:
            return self.links[pair]
        except KeyError:
            raise ValueError(f"no link {pair[0]} -> {pair[1]} (node ids {self.node_ids})") from None

    def close(self, *, graceful: bool = True) -> None:
        """Stop every broker (SIGTERM, in parallel; SIGKILL with ``graceful=False``), then the
        proxies and etcd; remove a temporary data directory."""
        for broker in self.brokers.values():
            if broker.paused:
                broker.signal(signal.SIGCONT)
                broker.paused = False
            broker.signal(signal.SIGTERM if graceful else signal.SIGKILL)
        for broker in self.brokers.values():
            broker.terminate()
        if self._runner is not None:
            self._runner.close()
            self._runner = None
        if self.etcd is not None:
            self.etcd.stop()
            self.etcd = None
        if self._finalizer is not None:
            atexit.unregister(self._finalizer)
            self._finalizer.detach()
        if self._own_dir:
            shutil.rmtree(self.data_dir, ignore_errors=True)

    def __enter__(self) -> LocalCluster:
        return self.start_all()

    def __exit__(self, *exc: object) -> None:
        self.close()
