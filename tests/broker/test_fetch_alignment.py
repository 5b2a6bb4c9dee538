"""Fetched batches are 8-byte aligned, whatever address the answer's records had.

Arrow's compute engine (Acero) warns "An input buffer was poorly aligned" for
every unaligned buffer (the compaction job's group-by printed 78 such lines per
run): the client aligns a fetch answer's records once, so every batch decoded
from them is aligned too.
"""

from __future__ import annotations

import pyarrow as pa
import pyarrow.compute as pc
import pytest

from logstore import Admin, NewTopic, Producer, TopicPartition
from logstore.broker.embedded import EmbeddedBroker
from logstore.client.fetcher import decode_fetched
from logstore.client.messages import aligned
from logstore.client.results import FetchRequestPartition
from logstore.client.rpc import BrokerClient

pytestmark = pytest.mark.timeout(120)


def test_aligned_copies_only_what_is_misaligned() -> None:
    data = bytes(range(64)) * 4
    at_start = memoryview(pa.allocate_buffer(len(data))).cast("B")
    at_start[:] = data
    assert aligned(at_start) is at_start  # aligned already: no copy
    shifted = memoryview(data)[3:]
    copy = aligned(shifted)
    assert pa.py_buffer(copy).address % 8 == 0 and bytes(copy) == bytes(shifted)


def test_every_fetched_buffer_is_aligned(shared_broker: EmbeddedBroker) -> None:
    topic = "aligned-fetch"
    with Admin(shared_broker.bootstrap) as admin:
        admin.create_topics([NewTopic(topic, 1)])
    with Producer(shared_broker.bootstrap) as producer:
        for i in range(7):  # odd sizes: keys, values and headers of every length
            producer.send(topic, b"v" * i, key=b"k" * (i + 1), headers=[("h", b"x" * i)]).result(timeout=30)
    with BrokerClient(shared_broker.bootstrap) as client:
        [fetched] = client.fetch([FetchRequestPartition(TopicPartition(topic, 0), 0, 1 << 20)], max_wait_ms=0)
    decoded = decode_fetched(fetched, fetch_offset=0, check_crcs=True, read_committed=False)
    buffers = [b for rb in decoded.batches for col in rb.columns for b in col.buffers() if b is not None]
    assert len(decoded.batches) == 7 and buffers
    assert [b.address % 8 for b in buffers] == [0] * len(buffers)
    # what the compaction job does with them: a hash aggregation over the decoded columns
    table = pa.Table.from_batches(decoded.batches).select(["key", "offset"])
    grouped = table.group_by("key").aggregate([("offset", "max")])
    assert pc.sum(grouped.column("offset_max")).as_py() == sum(range(7))
