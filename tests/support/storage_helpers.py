"""Plain helpers shared by the storage tests: building batches, reading a log back, a clock.

A record in these tests is the tuple ``(offset, timestamp_ms, key, value, headers)``
with ``headers`` either None or a list of ``(str, bytes)`` pairs, so a test's
model can be a plain list compared with ``==``.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence

import pyarrow as pa

from logstore.record import HEADERS_TYPE, build_batch, encode_batch, untyped_schema
from logstore.record_reader import StoredBatch, parse_batch_at
from logstore.storage.config import LogConfig
from logstore.storage.log import Log

SCHEMA = untyped_schema()

# (timestamp_ms, key, value, headers) of a record before it has an offset.
Draft = tuple[int, "bytes | None", "bytes | None", "list[tuple[str, bytes]] | None"]
Record = tuple[int, int, "bytes | None", "bytes | None", "list[tuple[str, bytes]] | None"]


class ManualClock:
    """A clock for ``Log.open(..., clock=...)``: seconds since the epoch, moved by hand."""

    def __init__(self, now_ms: int = 1_700_000_000_000) -> None:
        self.now_ms = now_ms

    def __call__(self) -> float:
        return self.now_ms / 1000

    def advance(self, ms: int) -> None:
        self.now_ms += ms


def config(**props: object) -> LogConfig:
    """A LogConfig from Kafka-style keys written with underscores (``segment_bytes=1024``)."""
    return LogConfig.from_properties({k.replace("_", "."): v for k, v in props.items()})


def make_batch(drafts: Sequence[Draft], schema: pa.Schema = SCHEMA) -> pa.RecordBatch:
    """An untyped batch of ``drafts``; headers are given as ``(key, value)`` pairs."""
    headers = [
        None if h is None else [{"key": k, "value": v} for k, v in h] for _, _, _, h in drafts
    ]
    return build_batch(
        schema,
        values=[d[2] for d in drafts],
        keys=[d[1] for d in drafts],
        timestamps_ms=[d[0] for d in drafts],
        headers=pa.array(headers, HEADERS_TYPE),
    )


def simple_batch(n: int, *, ts: int = 1_000, tag: bytes = b"v") -> pa.RecordBatch:
    """``n`` records with keys ``k<i>``, values ``<tag><i>`` and timestamps ``ts + i``."""
    return make_batch([(ts + i, b"k%d" % i, tag + b"%d" % i, None) for i in range(n)])


def produced(batch: pa.RecordBatch, **facts: object) -> tuple[StoredBatch, pa.RecordBatch, pa.Schema]:
    """``batch`` as a producer sends it (offsets 0..n-1, ``facts`` of its header): the arguments of
    ``Partition.append`` before ``fsync``."""
    encoded = encode_batch(batch, base_offset=0, **facts)  # type: ignore[arg-type]
    return parse_batch_at(memoryview(encoded.to_bytes()), 0), batch, batch.schema


def records_of(batches: Iterable[pa.RecordBatch]) -> list[Record]:
    """Decoded Arrow batches as record tuples (offsets and timestamps as ints)."""
    out: list[Record] = []
    for rb in batches:
        offsets = rb.column("offset").to_pylist()
        stamps = rb.column("timestamp").cast(pa.int64()).to_pylist()
        keys = rb.column("key").to_pylist()
        values = rb.column("value").to_pylist()
        headers = [
            None if h is None else [(e["key"], e["value"]) for e in h]
            for h in rb.column("headers").to_pylist()
        ]
        out.extend(zip(offsets, stamps, keys, values, headers, strict=True))
    return out


def read_all(log: Log, start: int | None = None, *, max_bytes: int = 1 << 20) -> list[Record]:
    """Every record from ``start`` (default: the log start offset) to the LEO, via ``Log.read``.

    Checks on the way that each read makes progress and that ``data`` is
    exactly the returned batches' bytes back to back.
    """
    offset = log.log_start_offset if start is None else start
    out: list[Record] = []
    while offset < log.log_end_offset:
        res = log.read(offset, max_bytes=max_bytes)
        assert res.batches, f"read at {offset} returned nothing below LEO {log.log_end_offset}"
        assert bytes(res.data) == b"".join(bytes(b.data) for b in res.batches)
        assert res.next_offset > offset
        out.extend(records_of(res.decode()))
        offset = res.next_offset
    return out
