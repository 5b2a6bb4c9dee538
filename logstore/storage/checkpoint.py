"""The high-water-mark checkpoint: the offsets this broker has handed out, per partition.

Kafka's ``replication-offset-checkpoint``. An offset is a permanent address
(DESIGN invariant I3): once a record at offset *o* was acknowledged (and so
possibly read), no other record may ever get *o*. Recovery after a crash or
damage can only see what the segment files still hold; this file remembers
how far each partition's high-water mark had got, so that a partition whose
recovered log ends below it is kept offline (see :mod:`logstore.storage.log`,
"Damage and recovery") instead of accepting new records at the lost offsets.

File in the data directory
--------------------------
``replication-offset-checkpoint``, JSON, replaced atomically (temp file,
fsync, rename, fsync of the directory)::

    {"version": 1,
     "partitions": [{"topic": "t", "topic_id": "ab12...", "partition": 0,
                     "high_watermark": 4000}, ...]}

``topic_id`` ties an entry to one incarnation of a topic: an entry whose id
differs from the topic's (a deleted and re-created topic) is ignored.

Written by the log manager every ``hwm_checkpoint_interval_ms`` (only when a
value changed) and on clean shutdown. The checkpoint may lag the log by up
to one interval: a loss in the records appended since the last write is not
detected (as in Kafka). An offline partition keeps the value it had.

Crash behaviour: the file holds the old or the new content, never a mix. An
unreadable file is logged and ignored (the broker then cannot detect lost
offsets until the next write); it never stops the broker.

Thread-safety: plain functions; the log manager serialises writes.
"""

from __future__ import annotations

import json
import logging
import os
from collections.abc import Iterable
from dataclasses import dataclass

from logstore.storage.fileutil import write_atomically

__all__ = ["HWM_CHECKPOINT_FILE", "HwmEntry", "read_hwm_checkpoint", "write_hwm_checkpoint"]

HWM_CHECKPOINT_FILE = "replication-offset-checkpoint"

log = logging.getLogger("logstore.storage.checkpoint")


@dataclass(frozen=True, slots=True)
class HwmEntry:
    """One partition's checkpointed high-water mark (exclusive: the next offset to hand out)."""

    topic: str
    topic_id: str
    partition: int
    high_watermark: int


def read_hwm_checkpoint(data_dir: str) -> dict[tuple[str, int], HwmEntry]:
    """The entries of ``data_dir``'s checkpoint by (topic, partition); empty if there is none."""
    path = os.path.join(data_dir, HWM_CHECKPOINT_FILE)
    try:
        with open(path, "rb") as f:
            doc = json.loads(f.read())
        if doc.get("version") != 1:
            raise ValueError(f"unknown version {doc.get('version')!r}")
        entries = [
            HwmEntry(str(e["topic"]), str(e["topic_id"]), int(e["partition"]), int(e["high_watermark"]))
            for e in doc["partitions"]
        ]
    except FileNotFoundError:
        return {}
    except (OSError, ValueError, KeyError, TypeError, AttributeError) as e:
        log.error("%s is unreadable (%s: %s): ignored; lost offsets cannot be detected until it is "
                  "written again", path, type(e).__name__, e)
        return {}
    return {(e.topic, e.partition): e for e in entries}


def write_hwm_checkpoint(data_dir: str, entries: Iterable[HwmEntry]) -> None:
    """Replace ``data_dir``'s checkpoint with ``entries``, atomically and durably."""
    doc = {
        "version": 1,
        "partitions": [
            {"topic": e.topic, "topic_id": e.topic_id, "partition": e.partition,
             "high_watermark": e.high_watermark}
            for e in sorted(entries, key=lambda e: (e.topic, e.partition))
        ],
    }
    write_atomically(os.path.join(data_dir, HWM_CHECKPOINT_FILE), json.dumps(doc).encode())

