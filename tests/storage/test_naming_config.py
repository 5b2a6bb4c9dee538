"""Topic names and partition directories (logstore.naming); LogConfig parsing (logstore.storage.config)."""

from __future__ import annotations

import pickle

import pytest

from logstore.errors import InvalidConfigError, InvalidPartitionsError, InvalidTopicError
from logstore.naming import (
    MAX_TOPIC_NAME_LENGTH,
    parse_partition_dir_name,
    partition_dir_name,
    validate_partition,
    validate_topic_name,
)
from logstore.storage.config import LogConfig

# ----------------------------------------------------------------------------- naming


@pytest.mark.parametrize(
    "name",
    ["a", "A-b_c.d", "0", "...", "a..b", "x" * MAX_TOPIC_NAME_LENGTH,
     "abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ0123456789._-"],
)
def test_legal_topic_names(name: str) -> None:
    assert validate_topic_name(name) == name


@pytest.mark.parametrize(
    ("name", "says"),
    [
        ("", "empty"),
        (".", "cannot be"),
        ("..", "cannot be"),
        ("x" * 250, "250 characters"),
        ("a/b", "illegal characters"),
        ("../etc", "illegal characters"),
        ("a\\b", "illegal characters"),
        ("has space", "illegal characters"),
        ("tab\t", "illegal characters"),
        ("new\nline", "illegal characters"),
        ("caf\u00e9", "illegal characters"),
        ("\u65e5\u672c", "illegal characters"),
        ("a\x00b", "illegal characters"),
        ("a:b", "illegal characters"),
        (None, "string"),
        (7, "string"),
    ],
)
def test_illegal_topic_names(name: object, says: str) -> None:
    with pytest.raises(InvalidTopicError) as info:
        validate_topic_name(name)
    assert info.value.code == "INVALID_TOPIC"
    assert says in info.value.message


def test_partition_dir_names_round_trip() -> None:
    assert partition_dir_name("orders", 3) == "orders-3"
    assert parse_partition_dir_name("orders-3") == ("orders", 3)
    # A topic may itself contain '-': the partition is after the last one.
    assert parse_partition_dir_name("my-topic-12") == ("my-topic", 12)
    assert parse_partition_dir_name(partition_dir_name("a-b-c", 0)) == ("a-b-c", 0)
    assert parse_partition_dir_name("orders--1") == ("orders-", 1)


@pytest.mark.parametrize("bad", ["orders", "orders-", "orders-x", "-3", "a/b-1", "a b-1"])
def test_parse_partition_dir_name_rejects_non_partition_dirs(bad: str) -> None:
    with pytest.raises(InvalidTopicError):
        parse_partition_dir_name(bad)


@pytest.mark.parametrize("bad", [-1, True, 1.0, "1", None])
def test_invalid_partitions(bad: object) -> None:
    with pytest.raises(InvalidPartitionsError):
        validate_partition(bad)
    with pytest.raises((InvalidPartitionsError, InvalidTopicError)):
        partition_dir_name("t", bad)  # type: ignore[arg-type]


def test_partition_dir_name_validates_the_topic() -> None:
    with pytest.raises(InvalidTopicError):
        partition_dir_name("../x", 0)


# ----------------------------------------------------------------------------- config


def test_defaults_and_overlay() -> None:
    cfg = LogConfig.from_properties({"segment.bytes": "1024", "retention.ms": -1})
    assert cfg.segment_bytes == 1024
    assert cfg.retention_ms == -1
    assert cfg.retention_bytes == -1
    assert cfg.index_interval_bytes == LogConfig().index_interval_bytes
    again = LogConfig.from_properties({"flush.messages": "5"}, base=cfg)
    assert (again.segment_bytes, again.flush_messages) == (1024, 5)


def test_round_trip_through_properties_and_pickle() -> None:
    cfg = LogConfig.from_properties(
        {"cleanup.policy": "delete, compact", "min.cleanable.dirty.ratio": "0.25"}
    )
    assert cfg.cleanup_policy == "compact,delete"
    assert cfg.compact and cfg.delete
    assert LogConfig.from_properties(cfg.to_properties()) == cfg
    assert set(cfg.to_properties()) == set(LogConfig.property_names())
    assert pickle.loads(pickle.dumps(cfg)) == cfg


@pytest.mark.parametrize(
    ("key", "value"),
    [
        ("segment.bytes", "1023"),
        ("segment.bytes", str(2**31)),
        ("segment.bytes", "big"),
        ("segment.bytes", ""),
        ("segment.ms", "0"),
        ("index.interval.bytes", "-1"),
        ("retention.ms", "-2"),
        ("retention.bytes", "-5"),
        ("retention.bytes", "1.5"),
        ("flush.messages", "0"),
        ("flush.ms", "-1"),
        ("max.message.bytes", "63"),
        ("cleanup.policy", "shred"),
        ("cleanup.policy", ""),
        ("min.cleanable.dirty.ratio", "1.5"),
        ("min.cleanable.dirty.ratio", "nan"),
        ("delete.retention.ms", "-1"),
        ("min.compaction.lag.ms", "x"),
        ("compression.type", "gzip"),
        ("min.insync.replicas", "0"),
        ("message.timestamp.type", "WallClock"),
        ("value.format", "xml"),
        ("value.format", "JSON"),
    ],
)
def test_invalid_values_name_the_key(key: str, value: str) -> None:
    with pytest.raises(InvalidConfigError) as info:
        LogConfig.from_properties({key: value})
    assert info.value.code == "INVALID_CONFIG"
    assert key in info.value.message
    assert repr(value) in info.value.message


def test_unknown_key_is_named() -> None:
    with pytest.raises(InvalidConfigError) as info:
        LogConfig.from_properties({"segment.byte": "1024"})
    assert "'segment.byte'" in info.value.message
    assert "segment.bytes" in info.value.message  # lists the known keys


def test_config_is_frozen() -> None:
    cfg = LogConfig()
    with pytest.raises(AttributeError):
        cfg.segment_bytes = 5  # type: ignore[misc]
