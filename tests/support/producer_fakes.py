"""A Producer whose broker client is an in-memory fake that assigns offsets and fails on script."""

from __future__ import annotations

import concurrent.futures
import threading
from collections import defaultdict, deque
from collections.abc import Callable, Sequence
from typing import Any

import pyarrow as pa

from logstore.client.producer import Producer
from logstore.client.results import ClusterMetadata, ProducedPartition
from logstore.errors import (
    LogstoreError,
    UnknownTopicOrPartitionError,
)
from logstore.record import (
    decode_schema,
    untyped_schema,
    value_schema_of,
)
from logstore.record_reader import iter_batches
from logstore.types import PartitionInfo, TopicDescription, TopicPartition

UNTYPED = untyped_schema()


class FakeClient:
    """In-memory stand-in for BrokerClient: assigns offsets, records requests, fails on script.

    ``script`` holds callables consulted per produce request: each returns None (answer
    normally) or a LogstoreError (fail the whole call) or a dict {tp: LogstoreError}
    (fail those partitions). ``hold`` makes answers wait until ``release()``.
    """

    bootstrap = "fake:1"

    def __init__(self, topics: dict[str, tuple[int, pa.Schema]], *, configs: dict[str, str] | None = None) -> None:
        self.topics = topics
        self.configs = configs or {"message.timestamp.type": "CreateTime"}
        self.lock = threading.Lock()
        self.requests: list[tuple[int, list[tuple[TopicPartition, int]]]] = []
        self.records: dict[TopicPartition, list[dict[str, Any]]] = defaultdict(list)
        self.script: deque[Callable[[list[TopicPartition]], Any]] = deque()
        self.hold = False
        self.held: list[Callable[[], None]] = []
        self.in_flight: dict[TopicPartition, int] = defaultdict(int)
        self.max_in_flight: dict[TopicPartition, int] = defaultdict(int)

    def metadata(self, topics: Sequence[str] | None = None, *, timeout_ms: int | None = None) -> ClusterMetadata:
        described, errors = {}, {}
        for name in topics or list(self.topics):
            if name not in self.topics:
                errors[name] = UnknownTopicOrPartitionError(f"topic {name!r} does not exist")
                continue
            n, schema = self.topics[name]
            parts = tuple(PartitionInfo(name, p, 0, 0, (0,), (0,), 0, 0, 0, 0, 0) for p in range(n))
            described[name] = TopicDescription(name, "id", schema, value_schema_of(schema), parts)
        return ClusterMetadata("c", 0, (), described, errors)

    def describe_configs(self, topics: Sequence[str], *, timeout_ms: int | None = None) -> dict[str, Any]:
        return {t: dict(self.configs) for t in topics}

    def init_producer_id(self, transactional_id: str = "", **_: Any) -> tuple[int, int]:
        return 7, 0

    def produce_async(self, items: Sequence[tuple[TopicPartition, bytes]], *, acks: int,
                      timeout_ms: int | None = None, transactional_id: str = "") -> concurrent.futures.Future:
        future: concurrent.futures.Future = concurrent.futures.Future()
        tps = [tp for tp, _ in items]
        with self.lock:
            for tp in tps:
                self.in_flight[tp] += 1
                self.max_in_flight[tp] = max(self.max_in_flight[tp], self.in_flight[tp])
            rule = self.script.popleft() if self.script else None
        outcome = rule(tps) if rule is not None else None

        def answer() -> None:
            with self.lock:
                for tp in tps:
                    self.in_flight[tp] -= 1
                if isinstance(outcome, LogstoreError):
                    future.set_exception(outcome)
                    return
                failed = outcome or {}
                results = []
                counts = []
                for tp, pieces in items:
                    # The producer hands over (head, body) pieces, as it sends them on the wire.
                    data = pieces if isinstance(pieces, bytes) else b"".join(bytes(x) for x in pieces)
                    schema, size = decode_schema(data)
                    batches = list(iter_batches(memoryview(data), start=size))
                    counts.append((tp, len(batches)))
                    if tp in failed:
                        results.append(ProducedPartition(tp.topic, tp.partition, failed[tp], (), -1, 0))
                        continue
                    bases = []
                    for b in batches:
                        base = len(self.records[tp])
                        bases.append(base)
                        rb = b.decode(schema)
                        for row in rb.to_pylist():
                            row["offset"] = len(self.records[tp])
                            self.records[tp].append(row)
                    results.append(ProducedPartition(tp.topic, tp.partition, None, tuple(bases), 12345, 0))
                self.requests.append((acks, counts))
            future.set_result(results)

        if self.hold:
            with self.lock:
                self.held.append(answer)
        else:
            threading.Thread(target=answer, daemon=True).start()
        return future

    def release(self) -> None:
        with self.lock:
            held, self.held = self.held, []
        for answer in held:
            answer()

    def close(self) -> None:
        pass


def make_producer(fake: FakeClient, **options: Any) -> Producer:
    # The fake appends whatever arrives, in any order: it has no sequence checks, so it
    # cannot keep pipelined batches in order as the broker does (tests/broker/test_producer_pipelining.py).
    options.setdefault("max_in_flight_requests_per_connection", 1)
    producer = Producer("127.0.0.1:1", **options)
    producer._client.close()
    producer._client = fake  # type: ignore[assignment]
    return producer
