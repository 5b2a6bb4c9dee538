"""Encoding a producer's batches: Arrow records to a stored batch message, with the producer's
id, epoch and sequence when idempotent (the sender's work before a request leaves).

Thread-safety: stateless after construction; any thread.
"""

from __future__ import annotations

import pyarrow as pa

from logstore.client.producer.arrow_input import records_to_batch
from logstore.client.producer.batch import ProducerBatch
from logstore.client.producer.metadata import TopicInfo
from logstore.errors import LogstoreError, RecordTooLargeError, SchemaMismatchError
from logstore.record import ATTR_TRANSACTIONAL, EncodedBatch, encode_batch

__all__ = ["BatchEncoder"]

_CONVERSION_ERRORS = (pa.ArrowException, TypeError, ValueError, OverflowError)


class BatchEncoder:
    """Encodes with the producer's ``compression``; ``idempotent`` batches carry producer id,
    epoch and sequence (and the transactional flag when ``transactional``)."""

    def __init__(self, *, compression: str | None, idempotent: bool, transactional: bool,
                 max_request_size: int) -> None:
        self._compression = compression
        self._idempotent = idempotent
        self._transactional = transactional
        self._max_request_size = max_request_size

    def encode(
        self, stored: pa.RecordBatch, *, base_sequence: int = -1, producer_id: int = -1, producer_epoch: int = -1
    ) -> EncodedBatch:
        """Encode, when idempotent with ``base_sequence`` under ``producer_id``/``producer_epoch``."""
        if not self._idempotent:
            return encode_batch(stored, base_offset=0, compression=self._compression)
        return encode_batch(
            stored, base_offset=0, compression=self._compression,
            producer_id=producer_id, producer_epoch=producer_epoch,
            base_sequence=base_sequence,
            attributes=ATTR_TRANSACTIONAL if self._transactional else 0,
        )

    def check_request_size(self, info: TopicInfo, chunk: pa.RecordBatch, data: EncodedBatch) -> None:
        if data.size + len(info.schema_message) > self._max_request_size:
            raise RecordTooLargeError(
                f"a batch of {chunk.num_rows} records encodes to {data.size} bytes, more than "
                f"max_request_size ({self._max_request_size}); lower batch_size or raise "
                "max_request_size"
            )

    def encode_records(self, batch: ProducerBatch) -> None:
        """Turn ``batch``'s ``send()`` records into its stored batch message.

        Records whose values Arrow cannot convert to the topic's columns fail
        alone with :class:`SchemaMismatchError` (``batch.count`` drops to the
        rest, which are sent); a batch left with none is marked ``empty``.
        """
        records = batch.records
        assert records is not None
        info = batch.info
        try:
            stored: pa.RecordBatch | None = (
                records.stored if records.stored is not None else records_to_batch(info, records, None)
            )
        except _CONVERSION_ERRORS:
            good: list[int] = []
            failed: dict[int, LogstoreError] = {}
            for i in range(len(records.values)):
                try:
                    records_to_batch(info, records, [i])
                    good.append(i)
                except _CONVERSION_ERRORS as e:
                    failed[i] = SchemaMismatchError(
                        f"record value does not fit the columns of topic {info.name!r}: {e}"
                    )
            if batch.completion is not None:
                batch.completion.fail_records(batch.sub, failed)
            batch.count = len(good)
            stored = records_to_batch(info, records, good) if good else None
        batch.records = None
        if stored is None:
            batch.empty = True
        else:
            batch.data = self.encode(stored, base_sequence=batch.base_sequence, producer_id=batch.producer_id,
                                     producer_epoch=batch.producer_epoch)
