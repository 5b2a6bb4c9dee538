"""A state log kept in an internal topic: what the coordinators persist their state in.

The transaction coordinator's state (``__transaction_state``) and the
group coordinator's offsets and metadata (``__consumer_offsets``) are
records of an internal topic, appended by the broker itself and replayed on
start-up. :class:`InternalTopicLog` is that log:

* the topic is created on first use (an append, or :meth:`InternalTopicLog.partitions`)
  with the partition count and configs given; a topic that exists already
  (created meanwhile, or by an earlier broker with another count) is used as it is;
* a record has an ``owner`` (a group id): all records of one owner go to
  partition ``crc32(owner) % partitions``, in the order appended, so an
  owner's history is one ordered sequence;
* :meth:`InternalTopicLog.append` writes one batch per partition touched and
  returns once the records are in the log (and, with ``fsync``, on disk);
* :meth:`InternalTopicLog.read_all` reads every record back as ``(key, value)``
  (``value`` None: a tombstone), partition by partition, each in offset
  order; it does not create the topic (nothing written, nothing to read).

Records use the untyped schema (binary key and value) and the wall clock as
their timestamp.

Thread-safety: appends go through the partition logs, which have their own
locks; records of one owner appended from several threads interleave in the
order the appends take the partition's lock.
"""

from __future__ import annotations

import contextlib
import time
import zlib
from collections import defaultdict
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass

from logstore.errors import LogstoreError, UnknownTopicOrPartitionError
from logstore.record import build_batch
from logstore.storage.log_manager import LogManager, Partition

__all__ = ["InternalRecord", "InternalTopicLog"]

_READ_BYTES = 8 << 20


@dataclass(frozen=True, slots=True)
class InternalRecord:
    """One record of an internal topic; ``value`` None is a tombstone."""

    owner: str
    key: bytes
    value: bytes | None


class InternalTopicLog:
    """Keyed records in the internal topic ``topic``; see the module docstring."""

    def __init__(self, manager: LogManager, topic: str, *, partitions: int,
                 configs: Mapping[str, str]) -> None:
        self._manager = manager
        self.topic = topic
        self._wanted_partitions = partitions
        self._configs = dict(configs)

    def _existing(self) -> list[Partition] | None:
        try:
            return self._manager.partitions_of(self.topic)
        except UnknownTopicOrPartitionError:
            return None

    def partitions(self) -> list[Partition]:
        """The topic's partitions, creating the topic if it does not exist."""
        parts = self._existing()
        if parts is None:
            with contextlib.suppress(LogstoreError):  # created meanwhile
                self._manager.create_topic(self.topic, partitions=self._wanted_partitions,
                                           configs=self._configs, value_schema=None)
            parts = self._manager.partitions_of(self.topic)
        return parts

    def append(self, records: Sequence[InternalRecord], *, fsync: bool) -> None:
        """Append ``records`` (one batch per partition, in partition order); see the module docstring."""
        parts = self.partitions()
        by_partition: dict[int, list[InternalRecord]] = defaultdict(list)
        for r in records:
            by_partition[zlib.crc32(r.owner.encode()) % len(parts)].append(r)
        now_ms = int(time.time() * 1000)
        for index, group in sorted(by_partition.items()):
            part = parts[index]
            batch = build_batch(part.log.schema, values=[r.value for r in group], keys=[r.key for r in group],
                                timestamps_ms=[now_ms] * len(group))
            part.log.append(batch, leader_epoch=part.leader_epoch, fsync=fsync)

    def partition_of(self, owner: str) -> int:
        """The partition ``owner``'s records go to (creating the topic if it does not exist)."""
        return zlib.crc32(owner.encode()) % len(self.partitions())

    def read_all(self) -> Iterator[tuple[bytes, bytes | None]]:
        """Every record as ``(key, value)``, partition by partition, each in offset order."""
        for part in self._existing() or ():
            yield from self._read(part)

    def read_partition(self, index: int) -> Iterator[tuple[bytes, bytes | None]]:
        """The records of partition ``index`` as ``(key, value)``, in offset order."""
        parts = self._existing() or []
        if index < len(parts):
            yield from self._read(parts[index])

    @staticmethod
    def _read(part: Partition) -> Iterator[tuple[bytes, bytes | None]]:
        offset = part.log.log_start_offset
        while offset < part.log.log_end_offset:
            result = part.log.read(offset, max_bytes=_READ_BYTES)
            if not result.batches:
                break
            for rb in result.decode():
                if rb.num_rows:
                    yield from zip(rb.column("key").to_pylist(), rb.column("value").to_pylist(), strict=True)
            offset = result.next_offset
