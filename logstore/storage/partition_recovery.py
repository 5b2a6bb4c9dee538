"""The operator's repair of one offline partition, on a stopped broker's data directory.

``logstore partitions recover --data-dir DIR --topic T --partition P``
(:mod:`logstore.cli.partitions`) calls :func:`recover_partition`. Without
``accept_data_loss`` it opens the partition exactly as a broker start would
(repairs that lose nothing, such as rebuilding indexes, happen; nothing below
the checkpointed high-water mark is touched) and says whether it opens and,
if not, why. With ``accept_data_loss``:

* a torn or corrupt tail of the active segment is truncated even below the
  checkpointed high-water mark (``replication-offset-checkpoint``, see
  :mod:`logstore.storage.checkpoint`), and the offsets lost,
  ``[recovered end, checkpointed HWM)``, are recorded in the partition's
  ``lost-offsets`` file; an empty segment based at the checkpointed HWM is
  created, so the next offset handed out is the HWM: no offset below it is
  ever reused, and a consumer positioned in the gap gets
  ``OFFSET_OUT_OF_RANGE`` naming the loss (Spark's ``failOnDataLoss``
  applies);
* a ``log-start-offset`` beyond the recovered end starts the log over, empty,
  at that offset (the records below it could never be read anyway);
* the offsets of a missing segment between two others are recorded as lost
  (readers get ``OFFSET_OUT_OF_RANGE`` there and move past them).

Every segment is read in full and every batch's CRC checked (a broker start
reads only the active segment, so a corrupt batch inside a closed segment would
otherwise be found only when a reader reaches it and the partition goes
offline): each one is reported as the loss it is, its offsets and record
count (``damaged``). Damage the command does not repair (a corrupt batch inside
a closed segment, a damaged schema message, an unreadable
``log-start-offset``) is reported and left as it is: it needs a person to
decide (restore the file from a copy or a replica, or delete the partition's
segments from the damage on).

It must run while the broker is stopped: the broker and this command would
otherwise both write the partition's files.

Thread-safety: a command-line operation; one call at a time per data directory.
"""

from __future__ import annotations

import os
from dataclasses import dataclass

from logstore.errors import CorruptRecordError, UnknownTopicOrPartitionError
from logstore.naming import partition_dir_name
from logstore.record_reader import parse_batch_at
from logstore.storage.checkpoint import read_hwm_checkpoint
from logstore.storage.config import LogConfig
from logstore.storage.dir_lock import DataDirLock
from logstore.storage.log import Log
from logstore.storage.log_manager import Partition, TopicInfo
from logstore.storage.segment import Segment

__all__ = ["BatchDamage", "RecoveryOutcome", "find_damaged_batches", "recover_partition"]


@dataclass(frozen=True, slots=True)
class BatchDamage:
    """A batch of a segment that fails its CRC (or cannot be parsed, and everything after it in
    the segment): its records, offsets ``[first_offset, end_offset)``, are lost."""

    segment: str
    position: int
    first_offset: int
    end_offset: int
    reason: str


@dataclass(frozen=True, slots=True)
class RecoveryOutcome:
    """What :func:`recover_partition` found and did.

    ``error`` is why the partition does not open (None when it does);
    ``lost`` the offset ranges ``[start, end)`` recorded as lost so far;
    ``damaged`` the batches of the opened log that fail their CRC (every
    segment is read in full, closed ones included: a broker start does not,
    and would find them only when a reader gets there).
    """

    directory: str
    checkpointed_hwm: int
    log_start_offset: int
    log_end_offset: int
    error: str | None
    lost: tuple[tuple[int, int], ...]
    damaged: tuple[BatchDamage, ...] = ()


def find_damaged_batches(segments: list[Segment]) -> tuple[BatchDamage, ...]:
    """Every batch of ``segments`` whose CRC fails, or whose bytes do not parse (then the rest
    of that segment is counted lost with it). Reads the files; changes nothing."""
    out: list[BatchDamage] = []
    for seg in segments:
        with open(seg.path, "rb") as f:
            data = memoryview(f.read(seg.size))
        pos, expected = seg.data_start, seg.base_offset
        while pos < seg.size:
            try:
                batch = parse_batch_at(data, pos, where=seg.path)
            except CorruptRecordError as e:
                out.append(BatchDamage(seg.path, pos, expected, max(seg.next_offset, expected), e.message))
                break
            try:
                batch.verify_crc(where=seg.path)
            except CorruptRecordError as e:
                out.append(BatchDamage(seg.path, pos, batch.header.base_offset, batch.header.next_offset,
                                       e.message))
            expected = batch.header.next_offset
            pos += batch.size
    return tuple(out)


def recover_partition(data_dir: str, topic: str, partition: int, *, accept_data_loss: bool) -> RecoveryOutcome:
    """Open ``topic``-``partition`` of ``data_dir`` as the broker would, repairing if accepted."""
    data_dir = os.path.abspath(data_dir)
    meta = os.path.join(data_dir, "meta", "topics", f"{topic}.json")
    try:
        with open(meta, "rb") as f:
            info = TopicInfo.from_json(f.read(), defaults=LogConfig(), where=meta)
    except FileNotFoundError:
        raise UnknownTopicOrPartitionError(f"topic {topic!r} does not exist in {data_dir}") from None
    if not 0 <= partition < info.partitions:
        raise UnknownTopicOrPartitionError(f"topic {topic!r} has no partition {partition} (it has {info.partitions})")
    lock = DataDirLock.acquire(data_dir, purpose="logstore partitions recover")  # never beside a broker
    try:
        return _recover(data_dir, info, topic, partition, accept_data_loss=accept_data_loss)
    finally:
        lock.release()


def _recover(data_dir: str, info: TopicInfo, topic: str, partition: int, *, accept_data_loss: bool) -> RecoveryOutcome:
    directory = os.path.join(data_dir, partition_dir_name(topic, partition))
    entry = read_hwm_checkpoint(data_dir).get((topic, partition))
    hwm = entry.high_watermark if entry is not None and entry.topic_id == info.topic_id else 0
    try:
        plog = Log.open(directory, config=info.config, schema=info.schema, min_end_offset=hwm,
                        accept_data_loss=accept_data_loss)
    except Exception as e:  # noqa: BLE001 - reported to the operator, nothing changed
        return RecoveryOutcome(directory, hwm, -1, -1, getattr(e, "message", None) or f"{type(e).__name__}: {e}", ())
    start, end, lost = plog.log_start_offset, plog.log_end_offset, tuple(plog.lost_offsets)
    try:
        damaged = find_damaged_batches(list(plog.segments))
    except OSError as e:
        plog.close()
        return RecoveryOutcome(directory, hwm, start, end, f"{type(e).__name__}: {e}", lost)
    try:
        Partition(topic, partition, plog).close()  # rebuilds the producer state, writes the clean marker
    except Exception as e:  # noqa: BLE001
        plog.close()
        return RecoveryOutcome(directory, hwm, start, end, getattr(e, "message", None) or f"{type(e).__name__}: {e}",
                               lost, damaged)
    return RecoveryOutcome(directory, hwm, start, end, None, lost, damaged)
