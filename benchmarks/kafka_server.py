"""A real single-node Apache Kafka 4.x broker (KRaft, no ZooKeeper) for the benchmarks' Kafka side.

``make bench-kafka`` compares logstore with Apache Kafka in the same run on the same
machine; this module brings up the Kafka half:

* :func:`resolve_jars` — the broker's jars, resolved once from Maven Central by
  ``mvn dependency:copy-dependencies`` on ``benchmarks/kafka/pom.xml`` (Kafka
  ``4.4.0``: ``kafka_2.13`` for ``kafka.Kafka`` and ``kafka.tools.StorageTool``,
  ``kafka-tools`` for ``ConsumerPerformance``, Log4j 2 behind SLF4J 2) into a
  git-ignored cache folder, ``$LOGSTORE_KAFKA_JARS`` or ``<repo>/.cache/kafka-jars``.
  The folder is filled in a sibling temporary folder and renamed into place, so
  an interrupted download never leaves a half cache that looks complete.
* :func:`server_properties` — the broker's configuration: KRaft combined mode
  (``process.roles=broker,controller``, node 1, a static one-voter quorum), a
  PLAINTEXT and a CONTROLLER listener on 127.0.0.1 only, replication factor 1
  for the internal topics, no initial rebalance delay. Pure: tested without Java.
* :class:`KafkaServer` — a context manager: formats a temporary log directory
  (``kafka.tools.StorageTool format``), starts ``java -Xmx1g kafka.Kafka`` in a
  child process on two loopback ports free at run time, waits until a topic can be
  created and deleted through confluent-kafka's admin client, and at exit (also
  on Ctrl-C and SIGTERM, which it turns into ``SystemExit``) stops the broker and
  deletes the directory; if this interpreter is killed outright, the kernel sends
  the child SIGKILL (``PR_SET_PDEATHSIG``) and only the directory in /tmp is left.
* :func:`maybe_kafka` — what each benchmark calls under ``--kafka``: the started
  server, or ``None`` after printing why Kafka was skipped (no ``java``, no
  ``mvn`` and no cached jars, no network for Maven, confluent-kafka not installed,
  the broker did not come up), so the benchmark still runs its usual baselines.

The broker's log (Log4j, level WARN) goes to ``kafka.log`` in its directory; the
last lines are quoted in the error when it fails to start.

Thread-safety: a :class:`KafkaServer` is started and stopped by one thread;
``create_topic``/``delete_topic`` may be called from any thread while it runs.
"""

from __future__ import annotations

import argparse
import base64
import contextlib
import os
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import threading
import time
import uuid
from collections.abc import Iterator
from pathlib import Path

__all__ = [
    "KAFKA_VERSION",
    "KafkaServer",
    "KafkaUnavailable",
    "add_kafka_flag",
    "default_jars_dir",
    "maybe_kafka",
    "resolve_jars",
    "server_properties",
]

KAFKA_VERSION = "4.4.0"
POM = Path(__file__).resolve().parent / "kafka" / "pom.xml"
REPO = Path(__file__).resolve().parent.parent
ENV_JARS = "LOGSTORE_KAFKA_JARS"
ENV_ENABLE = "LOGSTORE_BENCH_KAFKA"
_COMPLETE = ".complete"  # written last into a filled jar folder: its presence means "usable"
_PR_SET_PDEATHSIG = 1

LOG4J2_PROPERTIES = """\
# Written by benchmarks/kafka_server.py: warnings and errors only, to the child's stdout.
status = warn
appender.console.type = Console
appender.console.name = STDOUT
appender.console.layout.type = PatternLayout
appender.console.layout.pattern = [%d] %p %m (%c)%n
rootLogger.level = WARN
rootLogger.appenderRef.stdout.ref = STDOUT
"""


class KafkaUnavailable(RuntimeError):
    """Kafka cannot be started here; the message says why and what would fix it."""


def add_kafka_flag(parser: argparse.ArgumentParser) -> None:
    """``--kafka``: also measure Apache Kafka (default: on when $LOGSTORE_BENCH_KAFKA is 1)."""
    parser.add_argument(
        "--kafka", action=argparse.BooleanOptionalAction,
        default=os.environ.get(ENV_ENABLE, "") not in ("", "0"),
        help="also run the Kafka side (a single-node Apache Kafka started from Maven Central's jars, "
             f"confluent-kafka as client; or set {ENV_ENABLE}=1)")


def default_jars_dir() -> Path:
    """Where the broker's jars are cached: $LOGSTORE_KAFKA_JARS, else <repo>/.cache/kafka-jars."""
    configured = os.environ.get(ENV_JARS)
    path = Path(configured) if configured else REPO / ".cache" / "kafka-jars"
    return path if path.is_absolute() else (REPO / path)


def resolve_jars(jars_dir: Path | None = None, *, pom: Path = POM) -> Path:
    """The folder of Kafka's jars, downloading them with Maven first if it is not complete.

    Raises :class:`KafkaUnavailable` when there is no cached folder and ``mvn`` is
    missing or fails (no network to Maven Central, for instance).
    """
    target = jars_dir or default_jars_dir()
    if (target / _COMPLETE).exists():
        return target
    mvn = shutil.which("mvn")
    if mvn is None:
        raise KafkaUnavailable(f"no cached Kafka jars in {target} and no `mvn` on PATH to resolve "
                               f"them from {pom} (install Maven, or fill {ENV_JARS} with the jars)")
    target.parent.mkdir(parents=True, exist_ok=True)
    staging = Path(tempfile.mkdtemp(prefix=target.name + ".partial-", dir=target.parent))
    print(f"resolving Apache Kafka {KAFKA_VERSION} jars from Maven Central into {target} (once) ...",
          flush=True)
    try:
        done = subprocess.run([mvn, "-q", "-B", "-f", str(pom), "dependency:copy-dependencies",
                               f"-DoutputDirectory={staging}"],
                              capture_output=True, text=True, timeout=900)
        if done.returncode != 0:
            tail = "\n".join((done.stdout + done.stderr).strip().splitlines()[-8:])
            raise KafkaUnavailable(f"`mvn dependency:copy-dependencies` on {pom} failed "
                                   f"(exit {done.returncode}; no network to Maven Central?):\n{tail}")
        if not any(staging.glob("kafka_2.13-*.jar")):
            raise KafkaUnavailable(f"Maven resolved {pom} but no kafka_2.13 jar is in {staging}")
        (staging / _COMPLETE).write_text(KAFKA_VERSION + "\n")
        shutil.rmtree(target, ignore_errors=True)
        staging.rename(target)
    except subprocess.TimeoutExpired as e:
        raise KafkaUnavailable(f"`mvn dependency:copy-dependencies` on {pom} took over 900 s") from e
    finally:
        shutil.rmtree(staging, ignore_errors=True)
    return target


def free_port() -> int:
    """A TCP port on 127.0.0.1 that nothing listens on now (the kernel's choice)."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def new_cluster_id() -> str:
    """A KRaft cluster id: 16 random bytes, URL-safe base64 without padding (Kafka's ``Uuid``),
    never starting with "-" (a command-line parser takes that for an option; Kafka's own
    ``Uuid.randomUuid`` skips such ids for the same reason)."""
    while True:
        cluster_id = base64.urlsafe_b64encode(uuid.uuid4().bytes).rstrip(b"=").decode()
        if not cluster_id.startswith("-"):
            return cluster_id


def server_properties(*, broker_port: int, controller_port: int, log_dir: str | os.PathLike[str],
                      node_id: int = 1, extra: dict[str, str] | None = None) -> str:
    """server.properties of a one-node KRaft cluster in combined mode, on loopback only.

    The controller quorum is static (``controller.quorum.voters``), so the log
    directory is formatted with a cluster id and no ``--standalone``/``--initial-controllers``.
    Internal topics get replication factor 1 and ``min.insync.replicas`` 1: with a
    single broker, ``acks=all`` means "written by the leader" as in our single broker.
    """
    if broker_port == controller_port:
        raise ValueError(f"broker and controller need two ports, both are {broker_port}")
    props = {
        "process.roles": "broker,controller",
        "node.id": str(node_id),
        "controller.quorum.voters": f"{node_id}@127.0.0.1:{controller_port}",
        "listeners": f"PLAINTEXT://127.0.0.1:{broker_port},CONTROLLER://127.0.0.1:{controller_port}",
        "advertised.listeners": f"PLAINTEXT://127.0.0.1:{broker_port}",
        "controller.listener.names": "CONTROLLER",
        "inter.broker.listener.name": "PLAINTEXT",
        "listener.security.protocol.map": "PLAINTEXT:PLAINTEXT,CONTROLLER:PLAINTEXT",
        "log.dirs": os.fspath(log_dir),
        "num.partitions": "1",
        "auto.create.topics.enable": "false",
        "offsets.topic.replication.factor": "1",
        "offsets.topic.num.partitions": "1",
        "transaction.state.log.replication.factor": "1",
        "transaction.state.log.min.isr": "1",
        "share.coordinator.state.topic.replication.factor": "1",
        "share.coordinator.state.topic.min.isr": "1",
        "min.insync.replicas": "1",
        "group.initial.rebalance.delay.ms": "0",
        "delete.topic.enable": "true",
    }
    props.update(extra or {})
    return "".join(f"{k}={v}\n" for k, v in props.items())


# Asks for SIGKILL when this process dies (Linux), then execs the command: no broker outlives a
# kill -9. A shim, not preexec_fn: Python run in a fork of a process whose gRPC threads are busy
# can be aborted by gRPC's fork handlers before exec.
_DIE_WITH_PARENT_THEN_EXEC = (
    "import ctypes, os, signal, sys\n"
    "try:\n"
    f"    ctypes.CDLL(None, use_errno=True).prctl({_PR_SET_PDEATHSIG}, signal.SIGKILL)\n"
    "except (OSError, AttributeError):\n"
    "    pass\n"
    "os.execvp(sys.argv[1], sys.argv[1:])\n")


def _dying_with_parent(cmd: list[str]) -> list[str]:
    return [sys.executable, "-c", _DIE_WITH_PARENT_THEN_EXEC, *cmd]


def _exit_on_sigterm(signum: int, frame: object) -> None:
    raise SystemExit(128 + signum)


def _stop_cleanly_on_sigterm() -> None:
    """Make SIGTERM (``timeout``, a killed ``make``) unwind this interpreter's ``with`` blocks, so
    the broker is stopped and its directory deleted, rather than end it on the spot (Python's
    default). Only from the main thread and only over the default disposition."""
    if threading.current_thread() is threading.main_thread() and \
            signal.getsignal(signal.SIGTERM) is signal.SIG_DFL:
        signal.signal(signal.SIGTERM, _exit_on_sigterm)


class KafkaServer:
    """A single-node Kafka broker in a child JVM, in a temporary directory deleted on stop.

    ``with KafkaServer() as kafka: kafka.bootstrap`` — see the module docstring.
    """

    def __init__(self, *, jars_dir: Path | None = None, heap: str = "1g",
                 start_timeout_s: float = 120.0, extra_properties: dict[str, str] | None = None) -> None:
        self._jars_dir = jars_dir
        self._heap = heap
        self._start_timeout_s = start_timeout_s
        self._extra = extra_properties or {}
        self._process: subprocess.Popen[bytes] | None = None
        self._dir: str | None = None
        self.bootstrap = ""
        self.jars: Path | None = None

    @property
    def pid(self) -> int | None:
        return self._process.pid if self._process else None

    @property
    def classpath(self) -> str:
        assert self.jars is not None, "not started"
        return str(self.jars / "*")

    def java_command(self, main_class: str, *args: str, heap: str | None = None) -> list[str]:
        """``java`` running ``main_class`` of Kafka's jars, with this broker's Log4j settings."""
        java = shutil.which("java")
        if java is None:
            raise KafkaUnavailable("no `java` on PATH (Kafka 4 needs Java 17 or newer)")
        assert self._dir is not None, "not started"
        return [java, f"-Xmx{heap or self._heap}", "-XX:+UseG1GC", "-Djava.awt.headless=true",
                f"-Dlog4j2.configurationFile={self._dir}/log4j2.properties",
                "-cp", self.classpath, main_class, *args]

    def start(self) -> KafkaServer:
        _stop_cleanly_on_sigterm()
        self.jars = resolve_jars(self._jars_dir)
        self._dir = tempfile.mkdtemp(prefix="logstore-bench-kafka-")
        try:
            self._start()
        except BaseException:
            self.stop()
            raise
        return self

    def _start(self) -> None:
        assert self._dir is not None
        broker_port = free_port()
        controller_port = free_port()
        while controller_port == broker_port:
            controller_port = free_port()
        config = Path(self._dir) / "server.properties"
        config.write_text(server_properties(broker_port=broker_port, controller_port=controller_port,
                                            log_dir=f"{self._dir}/data", extra=self._extra))
        (Path(self._dir) / "log4j2.properties").write_text(LOG4J2_PROPERTIES)
        formatted = subprocess.run(
            self.java_command("kafka.tools.StorageTool", "format", f"--cluster-id={new_cluster_id()}",
                              "-c", str(config), heap="256m"),
            capture_output=True, text=True, timeout=120)
        if formatted.returncode != 0:
            raise KafkaUnavailable(f"kafka.tools.StorageTool format failed (exit {formatted.returncode}):"
                                   f"\n{(formatted.stdout + formatted.stderr).strip()[-2000:]}")
        self.bootstrap = f"127.0.0.1:{broker_port}"
        log = open(Path(self._dir) / "kafka.log", "wb")  # noqa: SIM115 (the child owns it)
        try:
            self._process = subprocess.Popen(
                _dying_with_parent(self.java_command("kafka.Kafka", str(config))), stdin=subprocess.DEVNULL,
                stdout=log, stderr=subprocess.STDOUT, start_new_session=True)
        finally:
            log.close()
        self._wait_ready()

    def _log_tail(self, lines: int = 15) -> str:
        try:
            text = (Path(self._dir or "") / "kafka.log").read_text(errors="replace")
        except OSError:
            return "(no kafka.log)"
        return "\n".join(text.strip().splitlines()[-lines:])

    def _admin(self):
        try:
            from confluent_kafka.admin import AdminClient
        except ImportError as e:
            raise KafkaUnavailable("confluent-kafka is not installed (`make bench-kafka` installs the "
                                   "`bench` extra: pip install -e '.[bench]')") from e
        return AdminClient({"bootstrap.servers": self.bootstrap, "log_level": 4})  # no info lines

    def _wait_ready(self) -> None:
        """Until the broker accepts a connection and a topic can be created (controller elected,
        broker registered and unfenced), or :class:`KafkaUnavailable` after the start timeout."""
        deadline = time.monotonic() + self._start_timeout_s
        host, port = self.bootstrap.rsplit(":", 1)
        assert self._process is not None
        while True:
            if self._process.poll() is not None:
                raise KafkaUnavailable(f"the Kafka broker exited with {self._process.returncode} "
                                       f"while starting; its log ends with:\n{self._log_tail()}")
            try:
                with socket.create_connection((host, int(port)), timeout=1):
                    break
            except OSError:
                if time.monotonic() > deadline:
                    raise KafkaUnavailable(f"the Kafka broker did not listen on {self.bootstrap} within "
                                           f"{self._start_timeout_s:.0f} s; log:\n{self._log_tail()}"
                                           ) from None
                time.sleep(0.2)
        admin = self._admin()
        last: BaseException | None = None
        while time.monotonic() < deadline:
            try:
                self.create_topic("logstore-bench-ready", 1, admin=admin)
                self.delete_topic("logstore-bench-ready", admin=admin)
                return
            except Exception as e:  # not ready yet: metadata, broker registration
                last = e
                time.sleep(0.5)
        raise KafkaUnavailable(f"no topic could be created on {self.bootstrap} within "
                               f"{self._start_timeout_s:.0f} s ({last}); log:\n{self._log_tail()}")

    def create_topic(self, name: str, partitions: int, *, admin=None,
                     config: dict[str, str] | None = None) -> None:
        """Create ``name`` and wait until its partitions have leaders known to the admin client."""
        from confluent_kafka.admin import NewTopic

        admin = admin or self._admin()
        futures = admin.create_topics([NewTopic(name, partitions, 1, config=config or {})],
                                      operation_timeout=30, request_timeout=30)
        futures[name].result(timeout=60)
        deadline = time.monotonic() + 30
        while time.monotonic() < deadline:
            topic = admin.list_topics(name, timeout=10).topics.get(name)
            if topic is not None and topic.error is None and len(topic.partitions) == partitions and \
                    all(p.leader >= 0 for p in topic.partitions.values()):
                return
            time.sleep(0.05)
        raise KafkaUnavailable(f"topic {name} was created but its {partitions} partitions have no leader")

    def delete_topic(self, name: str, *, admin=None) -> None:
        admin = admin or self._admin()
        admin.delete_topics([name], operation_timeout=30, request_timeout=30)[name].result(timeout=60)

    def stop(self) -> None:
        """SIGTERM (a controlled shutdown), SIGKILL after 30 s; then delete the directory. Idempotent."""
        process, self._process = self._process, None
        if process is not None and process.poll() is None:
            with contextlib.suppress(ProcessLookupError):
                process.send_signal(signal.SIGTERM)
            try:
                process.wait(timeout=30)
            except subprocess.TimeoutExpired:
                process.kill()
                process.wait(timeout=30)
        if self._dir is not None:
            shutil.rmtree(self._dir, ignore_errors=True)
            self._dir = None

    def __enter__(self) -> KafkaServer:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()


@contextlib.contextmanager
def maybe_kafka(enabled: bool, **kwargs: object) -> Iterator[KafkaServer | None]:
    """The running Kafka server when ``enabled`` and it can start; else ``None``, saying why."""
    if not enabled:
        yield None
        return
    try:
        import confluent_kafka
    except ImportError:
        print("Kafka side skipped: confluent-kafka is not installed (`make bench-kafka` installs the "
              "`bench` extra)", flush=True)
        yield None
        return
    server = KafkaServer(**kwargs)  # type: ignore[arg-type]
    t0 = time.perf_counter()
    try:
        server.start()
    except KafkaUnavailable as e:
        print(f"Kafka side skipped: {e}", flush=True)
        yield None
        return
    print(f"Apache Kafka {KAFKA_VERSION} (KRaft, one node, java pid {server.pid}) on {server.bootstrap}, "
          f"started in {time.perf_counter() - t0:.1f}s; client confluent-kafka "
          f"{confluent_kafka.__version__} (librdkafka {confluent_kafka.libversion()[0]})", flush=True)
    try:
        yield server
    finally:
        server.stop()


def main(argv: list[str] | None = None) -> int:
    """``python benchmarks/kafka_server.py``: start Kafka, print its bootstrap, stop it on Ctrl-C
    (``--resolve``: only fill the jar cache, as ``make kafka-jars`` does)."""
    parser = argparse.ArgumentParser(description=main.__doc__)
    parser.add_argument("--resolve", action="store_true", help="resolve the jars into the cache and exit")
    args = parser.parse_args(argv)
    if args.resolve:
        try:
            print(f"Kafka {KAFKA_VERSION} jars in {resolve_jars()}", flush=True)
        except KafkaUnavailable as e:
            print(f"Kafka's jars cannot be resolved: {e}", file=sys.stderr)
            return 1
        return 0
    try:
        with KafkaServer() as server:
            print(f"Kafka {KAFKA_VERSION} on {server.bootstrap} (pid {server.pid}); Ctrl-C stops it",
                  flush=True)
            while True:
                time.sleep(3600)
    except KafkaUnavailable as e:
        print(f"Kafka cannot start: {e}", file=sys.stderr)
        return 1
    except KeyboardInterrupt:
        return 0


if __name__ == "__main__":
    sys.exit(main())
