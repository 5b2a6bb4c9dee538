"""Damage done by hand to a partition's files, then reopen (DESIGN §3 crash behaviour, §7).

* a torn or damaged tail of the active segment after an unclean shutdown is
  truncated to the last good batch, and the good prefix is served;
* damage inside a closed segment is reported (CORRUPT_MESSAGE) when read and
  takes the log offline — never silently skipped, never served;
* missing or damaged index files are rebuilt from the segment.
"""

from __future__ import annotations

import os
import shutil
import struct

import pytest
from storage_helpers import SCHEMA, config, read_all, records_of, simple_batch

from logstore.errors import CorruptRecordError, LogOfflineError
from logstore.record_reader import StoredBatch
from logstore.storage.log import CLEAN_SHUTDOWN_FILE, Log
from logstore.storage.segment import Segment

CFG = config(index_interval_bytes=0, segment_bytes=1 << 20)


def build_log(path: str, *, batches: int = 4, closed_segments: int = 1) -> tuple[Log, list]:
    """A log with ``closed_segments`` closed segments of ``batches`` batches each, then an
    active segment with ``batches`` batches. Returns it (open) and its records."""
    log = Log.open(path, config=CFG, schema=SCHEMA)
    for s in range(closed_segments + 1):
        for i in range(batches):
            log.append(simple_batch(3 + i, ts=10_000 * s + 100 * i, tag=b"s%d-b%d-" % (s, i)))
        if s < closed_segments:
            log.roll()
    return log, read_all(log)


def assert_not_closed(log: Log) -> None:
    """The log was not closed: dropping it (``del``) is an unclean shutdown."""
    assert not os.path.exists(os.path.join(log.directory, CLEAN_SHUTDOWN_FILE))


def batches_of(segment: Segment) -> list[StoredBatch]:
    return segment.iter_batches()


def flip(path: str, position: int, mask: int = 0x01) -> None:
    with open(path, "r+b") as f:
        f.seek(position)
        byte = f.read(1)[0]
        f.seek(position)
        f.write(bytes([byte ^ mask]))


# ----------------------------------------------------------------------------- active segment


@pytest.mark.parametrize("cut", ["prefix", "metadata", "body", "last byte"])
def test_torn_tail_of_the_active_segment_is_truncated_on_unclean_open(tmp_path, cut) -> None:
    log, records = build_log(str(tmp_path / "t-0"))
    active = log.segments[-1]
    last = batches_of(active)[-1]
    good_end = last.position
    cut_at = {
        "prefix": last.position + 5,
        "metadata": last.position + 40,
        "body": last.position + last.body_start + 3,
        "last byte": last.position + last.size - 1,
    }[cut]
    path = active.path
    assert_not_closed(log)
    del log, active  # as a crashed process: no close (the old objects must be gone before reopening)
    os.truncate(path, cut_at)
    log = Log.open(str(tmp_path / "t-0"), config=CFG, schema=SCHEMA)
    lost = last.header.record_count
    assert log.log_end_offset == last.header.base_offset
    assert os.path.getsize(path) == good_end
    assert read_all(log) == records[:-lost]
    # The log carries on where the good prefix ends.
    res = log.append(simple_batch(2, tag=b"after"))
    assert res.base_offset == last.header.base_offset
    got = read_all(log)
    assert got[:-2] == records[:-lost]
    assert [r[0] for r in got[-2:]] == [res.base_offset, res.base_offset + 1]
    assert [r[3] for r in got[-2:]] == [b"after0", b"after1"]


@pytest.mark.parametrize("where", ["body", "facts", "garbage after"])
def test_damaged_last_batch_of_the_active_segment_is_truncated(tmp_path, where) -> None:
    log, records = build_log(str(tmp_path / "t-0"))
    active = log.segments[-1]
    last = batches_of(active)[-1]
    path = active.path
    assert_not_closed(log)
    del log, active
    if where == "body":
        flip(path, last.position + last.body_start + (last.size - last.body_start) // 2)
    elif where == "facts":
        # The last batch's max timestamp fact, a decimal string, loses 1: "10305" -> "10304".
        head = bytes(last.data[: last.body_start])
        fact = str(last.header.max_timestamp).encode()
        assert fact == b"10305" and head.count(fact) == 1
        flip(path, last.position + head.index(fact) + len(fact) - 1, 0x01)
    else:
        with open(path, "ab") as f:
            f.write(b"\xff\xff\xff\xff" + b"\x10\x00\x00\x00" + b"junk" * 4)
    log = Log.open(str(tmp_path / "t-0"), config=CFG, schema=SCHEMA)
    if where == "garbage after":
        assert read_all(log) == records
        assert os.path.getsize(path) == last.position + last.size
    else:
        assert read_all(log) == records[: -last.header.record_count]
        assert os.path.getsize(path) == last.position
    log.append(simple_batch(1))
    log.close()
    log = Log.open(str(tmp_path / "t-0"), config=CFG, schema=SCHEMA)
    assert read_all(log)[-1][3] == b"v0"


def test_clean_marker_with_a_torn_active_segment_still_serves_nothing_corrupt(tmp_path) -> None:
    # The marker says "clean", but the file was damaged afterwards: the log
    # must not serve the damaged batch (it reports it instead).
    log, records = build_log(str(tmp_path / "t-0"))
    path = log.segments[-1].path
    last = batches_of(log.segments[-1])[-1]
    log.close()
    flip(path, last.position + last.body_start + 1)
    log = Log.open(str(tmp_path / "t-0"), config=CFG, schema=SCHEMA)
    with pytest.raises(CorruptRecordError):
        read_all(log)
    with pytest.raises(LogOfflineError):
        log.read(log.log_start_offset, max_bytes=1 << 20)


# ----------------------------------------------------------------------------- closed segments


def reopen_and_expect_corrupt(directory: str, start: int) -> CorruptRecordError:
    log = Log.open(directory, config=CFG, schema=SCHEMA)
    with pytest.raises(CorruptRecordError) as info:
        read_all(log, start)
    err = info.value
    assert err.code == "CORRUPT_MESSAGE"
    # After that the partition is offline, for reads and writes alike.
    with pytest.raises(LogOfflineError) as offline:
        log.read(log.log_start_offset, max_bytes=1 << 20)
    assert offline.value.code == "LOG_OFFLINE"
    assert err.message in offline.value.message
    with pytest.raises(LogOfflineError):
        log.append(simple_batch(1))
    return err


@pytest.mark.parametrize("clean", [True, False])
def test_flipped_byte_in_the_middle_of_a_closed_segment_is_reported(tmp_path, clean) -> None:
    log, records = build_log(str(tmp_path / "t-0"), closed_segments=2)
    closed = log.segments[1]
    victim = batches_of(closed)[len(batches_of(closed)) // 2]
    path = closed.path
    if clean:
        log.close()
    else:
        assert_not_closed(log)
    del log, closed
    flip(path, victim.position + victim.body_start + (victim.size - victim.body_start) // 2)
    err = reopen_and_expect_corrupt(str(tmp_path / "t-0"), 0)
    assert path in err.message and f"offset {victim.header.base_offset}" in err.message
    assert f"(position {victim.position})" in err.message  # the file position, not a buffer index
    # Records before the damaged batch are still readable after reopening.
    log = Log.open(str(tmp_path / "t-0"), config=CFG, schema=SCHEMA)
    good = [r for r in records if r[0] < victim.header.base_offset]
    assert read_all_until(log, victim.header.base_offset) == good


def read_all_until(log: Log, end: int) -> list:
    out: list = []
    offset = log.log_start_offset
    while offset < end:
        res = log.read(offset, max_bytes=1 << 20, upper_bound=end)
        if not res.batches:
            break
        out.extend(records_of(res.decode()))
        offset = res.next_offset
    return out


@pytest.mark.timeout(30)
def test_corrupt_body_length_in_a_closed_segment_is_reported_not_looped_on(tmp_path) -> None:
    log, _ = build_log(str(tmp_path / "t-0"), closed_segments=1)
    closed = log.segments[0]
    victim = batches_of(closed)[1]
    body_len = victim.size - victim.body_start
    meta = bytes(victim.data[8: victim.body_start])
    at = meta.index(struct.pack("<q", body_len))
    log.close()
    # bodyLength grows by 2**24: the batch now claims to run far past the file's end.
    flip(closed.path, victim.position + 8 + at + 3, 0x01)
    err = reopen_and_expect_corrupt(str(tmp_path / "t-0"), victim.header.base_offset)
    assert closed.path in err.message


@pytest.mark.timeout(120)
def test_every_single_byte_flip_in_a_closed_batch_is_detected_or_harmless(tmp_path) -> None:
    """Flip each byte of one stored batch in turn: reading must raise CORRUPT_MESSAGE or
    return exactly the original records (a flip in padding) — never other data."""
    base = str(tmp_path / "orig")
    log, records = build_log(base, batches=3, closed_segments=1)
    victim = batches_of(log.segments[0])[1]
    path = log.segments[0].path
    log.close()
    with open(path, "rb") as f:
        original = f.read()
    work = str(tmp_path / "t-0")
    outcomes = {"detected": 0, "harmless": 0}
    for i in range(victim.position, victim.position + victim.size):
        shutil.rmtree(work, ignore_errors=True)
        shutil.copytree(base, work)
        data = bytearray(original)
        data[i] ^= 0x10
        with open(os.path.join(work, os.path.basename(path)), "wb") as f:
            f.write(data)
        try:
            reopened = Log.open(work, config=CFG, schema=SCHEMA)
            got = read_all(reopened)
        except CorruptRecordError:
            outcomes["detected"] += 1
            continue
        assert got == records, f"flipping byte {i - victim.position} of the batch changed what is served"
        outcomes["harmless"] += 1
    assert outcomes["detected"] > 0


@pytest.mark.timeout(120)
def test_every_single_byte_flip_in_a_closed_segments_schema_is_detected_or_harmless(tmp_path) -> None:
    """The schema message at the head of a segment file has no CRC: damage to it must
    be caught by the checks on the stored columns, or be harmless."""
    base = str(tmp_path / "orig")
    log, records = build_log(base, batches=2, closed_segments=1)
    path = log.segments[0].path
    schema_end = log.segments[0].data_start
    log.close()
    with open(path, "rb") as f:
        original = f.read()
    work = str(tmp_path / "t-0")
    detected = 0
    for i in range(schema_end):
        shutil.rmtree(work, ignore_errors=True)
        shutil.copytree(base, work)
        data = bytearray(original)
        data[i] ^= 0x10
        with open(os.path.join(work, os.path.basename(path)), "wb") as f:
            f.write(data)
        try:
            got = read_all(Log.open(work, config=CFG, schema=SCHEMA))
        except CorruptRecordError:
            detected += 1
            continue
        assert got == records, f"flipping byte {i} of the schema message changed what is served"
    assert detected > schema_end // 2
