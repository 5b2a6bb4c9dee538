"""The producer's topic metadata: what it needs to know of a topic to send to it.

:class:`TopicInfo` is fetched once per topic (``Metadata`` and
``DescribeConfigs``; retried while the broker cannot be reached, up to
``max_block_ms``, as Kafka's producer waits for metadata) and cached by :class:`TopicMetadata` until the sender
sees UNKNOWN_TOPIC_OR_PARTITION for the topic (:meth:`TopicMetadata.forget`);
the next send fetches it again. Batches keep the :class:`TopicInfo` they were
created with, so a refresh never changes the schema of a queued batch.

Thread-safety: :class:`TopicMetadata` is thread-safe (a lock serialises
fetches; cached lookups take no lock). :class:`TopicInfo` is immutable.
"""

from __future__ import annotations

import threading
import time
from dataclasses import dataclass

import pyarrow as pa

from logstore.client.rpc import BrokerClient
from logstore.errors import BrokerUnavailableError, UnknownTopicOrPartitionError
from logstore.record import encode_schema

__all__ = ["TopicInfo", "TopicMetadata"]


@dataclass(frozen=True, slots=True)
class TopicInfo:
    name: str
    num_partitions: int
    schema: pa.Schema
    value_schema: pa.Schema | None
    schema_message: bytes
    value_type: pa.DataType
    value_names: frozenset[str]
    # message.timestamp.type=LogAppendTime: records carry the broker's append time.
    log_append_time: bool = False

    def check_partition(self, partition: int) -> int:
        """``partition`` if it is an int in range; else TypeError or UnknownTopicOrPartitionError."""
        if not isinstance(partition, int) or isinstance(partition, bool):
            raise TypeError(f"partition must be an int, got {type(partition).__name__}")
        if not 0 <= partition < self.num_partitions:
            raise UnknownTopicOrPartitionError(
                f"partition {partition} of topic {self.name!r} does not exist "
                f"(it has {self.num_partitions} partitions)"
            )
        return partition


class TopicMetadata:
    """A cache of :class:`TopicInfo` by topic name, filled from the broker on first use."""

    def __init__(self, client: BrokerClient, *, max_block_ms: int) -> None:
        self.client = client
        self._timeout_ms = max(1, max_block_ms)
        self._topics: dict[str, TopicInfo] = {}
        self._lock = threading.Lock()

    def topic(self, topic: str) -> TopicInfo:
        """The cached info of ``topic``, fetched if needed (waits up to ``max_block_ms``)."""
        info = self._topics.get(topic)
        if info is not None:
            return info
        with self._lock:
            info = self._topics.get(topic)
            if info is None:
                info = self._fetch(topic)
                self._topics[topic] = info
            return info

    def cached(self, topic: str) -> TopicInfo | None:
        """The cached info of ``topic``, or None (no wait, no lock: ``send()``'s hot path)."""
        return self._topics.get(topic)

    def forget(self, topic: str) -> None:
        """Drop the cached info of ``topic``: the next :meth:`topic` fetches it again."""
        with self._lock:
            self._topics.pop(topic, None)

    def _fetch(self, topic: str) -> TopicInfo:
        if not isinstance(topic, str) or not topic:
            raise TypeError(f"topic must be a non-empty str, got {topic!r}")
        deadline = time.monotonic() + self._timeout_ms / 1000
        pause = 0.05
        while True:
            try:
                return self._fetch_once(topic, max(1, int((deadline - time.monotonic()) * 1000)))
            except BrokerUnavailableError:
                if time.monotonic() + pause >= deadline:
                    raise
            time.sleep(pause)
            pause = min(pause * 2, 1.0)

    def _fetch_once(self, topic: str, timeout_ms: int) -> TopicInfo:
        md = self.client.metadata([topic], timeout_ms=timeout_ms)
        if topic in md.topic_errors:
            raise md.topic_errors[topic]
        desc = md.topics.get(topic)
        if desc is None or desc.num_partitions < 1:
            raise UnknownTopicOrPartitionError(f"topic {topic!r} does not exist")
        configs = self.client.describe_configs([topic]).get(topic)
        timestamp_type = configs.get("message.timestamp.type") if isinstance(configs, dict) else None
        return TopicInfo(
            name=topic,
            num_partitions=desc.num_partitions,
            schema=desc.schema,
            value_schema=desc.value_schema,
            schema_message=encode_schema(desc.schema),
            value_type=desc.schema.field("value").type,
            value_names=frozenset(desc.value_schema.names if desc.value_schema is not None else ()),
            log_append_time=timestamp_type == "LogAppendTime",
        )
