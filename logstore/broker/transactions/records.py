"""What the transaction coordinator keeps: its records, and the log it keeps them in.

The coordinator's state is two kinds of record, each a JSON value under a key:

* :class:`TxnMetadata` — one transactional id's producer id, epoch, transaction
  number, state and partitions (key ``t:<transactional id>``; the latest wins);
* :class:`GroupDecision` — the last committed batch of a transaction group, the
  exactly-once Spark sink's commit point (key ``g:<group id>``; the latest wins).

The two prefixes keep the kinds apart whatever the ids contain.

The coordinator key
-------------------
Records live in the internal topic ``__transaction_state``
(:data:`TXN_STATE_TOPIC`), a record of id ``x`` in partition
``crc32(coordinator_key(x)) % partitions``, where the *coordinator key* is the
part of the id before its first ``/`` (:func:`coordinator_key`). The Spark sink
names its transactions ``<sinkId>/<batchId>/<task>.<attempt>`` and its group
``<sinkId>``: all of a sink's transactions and its decisions land in one
partition, so one coordinator (that partition's leader) owns the sink entirely
and a group decision never spans coordinators. Kafka's rule is the same with the
whole id as the key; clients ask ``FindCoordinator(TRANSACTION, coordinator_key)``.

:class:`TxnStateLog` is where the records go: :meth:`TxnStateLog.append` returns
once the record is durable (fsynced on a single broker), and
:meth:`TxnStateLog.read_partition` gives one partition's records back in the
order written (see :mod:`logstore.broker.transactions.state_log`).

Thread-safety: the records are immutable values.
"""

from __future__ import annotations

import enum
import json
import zlib
from collections.abc import Iterator
from dataclasses import dataclass, field

from logstore.naming import coordinator_key
from logstore.types import TxnRef

__all__ = ["TXN_STATE_TOPIC", "TxnState", "TxnMetadata", "GroupDecision", "TxnStateLog", "StateRecord",
           "TopicPartitionKey", "coordinator_key", "record_key", "decode_record"]

TXN_STATE_TOPIC = "__transaction_state"
TopicPartitionKey = tuple[str, int]


class TxnState(str, enum.Enum):
    EMPTY = "EMPTY"
    ONGOING = "ONGOING"
    PREPARE_COMMIT = "PREPARE_COMMIT"
    PREPARE_ABORT = "PREPARE_ABORT"
    COMPLETE_COMMIT = "COMPLETE_COMMIT"
    COMPLETE_ABORT = "COMPLETE_ABORT"


@dataclass(frozen=True, slots=True)
class TxnMetadata:
    transactional_id: str
    producer_id: int
    producer_epoch: int
    state: TxnState
    txn_number: int
    timeout_ms: int
    partitions: frozenset[TopicPartitionKey] = field(default_factory=frozenset)
    txn_start_ms: int = -1
    # The epoch before the last bump made for this producer itself (KIP-360: its bump after an
    # abortable error, or the abort of its timed-out transaction), so that it may ask again
    # with it after losing the answer; -1 when a new producer took the id over.
    last_producer_epoch: int = -1

    def to_json(self) -> bytes:
        return json.dumps({
            "transactional_id": self.transactional_id, "producer_id": self.producer_id,
            "producer_epoch": self.producer_epoch, "state": self.state.value,
            "txn_number": self.txn_number, "timeout_ms": self.timeout_ms,
            "partitions": sorted([t, p] for t, p in self.partitions), "txn_start_ms": self.txn_start_ms,
            "last_producer_epoch": self.last_producer_epoch,
        }).encode()

    @classmethod
    def from_json(cls, data: str | bytes) -> TxnMetadata:
        d = json.loads(data)
        return cls(
            transactional_id=d["transactional_id"], producer_id=int(d["producer_id"]),
            producer_epoch=int(d["producer_epoch"]), state=TxnState(d["state"]),
            txn_number=int(d["txn_number"]), timeout_ms=int(d["timeout_ms"]),
            partitions=frozenset((t, int(p)) for t, p in d["partitions"]),
            txn_start_ms=int(d["txn_start_ms"]), last_producer_epoch=int(d.get("last_producer_epoch", -1)),
        )


@dataclass(frozen=True, slots=True)
class GroupDecision:
    """A committed batch of a transaction group."""

    group_id: str
    batch_id: int
    txns: tuple[TxnRef, ...]

    def to_json(self) -> bytes:
        return json.dumps({"group": self.group_id, "batch_id": self.batch_id,
                           "txns": [[t.transactional_id, t.producer_id, t.producer_epoch, t.txn_number]
                                    for t in self.txns]}).encode()

    @classmethod
    def from_json(cls, data: str | bytes) -> GroupDecision:
        d = json.loads(data)
        return cls(d["group"], int(d["batch_id"]), tuple(TxnRef(t[0], int(t[1]), int(t[2]), int(t[3])) for t in d["txns"]))


StateRecord = TxnMetadata | GroupDecision


def record_key(record: StateRecord) -> bytes:
    """The record's key in the state log: ``t:`` + transactional id, ``g:`` + group id."""
    if isinstance(record, TxnMetadata):
        return b"t:" + record.transactional_id.encode()
    return b"g:" + record.group_id.encode()


def decode_record(key: bytes, value: bytes | None) -> StateRecord | None:
    """A record read back from the state log (None: a tombstone or a key of another kind)."""
    if value is None:
        return None
    if key.startswith(b"t:"):
        return TxnMetadata.from_json(value)
    if key.startswith(b"g:"):
        return GroupDecision.from_json(value)
    return None


class TxnStateLog:
    """Where the coordinator's records go (see the module docstring)."""

    def partition_count(self) -> int:  # pragma: no cover - interface
        raise NotImplementedError

    def partition_of(self, key: str) -> int:
        """The state partition of a transactional or group id."""
        return zlib.crc32(coordinator_key(key).encode()) % self.partition_count()

    def prepare(self) -> None:
        """Make the log ready before the first load (create it; import older state)."""

    def append(self, record: StateRecord) -> None:  # pragma: no cover - interface
        """Append ``record``; durable when this returns."""
        raise NotImplementedError

    def read_partition(self, partition: int) -> Iterator[StateRecord]:  # pragma: no cover - interface
        """The records of ``partition`` in the order written."""
        raise NotImplementedError
