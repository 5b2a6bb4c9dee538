"""One partition replica on this broker: its log, its producer state, and the bounds readers see.

A :class:`Partition` wraps a :class:`~logstore.storage.log.Log` with the
offsets readers must respect (DESIGN.md I5):

* the **high-water mark** (HWM), the exclusive bound of what any consumer may
  read. A partition that is not replicated (the single broker, or an internal
  topic) has HWM = LEO, computed, with nothing to maintain. A *replicated*
  partition keeps the HWM as state that the replica manager moves
  (:meth:`Partition.update_high_watermark`): a leader's HWM is the smallest LEO
  of its in-sync replicas and only grows; a follower's is the leader's HWM
  capped by its own LEO. Both are clamped to the LEO (a truncation lowers it).
  It starts at the checkpointed HWM (capped by the LEO) when the broker starts;
* the **last stable offset** (LSO), the bound for read_committed consumers:
  the first offset of the earliest open transaction, never above the HWM.

Appends: :meth:`Partition.append` (a producer's batch: sequence checks,
duplicate detection, and on a cluster the transaction check below),
:meth:`Partition.append_marker` (transaction markers),
:meth:`Partition.append_coordinator_transactional` (a coordinator's transactional
records: a transaction's consumer offsets) and, on a follower, :meth:`Partition.append_replica` (the leader's stored
batches byte for byte, see :mod:`logstore.storage.replica_append`) — all under
the partition's lock, so the producer state always reflects exactly the
batches in the log, on a leader and on its followers alike (sequences and the
LSO survive a leader change).

Roles (replicated partitions only): :meth:`Partition.become_leader` stamps new
appends with the leader epoch and writes the epoch's start into the leader
epoch cache *at once* (as Kafka does: a follower's OffsetsForLeaderEpoch for an
older epoch must see where it ends even before the new leader appends);
:meth:`Partition.become_follower` makes producer appends fail with
``NOT_LEADER_OR_FOLLOWER``; :meth:`Partition.truncate_to` removes a divergent
tail and rebuilds the producer state from the kept log;
:meth:`Partition.end_offset_for_epoch` answers OffsetsForLeaderEpoch.

A transactional batch on a cluster whose coordinator is another broker
(KIP-890): the leader appends it only if it continues the producer's open
transaction here (same epoch) or carries the **verification guard** the
leader took before asking the coordinator whether the partition is in that
transaction (:meth:`Partition.verification_guard`). A marker drops the guard,
so a transaction that ended while its first batch was being verified cannot be
reopened by that batch (a transaction nobody would ever end, holding the LSO).

Thread-safety: appends, truncation and role changes hold the partition's
lock; the HWM has its own small lock; reads take none.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable

import pyarrow as pa

from logstore.errors import InvalidTxnStateError, NotLeaderError, ProducerFencedError
from logstore.record import (
    ATTR_ABORT_MARKER,
    ATTR_CONTROL,
    ATTR_TRANSACTIONAL,
    NO_SEQUENCE,
    BatchHeader,
    build_batch,
)
from logstore.record_reader import StoredBatch
from logstore.storage.log import Log
from logstore.storage.producer_state import AbortedTxn, ProducerStateManager
from logstore.storage.replica_append import verify_replica_batches

__all__ = ["Partition", "UNDEFINED_EPOCH", "UNDEFINED_OFFSET"]

UNDEFINED_EPOCH = -1
UNDEFINED_OFFSET = -1


class Partition:
    """One partition on this broker; see the module docstring.

    ``replicated``: the HWM is state the replica manager moves (else it is the
    LEO); ``high_watermark``: where a replicated partition's HWM starts.
    """

    def __init__(self, topic: str, partition: int, log: Log, *, replicated: bool = False,
                 high_watermark: int = 0) -> None:
        self.topic = topic
        self.partition = partition
        self.log = log
        self.leader_epoch = 0
        self.replicated = replicated
        # A replicated partition is a follower until the replica manager says otherwise.
        self.is_leader = not replicated
        # Called after every leader append (producer batch or marker), lock released: the
        # replica manager moves the HWM of a leader whose ISR is itself, and wakes followers.
        self.on_append: Callable[[Partition], None] | None = None
        self._lock = threading.Lock()
        self._verification_guards: dict[int, set[object]] = {}   # producer id -> guards out (leader only)
        self._hwm_lock = threading.Lock()
        self._hwm = 0
        self.producers = ProducerStateManager(log.directory)
        if log.offline_reason is None:
            self._load_producer_state()
            self._hwm = min(high_watermark, log.log_end_offset)

    def _load_producer_state(self) -> None:
        """Snapshot, then replay the headers after it (see :mod:`logstore.storage.producer_state`)."""
        self.producers.load_snapshot(log_end_offset=self.log.log_end_offset)
        start = self.producers.applied_until
        if start < self.log.log_start_offset:
            self.producers.reset()
            start = self.log.log_start_offset
        for header in self.log.batch_headers(start):
            self.producers.apply(header)
        self.producers.truncate_from(self.log.log_start_offset)

    # ------------------------------------------------------------------ bounds

    @property
    def high_watermark(self) -> int:
        """Exclusive bound of what any consumer may read (the LEO when not replicated)."""
        if not self.replicated:
            return self.log.log_end_offset
        return self._hwm

    def update_high_watermark(self, value: int) -> bool:
        """Move a replicated partition's HWM; say whether it changed.

        A leader's only grows (``max(old, value)``); a follower's is set to
        ``value``. Either is clamped to the LEO.
        """
        with self._hwm_lock:
            leo = self.log.log_end_offset
            new = min(max(self._hwm, value) if self.is_leader else value, leo)
            if new == self._hwm:
                return False
            self._hwm = new
            return True

    @property
    def last_stable_offset(self) -> int:
        """Exclusive bound for read_committed consumers: the first open transaction's first offset."""
        hwm = self.high_watermark
        first_open = self.producers.first_unstable_offset()
        return hwm if first_open is None else min(first_open, hwm)

    def upper_bound(self, *, read_committed: bool) -> int:
        return self.last_stable_offset if read_committed else self.high_watermark

    # ------------------------------------------------------------------ leader appends

    def _check_leader(self) -> None:
        if not self.is_leader:
            raise NotLeaderError(
                f"this broker is not the leader of {self.topic}-{self.partition} "
                f"(leader epoch {self.leader_epoch}); refresh metadata and send to the leader"
            )

    def verification_guard(self, producer_id: int) -> object:
        """A guard for one request's transactional batches of ``producer_id``, taken before its
        coordinator is asked; it carries them to :meth:`append` once the coordinator confirmed
        the partition is in the transaction. Give it back with :meth:`release_verification_guard`
        whatever happened (each request has its own: one's failure never spoils another's)."""
        guard = object()
        with self._lock:
            self._verification_guards.setdefault(producer_id, set()).add(guard)
        return guard

    def release_verification_guard(self, producer_id: int, guard: object) -> None:
        """Forget ``guard`` (used, refused or abandoned): no guard outlives its request."""
        with self._lock:
            guards = self._verification_guards.get(producer_id)
            if guards is not None:
                guards.discard(guard)
                if not guards:
                    del self._verification_guards[producer_id]

    def in_open_transaction(self, producer_id: int, producer_epoch: int) -> bool:
        """Whether ``producer_id`` has a transaction open here at ``producer_epoch``."""
        with self._lock:
            return self.producers.in_open_transaction(producer_id, producer_epoch)

    def append(self, stored: StoredBatch, batch: pa.RecordBatch, schema: pa.Schema, *,
               fsync: bool, txn_guard: object | None = None) -> tuple[int, int]:
        """Append a producer's validated batch (``stored`` as sent, ``batch`` decoded, ``schema``
        the stream's); return (base offset, append time).

        A retried batch already in the log is not appended again: its original
        base offset is returned (idempotence). A replicated partition that is not
        the leader refuses with :class:`NotLeaderError`. With ``txn_guard`` (a
        transactional batch whose coordinator is elsewhere) the batch must continue
        the producer's open transaction or carry its current verification guard
        (:class:`InvalidTxnStateError` otherwise; see the module docstring).
        """
        header = stored.header
        with self._lock:
            self._check_leader()
            duplicate = self.producers.check(header, batch.num_rows)
            if duplicate is not None:
                return duplicate.base_offset, -1
            if txn_guard is not None and header.is_transactional:
                self._check_transaction(header, txn_guard)
            result = self.log.append_stored(stored, batch, schema, leader_epoch=self.leader_epoch, fsync=fsync)
            self.producers.apply(BatchHeader(
                base_offset=result.base_offset, last_offset_delta=result.last_offset - result.base_offset,
                record_count=batch.num_rows, max_timestamp=result.max_timestamp,
                leader_epoch=self.leader_epoch, producer_id=header.producer_id,
                producer_epoch=header.producer_epoch, base_sequence=header.base_sequence,
                attributes=header.attributes & ATTR_TRANSACTIONAL,
            ))
        self._appended()
        return result.base_offset, result.log_append_time_ms

    def _check_transaction(self, header: BatchHeader, guard: object) -> None:
        if self.producers.in_open_transaction(header.producer_id, header.producer_epoch):
            return
        if guard not in self._verification_guards.get(header.producer_id, ()):
            raise InvalidTxnStateError(
                f"producer {header.producer_id} epoch {header.producer_epoch} has no open transaction on "
                f"{self.topic}-{self.partition} that its coordinator confirmed (it ended meanwhile, or the "
                "partition was never added to it); abort the transaction")

    def append_coordinator_transactional(self, batch: pa.RecordBatch, *, producer_id: int, producer_epoch: int,
                                         fsync: bool, txn_guard: object | None = None) -> tuple[int, int]:
        """Append a coordinator's own records as a transactional batch of ``producer_id`` (the
        group coordinator's TxnOffsetCommit into ``__consumer_offsets``, as Kafka's); return the
        (base offset, last offset) it got.

        No sequence check (the broker writes it, not the producer: Kafka's coordinator origin;
        its base sequence is NO_SEQUENCE), but it opens (or continues) the producer's
        transaction here, so a COMMIT/ABORT marker for the producer ends it
        (:meth:`append_marker`) and the LSO waits for that marker. A producer epoch older than
        the one this partition knows is refused (:class:`ProducerFencedError`). With
        ``txn_guard`` the batch must continue the producer's open transaction here or carry
        that verification guard, taken before the coordinator confirmed the transaction
        (:class:`InvalidTxnStateError` otherwise: it ended meanwhile, and a batch opening a
        transaction nobody will end would hold the LSO and its offsets pending for ever).
        """
        with self._lock:
            self._check_leader()
            known = self.producers.epoch_of(producer_id)
            if known is not None and producer_epoch < known:
                raise ProducerFencedError(
                    f"producer {producer_id} epoch {producer_epoch} is fenced on {self.topic}-{self.partition}: "
                    f"epoch {known} has been used since")
            if txn_guard is not None and not self.producers.in_open_transaction(producer_id, producer_epoch) \
                    and txn_guard not in self._verification_guards.get(producer_id, ()):
                raise InvalidTxnStateError(
                    f"producer {producer_id} epoch {producer_epoch}: its transaction ended while its records for "
                    f"{self.topic}-{self.partition} were being checked; abort the transaction")
            result = self.log.append(batch, leader_epoch=self.leader_epoch, producer_id=producer_id,
                                     producer_epoch=producer_epoch, base_sequence=NO_SEQUENCE,
                                     attributes=ATTR_TRANSACTIONAL, fsync=fsync)
            self.producers.apply(BatchHeader(
                base_offset=result.base_offset, last_offset_delta=result.last_offset - result.base_offset,
                record_count=batch.num_rows, max_timestamp=result.max_timestamp, leader_epoch=self.leader_epoch,
                producer_id=producer_id, producer_epoch=producer_epoch, base_sequence=NO_SEQUENCE,
                attributes=ATTR_TRANSACTIONAL,
            ))
        self._appended()
        return result.base_offset, result.last_offset

    def append_marker(self, producer_id: int, producer_epoch: int, *, commit: bool,
                      coordinator_epoch: int = -1) -> int | None:
        """Write a COMMIT or ABORT marker ending ``producer_id``'s open transaction; fsync it.

        Returns the marker's offset, or None when the producer has no open
        transaction here (a marker written before a crash, or nothing sent).
        ``coordinator_epoch`` is the writing coordinator's (kept in the marker's
        ``base_sequence``); a marker from an older one than the last is refused with
        TRANSACTION_COORDINATOR_FENCED (:mod:`logstore.storage.producer_state`).
        """
        with self._lock:
            self._check_leader()
            self.producers.check_marker(producer_id, coordinator_epoch)
            self._verification_guards.pop(producer_id, None)   # confirmed for a transaction now ended
            if not self.producers.has_open_transaction(producer_id):
                return None
            schema = self.log.schema
            n = 1
            value_type = schema.field("value").type
            marker = build_batch(
                schema, values=pa.nulls(n, value_type), keys=[b"COMMIT" if commit else b"ABORT"],
                timestamps_ms=[int(time.time() * 1000)],
            )
            attributes = ATTR_CONTROL | ATTR_TRANSACTIONAL | (0 if commit else ATTR_ABORT_MARKER)
            result = self.log.append(
                marker, leader_epoch=self.leader_epoch, producer_id=producer_id,
                producer_epoch=producer_epoch, base_sequence=coordinator_epoch, attributes=attributes, fsync=True,
            )
            self.producers.apply(BatchHeader(
                base_offset=result.base_offset, last_offset_delta=0, record_count=1,
                max_timestamp=result.max_timestamp, leader_epoch=self.leader_epoch,
                producer_id=producer_id, producer_epoch=producer_epoch, base_sequence=coordinator_epoch,
                attributes=attributes,
            ))
        self._appended()
        return result.base_offset

    def _appended(self) -> None:
        listener = self.on_append
        if listener is not None:
            listener(self)

    # ------------------------------------------------------------------ replication

    def append_replica(self, schema_message: bytes | memoryview, records: memoryview) -> int:
        """Append the leader's stored batches as they are (a follower); return the new LEO.

        Checked first (:func:`~logstore.storage.replica_append.verify_replica_batches`): a
        bad answer raises :class:`~logstore.errors.CorruptRecordError` and nothing of it is
        written. Each batch's leader epoch enters the epoch cache and its producer facts the
        producer state. Refused (:class:`NotLeaderError`) on the leader.
        """
        with self._lock:
            if self.is_leader:
                raise NotLeaderError(f"{self.topic}-{self.partition} is led here (epoch "
                                     f"{self.leader_epoch}): it takes no replica appends")
            schema, batches = verify_replica_batches(
                schema_message, records, log_end_offset=self.log.log_end_offset,
                where=f"partition {self.topic}-{self.partition}",
            )
            if not batches:
                return self.log.log_end_offset
            leo = self.log.append_replica(schema, batches)
            for b in batches:
                self.producers.apply(b.header)
            return leo

    def become_leader(self, epoch: int) -> None:
        """Lead from now on at ``epoch``: appends are stamped with it; the epoch cache gets
        ``(epoch, LEO)`` now."""
        with self._lock:
            self.leader_epoch = epoch
            self.is_leader = True
            self.log.assign_leader_epoch(epoch)

    def become_follower(self, epoch: int) -> None:
        """Follow the leader of ``epoch``: producer appends are refused from now on."""
        with self._lock:
            self.leader_epoch = epoch
            self.is_leader = False

    def truncate_to(self, offset: int) -> None:
        """Remove every batch at or after ``offset`` (a follower's divergent tail): the log, the
        epoch cache's later entries, and the producer state (rebuilt from the kept log and
        snapshotted, so a stale snapshot is never loaded). The HWM is capped by the new LEO.
        Refused (:class:`NotLeaderError`) on a leader: a truncation decided while following
        must not run after the replica took over."""
        with self._lock:
            if self.replicated and self.is_leader:
                raise NotLeaderError(f"{self.topic}-{self.partition} is led here (epoch {self.leader_epoch}): "
                                     "a leader's log is never truncated")
            if offset >= self.log.log_end_offset:
                return
            self.log.truncate_to(offset)
            self.producers.reset()
            for header in self.log.batch_headers(self.log.log_start_offset):
                self.producers.apply(header)
            self.producers.write_snapshot()
        with self._hwm_lock:
            self._hwm = min(self._hwm, self.log.log_end_offset)

    def truncate_fully_and_start_at(self, offset: int) -> None:
        """Empty the log and continue at ``offset`` (the leader's log start offset, when this
        follower fell behind it); the producer state starts empty, the HWM at ``offset``."""
        with self._lock:
            if self.replicated and self.is_leader:
                raise NotLeaderError(f"{self.topic}-{self.partition} is led here: a leader's log is never emptied")
            self.log.truncate_fully_and_start_at(offset)
            self.producers.reset()
            self.producers.applied_until = offset
            self.producers.write_snapshot()
        with self._hwm_lock:
            self._hwm = offset

    def end_offset_for_epoch(self, epoch: int) -> tuple[int, int]:
        """Kafka's OffsetsForLeaderEpoch answer from this replica: ``(e, end)`` where ``e`` is the
        largest epoch ``<= epoch`` this log has and ``end`` the exclusive offset where it ends
        (the next epoch's start, or the LEO for the latest epoch). An ``epoch`` below every
        known one answers ``(epoch, first epoch's start)``; an unknown or newer one, or an
        empty cache, ``(-1, -1)``."""
        with self._lock:
            entries = self.log.epochs.entries
            leo = self.log.log_end_offset
        if epoch < 0 or not entries:
            return UNDEFINED_EPOCH, UNDEFINED_OFFSET
        if epoch == entries[-1].epoch:
            return epoch, leo
        higher = next((e for e in entries if e.epoch > epoch), None)
        if higher is None:
            return UNDEFINED_EPOCH, UNDEFINED_OFFSET
        floor = [e for e in entries if e.epoch <= epoch]
        return (floor[-1].epoch if floor else epoch), higher.start_offset

    # ------------------------------------------------------------------ misc

    def aborted_transactions(self, start: int, end: int) -> list[AbortedTxn]:
        with self._lock:
            return self.producers.aborted_between(start, end)

    def snapshot_producer_state(self) -> None:
        with self._lock:
            self.producers.truncate_from(self.log.log_start_offset)
            self.producers.write_snapshot()

    def close(self) -> None:
        with self._lock:
            if self.log.offline_reason is None:
                self.producers.write_snapshot()
            self.log.close()
