"""Rebuilding a topic's lost metadata file from its partition directories, on a stopped broker.

``logstore partitions recover --rebuild-metadata --data-dir DIR --topic T``
(:mod:`logstore.cli.partitions`) calls :func:`rebuild_topic_metadata` when
``meta/topics/<T>.json`` is missing (deleted by hand, or the whole ``meta/``
lost) or unreadable: the broker keeps such a topic offline and never deletes
its directories (:mod:`logstore.storage.log_manager`). What is on disk decides:

* the topic id: from the partition directories' ownership markers
  (:mod:`logstore.storage.ownership`); they must agree, else nothing is written;
* the partition count: one past the highest partition found in a directory or
  in the high-water-mark checkpoint under that topic id (a partition whose
  directory is gone but whose checkpoint says it held records then stays
  offline, as any partition that lost acknowledged records does);
* the schema: read from the schema message of every segment; the most evolved
  one wins (schemas only ever evolve compatibly, :func:`~logstore.record.check_schema_evolution`);
  segments of incompatible schemas are refused;
* the topic's own configs are not on disk: they become the broker's defaults
  (:attr:`RebuiltTopic.configs_lost` says so; set them again with ``logstore
  topics alter``). A damaged file is kept beside the new one as ``<T>.json.damaged``.

The file is written atomically, with nothing else changed. It must run while
the broker is stopped (the data directory's lock is taken).

Thread-safety: a command-line operation; one call at a time per data directory.
"""

from __future__ import annotations

import json
import os
import time
from dataclasses import dataclass

import pyarrow as pa

from logstore.errors import CorruptRecordError, SchemaMismatchError, UnknownTopicOrPartitionError
from logstore.naming import parse_partition_dir_name
from logstore.record import check_schema_evolution, decode_schema
from logstore.storage.checkpoint import read_hwm_checkpoint
from logstore.storage.config import LogConfig
from logstore.storage.dir_lock import DataDirLock
from logstore.storage.fileutil import write_atomically
from logstore.storage.log_manager import TopicInfo
from logstore.storage.ownership import DELETE_SUFFIX, PARTITION_MARKER_FILE
from logstore.storage.segment import SEGMENT_SUFFIX

__all__ = ["RebuiltTopic", "rebuild_topic_metadata"]

_SCHEMA_HEAD_BYTES = 64 * 1024


@dataclass(frozen=True, slots=True)
class RebuiltTopic:
    """What :func:`rebuild_topic_metadata` found and (unless a dry run) wrote.

    ``existed``: the topic's file was present and readable, and nothing was
    changed; ``info`` is then the file's content.
    """

    path: str
    info: TopicInfo
    directories: tuple[str, ...]
    existed: bool
    written: bool
    configs_lost: bool


def rebuild_topic_metadata(data_dir: str, topic: str, *, dry_run: bool) -> RebuiltTopic:
    """Rebuild ``meta/topics/<topic>.json`` of ``data_dir`` (see the module docstring)."""
    data_dir = os.path.abspath(data_dir)
    lock = DataDirLock.acquire(data_dir, purpose="logstore partitions recover")  # never beside a broker
    try:
        return _rebuild(data_dir, topic, dry_run=dry_run)
    finally:
        lock.release()


def _rebuild(data_dir: str, topic: str, *, dry_run: bool) -> RebuiltTopic:
    path = os.path.join(data_dir, "meta", "topics", f"{topic}.json")
    damaged = False
    if os.path.exists(path):
        try:
            with open(path, "rb") as f:
                info = TopicInfo.from_json(f.read(), defaults=LogConfig(), where=path)
            return RebuiltTopic(path, info, (), existed=True, written=False, configs_lost=False)
        except Exception:  # noqa: BLE001 - a damaged file is rebuilt (and kept aside)
            damaged = True
    found: dict[int, str] = {}
    ids: dict[str, list[str]] = {}
    for name in sorted(os.listdir(data_dir)):
        full = os.path.join(data_dir, name)
        if name.endswith(DELETE_SUFFIX) or not os.path.isfile(os.path.join(full, PARTITION_MARKER_FILE)):
            continue
        try:
            dir_topic, partition = parse_partition_dir_name(name)
        except Exception:  # noqa: BLE001, S112 - not a partition directory's name
            continue
        if dir_topic != topic:
            continue
        with open(os.path.join(full, PARTITION_MARKER_FILE), "rb") as f:
            marker = json.loads(f.read())
        ids.setdefault(str(marker.get("topic_id", "")), []).append(name)
        found[partition] = full
    if not found:
        raise UnknownTopicOrPartitionError(
            f"no partition directory of topic {topic!r} in {data_dir}: nothing to rebuild {path} from")
    if len(ids) != 1 or "" in ids:
        seen = "; ".join(f"{i or 'none'}: {', '.join(n)}" for i, n in ids.items())
        raise CorruptRecordError(
            f"the partition directories of topic {topic!r} disagree on its topic id ({seen}); rebuild refused")
    [topic_id] = ids
    checkpointed = [p for (t, p), e in read_hwm_checkpoint(data_dir).items() if t == topic and e.topic_id == topic_id]
    partitions = max([*found, *checkpointed]) + 1
    schema = _newest_schema(list(found.values()))
    info = TopicInfo(name=topic, topic_id=topic_id, partitions=partitions, overrides={}, config=LogConfig(),
                     schema=schema, created_ms=int(time.time() * 1000))
    if not dry_run:
        os.makedirs(os.path.dirname(path), exist_ok=True)
        if damaged:
            os.replace(path, path + ".damaged")
        write_atomically(path, info.to_json())
    return RebuiltTopic(path, info, tuple(os.path.basename(d) for _, d in sorted(found.items())),
                        existed=False, written=not dry_run, configs_lost=True)


def _newest_schema(directories: list[str]) -> pa.Schema:
    """The most evolved schema of every segment in ``directories``."""
    newest: pa.Schema | None = None
    for directory in directories:
        for name in sorted(os.listdir(directory)):
            if not name.endswith(SEGMENT_SUFFIX):
                continue
            seg_path = os.path.join(directory, name)
            try:
                with open(seg_path, "rb") as f:
                    schema, _ = decode_schema(f.read(_SCHEMA_HEAD_BYTES), where=seg_path)
            except (CorruptRecordError, SchemaMismatchError):
                continue  # a torn schema message (the partition's own recovery deals with it)
            if newest is None:
                newest = schema
                continue
            try:
                if check_schema_evolution(newest, schema):
                    newest = schema
            except SchemaMismatchError:
                check_schema_evolution(schema, newest)  # older: fine; incompatible either way: raises
    if newest is None:
        raise CorruptRecordError(f"no segment in {', '.join(directories)}: the schema cannot be read")
    return newest
