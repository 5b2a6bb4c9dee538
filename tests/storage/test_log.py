"""The partition log (logstore.storage.log) and its segments: behaviour, bad input, files on disk.

Reopen-from-disk tests cover every file of DESIGN §3: segments, .index,
.timeindex, leader-epoch-checkpoint and log-start-offset.
"""

from __future__ import annotations

import os
import struct

import numpy as np
import pyarrow as pa
import pyarrow.ipc
import pytest
from storage_helpers import (
    SCHEMA,
    config,
    make_batch,
    read_all,
    records_of,
    simple_batch,
)

from logstore.errors import (
    CorruptRecordError,
    InvalidTimestampError,
    LogOfflineError,
    OffsetOutOfRangeError,
    RecordTooLargeError,
    SchemaMismatchError,
)
from logstore.record import build_batch, encode_batch, typed_schema
from logstore.storage.index import OffsetIndex, TimeIndex
from logstore.storage.leader_epoch import LEADER_EPOCH_CHECKPOINT, EpochEntry, LeaderEpochCache
from logstore.storage.log import CLEAN_SHUTDOWN_FILE, LOG_START_OFFSET_FILE, Log
from logstore.storage.segment import Segment, segment_file_name

VALUE_SCHEMA = pa.schema([pa.field("id", pa.int64(), nullable=False), pa.field("name", pa.string())])
TYPED = typed_schema(VALUE_SCHEMA)


def open_log(path, cfg=None, clock=None, schema=SCHEMA) -> Log:
    kwargs = {"clock": clock} if clock is not None else {}
    return Log.open(str(path), config=cfg or config(), schema=schema, **kwargs)


def typed_batch(ids: list[int], schema: pa.Schema = TYPED, **extra: list) -> pa.RecordBatch:
    value_type = schema.field("value").type
    columns = {"id": ids, "name": [f"n{i}" for i in ids], **extra}
    values = pa.StructArray.from_arrays(
        [pa.array(columns[value_type.field(i).name], value_type.field(i).type)
         for i in range(value_type.num_fields)],
        fields=[value_type.field(i) for i in range(value_type.num_fields)],
    )
    return build_batch(schema, values=values, timestamps_ms=[1000 + i for i in ids])


def file_names(log: Log) -> set[str]:
    return set(os.listdir(log.directory))


# ----------------------------------------------------------------------------- append and read


def test_append_assigns_consecutive_offsets_and_reads_back(tmp_path) -> None:
    log = open_log(tmp_path / "t-0")
    assert (log.log_start_offset, log.log_end_offset) == (0, 0)
    r1 = log.append(simple_batch(3))
    r2 = log.append(simple_batch(2, tag=b"w"))
    assert (r1.base_offset, r1.last_offset, r2.base_offset, r2.last_offset) == (0, 2, 3, 4)
    assert r1.max_timestamp == 1002 and r1.segment_base_offset == 0
    assert log.log_end_offset == 5
    got = read_all(log)
    assert [r[0] for r in got] == [0, 1, 2, 3, 4]
    assert [r[3] for r in got] == [b"v0", b"v1", b"v2", b"w0", b"w1"]
    # Reading from the middle of a batch returns the whole batch; decode() slices it.
    res = log.read(1, max_bytes=1 << 20)
    assert res.batches[0].header.base_offset == 0
    assert [r[0] for r in records_of(res.decode())] == [1, 2, 3, 4]
    assert res.to_table().num_rows == 4


def test_read_returns_exactly_the_stored_bytes(tmp_path) -> None:
    log = open_log(tmp_path / "t-0")
    batches = [simple_batch(4, tag=b"a"), simple_batch(2, tag=b"b")]
    expected = b""
    for b in batches:
        res = log.append(b, leader_epoch=3, producer_id=9, producer_epoch=1, base_sequence=0)
        expected += encode_batch(b, base_offset=res.base_offset, leader_epoch=3, producer_id=9,
                                 producer_epoch=1, base_sequence=0).to_bytes()
    res = log.read(0, max_bytes=1 << 20)
    assert bytes(res.data) == expected
    with open(log.segments[0].path, "rb") as f:
        assert f.read()[log.segments[0].data_start:] == expected


def test_read_bounds(tmp_path) -> None:
    log = open_log(tmp_path / "t-0")
    for _ in range(5):
        log.append(simple_batch(2))
    # max_bytes: whole batches only, but at least one.
    one = log.read(0, max_bytes=1)
    assert len(one.batches) == 1 and one.next_offset == 2
    assert log.read(0, max_bytes=1, min_one_batch=False).batches == []
    size = one.batches[0].size
    assert len(log.read(0, max_bytes=2 * size).batches) == 2
    assert len(log.read(0, max_bytes=2 * size + size - 1).batches) == 2
    # upper_bound is exclusive and never splits a batch.
    assert log.read(0, max_bytes=1 << 20, upper_bound=4).next_offset == 4
    assert log.read(0, max_bytes=1 << 20, upper_bound=5).next_offset == 4
    assert log.read(4, max_bytes=1 << 20, upper_bound=4).batches == []
    assert log.read(0, max_bytes=1 << 20, upper_bound=100).next_offset == 10  # clamped to the LEO
    # At the LEO: nothing, no error. Beyond it, or below the start: OFFSET_OUT_OF_RANGE.
    at_end = log.read(10, max_bytes=1 << 20)
    assert at_end.batches == [] and at_end.next_offset == 10 and at_end.log_end_offset == 10
    for bad in (11, -1):
        with pytest.raises(OffsetOutOfRangeError) as info:
            log.read(bad, max_bytes=1 << 20)
        assert info.value.code == "OFFSET_OUT_OF_RANGE"
        assert "log start offset 0" in info.value.message and "log end offset 10" in info.value.message
    log.delete_records_before(5)
    with pytest.raises(OffsetOutOfRangeError):
        log.read(4, max_bytes=1 << 20)
    assert [r[0] for r in read_all(log)] == [5, 6, 7, 8, 9]


def test_reads_span_segments_one_segment_per_read(tmp_path) -> None:
    log = open_log(tmp_path / "t-0", config(segment_bytes=1024))
    for i in range(6):
        log.append(simple_batch(3, tag=b"s%d-" % i))
    assert len(log.segments) > 2
    res = log.read(0, max_bytes=1 << 30)
    assert {b.header.base_offset for b in res.batches} <= set(range(log.segments[1].base_offset))
    assert [r[0] for r in read_all(log)] == list(range(18))


def test_wait_for_data(tmp_path) -> None:
    log = open_log(tmp_path / "t-0")
    assert log.wait_for_data(0, 0.01) is False
    log.append(simple_batch(1))
    assert log.wait_for_data(0, 0.01) is True


def test_log_append_time_replaces_timestamps(tmp_path, clock) -> None:
    log = open_log(tmp_path / "t-0", config(message_timestamp_type="LogAppendTime"), clock)
    res = log.append(simple_batch(3, ts=5))
    assert res.max_timestamp == clock.now_ms == res.log_append_time_ms
    assert {r[1] for r in read_all(log)} == {clock.now_ms}


# ----------------------------------------------------------------------------- bad input


def assert_nothing_written(log: Log, before: tuple) -> None:
    assert (log.log_end_offset, log.size_bytes, len(log.segments)) == before


def state(log: Log) -> tuple:
    return (log.log_end_offset, log.size_bytes, len(log.segments))


def test_wrong_schema_is_rejected_and_nothing_is_written(tmp_path) -> None:
    log = open_log(tmp_path / "t-0")
    log.append(simple_batch(1))
    before = state(log)
    wrong_value = pa.schema([f if f.name != "value" else pa.field("value", pa.string()) for f in SCHEMA])
    wrong_names = pa.schema([f if f.name != "key" else pa.field("k", pa.binary()) for f in SCHEMA])
    bad_batches = [
        build_batch(wrong_value, values=["x"], timestamps_ms=[1]),
        pa.RecordBatch.from_arrays(simple_batch(1).columns, schema=wrong_names),
        typed_batch([1]),
    ]
    for bad in bad_batches:
        with pytest.raises(SchemaMismatchError) as info:
            log.append(bad)
        assert info.value.code == "SCHEMA_MISMATCH"
    assert_nothing_written(log, before)
    assert log.append(simple_batch(1)).base_offset == 1  # the log is still healthy


def test_oversized_batch_is_rejected_and_nothing_is_written(tmp_path) -> None:
    log = open_log(tmp_path / "t-0", config(max_message_bytes=4096))
    log.append(simple_batch(1))
    before = state(log)
    big = make_batch([(1, None, os.urandom(5000), None)])
    with pytest.raises(RecordTooLargeError) as info:
        log.append(big)
    assert info.value.code == "MESSAGE_TOO_LARGE" and "max.message.bytes" in info.value.message
    assert_nothing_written(log, before)
    log.close()
    log = open_log(tmp_path / "t-0", config(max_message_bytes=4096))
    assert len(read_all(log)) == 1


def test_null_timestamps_are_rejected_and_nothing_is_written(tmp_path) -> None:
    log = open_log(tmp_path / "t-0")
    before = state(log)
    ts = pa.array([None, 1], pa.timestamp("ms", tz="UTC"))
    with pytest.raises(InvalidTimestampError):
        log.append(build_batch(SCHEMA, values=[b"a", b"b"], timestamps_ms=ts))
    assert_nothing_written(log, before)


def test_typed_topic_schema_evolution(tmp_path) -> None:
    log = open_log(tmp_path / "t-0", schema=TYPED)
    log.append(typed_batch([1, 2]))
    first = log.segments[-1]
    # Adding a nullable value column is compatible: a new segment carries the new schema.
    evolved_values = pa.schema([*VALUE_SCHEMA, pa.field("score", pa.float64())])
    evolved = typed_schema(evolved_values)
    res = log.append(typed_batch([3], evolved, score=[0.5]))
    assert res.segment_base_offset == 2 and len(log.segments) == 2
    assert log.schema.equals(evolved, check_metadata=False)
    assert pyarrow.ipc.open_stream(log.segments[-1].path).schema.equals(evolved, check_metadata=False)
    assert pyarrow.ipc.open_stream(first.path).schema.equals(TYPED, check_metadata=False)
    # Old and new batches both decode with their own segment's schema.
    assert log.read(0, max_bytes=1 << 20).decode()[0].column("value").to_pylist() == [
        {"id": 1, "name": "n1"}, {"id": 2, "name": "n2"},
    ]
    assert log.read(2, max_bytes=1 << 20).decode()[0].column("value").to_pylist() == [
        {"id": 3, "name": "n3", "score": 0.5},
    ]
    # Going back, retyping, or adding a non-nullable column is rejected.
    before = state(log)
    rejected = [
        typed_batch([4]),  # removes "score"
        typed_batch([4], typed_schema(pa.schema([*VALUE_SCHEMA, pa.field("score", pa.int64())])), score=[1]),
        typed_batch([4], typed_schema(pa.schema([*evolved_values, pa.field("x", pa.int8(), nullable=False)])),
                    score=[1.0], x=[1]),
        typed_batch([4], typed_schema(pa.schema([VALUE_SCHEMA.field("id"), pa.field("name", pa.large_string()),
                                                 pa.field("score", pa.float64())])), score=[1.0]),
    ]
    for bad in rejected:
        with pytest.raises(SchemaMismatchError):
            log.append(bad)
    assert_nothing_written(log, before)
    # The evolved schema survives a reopen (it is the newest segment's schema).
    log.close()
    log = open_log(tmp_path / "t-0", schema=TYPED)
    assert log.schema.equals(evolved, check_metadata=False)
    assert log.append(typed_batch([5], evolved, score=[None])).base_offset == 3


def test_evolution_on_an_empty_active_segment_replaces_it(tmp_path) -> None:
    log = open_log(tmp_path / "t-0", schema=TYPED)
    evolved = typed_schema(pa.schema([*VALUE_SCHEMA, pa.field("score", pa.float64())]))
    log.append(typed_batch([1], evolved, score=[1.0]))
    assert len(log.segments) == 1
    assert pyarrow.ipc.open_stream(log.segments[0].path).schema.equals(evolved, check_metadata=False)


# ----------------------------------------------------------------------------- flush policy


def test_flush_messages_triggers_fsync(tmp_path) -> None:
    log = open_log(tmp_path / "t-0", config(flush_messages=5))
    log.append(simple_batch(3))
    assert log.recovery_point == 0
    log.append(simple_batch(1))
    assert log.recovery_point == 0
    log.append(simple_batch(1))  # 5 unflushed records
    assert log.recovery_point == 5
    log.append(simple_batch(4))
    assert log.recovery_point == 5


def test_flush_ms_triggers_fsync_on_append_and_maybe_flush(tmp_path, clock) -> None:
    log = open_log(tmp_path / "t-0", config(flush_ms=1000), clock)
    log.append(simple_batch(1))
    assert log.recovery_point == 0
    assert log.maybe_flush() is False
    clock.advance(999)
    log.append(simple_batch(1))
    assert log.recovery_point == 0
    clock.advance(1)
    assert log.maybe_flush() is True
    assert log.recovery_point == 2
    assert log.maybe_flush() is False  # nothing pending
    clock.advance(5000)
    log.append(simple_batch(1))  # due: flushed as part of the append
    assert log.recovery_point == 3


def test_explicit_fsync_and_defaults(tmp_path) -> None:
    log = open_log(tmp_path / "t-0")
    log.append(simple_batch(2))
    assert log.recovery_point == 0  # default policy: no fsync per append
    log.append(simple_batch(2), fsync=True)
    assert log.recovery_point == 4
    log.roll()
    log.append(simple_batch(1))
    assert log.recovery_point == 4
    log.flush()
    assert log.recovery_point == 5


# ----------------------------------------------------------------------------- rolling and retention


def test_segments_roll_by_size(tmp_path) -> None:
    log = open_log(tmp_path / "t-0", config(segment_bytes=8192))
    batch = simple_batch(2)
    size = encode_batch(batch, base_offset=0).size
    n = (8192 - log.segments[0].data_start) // size
    for _ in range(n):
        log.append(batch)
    assert len(log.segments) == 1 and log.segments[0].size + size > 8192
    log.append(batch)
    assert [s.base_offset for s in log.segments] == [0, 2 * n]
    assert log.segments[0].size <= 8192
    # A batch larger than segment.bytes still goes into a segment of its own.
    log.append(make_batch([(1, None, b"x" * 10_000, None)]))
    assert len(log.segments) == 3 and log.segments[-1].base_offset == 2 * n + 2
    names = {n for n in file_names(log) if n.endswith(".arrow")}
    assert names == {segment_file_name(s.base_offset) for s in log.segments}


def test_segments_roll_by_age_on_the_log_clock(tmp_path, clock) -> None:
    log = open_log(tmp_path / "t-0", config(segment_ms=60_000), clock)
    log.append(simple_batch(1))
    clock.advance(59_999)
    log.append(simple_batch(1))
    assert len(log.segments) == 1
    clock.advance(1)
    log.append(simple_batch(1))
    assert [s.base_offset for s in log.segments] == [0, 2]
    clock.advance(30_000)
    log.append(simple_batch(1))
    assert len(log.segments) == 2  # the new segment's age counts from its creation


def test_retention_bytes_deletes_oldest_closed_segments(tmp_path) -> None:
    log = open_log(tmp_path / "t-0", config(segment_bytes=1024))
    for i in range(6):
        log.append(simple_batch(2, tag=b"%d" % i))
    segs = log.segments
    assert len(segs) >= 4
    keep_bytes = sum(s.size for s in segs[-2:])
    log.update_config(config(segment_bytes=1024, retention_bytes=keep_bytes, retention_ms=-1))
    deleted = log.enforce_retention()
    assert deleted == len(segs) - 2
    assert log.log_start_offset == segs[-2].base_offset
    assert [s.base_offset for s in log.segments] == [s.base_offset for s in segs[-2:]]
    for s in segs[:-2]:
        assert not os.path.exists(s.path)
        assert not os.path.exists(s.offset_index.path) and not os.path.exists(s.time_index.path)
    assert read_all(log)[0][0] == segs[-2].base_offset
    # The active segment is never deleted, whatever the limit.
    log.update_config(config(segment_bytes=1024, retention_bytes=0, retention_ms=-1))
    log.enforce_retention()
    assert len(log.segments) == 1 and log.log_start_offset == log.segments[0].base_offset


def test_retention_ms_uses_the_largest_timestamp_and_the_injected_clock(tmp_path, clock) -> None:
    now = clock.now_ms
    log = open_log(tmp_path / "t-0", config(retention_ms=10_000), clock)
    log.append(simple_batch(1, ts=now - 50_000))
    log.roll()
    log.append(simple_batch(1, ts=now - 20_000))
    log.append(simple_batch(1, ts=now - 5_000))  # same segment: its max timestamp is recent
    log.roll()
    log.append(simple_batch(1, ts=now - 60_000))  # old but active
    assert log.enforce_retention() == 1
    assert log.log_start_offset == 1
    clock.advance(6_000)
    assert log.enforce_retention() == 1
    assert log.log_start_offset == 3 and len(log.segments) == 1
    # Only with cleanup.policy=delete.
    log2 = open_log(tmp_path / "t-1", config(retention_ms=0, cleanup_policy="compact"), clock)
    log2.append(simple_batch(1, ts=0))
    log2.roll()
    log2.append(simple_batch(1, ts=0))
    assert log2.enforce_retention() == 0


def test_delete_records_before(tmp_path) -> None:
    log = open_log(tmp_path / "t-0", config(segment_bytes=1024))
    for _ in range(4):
        log.append(simple_batch(3))
    first_segment_end = log.segments[0].next_offset
    assert log.delete_records_before(1) == 1
    assert [r[0] for r in read_all(log)][0] == 1
    assert os.path.exists(log.segments[0].path)  # the segment stays until wholly below
    log.delete_records_before(first_segment_end)
    assert log.segments[0].base_offset == first_segment_end
    assert log.delete_records_before(0) == first_segment_end  # never moves back
    with pytest.raises(OffsetOutOfRangeError):
        log.delete_records_before(log.log_end_offset + 1)
    assert log.delete_records_before(log.log_end_offset) == 12
    assert read_all(log) == []
    assert log.append(simple_batch(1)).base_offset == 12


def test_truncate_to(tmp_path) -> None:
    log = open_log(tmp_path / "t-0", config(segment_bytes=1024))
    for i in range(5):
        log.append(simple_batch(3, tag=b"%d-" % i), leader_epoch=i)
    before = read_all(log)
    log.truncate_to(7)  # inside the batch [6, 8]: kept whole
    assert log.log_end_offset == 9
    assert read_all(log) == before[:9]
    log.truncate_to(6)
    assert log.log_end_offset == 6
    assert all(s.base_offset < 6 for s in log.segments)
    assert [e.epoch for e in log.epochs.entries] == [0, 1]
    res = log.append(simple_batch(1, tag=b"new"), leader_epoch=7)
    assert res.base_offset == 6
    assert log.epochs.entries[-1] == EpochEntry(7, 6)
    log.truncate_to(100)  # at or above the LEO: nothing to do
    assert log.log_end_offset == 7
    log.delete_records_before(3)
    with pytest.raises(OffsetOutOfRangeError):
        log.truncate_to(2)
    log.close()
    log = open_log(tmp_path / "t-0", config(segment_bytes=1024))
    got = read_all(log)
    assert got[:-1] == before[3:6]
    assert (got[-1][0], got[-1][3]) == (6, b"new0")
    assert log.epochs.entries == [EpochEntry(1, 3), EpochEntry(7, 6)]


# ----------------------------------------------------------------------------- files on disk


def test_segment_files_are_arrow_ipc_streams(tmp_path) -> None:
    log = open_log(tmp_path / "t-0", config(segment_bytes=2048))
    expected = []
    for i in range(8):
        batch = simple_batch(3 + i % 3, ts=500 * i, tag=b"%d-" % i)
        res = log.append(batch, compression=[None, "lz4", "zstd"][i % 3])
        expected.extend((res.base_offset + j, 500 * i + j) for j in range(batch.num_rows))
    log.close()
    seen = []
    for name in sorted(os.listdir(tmp_path / "t-0")):
        if name.endswith(".arrow"):
            table = pyarrow.ipc.open_stream(str(tmp_path / "t-0" / name)).read_all()
            assert table.schema.equals(SCHEMA, check_metadata=False)
            offsets = table.column("offset").to_pylist()
            assert offsets and offsets[0] == int(name[:-6])
            stamps = table.column("timestamp").cast(pa.int64()).to_pylist()
            seen.extend(zip(offsets, stamps, strict=True))
    assert seen == expected


def test_clean_shutdown_marker(tmp_path) -> None:
    log = open_log(tmp_path / "t-0")
    log.append(simple_batch(1))
    assert CLEAN_SHUTDOWN_FILE not in file_names(log)
    log.close()
    assert CLEAN_SHUTDOWN_FILE in os.listdir(tmp_path / "t-0")
    with pytest.raises(LogOfflineError, match="closed"):
        log.read(0, max_bytes=100)
    log = open_log(tmp_path / "t-0")
    assert CLEAN_SHUTDOWN_FILE not in file_names(log)  # removed while open


def test_reopen_restores_everything(tmp_path, clock) -> None:
    cfg = config(segment_bytes=2048, index_interval_bytes=200)
    log = open_log(tmp_path / "t-0", cfg, clock)
    for i in range(12):
        log.append(simple_batch(2 + i % 4, ts=100 * i, tag=b"%d-" % i), leader_epoch=i // 4)
    log.delete_records_before(5)
    records = read_all(log)
    segments = [(s.base_offset, s.size, s.next_offset, s.max_timestamp) for s in log.segments]
    indexes = [(s.offset_index.entries(), s.time_index.entries()) for s in log.segments]
    epochs = log.epochs.entries
    leo = log.log_end_offset
    ts_answers = {t: log.find_offset_for_timestamp(t) for t in range(-1, 1300, 37)}
    for clean in (True, False):
        if clean:
            log.close()
        else:
            del log
        log = open_log(tmp_path / "t-0", cfg, clock)
        assert (log.log_start_offset, log.log_end_offset) == (5, leo)
        assert [(s.base_offset, s.size, s.next_offset, s.max_timestamp) for s in log.segments] == segments
        # Closed segments keep their index files; the active one's are rebuilt after a crash.
        assert [(s.offset_index.entries(), s.time_index.entries()) for s in log.segments[:-1]] == indexes[:-1]
        assert log.segments[-1].offset_index.entries() == indexes[-1][0]
        assert log.epochs.entries == epochs
        assert read_all(log) == records
        assert {t: log.find_offset_for_timestamp(t) for t in ts_answers} == ts_answers


def test_log_start_offset_file(tmp_path) -> None:
    log = open_log(tmp_path / "t-0")
    log.append(simple_batch(10))
    log.delete_records_before(4)
    with open(tmp_path / "t-0" / LOG_START_OFFSET_FILE) as f:
        assert f.read() == "4\n"
    del log
    assert open_log(tmp_path / "t-0").log_start_offset == 4


def test_leader_epoch_checkpoint_file(tmp_path) -> None:
    log = open_log(tmp_path / "t-0")
    log.append(simple_batch(2), leader_epoch=0)
    log.append(simple_batch(2), leader_epoch=0)
    log.append(simple_batch(2), leader_epoch=3)
    log.append(simple_batch(2))  # no epoch: not recorded
    with open(tmp_path / "t-0" / LEADER_EPOCH_CHECKPOINT) as f:
        assert f.read() == "0 0\n3 4\n"
    assert log.epochs.end_offset_for_epoch(0, log.log_end_offset) == 4
    assert log.epochs.end_offset_for_epoch(3, log.log_end_offset) == 8
    assert log.epochs.latest_epoch == 3
    log.delete_records_before(5)
    assert log.epochs.entries == [EpochEntry(3, 5)]
    log.close()
    assert LeaderEpochCache(str(tmp_path / "t-0")).entries == [EpochEntry(3, 5)]
    with open(tmp_path / "t-0" / LEADER_EPOCH_CHECKPOINT, "w") as f:
        f.write("3 x\n")
    with pytest.raises(Exception, match="line 1 is malformed"):
        LeaderEpochCache(str(tmp_path / "t-0"))


def test_leader_epochs_beyond_the_recovered_log_end_are_forgotten(tmp_path) -> None:
    log = open_log(tmp_path / "t-0")
    log.append(simple_batch(1), leader_epoch=1)
    size = log.segments[-1].size
    log.append(simple_batch(1), leader_epoch=2)
    path = log.segments[-1].path
    del log
    os.truncate(path, size)  # a crash lost the unflushed second batch; the checkpoint kept epoch 2
    log = open_log(tmp_path / "t-0")
    assert log.log_end_offset == 1
    assert log.epochs.entries == [EpochEntry(1, 0)]
    log.append(simple_batch(1), leader_epoch=3)
    assert log.epochs.entries == [EpochEntry(1, 0), EpochEntry(3, 1)]


def segment_with_batches(tmp_path, *, interval: int = 0) -> tuple[Log, list]:
    log = open_log(tmp_path / "t-0", config(index_interval_bytes=interval))
    # Timestamps fall then rise, so the largest is in an early batch.
    for i, ts in enumerate([5000, 4000, 3000, 2000, 6000, 1000]):
        log.append(simple_batch(2, ts=ts, tag=b"%d-" % i))
    log.roll()
    log.append(simple_batch(1, ts=10))
    return log, read_all(log)


@pytest.mark.parametrize("damage", ["delete .index", "delete .timeindex", "delete both",
                                    "tear .index", "tear .timeindex", "empty .timeindex",
                                    "swap index entries"])
def test_damaged_index_files_of_a_closed_segment_are_rebuilt(tmp_path, damage) -> None:
    log, records = segment_with_batches(tmp_path)
    seg = log.segments[0]
    want_offsets, want_times = seg.offset_index.entries(), seg.time_index.entries()
    want_max = seg.max_timestamp
    ts_answers = {t: log.find_offset_for_timestamp(t) for t in (0, 999, 1000, 2500, 5001, 6000, 6001)}
    log.close()
    index, timeindex = seg.offset_index.path, seg.time_index.path
    if "delete" in damage:
        for path in (index, timeindex):
            if damage == "delete both" or path.endswith(damage.split()[1]):
                os.remove(path)
    elif "tear" in damage:
        with open(index if damage.endswith(".index") else timeindex, "ab") as f:
            f.write(b"\x07")
    elif damage == "empty .timeindex":
        open(timeindex, "wb").close()
    else:
        with open(index, "r+b") as f:
            entries = f.read()
            f.seek(0)
            f.write(entries[8:16] + entries[0:8] + entries[16:])
    log = open_log(tmp_path / "t-0", config(index_interval_bytes=0))
    seg = log.segments[0]
    assert seg.offset_index.entries() == want_offsets
    assert seg.time_index.entries() == want_times
    assert seg.max_timestamp == want_max == 6001
    assert read_all(log) == records
    assert {t: log.find_offset_for_timestamp(t) for t in ts_answers} == ts_answers
    # And the rebuilt files are on disk for the next open.
    assert OffsetIndex(index, 0).entries() == want_offsets
    assert TimeIndex(timeindex, 0).entries() == want_times


def test_indexes_of_the_active_segment_are_rebuilt_after_an_unclean_shutdown(tmp_path) -> None:
    log, records = segment_with_batches(tmp_path)
    for s in log.segments:
        s.flush()
    active = log.segments[-1]
    want = active.offset_index.entries()
    index_path, timeindex_path = active.offset_index.path, active.time_index.path
    del log, active  # an unclean shutdown: nothing of the old log is left to write
    os.remove(index_path)
    with open(timeindex_path, "wb") as f:
        f.write(struct.pack("<qI", 99, 5))  # nonsense: points past the segment
    log = open_log(tmp_path / "t-0", config(index_interval_bytes=0))
    assert log.segments[-1].offset_index.entries() == want
    assert [(e.timestamp, e.offset) for e in log.segments[-1].time_index.entries()] == [(10, 12)]
    assert read_all(log) == records


def test_find_offset_for_timestamp_agrees_with_a_linear_scan(tmp_path) -> None:
    rng = np.random.default_rng(7)
    log = open_log(tmp_path / "t-0", config(segment_bytes=2048, index_interval_bytes=300))
    for _ in range(25):
        n = int(rng.integers(1, 6))
        stamps = rng.integers(0, 10_000, n).tolist()
        log.append(make_batch([(t, None, b"x", None) for t in stamps]))
    log.delete_records_before(7)
    records = read_all(log)
    for t in range(-5, 10_010, 97):
        want = next((r[0] for r in records if r[1] >= t), None)
        assert log.find_offset_for_timestamp(t) == want, t


def test_segment_rejects_batches_that_go_backwards(tmp_path) -> None:
    seg = Segment.create(str(tmp_path), 10, SCHEMA, index_interval_bytes=0)
    with pytest.raises(Exception, match="does not follow"):
        seg.append(encode_batch(simple_batch(1), base_offset=9))  # below the base offset
    seg.append(encode_batch(simple_batch(2), base_offset=10))
    with pytest.raises(Exception, match="does not follow"):
        seg.append(encode_batch(simple_batch(1), base_offset=11))  # inside the last batch
    seg.append(encode_batch(simple_batch(1), base_offset=20))  # a gap is fine
    assert (seg.next_offset, len(seg.iter_batches())) == (21, 2)
    seg.close()


def test_log_start_offset_is_made_durable_only_after_the_records_below_it(tmp_path) -> None:
    log = open_log(tmp_path / "t-0")
    log.append(simple_batch(2), fsync=True)
    log.append(simple_batch(3))
    assert log.recovery_point == 2
    log.delete_records_before(4)
    # An OS crash can no longer leave a log that ends below its durable log start offset.
    assert log.recovery_point == 5


def test_log_start_offset_beyond_the_recovered_end_is_refused_unless_the_loss_is_accepted(tmp_path) -> None:
    log = open_log(tmp_path / "t-0")
    log.append(simple_batch(2), fsync=True)
    flushed_size = log.segments[-1].size
    log.append(simple_batch(3))
    log.delete_records_before(4)  # the log start offset is durable at once
    path = log.segments[-1].path
    del log
    os.truncate(path, flushed_size)  # fsynced records [2, 4] lost anyway (damage)
    # Never "fixed" by deleting the segments: the partition does not open.
    with pytest.raises(CorruptRecordError, match="log start offset 4 is beyond the end of the log"):
        open_log(tmp_path / "t-0")
    assert os.path.getsize(path) == flushed_size
    # The operator accepts the loss: the log starts over at the log start offset.
    log = Log.open(str(tmp_path / "t-0"), config=config(), schema=SCHEMA, accept_data_loss=True)
    assert (log.log_start_offset, log.log_end_offset) == (4, 4)
    assert [s.base_offset for s in log.segments] == [4]
    assert not os.path.exists(path)
    # New records get offsets at or above the log start offset, so they can be read.
    assert log.append(simple_batch(1, tag=b"new")).base_offset == 4
    assert [(r[0], r[3]) for r in read_all(log)] == [(4, b"new0")]


def test_truncate_inside_a_batch_keeps_its_leader_epoch(tmp_path) -> None:
    log = open_log(tmp_path / "t-0")
    log.append(simple_batch(5), leader_epoch=0)
    log.delete_records_before(4)  # the epoch entry is clamped to (0, 4)
    log.truncate_to(4)  # inside the batch [0, 4], which is kept whole
    assert log.log_end_offset == 5
    assert log.epochs.entries == [EpochEntry(0, 4)]


def test_a_new_epoch_at_the_start_offset_of_an_empty_epoch_replaces_it(tmp_path) -> None:
    log = open_log(tmp_path / "t-0", config(retention_bytes=0, retention_ms=-1))
    log.append(simple_batch(1), leader_epoch=0)
    log.roll()
    assert log.enforce_retention() == 1  # the log is now empty at [1, 1); epoch 0 clamped to 1
    assert log.epochs.entries == [EpochEntry(0, 1)]
    log.append(simple_batch(1), leader_epoch=1)
    assert log.epochs.entries == [EpochEntry(1, 1)]
    assert LeaderEpochCache(str(tmp_path / "t-0")).entries == [EpochEntry(1, 1)]


def test_a_batch_of_more_buffers_than_iov_max_is_written_whole(tmp_path) -> None:
    # 700 nullable value columns: ~2,800 body pieces, more than one pwritev takes.
    fields = [pa.field(f"c{i}", pa.int64()) for i in range(700)]
    schema = typed_schema(pa.schema(fields))
    values = pa.StructArray.from_arrays([pa.array([i, None, -i]) for i in range(700)], fields=fields)
    batch = build_batch(schema, values=values, timestamps_ms=[1, 2, 3])
    assert len(encode_batch(batch, base_offset=0).body_pieces) > os.sysconf("SC_IOV_MAX")
    log = open_log(tmp_path / "t-0", schema=schema)
    log.append(batch)
    log.append(batch)
    res = log.read(0, max_bytes=1 << 30)
    assert bytes(res.data) == b"".join(
        encode_batch(batch, base_offset=base).to_bytes() for base in (0, 3)
    )
    log.close()
    log = open_log(tmp_path / "t-0", schema=schema)
    assert log.read(3, max_bytes=1 << 30).decode()[0].column("value").to_pylist()[1]["c699"] is None
