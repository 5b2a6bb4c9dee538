"""Which directories of a data directory belong to the broker, and how they are removed.

The broker shares its data directory with whatever an operator puts there
(``./data`` is the default, a relative path), so it only ever deletes
directories it can prove it created:

* a partition directory holds a marker file, ``logstore-partition``, written
  (and fsynced) right after the directory is created and before any other
  file in it. Its content is JSON: ``{"topic": ..., "partition": ...,
  "topic_id": ...}``;
* a directory from before the marker existed is ours when it is named
  ``<topic>-<partition>``, ``<topic>`` has metadata under ``meta/topics/`` and
  ``partition`` is below its partition count; it gets its marker at start-up.

Everything else in the data directory — other directories, files, a
directory that merely looks like a partition or a deleted partition — is
left alone, and named once in a warning at start-up.

A partition directory of ours whose topic has no metadata file is removed at
start-up only when it is provably an unfinished creation or deletion:

* an unfinished deletion: topic deletion writes ``logstore-partition-deleting``
  (fsynced) into every partition directory *before* it removes the topic file
  (the commit point), so a directory holding it is one whose deletion was
  committed or was about to be;
* an unfinished creation: a topic's (or a new partition's) directories are
  created before its metadata file is written, and no record can be appended
  before that, so such a directory holds no record: one segment, based at 0,
  with nothing after its schema message (:func:`holds_records`).

Any other directory of ours without metadata (``meta/topics/<t>.json`` lost
or removed by hand, or the whole ``meta/`` gone) holds acknowledged records:
it is *orphaned* — kept as it is and reported, never deleted because metadata
is absent (``logstore partitions recover --rebuild-metadata`` rebuilds the
topic file from it).

Removal (topic deletion, and unfinished creations or deletions found at
start-up) renames the partition directory to ``<name>.<uuid>-delete`` (as
Kafka does), fsyncs the data directory, then removes the renamed tree. A
crash during the removal leaves a ``-delete`` directory, which the next
start-up removes — only if it holds the marker.

Thread-safety: the functions keep no state; callers serialize changes to
one data directory (the log manager's lock).
"""

from __future__ import annotations

import contextlib
import json
import logging
import os
import shutil
import uuid
from collections.abc import Collection, Mapping
from dataclasses import dataclass, field

from logstore.naming import parse_partition_dir_name
from logstore.storage.checkpoint import HWM_CHECKPOINT_FILE
from logstore.storage.dir_lock import LOCK_FILE
from logstore.storage.fileutil import TMP_SUFFIX, fsync_dir, write_atomically
from logstore.storage.segment import SEGMENT_SUFFIX

__all__ = [
    "BROKER_FILES",
    "PARTITION_MARKER_FILE",
    "DELETING_MARKER_FILE",
    "DELETE_SUFFIX",
    "DataDirScan",
    "has_partition_marker",
    "holds_records",
    "mark_deleting",
    "marker_topic_id",
    "unmark_deleting",
    "remove_partition_dir",
    "scan_data_dir",
    "write_partition_marker",
]

log = logging.getLogger("logstore.storage.ownership")

PARTITION_MARKER_FILE = "logstore-partition"
DELETING_MARKER_FILE = "logstore-partition-deleting"
DELETE_SUFFIX = "-delete"
_NAME_MAX = 255  # bytes in one file name (ext4, xfs, tmpfs); names here are ASCII
META_DIR = "meta"
# What the broker keeps at the top of the data dir besides partition directories (and the
# temp file of an atomic replace a crash may leave of the checkpoint).
BROKER_FILES = frozenset({META_DIR, HWM_CHECKPOINT_FILE, HWM_CHECKPOINT_FILE + TMP_SUFFIX, LOCK_FILE})


def write_partition_marker(directory: str, *, topic: str, partition: int, topic_id: str) -> None:
    """Create ``directory`` if needed and write its ownership marker (durably)."""
    created = not os.path.isdir(directory)
    os.makedirs(directory, exist_ok=True)
    doc = {"topic": topic, "partition": partition, "topic_id": topic_id}
    write_atomically(os.path.join(directory, PARTITION_MARKER_FILE), json.dumps(doc).encode())
    if created:
        fsync_dir(os.path.dirname(directory) or ".")


def marker_topic_id(directory: str) -> str | None:
    """The topic id ``directory``'s marker names (None: no marker, or none readable in it)."""
    try:
        with open(os.path.join(directory, PARTITION_MARKER_FILE), "rb") as f:
            topic_id = json.loads(f.read()).get("topic_id")
    except (OSError, ValueError, AttributeError):
        return None
    return topic_id if isinstance(topic_id, str) else None


def has_partition_marker(directory: str) -> bool:
    """Whether ``directory`` holds the marker the broker writes into its partition directories."""
    return os.path.isfile(os.path.join(directory, PARTITION_MARKER_FILE))


def mark_deleting(directory: str) -> None:
    """Record (durably) that ``directory``'s topic is being deleted; see the module docstring."""
    write_atomically(os.path.join(directory, DELETING_MARKER_FILE), b"")


def unmark_deleting(directory: str) -> None:
    """Undo :func:`mark_deleting` (the deletion was not committed: its topic file is still there)."""
    with contextlib.suppress(FileNotFoundError):
        os.remove(os.path.join(directory, DELETING_MARKER_FILE))
        fsync_dir(directory)


def holds_records(directory: str) -> bool:
    """Whether ``directory`` may hold records: anything but one segment based at 0 that ends
    right after its schema message. Errs towards True (a file it cannot read holds records)."""
    segments = [n for n in os.listdir(directory) if n.endswith(SEGMENT_SUFFIX)]
    if not segments:
        return False
    if segments != [f"{0:020d}{SEGMENT_SUFFIX}"]:
        return True
    try:
        with open(os.path.join(directory, segments[0]), "rb") as f:
            head = f.read(8)
            size = os.fstat(f.fileno()).st_size
    except OSError:
        return True
    if len(head) < 8 or head[:4] != b"\xff\xff\xff\xff":
        return size > 0  # an empty file (a crash right after creating it) holds nothing
    schema_size = 8 + int.from_bytes(head[4:], "little")
    return size > schema_size


def remove_partition_dir(directory: str) -> None:
    """Rename ``directory`` to ``<name>.<uuid>-delete``, fsync its parent, then remove the tree.

    ``<name>`` is cut short where the whole would exceed 255 bytes.

    The caller has established that the directory is ours (see the module
    docstring). A crash after the rename leaves the ``-delete`` directory for
    the next start-up to finish.
    """
    parent = os.path.dirname(directory)
    suffix = f".{uuid.uuid4().hex}{DELETE_SUFFIX}"
    # The name keeps as much of <topic>-<partition> as fits NAME_MAX with the suffix (a
    # 249-character topic would not fit whole); start-up recognizes it by suffix and marker.
    doomed = os.path.join(parent, os.path.basename(directory)[:_NAME_MAX - len(suffix)] + suffix)
    os.rename(directory, doomed)
    fsync_dir(parent)
    shutil.rmtree(doomed)
    fsync_dir(parent)


@dataclass(slots=True)
class DataDirScan:
    """What :func:`scan_data_dir` found: directories to open, to remove, and names to leave alone."""

    #: partition directories of known topics, by (topic, partition); markers written.
    owned: dict[tuple[str, int], str] = field(default_factory=dict)
    #: our partition directories without a topic (unfinished creation or deletion).
    unfinished: list[str] = field(default_factory=list)
    #: our ``-delete`` directories a crash left behind.
    interrupted_deletes: list[str] = field(default_factory=list)
    #: partition directories of topics whose metadata cannot be read: ours, kept as they are.
    offline: list[str] = field(default_factory=list)
    #: our partition directories that hold records but whose topic has no metadata file (or
    #: whose number is beyond its topic's partition count): kept as they are, by topic.
    orphaned: dict[str, list[str]] = field(default_factory=dict)
    #: names in the data directory that are not ours; never touched.
    foreign: list[str] = field(default_factory=list)


def scan_data_dir(data_dir: str, topics: Mapping[str, tuple[str, int]], *,
                  offline_topics: Collection[str] = ()) -> DataDirScan:
    """Classify every entry of ``data_dir``; ``topics`` maps a topic name to (topic id, partitions).

    ``offline_topics`` are topics whose metadata file is damaged: their
    partition directories are neither opened nor removed (``offline``).
    Partition directories of known topics without a marker (from before
    markers existed) get one now. Changes nothing else.
    """
    scan = DataDirScan()
    for name in sorted(os.listdir(data_dir)):
        full = os.path.join(data_dir, name)
        if name in BROKER_FILES:
            continue
        if not os.path.isdir(full) or os.path.islink(full):
            scan.foreign.append(name)
            continue
        marked = has_partition_marker(full)
        if name.endswith(DELETE_SUFFIX):
            (scan.interrupted_deletes if marked else scan.foreign).append(name)
            continue
        try:
            topic, partition = parse_partition_dir_name(name)
        except Exception:
            scan.foreign.append(name)
            continue
        known = topics.get(topic)
        if topic in offline_topics:
            scan.offline.append(name)
        elif known is not None and partition < known[1]:
            if not marked:
                write_partition_marker(full, topic=topic, partition=partition, topic_id=known[0])
            unmark_deleting(full)  # its topic file is there: the deletion was not committed
            scan.owned[(topic, partition)] = full
        elif marked and (os.path.exists(os.path.join(full, DELETING_MARKER_FILE)) or not holds_records(full)):
            scan.unfinished.append(name)
        elif marked:
            scan.orphaned.setdefault(topic, []).append(name)
        else:
            scan.foreign.append(name)
    return scan


def log_foreign(data_dir: str, names: list[str]) -> None:
    """Say once which entries of ``data_dir`` the broker does not own and leaves alone."""
    if names:
        shown = ", ".join(repr(n) for n in names[:20])
        more = f" and {len(names) - 20} more" if len(names) > 20 else ""
        log.warning(
            "data dir %s holds %d entries that are not logstore partitions; leaving them alone: %s%s",
            data_dir, len(names), shown, more,
        )
