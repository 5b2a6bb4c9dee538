"""The Spark adapters of format ``logstore``: thin classes over the planner and
:func:`logstore.client.consumer.fetch_range`.

* :class:`LogstoreDataSource` — ``spark.read`` / ``spark.readStream``: the
  reader half of format ``logstore`` (:mod:`spark_source.registration` combines
  it with the writer half of :mod:`spark_sink`);
* :class:`LogstoreStreamReader` — micro-batch reader with admission control
  (``maxOffsetsPerTrigger`` via ``ReadMaxRows``, ``minOffsetsPerTrigger`` alone via
  ``ReadMinRows``; the ``maxTriggerDelay`` clock is kept by the reader, started when
  the query's reader is made and again at every batch released) and
  ``Trigger.AvailableNow``;
* :class:`LogstoreBatchReader` — a bounded read between starting and ending
  offsets, with filter pushdown (:mod:`spark_source.pushdown`): pushed filters
  narrow the partitions and offset ranges planned, and the rest of them are
  evaluated on each Arrow batch in the task.

Contracts followed (PySpark 4.2 Python Data Source API): offsets are dicts
of primitives ``{topic: {"partition": next_offset}}``; ``partitions()``
returns ``[]`` when start equals end; ``read()`` is stateless and opens its
own broker connection; nothing unpicklable lives on the reader between
calls (the driver-side client is opened lazily and dropped before pickling).
"""

from __future__ import annotations

import logging
import time
import uuid
from collections.abc import Iterable, Iterator, Sequence
from dataclasses import dataclass
from typing import Any

import pyarrow as pa
from pyspark.sql.datasource import (
    DataSource,
    DataSourceReader,
    DataSourceStreamReader,
    Filter,
    InputPartition,
)
from pyspark.sql.streaming.datasource import (
    ReadAllAvailable,
    ReadLimit,
    ReadMaxRows,
    ReadMinRows,
    SupportsTriggerAvailableNow,
)
from pyspark.sql.types import StructType

from logstore.client.fetcher import fetch_range
from logstore.client.rpc import BrokerClient
from logstore.errors import (
    LogstoreError,
    OffsetOutOfRangeError,
    SchemaMismatchError,
    UnknownTopicOrPartitionError,
)
from logstore.types import TopicPartition
from spark_source.options import SourceOptionError, SourceOptions, parse_source_options
from spark_source.planner import (
    WAIT,
    DataLossError,
    OffsetRange,
    PartitionBounds,
    admit,
    check_data_loss,
    discover,
    from_spark_offsets,
    narrow_positions,
    plan_ranges,
    resolve_positions,
    to_spark_offsets,
    unknown_topics,
)
from spark_source.pushdown import (
    accepts,
    keeps_partition,
    offset_bounds,
    row_filters,
    row_mask,
    timestamp_floor_ms,
)
from spark_source.rows import OutputShape, to_output_batch

__all__ = ["LogstoreDataSource", "LogstoreStreamReader", "LogstoreBatchReader", "FORMAT_NAME"]

FORMAT_NAME = "logstore"
_REPORT_TIMEOUT_MS = 5_000
log = logging.getLogger("logstore.spark_source")


@dataclass(frozen=True)
class RangePartition(InputPartition):
    """One Spark task's work: an offset range plus what the task needs to read it."""

    range: OffsetRange
    timestamp_type: int


def _value_schema_for(options: SourceOptions) -> pa.Schema | None:
    """The value columns shared by every subscribed topic (None = untyped)."""
    with BrokerClient(options.bootstrap, security=options.security) as client:
        wanted = list(options.subscribe or options.assign or ()) or None
        meta = client.metadata(wanted)
    schemas = {name: t.value_schema for name, t in meta.topics.items() if options.matches(name)}
    distinct = {None if s is None else s.to_string(show_schema_metadata=False) for s in schemas.values()}
    if len(distinct) > 1:
        raise SchemaMismatchError(
            "the subscribed topics have different value schemas: "
            + "; ".join(f"{n}: {'untyped' if s is None else s.to_string()}" for n, s in sorted(schemas.items(), key=lambda kv: kv[0]))
            + ". Read them in separate queries."
        )
    return next(iter(schemas.values()), None)


def _timestamp_types(client: BrokerClient, topics: Sequence[str]) -> dict[str, int]:
    configs = client.describe_configs(list(topics)) if topics else {}
    out = {}
    for topic, cfg in configs.items():
        if isinstance(cfg, Exception):
            out[topic] = 0
        else:
            out[topic] = 1 if cfg.get("message.timestamp.type") == "LogAppendTime" else 0
    return out


class LogstoreDataSource(DataSource):
    """Format ``logstore``, reading: options as Spark's Kafka source (see :mod:`spark_source.options`).

    The reader half (``name``, ``schema``, ``reader``, ``streamReader``), entry point
    ``source`` of the group ``logstore.spark``.
    """

    @classmethod
    def name(cls) -> str:
        return FORMAT_NAME

    def _shape(self, streaming: bool) -> tuple[SourceOptions, OutputShape]:
        opts = parse_source_options(dict(self.options), streaming=streaming)
        shape = OutputShape(_value_schema_for(opts), include_headers=opts.include_headers)
        return opts, shape

    def schema(self) -> StructType:
        # Spark asks for the schema before it says whether the read is a stream;
        # the stream rules are checked again in streamReader().
        opts = parse_source_options(
            {k: v for k, v in dict(self.options).items() if not k.lower().startswith("ending")},
            streaming=True,
        )
        return OutputShape(_value_schema_for(opts), include_headers=opts.include_headers).spark

    def reader(self, schema: StructType) -> DataSourceReader:
        opts, shape = self._shape(streaming=False)
        return LogstoreBatchReader(opts, shape) if opts.push_filters else _UnfilteredBatchReader(opts, shape)

    def streamReader(self, schema: StructType) -> DataSourceStreamReader:
        try:
            opts, shape = self._shape(streaming=True)
        except LogstoreError as e:
            # PySpark 4.2's stream-source runner calls ``reader.stop()`` in a ``finally``
            # even when this method raised, which buries our error under an
            # UnboundLocalError; hand it a reader that raises ours on first use instead.
            return _FailedStreamReader(e)
        return LogstoreStreamReader(opts, shape)


class _FailedStreamReader(DataSourceStreamReader, SupportsTriggerAvailableNow):
    """A stream reader whose options were refused: every call raises that error, ``stop`` is a no-op."""

    def __init__(self, error: LogstoreError) -> None:
        self.error = error

    def initialOffset(self) -> dict:
        raise self.error

    def getDefaultReadLimit(self) -> ReadLimit:
        raise self.error

    def prepareForTriggerAvailableNow(self) -> None:
        raise self.error

    def latestOffset(self, start: dict, limit: ReadLimit) -> dict:
        raise self.error

    def reportLatestOffset(self) -> dict | None:
        raise self.error

    def partitions(self, start: dict, end: dict) -> Sequence[InputPartition]:
        raise self.error

    def commit(self, end: dict) -> None:
        raise self.error

    def read(self, partition: InputPartition) -> Iterator[pa.RecordBatch]:
        raise self.error

    def stop(self) -> None:
        pass


class _ReaderBase:
    def __init__(self, options: SourceOptions, shape: OutputShape) -> None:
        self.options = options
        self.shape = shape
        self._client: BrokerClient | None = None
        # Filters Spark pushed (batch reads only); a task evaluates those of row_filters().
        self.pushed: tuple[Filter, ...] = ()

    @property
    def client(self) -> BrokerClient:
        if self._client is None:
            self._client = BrokerClient(self.options.bootstrap, security=self.options.security)
        return self._client

    def __getstate__(self) -> dict[str, Any]:
        state = dict(self.__dict__)
        state["_client"] = None
        return state

    def _partitions_for(self, ranges: list[OffsetRange], types: dict[str, int] | None = None) -> list[RangePartition]:
        if types is None:
            types = _timestamp_types(self.client, sorted({r.topic for r in ranges}))
        return [RangePartition(r, types.get(r.topic, 0)) for r in ranges]

    def read(self, partition: InputPartition) -> Iterator[pa.RecordBatch]:
        if not isinstance(partition, RangePartition):
            # An empty plan: Spark runs one task with a bare InputPartition; it reads nothing.
            return
        r = partition.range
        opts = self.options
        filters = row_filters(self.pushed)
        with BrokerClient(opts.bootstrap, security=opts.security) as client:
            batches = fetch_range(
                client, TopicPartition(r.topic, r.partition), r.start, r.end,
                isolation_level=opts.isolation_level, max_bytes=opts.fetch_max_bytes,
                fail_on_data_loss=opts.fail_on_data_loss, timeout_ms=opts.fetch_timeout_ms,
            )
            try:
                for batch in batches:
                    out = to_output_batch(batch, self.shape, topic=r.topic, partition=r.partition,
                                          timestamp_type=partition.timestamp_type)
                    if filters:
                        out = out.filter(row_mask(filters, out))
                        if out.num_rows == 0:
                            continue
                    yield out
            except OffsetOutOfRangeError as e:
                # Retention ran between planning and this task: say it in Spark's terms.
                raise DataLossError(
                    f"{e.message} (for this query: set the option failOnDataLoss to false)"
                ) from None

    def stop(self) -> None:
        if self._client is not None:
            self._client.close()
            self._client = None


class LogstoreBatchReader(_ReaderBase, DataSourceReader):
    """``spark.read.format("logstore")``: the offsets between starting and ending positions."""

    def pushFilters(self, filters: list[Filter]) -> Iterable[Filter]:
        """Take the filters :func:`spark_source.pushdown.accepts`; return the others to Spark."""
        pushed = [f for f in filters if accepts(f, self.shape.arrow)]
        self.pushed = tuple(pushed)
        return [f for f in filters if not any(f is p for p in pushed)]

    def partitions(self) -> Sequence[InputPartition]:
        opts = self.options
        bounds = discover(self.client, opts)
        missing = unknown_topics(opts, bounds)
        if missing:
            raise UnknownTopicOrPartitionError(
                f"topic {', '.join(repr(t) for t in missing)} named in the option "
                f"{'subscribe' if opts.subscribe is not None else 'assign'} does not exist; "
                f"create it (logstore topics create {missing[0]} --partitions N --bootstrap {opts.bootstrap}) or fix the name"
            )
        start = resolve_positions(self.client, opts.starting, bounds, opts, starting=True)
        end = resolve_positions(self.client, opts.ending, bounds, opts, starting=False)
        start = check_data_loss(start, bounds, fail_on_data_loss=opts.fail_on_data_loss)
        for tp, s in start.items():
            if s > end.get(tp, s):
                raise SourceOptionError(
                    f"starting offset {s} of {tp} is after its ending offset {end[tp]}; "
                    "check startingOffsets and endingOffsets"
                )
        types = _timestamp_types(self.client, sorted({tp.topic for tp in end}))
        if self.pushed:
            pushed = self.pushed
            start, end = narrow_positions(
                self.client, start, end, opts,
                keep=lambda tp: keeps_partition(pushed, topic=tp.topic, partition=tp.partition,
                                                timestamp_type=types.get(tp.topic, 0)),
                offsets=offset_bounds(pushed), timestamp_floor_ms=timestamp_floor_ms(pushed))
        ranges = plan_ranges(start, end, min_partitions=opts.min_partitions,
                             max_records_per_partition=opts.max_records_per_partition)
        return self._partitions_for(ranges, types)


class LogstoreStreamReader(_ReaderBase, DataSourceStreamReader, SupportsTriggerAvailableNow):
    """``spark.readStream.format("logstore")``; see the module docstring."""

    def __init__(self, options: SourceOptions, shape: OutputShape) -> None:
        super().__init__(options, shape)
        self._available_now_target: dict[TopicPartition, int] | None = None
        # maxTriggerDelay runs from the query's start (this reader is made per query, in the
        # stream-source runner Spark starts for it) and then from the last batch released.
        self._last_trigger_ms = time.monotonic() * 1000
        # commitOffsetsToGroup / groupIdPrefix: the group that sees this query's progress.
        self.report_group: str | None = options.commit_offsets_to_group or (
            f"{options.group_id_prefix}-{uuid.uuid4().hex}" if options.group_id_prefix else None)
        self._reported: dict[TopicPartition, int] = {}
        if self.report_group is not None:
            log.info("reporting the query's progress as the committed offsets of group %r", self.report_group)

    # -- offsets -------------------------------------------------------------

    def initialOffset(self) -> dict:
        bounds = discover(self.client, self.options)
        start = resolve_positions(self.client, self.options.starting, bounds, self.options, starting=True)
        return to_spark_offsets(start)

    def getDefaultReadLimit(self) -> ReadLimit:
        # PySpark 4.2 has no composite limit: with both options Spark is given the maximum and
        # the minimum comes from the options (latestOffset). Never ReadAllAvailable when a
        # minimum is set: Spark hands that limit back, and it means "do not wait".
        if self.options.max_offsets_per_trigger is not None:
            return ReadMaxRows(self.options.max_offsets_per_trigger)
        if self.options.min_offsets_per_trigger is not None:
            return ReadMinRows(self.options.min_offsets_per_trigger)
        return ReadAllAvailable()

    def prepareForTriggerAvailableNow(self) -> None:
        bounds = discover(self.client, self.options)
        self._available_now_target = {tp: b.end for tp, b in bounds.items()}

    def _latest(self, start: dict[TopicPartition, int]) -> tuple[dict[TopicPartition, int], dict[TopicPartition, PartitionBounds]]:
        bounds = discover(self.client, self.options)
        if self._available_now_target is not None:
            target = self._available_now_target
            # Partitions that appeared after the query started are not read under AvailableNow.
            bounds = {tp: PartitionBounds(b.log_start, min(b.end, target[tp]))
                      for tp, b in bounds.items() if tp in target}
        latest = {tp: b.end for tp, b in bounds.items()}
        return latest, bounds

    def latestOffset(self, start: dict, limit: ReadLimit) -> dict:
        begin = from_spark_offsets(start)
        # ``start`` is where the batch Spark completed last ends: report it too, since Spark calls
        # commit(end) only when it plans the next batch with data (never after the last one).
        self._report(begin)
        latest, bounds = self._latest(begin)
        # New partitions (new topics matching a pattern, added partitions) start at their log start.
        for tp, b in bounds.items():
            begin.setdefault(tp, b.log_start)
        begin = check_data_loss(begin, bounds, fail_on_data_loss=self.options.fail_on_data_loss, past_end=True)
        for tp in list(begin):
            if tp not in latest:
                latest[tp] = begin[tp]
        latest = {tp: max(latest[tp], begin[tp]) for tp in latest}
        # Trigger.Once passes ReadAllAvailable and AvailableNow reads to a target fixed at its
        # start: neither waits for minOffsetsPerTrigger.
        waits = not isinstance(limit, ReadAllAvailable) and self._available_now_target is None
        now_ms = time.monotonic() * 1000
        end = admit(begin, latest,
                    max_rows=limit.max_rows if isinstance(limit, ReadMaxRows) else None,
                    min_rows=self.options.min_offsets_per_trigger if waits else None,
                    waited_ms=now_ms - self._last_trigger_ms,
                    max_delay_ms=self.options.max_trigger_delay_ms)
        if end is WAIT:
            return start
        if any(end[tp] > begin[tp] for tp in end):
            self._last_trigger_ms = now_ms  # the next batch's delay runs from this one
        return to_spark_offsets(end)

    def reportLatestOffset(self) -> dict | None:
        latest, _ = self._latest({})
        return to_spark_offsets(latest)

    def partitions(self, start: dict, end: dict) -> Sequence[InputPartition]:
        begin = from_spark_offsets(start)
        finish = from_spark_offsets(end)
        new = [tp for tp in finish if tp not in begin]
        if new:
            # Partitions discovered by latestOffset (a new matching topic, added
            # partitions) are read from their log start offset.
            bounds = discover(self.client, self.options)
            for tp in new:
                begin[tp] = bounds[tp].log_start if tp in bounds else 0
        ranges = plan_ranges(begin, finish, min_partitions=self.options.min_partitions,
                             max_records_per_partition=self.options.max_records_per_partition)
        if not ranges:
            return []
        return self._partitions_for(ranges)

    def commit(self, end: dict) -> None:
        """The query's position lives in Spark's checkpoint; with commitOffsetsToGroup or
        groupIdPrefix, ``end`` is also committed as the group's offsets (for lag tooling).
        A failure to report is logged, never raised: it must not fail the query."""
        if self.report_group is not None:
            self._report(from_spark_offsets(end))

    def _report(self, offsets: dict[TopicPartition, int]) -> None:
        """Commit ``offsets`` to the report group when they changed; log (never raise) a failure."""
        group = self.report_group
        if group is None or not offsets or offsets == self._reported:
            return
        try:
            self.client.groups.commit_offsets(group, offsets, timeout_ms=_REPORT_TIMEOUT_MS)
            self._reported = dict(offsets)
        except Exception as e:  # noqa: BLE001 - reporting is best effort
            log.warning("could not report the query's offsets to consumer group %r: %s", group, e)


class _UnfilteredBatchReader(LogstoreBatchReader):
    """A batch read with ``pushFilters=false``: Spark evaluates every filter.

    Spark (4.2) refuses a reader that overrides ``pushFilters`` while the session's
    ``spark.sql.python.filterPushdown.enabled`` is off (DATA_SOURCE_PUSHDOWN_DISABLED),
    even for a query without filters; this reader has the base class's method, so it
    reads with the flag either way.
    """

    pushFilters = DataSourceReader.pushFilters
