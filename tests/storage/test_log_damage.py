"""Opening a damaged partition log (logstore.storage.log_loader, "Damage and recovery"):
repairs that lose nothing are logged, everything else is refused with the file named and
the files untouched; the HWM checkpoint file (logstore.storage.checkpoint)."""

from __future__ import annotations

import logging
import os

import pytest
from storage_helpers import SCHEMA, config, read_all, records_of, simple_batch

from logstore.errors import CorruptRecordError, OffsetOutOfRangeError
from logstore.storage.checkpoint import (
    HWM_CHECKPOINT_FILE,
    HwmEntry,
    read_hwm_checkpoint,
    write_hwm_checkpoint,
)
from logstore.storage.cleaner_checkpoint import write_cleaner_checkpoint
from logstore.storage.log import LOST_OFFSETS_FILE, Log
from logstore.storage.segment import RecoveryDataLossError

CFG = config(index_interval_bytes=0, segment_bytes=1 << 20)


def _log_with_batches(path: str, sizes: list[int]) -> Log:
    log = Log.open(path, config=CFG, schema=SCHEMA)
    for n in sizes:
        log.append(simple_batch(n), fsync=True)
    return log


def _flip_last_batch(path: str) -> None:
    with open(path, "r+b") as f:
        f.seek(-8, os.SEEK_END)
        b = f.read(1)[0]
        f.seek(-8, os.SEEK_END)
        f.write(bytes([b ^ 0x01]))


def test_recovery_below_the_checkpointed_hwm_is_refused_and_truncates_nothing(tmp_path) -> None:
    d = str(tmp_path / "t-0")
    log = _log_with_batches(d, [3, 3, 3])  # offsets 0..8
    path = log.segments[-1].path
    del log  # unclean
    _flip_last_batch(path)
    with open(path, "rb") as f:
        before = f.read()
    with pytest.raises(RecoveryDataLossError, match=r"lose offsets 6\.\.8 below the checkpointed high-water mark 9"):
        Log.open(d, config=CFG, schema=SCHEMA, min_end_offset=9)
    with open(path, "rb") as f:
        assert f.read() == before  # left for the operator
    # Without a checkpoint saying those offsets were handed out, the torn tail is cut (and logged).
    log = Log.open(d, config=CFG, schema=SCHEMA, min_end_offset=6)
    assert log.log_end_offset == 6


def test_every_recovery_truncation_is_logged(tmp_path, caplog) -> None:
    d = str(tmp_path / "t-0")
    log = _log_with_batches(d, [3, 3])
    path = log.segments[-1].path
    del log
    _flip_last_batch(path)
    with caplog.at_level(logging.WARNING, logger="logstore.storage.log"):
        log = Log.open(d, config=CFG, schema=SCHEMA)
    assert log.log_end_offset == 3
    [line] = [r.getMessage() for r in caplog.records if "recovery truncated" in r.getMessage()]
    assert line.startswith("partition t-0: recovery truncated " + path)
    assert "1 batches (offsets 3..5) dropped" in line and "CRC32C mismatch" in line


def test_accepting_the_loss_records_the_gap_and_never_reuses_its_offsets(tmp_path) -> None:
    d = str(tmp_path / "t-0")
    log = _log_with_batches(d, [3, 3, 3])
    path = log.segments[-1].path
    del log
    _flip_last_batch(path)
    log = Log.open(d, config=CFG, schema=SCHEMA, min_end_offset=9, accept_data_loss=True)
    assert (log.log_end_offset, log.lost_offsets) == (9, [(6, 9)])
    assert log.append(simple_batch(1)).base_offset == 9
    log.close()
    with open(os.path.join(d, LOST_OFFSETS_FILE)) as f:
        assert f.read() == "6 9\n"
    log = Log.open(d, config=CFG, schema=SCHEMA, min_end_offset=10)  # reopens cleanly, gap and all
    head = log.read(0, max_bytes=1 << 20)
    assert [r[0] for r in records_of(head.decode())] == list(range(6)) and head.next_offset == 6
    with pytest.raises(OffsetOutOfRangeError, match="offsets 6..8 of partition t-0 were lost"):
        log.read(7, max_bytes=1 << 20)
    assert log.lost_range_at(8) == (6, 9) and log.lost_range_at(9) is None
    assert [r[0] for r in read_all(log, 9)] == [9]


def test_a_missing_middle_segment_is_refused_but_a_compaction_gap_is_not(tmp_path) -> None:
    d = str(tmp_path / "t-0")
    log = _log_with_batches(d, [2])
    for n in (2, 2):
        log.roll()
        log.append(simple_batch(n), fsync=True)
    middle = log.segments[1]
    log.close()
    for p in (middle.path, middle.offset_index.path, middle.time_index.path):
        os.remove(p)
    with pytest.raises(CorruptRecordError, match=r"offsets 2\.\.3 are missing between"):
        Log.open(d, config=CFG, schema=SCHEMA)
    # The operator accepts the loss: the gap is recorded, readers are told.
    log = Log.open(d, config=CFG, schema=SCHEMA, accept_data_loss=True)
    assert log.lost_offsets == [(2, 4)] and log.log_end_offset == 6
    with pytest.raises(OffsetOutOfRangeError, match="offsets 2..3 of partition t-0 were lost"):
        log.read(3, max_bytes=1 << 20)
    log.close()
    assert Log.open(d, config=CFG, schema=SCHEMA).lost_offsets == [(2, 4)]
    os.remove(os.path.join(d, LOST_OFFSETS_FILE))
    write_cleaner_checkpoint(d, 4)  # as if compaction had removed offsets 2..3
    assert Log.open(d, config=CFG, schema=SCHEMA).log_end_offset == 6


@pytest.mark.parametrize("content", [b"\xff\xfe", b"twelve\n", b"-3\n"])
def test_an_unreadable_log_start_offset_file_is_refused_and_deletes_nothing(tmp_path, content) -> None:
    d = str(tmp_path / "t-0")
    _log_with_batches(d, [4]).close()
    with open(os.path.join(d, "log-start-offset"), "wb") as f:
        f.write(content)
    with pytest.raises(CorruptRecordError, match="log-start-offset"):
        Log.open(d, config=CFG, schema=SCHEMA)
    os.remove(os.path.join(d, "log-start-offset"))
    assert [r[0] for r in read_all(Log.open(d, config=CFG, schema=SCHEMA))] == [0, 1, 2, 3]


def test_hwm_checkpoint_round_trip_and_damage(tmp_path, caplog) -> None:
    entries = [HwmEntry("b", "id2", 1, 7), HwmEntry("a", "id1", 0, 40)]
    write_hwm_checkpoint(str(tmp_path), entries)
    assert read_hwm_checkpoint(str(tmp_path)) == {("a", 0): entries[1], ("b", 1): entries[0]}
    assert read_hwm_checkpoint(str(tmp_path / "none")) == {}
    with open(tmp_path / HWM_CHECKPOINT_FILE, "wb") as f:
        f.write(b"\x00{garbage")
    with caplog.at_level(logging.ERROR, logger="logstore.storage.checkpoint"):
        assert read_hwm_checkpoint(str(tmp_path)) == {}
    assert "is unreadable" in caplog.text
