"""The log manager (logstore.storage.log_manager) on its own: topics and partitions under one data
directory, their errors, and what a restart reopens, without a broker around it."""

from __future__ import annotations

import os
import re

import pyarrow as pa
import pytest
from storage_helpers import config, produced, read_all, simple_batch

from logstore.errors import (
    InvalidConfigError,
    InvalidPartitionsError,
    InvalidTopicError,
    LogOfflineError,
    SchemaMismatchError,
    TopicAlreadyExistsError,
    UnknownTopicOrPartitionError,
)
from logstore.record import typed_schema
from logstore.storage.log_manager import MAX_PARTITIONS, LogManager

pytestmark = pytest.mark.timeout(60)

VALUE_SCHEMA = pa.schema([pa.field("id", pa.int64(), nullable=False)])


def started(data_dir, **kwargs) -> LogManager:  # type: ignore[no-untyped-def]
    lm = LogManager(str(data_dir), topic_defaults=config(), **kwargs)
    lm.startup()
    return lm


def restarted(lm: LogManager) -> LogManager:
    lm.shutdown()
    return started(lm.data_dir, max_partitions=lm.max_partitions)


@pytest.fixture
def lm(tmp_path):  # type: ignore[no-untyped-def]
    manager = started(tmp_path)
    yield manager
    manager.shutdown()


def values(lm: LogManager, topic: str, partition: int) -> list[bytes | None]:
    return [r[3] for r in read_all(lm.partition(topic, partition).log)]


def test_a_created_topic_has_its_partitions_here(lm: LogManager) -> None:
    info = lm.create_topic("events", partitions=2, configs={"retention.ms": "5000"}, value_schema=None)
    assert (info.name, info.partitions, info.config.retention_ms, info.replicated) == ("events", 2, 5000, False)
    assert lm.topic("events") == info
    assert [t.name for t in lm.topics()] == ["events"]
    assert [(p.topic, p.partition) for p in lm.partitions_of("events")] == [("events", 0), ("events", 1)]
    assert lm.hosts("events", 1) and not lm.hosts("events", 2) and not lm.hosts("other", 0)
    part = lm.partition("events", 1)
    assert part.log.config.retention_ms == 5000
    assert part.append(*produced(simple_batch(3)), fsync=False)[0] == 0
    assert values(lm, "events", 1) == [b"v0", b"v1", b"v2"]
    assert os.path.isfile(os.path.join(lm.data_dir, "meta", "topics", "events.json"))


def test_unknown_topics_and_partitions_are_named_errors(lm: LogManager) -> None:
    lm.create_topic("events", partitions=2, configs={}, value_schema=None)
    for topic, partition, message in (("events", 2, "has no partition 2 (it has 2)"),
                                      ("events", -1, "has no partition -1"),
                                      ("nope", 0, "'nope' does not exist")):
        with pytest.raises(UnknownTopicOrPartitionError, match=re.escape(message)) as e:
            lm.partition(topic, partition)
        assert e.value.code == "UNKNOWN_TOPIC_OR_PARTITION"
    with pytest.raises(UnknownTopicOrPartitionError):
        lm.topic("nope")
    with pytest.raises(UnknownTopicOrPartitionError):
        lm.delete_topic("nope")


@pytest.mark.parametrize(("name", "partitions", "configs", "error"), [
    ("events", 1, {}, TopicAlreadyExistsError),
    ("bad/name", 1, {}, InvalidTopicError),
    ("", 1, {}, InvalidTopicError),
    ("fresh", 0, {}, InvalidPartitionsError),
    ("fresh", MAX_PARTITIONS + 1, {}, InvalidPartitionsError),
    ("fresh", 1, {"no.such.key": "1"}, InvalidConfigError),
    ("fresh", 1, {"retention.ms": "soon"}, InvalidConfigError),
    ("fresh", 1, {"segment.bytes": "10"}, InvalidConfigError),
])
def test_bad_creations_are_refused_and_leave_nothing(lm: LogManager, name, partitions, configs, error) -> None:  # type: ignore[no-untyped-def]
    lm.create_topic("events", partitions=1, configs={}, value_schema=None)
    before = sorted(os.listdir(lm.data_dir)), sorted(os.listdir(os.path.join(lm.data_dir, "meta", "topics")))
    with pytest.raises(error):
        lm.create_topic(name, partitions=partitions, configs=configs, value_schema=None)
    assert [t.name for t in lm.topics()] == ["events"]
    assert (sorted(os.listdir(lm.data_dir)), sorted(os.listdir(os.path.join(lm.data_dir, "meta", "topics")))) == before


def test_validate_only_checks_and_creates_nothing(lm: LogManager) -> None:
    info = lm.create_topic("events", partitions=3, configs={}, value_schema=None, validate_only=True)
    assert info.partitions == 3
    assert lm.topics() == [] and not lm.hosts("events", 0)
    assert not os.path.exists(os.path.join(lm.data_dir, "events-0"))


def test_the_partition_cap_is_enforced_across_topics(tmp_path) -> None:  # type: ignore[no-untyped-def]
    lm = started(tmp_path, max_partitions=3)
    lm.create_topic("a", partitions=2, configs={}, value_schema=None)
    with pytest.raises(InvalidPartitionsError, match="max_partitions_per_broker=3"):
        lm.create_topic("b", partitions=2, configs={}, value_schema=None)
    with pytest.raises(InvalidPartitionsError, match="max_partitions_per_broker=3"):
        lm.add_partitions("a", 4)
    lm.create_topic("b", partitions=1, configs={}, value_schema=None)
    lm.shutdown()


def test_a_directory_in_the_way_that_is_not_ours_refuses_the_creation(lm: LogManager) -> None:
    os.makedirs(os.path.join(lm.data_dir, "events-1"))
    with pytest.raises(InvalidTopicError, match="not a logstore partition directory"):
        lm.create_topic("events", partitions=2, configs={}, value_schema=None)
    assert os.listdir(os.path.join(lm.data_dir, "events-1")) == []
    assert not os.path.exists(os.path.join(lm.data_dir, "events-0"))


def test_a_restart_reopens_topics_records_and_producer_state(tmp_path) -> None:  # type: ignore[no-untyped-def]
    lm = started(tmp_path)
    info = lm.create_topic("events", partitions=2, configs={"retention.bytes": "9999"}, value_schema=None)
    typed = lm.create_topic("typed", partitions=1, configs={}, value_schema=VALUE_SCHEMA)
    lm.partition("events", 0).append(*produced(simple_batch(3)), fsync=False)
    lm.partition("events", 1).append(*produced(simple_batch(2, tag=b"p"), producer_id=7, producer_epoch=0,
                                               base_sequence=0), fsync=False)
    lm = restarted(lm)
    try:
        assert [t.name for t in lm.topics()] == ["events", "typed"]
        again = lm.topic("events")
        assert (again.topic_id, again.partitions, again.overrides) == (info.topic_id, 2, {"retention.bytes": "9999"})
        assert again.config.retention_bytes == 9999
        assert lm.topic("typed").schema.equals(typed.schema)
        assert values(lm, "events", 0) == [b"v0", b"v1", b"v2"]
        assert values(lm, "events", 1) == [b"p0", b"p1"]
        # The producer's batch is still known: a retry is answered, not appended again.
        part = lm.partition("events", 1)
        assert part.append(*produced(simple_batch(2, tag=b"p"), producer_id=7, producer_epoch=0,
                                     base_sequence=0), fsync=False)[0] == 0
        assert part.log.log_end_offset == 2
        assert lm.producer_id_floor() == (8, [])
    finally:
        lm.shutdown()


def test_deleting_a_topic_removes_its_files_and_frees_its_name(tmp_path) -> None:  # type: ignore[no-untyped-def]
    lm = started(tmp_path)
    old = lm.create_topic("events", partitions=2, configs={}, value_schema=None)
    lm.create_topic("kept", partitions=1, configs={}, value_schema=None)
    lm.partition("events", 0).append(*produced(simple_batch(3)), fsync=True)
    lm.partition("kept", 0).append(*produced(simple_batch(1)), fsync=True)
    lm.delete_topic("events")
    assert [t.name for t in lm.topics()] == ["kept"]
    assert not lm.hosts("events", 0)
    with pytest.raises(UnknownTopicOrPartitionError):
        lm.partition("events", 0)
    assert not any(n.startswith("events") for n in os.listdir(lm.data_dir))
    assert not os.path.exists(os.path.join(lm.data_dir, "meta", "topics", "events.json"))

    new = lm.create_topic("events", partitions=1, configs={}, value_schema=None)
    assert new.topic_id != old.topic_id
    assert lm.partition("events", 0).log.log_end_offset == 0
    lm = restarted(lm)
    try:
        assert [t.name for t in lm.topics()] == ["events", "kept"]
        assert lm.partition("events", 0).log.log_end_offset == 0
        assert values(lm, "kept", 0) == [b"v0"]
    finally:
        lm.shutdown()


def test_add_partitions_grows_only_and_survives_a_restart(tmp_path) -> None:  # type: ignore[no-untyped-def]
    lm = started(tmp_path)
    lm.create_topic("events", partitions=1, configs={}, value_schema=None)
    for count in (1, 0, MAX_PARTITIONS + 1):
        with pytest.raises(InvalidPartitionsError):
            lm.add_partitions("events", count)
    assert lm.add_partitions("events", 3, validate_only=True).partitions == 3
    assert not lm.hosts("events", 1)
    assert lm.add_partitions("events", 3).partitions == 3
    lm.partition("events", 2).append(*produced(simple_batch(1)), fsync=False)
    lm = restarted(lm)
    try:
        assert lm.topic("events").partitions == 3
        assert values(lm, "events", 2) == [b"v0"]
    finally:
        lm.shutdown()


def test_alter_configs_reaches_the_open_logs_and_the_topic_file(tmp_path) -> None:  # type: ignore[no-untyped-def]
    lm = started(tmp_path)
    lm.create_topic("events", partitions=2, configs={"retention.ms": "5000"}, value_schema=None)
    lm.alter_configs("events", set_configs={"retention.bytes": "1234"}, delete_keys=["retention.ms"])
    default_ms = config().retention_ms
    for part in lm.partitions_of("events"):
        assert (part.log.config.retention_bytes, part.log.config.retention_ms) == (1234, default_ms)
    with pytest.raises(InvalidConfigError, match="unknown topic config"):
        lm.alter_configs("events", set_configs={}, delete_keys=["no.such.key"])
    with pytest.raises(InvalidConfigError, match="untyped"):
        lm.alter_configs("events", set_configs={"schema": "id int64"}, delete_keys=[])
    with pytest.raises(InvalidConfigError):
        lm.alter_configs("events", set_configs={"retention.bytes": "lots"}, delete_keys=[])
    assert lm.alter_configs("events", set_configs={"retention.bytes": "1"}, delete_keys=[],
                            validate_only=True).config.retention_bytes == 1
    assert lm.partition("events", 0).log.config.retention_bytes == 1234
    lm = restarted(lm)
    try:
        assert lm.topic("events").overrides == {"retention.bytes": "1234"}
        assert lm.partition("events", 1).log.config.retention_bytes == 1234
    finally:
        lm.shutdown()


def test_replicated_topics_hold_only_the_partitions_ensured_here(tmp_path) -> None:  # type: ignore[no-untyped-def]
    lm = started(tmp_path)
    info = lm.ensure_replicated_topic("r", topic_id="id-1", partitions=3, configs={}, value_schema=None,
                                      replication_factor=3)
    assert info.replicated and info.replication_factor == 3
    assert lm.partitions_of("r") == [] and not lm.hosts("r", 0)
    part = lm.ensure_partition("r", 1)
    assert lm.ensure_partition("r", 1) is part
    assert [p.partition for p in lm.partitions_of("r")] == [1]
    assert not part.is_leader  # a replica is a follower until told otherwise
    with pytest.raises(UnknownTopicOrPartitionError, match="has no partition 3"):
        lm.ensure_partition("r", 3)
    with pytest.raises(UnknownTopicOrPartitionError):
        lm.ensure_partition("nope", 0)
    with pytest.raises(InvalidPartitionsError, match="cluster topic"):
        lm.add_partitions("r", 4)
    lm.ensure_partition("r", 2)
    lm.remove_partition("r", 2)
    lm.remove_partition("r", 0)  # none here: nothing happens
    assert not lm.hosts("r", 2) and not os.path.exists(os.path.join(lm.data_dir, "r-2"))

    lm = restarted(lm)
    try:
        assert [(p.topic, p.partition) for p in lm.all_partitions()] == [("r", 1)]
        # The same topic id again changes nothing; another one is a new incarnation.
        lm.ensure_replicated_topic("r", topic_id="id-1", partitions=3, configs={}, value_schema=None,
                                   replication_factor=3)
        assert lm.hosts("r", 1) and lm.topic("r").topic_id == "id-1"
        lm.ensure_replicated_topic("r", topic_id="id-2", partitions=3, configs={}, value_schema=None,
                                   replication_factor=3)
        assert lm.topic("r").topic_id == "id-2" and not lm.hosts("r", 1)
        assert not os.path.exists(os.path.join(lm.data_dir, "r-1"))
    finally:
        lm.shutdown()


def test_a_damaged_topic_file_keeps_that_topic_offline_and_others_served(tmp_path) -> None:  # type: ignore[no-untyped-def]
    lm = started(tmp_path)
    lm.create_topic("broken", partitions=1, configs={}, value_schema=None)
    lm.create_topic("fine", partitions=1, configs={}, value_schema=None)
    lm.partition("broken", 0).append(*produced(simple_batch(2)), fsync=True)
    lm.partition("fine", 0).append(*produced(simple_batch(1)), fsync=True)
    lm.shutdown()
    path = os.path.join(lm.data_dir, "meta", "topics", "broken.json")
    with open(path, "w") as f:
        f.write("{ not json")

    lm = started(lm.data_dir)
    try:
        for call in (lambda: lm.topic("broken"), lambda: lm.partition("broken", 0)):
            with pytest.raises(LogOfflineError, match="broken.json") as e:
                call()
            assert e.value.code == "LOG_OFFLINE" and "--rebuild-metadata" in e.value.message
        with pytest.raises(TopicAlreadyExistsError):
            lm.create_topic("broken", partitions=1, configs={}, value_schema=None)
        assert values(lm, "fine", 0) == [b"v0"]
        assert os.path.isfile(os.path.join(lm.data_dir, "broken-0", "00000000000000000000.arrow"))
    finally:
        lm.shutdown()


def test_high_watermarks_are_checkpointed_only_when_they_change(lm: LogManager) -> None:
    lm.create_topic("events", partitions=1, configs={}, value_schema=None)
    assert lm.checkpoint_high_watermarks()
    assert not lm.checkpoint_high_watermarks()
    lm.partition("events", 0).append(*produced(simple_batch(2)), fsync=True)
    assert lm.checkpoint_high_watermarks()
    assert not lm.checkpoint_high_watermarks()


def test_typed_schemas_evolve_only_by_adding_nullable_value_columns(tmp_path) -> None:  # type: ignore[no-untyped-def]
    lm = started(tmp_path)
    original = lm.create_topic("typed", partitions=1, configs={}, value_schema=VALUE_SCHEMA).schema
    evolved = typed_schema(pa.schema([*VALUE_SCHEMA, pa.field("name", pa.string())]))
    lm.note_schema("typed", evolved)  # a partition accepted batches of the wider schema
    assert lm.topic("typed").schema.equals(evolved)
    with pytest.raises(SchemaMismatchError):  # going back would drop a column
        lm.alter_configs("typed", set_configs={"schema": "id BIGINT NOT NULL"}, delete_keys=[])
    with pytest.raises(SchemaMismatchError):
        lm.note_schema("typed", original)
    lm.alter_configs("typed", set_configs={"schema": "id BIGINT NOT NULL, name STRING, n INT"},
                     delete_keys=[])
    wider = lm.topic("typed").schema
    assert wider.field("value").type.num_fields == 3
    lm = restarted(lm)
    try:
        assert lm.topic("typed").schema.equals(wider)
    finally:
        lm.shutdown()


def test_startup_removes_empty_unfinished_creations_but_never_records(tmp_path) -> None:  # type: ignore[no-untyped-def]
    lm = started(tmp_path)
    lm.create_topic("ghost", partitions=2, configs={}, value_schema=None)  # empty: as if never committed
    lm.create_topic("lost", partitions=1, configs={}, value_schema=None)
    lm.partition("lost", 0).append(*produced(simple_batch(2)), fsync=True)
    lm.shutdown()
    segment = os.path.join(lm.data_dir, "lost-0", "00000000000000000000.arrow")
    size = os.path.getsize(segment)
    for name in ("ghost", "lost"):
        os.remove(os.path.join(lm.data_dir, "meta", "topics", f"{name}.json"))

    lm = started(tmp_path)
    try:
        assert lm.topics() == []
        assert not any(n.startswith("ghost") for n in os.listdir(lm.data_dir))
        with pytest.raises(LogOfflineError, match="lost.json is missing"):
            lm.partition("lost", 0)
        assert os.path.getsize(segment) == size
        with pytest.raises(TopicAlreadyExistsError):
            lm.create_topic("lost", partitions=1, configs={}, value_schema=None)
        lm.create_topic("ghost", partitions=1, configs={}, value_schema=None)
    finally:
        lm.shutdown()
