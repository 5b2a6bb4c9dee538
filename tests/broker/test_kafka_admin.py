"""The Kafka listener's admin APIs (logstore.broker.kafka.admin_apis) against real Kafka clients.

confluent-kafka's AdminClient (librdkafka) and Apache Kafka's own Java ``kafka-topics`` and
``kafka-configs`` tools create, grow, configure, trim and delete topics through the Kafka
listener of a real broker; logstore's own Admin, Producer and Consumer check each result
from the other side. No component of ours is mocked.
"""

from __future__ import annotations

import dataclasses
import datetime
import io
import random
import socket
import struct
import subprocess
import sys
import time
import uuid
from collections.abc import Iterator
from typing import Any

import pytest

pytest.importorskip("kio", reason="the Kafka listener needs kio (Python 3.11+)")
ck = pytest.importorskip("confluent_kafka")

from confluent_kafka.admin import (  # noqa: E402
    AdminClient,
    AlterConfigOpType,
    ConfigEntry,
    ConfigResource,
    ConfigSource,
    NewPartitions,
)
from confluent_kafka.admin import NewTopic as KafkaNewTopic  # noqa: E402
from kafka_tools import NO_KAFKA_JARS, kafka_classpath  # noqa: E402
from kio.index import load_request_schema, load_response_schema  # noqa: E402
from kio.serial import entity_reader, entity_writer  # noqa: E402

from logstore import Admin, Consumer, NewTopic, Producer, TopicPartition  # noqa: E402
from logstore.broker.embedded import EmbeddedBroker  # noqa: E402
from logstore.broker.kafka.admin_apis import ADMIN_APIS  # noqa: E402
from logstore.broker.kafka.group_admin_apis import GROUP_ADMIN_APIS  # noqa: E402

pytestmark = pytest.mark.timeout(120)
_CLIENT = {"socket.timeout.ms": 10_000, "reconnect.backoff.max.ms": 500}


@pytest.fixture(scope="module")
def broker() -> Iterator[EmbeddedBroker]:
    with EmbeddedBroker(kafka_listener="127.0.0.1:0", overrides={"num_partitions": 2}) as b:
        yield b


@pytest.fixture(scope="module")
def kafka_admin(broker: EmbeddedBroker) -> AdminClient:
    return AdminClient({"bootstrap.servers": broker.kafka_bootstrap, **_CLIENT})


def _name(prefix: str) -> str:
    return f"{prefix}-{random.randrange(1 << 30)}"


def _outcomes(futures: dict[Any, Any]) -> dict[Any, Any]:
    """Each future's result, or the KafkaError it failed with."""
    out = {}
    for key, future in futures.items():
        try:
            out[key] = future.result(timeout=30)
        except ck.KafkaException as e:
            out[key] = e.args[0]
    return out


def _code(outcome: Any) -> int:
    assert isinstance(outcome, ck.KafkaError), outcome
    return int(outcome.code())


def test_create_topics_makes_logstore_topics(broker: EmbeddedBroker, kafka_admin: AdminClient) -> None:
    plain, compacted, default, checked = (_name(p) for p in ("plain", "compacted", "default", "checked"))
    done = _outcomes(kafka_admin.create_topics([
        KafkaNewTopic(plain, num_partitions=3, replication_factor=1),
        KafkaNewTopic(compacted, num_partitions=1, config={"cleanup.policy": "compact", "retention.ms": "60000"}),
        KafkaNewTopic(default),  # -1 partitions, -1 replication factor: the broker's defaults
    ]))
    assert done == {plain: None, compacted: None, default: None}
    assert _outcomes(kafka_admin.create_topics([KafkaNewTopic(checked, 4)], validate_only=True)) == {checked: None}
    with Admin(broker.bootstrap) as admin:
        described = admin.describe_topics([plain, compacted, default])
        configs = admin.describe_configs([compacted])[compacted]
        assert checked not in admin.list_topics()  # validate_only created nothing
    assert {n: len(t.partitions) for n, t in described.items()} == {plain: 3, compacted: 1, default: 2}
    assert (configs["cleanup.policy"], configs["retention.ms"]) == ("compact", "60000")

    refused = _outcomes(kafka_admin.create_topics([
        KafkaNewTopic(plain, 1),  # exists
        KafkaNewTopic("__internal-" + plain, 1),
        KafkaNewTopic(_name("rf3"), 1, replication_factor=3),
        KafkaNewTopic(_name("bad-config"), 1, config={"cleanup.policy": "sometimes"}),
        KafkaNewTopic(_name("zero"), 0),
    ]))
    codes = [_code(refused[t]) for t in refused]
    assert codes == [ck.KafkaError.TOPIC_ALREADY_EXISTS, ck.KafkaError.TOPIC_EXCEPTION,
                     ck.KafkaError.INVALID_REPLICATION_FACTOR, ck.KafkaError.INVALID_CONFIG,
                     ck.KafkaError.INVALID_PARTITIONS], refused
    assert all(refused[t].str() for t in refused)  # each says why


def test_create_partitions_grows_a_topic(broker: EmbeddedBroker, kafka_admin: AdminClient) -> None:
    topic = _name("grow")
    _outcomes(kafka_admin.create_topics([KafkaNewTopic(topic, 2)]))
    assert _outcomes(kafka_admin.create_partitions([NewPartitions(topic, 5)])) == {topic: None}
    assert _code(_outcomes(kafka_admin.create_partitions([NewPartitions(topic, 3)]))[topic]) == \
        ck.KafkaError.INVALID_PARTITIONS
    with Admin(broker.bootstrap) as admin:
        assert len(admin.describe_topics([topic])[topic].partitions) == 5
    with Producer(broker.bootstrap) as producer:  # the new partitions take records
        assert producer.send(topic, b"v", partition=4).result(timeout=30).offset == 0


def test_describe_and_incrementally_alter_configs(broker: EmbeddedBroker, kafka_admin: AdminClient) -> None:
    topic = _name("configs")
    with Admin(broker.bootstrap) as admin:
        admin.create_topics([NewTopic(topic, 1, configs={"retention.ms": "3600000"})])
    resource = ConfigResource(ConfigResource.Type.TOPIC, topic)
    [described] = _outcomes(kafka_admin.describe_configs([resource])).values()
    assert described["retention.ms"].value == "3600000"
    assert described["retention.ms"].source == ConfigSource.DYNAMIC_TOPIC_CONFIG.value
    assert (described["cleanup.policy"].value, described["cleanup.policy"].source) == (
        "delete", ConfigSource.DEFAULT_CONFIG.value)

    changes = ConfigResource(ConfigResource.Type.TOPIC, topic, incremental_configs=[
        ConfigEntry("cleanup.policy", "compact", incremental_operation=AlterConfigOpType.APPEND),
        ConfigEntry("segment.ms", "600000", incremental_operation=AlterConfigOpType.SET),
        ConfigEntry("retention.ms", None, incremental_operation=AlterConfigOpType.DELETE),
    ])
    assert list(_outcomes(kafka_admin.incremental_alter_configs([changes])).values()) == [None]
    with Admin(broker.bootstrap) as admin:
        configs = admin.describe_configs([topic])[topic]
    assert (configs["cleanup.policy"], configs["segment.ms"], configs["retention.ms"]) == (
        "compact,delete", "600000", "604800000")  # the broker keeps a list config in its order

    subtract = ConfigResource(ConfigResource.Type.TOPIC, topic, incremental_configs=[
        ConfigEntry("cleanup.policy", "delete", incremental_operation=AlterConfigOpType.SUBTRACT)])
    assert list(_outcomes(kafka_admin.incremental_alter_configs([subtract])).values()) == [None]
    with Admin(broker.bootstrap) as admin:
        assert admin.describe_configs([topic])[topic]["cleanup.policy"] == "compact"

    for bad, code in ((ConfigEntry("no.such.config", "1", incremental_operation=AlterConfigOpType.SET),
                       ck.KafkaError.INVALID_CONFIG),
                      (ConfigEntry("segment.ms", "1", incremental_operation=AlterConfigOpType.APPEND),
                       ck.KafkaError.INVALID_CONFIG)):
        wrong = ConfigResource(ConfigResource.Type.TOPIC, topic, incremental_configs=[bad])
        assert _code(list(_outcomes(kafka_admin.incremental_alter_configs([wrong])).values())[0]) == code
    missing = ConfigResource(ConfigResource.Type.TOPIC, _name("missing"))
    assert _code(list(_outcomes(kafka_admin.describe_configs([missing])).values())[0]) == \
        ck.KafkaError.UNKNOWN_TOPIC_OR_PART
    broker_resource = ConfigResource(ConfigResource.Type.BROKER, "0")
    assert _code(list(_outcomes(kafka_admin.describe_configs([broker_resource])).values())[0]) == \
        ck.KafkaError.INVALID_REQUEST


def test_delete_records_moves_the_log_start(broker: EmbeddedBroker, kafka_admin: AdminClient) -> None:
    topic = _name("trim")
    with Admin(broker.bootstrap) as admin:
        admin.create_topics([NewTopic(topic, 1)])
    with Producer(broker.bootstrap) as producer:
        for i in range(10):
            producer.send(topic, str(i).encode(), partition=0)
    [trimmed] = _outcomes(kafka_admin.delete_records([ck.TopicPartition(topic, 0, 4)])).values()
    assert trimmed.low_watermark == 4
    with Consumer(broker.bootstrap, auto_offset_reset="earliest") as consumer:
        consumer.assign([TopicPartition(topic, 0)])
        got = []
        while len(got) < 6:
            got += consumer.poll(timeout_ms=2000)
    assert [r.offset for r in got] == list(range(4, 10))
    [past] = _outcomes(kafka_admin.delete_records([ck.TopicPartition(topic, 0, 11)])).values()
    assert _code(past) == ck.KafkaError.OFFSET_OUT_OF_RANGE


def test_describe_cluster_and_delete_topics(broker: EmbeddedBroker, kafka_admin: AdminClient) -> None:
    cluster = kafka_admin.describe_cluster().result(timeout=30)
    assert [(n.id, n.host, n.port) for n in cluster.nodes] == [(0, "127.0.0.1", broker.kafka_port)]
    assert cluster.controller.id == 0 and cluster.cluster_id
    topic = _name("doomed")
    _outcomes(kafka_admin.create_topics([KafkaNewTopic(topic, 1)]))
    assert _outcomes(kafka_admin.delete_topics([topic])) == {topic: None}
    with Admin(broker.bootstrap) as admin:
        assert topic not in admin.list_topics()
    refused = _outcomes(kafka_admin.delete_topics([topic, "__consumer_offsets"]))
    assert [_code(refused[t]) for t in (topic, "__consumer_offsets")] == [
        ck.KafkaError.UNKNOWN_TOPIC_OR_PART, ck.KafkaError.TOPIC_EXCEPTION]


@pytest.mark.timeout(240)
def test_apache_kafkas_java_topic_and_config_tools(broker: EmbeddedBroker) -> None:
    """Kafka's own command-line tools negotiate the newest versions (CreateTopics v7, ...)."""
    classpath = kafka_classpath()
    if classpath is None:
        pytest.skip(NO_KAFKA_JARS)
    topic = _name("java-admin")

    def tool(main: str, *args: str) -> str:
        done = subprocess.run(["java", "-cp", classpath, main, "--bootstrap-server", broker.kafka_bootstrap, *args],
                              capture_output=True, text=True, timeout=90)
        assert done.returncode == 0, (args, done.stdout[-2000:], done.stderr[-2000:])
        return done.stdout

    topics = "org.apache.kafka.tools.TopicCommand"
    tool(topics, "--create", "--topic", topic, "--partitions", "3", "--config", "cleanup.policy=compact")
    tool("org.apache.kafka.tools.ConfigCommand", "--alter", "--entity-type", "topics", "--entity-name", topic,
         "--add-config", "retention.ms=120000")
    described = tool(topics, "--describe", "--topic", topic)
    assert f"Topic: {topic}" in described and "PartitionCount: 3" in described
    assert "cleanup.policy=compact" in described and "retention.ms=120000" in described
    with Admin(broker.bootstrap) as admin:
        configs = admin.describe_configs([topic])[topic]
        assert (configs["cleanup.policy"], configs["retention.ms"]) == ("compact", "120000")
        assert len(admin.describe_topics([topic])[topic].partitions) == 3
    group = _name("java-group")  # a group that committed offsets: kafka-consumer-groups --describe
    with Producer(broker.bootstrap) as producer:
        for _ in range(5):
            producer.send(topic, b"v", partition=0)
    with Consumer(broker.bootstrap, group_id=group) as consumer:
        consumer.commit({TopicPartition(topic, 0): 3})
    lines = tool("org.apache.kafka.tools.consumer.group.ConsumerGroupCommand", "--describe", "--group", group)
    [row] = [line.split() for line in lines.splitlines() if line.startswith(group)]
    assert row[1:6] == [topic, "0", "3", "5", "2"]  # topic, partition, current offset, log end, lag


# ---------------------------------------------------------------------------- every version


def _entity(module: Any, entity_name: str, **fields: Any) -> Any:
    """``module.entity_name`` from those of ``fields`` its version has."""
    entity = getattr(module, entity_name)
    return entity(**{f.name: fields[f.name] for f in dataclasses.fields(entity) if f.name in fields})


def _sweep_request(api_key: int, version: int) -> Any:
    """A request of ``api_key`` at ``version`` about a topic that does not exist (or the cluster)."""
    request_type: Any = load_request_schema(api_key, version)
    m = sys.modules[request_type.__module__]
    timeout = datetime.timedelta(seconds=10)
    if api_key == 19:
        topic = _entity(m, "CreatableTopic", name="__sweep", num_partitions=1, replication_factor=1,
                        assignments=(), configs=())
        return _entity(m, request_type.__name__, topics=(topic,), timeout=timeout, validate_only=True)
    if api_key == 20:
        return _entity(m, request_type.__name__, topic_names=("missing",), timeout=timeout,
                       topics=(_entity(m, "DeleteTopicState", name="missing", topic_id=uuid.UUID(int=0)),)
                       if hasattr(m, "DeleteTopicState") else ())
    if api_key == 21:
        partition = _entity(m, "DeleteRecordsPartition", partition_index=0, offset=1)
        return _entity(m, request_type.__name__, timeout=timeout,
                       topics=(_entity(m, "DeleteRecordsTopic", name="missing", partitions=(partition,)),))
    if api_key == 32:
        resource = _entity(m, "DescribeConfigsResource", resource_type=2, resource_name="missing",
                           configuration_keys=None)
        return _entity(m, request_type.__name__, resources=(resource,), include_synonyms=False,
                       include_documentation=False)
    if api_key == 37:
        topic = _entity(m, "CreatePartitionsTopic", name="missing", count=2, assignments=None)
        return _entity(m, request_type.__name__, topics=(topic,), timeout=timeout, validate_only=False)
    if api_key == 15:
        return _entity(m, request_type.__name__, groups=("missing",), include_authorized_operations=False)
    if api_key == 16:
        return _entity(m, request_type.__name__, states_filter=("Dead",), types_filter=())
    if api_key == 42:
        return _entity(m, request_type.__name__, groups_names=("missing",))
    if api_key == 44:
        resource = _entity(m, "AlterConfigsResource", resource_type=2, resource_name="missing", configs=())
        return _entity(m, request_type.__name__, resources=(resource,), validate_only=False)
    assert api_key == 60
    return _entity(m, request_type.__name__, include_cluster_authorized_operations=False, endpoint_type=1)


def _error_codes(response: Any) -> list[int]:
    """Every ``error_code`` in ``response``, depth first."""
    codes = [int(response.error_code)] if hasattr(response, "error_code") else []
    for f in dataclasses.fields(response):
        value = getattr(response, f.name)
        for item in value if isinstance(value, tuple) else ():
            if dataclasses.is_dataclass(item):
                codes += _error_codes(item)
    return codes


@pytest.mark.parametrize(("api_key", "version"), [(k, v) for k, (low, high) in sorted({**ADMIN_APIS,
                                                                                       **GROUP_ADMIN_APIS}.items())
                                                  for v in range(low, high + 1)])
def test_every_admin_api_version_is_answered(broker: EmbeddedBroker, api_key: int, version: int) -> None:
    request = _sweep_request(api_key, version)
    header_type: Any = type(request).__header_schema__
    buffer = io.BytesIO()
    entity_writer(header_type)(buffer, header_type(request_api_key=api_key, request_api_version=version,
                                                   correlation_id=api_key, client_id="sweep"))
    entity_writer(type(request))(buffer, request)
    with socket.create_connection(("127.0.0.1", broker.kafka_port), timeout=10) as sock:
        sock.sendall(struct.pack(">i", buffer.tell()) + buffer.getvalue())
        size = struct.unpack(">i", sock.recv(4, socket.MSG_WAITALL))[0]
        frame = sock.recv(size, socket.MSG_WAITALL)
    response_type: Any = load_response_schema(api_key, version)
    assert struct.unpack_from(">i", frame)[0] == api_key  # the correlation id
    response, _ = entity_reader(response_type)(frame, 5 if response_type.__header_schema__.__flexible__ else 4)
    expected = {15: [0], 16: [0], 19: [17], 20: [3], 21: [3], 32: [3], 37: [3], 42: [69], 44: [3], 60: [0]}[api_key]
    # NONE (an unknown group is "Dead"; no group is), INVALID_TOPIC_EXCEPTION, UNKNOWN_TOPIC_OR_PARTITION,
    # GROUP_ID_NOT_FOUND
    assert _error_codes(response) == expected
    if api_key == 15:
        assert [(g.group_id, g.group_state) for g in response.groups] == [("missing", "Dead")]


# ---------------------------------------------------------------------------- groups


def test_list_describe_and_delete_groups(broker: EmbeddedBroker, kafka_admin: AdminClient) -> None:
    topic, group = _name("grouped"), _name("group")
    with Admin(broker.bootstrap) as admin:
        admin.create_topics([NewTopic(topic, 2)])
    with Producer(broker.bootstrap) as producer:
        producer.send(topic, b"v", partition=0).result(timeout=30)
    with Consumer(broker.bootstrap, group_id=group, client_id="ours") as member:
        member.subscribe([topic])
        deadline = time.monotonic() + 30
        while len(member.assignment()) < 2 and time.monotonic() < deadline:
            member.poll(timeout_ms=200)
        member.commit()
        listed = {g.group_id: g for g in kafka_admin.list_consumer_groups().result(timeout=30).valid}
        assert listed[group].state == ck.ConsumerGroupState.STABLE
        [described] = _outcomes(kafka_admin.describe_consumer_groups([group])).values()
        assert (described.group_id, described.state, described.partition_assignor) == (
            group, ck.ConsumerGroupState.STABLE, "uniform")
        [m] = described.members
        assert m.client_id == "ours"
        assert sorted((tp.topic, tp.partition) for tp in m.assignment.topic_partitions) == [(topic, 0), (topic, 1)]
        busy = _outcomes(kafka_admin.delete_consumer_groups([group]))[group]
        assert _code(busy) == ck.KafkaError.NON_EMPTY_GROUP
    deadline = time.monotonic() + 30  # the member left when it closed
    while time.monotonic() < deadline and kafka_admin.list_consumer_groups(
            states={ck.ConsumerGroupState.EMPTY}).result(timeout=30).valid == []:
        time.sleep(0.2)
    empty = [g.group_id for g in kafka_admin.list_consumer_groups(
        states={ck.ConsumerGroupState.EMPTY}).result(timeout=30).valid]
    assert group in empty
    assert _outcomes(kafka_admin.delete_consumer_groups([group])) == {group: None}
    with Admin(broker.bootstrap) as admin:
        assert group not in [g.group_id for g in admin.list_groups()]
    assert _code(_outcomes(kafka_admin.delete_consumer_groups([group]))[group]) == ck.KafkaError.GROUP_ID_NOT_FOUND
