"""The broker's /metrics and gRPC health service, scraped from a real EmbeddedBroker.

Every number is checked against what the test did: records and bytes produced
(raw gRPC, so the bytes are known exactly), fetched, refused; offsets; a
group's committed offset; an open transaction. No mocks: the scrape is an HTTP
GET of prometheus_client's server, parsed with prometheus_client's parser.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import random
import socket
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Callable, Iterator
from pathlib import Path

import grpc
import pytest
from etcd_helpers import cluster_id, etcd  # noqa: F401 - fixtures
from grpc_health.v1 import health_pb2, health_pb2_grpc
from metrics_helpers import free_port, scrape
from security_helpers import make_certificates

from logstore import Admin, Consumer, NewTopic, Producer, TopicPartition
from logstore._proto import logstore_pb2 as pb
from logstore._proto import logstore_pb2_grpc as pb_grpc
from logstore.broker.config import load_broker_config
from logstore.broker.embedded import EmbeddedBroker
from logstore.broker.service import Broker
from logstore.dev.etcd_process import EtcdServer
from logstore.record import build_batch, encode_batch, encode_schema, untyped_schema
from spark_source import offsets_behind_latest

SCHEMA = untyped_schema()
# logstore's gauge -> the name Kafka's JMX exporter gives the same value.
KAFKA_NAMES = {"logstore_under_replicated_partitions": "kafka_server_replicamanager_underreplicatedpartitions",
               "logstore_is_controller": "kafka_controller_kafkacontroller_activecontrollercount"}


def tp(topic: str, partition: int) -> tuple[tuple[str, str], ...]:
    return (("partition", str(partition)), ("topic", topic))


def records(values: list[bytes]) -> bytes:
    batch = build_batch(SCHEMA, values=values, timestamps_ms=[1_000 + i for i in range(len(values))],
                        keys=[None] * len(values))
    return encode_schema(SCHEMA) + encode_batch(batch, base_offset=0).to_bytes()


@pytest.fixture(scope="module")
def broker() -> Iterator[EmbeddedBroker]:
    with EmbeddedBroker(overrides={"metrics_port": free_port()}) as b:
        yield b


@pytest.fixture(scope="module")
def stub(broker: EmbeddedBroker) -> pb_grpc.LogstoreStub:
    return pb_grpc.LogstoreStub(grpc.insecure_channel(broker.bootstrap))


def metrics_port(broker: EmbeddedBroker) -> int:
    return int(broker.overrides["metrics_port"])


def create(stub: pb_grpc.LogstoreStub, partitions: int = 2) -> str:
    name = f"m-{random.randrange(1 << 30)}"
    resp = stub.CreateTopics(pb.CreateTopicsRequest(topics=[pb.NewTopic(name=name, partitions=partitions)]),
                             timeout=30)
    assert not resp.results[0].error.code, resp.results[0].error
    return name


@pytest.mark.timeout(120)
def test_streamed_produces_are_counted_as_unary_ones(broker: EmbeddedBroker, stub: pb_grpc.LogstoreStub) -> None:
    topic = create(stub)
    before = scrape(metrics_port(broker))
    requests = [pb.ProduceRequest(acks=1, correlation_id=n, partitions=[
        pb.ProducePartition(topic=topic, partition=partition, records=records([b"x"]))])
        for n, partition in ((1, 0), (2, 1), (3, 9))]
    requests.append(pb.ProduceRequest(acks=5, correlation_id=4, partitions=requests[0].partitions))
    answers = {a.correlation_id: a for a in stub.ProduceStream(iter(requests), timeout=30)}
    assert [answers[n].partitions[0].error.code for n in (1, 2, 3)] == ["", "", "UNKNOWN_TOPIC_OR_PARTITION"]
    assert answers[4].error.code == "INVALID_REQUEST" and not answers[4].partitions
    m = scrape(metrics_port(broker))

    def delta(name: str, labels: tuple[tuple[str, str], ...]) -> float:
        return m.get((name, labels), 0.0) - before.get((name, labels), 0.0)

    assert delta("logstore_request_latency_seconds_count", (("rpc", "Produce"),)) == 4
    assert delta("logstore_request_errors_total",
                 (("code", "UNKNOWN_TOPIC_OR_PARTITION"), ("rpc", "Produce"))) == 1
    assert delta("logstore_request_errors_total", (("code", "INVALID_REQUEST"), ("rpc", "Produce"))) == 1
    assert m[("logstore_produce_records_in_total", tp(topic, 0))] == 1
    assert m[("logstore_produce_records_in_total", tp(topic, 1))] == 1


@pytest.mark.timeout(120)
def test_produce_fetch_and_errors_are_counted_exactly(broker: EmbeddedBroker, stub: pb_grpc.LogstoreStub) -> None:
    topic = create(stub)
    before = scrape(metrics_port(broker))
    sent = [records([b"a", b"b", b"c"]), records([b"d"]), records([b"e", b"f"])]
    for data in sent:
        r = stub.Produce(pb.ProduceRequest(acks=-1, partitions=[
            pb.ProducePartition(topic=topic, partition=1, records=data)]), timeout=30).partitions[0]
        assert not r.error.code
    # A fetch from offset 1 to the end: 5 offsets, the records of the batches that hold them.
    fetched = stub.Fetch(pb.FetchRequest(max_wait_ms=0, partitions=[
        pb.FetchPartition(topic=topic, partition=1, fetch_offset=1)]), timeout=30).partitions[0]
    assert fetched.next_offset == 6
    # Failures: a partition that does not exist (in a produce and a fetch) and a request-level one.
    bad = stub.Produce(pb.ProduceRequest(acks=-1, partitions=[
        pb.ProducePartition(topic=topic, partition=7, records=sent[1])]), timeout=30).partitions[0]
    assert bad.error.code == "UNKNOWN_TOPIC_OR_PARTITION"
    stub.Fetch(pb.FetchRequest(max_wait_ms=0, partitions=[
        pb.FetchPartition(topic=f"{topic}-missing", partition=0, fetch_offset=0)]), timeout=30)
    with pytest.raises(grpc.RpcError):
        stub.Produce(pb.ProduceRequest(acks=5, partitions=[
            pb.ProducePartition(topic=topic, partition=1, records=sent[1])]), timeout=30)

    m = scrape(metrics_port(broker))
    key = tp(topic, 1)
    assert m[("logstore_produce_records_in_total", key)] == 6
    assert m[("logstore_produce_bytes_in_total", key)] == sum(len(d) for d in sent)
    assert m[("logstore_fetch_bytes_out_total", key)] == len(fetched.records)
    assert m[("logstore_fetch_records_out_total", key)] == 5
    assert ("logstore_produce_records_in_total", tp(topic, 0)) not in m  # nothing produced there
    assert m[("logstore_log_end_offset", key)] == 6
    assert m[("logstore_high_watermark", key)] == 6
    assert m[("logstore_log_start_offset", key)] == 0
    assert m[("logstore_log_end_offset", tp(topic, 0))] == 0
    assert m[("logstore_log_size_bytes", key)] > m[("logstore_log_size_bytes", tp(topic, 0))]

    def delta(name: str, labels: tuple[tuple[str, str], ...]) -> float:
        return m.get((name, labels), 0.0) - before.get((name, labels), 0.0)

    # Four produce requests (three good, one with a bad partition) plus the refused one.
    assert delta("logstore_request_latency_seconds_count", (("rpc", "Produce"),)) == 5
    assert delta("logstore_request_latency_seconds_count", (("rpc", "Fetch"),)) == 2
    assert delta("logstore_request_errors_total",
                 (("code", "UNKNOWN_TOPIC_OR_PARTITION"), ("rpc", "Produce"))) == 1
    assert delta("logstore_request_errors_total",
                 (("code", "UNKNOWN_TOPIC_OR_PARTITION"), ("rpc", "Fetch"))) == 1
    assert delta("logstore_request_errors_total", (("code", "INVALID_REQUEST"), ("rpc", "Produce"))) == 1
    assert m[("logstore_offline_partitions", ())] == 0
    assert m[("logstore_under_replicated_partitions", ())] == 0
    assert m[("logstore_is_controller", ())] == 1  # its own controller: a controller-count alert sums to 1


@pytest.mark.timeout(120)
def test_every_rpc_is_timed_and_kafka_dashboards_find_their_names(
        broker: EmbeddedBroker, stub: pb_grpc.LogstoreStub) -> None:
    """Kafka's JMX exporter names carry the same values as the logstore_* series; the request
    time covers every RPC (not only Produce and Fetch), named as Kafka names requests."""
    topic = create(stub)
    before = scrape(metrics_port(broker))
    sent = [records([b"a", b"b"]), records([b"c"])]
    for data in sent:
        stub.Produce(pb.ProduceRequest(acks=-1, partitions=[
            pb.ProducePartition(topic=topic, partition=0, records=data)]), timeout=30)
    fetched = stub.Fetch(pb.FetchRequest(max_wait_ms=0, partitions=[
        pb.FetchPartition(topic=topic, partition=0, fetch_offset=0)]), timeout=30).partitions[0]
    with contextlib.suppress(grpc.RpcError):  # a replica's fetch (answered or refused): FetchFollower
        stub.Fetch(pb.FetchRequest(max_wait_ms=0, replica_id=9, partitions=[
            pb.FetchPartition(topic=topic, partition=0, fetch_offset=0)]), timeout=30)
    for _ in range(3):
        stub.Metadata(pb.MetadataRequest(topics=[topic]), timeout=30)
    stub.ListOffsets(pb.ListOffsetsRequest(partitions=[
        pb.ListOffsetsPartition(topic=topic, partition=0, timestamp=-1)]), timeout=30)
    with pytest.raises(grpc.RpcError):  # refused on a single broker: still a timed request
        stub.OffsetsForLeaderEpoch(pb.OffsetsForLeaderEpochRequest(), timeout=30)
    stub.ListGroups(pb.ListGroupsRequest(), timeout=30)
    m = scrape(metrics_port(broker))

    def delta(name: str, labels: tuple[tuple[str, str], ...]) -> float:
        return m.get((name, labels), 0.0) - before.get((name, labels), 0.0)

    for rpc, kafka_name, calls in (("Produce", "Produce", 2), ("Fetch", "FetchConsumer", 1),
                                   ("FetchFollower", "FetchFollower", 1),
                                   ("Metadata", "Metadata", 3), ("ListOffsets", "ListOffsets", 1),
                                   ("OffsetsForLeaderEpoch", "OffsetForLeaderEpoch", 1),
                                   ("ListGroups", "ListGroups", 1), ("CreateTopics", "CreateTopics", 0)):
        assert delta("logstore_request_latency_seconds_count", (("rpc", rpc),)) == calls, rpc
        kafka = (("request", kafka_name),)
        assert m[("kafka_network_requestmetrics_totaltimems_count", kafka)] == \
            m[("logstore_request_latency_seconds_count", (("rpc", rpc),))], rpc
        assert m[("kafka_network_requestmetrics_totaltimems_sum", kafka)] == pytest.approx(
            1000 * m[("logstore_request_latency_seconds_sum", (("rpc", rpc),))]), rpc
        assert m[("kafka_network_requestmetrics_totaltimems_bucket", (("le", "5.0"), *kafka))] == \
            m[("logstore_request_latency_seconds_bucket", (("le", "0.005"), ("rpc", rpc)))], rpc
        assert m[("kafka_network_requestmetrics_totaltimems_bucket", (("le", "+Inf"), *kafka))] == \
            m[("kafka_network_requestmetrics_totaltimems_count", kafka)], rpc

    topic_label = (("topic", topic),)
    assert m[("kafka_server_brokertopicmetrics_messagesin_total", topic_label)] == 3
    assert m[("kafka_server_brokertopicmetrics_bytesin_total", topic_label)] == sum(len(d) for d in sent)
    assert m[("kafka_server_brokertopicmetrics_bytesout_total", topic_label)] == len(fetched.records)
    for kafka_name, ours in (("messagesin", "logstore_produce_records_in_total"),
                             ("bytesin", "logstore_produce_bytes_in_total"),
                             ("bytesout", "logstore_fetch_bytes_out_total")):
        every_topic = sum(v for (name, _), v in m.items() if name == ours)
        assert m[(f"kafka_server_brokertopicmetrics_{kafka_name}_total", ())] == every_topic > 0
    assert m[("kafka_server_replicamanager_underreplicatedpartitions", ())] == 0
    assert m[("kafka_controller_kafkacontroller_activecontrollercount", ())] == 1


@pytest.mark.timeout(120)
def test_group_lag_is_the_high_watermark_minus_the_committed_offset(
    broker: EmbeddedBroker, stub: pb_grpc.LogstoreStub
) -> None:
    topic = create(stub)
    with Producer(broker.bootstrap) as producer:
        for i in range(7):
            producer.send(topic, b"v%d" % i, partition=0)
        producer.flush()
    group = f"lag-{random.randrange(1 << 30)}"
    with Consumer(broker.bootstrap, group_id=group, auto_offset_reset="earliest") as consumer:
        consumer.assign([TopicPartition(topic, 0), TopicPartition(topic, 1)])
        consumer.commit({TopicPartition(topic, 0): 2, TopicPartition(topic, 1): 0})
    m = scrape(metrics_port(broker))
    labels = (("group", group), ("partition", "0"), ("topic", topic))
    assert m[("logstore_group_lag", labels)] == 5
    assert m[("logstore_group_lag", (("group", group), ("partition", "1"), ("topic", topic)))] == 0


@pytest.mark.timeout(120)
def test_open_transactions_count_until_the_commit(broker: EmbeddedBroker, stub: pb_grpc.LogstoreStub) -> None:
    topic = create(stub, 1)
    base = scrape(metrics_port(broker))[("logstore_open_transactions", ())]
    with Producer(broker.bootstrap, transactional_id=f"tx-{random.randrange(1 << 30)}") as producer:
        producer.init_transactions()
        producer.begin_transaction()
        producer.send(topic, b"in a transaction", partition=0).result(timeout=30)
        assert scrape(metrics_port(broker))[("logstore_open_transactions", ())] == base + 1
        producer.commit_transaction()
    assert scrape(metrics_port(broker))[("logstore_open_transactions", ())] == base


@pytest.mark.timeout(60)
def test_metrics_are_off_by_default_and_count_nothing(tmp_path: object) -> None:
    config = load_broker_config(None, overrides={"data_dir": str(tmp_path)}, env={})
    assert config.metrics_port == 0
    assert Broker(config).metrics is None  # no counters on the hot path either
    assert Broker(load_broker_config(None, overrides={"data_dir": str(tmp_path), "metrics_port": 9},
                                     env={})).metrics is not None


# ------------------------------------------------------------------ health


def health_status(address: str, service: str = "") -> int:
    with grpc.insecure_channel(address) as channel:
        stub = health_pb2_grpc.HealthStub(channel)
        return int(stub.Check(health_pb2.HealthCheckRequest(service=service), timeout=10).status)


@pytest.mark.timeout(60)
def test_health_says_serving_once_started(broker: EmbeddedBroker) -> None:
    assert health_status(broker.bootstrap) == health_pb2.HealthCheckResponse.SERVING
    assert health_status(broker.bootstrap, "logstore.v1.Logstore") == health_pb2.HealthCheckResponse.SERVING


@pytest.mark.timeout(120)
def test_health_watch_sees_not_serving_when_the_broker_stops(tmp_path: object) -> None:
    """A Watch opened while serving receives NOT_SERVING as soon as stop() begins."""
    config = load_broker_config(None, overrides={"data_dir": str(tmp_path), "port": 0}, env={})
    seen: list[int] = []
    first = threading.Event()

    def watch(address: str) -> None:
        with grpc.insecure_channel(address) as channel:
            stream = health_pb2_grpc.HealthStub(channel).Watch(health_pb2.HealthCheckRequest(service=""),
                                                                 timeout=60)
            try:
                for answer in stream:
                    seen.append(int(answer.status))
                    first.set()
            except grpc.RpcError:
                pass  # the server closed the stream when it stopped

    async def run() -> None:
        broker = Broker(config)
        port = await broker.start()
        watcher = threading.Thread(target=watch, args=(f"127.0.0.1:{port}",), daemon=True)
        watcher.start()
        assert await asyncio.get_running_loop().run_in_executor(None, first.wait, 30)
        await broker.stop(grace_s=1)
        await asyncio.get_running_loop().run_in_executor(None, watcher.join, 30)

    asyncio.run(run())
    assert seen[0] == health_pb2.HealthCheckResponse.SERVING
    assert health_pb2.HealthCheckResponse.NOT_SERVING in seen[1:]


# ------------------------------------------------------------------ a cluster


@pytest.mark.timeout(240)
def test_cluster_gauges_count_under_replicated_offline_and_the_controller(
    etcd: EtcdServer, cluster_id: str,  # noqa: F811 - the fixtures
) -> None:
    """Three in-process brokers on a real etcd; broker 3 stops. Its partitions' ISRs shrink
    (under-replicated, reported by their leaders), the topic it alone held has no leader
    (offline, reported by the controller), and exactly one broker is the controller. The
    controller's decisions are leader_changed / isr_changed log events."""
    events: list[logging.LogRecord] = []
    handler = logging.Handler(logging.INFO)
    handler.emit = events.append  # type: ignore[method-assign]
    logger = logging.getLogger("replication")
    logger.addHandler(handler)
    logger.setLevel(logging.INFO)
    ports = {i: free_port() for i in (1, 2, 3)}
    brokers = {i: EmbeddedBroker(overrides={
        "metadata": etcd.url, "cluster_id": cluster_id, "node_id": i, "metrics_port": ports[i],
        "broker_session_timeout_ms": 2000, "replica_lag_time_max_ms": 2000,
        "controlled_shutdown_timeout_ms": 5000}) for i in (1, 2, 3)}
    try:
        for b in brokers.values():
            b.start()  # returns once joined: the health service says so
            assert health_status(b.bootstrap) == health_pb2.HealthCheckResponse.SERVING

        def total(name: str, nodes: tuple[int, ...]) -> float:
            scrapes = [scrape(ports[i]) for i in nodes]
            ours = sum(m[(name, ())] for m in scrapes)
            kafka = KAFKA_NAMES.get(name)
            assert kafka is None or sum(m[(kafka, ())] for m in scrapes) == ours, (name, kafka)
            return ours

        def wait_for(what: str, check: Callable[[], bool]) -> None:
            deadline = time.monotonic() + 60
            while not check():
                assert time.monotonic() < deadline, what
                time.sleep(0.2)

        with Admin(brokers[1].bootstrap) as admin:
            wait_for("broker 1 to see the three brokers", lambda: len(admin.describe_cluster().brokers) == 3)
            admin.create_topics([NewTopic("replicated", 3, replication_factor=3),
                                 NewTopic("single", 3, replication_factor=1)])
            placed = admin.describe_topics(["single"])["single"].partitions
        only_on_3 = sum(1 for p in placed if p.replicas == (3,))
        assert only_on_3 >= 1, placed  # placement spreads a topic's partitions over the brokers

        everyone = (1, 2, 3)
        wait_for("one controller, all in sync", lambda: total("logstore_is_controller", everyone) == 1
                 and total("logstore_under_replicated_partitions", everyone) == 0
                 and total("logstore_offline_partitions", everyone) == 0)
        brokers[3].stop()
        rest = (1, 2)
        wait_for("broker 3 out of every ISR", lambda: total("logstore_under_replicated_partitions", rest) == 3)
        wait_for("broker 3's own partitions offline",
                 lambda: total("logstore_offline_partitions", rest) == only_on_3
                 and total("logstore_is_controller", rest) == 1)
        changes = [(r.event, r.topic, r.leader, tuple(r.isr)) for r in events  # type: ignore[attr-defined]
                   if getattr(r, "event", None) in ("leader_changed", "isr_changed")]
        assert {c[1] for c in changes if c[0] == "isr_changed" and 3 not in c[3]} >= {"replicated"}, changes
        assert [c for c in changes if c[:3] == ("leader_changed", "single", -1)], changes
    finally:
        logger.removeHandler(handler)
        for b in brokers.values():
            b.close()


# ------------------------------------------------------------------ Spark source progress


def test_offsets_behind_latest_has_kafkas_names_and_numbers() -> None:
    source = {"endOffset": {"orders": {"0": 10, "1": 25}},
              "latestOffset": '{"orders": {"0": 30, "1": 40, "2": 7}}'}  # "2" not read yet: left out
    assert offsets_behind_latest(source) == {
        "offsetsBehindLatest": "35", "minOffsetsBehindLatest": "15",
        "avgOffsetsBehindLatest": "17.5", "maxOffsetsBehindLatest": "20",
    }
    assert offsets_behind_latest({"endOffset": None, "latestOffset": None}) == {}


@pytest.mark.timeout(600)  # the session's first start (JVM, Delta from Ivy's cache) dominates
def test_a_streaming_query_progress_gives_offsets_behind_latest(spark, broker: EmbeddedBroker,  # type: ignore[no-untyped-def]
                                                               stub: pb_grpc.LogstoreStub) -> None:
    topic = create(stub, 2)
    with Producer(broker.bootstrap) as producer:
        for i in range(40):
            producer.send(topic, b"r%d" % i, partition=i % 2)
        producer.flush()
    query = (spark.readStream.format("logstore").option("logstore.bootstrap.servers", broker.bootstrap)
             .option("subscribe", topic).option("startingOffsets", "earliest")
             .option("maxOffsetsPerTrigger", "10").load()
             .writeStream.format("memory").queryName("behind_latest").outputMode("append")
             .option("checkpointLocation", str(tempfile.mkdtemp())).trigger(availableNow=True).start())
    assert query.awaitTermination(240) and query.exception() is None
    batches = [p["sources"][0] for p in query.recentProgress if p["numInputRows"]]
    assert [offsets_behind_latest(s)["offsetsBehindLatest"] for s in batches] == ["30", "20", "10", "0"]
    assert offsets_behind_latest(batches[0])["maxOffsetsBehindLatest"] == "15"


@pytest.mark.timeout(60)
def test_a_taken_metrics_port_stops_the_start_with_one_clear_error(tmp_path: object) -> None:
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = taken.getsockname()[1]
        broker = EmbeddedBroker(str(tmp_path), overrides={"metrics_port": port})
        with pytest.raises(OSError, match=f"cannot serve metrics on 127.0.0.1:{port} \\(metrics_port\\)"):
            broker.start()
    # The failed start let go of everything: the data directory opens again at once.
    with EmbeddedBroker(str(tmp_path), overrides={"metrics_port": free_port()}) as again:
        assert again.running


@pytest.mark.timeout(120)
def test_a_taken_metrics_or_tls_port_fails_the_start_first_in_one_line(tmp_path: Path) -> None:
    """A taken metrics port, as a taken listener port: found before the logs are recovered or
    created (not after the broker recovered, started its listener and joined its cluster), and
    told in one line, with no raw gRPC line and no "[Errno 98]"; a TLS listener's too."""
    certificates = make_certificates(tmp_path / "tls")
    tls = ["--tls-cert", certificates.server_cert, "--tls-key", certificates.server_key]
    in_use = "the address is in use (another broker, or another program, listens there)"
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = taken.getsockname()[1]
        for name, flags, said in (
                ("metrics", ["--port", "0", "--metrics-port", str(port)],
                 f"cannot serve metrics on 127.0.0.1:{port} (metrics_port): {in_use}"),
                ("metrics-tls", ["--port", "0", "--metrics-port", str(port), *tls],
                 f"cannot serve metrics on 127.0.0.1:{port} (metrics_port): {in_use}"),
                ("listener-tls", ["--port", str(port), *tls], f"cannot listen on 127.0.0.1:{port}: {in_use}")):
            data = tmp_path / name
            result = subprocess.run([sys.executable, "-m", "logstore.broker", "--data-dir", str(data), *flags],
                                    capture_output=True, text=True, timeout=60)
            assert result.returncode != 0
            errors = [line for line in result.stderr.splitlines() if " INFO " not in line]
            assert errors == [f"error: [BROKER_START_FAILED] cannot start the broker: {said}"], result.stderr
            assert not data.exists(), name  # refused before the logs were opened or created
