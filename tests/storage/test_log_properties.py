"""Property-based test of the partition log against a simple model (DESIGN §1 I1-I3, §3).

A hypothesis state machine drives one :class:`~logstore.storage.log.Log` through random
appends (random batch sizes, keys, values, headers and timestamps, nulls,
lz4/zstd), rolls, retention by bytes and by time on an injected clock,
``delete_records_before``, ``truncate_to``, clean reopens, and unclean reopens
that may also lose the unflushed tail of the active segment (as an OS crash
would) or find garbage after it.

The model is a list of stored batches, each with its offsets, records and the
exact bytes :func:`~logstore.record.encode_batch` produces for it. After every
step the log must agree with it: offsets, bounds, segment sizes and max
timestamps, every read (decoded records *and* the raw stored bytes), offset
index entries (derived independently from batch positions and
``index.interval.bytes``) and lookups (against a sorted-dict model), time index
promises and lookups, ``find_offset_for_timestamp`` (against a linear scan)
and the leader epoch cache.
"""

from __future__ import annotations

import bisect
import gc
import os
import shutil
import tempfile
from dataclasses import dataclass

import pytest
from hypothesis import HealthCheck, settings
from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, initialize, invariant, rule
from storage_helpers import SCHEMA, ManualClock, Record, config, make_batch, records_of

from logstore.errors import OffsetOutOfRangeError
from logstore.record import encode_batch
from logstore.record_reader import parse_batch_at
from logstore.storage.config import LogConfig
from logstore.storage.index import OffsetPosition, TimestampOffset
from logstore.storage.log import Log

pytestmark = pytest.mark.slow


@dataclass
class ModelBatch:
    base_offset: int
    records: list[Record]
    data: bytes  # the exact stored message
    epoch: int

    @property
    def next_offset(self) -> int:
        return self.records[-1][0] + 1

    @property
    def max_timestamp(self) -> int:
        return max(r[1] for r in self.records)


NOW = 1_700_000_000_000
keys = st.one_of(st.none(), st.binary(max_size=16))
values = st.one_of(st.none(), st.binary(max_size=48), st.binary(min_size=200, max_size=700))
headers = st.one_of(
    st.none(),
    st.lists(st.tuples(st.text("abcxyz-", max_size=5), st.binary(max_size=8)), max_size=2),
)
drafts = st.lists(
    st.tuples(st.integers(NOW - 300_000, NOW + 300_000), keys, values, headers), min_size=1, max_size=12
)


class LogMachine(RuleBasedStateMachine):
    def __init__(self) -> None:
        super().__init__()
        self.root = tempfile.mkdtemp(prefix="log-property-")
        self.dir = os.path.join(self.root, "t-0")
        self.clock = ManualClock(NOW)
        self.batches: list[ModelBatch] = []  # on disk (maybe below the log start), in offset order
        self.log_start = 0
        self.leo = 0
        self.epoch = 0

    # ------------------------------------------------------------------ setup / teardown

    @initialize(segment_bytes=st.sampled_from([1024, 3000, 20_000]),
                interval=st.sampled_from([0, 700, 1 << 20]))
    def open_log(self, segment_bytes: int, interval: int) -> None:
        self.cfg = config(segment_bytes=segment_bytes, index_interval_bytes=interval,
                          retention_ms=-1, retention_bytes=-1)
        self.log = self._open()

    def _open(self) -> Log:
        return Log.open(self.dir, config=self.cfg, schema=SCHEMA, clock=self.clock)

    def teardown(self) -> None:
        log = getattr(self, "log", None)
        if log is not None and log.offline_reason is None:
            log.close()
        shutil.rmtree(self.root, ignore_errors=True)

    # ------------------------------------------------------------------ model helpers

    def visible(self) -> list[Record]:
        return [r for b in self.batches for r in b.records if r[0] >= self.log_start]

    def batches_in(self, base: int, end: int) -> list[ModelBatch]:
        return [b for b in self.batches if base <= b.base_offset < end]

    def segment_ranges(self) -> list[tuple[int, int]]:
        """(base offset, next offset) of each segment, as the log reports them."""
        return [(s.base_offset, s.next_offset) for s in self.log.segments]

    def drop_batches_below(self, offset: int) -> None:
        self.batches = [b for b in self.batches if b.base_offset >= offset]

    # ------------------------------------------------------------------ rules: writing

    @rule(drafts=drafts, compression=st.sampled_from([None, None, None, "lz4", "zstd"]),
          fsync=st.booleans(), new_epoch=st.integers(0, 5))
    def append(self, drafts, compression, fsync, new_epoch) -> None:
        if new_epoch == 0:
            self.epoch += 1
        batch = make_batch(drafts)
        res = self.log.append(batch, leader_epoch=self.epoch, compression=compression, fsync=fsync)
        assert res.base_offset == self.leo
        assert res.last_offset == self.leo + len(drafts) - 1
        assert res.max_timestamp == max(d[0] for d in drafts)
        data = encode_batch(batch, base_offset=res.base_offset, leader_epoch=self.epoch,
                            compression=compression).to_bytes()
        records = [(res.base_offset + i, *d) for i, d in enumerate(drafts)]
        self.batches.append(ModelBatch(res.base_offset, records, data, self.epoch))
        self.leo = res.last_offset + 1
        if fsync:
            assert self.log.recovery_point == self.leo

    @rule()
    def roll(self) -> None:
        before = self.segment_ranges()
        self.log.roll()
        after = self.segment_ranges()
        if before[-1][0] == before[-1][1]:
            assert after == before  # an empty active segment does not roll
        else:
            assert after == [*before, (self.leo, self.leo)]

    @rule(ms=st.integers(0, 400_000))
    def advance_clock(self, ms: int) -> None:
        self.clock.advance(ms)

    @rule(by_time=st.booleans(), limit=st.integers(0, 30_000), retention_ms=st.integers(0, 400_000))
    def enforce_retention(self, by_time: bool, limit: int, retention_ms: int) -> None:
        segments = self.log.segments
        closed = segments[:-1]
        doomed = 0
        if by_time:
            horizon = self.clock.now_ms - retention_ms
            for seg in closed:
                seg_max = max(b.max_timestamp for b in self.batches_in(seg.base_offset, seg.next_offset))
                if seg_max >= horizon:
                    break
                doomed += 1
            props = {"retention.ms": retention_ms, "retention.bytes": -1}
        else:
            total = sum(s.size for s in segments)
            for seg in closed:
                if total - seg.size < limit:
                    break
                doomed += 1
                total -= seg.size
            props = {"retention.ms": -1, "retention.bytes": limit}
        self.log.update_config(LogConfig.from_properties(props, base=self.cfg))
        try:
            assert self.log.enforce_retention() == doomed
        finally:
            self.log.update_config(self.cfg)
        if doomed:
            first = segments[doomed].base_offset
            self.log_start = max(self.log_start, first)
            self.drop_batches_below(first)

    @rule(data=st.data())
    def delete_records_before(self, data: st.DataObject) -> None:
        offset = data.draw(st.integers(self.log_start, self.leo))
        before = self.log.segments
        assert self.log.delete_records_before(offset) == max(offset, self.log_start)
        if offset > self.log_start:
            # Segments wholly below the new start go (the active one stays). A call that
            # does not move the start deletes nothing.
            survivors = [s for s in before[:-1] if s.next_offset > offset] + [before[-1]]
        else:
            survivors = before
        self.log_start = max(offset, self.log_start)
        assert [s.base_offset for s in self.log.segments] == [s.base_offset for s in survivors]
        self.drop_batches_below(self.log.segments[0].base_offset)

    @rule(data=st.data())
    def truncate_to(self, data: st.DataObject) -> None:
        offset = data.draw(st.one_of(
            st.integers(self.log_start, self.leo),
            st.sampled_from([b.base_offset for b in self.batches] or [self.leo]),
        ))
        if offset < self.log_start:
            with pytest.raises(OffsetOutOfRangeError):
                self.log.truncate_to(offset)
            return
        self.log.truncate_to(offset)
        if offset < self.leo:
            self.batches = [b for b in self.batches if b.base_offset < offset]
            self.leo = self.batches[-1].next_offset if self.batches else offset
            assert self.leo >= offset
            assert self.log.recovery_point == self.leo

    @rule()
    def reopen_clean(self) -> None:
        self.log.close()
        self.log = self._open()
        assert self.log.recovery_point == self.leo

    @rule(damage=st.sampled_from(["none", "lose unflushed tail", "garbage after"]), data=st.data())
    def reopen_unclean(self, damage: str, data: st.DataObject) -> None:
        active = self.log.segments[-1]
        recovery_point = self.log.recovery_point
        path = active.path
        positions = []  # (position, batch) of the active segment's batches
        pos = active.data_start
        for b in self.batches_in(active.base_offset, self.leo + 1):
            positions.append((pos, b))
            pos += len(b.data)
        assert pos == active.size
        self.log = None  # type: ignore[assignment]
        del active
        gc.collect()  # nothing of the old log may write after this point
        unflushed = [(p, b) for p, b in positions if b.base_offset >= recovery_point]
        if damage == "lose unflushed tail" and unflushed:
            cut = data.draw(st.integers(unflushed[0][0], positions[-1][0] + len(positions[-1][1].data) - 1))
            os.truncate(path, cut)
            lost = {b.base_offset for p, b in positions if p + len(b.data) > cut}
            self.batches = [b for b in self.batches if b.base_offset not in lost]
            self.leo = min(lost)
        elif damage == "garbage after":
            with open(path, "ab") as f:
                f.write(data.draw(st.binary(min_size=1, max_size=64)))
        self.log = self._open()
        if self.leo < self.log_start:
            # The log start offset outlived the records below it: the log starts over there.
            self.batches = []
            self.leo = self.log_start
        assert self.log.recovery_point == self.leo

    # ------------------------------------------------------------------ rules: reading

    @rule(max_bytes=st.sampled_from([0, 1, 500, 3000, 1 << 20]))
    def read_everything(self, max_bytes: int) -> None:
        by_base = {b.base_offset: b for b in self.batches}
        offset = self.log_start
        got: list[Record] = []
        while offset < self.leo:
            res = self.log.read(offset, max_bytes=max_bytes)
            assert res.batches, f"nothing read at {offset} < LEO {self.leo}"
            assert (res.log_start_offset, res.log_end_offset) == (self.log_start, self.leo)
            assert bytes(res.data) == b"".join(bytes(b.data) for b in res.batches)
            assert res.batches[0].header.base_offset <= offset < res.batches[0].header.next_offset
            for b in res.batches:
                model = by_base[b.header.base_offset]
                assert bytes(b.data) == model.data, f"stored bytes of batch {model.base_offset} changed"
                assert b.header.leader_epoch == model.epoch
            if max_bytes >= 1 << 20:
                assert len(res.batches) >= 1
            elif len(res.batches) > 1:
                assert len(res.data) <= max_bytes
            got.extend(records_of(res.decode()))
            assert res.next_offset == res.batches[-1].header.next_offset
            offset = res.next_offset
        assert got == self.visible()
        offsets = [r[0] for r in got]
        assert offsets == sorted(set(offsets))

    @rule(data=st.data())
    def read_from_anywhere(self, data: st.DataObject) -> None:
        offset = data.draw(st.integers(self.log_start, self.leo))
        upper = data.draw(st.one_of(st.none(), st.integers(offset, self.leo + 5)))
        res = self.log.read(offset, max_bytes=1 << 20, upper_bound=upper)
        bound = self.leo if upper is None else min(upper, self.leo)
        want = [r for r in self.visible() if r[0] >= offset]
        got = records_of(res.decode())
        assert got == want[: len(got)]
        for b in res.batches:
            assert b.header.next_offset <= bound
        if want and want[0][0] < bound and not got:
            # Nothing returned although a record below the bound exists: only allowed
            # when the batch holding it crosses the bound.
            holder = next(b for b in self.batches if b.base_offset <= want[0][0] < b.next_offset)
            assert holder.next_offset > bound
        for bad in (self.log_start - 1, self.leo + 1):
            if bad >= 0 or bad < self.log_start:
                with pytest.raises(OffsetOutOfRangeError):
                    self.log.read(bad, max_bytes=100)

    @rule(data=st.data())
    def find_offset_for_timestamp(self, data: st.DataObject) -> None:
        visible = self.visible()
        stamps = [r[1] for r in visible]
        ts = data.draw(st.one_of(st.integers(NOW - 310_000, NOW + 310_000),
                                 st.sampled_from(stamps or [NOW])))
        want = next((r[0] for r in visible if r[1] >= ts), None)
        assert self.log.find_offset_for_timestamp(ts) == want

    # ------------------------------------------------------------------ invariants

    @invariant()
    def bounds_and_segments(self) -> None:
        if getattr(self, "log", None) is None:
            return
        log = self.log
        assert (log.log_start_offset, log.log_end_offset) == (self.log_start, self.leo)
        segments = log.segments
        assert segments[0].base_offset <= self.log_start <= self.leo
        assert segments[-1].next_offset == self.leo
        for a, b in zip(segments, segments[1:], strict=False):
            assert a.next_offset <= b.base_offset
        on_disk = sorted(n for n in os.listdir(self.dir) if n.endswith(".arrow"))
        assert on_disk == [f"{s.base_offset:020d}.arrow" for s in segments]
        for seg in segments:
            mine = self.batches_in(seg.base_offset, seg.next_offset if seg is not segments[-1] else self.leo + 1)
            assert seg.size == seg.data_start + sum(len(b.data) for b in mine)
            assert seg.max_timestamp == max((b.max_timestamp for b in mine), default=-1)
            if mine:
                assert seg.next_offset == mine[-1].next_offset
        covered = [b for s in segments for b in self.batches_in(s.base_offset, s.next_offset)]
        assert covered == self.batches

    @invariant()
    def indexes(self) -> None:
        if getattr(self, "log", None) is None:
            return
        interval = self.cfg.index_interval_bytes
        segments = self.log.segments
        for seg in segments:
            with open(seg.path, "rb") as f:
                file_bytes = memoryview(f.read())
            # Offset index: derived independently from the batch positions.
            expected: list[OffsetPosition] = []
            pos, since = seg.data_start, 0
            for i, b in enumerate(self.batches_in(seg.base_offset, seg.next_offset)):
                if i == 0 or since >= interval:
                    expected.append(OffsetPosition(b.base_offset, pos))
                    since = 0
                since += len(b.data)
                pos += len(b.data)
            assert seg.offset_index.entries() == expected
            for e in expected:
                assert parse_batch_at(file_bytes, e.position).header.base_offset == e.offset
            keys = [e.offset for e in expected]
            for probe in {seg.base_offset - 1, seg.base_offset, *keys, *(k + 1 for k in keys), seg.next_offset}:
                i = bisect.bisect_right(keys, probe) - 1
                assert seg.offset_index.lookup(probe) == (expected[i] if i >= 0 else OffsetPosition(seg.base_offset, 0))
            # Time index: each entry's promise, and lookups against the entries as a sorted dict.
            entries = seg.time_index.entries()
            mine = self.batches_in(seg.base_offset, seg.next_offset)
            for e in entries:
                covered = [b for b in mine if b.base_offset <= e.offset]
                assert covered and e.timestamp == max(b.max_timestamp for b in covered)
            stamps = [e.timestamp for e in entries]
            assert stamps == sorted(set(stamps))
            assert [e.offset for e in entries] == sorted(e.offset for e in entries)
            if seg is not segments[-1] and mine:
                assert entries[-1].timestamp == seg.max_timestamp
            for probe in {NOW - 400_000, *stamps, *(t + 1 for t in stamps), NOW + 400_000}:
                i = bisect.bisect_left(stamps, probe) - 1
                assert seg.time_index.lookup_before(probe) == (
                    entries[i] if i >= 0 else TimestampOffset(-1, seg.base_offset)
                )

    @invariant()
    def leader_epochs(self) -> None:
        if getattr(self, "log", None) is None:
            return
        entries = self.log.epochs.entries
        assert [e.epoch for e in entries] == sorted({e.epoch for e in entries})
        assert [e.start_offset for e in entries] == sorted({e.start_offset for e in entries})
        for e in entries:
            assert self.log_start <= e.start_offset < max(self.leo, self.log_start + 1)
        starts = [e.start_offset for e in entries]
        for b in self.batches:
            if b.next_offset <= self.log_start:
                continue
            i = bisect.bisect_right(starts, max(b.base_offset, self.log_start)) - 1
            assert i >= 0 and entries[i].epoch == b.epoch, (b.base_offset, b.epoch, entries)


LogMachine.TestCase.settings = settings(
    max_examples=int(os.environ.get("LOG_PROPERTY_EXAMPLES", "30")), stateful_step_count=25, deadline=None,
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large],
)
test_log_against_model = LogMachine.TestCase
