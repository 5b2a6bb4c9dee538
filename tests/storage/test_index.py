"""Offset and time indexes (logstore.storage.index) against a sorted-dict model, on disk and reopened."""

from __future__ import annotations

import bisect
import os
import shutil
import struct
import tempfile

import pytest
from hypothesis import settings
from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, invariant, precondition, rule

from logstore.errors import CorruptRecordError
from logstore.storage.index import OffsetIndex, OffsetPosition, TimeIndex, TimestampOffset

BASE = 1_000_000  # a non-zero base offset, so relative/absolute mix-ups show


class SortedModel:
    """A sorted dict as two parallel lists: the reference for index lookups."""

    def __init__(self) -> None:
        self.keys: list[int] = []
        self.values: list[int] = []

    def floor(self, key: int) -> tuple[int, int] | None:
        """The entry with the largest key <= ``key``."""
        i = bisect.bisect_right(self.keys, key) - 1
        return (self.keys[i], self.values[i]) if i >= 0 else None

    def lower(self, key: int) -> tuple[int, int] | None:
        """The entry with the largest key < ``key``."""
        i = bisect.bisect_left(self.keys, key) - 1
        return (self.keys[i], self.values[i]) if i >= 0 else None


class IndexMachine(RuleBasedStateMachine):
    """Random appends, truncations, flushes and reopens of both index kinds."""

    def __init__(self) -> None:
        super().__init__()
        self.dir = tempfile.mkdtemp(prefix="index-test-")
        self.offsets = OffsetIndex(os.path.join(self.dir, "x.index"), BASE)
        self.times = TimeIndex(os.path.join(self.dir, "x.timeindex"), BASE)
        self.offsets.reset()
        self.times.reset()
        self.off_model = SortedModel()  # absolute offset -> position
        self.time_model = SortedModel()  # timestamp -> absolute offset
        self.next_offset = BASE
        self.next_position = 0

    def teardown(self) -> None:
        self.offsets.close()
        self.times.close()
        shutil.rmtree(self.dir, ignore_errors=True)

    @rule(offset_step=st.integers(0, 2**20), position_step=st.integers(1, 2**20),
          ts=st.integers(-5, 10**13))
    def append(self, offset_step: int, position_step: int, ts: int) -> None:
        offset = self.next_offset + offset_step
        position = self.next_position + position_step - 1
        if offset - BASE >= 2**32 or position >= 2**32:
            return
        self.offsets.append(offset, position)
        self.off_model.keys.append(offset)
        self.off_model.values.append(position)
        appended = self.times.maybe_append(ts, offset)
        expect = not self.time_model.keys or ts > self.time_model.keys[-1]
        assert appended == expect
        if expect:
            self.time_model.keys.append(ts)
            self.time_model.values.append(offset)
        self.next_offset = offset + 1
        self.next_position = position + 1

    @precondition(lambda self: bool(self.off_model.keys))
    @rule(data=st.data())
    def rejects_non_increasing_entries(self, data: st.DataObject) -> None:
        last_off, last_pos = self.off_model.keys[-1], self.off_model.values[-1]
        bad = data.draw(st.sampled_from([
            (last_off, last_pos + 1), (last_off + 1, last_pos), (last_off - 1, last_pos + 5),
            (BASE - 1, last_pos + 1), (BASE + 2**32, last_pos + 1),
        ]))
        with pytest.raises(ValueError):
            self.offsets.append(*bad)
        # A time index entry may not point before the last one, even with a larger timestamp.
        if self.time_model.values[-1] > BASE:
            with pytest.raises(ValueError):
                self.times.maybe_append(10**14, self.time_model.values[-1] - 1)

    @rule(data=st.data())
    def truncate(self, data: st.DataObject) -> None:
        # Truncation points exactly at entries are the interesting ones.
        at_entry = st.sampled_from(self.off_model.keys) if self.off_model.keys else st.just(BASE)
        offset = data.draw(st.one_of(at_entry, st.integers(BASE, self.next_offset + 2)))
        self.offsets.truncate_to(offset)
        self.times.truncate_to(offset)
        for model in (self.off_model, self.time_model):
            offs = model.keys if model is self.off_model else model.values
            keep = sum(1 for o in offs if o < offset)
            del model.keys[keep:]
            del model.values[keep:]
        self.next_offset = self.off_model.keys[-1] + 1 if self.off_model.keys else BASE
        self.next_position = self.off_model.values[-1] + 1 if self.off_model.values else 0

    @rule()
    def flush(self) -> None:
        self.offsets.flush()
        self.times.flush()

    @rule()
    def reopen(self) -> None:
        self.offsets.close()
        self.times.close()
        self.offsets = OffsetIndex(self.offsets.path, BASE)
        self.times = TimeIndex(self.times.path, BASE)
        self.offsets.sanity_check()
        self.times.sanity_check()

    @rule(data=st.data())
    def lookups(self, data: st.DataObject) -> None:
        for _ in range(5):
            offset = data.draw(st.integers(BASE - 3, self.next_offset + 3))
            want = self.off_model.floor(offset)
            got = self.offsets.lookup(offset)
            assert got == (OffsetPosition(*want) if want else OffsetPosition(BASE, 0))
            ts = data.draw(st.integers(-10, 10**13 + 10))
            want_t = self.time_model.lower(ts)
            got_t = self.times.lookup_before(ts)
            assert got_t == (TimestampOffset(*want_t) if want_t else TimestampOffset(-1, BASE))

    @invariant()
    def entries_match_the_model(self) -> None:
        assert self.offsets.entries() == [
            OffsetPosition(k, v) for k, v in zip(self.off_model.keys, self.off_model.values, strict=True)
        ]
        assert self.times.entries() == [
            TimestampOffset(k, v) for k, v in zip(self.time_model.keys, self.time_model.values, strict=True)
        ]
        assert len(self.offsets) == len(self.off_model.keys)
        last = self.offsets.last_entry()
        assert last == (OffsetPosition(self.off_model.keys[-1], self.off_model.values[-1])
                        if self.off_model.keys else OffsetPosition(BASE, 0))

    @precondition(lambda self: bool(self.off_model.keys))
    @invariant()
    def disk_matches_after_flush(self) -> None:
        self.offsets.flush()
        self.times.flush()
        with open(self.offsets.path, "rb") as f:
            raw = f.read()
        assert [(BASE + r, p) for r, p in struct.iter_unpack("<II", raw)] == list(
            zip(self.off_model.keys, self.off_model.values, strict=True)
        )
        with open(self.times.path, "rb") as f:
            raw = f.read()
        assert [(t, BASE + r) for t, r in struct.iter_unpack("<qI", raw)] == list(
            zip(self.time_model.keys, self.time_model.values, strict=True)
        )


IndexMachine.TestCase.settings = settings(max_examples=60, stateful_step_count=30, deadline=None)
test_index_against_sorted_dict_model = IndexMachine.TestCase


# ----------------------------------------------------------------------------- files on disk


def test_entry_layout_is_fixed_width_little_endian(tmp_path) -> None:
    idx = OffsetIndex(str(tmp_path / "a.index"), 100)
    idx.reset()
    idx.append(100, 0)
    idx.append(105, 4096)
    tix = TimeIndex(str(tmp_path / "a.timeindex"), 100)
    tix.reset()
    tix.maybe_append(-1 + 2**40, 105)
    idx.close()
    tix.close()
    assert (tmp_path / "a.index").read_bytes() == struct.pack("<IIII", 0, 0, 5, 4096)
    assert (tmp_path / "a.timeindex").read_bytes() == struct.pack("<qI", 2**40 - 1, 5)


def test_missing_file_is_an_empty_index(tmp_path) -> None:
    idx = OffsetIndex(str(tmp_path / "none.index"), 7)
    assert len(idx) == 0
    assert idx.lookup(100) == OffsetPosition(7, 0)
    tix = TimeIndex(str(tmp_path / "none.timeindex"), 7)
    assert tix.lookup_before(5) == TimestampOffset(-1, 7)
    idx.sanity_check()
    tix.sanity_check()


@pytest.mark.parametrize("kind", [OffsetIndex, TimeIndex])
def test_torn_file_fails_the_sanity_check_but_keeps_whole_entries(tmp_path, kind) -> None:
    path = str(tmp_path / "t.idx")
    idx = kind(path, 0)
    idx.reset()
    for i in range(3):
        if kind is OffsetIndex:
            idx.append(i * 10, i * 100)
        else:
            idx.maybe_append(1000 + i, i * 10)
    idx.close()
    with open(path, "ab") as f:
        f.write(b"\x01\x02\x03")
    again = kind(path, 0)
    assert len(again) == 3
    with pytest.raises(CorruptRecordError) as info:
        again.sanity_check()
    assert path in info.value.message and "3 trailing bytes" in info.value.message


@pytest.mark.parametrize("kind", [OffsetIndex, TimeIndex])
def test_non_increasing_entries_fail_the_sanity_check(tmp_path, kind) -> None:
    path = str(tmp_path / "t.idx")
    entry = kind._entry
    with open(path, "wb") as f:
        f.write(entry.pack(5, 10) + entry.pack(5, 20))
    with pytest.raises(CorruptRecordError, match="does not exceed"):
        kind(path, 0).sanity_check()


def test_time_index_offsets_going_backwards_fail_the_sanity_check(tmp_path) -> None:
    path = str(tmp_path / "t.timeindex")
    with open(path, "wb") as f:
        f.write(struct.pack("<qI", 10, 5) + struct.pack("<qI", 20, 4))
    with pytest.raises(CorruptRecordError, match="backwards"):
        TimeIndex(path, 0).sanity_check()


def test_truncate_and_reopen(tmp_path) -> None:
    idx = OffsetIndex(str(tmp_path / "a.index"), 0)
    idx.reset()
    for i in range(10):
        idx.append(i * 3, i * 50)
    idx.truncate_to(13)  # keeps 0, 3, 6, 9, 12
    idx.append(20, 1000)
    idx.close()
    again = OffsetIndex(str(tmp_path / "a.index"), 0)
    assert [e.offset for e in again.entries()] == [0, 3, 6, 9, 12, 20]
    assert again.lookup(19) == OffsetPosition(12, 200)
    assert os.path.getsize(tmp_path / "a.index") == 6 * 8


def test_reset_delete_and_rename(tmp_path) -> None:
    idx = OffsetIndex(str(tmp_path / "a.index"), 0)
    idx.reset()
    idx.append(0, 10)
    idx.rename(str(tmp_path / "b.index"))
    assert not (tmp_path / "a.index").exists()
    assert OffsetIndex(str(tmp_path / "b.index"), 0).entries() == [OffsetPosition(0, 10)]
    idx.reset()
    assert len(idx) == 0 and os.path.getsize(tmp_path / "b.index") == 0
    idx.delete()
    assert not (tmp_path / "b.index").exists()
    idx.delete()  # idempotent
