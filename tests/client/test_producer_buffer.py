"""Sealing a topic's ``send()`` buffer into partition batches, against a simple model (issue 16).

The model: a record with an explicit partition goes there, a keyed one to
``partition_for_key`` (Kafka's murmur2, one key at a time), a keyless one to
the sticky partition; each partition's records keep their send order; record
``i``'s future reports that partition and its position in the batch as offset
(plus the batch's base offset).
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import random
import threading

import pyarrow as pa
import pytest

from logstore.client.partitioner import partition_for_key
from logstore.client.producer.arrow_input import records_to_batch
from logstore.client.producer.delivery import RecordFuture
from logstore.client.producer.metadata import TopicInfo
from logstore.client.producer.record_buffer import KEYED, STICKY, TopicBuffer, split_buffer
from logstore.errors import RecordTooLargeError
from logstore.record import encode_schema, typed_schema, untyped_schema, value_schema_of


def topic_info(schema: pa.Schema, partitions: int) -> TopicInfo:
    return TopicInfo(name="t", num_partitions=partitions, schema=schema, value_schema=value_schema_of(schema),
                     schema_message=encode_schema(schema), value_type=schema.field("value").type,
                     value_names=frozenset())


def fill(info: TopicInfo, records: list[tuple[int, bytes | None, object]]) -> TopicBuffer:
    buffer = TopicBuffer(info, 0.0)
    c = buffer.columns
    for i, (part, key, value) in enumerate(records):
        c.keys.append(key)
        c.values.append(value)
        c.timestamps.append(1000 + i)
        c.headers.append([{"key": "h", "value": b"%d" % i}] if i % 5 == 0 else None)
        buffer.parts.append(part)
    return buffer


@pytest.mark.parametrize("typed", [False, True], ids=["untyped", "typed"])
@pytest.mark.parametrize("seed", range(5))
def test_split_matches_the_model(typed: bool, seed: int) -> None:
    rng = random.Random(seed)
    n_parts, sticky = 6, rng.randrange(6)
    schema = typed_schema(pa.schema([("x", pa.int64())])) if typed else untyped_schema()
    info = topic_info(schema, n_parts)
    records: list[tuple[int, bytes | None, object]] = []
    expected_partition = []
    for i in range(rng.randrange(1, 400)):
        kind = rng.choice(["explicit", "keyed", "sticky"])
        value: object = {"x": i} if typed else b"v%d" % i
        if kind == "explicit":
            p = rng.randrange(n_parts)
            records.append((p, rng.choice([None, b"k"]), value))
            expected_partition.append(p)
        elif kind == "keyed":
            key = b"key-%d" % rng.randrange(50)
            records.append((KEYED, key, value))
            expected_partition.append(partition_for_key(key, n_parts))
        else:
            records.append((STICKY, None, value))
            expected_partition.append(sticky)
    buffer = fill(info, records)
    batches = split_buffer(buffer, sticky)

    # Each batch holds its partition's records, in send order.
    by_partition: dict[int, list[int]] = {}
    for i, p in enumerate(expected_partition):
        by_partition.setdefault(p, []).append(i)
    assert sorted(p for p, _, _ in batches) == sorted(by_partition)
    completion = buffer.completion
    for sub, (p, columns, count) in enumerate(batches):
        rows = by_partition[p]
        assert count == len(rows)
        stored = columns.stored if columns.stored is not None else records_to_batch(info, columns, None)
        want = records_to_batch(info, buffer.columns, rows)
        assert stored.equals(want), f"partition {p}"
        completion.complete(sub, (100 * (p + 1), -1))
    for i, p in enumerate(expected_partition):
        md = RecordFuture(completion, i).result(timeout=0)
        assert (md.partition, md.offset, md.timestamp_ms) == (p, 100 * (p + 1) + by_partition[p].index(i), 1000 + i)


def test_a_failed_batch_fails_only_its_records() -> None:
    info = topic_info(untyped_schema(), 2)
    buffer = fill(info, [(i % 2, None, b"v%d" % i) for i in range(10)])
    batches = split_buffer(buffer, 0)
    assert [p for p, _, _ in batches] == [0, 1]
    error = RecordTooLargeError("refused")
    buffer.completion.complete(1, error)
    futures = [RecordFuture(buffer.completion, i) for i in range(10)]
    assert [f.exception(timeout=0) for f in futures[1::2]] == [error] * 5
    assert not any(f.done() for f in futures[0::2])
    buffer.completion.complete(0, (7, -1))
    assert [f.result(timeout=0).offset for f in futures[0::2]] == [7, 8, 9, 10, 11]


@pytest.mark.timeout(30)
def test_record_futures_work_with_wait_as_completed_and_asyncio() -> None:
    info = topic_info(untyped_schema(), 1)
    buffer = fill(info, [(0, None, b"v%d" % i) for i in range(3)])
    split_buffer(buffer, 0)
    futures = [RecordFuture(buffer.completion, i) for i in range(3)]

    async def awaited() -> int:
        return (await asyncio.wrap_future(futures[2])).offset

    threading.Timer(0.2, lambda: buffer.completion.complete(0, (40, -1))).start()
    # Waiting on pending futures makes them full Futures that the completion wakes.
    done, not_done = concurrent.futures.wait(futures[:2], timeout=10)
    assert len(done) == 2 and not not_done
    assert [f.result().offset for f in concurrent.futures.as_completed(futures, timeout=10)] != []
    assert asyncio.run(awaited()) == 42
    assert [f.result(timeout=0).offset for f in futures] == [40, 41, 42]
