"""The transaction coordinator: transactional ids, producer ids and epochs, commit/abort.

A transactional id maps to one producer id and an epoch. Its transactions
are numbered (``txn_number``) and go through these states::

    EMPTY ──add partitions──▶ ONGOING ──end(commit)──▶ PREPARE_COMMIT ──markers──▶ COMPLETE_COMMIT
                                  └─────end(abort)───▶ PREPARE_ABORT  ──markers──▶ COMPLETE_ABORT
    COMPLETE_* ──add partitions──▶ ONGOING (txn_number + 1)

Fencing (the ordering flaw Jepsen found in Kafka's protocol cannot happen
here): every transactional request names the producer id, the epoch *and*
the transaction number it belongs to. A request from an older epoch gets
PRODUCER_FENCED; an ``end`` for an earlier transaction number never touches
the current transaction — a retried end of the transaction that just
completed with the same decision is answered OK, anything else is
INVALID_TXN_STATE. ``init_producer_id`` for an id with an open transaction
aborts it and bumps the epoch (a restarted producer fences its predecessor);
so does the timeout (``transaction.timeout.ms``) for a transaction left open
by a dead producer.

Durability: each transactional id's metadata is a JSON file in
``<data_dir>/meta/transactions/``, replaced atomically on every state change.
The decision (PREPARE_*) is persisted before any marker is written; a
coordinator that restarts finds PREPARE_* and writes the remaining markers
(markers are idempotent per partition: a partition whose producer has no
open transaction gets none). Producer ids come from a persisted counter,
allocated in blocks.

Thread-safety: all public methods take the coordinator's lock.
"""

from __future__ import annotations

import enum
import json
import os
import threading
import time
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field, replace

from logstore.errors import (
    ConcurrentTransactionsError,
    InvalidRequestError,
    InvalidTxnStateError,
    ProducerFencedError,
)
from logstore.fileutil import read_text_or, write_atomically

__all__ = ["TxnState", "TxnMetadata", "TransactionCoordinator", "MarkerWriter", "MAX_TIMEOUT_MS"]

MAX_TIMEOUT_MS = 15 * 60 * 1000
_PID_BLOCK = 1000
TopicPartitionKey = tuple[str, int]
# (partitions, producer id, producer epoch, commit?) -> None; writes and fsyncs markers.
MarkerWriter = Callable[[Iterable[TopicPartitionKey], int, int, bool], None]


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

    def to_json(self) -> bytes:
        return json.dumps({
            "transactional_id": self.transactional_id, "producer_id": self.producer_id,
            "producer_epoch": self.producer_epoch, "state": self.state.value,
            "txn_number": self.txn_number, "timeout_ms": self.timeout_ms,
            "partitions": sorted([t, p] for t, p in self.partitions), "txn_start_ms": self.txn_start_ms,
        }).encode()

    @classmethod
    def from_json(cls, data: str) -> TxnMetadata:
        d = json.loads(data)
        return cls(
            transactional_id=d["transactional_id"], producer_id=int(d["producer_id"]),
            producer_epoch=int(d["producer_epoch"]), state=TxnState(d["state"]),
            txn_number=int(d["txn_number"]), timeout_ms=int(d["timeout_ms"]),
            partitions=frozenset((t, int(p)) for t, p in d["partitions"]),
            txn_start_ms=int(d["txn_start_ms"]),
        )


def _file_name(transactional_id: str) -> str:
    return transactional_id.encode().hex() + ".json"


class TransactionCoordinator:
    """See the module docstring."""

    def __init__(self, data_dir: str, *, write_markers: MarkerWriter,
                 clock: Callable[[], float] = time.time) -> None:
        self._dir = os.path.join(data_dir, "meta", "transactions")
        self._pid_file = os.path.join(data_dir, "meta", "producer-id-block")
        self._write_markers = write_markers
        self._clock = clock
        self._lock = threading.RLock()
        self._txns: dict[str, TxnMetadata] = {}
        self._by_pid: dict[int, str] = {}
        self._next_pid = 0
        self._pid_limit = 0

    # ------------------------------------------------------------------ lifecycle

    def startup(self) -> None:
        """Load every transactional id and finish transactions caught in PREPARE_*."""
        os.makedirs(self._dir, exist_ok=True)
        with self._lock:
            self._next_pid = self._pid_limit = int(read_text_or(self._pid_file, "0").strip() or 0)
            for name in os.listdir(self._dir):
                if name.endswith(".json"):
                    meta = TxnMetadata.from_json(read_text_or(os.path.join(self._dir, name), ""))
                    self._txns[meta.transactional_id] = meta
                    self._by_pid[meta.producer_id] = meta.transactional_id
            for meta in list(self._txns.values()):
                if meta.state in (TxnState.PREPARE_COMMIT, TxnState.PREPARE_ABORT):
                    self._complete(meta)

    def _now_ms(self) -> int:
        return int(self._clock() * 1000)

    def _persist(self, meta: TxnMetadata) -> TxnMetadata:
        write_atomically(os.path.join(self._dir, _file_name(meta.transactional_id)), meta.to_json())
        self._txns[meta.transactional_id] = meta
        self._by_pid[meta.producer_id] = meta.transactional_id
        return meta

    def _allocate_pid(self) -> int:
        if self._next_pid >= self._pid_limit:
            self._pid_limit = self._next_pid + _PID_BLOCK
            write_atomically(self._pid_file, f"{self._pid_limit}\n".encode())
        pid = self._next_pid
        self._next_pid += 1
        return pid

    # ------------------------------------------------------------------ requests

    def init_producer_id(self, transactional_id: str, *, timeout_ms: int) -> tuple[int, int]:
        """A producer id and epoch; for a transactional id, fence and abort its predecessor."""
        with self._lock:
            if not transactional_id:
                return self._allocate_pid(), 0
            if not 1 <= timeout_ms <= MAX_TIMEOUT_MS:
                raise InvalidRequestError(
                    f"transaction.timeout.ms must be between 1 and {MAX_TIMEOUT_MS}, got {timeout_ms}"
                )
            meta = self._txns.get(transactional_id)
            if meta is None:
                meta = TxnMetadata(transactional_id, self._allocate_pid(), 0, TxnState.EMPTY, 0, timeout_ms)
                self._persist(meta)
                return meta.producer_id, meta.producer_epoch
            if meta.state == TxnState.ONGOING:
                self._abort_with_bump(meta)
                meta = self._txns[transactional_id]
            elif meta.state in (TxnState.PREPARE_COMMIT, TxnState.PREPARE_ABORT):
                meta = self._complete(meta)
            meta = self._persist(replace(meta, producer_epoch=meta.producer_epoch + 1, timeout_ms=timeout_ms,
                                         state=meta.state if meta.state != TxnState.ONGOING else TxnState.EMPTY))
            return meta.producer_id, meta.producer_epoch

    def _fenced(self, transactional_id: str, producer_id: int, producer_epoch: int) -> TxnMetadata:
        meta = self._txns.get(transactional_id)
        if meta is None:
            raise InvalidTxnStateError(
                f"transactional id {transactional_id!r} is unknown; call init_transactions() first"
            )
        if producer_id != meta.producer_id or producer_epoch < meta.producer_epoch:
            raise ProducerFencedError(
                f"producer {producer_id} epoch {producer_epoch} of transactional id {transactional_id!r} "
                f"is fenced by producer {meta.producer_id} epoch {meta.producer_epoch}"
            )
        if producer_epoch > meta.producer_epoch:
            raise InvalidTxnStateError(
                f"epoch {producer_epoch} is newer than the coordinator's {meta.producer_epoch}"
            )
        return meta

    def add_partitions(self, transactional_id: str, producer_id: int, producer_epoch: int,
                       partitions: Iterable[TopicPartitionKey]) -> int:
        """Add partitions to the current transaction (starting one if none is open); return its number."""
        with self._lock:
            meta = self._fenced(transactional_id, producer_id, producer_epoch)
            if meta.state in (TxnState.PREPARE_COMMIT, TxnState.PREPARE_ABORT):
                raise ConcurrentTransactionsError(
                    f"transaction {meta.txn_number} of {transactional_id!r} is still completing; retry"
                )
            if meta.state != TxnState.ONGOING:
                meta = replace(meta, state=TxnState.ONGOING, txn_number=meta.txn_number + 1,
                               partitions=frozenset(), txn_start_ms=self._now_ms())
            added = meta.partitions | frozenset(partitions)
            if added != meta.partitions or meta is not self._txns.get(transactional_id):
                meta = self._persist(replace(meta, partitions=added))
            return meta.txn_number

    def verify_partition(self, producer_id: int, producer_epoch: int, tp: TopicPartitionKey) -> None:
        """Raise unless ``tp`` is part of the open transaction of ``producer_id``/``producer_epoch``."""
        with self._lock:
            txn_id = self._by_pid.get(producer_id)
            meta = self._txns.get(txn_id) if txn_id is not None else None
            if meta is None:
                raise InvalidTxnStateError(f"producer {producer_id} has no transactional id")
            if producer_epoch < meta.producer_epoch:
                raise ProducerFencedError(
                    f"producer {producer_id} epoch {producer_epoch} is fenced by epoch {meta.producer_epoch}"
                )
            if meta.state != TxnState.ONGOING or tp not in meta.partitions:
                raise InvalidTxnStateError(
                    f"partition {tp[0]}-{tp[1]} is not part of an open transaction of "
                    f"{meta.transactional_id!r}; add it before sending"
                )

    def end_txn(self, transactional_id: str, producer_id: int, producer_epoch: int,
                txn_number: int, *, commit: bool) -> None:
        """Commit or abort transaction ``txn_number``; idempotent for a retried request."""
        with self._lock:
            meta = self._fenced(transactional_id, producer_id, producer_epoch)
            wanted = "commit" if commit else "abort"
            if txn_number != meta.txn_number:
                raise InvalidTxnStateError(
                    f"request to {wanted} transaction {txn_number} of {transactional_id!r} is stale: "
                    f"transaction {meta.txn_number} is current; it was not applied"
                )
            done = TxnState.COMPLETE_COMMIT if commit else TxnState.COMPLETE_ABORT
            prepare = TxnState.PREPARE_COMMIT if commit else TxnState.PREPARE_ABORT
            if meta.state == done:
                return  # a retry of the request that completed this transaction
            if meta.state == prepare:
                self._complete(meta)
                return
            if meta.state != TxnState.ONGOING:
                raise InvalidTxnStateError(
                    f"cannot {wanted} transaction {txn_number} of {transactional_id!r}: it is {meta.state.value}"
                )
            self._complete(self._persist(replace(meta, state=prepare)))

    def _complete(self, meta: TxnMetadata) -> TxnMetadata:
        commit = meta.state == TxnState.PREPARE_COMMIT
        self._write_markers(sorted(meta.partitions), meta.producer_id, meta.producer_epoch, commit)
        return self._persist(replace(meta, state=TxnState.COMPLETE_COMMIT if commit else TxnState.COMPLETE_ABORT))

    def _abort_with_bump(self, meta: TxnMetadata) -> TxnMetadata:
        """Abort the open transaction with a bumped epoch, fencing the producer that owns it."""
        bumped = self._persist(replace(meta, producer_epoch=meta.producer_epoch + 1, state=TxnState.PREPARE_ABORT))
        return self._complete(bumped)

    def abort_expired(self) -> list[str]:
        """Abort transactions open longer than their timeout; return their transactional ids."""
        with self._lock:
            now = self._now_ms()
            expired = [m for m in self._txns.values()
                       if m.state == TxnState.ONGOING and now - m.txn_start_ms > m.timeout_ms]
            for meta in expired:
                self._abort_with_bump(meta)
            return [m.transactional_id for m in expired]

    def describe(self, transactional_id: str) -> TxnMetadata | None:
        with self._lock:
            return self._txns.get(transactional_id)
