"""The transaction coordinator's :class:`~logstore.broker.transactions.records.TxnStateLog` in
the internal topic ``__transaction_state``.

Each state change of a transactional id, and each committed batch of a transaction
group, is one record (key and JSON value as :mod:`logstore.broker.transactions.records`
says) appended with fsync — the decision of a transaction (PREPARE_*) and a group's
decision record are durable before any marker is written. Records of one coordinator
key go to one partition (``crc32(coordinator key) % partitions``, by
:class:`~logstore.broker.internal_log.InternalTopicLog`'s owner rule), in the order
written; the topic is compacted (``cleanup.policy=compact``: the latest record of
each key is the state). The partition count is fixed when the topic is created
(``transaction_state_num_partitions``, default 10); an existing topic keeps its own.

Older state is imported once, when the topic is created: the per-id JSON files of
``<data_dir>/meta/transactions/`` (then removed) and the group decisions of the
former ``__sink_commits`` topic (then deleted).

Thread-safety: as :class:`~logstore.broker.internal_log.InternalTopicLog`.
"""

from __future__ import annotations

import contextlib
import logging
import os
import shutil
from collections.abc import Iterator

from logstore.broker.internal_log import InternalRecord, InternalReplication, InternalTopicLog
from logstore.broker.transactions.records import (
    TXN_STATE_TOPIC,
    GroupDecision,
    StateRecord,
    TxnMetadata,
    TxnStateLog,
    coordinator_key,
    decode_record,
    record_key,
)
from logstore.errors import LogstoreError, UnknownTopicOrPartitionError
from logstore.storage.fileutil import read_text_or
from logstore.storage.log_manager import LogManager

__all__ = ["TopicTxnStateLog", "DEFAULT_PARTITIONS"]

DEFAULT_PARTITIONS = 10
_LEGACY_DECISIONS_TOPIC = "__sink_commits"
log = logging.getLogger("logstore.broker.txn")


class TopicTxnStateLog(TxnStateLog):
    """Coordinator records in ``__transaction_state``; see the module docstring."""

    def __init__(self, manager: LogManager, *, partitions: int = DEFAULT_PARTITIONS) -> None:
        self._manager = manager
        self._log = InternalTopicLog(manager, TXN_STATE_TOPIC, partitions=partitions,
                                     configs={"cleanup.policy": "compact"})
        self._count = 0

    def use_cluster(self, cluster: InternalReplication) -> None:
        """Keep the records in the cluster's replicated ``__transaction_state`` (created in etcd by
        the broker); appends return once the in-sync replicas have them."""
        self._log.use_cluster(cluster)

    def partition_count(self) -> int:
        if not self._count:
            self._count = self._log.partition_count()
        return self._count

    def prepare(self) -> None:
        try:
            self._manager.partitions_of(TXN_STATE_TOPIC)
        except UnknownTopicOrPartitionError:
            self._import_legacy()
        self.partition_count()

    def append(self, record: StateRecord) -> None:
        owner = coordinator_key(record.transactional_id if isinstance(record, TxnMetadata) else record.group_id)
        self._log.append([InternalRecord(owner, record_key(record), record.to_json())], fsync=True)

    def read_partition(self, partition: int) -> Iterator[StateRecord]:
        for key, value in self._log.read_partition(partition):
            record = decode_record(key, value)
            if record is not None:
                yield record

    def _import_legacy(self) -> None:
        """State kept by older versions: per-id JSON files and the ``__sink_commits`` topic."""
        legacy_dir = os.path.join(self._manager.data_dir, "meta", "transactions")
        records: list[StateRecord] = []
        if os.path.isdir(legacy_dir):
            for name in sorted(os.listdir(legacy_dir)):
                if name.endswith(".json"):
                    records.append(TxnMetadata.from_json(read_text_or(os.path.join(legacy_dir, name), "")))
        decisions = InternalTopicLog(self._manager, _LEGACY_DECISIONS_TOPIC, partitions=1, configs={})
        records += [GroupDecision.from_json(v) for _, v in decisions.read_all() if v is not None]
        for record in records:
            self.append(record)
        if records:
            log.info("imported %d transaction records into %s", len(records), TXN_STATE_TOPIC)
        shutil.rmtree(legacy_dir, ignore_errors=True)
        with contextlib.suppress(LogstoreError):  # there was none
            self._manager.delete_topic(_LEGACY_DECISIONS_TOPIC)
