"""One segment (logstore.storage.segment) on its own: appends, reads, index lookups, reopening
from disk, and recovery of a damaged or torn tail, as its module docstring promises."""

from __future__ import annotations

import os
import tempfile

import pyarrow as pa
import pyarrow.ipc
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from storage_helpers import SCHEMA, make_batch, records_of, simple_batch

from logstore.errors import CorruptRecordError
from logstore.record import encode_batch, typed_schema
from logstore.storage.segment import RecoveryDataLossError, Segment, SegmentRead

pytestmark = pytest.mark.timeout(60)

BASE = 100  # every segment here starts at a non-zero base offset, to catch absolute/relative mix-ups


def new_segment(directory, *, interval: int = 1 << 20, base: int = BASE) -> Segment:  # type: ignore[no-untyped-def]
    return Segment.create(str(directory), base, SCHEMA, index_interval_bytes=interval)


def append(seg: Segment, base_offset: int, n: int, *, ts: int = 1_000, tag: bytes = b"v") -> int:
    return seg.append(encode_batch(simple_batch(n, ts=ts, tag=tag), base_offset=base_offset))


def records(read: SegmentRead) -> list[tuple]:
    return records_of(b.decode(read.schema) for b in read.batches)


def reopen(seg: Segment) -> Segment:
    seg.close()
    return Segment.open(seg.directory, seg.base_offset, index_interval_bytes=seg.index_interval_bytes)


def test_appends_read_back_whole_batches_at_the_positions_returned(tmp_path) -> None:  # type: ignore[no-untyped-def]
    seg = new_segment(tmp_path)
    empty_size = seg.size
    assert (seg.next_offset, seg.max_timestamp) == (BASE, -1)
    positions = [append(seg, BASE, 3, ts=5_000), append(seg, BASE + 3, 2, ts=2_000, tag=b"w"),
                 append(seg, BASE + 10, 1, ts=9_000, tag=b"x")]  # a gap of offsets 105..109
    assert positions[0] == empty_size
    assert [b.position for b in seg.iter_batches()] == positions
    assert seg.size == os.path.getsize(seg.path)
    assert (seg.next_offset, seg.max_timestamp) == (BASE + 11, 9_000)

    got = seg.read(BASE, max_bytes=1 << 20, upper_bound=1 << 40)
    assert [b.header.base_offset for b in got.batches] == [BASE, BASE + 3, BASE + 10]
    assert [r[0] for r in records(got)] == [100, 101, 102, 103, 104, 110]
    assert [r[3] for r in records(got)] == [b"v0", b"v1", b"v2", b"w0", b"w1", b"x0"]
    assert bytes(got.data) == b"".join(bytes(b.data) for b in got.batches)
    assert got.next_offset == BASE + 11
    # Offsets in a gap start at the next batch; offsets at or past the end read nothing.
    assert seg.read(BASE + 7, max_bytes=1 << 20, upper_bound=1 << 40).batches[0].header.base_offset == 110
    assert seg.read(BASE + 11, max_bytes=1 << 20, upper_bound=1 << 40).batches == []


def test_the_file_is_an_arrow_ipc_stream(tmp_path) -> None:  # type: ignore[no-untyped-def]
    seg = new_segment(tmp_path)
    append(seg, BASE, 3)
    append(seg, BASE + 3, 2)
    with open(seg.path, "rb") as f:
        table = pyarrow.ipc.open_stream(f).read_all()
    assert table.schema.equals(SCHEMA)
    assert table.column("offset").to_pylist() == [100, 101, 102, 103, 104]


def test_read_bounds_are_whole_batches_exclusive_upper_bound_and_max_bytes(tmp_path) -> None:  # type: ignore[no-untyped-def]
    seg = new_segment(tmp_path)
    for i in range(4):
        append(seg, BASE + 3 * i, 3)
    one = seg.iter_batches()[0].size

    # A start inside a batch returns that whole batch.
    assert seg.read(BASE + 4, max_bytes=1 << 20, upper_bound=1 << 40).batches[0].header.base_offset == BASE + 3
    # upper_bound is exclusive: a batch is returned only when its next offset is <= upper_bound.
    assert len(seg.read(BASE, max_bytes=1 << 20, upper_bound=BASE + 6).batches) == 2
    assert len(seg.read(BASE, max_bytes=1 << 20, upper_bound=BASE + 5).batches) == 1
    assert seg.read(BASE, max_bytes=1 << 20, upper_bound=BASE + 2).batches == []
    # max_bytes never splits a batch; min_one_batch returns the first one even if it is larger.
    assert len(seg.read(BASE, max_bytes=2 * one, upper_bound=1 << 40).batches) == 2
    assert len(seg.read(BASE, max_bytes=2 * one - 1, upper_bound=1 << 40).batches) == 1
    assert len(seg.read(BASE, max_bytes=1, upper_bound=1 << 40).batches) == 1
    assert seg.read(BASE, max_bytes=1, upper_bound=1 << 40, min_one_batch=False).batches == []


def test_batches_that_do_not_follow_are_refused_and_nothing_is_written(tmp_path) -> None:  # type: ignore[no-untyped-def]
    seg = new_segment(tmp_path)
    append(seg, BASE, 3)
    size = seg.size
    for base_offset in (BASE + 2, BASE - 5):  # overlapping the last batch; below the segment's base
        with pytest.raises(CorruptRecordError, match="does not follow") as e:
            append(seg, base_offset, 1)
        assert e.value.code == "CORRUPT_MESSAGE"
        assert seg.path in e.value.message
    assert (seg.size, seg.next_offset, os.path.getsize(seg.path)) == (size, BASE + 3, size)
    with pytest.raises(CorruptRecordError, match="u32 range"):
        append(seg, BASE + 2**32, 1)


# (timestamp offsets per batch) for the index tests: out of order on purpose, as CreateTime allows.
stamps = st.lists(st.lists(st.integers(0, 50), min_size=1, max_size=4), min_size=1, max_size=8)


@settings(max_examples=30, deadline=None)
@given(batches=stamps, interval=st.sampled_from([1, 400, 1 << 20]), probe=st.integers(-1, 52))
def test_offset_and_time_lookups_agree_with_a_linear_scan(batches, interval, probe) -> None:  # type: ignore[no-untyped-def]
    with tempfile.TemporaryDirectory() as d:
        seg = new_segment(d, interval=interval)
        model: dict[int, int] = {}  # offset -> timestamp, in offset order
        offset = BASE
        for ts in batches:
            seg.append(encode_batch(make_batch([(t, None, b"x", None) for t in ts]), base_offset=offset))
            model.update({offset + i: t for i, t in enumerate(ts)})
            offset += len(ts) + 1  # a gap after every batch
        batch_of = {o: b.header.base_offset for b in seg.iter_batches()
                    for o in range(b.header.base_offset, b.header.next_offset)}

        for o in list(model) + [o + 1 for o in model]:
            got = seg.read(o, max_bytes=1, upper_bound=1 << 40)
            expected = min((k for k in model if k >= o), default=None)
            if expected is None:
                assert got.batches == []
            else:
                assert got.batches[0].header.base_offset == batch_of[expected]
        # Every offset index entry names a batch start.
        starts = {b.header.base_offset: b.position for b in seg.iter_batches()}
        assert all(starts[e.offset] == e.position for e in seg.offset_index.entries())

        for start in (BASE, BASE + 3, offset):
            expected = min((o for o, t in model.items() if o >= start and t >= probe), default=None)
            assert seg.find_offset_for_timestamp(probe, start_offset=start) == expected
        seg.close()


def test_reopening_after_a_clean_close_restores_every_fact(tmp_path) -> None:  # type: ignore[no-untyped-def]
    seg = new_segment(tmp_path, interval=1)
    for i in range(5):
        append(seg, BASE + 2 * i, 2, ts=1_000 * (5 - i))  # max timestamp in the first batch
    before = (seg.size, seg.next_offset, seg.max_timestamp)
    reads = records(seg.read(BASE, max_bytes=1 << 20, upper_bound=1 << 40))
    entries = (seg.offset_index.entries(), seg.time_index.entries())
    seg.seal()

    again = reopen(seg)
    again.load()
    assert (again.size, again.next_offset, again.max_timestamp) == before == (seg.size, BASE + 10, 5_001)
    assert (again.offset_index.entries(), again.time_index.entries()) == entries
    assert records(again.read(BASE, max_bytes=1 << 20, upper_bound=1 << 40)) == reads
    assert again.find_offset_for_timestamp(5_001, start_offset=BASE) == BASE + 1
    # It takes appends where the old object left off.
    append(again, BASE + 10, 1)
    assert again.next_offset == BASE + 11


@pytest.mark.parametrize("damage", ["deleted", "emptied", "garbage"])
def test_load_rebuilds_missing_or_damaged_indexes(tmp_path, damage) -> None:  # type: ignore[no-untyped-def]
    seg = new_segment(tmp_path, interval=1)
    for i in range(4):
        append(seg, BASE + 3 * i, 3, ts=100 * i)
    entries = (seg.offset_index.entries(), seg.time_index.entries())
    seg.seal()
    seg.close()
    for path in (seg.offset_index.path, seg.time_index.path):
        if damage == "deleted":
            os.remove(path)
        else:
            with open(path, "wb") as f:
                f.write(b"" if damage == "emptied" else b"\x07" * 13)

    again = Segment.open(str(tmp_path), BASE, index_interval_bytes=1)
    again.load()
    assert (again.size, again.next_offset, again.max_timestamp) == (seg.size, BASE + 12, 302)
    assert again.offset_index.entries() == entries[0]
    assert again.find_offset_for_timestamp(200, start_offset=BASE) == BASE + 6


def test_a_bad_batch_in_a_closed_segment_raises_and_is_not_skipped(tmp_path) -> None:  # type: ignore[no-untyped-def]
    seg = new_segment(tmp_path)
    for i in range(3):
        append(seg, BASE + 3 * i, 3)
    middle = seg.iter_batches()[1]
    seg.seal()
    seg.close()
    size = os.path.getsize(seg.path)
    with open(seg.path, "r+b") as f:  # flip a byte in the middle batch's body
        f.seek(middle.position + middle.size - 8)
        byte = f.read(1)
        f.seek(-1, os.SEEK_CUR)
        f.write(bytes([byte[0] ^ 0xFF]))
    os.remove(seg.offset_index.path)  # forces the rebuild that must find the bad batch

    again = Segment.open(str(tmp_path), BASE, index_interval_bytes=1 << 20)
    with pytest.raises(CorruptRecordError, match="corrupt closed segment"):
        again.load()
    assert os.path.getsize(seg.path) == size


@pytest.mark.parametrize("head", [b"not arrow at all" * 8, "other-schema"])
def test_a_file_that_is_not_a_segment_is_refused_on_open(tmp_path, head) -> None:  # type: ignore[no-untyped-def]
    path = tmp_path / f"{BASE:020d}.arrow"
    if head == "other-schema":  # a valid Arrow stream, but not of the stored columns
        sink = pa.BufferOutputStream()
        pyarrow.ipc.new_stream(sink, pa.schema([pa.field("a", pa.int64())])).close()
        head = sink.getvalue().to_pybytes()
    path.write_bytes(head)
    with pytest.raises(CorruptRecordError) as e:
        Segment.open(str(tmp_path), BASE, index_interval_bytes=1 << 20)
    assert str(path) in e.value.message


def torn(tmp_path, cut_bytes: int) -> tuple[Segment, int]:  # type: ignore[no-untyped-def]
    """A segment of three 3-record batches whose file lost its last ``cut_bytes`` bytes in a crash."""
    seg = new_segment(tmp_path, interval=1)
    for i in range(3):
        append(seg, BASE + 3 * i, 3, ts=1_000 + 10 * i)
    last = seg.iter_batches()[-1]
    seg.flush()
    seg.close()
    os.truncate(seg.path, seg.size - cut_bytes)
    return Segment.open(str(tmp_path), BASE, index_interval_bytes=1), last.position


def test_recover_cuts_a_torn_tail_and_says_what_it_cut(tmp_path) -> None:  # type: ignore[no-untyped-def]
    seg, last_position = torn(tmp_path, cut_bytes=10)
    file_size = os.path.getsize(seg.path)
    assert seg.recover(min_end_offset=BASE + 6) == file_size - last_position
    assert os.path.getsize(seg.path) == seg.size == last_position
    assert (seg.next_offset, seg.max_timestamp) == (BASE + 6, 1_012)
    tail = seg.truncated_tail
    assert tail is not None
    assert (tail.position, tail.bytes, tail.first_offset) == (last_position, file_size - last_position, BASE + 6)
    assert [e.offset for e in seg.offset_index.entries()] == [BASE, BASE + 3]
    # The offsets cut off are handed out again, to the next append.
    assert append(seg, BASE + 6, 1, tag=b"again") == last_position
    assert records(seg.read(BASE + 6, max_bytes=1 << 20, upper_bound=1 << 40))[0][3] == b"again0"


def test_recover_of_a_whole_segment_cuts_nothing(tmp_path) -> None:  # type: ignore[no-untyped-def]
    seg, _ = torn(tmp_path, cut_bytes=0)
    size = os.path.getsize(seg.path)
    assert seg.recover(min_end_offset=BASE + 9) == 0
    assert seg.truncated_tail is None
    assert (seg.size, seg.next_offset) == (size, BASE + 9)


def test_recover_that_would_cut_below_min_end_offset_raises_and_cuts_nothing(tmp_path) -> None:  # type: ignore[no-untyped-def]
    seg, _ = torn(tmp_path, cut_bytes=10)
    size = os.path.getsize(seg.path)
    with pytest.raises(RecoveryDataLossError) as e:
        seg.recover(min_end_offset=BASE + 7)
    assert (e.value.kept_end_offset, e.value.min_end_offset) == (BASE + 6, BASE + 7)
    assert e.value.code == "CORRUPT_MESSAGE"
    assert seg.path in e.value.message
    assert os.path.getsize(seg.path) == size


def test_recover_refuses_to_cut_a_flipped_byte_followed_by_a_good_batch(tmp_path) -> None:  # type: ignore[no-untyped-def]
    seg, _ = torn(tmp_path, cut_bytes=0)
    seg.recover()
    middle = seg.iter_batches()[1]
    seg.close()
    with open(seg.path, "r+b") as f:
        f.seek(middle.position + middle.size - 8)
        byte = f.read(1)
        f.seek(-1, os.SEEK_CUR)
        f.write(bytes([byte[0] ^ 0xFF]))
    size = os.path.getsize(seg.path)

    strict = Segment.open(str(tmp_path), BASE, index_interval_bytes=1)
    with pytest.raises(RecoveryDataLossError, match="a whole batch with a good CRC follows") as e:
        strict.recover(only_unfinished_writes=True)
    assert e.value.min_end_offset == BASE + 9
    assert os.path.getsize(seg.path) == size
    strict.close()

    lenient = Segment.open(str(tmp_path), BASE, index_interval_bytes=1)
    assert lenient.recover() == size - middle.position
    assert lenient.next_offset == BASE + 3
    assert lenient.truncated_tail is not None and lenient.truncated_tail.batches == 2


def test_truncate_to_keeps_whole_batches_below_the_offset(tmp_path) -> None:  # type: ignore[no-untyped-def]
    seg = new_segment(tmp_path, interval=1)
    for i in range(4):
        append(seg, BASE + 3 * i, 3, ts=1_000 * (i + 1))
    positions = [b.position for b in seg.iter_batches()]

    seg.truncate_to(BASE + 7)  # inside the third batch: it starts below 107, so it stays
    assert (seg.next_offset, seg.size, seg.max_timestamp) == (BASE + 9, positions[3], 3_002)
    seg.truncate_to(BASE + 3)
    assert (seg.next_offset, seg.size, seg.max_timestamp) == (BASE + 3, positions[1], 1_002)
    assert os.path.getsize(seg.path) == positions[1]
    assert [e.offset for e in seg.offset_index.entries()] == [BASE]
    assert seg.find_offset_for_timestamp(2_000, start_offset=BASE) is None
    append(seg, BASE + 3, 1, tag=b"new")
    assert [r[3] for r in records(seg.read(BASE, max_bytes=1 << 20, upper_bound=1 << 40))][-1] == b"new0"
    seg.truncate_to(BASE)
    assert (seg.next_offset, seg.size, seg.max_timestamp) == (BASE, seg.data_start, -1)


def test_created_ms_is_the_age_the_owner_gives(tmp_path) -> None:  # type: ignore[no-untyped-def]
    seg = Segment.create(str(tmp_path), BASE, SCHEMA, index_interval_bytes=4096, created_ms=123)
    assert seg.created_ms == 123
    seg.close()
    assert Segment.open(str(tmp_path), BASE, index_interval_bytes=4096, created_ms=456).created_ms == 456
    with pytest.raises(FileExistsError):  # create never overwrites a segment
        Segment.create(str(tmp_path), BASE, SCHEMA, index_interval_bytes=4096)


def test_delete_removes_the_three_files(tmp_path) -> None:  # type: ignore[no-untyped-def]
    seg = new_segment(tmp_path)
    append(seg, BASE, 2)
    seg.flush()
    assert sorted(os.listdir(tmp_path)) == [f"{BASE:020d}{s}" for s in (".arrow", ".index", ".timeindex")]
    seg.delete()
    assert os.listdir(tmp_path) == []


def test_schema_of_the_file_is_the_one_created_with(tmp_path) -> None:  # type: ignore[no-untyped-def]
    schema = typed_schema(pa.schema([pa.field("id", pa.int64(), nullable=False)]))
    seg = Segment.create(str(tmp_path), BASE, schema, index_interval_bytes=4096)
    assert reopen(seg).schema.equals(schema)
