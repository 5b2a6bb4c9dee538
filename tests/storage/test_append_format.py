"""Appending a producer's batch without re-encoding it (logstore.storage.validation.assign_offsets,
Log.append_stored): which bytes the broker patches, which it keeps, when it falls back to
encoding again, and format-1 segments next to format-2 batches."""

from __future__ import annotations

import io
import shutil
from pathlib import Path

import numpy as np
import pyarrow as pa
import pytest
from storage_helpers import (
    SCHEMA,
    ManualClock,
    config,
    produced,
    read_all,
    records_of,
    simple_batch,
)

from logstore.errors import CorruptRecordError
from logstore.record import ATTR_TRANSACTIONAL, build_batch, encode_batch, encode_schema
from logstore.record_layout import FACT_SLICES, FACTS_LENGTH
from logstore.record_reader import iter_batches, parse_batch_at
from logstore.storage.log import Log
from logstore.storage.segment import segment_file_name
from logstore.storage.validation import assign_offsets, validate_records

NOW_MS = 1_700_000_000_000
GOLDEN_V1 = Path(__file__).parent / "golden" / "untyped-batch-v1.arrow"


def _sent(n: int = 5, **facts: object):  # type: ignore[no-untyped-def]
    stored, batch, _ = produced(simple_batch(n), producer_id=31, producer_epoch=2, base_sequence=8, **facts)
    return stored, batch


def _diff(a: bytes, b: bytes) -> list[int]:
    return [i for i in range(len(a)) if a[i] != b[i]]


def test_only_the_base_offset_leader_epoch_and_offset_values_change() -> None:
    stored, _ = _sent()
    sent = bytes(stored.data)
    patched = assign_offsets(stored, base_offset=12_345, leader_epoch=6)
    assert patched is not None
    written = patched.to_bytes()
    assert len(written) == len(sent)
    layout = stored.layout()
    f, (o0, o1) = layout.facts_at, layout.offsets
    allowed = {*range(f + FACT_SLICES["base_offset"].start, f + FACT_SLICES["leader_epoch"].stop), *range(o0, o1)}
    changed = _diff(sent, written)
    assert changed and set(changed) <= allowed
    # The body around the offsets is the producer's memory, not a copy.
    assert patched.body_pieces[0].obj is stored.data.obj and patched.body_pieces[2].obj is stored.data.obj
    again = parse_batch_at(memoryview(written), 0)
    again.verify_crc()  # the producer's CRC, unchanged
    assert again.header.crc == stored.header.crc
    h = again.header
    assert (h.base_offset, h.leader_epoch, h.producer_id, h.producer_epoch, h.base_sequence) == (12_345, 6, 31, 2, 8)
    # Any Arrow reader sees absolute offsets.
    table = pa.ipc.open_stream(io.BytesIO(encode_schema(SCHEMA) + written)).read_all()
    assert table.column("offset").to_pylist() == list(range(12_345, 12_350))


def test_log_append_time_rewrites_timestamps_and_computes_the_crc_again() -> None:
    stored, _ = _sent(3)
    patched = assign_offsets(stored, base_offset=7, leader_epoch=0, log_append_time=NOW_MS)
    assert patched is not None
    again = parse_batch_at(memoryview(patched.to_bytes()), 0)
    again.verify_crc()
    assert again.header.max_timestamp == NOW_MS and again.header.crc != stored.header.crc
    batch = again.decode(SCHEMA)
    assert batch.column("timestamp").cast(pa.int64()).to_pylist() == [NOW_MS] * 3
    assert batch.column("offset").to_pylist() == [7, 8, 9]


@pytest.mark.parametrize("why", ["compressed", "format 1"])
def test_batches_that_cannot_be_patched_are_left_to_encoding(why: str) -> None:
    if why == "compressed":
        stored, _ = _sent(compression="zstd")
    else:
        data = memoryview(GOLDEN_V1.read_bytes())
        stored = next(iter_batches(data, start=len(encode_schema(SCHEMA))))
        assert stored.version == 1
    assert assign_offsets(stored, base_offset=100, leader_epoch=0) is None


def test_validation_refuses_offsets_the_broker_would_not_patch_and_a_false_max_timestamp() -> None:
    def stream(encoded: bytes) -> bytes:
        return encode_schema(SCHEMA) + encoded

    def validate(data: bytes) -> None:
        validate_records(data, log_schema=SCHEMA, max_message_bytes=1 << 20, max_decompressed_bytes=1 << 20,
                         where="produce to t-0")

    gaps = encode_batch(simple_batch(3), base_offset=0, offsets=np.array([0, 2, 4], dtype=np.int64)).to_bytes()
    with pytest.raises(CorruptRecordError, match="without gaps"):
        validate(stream(gaps))
    good = encode_batch(simple_batch(3), base_offset=0).to_bytes()
    validate(stream(good))
    # A max timestamp that is not the largest timestamp, with a CRC that matches the lie.
    lie = encode_batch(simple_batch(3), base_offset=0).header
    at = good.index(b"%+020d" % lie.max_timestamp)
    forged = bytearray(good[:at] + b"%+020d" % (lie.max_timestamp + 5) + good[at + 20:])
    stored = parse_batch_at(memoryview(bytes(forged)), 0)
    from logstore.record_layout import crc_v2
    crc = crc_v2([bytes(forged)], stored.layout(), base_offset=0, compressed=False)
    f = stored.layout().facts_at
    forged[f:f + FACTS_LENGTH] = stored.header.with_crc(crc).facts()
    with pytest.raises(CorruptRecordError, match="max timestamp"):
        validate(stream(bytes(forged)))


def test_a_log_stores_sent_batches_as_they_came_and_reads_them_with_arrow(tmp_path: Path) -> None:
    log = Log.open(str(tmp_path / "t-0"), config=config(), schema=SCHEMA, clock=ManualClock(NOW_MS))
    sent = []
    for n in (3, 1, 4):
        stored, batch, schema = produced(simple_batch(n, tag=b"n%d" % n), producer_id=5, base_sequence=len(sent))
        sent.append(bytes(stored.data))
        log.append_stored(stored, batch, schema, leader_epoch=2)
    log.close()
    [segment] = [p for p in (tmp_path / "t-0").iterdir() if p.suffix == ".arrow"]
    data = segment.read_bytes()
    on_disk = list(iter_batches(memoryview(data), start=len(encode_schema(SCHEMA))))
    for original, stored in zip(sent, on_disk, strict=True):
        stored.verify_crc()
        assert stored.header.leader_epoch == 2
        assert len(_diff(original, bytes(stored.data))) <= 20 + 11 + 8 * stored.header.record_count
    assert [s.header.base_offset for s in on_disk] == [0, 3, 4]
    table = pa.ipc.open_stream(data).read_all()
    assert table.column("offset").to_pylist() == list(range(8))
    log = Log.open(str(tmp_path / "t-0"), config=config(), schema=SCHEMA, clock=ManualClock(NOW_MS))
    assert [r[0] for r in read_all(log)] == list(range(8))
    log.close()


def test_a_format_1_segment_is_read_and_format_2_batches_follow_it(tmp_path: Path) -> None:
    directory = tmp_path / "t-0"
    directory.mkdir()
    shutil.copy(GOLDEN_V1, directory / segment_file_name(42))  # schema + one format-1 batch at 42..44
    log = Log.open(str(directory), config=config(), schema=SCHEMA, clock=ManualClock(NOW_MS))
    assert (log.log_start_offset, log.log_end_offset) == (42, 45)
    stored, batch, schema = produced(build_batch(SCHEMA, values=[b"new"], timestamps_ms=[NOW_MS]),
                                     producer_id=9, attributes=ATTR_TRANSACTIONAL)
    log.append_stored(stored, batch, schema)
    log.close()
    log = Log.open(str(directory), config=config(), schema=SCHEMA, clock=ManualClock(NOW_MS))
    got = read_all(log)
    log.close()
    assert [(o, v) for o, _, _, v, _ in got] == [(42, b"v0"), (43, None), (44, b"value-2"), (45, b"new")]
    data = (directory / segment_file_name(42)).read_bytes()
    versions = [b.version for b in iter_batches(memoryview(data), start=len(encode_schema(SCHEMA)))]
    assert versions == [1, 2]
    assert records_of([pa.ipc.open_stream(data).read_all().to_batches()[0]])[0][0] == 42
