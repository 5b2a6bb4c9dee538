"""Records of ``send()`` accumulated column-wise per topic, partitioned when they seal.

``send()`` appends a record to its topic's :class:`TopicBuffer`: one Python
list per column (key, value, timestamp, headers) plus the partition the
caller asked for, as a small int (:data:`KEYED` = hash the key,
:data:`STICKY` = the topic's sticky partition, else the partition itself).
Nothing per record is created but the list entries (bytes and ints, which the
cyclic garbage collector does not track) and the future the caller gets.

When the buffer seals (:func:`split_buffer`) the partitions are decided for
all its records at once: keys hashed with the vectorized murmur2
(:func:`~logstore.client.partitioner.partitions_for_keys`, Kafka's formula),
keyless records sent to the sticky partition; then the records are grouped by
partition, input order kept within each partition (a stable sort), and the
:class:`~logstore.client.producer.delivery.SendCompletion` learns which batch
and position each record got. A buffer holds at most ``batch_size`` bytes
(the producer's estimate), so every partition batch cut from it does too.

:func:`split_stored` does the same for a converted ``send_batch()`` batch.

Thread-safety: buffers are filled and split under the accumulator's lock.
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any

import numpy as np
import pyarrow as pa

from logstore.client.partitioner import StickyPartitioner, partitions_for_keys
from logstore.client.producer.arrow_input import records_to_batch
from logstore.client.producer.delivery import SendCompletion
from logstore.client.producer.metadata import TopicInfo

__all__ = ["KEYED", "STICKY", "RecordColumns", "TopicBuffer", "split_buffer", "split_stored"]

#: ``parts`` entry of a record whose partition is its key's murmur2.
KEYED = -1
#: ``parts`` entry of a keyless record without an explicit partition.
STICKY = -2


class RecordColumns:
    """The columns of some ``send()`` records, in order (what the sender encodes).

    ``stored``, when set, is the records already converted to the stored
    schema (the lists are then empty).
    """

    __slots__ = ("keys", "values", "timestamps", "headers", "stored")

    def __init__(self, keys: list[bytes | None], values: list[Any], timestamps: list[int],
                 headers: list[list[dict[str, Any]] | None], stored: pa.RecordBatch | None = None) -> None:
        self.keys = keys
        self.values = values
        self.timestamps = timestamps
        self.headers = headers
        self.stored = stored


class TopicBuffer:
    """The not-yet-sealed ``send()`` records of one topic (see the module docstring)."""

    __slots__ = ("info", "columns", "parts", "size", "created", "completion")

    def __init__(self, info: TopicInfo, now: float) -> None:
        self.info = info
        self.columns = RecordColumns([], [], [], [])
        self.parts: list[int] = []
        self.size = 0
        self.created = now
        self.completion = SendCompletion(info.name, self.columns.timestamps)


def _partition_array(buffer: TopicBuffer, sticky: int, keys: pa.Array | None) -> np.ndarray:
    """The partition of every record (int32): keys hashed, keyless records on ``sticky``.

    ``keys``: the key column as an Arrow array, if already built.
    """
    parts = np.asarray(buffer.parts, dtype=np.int32)
    keyed = parts == KEYED
    if keyed.any():
        n = buffer.info.num_partitions
        if keys is None:
            keys = pa.array(buffer.columns.keys, pa.binary())
        if keyed.all():
            parts = partitions_for_keys(keys, n)
        else:
            where = np.flatnonzero(keyed)
            parts[where] = partitions_for_keys(keys.take(pa.array(where)), n)
    parts[parts == STICKY] = sticky
    return parts


def split_buffer(buffer: TopicBuffer, sticky: int) -> list[tuple[int, RecordColumns, int]]:
    """Cut a sealed buffer into partition batches: ``(partition, columns, count)`` each.

    ``sticky`` is the partition of keyless records without an explicit one.
    Fills the buffer's completion (:meth:`SendCompletion.set_batches`).
    Records of one partition keep their order.
    """
    columns = buffer.columns
    parts = buffer.parts
    n = len(parts)
    completion = buffer.completion
    first = parts[0]
    if first >= 0 and parts.count(first) == n:
        completion.set_batches([first], None, None, None)
        return [(first, columns, n)]
    if first == STICKY and parts.count(STICKY) == n:
        completion.set_batches([sticky], None, None, None)
        return [(sticky, columns, n)]
    # Untyped values (bytes or None) convert: build the stored batch once, cut it with take().
    # Anything Arrow refuses (say, a timestamp out of range) fails per record on the sender.
    stored = None
    if buffer.info.value_schema is None:
        try:
            stored = records_to_batch(buffer.info, columns, None)
        except (pa.ArrowException, TypeError, ValueError, OverflowError):
            stored = None
    assigned = _partition_array(buffer, sticky, None if stored is None else stored.column(2))
    if (assigned == assigned[0]).all():
        p = int(assigned[0])
        completion.set_batches([p], None, None, None)
        if stored is not None:
            columns = RecordColumns([], [], [], [], stored)
        return [(p, columns, n)]
    order = np.argsort(assigned, kind="stable")
    sorted_parts = assigned[order]
    cuts = np.flatnonzero(np.diff(sorted_parts)) + 1
    starts = np.concatenate(([0], cuts))
    ends = np.concatenate((cuts, [n]))
    group_of_sorted = np.repeat(np.arange(len(starts)), ends - starts)
    batch_of = np.empty(n, dtype=np.int64)
    batch_of[order] = group_of_sorted
    pos = np.empty(n, dtype=np.int64)
    pos[order] = np.arange(n) - starts[group_of_sorted]
    out: list[tuple[int, RecordColumns, int]] = []
    rows_per_batch: list[list[int]] = []
    keys, values, timestamps, headers = columns.keys, columns.values, columns.timestamps, columns.headers
    for lo, hi in zip(starts.tolist(), ends.tolist(), strict=True):
        rows = order[lo:hi].tolist()
        rows_per_batch.append(rows)
        if stored is not None:
            taken = stored.take(pa.array(order[lo:hi]))
            # The offset column counts from 0 in every batch (build_batch's relative offsets).
            taken = taken.set_column(0, stored.schema.field(0), pa.array(np.arange(hi - lo, dtype=np.int64)))
            part = RecordColumns([], [], [], [], taken)
        else:
            part = RecordColumns([keys[i] for i in rows], [values[i] for i in rows],
                                 [timestamps[i] for i in rows], [headers[i] for i in rows])
        out.append((int(sorted_parts[lo]), part, hi - lo))
    completion.set_batches([p for p, _, _ in out], batch_of.tolist(), pos.tolist(), rows_per_batch)
    return out


def split_stored(
    info: TopicInfo,
    stored: pa.RecordBatch,
    partition: int | None,
    parts: np.ndarray | None,
    *,
    sticky: StickyPartitioner,
    batch_size: int,
) -> Iterable[tuple[int, pa.RecordBatch]]:
    """Yield ``(partition, chunk of at most batch_size bytes)`` for a converted batch.

    Rows go to ``partition`` if given; else to ``parts`` (a partition per
    row); else by key (vectorized murmur2), keyless rows to the sticky
    partition; a keyless input is cut into chunks spread round-robin from
    the sticky partition. Each partition's rows keep their input order.
    """
    n = info.num_partitions
    rows = stored.num_rows
    if partition is None and parts is None:
        keys = stored.column(2)
        if keys.null_count < rows:
            parts = partitions_for_keys(keys, n)
            if keys.null_count:
                parts[parts < 0] = sticky.partition(info.name, n)
    if partition is not None or parts is None:
        # One partition, or no keys: round-robin chunks from the sticky partition.
        start = partition if partition is not None else sticky.partition(info.name, n)
        last = start
        for i, chunk in enumerate(_chunks(stored, batch_size)):
            last = start if partition is not None else (start + i) % n
            yield last, chunk
        if partition is None:
            sticky.on_new_batch(info.name, n, sticky.partition(info.name, n))
        return
    first = int(parts[0])
    if (parts == first).all():
        for chunk in _chunks(stored, batch_size):
            yield first, chunk
        return
    order = np.argsort(parts, kind="stable")
    sorted_parts = parts[order]
    cuts = np.flatnonzero(np.diff(sorted_parts)) + 1
    taken = stored.take(pa.array(order))
    bounds = [0, *cuts.tolist(), rows]
    for lo, hi in zip(bounds[:-1], bounds[1:], strict=True):
        for chunk in _chunks(taken.slice(lo, hi - lo), batch_size):
            yield int(sorted_parts[lo]), chunk

def _chunks(batch: pa.RecordBatch, batch_size: int) -> Iterable[pa.RecordBatch]:
    rows = batch.num_rows
    if rows == 0:
        return
    per_row = max(1, batch.nbytes // rows)
    step = max(1, batch_size // per_row)
    for lo in range(0, rows, step):
        yield batch.slice(lo, min(step, rows - lo))
