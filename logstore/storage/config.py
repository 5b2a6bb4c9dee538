"""Per-topic log configuration, named as Kafka names it.

:class:`LogConfig` is the typed, immutable form of a topic's configuration.
It is built from Kafka-style properties (``segment.bytes``, ``retention.ms``,
...) by :meth:`LogConfig.from_properties`, which rejects unknown keys and
out-of-range values with :class:`~logstore.errors.InvalidConfigError` naming
the key. Nothing else in logstore parses raw property strings.

Units are in the names: ``*_ms`` are milliseconds, ``*_bytes`` are bytes.
``-1`` means "unlimited" for ``retention.ms`` and ``retention.bytes``.

Floors: any client may set a topic's configs, so a value that multiplies
files or work per record has a floor (refused below it, naming the key and
the floor): ``segment.ms`` >= :data:`MIN_SEGMENT_MS` (one minute: at most one
new segment per partition per minute from age alone) and ``segment.bytes``
>= :data:`MIN_SEGMENT_BYTES` (small segments are legitimate for small data
and tests; their descriptors are bounded by the broker's file pool, see
:mod:`logstore.storage.file_cache`). ``retention.ms`` and ``retention.bytes``
keep 0 as their floor: small values delete files, they never multiply them.

Thread-safety: instances are frozen.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any

from logstore.errors import InvalidConfigError

__all__ = [
    "LogConfig",
    "CLEANUP_POLICIES",
    "COMPRESSION_TYPES",
    "TIMESTAMP_TYPES",
    "VALUE_FORMATS",
    "check_value_format",
    "MIN_SEGMENT_BYTES",
    "MIN_SEGMENT_MS",
]

LONG_MAX = 2**63 - 1
CLEANUP_POLICIES = ("delete", "compact", "compact,delete")
COMPRESSION_TYPES = ("producer", "none", "lz4", "zstd")
TIMESTAMP_TYPES = ("CreateTime", "LogAppendTime")
# How Kafka producers' values become a typed topic's columns (``value.format``): "none" refuses them.
VALUE_FORMATS = ("none", "json")
VALUE_FORMAT = "value.format"
# Positions in the offset index are u32 and the active segment must stay addressable.
_MAX_SEGMENT_BYTES = 2**31 - 1
MIN_SEGMENT_BYTES = 1024
MIN_SEGMENT_MS = 60_000


@dataclass(frozen=True, slots=True)
class _Key:
    name: str
    attr: str
    parse: Callable[[str], Any]
    check: Callable[[Any], bool]
    rule: str


def _int(text: str) -> int:
    return int(str(text).strip())


def _float(text: str) -> float:
    return float(str(text).strip())


def _policy(text: str) -> str:
    parts = sorted(p.strip() for p in str(text).split(",") if p.strip())
    return ",".join(parts)


def _str(text: str) -> str:
    return str(text).strip()


def _bool(text: str) -> bool:
    value = str(text).strip().lower()
    if value not in ("true", "false"):
        raise ValueError(f"not a boolean: {text!r}")
    return value == "true"


def _text_of(value: Any) -> str:
    """A value as a property string: booleans as Kafka writes them (true/false)."""
    return ("true" if value else "false") if isinstance(value, bool) else str(value)


_KEYS: tuple[_Key, ...] = (
    _Key("segment.bytes", "segment_bytes", _int, lambda v: MIN_SEGMENT_BYTES <= v <= _MAX_SEGMENT_BYTES,
         f"an integer in [{MIN_SEGMENT_BYTES}, {_MAX_SEGMENT_BYTES}] (the floor {MIN_SEGMENT_BYTES} "
         "bounds how many files data can make)"),
    _Key("segment.ms", "segment_ms", _int, lambda v: v >= MIN_SEGMENT_MS,
         f"an integer >= {MIN_SEGMENT_MS} (the floor: smaller values multiply segment files)"),
    _Key("index.interval.bytes", "index_interval_bytes", _int, lambda v: v >= 0,
         "a non-negative integer"),
    _Key("retention.ms", "retention_ms", _int, lambda v: v == -1 or v >= 0,
         "-1 (unlimited) or a non-negative integer"),
    _Key("retention.bytes", "retention_bytes", _int, lambda v: v == -1 or v >= 0,
         "-1 (unlimited) or a non-negative integer"),
    _Key("flush.messages", "flush_messages", _int, lambda v: v >= 1, "a positive integer"),
    _Key("flush.ms", "flush_ms", _int, lambda v: v >= 0, "a non-negative integer"),
    _Key("max.message.bytes", "max_message_bytes", _int, lambda v: 64 <= v <= _MAX_SEGMENT_BYTES,
         f"an integer in [64, {_MAX_SEGMENT_BYTES}]"),
    _Key("cleanup.policy", "cleanup_policy", _policy, lambda v: v in CLEANUP_POLICIES,
         "one of delete, compact, compact,delete"),
    _Key("min.cleanable.dirty.ratio", "min_cleanable_dirty_ratio", _float,
         lambda v: 0.0 <= v <= 1.0, "a number in [0, 1]"),
    _Key("delete.retention.ms", "delete_retention_ms", _int, lambda v: v >= 0,
         "a non-negative integer"),
    _Key("min.compaction.lag.ms", "min_compaction_lag_ms", _int, lambda v: v >= 0,
         "a non-negative integer"),
    _Key("compression.type", "compression_type", _str, lambda v: v in COMPRESSION_TYPES,
         "one of " + ", ".join(COMPRESSION_TYPES)),
    _Key("min.insync.replicas", "min_insync_replicas", _int, lambda v: v >= 1,
         "a positive integer"),
    _Key("message.timestamp.type", "message_timestamp_type", _str,
         lambda v: v in TIMESTAMP_TYPES, "CreateTime or LogAppendTime"),
    _Key("unclean.leader.election.enable", "unclean_leader_election_enable", _bool,
         lambda v: isinstance(v, bool), "true or false"),
    _Key(VALUE_FORMAT, "value_format", _str, lambda v: v in VALUE_FORMATS,
         "json (Kafka producers' values are JSON objects of the topic's columns) or none"),
)
_BY_NAME = {k.name: k for k in _KEYS}


@dataclass(frozen=True, slots=True)
class LogConfig:
    """A topic's configuration. Defaults follow Kafka unless noted."""

    segment_bytes: int = 1 << 30
    segment_ms: int = 7 * 24 * 3600 * 1000
    index_interval_bytes: int = 4096
    retention_ms: int = 7 * 24 * 3600 * 1000
    retention_bytes: int = -1
    flush_messages: int = LONG_MAX
    flush_ms: int = LONG_MAX
    # Kafka's default is ~1 MiB; Arrow batches are larger, so logstore allows 16 MiB.
    max_message_bytes: int = 16 << 20
    cleanup_policy: str = "delete"
    min_cleanable_dirty_ratio: float = 0.5
    delete_retention_ms: int = 24 * 3600 * 1000
    min_compaction_lag_ms: int = 0
    compression_type: str = "producer"
    min_insync_replicas: int = 1
    message_timestamp_type: str = "CreateTime"
    # Replication (a cluster): only an in-sync replica may become leader unless this is true,
    # which trades acknowledged records for availability.
    unclean_leader_election_enable: bool = False
    # A typed topic: how a Kafka producer's value bytes decode into its columns ("none":
    # Kafka producers are refused). logstore's own clients send columns and ignore it.
    value_format: str = "none"

    @classmethod
    def property_names(cls) -> tuple[str, ...]:
        return tuple(k.name for k in _KEYS)

    @classmethod
    def from_properties(
        cls, props: Mapping[str, object], *, base: LogConfig | None = None
    ) -> LogConfig:
        """Overlay Kafka-style ``props`` on ``base`` (default: the defaults).

        Raises :class:`InvalidConfigError` naming the key for unknown keys and
        for values that do not parse or are out of range.
        """
        changes: dict[str, Any] = {}
        for name, raw in props.items():
            key = _BY_NAME.get(name)
            if key is None:
                raise InvalidConfigError(
                    f"unknown topic config {name!r}; known keys: {', '.join(_BY_NAME)}"
                )
            try:
                value = key.parse(str(raw))
            except ValueError:
                raise InvalidConfigError(
                    f"invalid value {raw!r} for {name}: expected {key.rule}"
                ) from None
            if not key.check(value):
                raise InvalidConfigError(f"invalid value {raw!r} for {name}: expected {key.rule}")
            changes[key.attr] = value
        return dataclasses.replace(base or cls(), **changes)

    def to_properties(self) -> dict[str, str]:
        """Every key as Kafka names it, values as strings."""
        return {k.name: _text_of(getattr(self, k.attr)) for k in _KEYS}

    @property
    def compact(self) -> bool:
        return "compact" in self.cleanup_policy

    @property
    def delete(self) -> bool:
        return "delete" in self.cleanup_policy


def check_value_format(overrides: Mapping[str, object], *, typed: bool, topic: str) -> None:
    """Refuse (:class:`InvalidConfigError`) a topic's own ``value.format`` other than ``none``
    on an untyped topic: Kafka producers' values are stored there as sent, and a format that
    decodes nothing would be a silent no-op. A broker-wide default is not refused: it applies
    to the typed topics only."""
    value = overrides.get(VALUE_FORMAT)
    if not typed and value is not None and str(value).strip() != "none":
        raise InvalidConfigError(
            f"invalid value {value!r} for {VALUE_FORMAT}: topic {topic!r} is untyped (its values are bytes, "
            "stored as sent); value.format applies to typed topics (created with a schema) only")
