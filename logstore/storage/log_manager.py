"""Topics and their partition logs on one broker.

Layout under the data directory::

    <data_dir>/
      meta/topics/<topic>.json     one file per topic, replaced atomically
      meta/cluster.json            cluster id and node id
      replication-offset-checkpoint  high-water marks (logstore.storage.checkpoint)
      <topic>-<partition>/         a partition log (logstore.storage.log)

A topic's metadata file is the commit point of its creation: partition
directories are created first and the file is written last, so after a
crash a directory without a topic file may be an unfinished creation (or an
unfinished deletion, which marks its directories and then removes the file);
it is deleted at start-up only when the broker can prove it created it (its
marker file) *and* that it is unfinished (empty, or marked as being deleted;
see :mod:`logstore.storage.ownership`). Start-up never deletes records
because metadata is absent: a directory of ours holding records whose topic
file is missing (lost, or the whole ``meta/`` gone) keeps its topic offline
(:class:`~logstore.errors.LogOfflineError` naming the missing file, logged at
ERROR) until ``logstore partitions recover --rebuild-metadata`` rebuilds the
file from the directories. Anything else in the data directory is left alone
and named in one warning.

A :class:`~logstore.storage.partition.Partition` wraps a
:class:`~logstore.storage.log.Log` with the bounds readers must respect: the
high-water mark (HWM) and the last stable offset (LSO).

Replicated topics (a cluster, :mod:`replication`): the broker holds only the
partitions it has replicas of. Such a topic's file says ``"replicated": true``
and its replication factor; :meth:`LogManager.ensure_replicated_topic` records
it (no partition opened), :meth:`LogManager.ensure_partition` creates or opens
one local replica, :meth:`LogManager.remove_partition` deletes one. At
start-up only the partition directories present are opened; their HWM starts
at the checkpointed value (capped by the LEO). A replicated partition with
more than one replica opens without the "no loss below the checkpointed HWM"
guard: its unflushed tail may be lost in a crash (durability is the quorum,
DESIGN.md §6), and it is fetched again from the leader.

Damaged partitions: a partition whose files cannot be opened (see
:mod:`logstore.storage.log_loader`, "Damage and recovery": a corrupt closed segment,
a bad ``log-start-offset`` or producer-state file, a missing segment, a
recovery that would lose offsets below the checkpointed high-water mark, ...)
is kept *offline* alone: every call on it raises
:class:`~logstore.errors.LogOfflineError` with the reason, which is logged
once at start-up and reported in Metadata; every other partition is served.
Its files are left as they are for the operator
(``logstore partitions recover``), and its checkpointed high-water mark is
kept. A topic whose metadata file cannot be read is offline as a whole
(:class:`~logstore.errors.LogOfflineError` naming the file, for Metadata and
every request), its partition directories are left alone, and its name
cannot be created again until the file is repaired.

Thread-safety: topic creation, deletion and config changes hold the
manager's lock; partition logs have their own locks.
"""

from __future__ import annotations

import contextlib
import dataclasses
import logging
import os
import shutil
import threading
import time
import uuid
from collections.abc import Callable, Mapping

import pyarrow as pa

from logstore.errors import (
    InvalidConfigError,
    InvalidPartitionsError,
    InvalidTopicError,
    LogOfflineError,
    LogstoreError,
    SchemaMismatchError,
    StorageError,
    TopicAlreadyExistsError,
    UnknownTopicOrPartitionError,
)
from logstore.naming import parse_partition_dir_name, partition_dir_name, validate_topic_name
from logstore.record import (
    check_schema_evolution,
    typed_schema,
    untyped_schema,
    value_schema_of,
)
from logstore.schema_text import parse_schema
from logstore.storage.checkpoint import HwmEntry, read_hwm_checkpoint, write_hwm_checkpoint
from logstore.storage.config import LogConfig, check_value_format
from logstore.storage.dir_lock import DataDirLock
from logstore.storage.fileutil import fsync_dir, write_atomically
from logstore.storage.log import Log
from logstore.storage.ownership import (
    has_partition_marker,
    log_foreign,
    mark_deleting,
    marker_topic_id,
    remove_partition_dir,
    scan_data_dir,
    write_partition_marker,
)
from logstore.storage.partition import Partition
from logstore.storage.producer_id_scan import max_producer_id_on_disk
from logstore.storage.topic_info import SCHEMA_CONFIG, TopicInfo

__all__ = ["LogManager", "Partition", "TopicInfo", "MAX_PARTITIONS", "DEFAULT_MAX_PARTITIONS_PER_BROKER"]

log = logging.getLogger("logstore.storage.log_manager")

MAX_PARTITIONS = 10_000
# Every partition costs a directory, a few files, memory and start-up time (no
# descriptor: see logstore.storage.file_cache); a client may not create more than this.
DEFAULT_MAX_PARTITIONS_PER_BROKER = 20_000

class LogManager:
    """Owns every topic and partition log under one data directory."""

    def __init__(
        self,
        data_dir: str,
        *,
        topic_defaults: LogConfig,
        clock: Callable[[], float] = time.time,
        max_partitions: int = DEFAULT_MAX_PARTITIONS_PER_BROKER,
    ) -> None:
        self.data_dir = os.path.abspath(data_dir)
        self.max_partitions = max_partitions
        self.topic_defaults = topic_defaults
        self._clock = clock
        self._lock = threading.RLock()
        self._topics: dict[str, TopicInfo] = {}
        self._partitions: dict[tuple[str, int], Partition] = {}
        self._meta_dir = os.path.join(self.data_dir, "meta", "topics")
        # Topics whose metadata file cannot be read: name -> why (offline, files left alone).
        self._damaged_topics: dict[str, str] = {}
        # The high-water marks last written to the checkpoint (logstore.storage.checkpoint).
        self._hwm_checkpoint: dict[tuple[str, int], HwmEntry] = {}
        self._checkpoint_lock = threading.Lock()
        self._dir_lock: DataDirLock | None = None

    # ------------------------------------------------------------------ lifecycle

    def startup(self) -> None:
        """Lock the data directory (:mod:`logstore.storage.dir_lock`), load topic metadata, delete
        unfinished creations/deletions, open (and recover) logs."""
        self._dir_lock = DataDirLock.acquire(self.data_dir)
        os.makedirs(self._meta_dir, exist_ok=True)
        with self._lock:
            for name in sorted(os.listdir(self._meta_dir)):
                if not name.endswith(".json"):
                    continue
                path = os.path.join(self._meta_dir, name)
                try:
                    with open(path, "rb") as f:
                        info = TopicInfo.from_json(f.read(), defaults=self.topic_defaults, where=path)
                except Exception as e:  # noqa: BLE001 - one damaged topic file must not stop the broker
                    self._damaged_topics[name[: -len(".json")]] = (
                        f"its metadata file is damaged: {path}: {type(e).__name__}: {e}; repair it, or stop "
                        f"the broker and run 'logstore partitions recover --data-dir {self.data_dir} --topic "
                        f"{name[: -len('.json')]} --rebuild-metadata' to rebuild it from the partition directories")
                    log.error("topic %s is offline: its metadata file is damaged: %s (its partition "
                              "directories are left alone)", name[: -len(".json")], e)
                    continue
                self._topics[info.name] = info
            owned = self._clean_data_dir()
            self._hwm_checkpoint = {  # an offline topic's entries are kept (they protect its records)
                key: e for key, e in read_hwm_checkpoint(self.data_dir).items()
                if (key[0] in self._topics and self._topics[key[0]].topic_id == e.topic_id)
                or (key[0] in self._damaged_topics and key[0] not in self._topics)
            }
            for info in self._topics.values():
                for p in range(info.partitions):
                    if not info.replicated or (info.name, p) in owned:
                        self._load_partition(info, p)

    def _clean_data_dir(self) -> set[tuple[str, int]]:
        """Remove our unfinished creations and deletions; leave (and name) what is not ours;
        return the partitions whose directories are ours.

        See :mod:`logstore.storage.ownership` for how a directory is proven ours.
        """
        known = {t.name: (t.topic_id, t.partitions) for t in self._topics.values()}
        scan = scan_data_dir(self.data_dir, known, offline_topics=self._damaged_topics)
        for name in scan.unfinished:
            log.info("removing partition directory %s: its topic does not exist "
                     "(an interrupted creation or deletion)", name)
            remove_partition_dir(os.path.join(self.data_dir, name))
        for name in scan.interrupted_deletes:
            log.info("finishing the removal of deleted partition directory %s", name)
            shutil.rmtree(os.path.join(self.data_dir, name))
        if scan.interrupted_deletes:
            fsync_dir(self.data_dir)
        log_foreign(self.data_dir, scan.foreign)
        for topic, names in sorted(scan.orphaned.items()):
            path = os.path.join(self._meta_dir, f"{topic}.json")
            info = self._topics.get(topic)
            if info is None:
                self._damaged_topics[topic] = (
                    f"{path} is missing, but partition directories of the topic hold records "
                    f"({', '.join(names)}); they are kept as they are. Stop the broker and run "
                    f"'logstore partitions recover --data-dir {self.data_dir} --topic {topic} "
                    "--rebuild-metadata' to rebuild the file from them")
                log.error("topic %s is offline: %s", topic, self._damaged_topics[topic],
                          extra={"event": "topic_offline", "topic": topic, "missing": path})
            else:
                log.error("partition directories %s hold records but %s names only %d partitions of "
                          "topic %s; they are left alone (not opened, not deleted)", ", ".join(names),
                          path, info.partitions, topic)
        return set(scan.owned)

    def _open_partition(self, info: TopicInfo, partition: int) -> Partition:
        directory = os.path.join(self.data_dir, partition_dir_name(info.name, partition))
        if not has_partition_marker(directory):
            write_partition_marker(directory, topic=info.name, partition=partition, topic_id=info.topic_id)
        log = Log.open(directory, config=info.config, schema=info.schema, clock=self._clock)
        part = Partition(info.name, partition, log, replicated=info.replicated)
        self._partitions[(info.name, partition)] = part
        return part

    def _load_partition(self, info: TopicInfo, partition: int) -> Partition:
        """Open an existing partition at start-up, or keep it offline alone when its files are damaged."""
        directory = os.path.join(self.data_dir, partition_dir_name(info.name, partition))
        checkpointed = self._hwm_checkpoint.get((info.name, partition))
        hwm = checkpointed.high_watermark if checkpointed is not None else 0
        # With other replicas, a lost unflushed tail is fetched again (see the module docstring).
        min_end = 0 if info.replicated and info.replication_factor > 1 else hwm
        plog: Log | None = None
        try:
            plog = Log.open(directory, config=info.config, schema=info.schema, clock=self._clock,
                            min_end_offset=min_end)
            part = Partition(info.name, partition, plog, replicated=info.replicated, high_watermark=hwm)
        except Exception as e:  # noqa: BLE001 - any damage takes this partition offline, not the broker
            if plog is not None:
                plog.close()
            reason = getattr(e, "message", None) or f"{type(e).__name__}: {e}"
            if not isinstance(e, LogstoreError):
                reason = f"{directory}: {reason}"
            reason = f"{reason}; run 'logstore partitions recover' with the broker stopped"
            plog = Log.offline(directory, config=info.config, schema=info.schema, reason=reason,
                               clock=self._clock)  # logs the partition_offline event
            part = Partition(info.name, partition, plog, replicated=info.replicated)
        else:
            log.info("partition %s-%d online: offsets %d..%d, high watermark %d%s", info.name, partition,
                     plog.log_start_offset, plog.log_end_offset, part.high_watermark,
                     "" if plog.opened_clean else " (recovered after an unclean shutdown)",
                     extra={"event": "partition_online", "topic": info.name, "partition": partition,
                            "log_start_offset": plog.log_start_offset, "log_end_offset": plog.log_end_offset,
                            "high_watermark": part.high_watermark, "clean_shutdown": plog.opened_clean})
        self._partitions[(info.name, partition)] = part
        return part

    def shutdown(self) -> None:
        """Checkpoint the high-water marks, then close every log cleanly (flush + clean-shutdown marker)."""
        with self._lock:
            try:
                self.checkpoint_high_watermarks()
            except OSError as e:  # e.g. disk full: still close the logs
                log.error("cannot write the high-water-mark checkpoint: %s", e)
            for part in self._partitions.values():
                part.close()
            self._partitions.clear()
            if self._dir_lock is not None:
                self._dir_lock.release()

    def checkpoint_high_watermarks(self) -> bool:
        """Write the high-water-mark checkpoint if any value changed; say whether it wrote.

        Online partitions record their HWM; an offline one, or one of a topic
        offline for its metadata file, keeps its last checkpointed value (so it
        stays protected). Deleted topics drop out.
        """
        with self._checkpoint_lock:
            entries: dict[tuple[str, int], HwmEntry] = {}
            for (topic, p), part in list(self._partitions.items()):
                info = self._topics.get(topic)
                if info is None:
                    continue
                previous = self._hwm_checkpoint.get((topic, p))
                if part.log.offline_reason is None:
                    entries[(topic, p)] = HwmEntry(topic, info.topic_id, p, part.high_watermark)
                elif previous is not None:
                    entries[(topic, p)] = previous
            for key, entry in self._hwm_checkpoint.items():  # topics offline for their metadata file
                if key[0] in self._damaged_topics and key[0] not in self._topics:
                    entries[key] = entry
            if entries == self._hwm_checkpoint:
                return False
            write_hwm_checkpoint(self.data_dir, entries.values())
            self._hwm_checkpoint = entries
            return True

    # ------------------------------------------------------------------ topics

    def topics(self) -> list[TopicInfo]:
        with self._lock:
            return sorted(self._topics.values(), key=lambda t: t.name)

    def topic(self, name: str) -> TopicInfo:
        info = self._topics.get(name)
        if info is None and name in self._damaged_topics:
            raise LogOfflineError(f"topic {name!r} is offline: {self._damaged_topics[name]}")
        if info is None:
            raise UnknownTopicOrPartitionError(f"topic {name!r} does not exist")
        return info

    def hosts(self, topic: str, partition: int) -> bool:
        """Whether this broker has ``topic``-``partition`` (a replica of it, on a cluster)."""
        return (topic, partition) in self._partitions

    def partition(self, topic: str, partition: int) -> Partition:
        part = self._partitions.get((topic, partition))
        if part is None:
            if topic in self._topics:
                raise UnknownTopicOrPartitionError(
                    f"topic {topic!r} has no partition {partition} "
                    f"(it has {self._topics[topic].partitions})"
                )
            self.topic(topic)  # a damaged topic: LOG_OFFLINE with the reason
            raise UnknownTopicOrPartitionError(f"topic {topic!r} does not exist")
        return part

    def partitions_of(self, topic: str) -> list[Partition]:
        """The topic's partitions held here (all of them, unless the topic is replicated)."""
        info = self.topic(topic)
        return [part for p in range(info.partitions) if (part := self._partitions.get((topic, p))) is not None]

    def create_topic(
        self,
        name: str,
        *,
        partitions: int,
        configs: Mapping[str, str],
        value_schema: pa.Schema | None,
        validate_only: bool = False,
    ) -> TopicInfo:
        """Create a topic; raise on a bad name, count, config or schema, or if it exists."""
        validate_topic_name(name)
        if not 1 <= partitions <= MAX_PARTITIONS:
            raise InvalidPartitionsError(
                f"partition count must be between 1 and {MAX_PARTITIONS}, got {partitions}"
            )
        overrides = dict(configs)
        schema_text = overrides.pop(SCHEMA_CONFIG, None)
        if schema_text:
            if value_schema is not None:
                raise InvalidConfigError("give the schema either as value_schema or as the schema config, not both")
            value_schema = parse_schema(schema_text)
        config = LogConfig.from_properties(overrides, base=self.topic_defaults)
        check_value_format(overrides, typed=value_schema is not None, topic=name)
        schema = untyped_schema() if value_schema is None else typed_schema(value_schema)
        with self._lock:
            if name in self._topics or name in self._damaged_topics:
                raise TopicAlreadyExistsError(f"topic {name!r} already exists")
            self._check_partition_cap(partitions)
            info = TopicInfo(
                name=name, topic_id=uuid.uuid4().hex, partitions=partitions,
                overrides={k: str(v) for k, v in overrides.items()}, config=config,
                schema=schema, created_ms=int(self._clock() * 1000),
            )
            if validate_only:
                return info
            for p in range(partitions):
                directory = os.path.join(self.data_dir, partition_dir_name(name, p))
                if os.path.lexists(directory) and not has_partition_marker(directory):
                    raise InvalidTopicError(
                        f"cannot create topic {name!r}: {directory} exists and is not a logstore "
                        "partition directory; move it out of the data directory or choose another name"
                    )
            try:
                for p in range(partitions):
                    self._open_partition(info, p)
                self._write_topic(info)
            except BaseException:
                self._abandon_creation(info)
                raise
            self._topics[name] = info
        log.info("topic %s created: %d partitions", name, partitions,
                 extra={"event": "topic_created", "topic": name, "partitions": partitions})
        return info

    def _abandon_creation(self, info: TopicInfo) -> None:
        """Undo a creation that failed before its commit point: drop what it opened (a
        failed create must not keep partitions, files or descriptors; start-up would
        remove the directories anyway)."""
        for p in range(info.partitions):
            part = self._partitions.pop((info.name, p), None)
            if part is not None:
                try:
                    part.log.delete()
                except OSError:
                    part.log.close()

    def _check_partition_cap(self, adding: int) -> None:
        """Refuse ``adding`` partitions past the broker's cap (``max_partitions_per_broker``)."""
        held = sum(t.partitions for t in self._topics.values() if not t.replicated) + sum(
            1 for (name, _) in self._partitions if name in self._topics and self._topics[name].replicated)
        if held + adding > self.max_partitions:
            raise InvalidPartitionsError(
                f"this broker holds {held} partitions; {adding} more would exceed its cap "
                f"max_partitions_per_broker={self.max_partitions}"
            )

    def _write_topic(self, info: TopicInfo) -> None:
        write_atomically(os.path.join(self._meta_dir, f"{info.name}.json"), info.to_json())

    def ensure_replicated_topic(
        self, name: str, *, topic_id: str, partitions: int, configs: Mapping[str, str],
        value_schema: pa.Schema | None, replication_factor: int,
    ) -> TopicInfo:
        """Record (or update) a cluster topic as the cluster's metadata describes it; open no
        partition (see :meth:`ensure_partition`). A local topic of that name with another
        topic id is an older incarnation (deleted and re-created while this broker was away):
        it is deleted first. Raises on a bad name, config or schema."""
        validate_topic_name(name)
        overrides = {k: str(v) for k, v in configs.items() if k != SCHEMA_CONFIG}
        config = LogConfig.from_properties(overrides, base=self.topic_defaults)
        schema = untyped_schema() if value_schema is None else typed_schema(value_schema)
        with self._lock:
            old = self._topics.get(name)
            if old is not None and (old.topic_id != topic_id or not old.replicated):
                self.delete_topic(name)
                old = None
            if old is None:
                info = TopicInfo(name=name, topic_id=topic_id, partitions=partitions, overrides=overrides,
                                 config=config, schema=schema, created_ms=int(self._clock() * 1000),
                                 replicated=True, replication_factor=replication_factor)
                log.info("topic %s created here: %d partitions, replication factor %d", name, partitions,
                         replication_factor, extra={"event": "topic_created", "topic": name,
                                                    "partitions": partitions, "replicated": True})
            else:
                try:
                    check_schema_evolution(old.schema, schema)
                except SchemaMismatchError:
                    schema = old.schema  # evolved here already (note_schema): keep the newest
                info = dataclasses.replace(old, partitions=max(partitions, old.partitions), overrides=overrides,
                                           config=config, schema=schema, replication_factor=replication_factor)
                if info == old:
                    return old
            self._write_topic(info)
            self._topics[name] = info
            self._damaged_topics.pop(name, None)  # a missing file: the cluster's metadata rebuilt it
            for part in self.partitions_of(name):
                part.log.update_config(config)
            return info

    def ensure_partition(self, topic: str, partition: int) -> Partition:
        """The local replica of ``topic``'s ``partition``, created (empty) if this broker has
        none; the topic must be recorded (:meth:`ensure_replicated_topic`)."""
        with self._lock:
            part = self._partitions.get((topic, partition))
            if part is not None:
                return part
            info = self.topic(topic)
            if not 0 <= partition < info.partitions:
                raise UnknownTopicOrPartitionError(
                    f"topic {topic!r} has no partition {partition} (it has {info.partitions})")
            directory = os.path.join(self.data_dir, partition_dir_name(topic, partition))
            if os.path.lexists(directory) and not has_partition_marker(directory):
                raise InvalidTopicError(
                    f"cannot create a replica of {topic}-{partition}: {directory} exists and is not "
                    "a logstore partition directory; move it out of the data directory")
            if marker_topic_id(directory) not in (None, info.topic_id):
                # Kept at start-up for want of a topic file; the cluster says that topic was deleted
                # (and the name reused) meanwhile: an older incarnation's replica.
                log.warning("removing %s: it belongs to an older topic %s (topic id %s, now %s)", directory,
                            topic, marker_topic_id(directory), info.topic_id)
                remove_partition_dir(directory)
            self._check_partition_cap(1)
            return self._open_partition(info, partition)

    def remove_partition(self, topic: str, partition: int) -> None:
        """Close and delete the local replica of ``topic``'s ``partition`` (no longer hosted
        here); the topic's record stays. Nothing happens when there is none."""
        with self._lock:
            part = self._partitions.pop((topic, partition), None)
            if part is not None:
                with contextlib.suppress(OSError, StorageError):
                    part.log.close()
            directory = os.path.join(self.data_dir, partition_dir_name(topic, partition))
            if has_partition_marker(directory):
                remove_partition_dir(directory)

    def add_partitions(self, name: str, count: int, *, validate_only: bool = False) -> TopicInfo:
        """Grow a local topic to ``count`` partitions (Kafka's CreatePartitions); the new ones
        start empty. A count that does not grow is refused (INVALID_PARTITIONS)."""
        with self._lock:
            info = self.topic(name)
            if info.replicated:
                raise InvalidPartitionsError(f"topic {name!r} is a cluster topic: its partitions live in etcd")
            if not info.partitions < count <= MAX_PARTITIONS:
                raise InvalidPartitionsError(
                    f"topic {name!r} has {info.partitions} partitions; the new count must be larger "
                    f"(partitions cannot be removed) and at most {MAX_PARTITIONS}, got {count}")
            self._check_partition_cap(count - info.partitions)
            grown = dataclasses.replace(info, partitions=count)
            if validate_only:
                return grown
            for p in range(info.partitions, count):
                self._open_partition(grown, p)
            self._write_topic(grown)  # the commit point: start-up opens what the topic file names
            self._topics[name] = grown
            log.info("topic %s: partitions %d -> %d", name, info.partitions, count)
            return grown

    def delete_topic(self, name: str) -> None:
        """Delete a topic: its metadata file first (the commit point), then its logs.

        Each partition directory is renamed to ``<topic>-<p>.<uuid>-delete``
        and then removed (:func:`~logstore.storage.ownership.remove_partition_dir`);
        after a crash the next start-up finishes the removal, and the topic is
        gone either way.
        """
        with self._lock:
            info = self.topic(name)
            for p in range(info.partitions):  # before the commit point (the module docstring)
                directory = os.path.join(self.data_dir, partition_dir_name(name, p))
                if has_partition_marker(directory):
                    mark_deleting(directory)
            os.remove(os.path.join(self._meta_dir, f"{name}.json"))
            fsync_dir(self._meta_dir)
            del self._topics[name]
            for p in range(info.partitions):
                part = self._partitions.pop((name, p), None)
                if part is not None:
                    with contextlib.suppress(OSError, StorageError):
                        part.log.close()
                directory = os.path.join(self.data_dir, partition_dir_name(name, p))
                if has_partition_marker(directory):
                    remove_partition_dir(directory)
        log.info("topic %s deleted", name, extra={"event": "topic_deleted", "topic": name,
                                                   "partitions": info.partitions})

    def alter_configs(
        self,
        name: str,
        *,
        set_configs: Mapping[str, str],
        delete_keys: list[str],
        validate_only: bool = False,
    ) -> TopicInfo:
        """Change a topic's configs; ``schema`` may only evolve compatibly."""
        with self._lock:
            info = self.topic(name)
            overrides = dict(info.overrides)
            for key in delete_keys:
                if key != SCHEMA_CONFIG and key not in LogConfig.property_names():
                    raise InvalidConfigError(f"unknown topic config {key!r}")
                if key == SCHEMA_CONFIG:
                    raise InvalidConfigError("the schema of a topic cannot be removed")
                overrides.pop(key, None)
            changes = dict(set_configs)
            schema = info.schema
            schema_text = changes.pop(SCHEMA_CONFIG, None)
            if schema_text is not None:
                if value_schema_of(info.schema) is None:
                    raise InvalidConfigError(f"topic {name!r} is untyped; its schema cannot be set")
                proposed = typed_schema(parse_schema(schema_text))
                check_schema_evolution(info.schema, proposed)
                schema = proposed
            overrides.update({k: str(v) for k, v in changes.items()})
            config = LogConfig.from_properties(overrides, base=self.topic_defaults)
            check_value_format(overrides, typed=info.typed, topic=name)
            new = dataclasses.replace(info, overrides=overrides, config=config, schema=schema)
            if validate_only:
                return new
            self._write_topic(new)
            self._topics[name] = new
            for part in self.partitions_of(name):
                part.log.update_config(config)
            return new

    def note_schema(self, name: str, schema: pa.Schema) -> None:
        """Record that a partition of ``name`` accepted batches of an evolved ``schema``."""
        with self._lock:
            info = self.topic(name)
            if info.schema.equals(schema, check_metadata=False):
                return
            if not check_schema_evolution(info.schema, schema):
                return
            new = dataclasses.replace(info, schema=schema)
            self._write_topic(new)
            self._topics[name] = new

    # ------------------------------------------------------------------ housekeeping

    def all_partitions(self) -> list[Partition]:
        with self._lock:
            return list(self._partitions.values())

    def run_retention(self) -> int:
        """Apply retention to every partition; return how many segments were deleted."""
        deleted = 0
        for part in self.all_partitions():
            if part.log.offline_reason is None:
                deleted += part.log.enforce_retention()
        return deleted

    def flush_due(self) -> None:
        """fsync partitions whose ``flush.ms`` has passed."""
        for part in self.all_partitions():
            if part.log.offline_reason is None:
                part.log.maybe_flush()

    def producer_id_floor(self) -> tuple[int, list[str]]:
        """One past the largest producer id any partition held here has seen (its producer
        state, :attr:`~logstore.storage.producer_state.ProducerStateManager.max_producer_id`;
        for an offline partition or topic, its files: :mod:`logstore.storage.producer_id_scan`),
        and the partitions whose files could not be read to the end (with why)."""
        with self._lock:
            floor, unknown = 0, []
            offline = [part.log.directory for part in self._partitions.values() if part.log.offline_reason is not None]
            for part in self._partitions.values():
                if part.log.offline_reason is None:
                    floor = max(floor, part.producers.max_producer_id + 1)
            for name in sorted(os.listdir(self.data_dir)):  # the partition directories of offline topics
                with contextlib.suppress(Exception):
                    if parse_partition_dir_name(name)[0] in self._damaged_topics:
                        offline.append(os.path.join(self.data_dir, name))
            for directory in offline:  # read off their files instead
                try:
                    found, problem = max_producer_id_on_disk(directory)
                except OSError as e:
                    found, problem = -1, str(e)
                floor = max(floor, found + 1)
                if problem is not None:
                    unknown.append(f"{os.path.basename(directory)} ({problem})")
            return floor, unknown

    def snapshot_producer_states(self) -> None:
        """Write every partition's producer state snapshot (bounds replay after a crash)."""
        for part in self.all_partitions():
            if part.log.offline_reason is None:
                part.snapshot_producer_state()
