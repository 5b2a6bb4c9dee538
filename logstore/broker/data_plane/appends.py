"""A produce's appends: validated in parallel, each idempotent batch appended after the
batches before it.

A producer keeps up to five requests per partition in flight (pipelining,
:mod:`logstore.client.producer.sender`). They leave in sequence order, but the
broker may start handling them in another: HTTP/2 multiplexes them on one
connection, so a small request can be received whole before a large one sent
just ahead of it, and the I/O pool validates several at once. Appended as it
comes, an idempotent producer's batch that overtook its predecessor would be
refused as OUT_OF_ORDER_SEQUENCE and sent again, costing a round trip (the
sequence check keeps the log right either way). Kafka avoids this by handling
one request per connection at a time; we keep the parallel validation and
order by sequence instead: :class:`SequenceGate` holds a validated request
whose first batch is ahead of what the partition expects
(:meth:`~logstore.storage.producer_state.ProducerStateManager.is_ahead`) until
an append to that partition lets it through, for at most
:data:`MAX_HOLD_S`. A request whose predecessor really was lost is then
appended and refused as before, and its producer resends in order.

Thread-safety: :class:`SequenceGate` is used on the event loop only;
:func:`validate` and :func:`append_valid` run on the I/O pool.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import Callable
from dataclasses import dataclass
from typing import NamedTuple

from logstore.broker.data_plane.waiters import PartitionWaiters
from logstore.broker.transactions.coordinator import TransactionCoordinator
from logstore.record import BatchHeader
from logstore.storage.log_manager import LogManager, Partition
from logstore.storage.validation import ValidatedRecords, validate_records

__all__ = ["MAX_HOLD_S", "Attempt", "SequenceGate", "Unverified", "append_valid", "unverified_transaction",
           "validate", "validate_and_append"]

# Long enough for a predecessor to be received and validated; short against a lost one.
MAX_HOLD_S = 0.5


class SequenceGate:
    """Holds idempotent requests that overtook their predecessors; see the module docstring."""

    def __init__(self) -> None:
        self._waiters = PartitionWaiters()

    async def wait_turn(self, part: Partition, valid: ValidatedRecords) -> None:
        """Return once ``valid``'s first batch is not ahead of ``part``'s expected sequence,
        or after :data:`MAX_HOLD_S`."""
        header = valid.batches[0][0].header
        loop = asyncio.get_running_loop()
        deadline = loop.time() + MAX_HOLD_S
        key = [(part.topic, part.partition)]
        while part.producers.is_ahead(header):
            remaining = deadline - loop.time()
            if remaining <= 0:
                return
            waiter: asyncio.Future[None] = loop.create_future()
            self._waiters.watch(key, waiter)
            try:
                with contextlib.suppress(asyncio.TimeoutError):
                    await asyncio.wait_for(waiter, remaining)
            finally:
                self._waiters.unwatch(key, waiter)

    def appended(self, topic: str, partition: int) -> None:
        """An append to the partition ended (whatever its outcome): held requests look again."""
        self._waiters.wake(topic, partition)


def validate(part: Partition, records: bytes | memoryview, *, max_decompressed_bytes: int) -> ValidatedRecords:
    """Check a produce's records for ``part`` (nothing is written unless all pass)."""
    return validate_records(
        records, log_schema=part.log.schema, max_message_bytes=part.log.config.max_message_bytes,
        max_decompressed_bytes=max_decompressed_bytes, where=f"produce to {part.topic}-{part.partition}",
    )


@dataclass(frozen=True, slots=True)
class Unverified:
    """A transactional producer whose coordinator is another broker and has not yet confirmed
    that the partition is in its open transaction; ``guard`` is the partition's verification
    guard, taken before asking (:mod:`logstore.broker.transactions.verifier`)."""

    producer_id: int
    producer_epoch: int
    guard: object


class Attempt(NamedTuple):
    """What :func:`validate_and_append` did: ``appended`` is None when the records are not
    appended yet — held behind their predecessors (:class:`SequenceGate`), or ``unverified``."""

    valid: ValidatedRecords
    appended: tuple[list[int], int] | None
    unverified: Unverified | None


# A guard no partition holds: the batch passes only if it continues an open transaction.
_CONTINUING_ONLY = object()


def unverified_transaction(part: Partition, valid: ValidatedRecords,
                           coordinator: TransactionCoordinator) -> Unverified | None:
    """The producer of a transactional batch in ``valid`` that opens a transaction on ``part``
    whose coordinator is another broker (ask it first), or None."""
    if not coordinator.coordinated_elsewhere:
        return None
    for stored, _ in valid.batches:
        h = stored.header
        if (h.is_transactional and not coordinator.knows_producer(h.producer_id)
                and not part.in_open_transaction(h.producer_id, h.producer_epoch)):
            return Unverified(h.producer_id, h.producer_epoch, part.verification_guard(h.producer_id))
    return None


def append_valid(part: Partition, valid: ValidatedRecords, *, manager: LogManager,
                 coordinator: TransactionCoordinator, guard: object | None = None) -> tuple[list[int], int]:
    """Append validated records; return their base offsets and the append time (-1 unless
    the topic uses LogAppendTime, as Kafka reports it). A transactional batch is checked by
    this broker's coordinator when it knows the producer; else it must continue the open
    transaction on ``part`` or carry ``guard``, its coordinator's confirmation."""
    base_offsets = []
    append_time = -1
    for stored, batch in valid.batches:
        h = stored.header
        txn_guard = None
        if h.is_transactional:
            if coordinator.coordinated_elsewhere and not coordinator.knows_producer(h.producer_id):
                txn_guard = _CONTINUING_ONLY if guard is None else guard
            else:
                coordinator.verify_partition(h.producer_id, h.producer_epoch, (part.topic, part.partition))
        base, when = part.append(stored, batch, valid.schema, fsync=False, txn_guard=txn_guard)
        base_offsets.append(base)
        append_time = when if part.log.config.message_timestamp_type == "LogAppendTime" else -1
    if not valid.schema.equals(manager.topic(part.topic).schema, check_metadata=False):
        manager.note_schema(part.topic, valid.schema)
    return base_offsets, append_time


def validate_and_append(part: Partition, records: bytes | memoryview, *, max_decompressed_bytes: int,
                        manager: LogManager, coordinator: TransactionCoordinator,
                        check_producer: Callable[[BatchHeader], None] | None = None,
                        ) -> Attempt:
    """Validate, then append unless the first batch is ahead of the partition's expected
    sequence (the caller holds it in the :class:`SequenceGate` and appends after) or opens a
    transaction its coordinator elsewhere must confirm first (:func:`unverified_transaction`).
    One trip to the I/O pool for the common case. ``check_producer`` (the authorizer's, see
    :meth:`logstore.broker.security.authorization.Authorization.producer_check`) sees the header
    of every batch with a producer id before anything is appended, and may raise."""
    valid = validate(part, records, max_decompressed_bytes=max_decompressed_bytes)
    if check_producer is not None:
        for stored, _ in valid.batches:
            if stored.header.producer_id >= 0:
                check_producer(stored.header)
    unverified = unverified_transaction(part, valid, coordinator)
    if unverified is not None or part.producers.is_ahead(valid.batches[0][0].header):
        return Attempt(valid, None, unverified)
    return Attempt(valid, append_valid(part, valid, manager=manager, coordinator=coordinator), None)
