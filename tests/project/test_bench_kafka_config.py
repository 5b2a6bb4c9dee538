"""benchmarks/kafka_server.py writes a sane one-node KRaft configuration (no Kafka download needed).

The Kafka side of ``make bench-kafka`` is only as trustworthy as the broker it
starts: combined mode, a static one-voter quorum, loopback-only listeners and
replication factor 1 for the internal topics (else a single broker cannot create
``__consumer_offsets`` or commit a transaction). Starting the broker itself needs
Java and Maven Central and is exercised by ``make bench-kafka``, not here.
"""

from __future__ import annotations

import base64
import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "benchmarks"))

import kafka_server  # noqa: E402


def _parse(text: str) -> dict[str, str]:
    pairs = [line.split("=", 1) for line in text.splitlines() if line and not line.startswith("#")]
    assert all(len(p) == 2 for p in pairs), text
    keys = [k for k, _ in pairs]
    assert len(keys) == len(set(keys)), f"duplicate keys in {keys}"
    return dict(pairs)  # type: ignore[arg-type]


def test_server_properties_are_kraft_combined_mode_on_loopback(tmp_path: Path) -> None:
    props = _parse(kafka_server.server_properties(broker_port=19092, controller_port=19093,
                                                  log_dir=tmp_path / "data"))
    assert props["process.roles"] == "broker,controller"
    assert props["node.id"] == "1"
    assert props["controller.quorum.voters"] == "1@127.0.0.1:19093"
    assert props["listeners"] == "PLAINTEXT://127.0.0.1:19092,CONTROLLER://127.0.0.1:19093"
    assert props["advertised.listeners"] == "PLAINTEXT://127.0.0.1:19092"
    assert props["controller.listener.names"] == "CONTROLLER"
    assert props["log.dirs"] == str(tmp_path / "data")
    assert "zookeeper.connect" not in props
    for key in ("offsets.topic.replication.factor", "transaction.state.log.replication.factor",
                "transaction.state.log.min.isr", "min.insync.replicas"):
        assert props[key] == "1", key
    every_host = [v for k, v in props.items() if "listeners" in k or k == "controller.quorum.voters"]
    assert all("127.0.0.1" in v and "0.0.0.0" not in v for v in every_host), every_host


def test_extra_properties_override_and_ports_must_differ(tmp_path: Path) -> None:
    props = _parse(kafka_server.server_properties(broker_port=1, controller_port=2, log_dir=tmp_path,
                                                  extra={"num.partitions": "6", "log.flush.interval.messages": "1"}))
    assert props["num.partitions"] == "6" and props["log.flush.interval.messages"] == "1"
    with pytest.raises(ValueError, match="two ports"):
        kafka_server.server_properties(broker_port=5, controller_port=5, log_dir=tmp_path)


def test_cluster_id_is_a_kafka_uuid() -> None:
    cluster_id = kafka_server.new_cluster_id()
    assert len(cluster_id) == 22 and "=" not in cluster_id
    assert len(base64.urlsafe_b64decode(cluster_id + "==")) == 16
    assert cluster_id != kafka_server.new_cluster_id()
    assert not any(kafka_server.new_cluster_id().startswith("-") for _ in range(2000))


def test_free_ports_are_distinct_and_bindable() -> None:
    import socket

    port = kafka_server.free_port()
    with socket.socket() as s:
        s.bind(("127.0.0.1", port))


def test_without_mvn_or_cache_the_reason_is_named(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("PATH", str(tmp_path))  # no mvn, no java
    with pytest.raises(kafka_server.KafkaUnavailable, match="no `mvn` on PATH"):
        kafka_server.resolve_jars(tmp_path / "jars")
    (tmp_path / "jars").mkdir()
    (tmp_path / "jars" / ".complete").write_text("4.4.0\n")
    assert kafka_server.resolve_jars(tmp_path / "jars") == tmp_path / "jars"


def test_maybe_kafka_skips_with_a_reason_instead_of_failing(tmp_path: Path, capsys: pytest.CaptureFixture[str],
                                                          monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("PATH", str(tmp_path))
    monkeypatch.setenv(kafka_server.ENV_JARS, str(tmp_path / "none"))
    with kafka_server.maybe_kafka(False) as off:
        assert off is None
    with kafka_server.maybe_kafka(True) as skipped:
        assert skipped is None
    assert "Kafka side skipped:" in capsys.readouterr().out
