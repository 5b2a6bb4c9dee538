"""The atomic segment swap of compaction, at the storage level (logstore.storage.segment_replacement and
Log.replace_segments), against a model; no broker, no Spark.

DESIGN I1/I3: compaction removes records but never changes a survivor's bytes or
offset; a crash or failure at any step of the swap leaves either the old or the new
segments, never a mix, and nothing stays locked.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

import pytest
from compaction_helpers import compact_local, local_range, log_records, model_after_compaction
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from storage_helpers import SCHEMA, ManualClock, config, make_batch

from logstore.errors import (
    CompactionConflictError,
    CorruptRecordError,
    InvalidRequestError,
    LogOfflineError,
)
from logstore.record import encode_batch, encode_schema, typed_schema
from logstore.storage.cleanable import cleaning_state
from logstore.storage.cleaner_checkpoint import CLEANER_CHECKPOINT_FILE
from logstore.storage.log import Log
from logstore.storage.segment_replacement import SegmentReplacement, segment_summary
from logstore.storage.segment_swap import (
    SWAP_MANIFEST_FILE,
    recover_interrupted_swap,
    set_swap_hook,
)

pytestmark = pytest.mark.timeout(300)

NOW_MS = 1_700_000_000_000
DAY_MS = 86_400_000
SUPPORT_DIR = os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "support")


def open_log(directory: str | Path, clock: ManualClock | None = None, **props: object) -> Log:
    cfg = config(segment_bytes=1024, cleanup_policy="compact", **props)
    return Log.open(str(directory), config=cfg, schema=SCHEMA, clock=clock or ManualClock(NOW_MS))


def fill(log: Log, batches: list[list[tuple[int, bytes | None, bytes | None]]]) -> None:
    for drafts in batches:
        log.append(make_batch([(ts, k, v, None) for ts, k, v in drafts]))


def leftovers(directory: str | Path) -> list[str]:
    return sorted(n for n in os.listdir(directory)
                  if n.endswith((".cleaned", ".swap")) or n.startswith(SWAP_MANIFEST_FILE))


def keyed_batches(n: int, *, keys: int = 7, per_batch: int = 6, ts: int = NOW_MS) -> list[list[tuple[int, bytes | None, bytes | None]]]:
    return [[(ts + b, b"k%d" % ((b * per_batch + i) % keys), b"value-%04d" % (b * per_batch + i) + b"." * 40)
             for i in range(per_batch)] for b in range(n)]


def expected_after(log: Log, before: list, *, delete_retention_ms: int = DAY_MS) -> list:
    return model_after_compaction(before, cleanable_end=log.segments[-1].base_offset, now_ms=NOW_MS,
                                  delete_retention_ms=delete_retention_ms)


# ---------------------------------------------------------------- behaviour


def test_compaction_keeps_the_latest_per_key_and_preserves_offsets(tmp_path: Path) -> None:
    log = open_log(tmp_path / "t-0")
    fill(log, keyed_batches(30))
    assert len(log.segments) > 5
    before = log_records(log)
    want = expected_after(log, before)
    active_before = [(s.base_offset, s.size) for s in log.segments[-1:]]
    compact_local(log, now_ms=NOW_MS, delete_retention_ms=DAY_MS)
    assert log_records(log) == want
    assert [(s.base_offset, s.size) for s in log.segments[-1:]] == active_before  # active untouched
    assert log.log_start_offset == 0 and log.segments[0].base_offset == 0
    # Replacement segments respect segment.bytes (a single larger batch gets its own segment).
    assert all(s.size <= 1024 or len(s.iter_batches()) == 1 for s in log.segments[:-1])
    # Every survivor is found by an indexed read at its own offset.
    for offset, *_ in want:
        res = log.read(offset, max_bytes=1)
        assert res.batches[0].header.base_offset <= offset < res.batches[0].header.next_offset
    log.close()
    reopened = open_log(tmp_path / "t-0")
    assert log_records(reopened) == want
    assert leftovers(tmp_path / "t-0") == []
    # A second compaction of compacted data removes nothing more.
    fill(reopened, keyed_batches(1, ts=NOW_MS + 1000))
    again_before = log_records(reopened)
    compact_local(reopened, now_ms=NOW_MS, delete_retention_ms=DAY_MS)
    assert log_records(reopened) == expected_after(reopened, again_before)
    reopened.close()


def test_small_segments_are_merged_and_an_empty_result_keeps_the_log_start(tmp_path: Path) -> None:
    log = open_log(tmp_path / "t-0")
    old = NOW_MS - 3 * DAY_MS
    # Every key ends with an expired tombstone: the whole compacted range goes away.
    fill(log, [[(old, b"a", b"x" * 300)], [(old, b"b", b"y" * 300)], [(old, b"a", None)],
               [(old, b"b", None)], [(old, b"c", b"z" * 300)], [(old, b"c", None)]])
    fill(log, [[(NOW_MS, b"live", b"v")]])
    assert len(log.segments) >= 3
    compact_local(log, now_ms=NOW_MS, delete_retention_ms=DAY_MS)
    assert len(log.segments) == 2 and log.segments[0].base_offset == 0
    assert log.segments[0].size == log.segments[0].data_start  # an empty segment holds the start
    assert log.log_start_offset == 0
    assert [r[2] for r in log_records(log)] == [b"live"]
    log.close()
    reopened = open_log(tmp_path / "t-0")
    assert reopened.log_start_offset == 0 and [r[2] for r in log_records(reopened)] == [b"live"]
    reopened.close()


def test_typed_topic_compacts_with_struct_values_and_null_tombstones(tmp_path: Path) -> None:
    import pyarrow as pa

    from logstore.record import build_batch

    schema = typed_schema(pa.schema([pa.field("n", pa.int64()), pa.field("s", pa.string())]))
    log = Log.open(str(tmp_path / "t-0"), config=config(segment_bytes=1024, cleanup_policy="compact"),
                   schema=schema, clock=ManualClock(NOW_MS))
    value_type = schema.field("value").type
    for b in range(20):
        values = pa.array([{"n": b * 4 + i, "s": "x" * 30} if (b + i) % 9 else None for i in range(4)],
                          value_type)
        log.append(build_batch(schema, values=values, keys=[b"k%d" % ((b + i) % 5) for i in range(4)],
                               timestamps_ms=[NOW_MS] * 4))
    before = log_records(log)
    compact_local(log, now_ms=NOW_MS, delete_retention_ms=DAY_MS)
    after = log_records(log)
    assert after == expected_after(log, before)
    assert any(r[3] is None for r in after), "young tombstones stay"


def test_readers_holding_the_old_segments_keep_reading_them(tmp_path: Path) -> None:
    log = open_log(tmp_path / "t-0")
    fill(log, keyed_batches(30))
    old_segments = log.segments  # what a Log.read in flight works on
    old_reads = [bytes(s.read(s.base_offset, max_bytes=1 << 20, upper_bound=1 << 40).data)
                 for s in old_segments[:-1]]
    compact_local(log, now_ms=NOW_MS, delete_retention_ms=DAY_MS)
    assert [s.base_offset for s in log.segments] != [s.base_offset for s in old_segments]
    again = [bytes(s.read(s.base_offset, max_bytes=1 << 20, upper_bound=1 << 40).data)
             for s in old_segments[:-1]]
    assert again == old_reads


def test_appends_go_on_between_planning_and_the_swap(tmp_path: Path) -> None:
    log = open_log(tmp_path / "t-0")
    fill(log, keyed_batches(20))
    segments = log.segments
    end = segments[-1].base_offset
    batches = list(local_range(log, 0, end))
    replacement = SegmentReplacement.begin(log, replaced=[segment_summary(s) for s in segments[:-1]],
                                           end_offset=end)
    from compaction.cleaner import CleanStats, compacted_chunks
    from compaction.planner import reference_survivors

    survivors = reference_survivors(batches, start=0, end=end, tombstone_horizon_ms=NOW_MS - DAY_MS)
    for schema_message, records in compacted_chunks(batches, survivors, CleanStats()):
        replacement.add(schema_message, records)
    before = log_records(log)
    fill(log, keyed_batches(10, ts=NOW_MS + 100))  # rolls the active segment more than once
    full_before = log_records(log)
    log.replace_segments(replacement, max_end_offset=log.log_end_offset)
    got = log_records(log)
    assert got == model_after_compaction(full_before, cleanable_end=end, now_ms=NOW_MS,
                                         delete_retention_ms=DAY_MS)
    assert [r for r in got if r[0] >= end] == [r for r in full_before if r[0] >= end]
    assert len(before) < len(full_before)


# ---------------------------------------------------------------- refusals


def test_swap_is_refused_when_the_segments_changed(tmp_path: Path) -> None:
    log = open_log(tmp_path / "t-0")
    fill(log, keyed_batches(20))
    summaries = [segment_summary(s) for s in log.segments[:-1]]
    end = log.segments[-1].base_offset
    replacement = SegmentReplacement.begin(log, replaced=summaries, end_offset=end)
    with pytest.raises(CompactionConflictError):
        SegmentReplacement.begin(log, replaced=summaries, end_offset=end)  # one at a time
    log.delete_records_before(summaries[1].base_offset)  # retention takes the first segment
    before = log_records(log)
    with pytest.raises(CompactionConflictError, match="no longer in the log"):
        log.replace_segments(replacement, max_end_offset=log.log_end_offset)
    replacement.abort()
    assert log_records(log) == before and log.offline_reason is None
    assert leftovers(tmp_path / "t-0") == []
    # Nothing stays locked: plan again and it works.
    compact_local(log, now_ms=NOW_MS, delete_retention_ms=DAY_MS)
    # A replacement planned against segments another compaction replaced is refused.
    fill(log, keyed_batches(8, ts=NOW_MS + 100))
    stale = [segment_summary(s) for s in log.segments[:-1]]
    stale_end = log.segments[-1].base_offset
    compact_local(log, now_ms=NOW_MS, delete_retention_ms=DAY_MS)
    with pytest.raises(CompactionConflictError):
        SegmentReplacement.begin(log, replaced=stale, end_offset=stale_end)


def test_swap_is_refused_above_the_last_stable_offset(tmp_path: Path) -> None:
    log = open_log(tmp_path / "t-0")
    fill(log, keyed_batches(20))
    segments = log.segments
    replacement = SegmentReplacement.begin(log, replaced=[segment_summary(s) for s in segments[:-1]],
                                           end_offset=segments[-1].base_offset)
    with pytest.raises(CompactionConflictError, match="last stable offset"):
        log.replace_segments(replacement, max_end_offset=segments[1].base_offset)
    replacement.abort()
    assert leftovers(tmp_path / "t-0") == []


@pytest.mark.parametrize("damage", ["crc", "beyond-end", "repeated", "schema", "no-schema"])
def test_bad_replacements_are_refused_and_leave_nothing(tmp_path: Path, damage: str) -> None:
    import pyarrow as pa

    log = open_log(tmp_path / "t-0")
    fill(log, keyed_batches(20))
    segments = log.segments
    end = segments[-1].base_offset
    first = next(iter(local_range(log, 0, end))).stored
    data = bytearray(first.data)
    schema_message = encode_schema(SCHEMA)
    if damage == "crc":
        data[-3] ^= 0xFF
        chunks = [(schema_message, bytes(data))]
    elif damage == "beyond-end":
        batch = make_batch([(NOW_MS, b"k", b"v", None)])
        chunks = [(schema_message, encode_batch(batch, base_offset=end).to_bytes())]
    elif damage == "repeated":
        chunks = [(schema_message, bytes(data) + bytes(data))]
    elif damage == "schema":
        other = typed_schema(pa.schema([pa.field("n", pa.int64())]))
        chunks = [(encode_schema(other), bytes(data))]
    else:
        chunks = [(b"", bytes(data))]
    before = log_records(log)
    replacement = SegmentReplacement.begin(log, replaced=[segment_summary(s) for s in segments[:-1]],
                                           end_offset=end)
    with pytest.raises((CorruptRecordError, InvalidRequestError)):
        for schema, records in chunks:
            replacement.add(schema, records)
        log.replace_segments(replacement, max_end_offset=log.log_end_offset)
    replacement.abort()
    assert leftovers(tmp_path / "t-0") == []
    assert log_records(log) == before and log.offline_reason is None


# ---------------------------------------------------------------- cleaning state


def test_cleaning_state_dirty_ratio_checkpoint_lso_and_lag(tmp_path: Path) -> None:
    clock = ManualClock(NOW_MS)
    log = open_log(tmp_path / "t-0", clock)
    fill(log, keyed_batches(20))
    s = cleaning_state(log, last_stable_offset=log.log_end_offset, now_ms=NOW_MS)
    assert s.first_dirty_offset == 0 and s.clean_bytes == 0
    assert s.cleanable_end_offset == s.active_segment_base == log.segments[-1].base_offset
    assert s.dirty_bytes == sum(g.size for g in log.segments[:-1]) and s.dirty_ratio == 1.0
    assert [g.base_offset for g in s.segments] == [g.base_offset for g in log.segments[:-1]]
    # The LSO and min.compaction.lag.ms hold the cleanable end back, at segment boundaries.
    lso = log.segments[3].base_offset + 1
    assert cleaning_state(log, last_stable_offset=lso, now_ms=NOW_MS).cleanable_end_offset == log.segments[3].base_offset
    log.update_config(config(segment_bytes=1024, cleanup_policy="compact", min_compaction_lag_ms=60_000))
    assert cleaning_state(log, last_stable_offset=log.log_end_offset, now_ms=NOW_MS).segments == ()
    assert cleaning_state(log, last_stable_offset=log.log_end_offset,
                          now_ms=NOW_MS + 60_100).cleanable_end_offset == s.cleanable_end_offset
    log.update_config(config(segment_bytes=1024, cleanup_policy="compact"))
    compact_local(log, now_ms=NOW_MS, delete_retention_ms=DAY_MS)
    with open(tmp_path / "t-0" / CLEANER_CHECKPOINT_FILE) as f:
        assert int(f.read()) == s.cleanable_end_offset
    after = cleaning_state(log, last_stable_offset=log.log_end_offset, now_ms=NOW_MS)
    assert after.first_dirty_offset == s.cleanable_end_offset and after.dirty_bytes == 0
    assert after.clean_bytes == sum(g.size for g in log.segments[:-1]) and after.dirty_ratio == 0.0
    fill(log, keyed_batches(10, ts=NOW_MS + 50))
    more = cleaning_state(log, last_stable_offset=log.log_end_offset, now_ms=NOW_MS)
    assert more.clean_bytes == after.clean_bytes and more.dirty_bytes > 0
    assert more.dirty_ratio == pytest.approx(more.dirty_bytes / (more.clean_bytes + more.dirty_bytes))


# ---------------------------------------------------------------- the model


records_strategy = st.lists(
    st.lists(
        st.tuples(
            st.integers(0, 3 * DAY_MS),                          # age
            st.one_of(st.none(), st.sampled_from([b"a", b"b", b"c", b"d", b"e", b"f"])),
            st.one_of(st.none(), st.binary(min_size=0, max_size=120)),  # None = tombstone
        ),
        min_size=1, max_size=8,
    ),
    min_size=2, max_size=14,
)


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(batches=records_strategy, delete_retention_ms=st.sampled_from([0, DAY_MS, 10 * DAY_MS]))
def test_compaction_matches_the_model(batches: list, delete_retention_ms: int) -> None:
    with tempfile.TemporaryDirectory() as tmp:
        log = open_log(tmp)
        fill(log, [[(NOW_MS - age, key, value) for age, key, value in b] for b in batches])
        before = log_records(log)
        if len(log.segments) < 2:
            return
        want = model_after_compaction(before, cleanable_end=log.segments[-1].base_offset, now_ms=NOW_MS,
                                      delete_retention_ms=delete_retention_ms)
        compact_local(log, now_ms=NOW_MS, delete_retention_ms=delete_retention_ms)
        assert log_records(log) == want
        log.close()
        reopened = open_log(tmp)
        assert log_records(reopened) == want
        reopened.close()


# ---------------------------------------------------------------- failures and crashes


def _prepared_log(tmp_path: Path) -> tuple[Path, list, list]:
    """A closed log to compact, its records, and its records after compaction."""
    src = tmp_path / "src" / "t-0"
    log = open_log(src)
    fill(log, keyed_batches(14))
    before = log_records(log)
    want = expected_after(log, before)
    log.close()
    return src, before, want


def _swap_steps(tmp_path: Path, src: Path) -> list[str]:
    """The hook steps of one swap (a dry run on a copy)."""
    steps: list[str] = []
    dry = tmp_path / "dry" / "t-0"
    shutil.copytree(src, dry)
    log = open_log(dry)
    previous = set_swap_hook(steps.append)
    try:
        compact_local(log, now_ms=NOW_MS, delete_retention_ms=DAY_MS, chunk_bytes=2048)
    finally:
        set_swap_hook(previous)
    log.close()
    assert "manifest-written" in steps and len([s for s in steps if s.startswith("swap-renamed:")]) >= 2
    return steps


def test_a_failure_at_any_step_leaves_the_old_segments_or_completes_on_reopen(tmp_path: Path) -> None:
    src, before, want = _prepared_log(tmp_path)
    steps = _swap_steps(tmp_path, src)
    committed = steps.index("manifest-written")
    for i, step in enumerate(steps):
        work = tmp_path / f"fail-{i}" / "t-0"
        shutil.copytree(src, work)
        log = open_log(work)

        def fail(name: str, at: str = step) -> None:
            if name == at:
                raise OSError(f"injected failure after {name}")

        previous = set_swap_hook(fail)
        try:
            with pytest.raises(Exception, match="injected failure"):
                compact_local(log, now_ms=NOW_MS, delete_retention_ms=DAY_MS, chunk_bytes=2048)
        finally:
            set_swap_hook(previous)
        if i < committed:
            assert log.offline_reason is None, step
            assert log_records(log) == before, step
            assert leftovers(work) == [], step
            compact_local(log, now_ms=NOW_MS, delete_retention_ms=DAY_MS)  # not stuck: retry works
            assert log_records(log) == want, step
        else:
            with pytest.raises(LogOfflineError):
                log.read(0, max_bytes=100)
            reopened = open_log(work)
            assert log_records(reopened) == want, step
            assert leftovers(work) == [], step
            reopened.close()


_CHILD = """
import os, sys
sys.path.insert(0, {tests!r})
from compaction_helpers import compact_local
from storage_helpers import ManualClock, SCHEMA, config
from logstore.storage.segment_swap import set_swap_hook, recover_interrupted_swap
from logstore.storage.log import Log
NOW_MS, DAY_MS = {now}, {day}
def open_log(path):
    cfg = config(segment_bytes=1024, cleanup_policy="compact")
    return Log.open(path, config=cfg, schema=SCHEMA, clock=ManualClock(NOW_MS))
step = {step!r}
def crash(name):
    if name == step:
        os._exit(17)
set_swap_hook(crash)
if {recover_only!r}:
    recover_interrupted_swap({path!r})
else:
    compact_local(open_log({path!r}), now_ms=NOW_MS, delete_retention_ms=DAY_MS, chunk_bytes=2048)
os._exit(0)
"""


def _run_child(path: Path, step: str, *, recover_only: bool = False) -> int:
    code = _CHILD.format(tests=SUPPORT_DIR, step=step, path=str(path), recover_only=recover_only,
                         now=NOW_MS, day=DAY_MS)
    return subprocess.run([sys.executable, "-c", code], timeout=120).returncode


def test_a_crash_at_any_step_leaves_either_the_old_or_the_new_segments(tmp_path: Path) -> None:
    src, before, want = _prepared_log(tmp_path)
    steps = _swap_steps(tmp_path, src)
    committed = steps.index("manifest-written")
    for i, step in enumerate(steps):
        work = tmp_path / f"crash-{i}" / "t-0"
        shutil.copytree(src, work)
        assert _run_child(work, step) == 17, step
        reopened = open_log(work)
        got = log_records(reopened)
        assert got == (before if i < committed else want), step
        assert leftovers(work) == [], step
        reopened.close()


def test_a_crash_while_completing_a_swap_is_completed_by_the_next_open(tmp_path: Path) -> None:
    src, _, want = _prepared_log(tmp_path)
    work = tmp_path / "crash" / "t-0"
    shutil.copytree(src, work)
    assert _run_child(work, "manifest-written") == 17
    with open(work / SWAP_MANIFEST_FILE) as f:
        manifest = json.load(f)
    recovery_steps = [f"old-deleted:{b}" for b in manifest["replaced"] if b not in manifest["segments"]]
    recovery_steps += [f"final-renamed:{b}" for b in manifest["segments"]] + ["renamed", "checkpoint-written"]
    for step in recovery_steps:
        assert _run_child(work, step, recover_only=True) == 17, step
    assert recover_interrupted_swap(str(work)) == "completed"
    reopened = open_log(work)
    assert log_records(reopened) == want
    assert leftovers(work) == []
    reopened.close()
