"""Kafka's habits in the Python clients (issue 13): ``bootstrap_servers=``, bootstrap errors,
``poll()``'s units, and ``py.typed``.

* ``Producer``/``Consumer``/``Admin`` take ``bootstrap_servers=`` (kafka-python's
  name; a string or a list of ``host:port``) as a synonym of their first argument;
* a malformed bootstrap is an :class:`InvalidBootstrapError` (``INVALID_BOOTSTRAP``,
  also a ValueError) raised at construction, before anything is sent;
* ``poll(timeout)`` is in seconds (confluent-kafka), ``timeout_ms=`` keyword-only
  (kafka-python), never both: ``poll(0.5)`` waits half a second, not half a millisecond;
* the package ships ``logstore/py.typed`` (PEP 561), in the source tree and in a built wheel.
"""

from __future__ import annotations

import importlib.resources
import shutil
import subprocess
import sys
import time
import zipfile
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
from broker_helpers import stub_for

from logstore import Admin, Consumer, InvalidBootstrapError, NewTopic, Producer, TopicPartition
from logstore._proto import logstore_pb2 as pb
from logstore.broker.embedded import EmbeddedBroker
from logstore.client.bootstrap import parse_bootstrap, resolve_bootstrap
from logstore.errors import InvalidConfigError
from logstore.record_reader import iter_batches

pytestmark = pytest.mark.timeout(60)

REPO = Path(__file__).resolve().parents[2]


@pytest.fixture(scope="module")
def broker() -> Iterator[EmbeddedBroker]:
    with EmbeddedBroker() as b:
        yield b


# --------------------------------------------------------------------------- bootstrap addresses


@pytest.mark.parametrize("value, first", [
    ("localhost:9392", "localhost:9392"),
    (" localhost:9392 ", "localhost:9392"),
    ("b1:1,b2:65535", "b1:1"),
    (["b1:9392", "b2:9392"], "b1:9392"),
    (("10.0.0.1:9092",), "10.0.0.1:9092"),
    ("[::1]:9392", "[::1]:9392"),
])
def test_good_bootstrap_addresses(value: Any, first: str) -> None:
    assert parse_bootstrap(value) == first


@pytest.mark.parametrize("value, says", [
    ("localhost", "'localhost' has no port: use host:port, e.g. localhost:9392"),
    ("localhost:", "the port '' is not a number in 1..65535"),
    ("localhost:0", "the port '0' is not a number"),
    ("localhost:65536", "the port '65536' is not a number"),
    ("localhost:x1", "the port 'x1' is not a number"),
    (":9392", "has no host"),
    ("grpc://localhost:9392", "has a scheme"),
    ("a:1,,b:2", "an empty address"),
    ("a:1,b", "'b' has no port"),
    ("fe80::1:9392", "IPv6 address in brackets"),
    ("[::1]", "has no port"),
    ([], "bootstrap is empty"),
    (["a:1", 2], "entries must be 'host:port' strings"),
    (b"localhost:9392", "got bytes"),
    (9392, "got int"),
])
def test_bad_bootstrap_addresses(value: Any, says: str) -> None:
    with pytest.raises(InvalidBootstrapError) as raised:
        parse_bootstrap(value)
    assert says in raised.value.message
    assert raised.value.code == "INVALID_BOOTSTRAP"
    assert isinstance(raised.value, ValueError)


@pytest.mark.parametrize("make", [Producer, Consumer, Admin], ids=lambda c: c.__name__)
def test_clients_refuse_a_bootstrap_without_port_at_construction(make: Callable[..., Any]) -> None:
    for kwargs in ({}, {"bootstrap_servers": "localhost"}):
        args = ("localhost",) if not kwargs else ()
        with pytest.raises(InvalidBootstrapError, match="'localhost' has no port"):
            make(*args, **kwargs)
    with pytest.raises(InvalidBootstrapError, match="not both"):
        make("a:1", bootstrap_servers="b:1")


def test_resolve_bootstrap() -> None:
    assert resolve_bootstrap(None, None) is None
    assert resolve_bootstrap("a:1", None) == "a:1"
    assert resolve_bootstrap(None, ["a:1"]) == ["a:1"]
    assert resolve_bootstrap("a:1,b:2", ["a:1", "b:2"]) == ["a:1", "b:2"]  # the same addresses: fine
    with pytest.raises(InvalidBootstrapError):
        resolve_bootstrap("a:1", "a:2")


@pytest.mark.parametrize("shape", ["str", "list", "csv"])
def test_bootstrap_servers_synonym_works_end_to_end(broker: EmbeddedBroker, shape: str) -> None:
    servers: str | list[str] = {"str": broker.bootstrap, "list": [broker.bootstrap],
                                "csv": f"{broker.bootstrap},127.0.0.1:1"}[shape]
    topic = f"bootstrap-servers-{shape}"
    # every entry is kept (a client moves to the next one while one is unreachable)
    expected = servers if isinstance(servers, str) else ",".join(servers)
    with Admin(bootstrap_servers=servers) as admin:
        assert admin.bootstrap == expected
        admin.create_topics([NewTopic(topic, 1)])
    with Producer(bootstrap_servers=servers) as producer:
        assert producer.bootstrap == expected
        producer.send(topic, b"hello").result(timeout=30)
    with Consumer(bootstrap_servers=servers, auto_offset_reset="earliest") as consumer:
        assert consumer.bootstrap == expected
        consumer.assign([TopicPartition(topic, 0)])
        assert [r.value for r in consumer.poll(10.0)] == [b"hello"]


@pytest.mark.parametrize("codec", ["lz4", "zstd"])
def test_kafka_pythons_compression_type_compresses_the_stored_batch(broker: EmbeddedBroker, codec: str) -> None:
    topic = f"compression-type-{codec}"
    with Admin(broker.bootstrap) as admin:
        admin.create_topics([NewTopic(topic, 1)])
    with Producer(broker.bootstrap, compression_type=codec) as producer:
        producer.send(topic, b"v" * 1000, partition=0).result(timeout=30)
    stub = stub_for(broker)
    answer = stub.Fetch(pb.FetchRequest(max_wait_ms=0, partitions=[
        pb.FetchPartition(topic=topic, partition=0, fetch_offset=0)]), timeout=30).partitions[0]
    assert [b.header.compression for b in iter_batches(memoryview(answer.records))] == [codec]


def test_compression_type_names_one_option_and_says_what_arrow_has() -> None:
    with pytest.raises(InvalidConfigError, match="compression or compression_type"):
        Producer("127.0.0.1:1", compression="lz4", compression_type="zstd")
    with pytest.raises(ValueError, match="no gzip or snappy"):
        Producer("127.0.0.1:1", compression_type="gzip")


# --------------------------------------------------------------------------- poll() units


@pytest.fixture
def idle_consumer(broker: EmbeddedBroker) -> Iterator[Consumer]:
    """A consumer of an empty partition: every poll waits its whole timeout."""
    name = f"idle-{time.monotonic_ns()}"
    with Admin(broker.bootstrap) as admin:
        admin.create_topics([NewTopic(name, 1)])
    with Consumer(broker.bootstrap, fetch_max_wait_ms=100) as consumer:
        consumer.assign([TopicPartition(name, 0)])
        consumer.poll(timeout_ms=0)  # positions resolved outside the timed polls
        yield consumer


def _waited(poll: Callable[[], object]) -> float:
    started = time.monotonic()
    assert not poll()
    return time.monotonic() - started


@pytest.mark.parametrize("method", ["poll", "poll_arrow"])
def test_poll_timeout_is_seconds_and_timeout_ms_is_milliseconds(idle_consumer: Consumer, method: str) -> None:
    poll = getattr(idle_consumer, method)
    # The issue: poll(3.0) returned after 3 ms. A positional number is seconds now.
    assert 0.45 <= _waited(lambda: poll(0.5)) < 3.0
    assert 0.45 <= _waited(lambda: poll(timeout=0.5)) < 3.0
    assert 0.45 <= _waited(lambda: poll(timeout_ms=500)) < 3.0
    assert 0.95 <= _waited(lambda: poll(1)) < 3.5  # an int is seconds too
    assert _waited(lambda: poll()) < 0.45  # no timeout: do not wait


@pytest.mark.parametrize("method", ["poll", "poll_arrow"])
def test_poll_refuses_ambiguous_or_bad_timeouts(idle_consumer: Consumer, method: str) -> None:
    poll = getattr(idle_consumer, method)
    with pytest.raises(ValueError, match="not both"):
        poll(1.0, timeout_ms=1000)
    with pytest.raises(ValueError, match="timeout is in seconds"):
        poll(-1)
    with pytest.raises(ValueError, match="timeout is in seconds"):
        poll(True)
    with pytest.raises(ValueError, match="timeout_ms must be an integer"):
        poll(timeout_ms=0.5)
    with pytest.raises(ValueError, match="timeout_ms must be an integer"):
        poll(timeout_ms=-5)
    with pytest.raises(TypeError):
        poll(1.0, 500)  # timeout_ms cannot be given by position


def test_poll_returns_records_as_soon_as_they_arrive_within_seconds(broker: EmbeddedBroker) -> None:
    name = f"poll-soon-{time.monotonic_ns()}"
    with Admin(broker.bootstrap) as admin:
        admin.create_topics([NewTopic(name, 1)])
    with Producer(broker.bootstrap) as producer, Consumer(broker.bootstrap) as consumer:
        consumer.assign([TopicPartition(name, 0)])
        consumer.poll(0)
        producer.send(name, b"x").result(timeout=30)
        started = time.monotonic()
        assert [r.value for r in consumer.poll(20.0)] == [b"x"]
        assert time.monotonic() - started < 10


# --------------------------------------------------------------------------- py.typed


def test_py_typed_is_in_the_package() -> None:
    assert importlib.resources.files("logstore").joinpath("py.typed").is_file()


@pytest.mark.timeout(300)
def test_py_typed_is_in_the_built_wheel(tmp_path: Path) -> None:
    # Build from a copy: an in-tree build would leave build/ and *.egg-info in the checkout.
    src = tmp_path / "src"
    src.mkdir()
    for name in ("pyproject.toml", "README.md"):
        shutil.copy(REPO / name, src / name)
    for package in ("logstore", "spark_source", "spark_sink", "compaction", "replication", "jobs"):
        if (REPO / package).is_dir():
            shutil.copytree(REPO / package, src / package, ignore=shutil.ignore_patterns("__pycache__"))
    out = tmp_path / "dist"
    proc = subprocess.run(
        [sys.executable, "-m", "pip", "wheel", "--no-deps", "--no-build-isolation", "--no-index",
         "-q", "-w", str(out), str(src)],
        capture_output=True, text=True, timeout=280,
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    (wheel,) = out.glob("logstore-*.whl")
    assert "logstore/py.typed" in zipfile.ZipFile(wheel).namelist()
