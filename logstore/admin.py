"""The admin client: :class:`Admin` creates, describes, configures and trims topics.

Every method sends one request and raises the mapped
:class:`~logstore.errors.LogstoreError` when the broker refuses it, e.g.
:class:`TopicAlreadyExistsError`, :class:`UnknownTopicOrPartitionError`,
:class:`InvalidConfigError`, :class:`SchemaMismatchError`. Methods that take
several items act on each independently (no atomicity across topics): if
some fail, the others are still applied and the first failure is raised,
its message prefixed with the item it is about.

Thread-safety: an :class:`Admin` is thread-safe.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence

import pyarrow as pa

from logstore.client import (
    DEFAULT_REQUEST_TIMEOUT_MS,
    EARLIEST_TIMESTAMP,
    ISOLATION_LEVELS,
    LATEST_TIMESTAMP,
    BrokerClient,
    ConfigAlteration,
    TopicCleaning,
    about,
    raise_for_errors,
)
from logstore.errors import (
    InvalidPartitionsError,
    LogstoreError,
    UnknownServerError,
    UnknownTopicOrPartitionError,
)
from logstore.types import ListedOffset, NewTopic, TopicDescription, TopicPartition

__all__ = ["Admin", "OffsetSpec"]

# What list_offsets accepts per partition: "earliest", "latest" or a timestamp in ms.
OffsetSpec = str | int


class Admin:
    """Topic administration against one broker.

    ``bootstrap`` is ``"host:port"`` (default ``$LOGSTORE_BOOTSTRAP`` or
    ``127.0.0.1:9392``); every call has the deadline ``request_timeout_ms``.
    Use as a context manager or call :meth:`close`. Thread-safe.
    """

    def __init__(
        self, bootstrap: str | None = None, *, request_timeout_ms: int = DEFAULT_REQUEST_TIMEOUT_MS
    ) -> None:
        self._client = BrokerClient(bootstrap, request_timeout_ms=request_timeout_ms)

    @property
    def bootstrap(self) -> str:
        return self._client.bootstrap

    def close(self) -> None:
        self._client.close()

    def __enter__(self) -> Admin:
        return self

    def __exit__(self, *exc_info: object) -> None:
        self.close()

    # ------------------------------------------------------------------ topics

    def create_topics(self, topics: Sequence[NewTopic], *, validate_only: bool = False) -> None:
        """Create ``topics`` (or, with ``validate_only``, only check that they could be).

        Raises e.g. :class:`TopicAlreadyExistsError`, :class:`InvalidTopicError`,
        :class:`InvalidPartitionsError`, :class:`InvalidConfigError`,
        :class:`SchemaMismatchError` (an unusable value schema).
        """
        topics = list(topics)
        for t in topics:
            if not isinstance(t, NewTopic):
                raise TypeError(f"create_topics takes NewTopic objects, got {t!r}")
            if t.value_schema is not None and not isinstance(t.value_schema, pa.Schema):
                raise TypeError(f"value_schema of {t.name!r} must be a pyarrow.Schema")
            # On the wire 0 means "the broker's default count": refuse it here.
            if not isinstance(t.num_partitions, int) or t.num_partitions < 1:
                raise InvalidPartitionsError(
                    f"topic {t.name!r}: num_partitions must be a positive integer, got {t.num_partitions!r}"
                )
        results = self._client.create_topics(topics, validate_only=validate_only)
        raise_for_errors(
            (f"topic {t.name!r}", _result(results, t.name)) for t in topics
        )

    def create_topic(
        self,
        name: str,
        num_partitions: int = 1,
        *,
        configs: Mapping[str, str] | None = None,
        value_schema: pa.Schema | None = None,
    ) -> None:
        """Create one topic; shorthand for ``create_topics([NewTopic(...)])``."""
        self.create_topics([
            NewTopic(name, num_partitions, configs=dict(configs or {}), value_schema=value_schema)
        ])

    def delete_topics(self, names: Iterable[str]) -> None:
        """Delete topics and their data. Raises :class:`UnknownTopicOrPartitionError` for unknown ones."""
        names = list(names)
        results = self._client.delete_topics(names)
        raise_for_errors((f"topic {n!r}", _result(results, n)) for n in names)

    def list_topics(self) -> list[str]:
        """The names of every topic, sorted."""
        md = self._client.metadata()
        return sorted(md.topics)

    def describe_topics(self, names: Iterable[str] | None = None) -> dict[str, TopicDescription]:
        """Describe ``names`` (None = every topic): schema, partitions, offsets, HWM and LSO."""
        wanted = None if names is None else list(names)
        md = self._client.metadata(wanted)
        if wanted is None:
            return dict(md.topics)
        out: dict[str, TopicDescription] = {}
        for name in wanted:
            err = md.topic_errors.get(name)
            if err is not None:
                raise about(err, f"topic {name!r}")
            desc = md.topics.get(name)
            if desc is None:
                raise UnknownTopicOrPartitionError(f"topic {name!r} does not exist")
            out[name] = desc
        return out

    # ------------------------------------------------------------------ configs

    def describe_configs(self, topics: Iterable[str]) -> dict[str, dict[str, str]]:
        """Each topic's effective configuration: every key, Kafka names, string values."""
        names = list(topics)
        results = self._client.describe_configs(names)
        out: dict[str, dict[str, str]] = {}
        for name in names:
            configs = results.get(name)
            if configs is None:
                raise UnknownServerError(f"the broker's answer has no configs for topic {name!r}")
            if isinstance(configs, LogstoreError):
                raise about(configs, f"topic {name!r}")
            out[name] = configs
        return out

    def alter_configs(
        self, changes: Mapping[str, Mapping[str, object | None]], *, validate_only: bool = False
    ) -> None:
        """Change topic configs: ``{topic: {key: value}}``; a None value resets the key to the default.

        Keys not named keep their values (an incremental alter). Raises
        :class:`InvalidConfigError` for unknown keys or bad values.
        """
        alterations = {
            topic: ConfigAlteration(
                set={k: str(v) for k, v in conf.items() if v is not None},
                delete=tuple(k for k, v in conf.items() if v is None),
            )
            for topic, conf in changes.items()
        }
        results = self._client.alter_configs(alterations, validate_only=validate_only)
        raise_for_errors((f"topic {t!r}", _result(results, t)) for t in alterations)

    # ------------------------------------------------------------------ offsets

    def list_offsets(
        self,
        specs: Mapping[TopicPartition, OffsetSpec],
        *,
        isolation_level: str = "read_uncommitted",
    ) -> dict[TopicPartition, ListedOffset]:
        """Look up offsets: ``"earliest"`` (log start offset), ``"latest"`` (HWM, or LSO with
        read_committed) or a timestamp in ms (first record at or after it; ``offset`` None if none).
        """
        if isolation_level not in ISOLATION_LEVELS:
            raise ValueError(f"isolation_level must be one of {sorted(ISOLATION_LEVELS)}")
        timestamps: dict[TopicPartition, int] = {}
        for tp, spec in specs.items():
            if spec == "earliest":
                timestamps[tp] = EARLIEST_TIMESTAMP
            elif spec == "latest":
                timestamps[tp] = LATEST_TIMESTAMP
            elif isinstance(spec, int) and not isinstance(spec, bool) and spec >= 0:
                timestamps[tp] = spec
            else:
                raise ValueError(
                    f"offset spec for {tp} must be 'earliest', 'latest' or a timestamp in ms >= 0, "
                    f"got {spec!r}"
                )
        found = self._client.list_offsets(timestamps, isolation_level=isolation_level)
        out: dict[TopicPartition, ListedOffset] = {}
        for tp in timestamps:
            listed = found.get(tp)
            if listed is None:
                raise UnknownServerError(f"the broker's answer has no offset for {tp}")
            if isinstance(listed, LogstoreError):
                raise about(listed, tp)
            out[tp] = listed
        return out

    def delete_records(self, before: Mapping[TopicPartition, int]) -> dict[TopicPartition, int]:
        """Delete the records below each offset (-1 = the high watermark); return the new
        log start offsets. Raises :class:`OffsetOutOfRangeError` for an offset above the HWM.
        """
        for tp, offset in before.items():
            if not isinstance(offset, int) or offset < -1:
                raise ValueError(f"offset for {tp} must be an int >= -1, got {offset!r}")
        found = self._client.delete_records(before)
        out: dict[TopicPartition, int] = {}
        for tp in before:
            low = found.get(tp)
            if low is None:
                raise UnknownServerError(f"the broker's answer has no entry for {tp}")
            if isinstance(low, LogstoreError):
                raise about(low, tp)
            out[tp] = low
        return out


    # ------------------------------------------------------------------ compaction

    def describe_cleaning(
        self, topics: Iterable[str] | None = None, *, now_ms: int | None = None
    ) -> dict[str, TopicCleaning]:
        """The compaction state of ``topics`` (None = every topic whose cleanup.policy
        includes compact): their compaction configs and, per partition, clean and
        dirty bytes, dirty ratio, first dirty offset, cleanable end offset, active
        segment base, LSO and the closed segments a compaction would replace.

        ``now_ms`` is the clock for ``min.compaction.lag.ms`` (default: the
        broker's). Raises :class:`UnknownTopicOrPartitionError` for an unknown topic.
        """
        names = None if topics is None else list(topics)
        found = self._client.describe_cleaning(names, now_ms=now_ms)
        out: dict[str, TopicCleaning] = {}
        for name in names if names is not None else sorted(found):
            got = found.get(name)
            if got is None:
                raise UnknownServerError(f"the broker's answer has no cleaning state for topic {name!r}")
            if isinstance(got, LogstoreError):
                raise about(got, f"topic {name!r}")
            out[name] = got
        return out


def _result(results: Mapping[str, LogstoreError | None], name: str) -> LogstoreError | None:
    if name not in results:
        return UnknownServerError("the broker's answer does not mention it")
    return results[name]
