"""Per-partition producer state: idempotence, open transactions, aborted transactions.

For every producer id that wrote to the partition the broker remembers its
epoch, the sequence of its last record, the metadata of its last
:data:`DEDUP_WINDOW` batches (so a retried batch is answered with its
original offsets instead of being appended twice) and, when a transaction
is open, the offset of its first record. From that it derives:

* the **LSO** — the first offset of the earliest open transaction, or the
  HWM when none is open (read_committed readers stop there, DESIGN I5);
* the **aborted transactions index** — ``(producer id, first offset, last
  offset)`` per aborted transaction, which Fetch returns so read_committed
  readers can drop aborted records.

Sequence rules for a batch of producer ``p`` with epoch ``e`` and base
sequence ``s`` (no checks at all when ``p`` is -1, a plain producer):

* ``e`` below the known epoch → :class:`ProducerFencedError`;
* ``e`` above it (a new epoch) → ``s`` must be 0;
* same epoch, ``(s, last)`` equal to a remembered batch → duplicate:
  answer the remembered offsets, append nothing;
* otherwise ``s`` must be the last sequence + 1 → else
  :class:`OutOfOrderSequenceError`. An unknown producer must start at 0.

Durability: the state is a pure function of the partition's batch headers,
so it is rebuilt by replaying headers (:meth:`ProducerStateManager.replay`)
from the last snapshot (``producer-state.json``, written atomically on
clean close and roll) to the LEO. A snapshot beyond the LEO (truncation) is
ignored and the replay starts at the log start.

Markers: a control batch's ``base_sequence`` holds the epoch of the transaction
coordinator that wrote it (the leader epoch of its ``__transaction_state``
partition; -1 in markers written before this was kept), as Kafka keeps it in the
marker's value. Each producer remembers the newest such epoch, so a marker of an
older coordinator epoch — from a coordinator deposed meanwhile, arriving late —
is refused (:meth:`ProducerStateManager.check_marker`) instead of ending the
producer's next transaction; replay from the headers restores it.

``max_producer_id`` is the largest producer id counter the partition has ever seen
(:func:`~logstore.producer_id_layout.counter_of`: a bound id counts as its counter)
(kept in the snapshot, never lowered by a reset or a truncation; -1: none).
The single broker's producer-id allocation never hands out an id at or below
it (:mod:`logstore.broker.transactions.coordinator`): a reissued id would make
the new producer's batches look like duplicates of the old one's.

Thread-safety: guarded by the owning partition's lock.
"""

from __future__ import annotations

import json
import os
from collections import deque
from dataclasses import dataclass, field

from logstore.errors import (
    OutOfOrderSequenceError,
    ProducerFencedError,
    TransactionCoordinatorFencedError,
)
from logstore.producer_id_layout import counter_of
from logstore.record import NO_PRODUCER_ID, BatchHeader
from logstore.storage.fileutil import read_text_or, write_atomically

__all__ = [
    "AbortedTxn",
    "BatchAppend",
    "ProducerStateManager",
    "DEDUP_WINDOW",
    "PRODUCER_STATE_FILE",
]

DEDUP_WINDOW = 5
PRODUCER_STATE_FILE = "producer-state.json"
_SEQ_MOD = 2**31


@dataclass(frozen=True, slots=True)
class AbortedTxn:
    """Records of ``producer_id`` in ``[first_offset, last_offset]`` belong to an aborted transaction
    (``last_offset`` is the abort marker's offset)."""

    producer_id: int
    first_offset: int
    last_offset: int


@dataclass(frozen=True, slots=True)
class BatchAppend:
    """A remembered batch: sequences ``[first_seq, last_seq]`` at offsets ``[base, last]``."""

    first_seq: int
    last_seq: int
    base_offset: int
    last_offset: int


@dataclass(slots=True)
class _Producer:
    epoch: int
    last_seq: int = -1
    batches: deque[BatchAppend] = field(default_factory=lambda: deque(maxlen=DEDUP_WINDOW))
    txn_first_offset: int = -1
    coordinator_epoch: int = -1   # of the newest marker (see the module docstring)


class ProducerStateManager:
    """The producer state of one partition; see the module docstring."""

    def __init__(self, directory: str) -> None:
        self.directory = directory
        self._producers: dict[int, _Producer] = {}
        self._aborted: list[AbortedTxn] = []
        self.applied_until = 0  # exclusive: batches below it are reflected in the state
        self.max_producer_id = NO_PRODUCER_ID  # see the module docstring

    # ------------------------------------------------------------------ checks

    def check(self, header: BatchHeader, record_count: int) -> BatchAppend | None:
        """Validate a producer batch before it is appended.

        Returns the remembered :class:`BatchAppend` when the batch is a
        duplicate of one already in the log (the caller answers with its
        offsets and appends nothing), else None. Raises on fencing and on
        sequence gaps.
        """
        pid = header.producer_id
        if pid == NO_PRODUCER_ID:
            return None
        entry = self._producers.get(pid)
        first = header.base_sequence
        last = (first + record_count - 1) % _SEQ_MOD
        if entry is None:
            if first != 0:
                raise OutOfOrderSequenceError(
                    f"producer {pid} is unknown to this partition and must start at sequence 0, "
                    f"got {first}"
                )
            return None
        if header.producer_epoch < entry.epoch:
            raise ProducerFencedError(
                f"producer {pid} epoch {header.producer_epoch} is fenced: epoch {entry.epoch} "
                "has been used since (a newer producer with the same id took over)"
            )
        if header.producer_epoch > entry.epoch:
            if first != 0:
                raise OutOfOrderSequenceError(
                    f"producer {pid} starts epoch {header.producer_epoch} at sequence {first}; "
                    "a new epoch must start at 0"
                )
            return None
        for b in entry.batches:
            if b.first_seq == first and b.last_seq == last:
                return b
        expected = (entry.last_seq + 1) % _SEQ_MOD
        if first != expected:
            raise OutOfOrderSequenceError(
                f"producer {pid} epoch {entry.epoch}: expected sequence {expected}, got {first} "
                f"(batches were lost or reordered)"
            )
        return None

    def check_marker(self, producer_id: int, coordinator_epoch: int) -> None:
        """Refuse a marker from a coordinator older than the last marker's (-1: not known)."""
        entry = self._producers.get(producer_id)
        if entry is not None and 0 <= coordinator_epoch < entry.coordinator_epoch:
            raise TransactionCoordinatorFencedError(
                f"a transaction marker for producer {producer_id} from coordinator epoch {coordinator_epoch} "
                f"is fenced: a coordinator of epoch {entry.coordinator_epoch} wrote one since")

    def is_ahead(self, header: BatchHeader) -> bool:
        """Whether ``header``'s batch starts past the sequence this partition expects next, so
        that :meth:`check` would refuse it now but accept it once the batches before it arrive
        (a pipelined request that overtook its predecessor). A hint read without the caller's
        lock: :meth:`check`, under it, decides."""
        pid = header.producer_id
        if pid == NO_PRODUCER_ID:
            return False
        entry = self._producers.get(pid)
        first = header.base_sequence
        if entry is None or header.producer_epoch > entry.epoch:
            return first != 0
        if header.producer_epoch < entry.epoch:
            return False
        ahead = (first - entry.last_seq - 1) % _SEQ_MOD
        return 0 < ahead < _SEQ_MOD // 2

    # ------------------------------------------------------------------ updates

    def apply(self, header: BatchHeader) -> None:
        """Account for a batch now in the log (appended, or replayed on recovery)."""
        self.applied_until = max(self.applied_until, header.next_offset)
        pid = header.producer_id
        if pid == NO_PRODUCER_ID:
            return
        self.max_producer_id = max(self.max_producer_id, counter_of(pid))
        entry = self._producers.get(pid)
        if entry is None or header.producer_epoch > entry.epoch:
            entry = _Producer(epoch=header.producer_epoch, txn_first_offset=entry.txn_first_offset if entry else -1,
                              coordinator_epoch=entry.coordinator_epoch if entry else -1)
            self._producers[pid] = entry
        if header.is_control:
            entry.coordinator_epoch = max(entry.coordinator_epoch, header.base_sequence)
            if entry.txn_first_offset >= 0 and header.is_abort_marker:
                self._aborted.append(AbortedTxn(pid, entry.txn_first_offset, header.base_offset))
            entry.txn_first_offset = -1
            return
        if header.is_transactional and entry.txn_first_offset < 0:
            entry.txn_first_offset = header.base_offset
        last_seq = (header.base_sequence + header.record_count - 1) % _SEQ_MOD
        entry.last_seq = last_seq
        entry.batches.append(BatchAppend(header.base_sequence, last_seq, header.base_offset, header.last_offset))

    def epoch_of(self, producer_id: int) -> int | None:
        """The newest epoch of ``producer_id`` seen here (None: the producer never wrote here)."""
        entry = self._producers.get(producer_id)
        return None if entry is None else entry.epoch

    def has_open_transaction(self, producer_id: int) -> bool:
        entry = self._producers.get(producer_id)
        return entry is not None and entry.txn_first_offset >= 0

    def in_open_transaction(self, producer_id: int, producer_epoch: int) -> bool:
        """Whether ``producer_id`` has a transaction open here at exactly ``producer_epoch``."""
        entry = self._producers.get(producer_id)
        return entry is not None and entry.txn_first_offset >= 0 and entry.epoch == producer_epoch

    def first_unstable_offset(self) -> int | None:
        """The first offset of the earliest open transaction, or None when none is open."""
        firsts = [p.txn_first_offset for p in self._producers.values() if p.txn_first_offset >= 0]
        return min(firsts) if firsts else None

    def aborted_between(self, start: int, end: int) -> list[AbortedTxn]:
        """Aborted transactions with records in ``[start, end)``."""
        return [a for a in self._aborted if a.last_offset >= start and a.first_offset < end]

    def truncate_from(self, log_start_offset: int) -> None:
        """Forget aborted transactions wholly below the log start offset."""
        self._aborted = [a for a in self._aborted if a.last_offset >= log_start_offset]

    def reset(self) -> None:
        self._producers.clear()
        self._aborted.clear()
        self.applied_until = 0

    # ------------------------------------------------------------------ snapshot

    def write_snapshot(self) -> None:
        doc = {
            "applied_until": self.applied_until,
            "max_producer_id": max(self.max_producer_id, *map(counter_of, self._producers), NO_PRODUCER_ID),
            "producers": {
                str(pid): {
                    "epoch": p.epoch, "last_seq": p.last_seq, "txn_first_offset": p.txn_first_offset,
                    "coordinator_epoch": p.coordinator_epoch,
                    "batches": [[b.first_seq, b.last_seq, b.base_offset, b.last_offset] for b in p.batches],
                }
                for pid, p in self._producers.items()
            },
            "aborted": [[a.producer_id, a.first_offset, a.last_offset] for a in self._aborted],
        }
        write_atomically(os.path.join(self.directory, PRODUCER_STATE_FILE), json.dumps(doc).encode())

    def load_snapshot(self, *, log_end_offset: int) -> None:
        """Load the snapshot if it is not beyond the LEO; otherwise start empty."""
        self.reset()
        try:
            text = read_text_or(os.path.join(self.directory, PRODUCER_STATE_FILE), "")
            if not text:
                return
            doc = json.loads(text)
            ids = [counter_of(int(pid)) for pid in doc["producers"]]
            self.max_producer_id = max(self.max_producer_id, counter_of(int(doc.get("max_producer_id", -1))), *ids, -1)
            if int(doc["applied_until"]) > log_end_offset:
                return
            for pid, p in doc["producers"].items():
                entry = _Producer(epoch=int(p["epoch"]), last_seq=int(p["last_seq"]),
                                  txn_first_offset=int(p["txn_first_offset"]),
                                  coordinator_epoch=int(p.get("coordinator_epoch", -1)))
                entry.batches.extend(BatchAppend(*map(int, b)) for b in p["batches"])
                self._producers[int(pid)] = entry
            self._aborted = [AbortedTxn(*map(int, a)) for a in doc["aborted"]]
            self.applied_until = int(doc["applied_until"])
        except (ValueError, KeyError, TypeError, AttributeError):
            # A damaged snapshot is only an optimisation: replay from the start instead.
            self.reset()
