"""Opening a partition log's files: recovery, repairs that lose nothing, refusals that need a person.

Files in the partition directory besides the segments (the partition log,
:mod:`logstore.storage.log`, owns their meaning):

* ``log-start-offset`` — decimal log start offset, replaced atomically;
* ``clean-shutdown`` — present only while the log is closed cleanly;
* ``lost-offsets`` — present only after an operator accepted a data loss
  (``logstore partitions recover --accept-data-loss``,
  :mod:`logstore.storage.partition_recovery`): lines ``<start> <end>``, each
  an offset range (end exclusive) whose acknowledged records were lost. Those
  offsets are never handed out again, and a read starting inside one raises
  :class:`~logstore.errors.OffsetOutOfRangeError` naming the loss (a consumer
  sees data loss, never new records at old offsets).

Damage and recovery (what opens, what refuses to)
-------------------------------------------------
:func:`load_log_files` repairs only what loses no acknowledged record, logs
every repair (logger ``logstore.storage.log``: partition, file, offset range,
bytes and batches dropped), and raises
:class:`~logstore.errors.CorruptRecordError` naming the file for everything
else (the log manager then keeps that one partition offline, with the
message as its reason, and the files as they are):

* missing, short or inconsistent index files: rebuilt from the segment; a
  damaged ``leader-epoch-checkpoint``: rebuilt from the batch headers (by
  :class:`~logstore.storage.log.Log`, which owns it);
* a torn or CRC-failing tail of the active segment (after an unclean
  shutdown, or found damaged after a clean one) above ``min_end_offset``
  (the checkpointed high-water mark, :mod:`logstore.storage.checkpoint`):
  truncated and logged — but only when it is provably the end of writes a
  crash cut short: when a whole batch with a good CRC follows the damaged
  one, the damaged batch was written in full (a flipped byte, not a torn
  write) and the records from it on may have been acknowledged since the
  last checkpoint (it lags the HWM by up to ``hwm_checkpoint_interval_ms``):
  :class:`~logstore.storage.segment.RecoveryDataLossError`, nothing truncated,
  the partition offline. A damaged *last* batch cannot be told from a write
  torn by a power loss, and is truncated;
* the same below ``min_end_offset``, or a log that ends below it for any
  other reason (a missing or shortened segment file): nothing is truncated,
  :class:`~logstore.storage.segment.RecoveryDataLossError` — the records were
  acknowledged, and reusing their offsets would break invariant I3;
* an unreadable ``log-start-offset`` file, or one beyond the end of the log:
  refused, never "fixed" by deleting segments (the log start offset is made
  durable only after the records below it are fsynced, so a recovered log
  never legitimately ends below it);
* a torn schema message of the active segment after an unclean shutdown: the
  segment is removed when it starts at or above ``min_end_offset`` (a crash
  while it was created: it holds no acknowledged record), else refused;
* a corrupt batch in a closed segment whose indexes must be rebuilt, or a
  closed segment whose schema message is damaged: refused (a corrupt batch in
  a closed segment with good indexes is found when read, and takes the log
  offline then: start-up does not read every closed segment);
* a missing segment between two others: refused. Without compaction every
  segment starts at its predecessor's next offset; compaction can leave a gap
  only below the first dirty offset of the cleaner checkpoint
  (:mod:`logstore.storage.cleaner_checkpoint`), and an accepted loss only
  inside a ``lost-offsets`` range; any other gap is a missing file (with
  ``accept_data_loss`` it is recorded in ``lost-offsets`` instead);
* an unreadable ``lost-offsets`` file: refused.

With ``accept_data_loss`` (the operator's command) the active segment's tail
is truncated even below ``min_end_offset``, a log start offset beyond the end
starts the log over there, the lost range ``[recovered end, resume)`` is
appended to ``lost-offsets``, and an empty segment based at ``resume`` is
created, so the next offset continues there; ``resume`` is the larger of
``min_end_offset`` and the end of the last batch header readable in the cut
tail (no offset a cut batch had is handed out again).

Thread-safety: called by :meth:`logstore.storage.log.Log.open` only, before
the log is shared.
"""

from __future__ import annotations

import logging
import os
from dataclasses import dataclass

import pyarrow as pa

from logstore.errors import CorruptRecordError
from logstore.storage.cleaner_checkpoint import read_cleaner_checkpoint
from logstore.storage.fileutil import TMP_SUFFIX, fsync_dir, read_text_or, write_atomically
from logstore.storage.leader_epoch import LEADER_EPOCH_CHECKPOINT, LeaderEpochCache
from logstore.storage.segment import SEGMENT_SUFFIX, RecoveryDataLossError, Segment
from logstore.storage.segment_swap import recover_interrupted_swap

__all__ = [
    "CLEAN_SHUTDOWN_FILE",
    "LOG_START_OFFSET_FILE",
    "LOST_OFFSETS_FILE",
    "LoadedLog",
    "load_log_files",
    "rebuild_leader_epochs",
]

CLEAN_SHUTDOWN_FILE = "clean-shutdown"
LOG_START_OFFSET_FILE = "log-start-offset"
LOST_OFFSETS_FILE = "lost-offsets"

log = logging.getLogger("logstore.storage.log")


@dataclass(frozen=True, slots=True)
class LoadedLog:
    """A partition directory's segments (oldest first, the last one active) and its offsets."""

    segments: list[Segment]
    log_start_offset: int
    lost: list[tuple[int, int]]
    clean: bool


def load_log_files(
    directory: str,
    *,
    schema: pa.Schema,
    index_interval_bytes: int,
    now_ms: int,
    min_end_offset: int = 0,
    accept_data_loss: bool = False,
) -> LoadedLog:
    """Recover and open ``directory``'s segments (see the module docstring).

    ``schema`` is used only when the log has no segment yet. On failure every
    segment opened so far is closed again.
    """
    segments: list[Segment] = []
    try:
        return _load(directory, segments, schema=schema, interval=index_interval_bytes, now_ms=now_ms,
                     min_end_offset=min_end_offset, accept_data_loss=accept_data_loss)
    except BaseException:
        for seg in segments:
            seg.close()
        raise


def _load(directory: str, segments: list[Segment], *, schema: pa.Schema, interval: int, now_ms: int,
          min_end_offset: int, accept_data_loss: bool) -> LoadedLog:
    # A compaction's segment swap a crash interrupted: finish or roll back (logstore.storage.segment_swap).
    recover_interrupted_swap(directory)
    for name in os.listdir(directory):
        if name.endswith(TMP_SUFFIX):
            os.remove(os.path.join(directory, name))
    bases = sorted(
        int(name[: -len(SEGMENT_SUFFIX)])
        for name in os.listdir(directory)
        if name.endswith(SEGMENT_SUFFIX) and name[: -len(SEGMENT_SUFFIX)].isdigit()
    )
    clean = os.path.exists(os.path.join(directory, CLEAN_SHUTDOWN_FILE))
    lost = _read_lost_offsets(directory)
    resume_at = min_end_offset  # with accept_data_loss: the next offset is at least this
    partition = os.path.basename(directory)
    for i, base in enumerate(bases):
        active = i == len(bases) - 1
        path = os.path.join(directory, f"{base:020d}{SEGMENT_SUFFIX}")
        try:
            seg = Segment.open(directory, base, index_interval_bytes=interval, created_ms=now_ms)
        except CorruptRecordError:
            if active and not clean and (base >= min_end_offset or accept_data_loss):
                # Crash while creating the segment: its schema message is torn. No
                # acknowledged record can be in it (it starts at or above the HWM).
                log.warning("partition %s: removed segment %s whose schema message is torn "
                            "(a crash while it was created)", partition, path)
                os.remove(path)
                continue
            raise
        segments.append(seg)
        if active and (not clean or accept_data_loss):
            seg.recover(min_end_offset=0 if accept_data_loss else min_end_offset,
                        only_unfinished_writes=not accept_data_loss)
            _log_truncation(partition, seg)
            if accept_data_loss and seg.truncated_tail is not None:  # never reuse a cut batch's offsets
                resume_at = max(resume_at, seg.truncated_tail.end_offset)
        elif active:
            try:
                seg.load()
            except CorruptRecordError as e:
                # Damaged after a clean shutdown: repair like a crash, never below the checkpoint.
                log.warning("partition %s: active segment %s is damaged although the log was closed "
                            "cleanly (%s); recovering it", partition, seg.path, e.message)
                seg.recover(min_end_offset=min_end_offset, only_unfinished_writes=True)
                _log_truncation(partition, seg)
        else:
            seg.load()
    lost = _check_no_missing_segment(directory, segments, lost, accept_data_loss=accept_data_loss)
    start_path = os.path.join(directory, LOG_START_OFFSET_FILE)
    stored_start = ""
    try:
        stored_start = read_text_or(start_path, "").strip()
        start = int(stored_start) if stored_start else 0
    except ValueError:  # not decimal, or not even UTF-8
        raise CorruptRecordError(f"{start_path}: not an offset: {stored_start[:40]!r}") from None
    if start < 0:
        raise CorruptRecordError(f"{start_path}: negative offset {start}")
    log_start = max(start, segments[0].base_offset if segments else 0)
    leo = segments[-1].next_offset if segments else log_start
    if segments and leo < log_start and not accept_data_loss:
        # The log start offset is made durable only after the records below it
        # are (Log._set_log_start_offset), so this is a damaged file or lost
        # fsynced data: never "fix" it by deleting the segments.
        raise RecoveryDataLossError(
            f"{start_path}: log start offset {start} is beyond the end of the log ({leo}); "
            f"the file is damaged or records were lost",
            kept_end_offset=leo, min_end_offset=start,
        )
    if max(leo, log_start) < min_end_offset and not accept_data_loss:
        raise RecoveryDataLossError(
            f"partition {partition}: the log ends at {leo} but its checkpointed high-water mark is "
            f"{min_end_offset}: offsets {leo}..{min_end_offset - 1} were lost (missing or "
            f"shortened segment files in {directory})",
            kept_end_offset=leo, min_end_offset=min_end_offset,
        )
    if segments and leo < log_start:
        # The operator accepted the loss: offsets below the log start offset can
        # never be read, so start over there rather than hand them out again.
        log.warning("partition %s: log start offset %d is beyond the recovered end %d; "
                    "deleting %d segments (loss accepted)", partition, log_start, leo, len(segments))
        schema = segments[-1].schema
        for seg in segments:
            seg.delete()
            seg.close()
        fsync_dir(directory)
        segments.clear()
    if not segments:
        segments.append(Segment.create(directory, log_start, schema, index_interval_bytes=interval,
                                       created_ms=now_ms))
    if accept_data_loss and segments[-1].next_offset < resume_at:
        lost = _record_loss(directory, segments, lost, log_start=log_start, resume_at=resume_at,
                            interval=interval, now_ms=now_ms)
    return LoadedLog(list(segments), log_start, lost, clean)


def _log_truncation(partition: str, seg: Segment) -> None:
    cut = seg.truncated_tail
    if cut is not None:
        offsets = (f"offsets {cut.first_offset}..{cut.end_offset - 1}" if cut.end_offset > cut.first_offset
                   else f"no whole batch header, at offset {cut.first_offset}")
        log.warning("partition %s: recovery truncated %s at position %d: %d bytes, %d batches (%s) "
                    "dropped: %s", partition, seg.path, cut.position, cut.bytes, cut.batches, offsets,
                    cut.reason, extra={"event": "recovery_truncated", "partition_dir": partition,
                                       "segment": seg.path, "position": cut.position, "bytes": cut.bytes,
                                       "batches": cut.batches, "first_offset": cut.first_offset,
                                       "reason": cut.reason})


def _read_lost_offsets(directory: str) -> list[tuple[int, int]]:
    path = os.path.join(directory, LOST_OFFSETS_FILE)
    ranges: list[tuple[int, int]] = []
    try:
        text = read_text_or(path, "")
    except ValueError:
        raise CorruptRecordError(f"{path}: not text") from None
    for line in text.splitlines():
        try:
            start, end = (int(x) for x in line.split())
        except ValueError:
            raise CorruptRecordError(f"{path}: not an offset range: {line[:60]!r}") from None
        ranges.append((start, end))
    return ranges


def _record_loss(directory: str, segments: list[Segment], lost: list[tuple[int, int]], *, log_start: int,
                 resume_at: int, interval: int, now_ms: int) -> list[tuple[int, int]]:
    """The operator accepted losing ``[LEO, resume_at)``: record it, continue at ``resume_at``."""
    active = segments[-1]
    gap = (max(active.next_offset, log_start), resume_at)
    lost = [*lost, gap]
    write_atomically(os.path.join(directory, LOST_OFFSETS_FILE), "".join(f"{a} {b}\n" for a, b in lost).encode())
    if active.size == active.data_start and active.base_offset == active.next_offset:
        active.delete()
        active.close()
        segments.pop()
    else:
        active.seal()
    segments.append(Segment.create(directory, resume_at, active.schema, index_interval_bytes=interval,
                                   created_ms=now_ms))
    log.warning("partition %s: data loss accepted: offsets %d..%d recorded as lost; the next offset is %d",
                os.path.basename(directory), gap[0], gap[1] - 1, resume_at)
    return lost


def _check_no_missing_segment(directory: str, segments: list[Segment], lost: list[tuple[int, int]], *,
                              accept_data_loss: bool) -> list[tuple[int, int]]:
    """Raise if two consecutive segments leave a gap that neither compaction nor an
    accepted loss explains (a deleted segment file); with ``accept_data_loss``, record
    such gaps as lost instead. Returns the lost ranges."""
    first_dirty: int | None = None
    for prev, seg in zip(segments, segments[1:], strict=False):
        if seg.base_offset <= prev.next_offset:
            continue
        if any(a <= prev.next_offset and seg.base_offset <= b for a, b in lost):
            continue
        if first_dirty is None:
            first_dirty = read_cleaner_checkpoint(directory) or 0
        if seg.base_offset <= first_dirty:
            continue  # compaction removed the records of that gap
        if accept_data_loss:
            lost = sorted([*lost, (prev.next_offset, seg.base_offset)])
            write_atomically(os.path.join(directory, LOST_OFFSETS_FILE),
                             "".join(f"{a} {b}\n" for a, b in lost).encode())
            log.warning("partition %s: data loss accepted: offsets %d..%d (missing between %s and %s) "
                        "recorded as lost", os.path.basename(directory), prev.next_offset,
                        seg.base_offset - 1, prev.path, seg.path)
            continue
        raise CorruptRecordError(
            f"partition {os.path.basename(directory)}: offsets {prev.next_offset}..{seg.base_offset - 1} "
            f"are missing between {prev.path} and {seg.path} (a segment file was deleted?)"
        )
    return lost


def rebuild_leader_epochs(directory: str, segments: list[Segment], damage: str) -> LeaderEpochCache:
    """Replace a damaged ``leader-epoch-checkpoint`` with one read off the batch headers.

    The checkpoint is derived state (every batch carries its leader epoch), so
    damage to it is repaired, not a reason to take the partition offline.
    """
    path = os.path.join(directory, LEADER_EPOCH_CHECKPOINT)
    if os.path.exists(path):
        os.remove(path)
    epochs = LeaderEpochCache(directory)
    for seg in segments:
        for stored in seg.iter_batches():
            epochs.assign(stored.header.leader_epoch, stored.header.base_offset)
    log.warning("partition %s: rebuilt %s from the batches (%d epochs): it was damaged: %s",
                os.path.basename(directory), epochs.path, len(epochs.entries), damage)
    return epochs
