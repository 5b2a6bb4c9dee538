"""A producer's batches and per-partition send state (the accumulator's records).

:class:`ProducerBatch` is one sealed batch of one partition, from sealing
until its outcome is reported; :class:`PartitionState` is a partition's queue
and in-flight bookkeeping; a :data:`Request` is what one produce request
carries. The rules that use them are in
:mod:`~logstore.client.producer.accumulator` (queueing, pipelining window)
and :mod:`~logstore.client.producer.sender` (answers, retries).

Thread-safety: guarded by the accumulator's lock, except
:meth:`ProducerBatch.report` (sender thread, outside the lock).
"""

from __future__ import annotations

from collections import deque

from logstore.client.producer.delivery import SendBatchCall, SendCompletion
from logstore.client.producer.metadata import TopicInfo
from logstore.client.producer.record_buffer import RecordColumns
from logstore.errors import LogstoreError
from logstore.record import EncodedBatch, with_producer
from logstore.types import BatchMetadata, TopicPartition

__all__ = ["PartitionState", "ProducerBatch", "Request"]


class ProducerBatch:
    """A sealed batch waiting in a partition queue (or in flight).

    ``records`` holds the unencoded ``send()`` records until the sender
    encodes them; ``data`` then holds the stored batch message. ``empty``
    marks a batch all of whose records failed conversion (nothing to send).
    ``send()`` records report to batch ``sub`` of ``completion``; a
    ``send_batch()`` batch to batch ``call_index`` of ``call``.
    """

    __slots__ = ("id", "tp", "info", "records", "data", "empty", "count", "size", "created",
                 "attempts", "completion", "sub", "call", "call_index", "reported", "base_sequence",
                 "producer_id", "producer_epoch", "maybe_written", "in_window")

    def __init__(
        self, batch_id: int, info: TopicInfo, partition: int, *, created: float, size: int, count: int
    ) -> None:
        self.id = batch_id
        self.info = info
        self.tp = TopicPartition(info.name, partition)
        self.records: RecordColumns | None = None
        self.data: EncodedBatch | None = None
        self.empty = False
        self.count = count
        self.size = size
        self.created = created
        self.attempts = 0
        self.completion: SendCompletion | None = None
        self.sub = 0
        self.call: SendBatchCall | None = None
        self.call_index = 0
        self.reported = False
        self.base_sequence = -1  # with idempotence: numbered under producer_id/producer_epoch
        self.producer_id = -1
        self.producer_epoch = -1
        # An attempt ended without a definite answer: the broker may hold the batch.
        self.maybe_written = False
        self.in_window = False  # sent once: counted in its partition's window

    def report(self, error: LogstoreError | None, base_offset: int = -1, append_time_ms: int = -1) -> None:
        """Complete the batch's futures and callbacks, once. Never called under the lock."""
        if self.reported:
            return
        self.reported = True
        if error is None:
            if self.completion is not None:
                self.completion.complete(self.sub, (base_offset, append_time_ms))
            if self.call is not None:
                self.call.succeed(
                    self.call_index, BatchMetadata(self.tp.topic, self.tp.partition, base_offset, self.count)
                )
        else:
            if self.completion is not None:
                self.completion.complete(self.sub, error)
            if self.call is not None:
                self.call.fail(error)


class PartitionState:
    """A partition's queue of sealed batches and its in-flight bookkeeping.

    ``in_flight`` counts the partition's batches in requests not yet
    answered; ``window`` holds, with idempotence, the batches sent from the
    oldest not yet reported on (see the module docstring); ``resync`` is set
    while a batch waits to be retried (nothing more is sent until
    ``in_flight`` is 0). With idempotence the partition's sequences count
    from 0 under ``producer_id``/``producer_epoch`` (``next_seq`` is the
    next one to hand out); ``restart`` is set once they can no longer be
    accepted (a numbered batch failed for good, or the broker refused the
    oldest pending batch): nothing more is sent until ``in_flight`` is 0,
    then the partition restarts at 0 under a new epoch.
    """

    __slots__ = ("tp", "info", "queue", "in_flight", "window", "resync", "restart", "retry_at", "next_seq",
                 "producer_id", "producer_epoch")

    def __init__(self, info: TopicInfo, partition: int) -> None:
        self.tp = TopicPartition(info.name, partition)
        self.info = info
        self.queue: deque[ProducerBatch] = deque()
        self.in_flight = 0
        self.window: deque[ProducerBatch] = deque()
        self.resync = False
        self.restart = False
        self.retry_at = 0.0
        self.next_seq = 0
        self.producer_id = -1
        self.producer_epoch = -1

    def restart_at_zero(self, producer_id: int, producer_epoch: int) -> None:
        """Number the queued batches from sequence 0 under ``producer_id``/``producer_epoch``,
        re-stamping the encoded ones; forget the window. Caller holds the accumulator's lock
        and nothing of the partition is in flight."""
        self.producer_id, self.producer_epoch = producer_id, producer_epoch
        self.restart = False
        self.resync = False
        self.window.clear()
        sequence = 0
        for b in self.queue:
            b.in_window = False
            b.base_sequence = sequence
            b.producer_id, b.producer_epoch = producer_id, producer_epoch
            if b.data is not None:
                b.data = with_producer(b.data, producer_id=producer_id, producer_epoch=producer_epoch,
                                       base_sequence=sequence)
            sequence = (sequence + b.count) % SEQUENCE_MOD
        self.next_seq = sequence


SEQUENCE_MOD = 2**31  # sequences wrap here (Kafka's int32 sequence)

# The batches of one produce request, per partition.
Request = dict[TopicPartition, list[ProducerBatch]]
