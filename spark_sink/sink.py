"""The exactly-once writers of format ``logstore``: ``df.write`` and ``df.writeStream``.

How a micro-batch (or a batch write) becomes visible exactly once
-----------------------------------------------------------------
1. Each Spark task attempt is a transactional producer with its own
   transactional id ``<sinkId>/<batchId>/<partition>.<attempt>.<taskAttemptId>``.
   It sends its rows (Arrow batches, through :meth:`Producer.send_batch`),
   waits until every batch is acknowledged (``acks=all``), and returns the
   transaction's reference — producer id, epoch, transaction number — as
   its commit message, leaving the transaction **open** (invisible to
   read_committed readers).
2. The driver's ``commit(messages, batchId)`` ends the batch's transactions
   as one transaction group (``EndTxnGroup``): the broker records the
   decision ``(sinkId, batchId, transactions)`` in the log (``__transaction_state``)
   — the commit point — writes the commit markers, and aborts every other
   open transaction under ``<sinkId>/<batchId>/`` (failed task attempts,
   speculative duplicates: only attempts whose messages reached the driver
   become visible).
3. A batch id at or below the sink's last committed one (a query restarted
   after its driver died between committing and checkpointing, replaying the
   batch) is not committed again: its new writes are aborted, so the replay
   is a no-op. ``abort(messages, batchId)`` aborts everything under the prefix.
   A driver that dies before committing leaves open transactions that the
   replayed batch's attempts fence (same transactional ids) or that the
   broker aborts after ``transaction.timeout.ms``.

The sink's identity is ``sinkId`` (by default derived from the query's
checkpoint location); its last committed batch id lives in the broker's
``__transaction_state`` topic, not in a side file.

Input columns (as Spark's Kafka sink): ``key`` (binary/string, optional),
``value`` (binary/string) or the typed topic's value columns, optional
``topic``, ``partition``, ``headers`` (array<struct<key string, value binary>>),
``timestamp``.
"""

from __future__ import annotations

import uuid
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

import pyarrow as pa
import pyarrow.compute as pc
from pyspark import TaskContext
from pyspark.sql.datasource import (
    DataSource,
    DataSourceArrowWriter,
    DataSourceStreamArrowWriter,
    WriterCommitMessage,
)
from pyspark.sql.types import StructType

from logstore.client.producer import Producer
from logstore.client.rpc import BrokerClient
from logstore.errors import InvalidRequestError, UnknownTopicOrPartitionError
from logstore.types import TxnRef
from spark_sink.options import SinkOptions, parse_sink_options

__all__ = ["FORMAT_NAME", "LogstoreSinkDataSource", "LogstoreStreamWriter", "LogstoreBatchWriter",
           "SinkCommit", "check_output_topic"]

FORMAT_NAME = "logstore"


@dataclass(frozen=True)
class SinkCommit(WriterCommitMessage):
    """What a task attempt wrote: its open transaction (None if it wrote nothing)."""

    txn: TxnRef | None
    records: int


def _prefix(sink_id: str, batch_id: int) -> str:
    return f"{sink_id}/{batch_id}/"


def write_partition(options: SinkOptions, batch_id: int, rows: Iterator[pa.RecordBatch]) -> SinkCommit:
    """The task side: send ``rows`` in one open transaction; return its reference."""
    assert options.sink_id is not None
    ctx = TaskContext.get()
    suffix = (f"{ctx.partitionId()}.{ctx.attemptNumber()}.{ctx.taskAttemptId()}" if ctx is not None
              else uuid.uuid4().hex)
    txn_id = _prefix(options.sink_id, batch_id) + suffix
    producer: Producer | None = None
    count = 0
    try:
        for batch in rows:
            if batch.num_rows == 0:
                continue
            if producer is None:
                producer = Producer(
                    options.bootstrap, security=options.security, transactional_id=txn_id, acks="all",
                    transaction_timeout_ms=options.transaction_timeout_ms,
                    compression=options.compression, batch_size=options.batch_size,
                    linger_ms=options.linger_ms,
                )
                producer.init_transactions()
                producer.begin_transaction()
            for topic, part in _split_by_topic(batch, options.topic):
                producer.send_batch(topic, part)
            count += batch.num_rows
        if producer is None:
            return SinkCommit(None, 0)
        ref = producer.prepare_transaction()  # flushes; the transaction stays open
        return SinkCommit(ref, count)
    finally:
        if producer is not None:
            producer.close()  # leaves the transaction open for the driver


def _split_by_topic(batch: pa.RecordBatch, default_topic: str | None) -> Iterator[tuple[str, pa.RecordBatch]]:
    """Rows grouped by their ``topic`` column (or the ``topic`` option), without that column."""
    names = batch.schema.names
    if "topic" not in names:
        if default_topic is None:
            raise InvalidRequestError(
                "rows have no topic column and the option topic is not set; set one of them"
            )
        yield default_topic, batch
        return
    rest = batch.drop_columns(["topic"])
    topics = batch.column("topic")
    if default_topic is not None:
        topics = pc.fill_null(topics, default_topic)
    elif topics.null_count:
        raise InvalidRequestError("a row has a null topic and the option topic is not set")
    for topic in pc.unique(topics).to_pylist():
        mask = pc.equal(topics, topic)
        yield topic, rest.filter(mask)


def end_batch(options: SinkOptions, batch_id: int, messages: list[Any], *, commit: bool) -> bool:
    """The driver side: commit (or abort) a batch's transactions as one group."""
    assert options.sink_id is not None
    refs = [m.txn for m in messages if isinstance(m, SinkCommit) and m.txn is not None]
    with BrokerClient(options.bootstrap, security=options.security) as client:
        committed, _ = client.end_txn_group(
            options.sink_id, batch_id, refs, abort_prefix=_prefix(options.sink_id, batch_id), commit=commit,
        )
    return committed


class LogstoreStreamWriter(DataSourceStreamArrowWriter):
    """``df.writeStream.format("logstore")``: exactly-once micro-batches."""

    def __init__(self, options: SinkOptions) -> None:
        self.options = options

    def write(self, iterator: Iterator[pa.RecordBatch]) -> SinkCommit:
        # The micro-batch id is not passed to tasks; the prefix uses the epoch Spark runs.
        ctx = TaskContext.get()
        batch_id = int((ctx.getLocalProperty("streaming.sql.batchId") if ctx is not None else None) or -1)
        if batch_id < 0:
            raise InvalidRequestError("the logstore stream writer could not learn the micro-batch id")
        return write_partition(self.options, batch_id, iterator)

    def commit(self, messages: list[WriterCommitMessage | None], batchId: int) -> None:
        end_batch(self.options, batchId, list(messages), commit=True)

    def abort(self, messages: list[WriterCommitMessage | None], batchId: int) -> None:
        end_batch(self.options, batchId, list(messages), commit=False)


class LogstoreBatchWriter(DataSourceArrowWriter):
    """``df.write.format("logstore")``: the whole write becomes visible atomically.

    With ``sinkId`` + ``batchId`` (what :func:`spark_sink.write_transactional`
    passes) a repeated write of the same batch id is a no-op; without them the
    write gets a fresh one-off identity.
    """

    def __init__(self, options: SinkOptions) -> None:
        if options.sink_id is None:
            options = SinkOptions(**{**_fields(options), "sink_id": f"write-{uuid.uuid4().hex}", "batch_id": 0})
        self.options = options
        self.batch_id = options.batch_id if options.batch_id is not None else 0

    def write(self, iterator: Iterator[pa.RecordBatch]) -> SinkCommit:
        return write_partition(self.options, self.batch_id, iterator)

    def commit(self, messages: list[WriterCommitMessage | None]) -> None:
        end_batch(self.options, self.batch_id, list(messages), commit=True)

    def abort(self, messages: list[WriterCommitMessage | None]) -> None:
        end_batch(self.options, self.batch_id, list(messages), commit=False)


def _fields(options: SinkOptions) -> dict[str, Any]:
    return {f: getattr(options, f) for f in options.__dataclass_fields__}


class LogstoreSinkDataSource(DataSource):
    """Format ``logstore``, writing: the writer half (``writer``, ``streamWriter``).

    Entry point ``sink`` of the group ``logstore.spark``:
    ``spark_source.register(spark)`` combines it with the reader half into the
    one class registered as format ``logstore`` (see
    :mod:`spark_source.registration`). Registered alone it is a write-only format.
    """

    @classmethod
    def name(cls) -> str:
        return FORMAT_NAME

    def writer(self, schema: StructType, overwrite: bool) -> DataSourceArrowWriter:
        options = parse_sink_options(dict(self.options), streaming=False)
        check_output_topic(options)
        return LogstoreBatchWriter(options)

    def streamWriter(self, schema: StructType, overwrite: bool) -> DataSourceStreamArrowWriter:
        options = parse_sink_options(dict(self.options), streaming=True)
        check_output_topic(options)
        return LogstoreStreamWriter(options)


def check_output_topic(options: SinkOptions) -> None:
    """On the driver, before any task runs: the ``topic`` option names a topic that exists.

    Without this, a missing topic surfaces in every task as UNKNOWN_TOPIC_OR_PARTITION
    inside a long Spark trace. Rows that carry their own ``topic`` column are checked
    by the broker when they are written (the driver cannot see them).
    """
    if options.topic is None:
        return
    with BrokerClient(options.bootstrap, security=options.security) as client:
        meta = client.metadata([options.topic])
    if options.topic not in meta.topics:
        raise UnknownTopicOrPartitionError(
            f"output topic {options.topic!r} (option topic) does not exist on {options.bootstrap}; "
            f"create it first: logstore topics create {options.topic} --partitions N --bootstrap {options.bootstrap}"
        )
