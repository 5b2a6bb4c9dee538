"""Offset planning for the Spark source: what to read, in how many tasks.

Plain functions over plain values, unit-tested without Spark:

* :func:`discover` — the partitions of the subscription and their bounds
  (log start offset and the readable end: the LSO for read_committed, the
  HWM otherwise — DESIGN I5);
* :func:`resolve_positions` — turn an :class:`OffsetSpec` into offsets;
* :func:`rate_limit` — split ``maxOffsetsPerTrigger`` across partitions by lag;
* :func:`admit` — the next micro-batch's end offsets under ``maxOffsetsPerTrigger``,
  ``minOffsetsPerTrigger`` and ``maxTriggerDelay``, or :data:`WAIT`;
* :func:`plan_ranges` — offset ranges per Spark task (``minPartitions``,
  ``maxRecordsPerPartition``);
* :func:`check_data_loss` — compare planned starts with log start offsets;
* :func:`narrow_positions` — the planned offsets cut down by pushed filters
  (:mod:`spark_source.pushdown`).

Offsets in Spark's checkpoint are ``{topic: {"partition": next_offset}}``
(:func:`to_spark_offsets` / :func:`from_spark_offsets`); end offsets are
exclusive everywhere.

Thread-safety: pure functions except :func:`discover`,
:func:`resolve_positions` and :func:`narrow_positions`, which call the broker.
"""

from __future__ import annotations

import logging
import math
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import TypeVar

from logstore.client.error_mapping import unwrap_items
from logstore.client.rpc import LATEST_TIMESTAMP, BrokerClient
from logstore.errors import LogstoreError, OffsetOutOfRangeError
from logstore.types import TopicPartition
from spark_source.options import EARLIEST, LATEST, OffsetSpec, SourceOptionError, SourceOptions

__all__ = [
    "WAIT",
    "admit",
    "PartitionBounds",
    "OffsetRange",
    "DataLossError",
    "to_spark_offsets",
    "from_spark_offsets",
    "discover",
    "resolve_positions",
    "rate_limit",
    "plan_ranges",
    "check_data_loss",
    "unknown_topics",
    "narrow_positions",
]

T = TypeVar("T")
log = logging.getLogger("logstore.spark_source")


class DataLossError(OffsetOutOfRangeError):
    """Offsets a query was going to read are gone (retention, deleted topic or partition)."""


@dataclass(frozen=True, slots=True)
class PartitionBounds:
    """What a reader may read of one partition right now: ``[log_start, end)``."""

    log_start: int
    end: int


@dataclass(frozen=True, slots=True)
class OffsetRange:
    """Offsets ``[start, end)`` of one partition, read by one Spark task."""

    topic: str
    partition: int
    start: int
    end: int

    @property
    def size(self) -> int:
        return self.end - self.start


def to_spark_offsets(offsets: Mapping[TopicPartition, int]) -> dict[str, dict[str, int]]:
    out: dict[str, dict[str, int]] = {}
    for tp in sorted(offsets):
        out.setdefault(tp.topic, {})[str(tp.partition)] = int(offsets[tp])
    return out


def from_spark_offsets(doc: Mapping[str, Mapping[str, int]]) -> dict[TopicPartition, int]:
    return {TopicPartition(t, int(p)): int(o) for t, parts in doc.items() for p, o in parts.items()}


def discover(client: BrokerClient, options: SourceOptions) -> dict[TopicPartition, PartitionBounds]:
    """Partitions of the subscription with their readable bounds.

    ``subscribe``/``assign`` topics that do not exist are simply absent
    (they may be created later); ``subscribePattern`` matches every topic
    the broker knows now.
    """
    wanted: list[str] | None
    if options.subscribe is not None:
        wanted = list(options.subscribe)
    elif options.assign is not None:
        wanted = list(options.assign)
    else:
        wanted = None
    meta = _with_retries(lambda: client.metadata(wanted), "looking up partitions", options)
    starts: dict[TopicPartition, int] = {}
    for name, topic in meta.topics.items():
        if not options.matches(name):
            continue
        allowed = set(options.assign[name]) if options.assign is not None else None
        for p in topic.partitions:
            if allowed is not None and p.partition not in allowed:
                continue
            starts[TopicPartition(name, p.partition)] = p.log_start_offset
    if not starts:
        return {}
    # The ends from each partition's leader (ListOffsets), not from whichever broker answered
    # Metadata: on a cluster a follower's high-water mark trails the leader's, and a new
    # leader's may trail what readers were already told; AvailableNow and batch reads would
    # stop short. The leaders refuse (retriably) until they know their end.
    ends = _with_retries(lambda: _latest_offsets(client, list(starts), options), "looking up end offsets",
                         options)
    return {tp: PartitionBounds(start, ends[tp]) for tp, start in starts.items()}


def _latest_offsets(client: BrokerClient, tps: list[TopicPartition], options: SourceOptions) -> dict[TopicPartition, int]:
    latest = dict.fromkeys(tps, LATEST_TIMESTAMP)
    found = unwrap_items(latest, client.list_offsets(latest, isolation_level=options.isolation_level), what="offset")
    out: dict[TopicPartition, int] = {}
    for tp, answer in found.items():
        assert answer.offset is not None  # a "latest" lookup always has an offset
        out[tp] = answer.offset
    return out


def _with_retries(call: Callable[[], T], what: str, options: SourceOptions) -> T:
    """``call()``, retried ``fetchOffset.numRetries`` times on retriable errors,
    ``fetchOffset.retryIntervalMs`` apart (as Spark's Kafka source retries its offset lookups)."""
    attempt = 0
    while True:
        try:
            return call()
        except LogstoreError as e:
            if not e.retriable or attempt >= options.fetch_offset_num_retries:
                raise
            attempt += 1
            log.warning("%s failed (%s); retry %d of %d in %d ms", what, e, attempt,
                        options.fetch_offset_num_retries, options.fetch_offset_retry_interval_ms)
            time.sleep(options.fetch_offset_retry_interval_ms / 1000)


def unknown_topics(options: SourceOptions, bounds: Mapping[TopicPartition, PartitionBounds]) -> list[str]:
    """Topics named by ``subscribe``/``assign`` that have no partition in ``bounds`` (sorted)."""
    named = options.subscribe if options.subscribe is not None else tuple(options.assign or ())
    present = {tp.topic for tp in bounds}
    return sorted(set(named) - present)


def _check_complete(spec: OffsetSpec, bounds: Mapping[TopicPartition, PartitionBounds], *, starting: bool) -> None:
    """A JSON position that names a topic must list each of its partitions (Spark's Kafka rule)."""
    partitions: dict[str, set[int]] = {}
    for tp in bounds:
        partitions.setdefault(tp.topic, set()).add(tp.partition)
    for topic, listed in (spec.offsets or {}).items():
        left_out = sorted(partitions.get(topic, set()) - set(listed))
        if left_out:
            name = ("starting" if starting else "ending") + (
                "Offsets" if spec.kind == "offsets" else "OffsetsByTimestamp")
            raise SourceOptionError(
                f"option {name} names topic {topic!r} but leaves out its partitions "
                f"{', '.join(map(str, left_out))}; list every partition of the topic "
                f"(-2 = earliest, -1 = latest)"
            )


def resolve_positions(
    client: BrokerClient,
    spec: OffsetSpec,
    bounds: Mapping[TopicPartition, PartitionBounds],
    options: SourceOptions,
    *,
    starting: bool,
) -> dict[TopicPartition, int]:
    """Offsets for every partition in ``bounds`` according to ``spec``.

    Timestamps resolve to the first offset whose record is at least that
    recent; when there is none, a starting position follows
    ``startingOffsetsByTimestampStrategy`` (error, or latest) and an ending
    position is the latest.
    """
    if spec.kind in ("offsets", "timestamps"):
        _check_complete(spec, bounds, starting=starting)
    out: dict[TopicPartition, int] = {}
    default = EARLIEST if starting else LATEST
    by_time: dict[TopicPartition, int] = {}
    for tp, b in bounds.items():
        if spec.kind == "earliest":
            out[tp] = b.log_start
        elif spec.kind == "latest":
            out[tp] = b.end
        elif spec.kind == "offsets":
            wanted = (spec.offsets or {}).get(tp.topic, {}).get(tp.partition, default)
            out[tp] = b.log_start if wanted == EARLIEST else b.end if wanted == LATEST else wanted
        elif spec.kind == "timestamp":
            assert spec.timestamp_ms is not None
            by_time[tp] = spec.timestamp_ms
        else:  # timestamps per partition
            ts = (spec.offsets or {}).get(tp.topic, {}).get(tp.partition)
            if ts is None:
                raise SourceOptionError(
                    f"option {'starting' if starting else 'ending'}OffsetsByTimestamp has no "
                    f"timestamp for partition {tp}; give one for every partition read"
                )
            by_time[tp] = ts
    if by_time:
        found = unwrap_items(by_time, client.list_offsets(by_time, isolation_level=options.isolation_level),
                             what="offset")
        for tp, answer in found.items():
            if answer.offset is not None:
                out[tp] = answer.offset
            elif starting and options.timestamp_strategy == "error":
                raise SourceOptionError(
                    f"no record in {tp} has a timestamp >= {by_time[tp]}; set "
                    "startingOffsetsByTimestampStrategy to latest to start at the end instead"
                )
            else:
                out[tp] = bounds[tp].end
    return out


def rate_limit(
    start: Mapping[TopicPartition, int],
    latest: Mapping[TopicPartition, int],
    max_offsets: int,
) -> dict[TopicPartition, int]:
    """End offsets that read at most ``max_offsets`` in total, shared by lag.

    Each partition gets ``floor(max_offsets * lag / total_lag)``; the
    offsets left over by rounding go one each to the partitions with the
    largest fractional share, so the total is exactly ``min(max_offsets,
    total_lag)`` and no partition with lag starves forever.
    """
    lags = {tp: max(latest[tp] - start.get(tp, latest[tp]), 0) for tp in latest}
    total = sum(lags.values())
    if total <= max_offsets:
        return dict(latest)
    shares = {tp: max_offsets * lag / total for tp, lag in lags.items()}
    grant = {tp: math.floor(s) for tp, s in shares.items()}
    left = max_offsets - sum(grant.values())
    for tp in sorted(shares, key=lambda t: (grant[t] - shares[t], t))[:left]:
        grant[tp] += 1
    return {tp: start.get(tp, latest[tp]) + min(grant[tp], lags[tp]) for tp in latest}


WAIT = None
"""What :func:`admit` answers when the next micro-batch must wait for more records."""


def admit(
    start: Mapping[TopicPartition, int],
    latest: Mapping[TopicPartition, int],
    *,
    max_rows: int | None,
    min_rows: int | None,
    waited_ms: float,
    max_delay_ms: int,
) -> dict[TopicPartition, int] | None:
    """The end offsets of the next micro-batch, or :data:`WAIT` (admission control as in
    Spark's Kafka source).

    ``max_rows`` (``maxOffsetsPerTrigger``) caps the batch, split by lag (:func:`rate_limit`).
    With ``min_rows`` (``minOffsetsPerTrigger``) a batch of fewer records waits, unless
    ``waited_ms`` — the time since the last batch was released, or since the query
    started for its first — has reached ``max_delay_ms`` (``maxTriggerDelay``); a batch
    with no records at all is never "released" early (Spark runs no batch for it anyway).
    ``min_rows=None`` never waits: the caller passes it for ``Trigger.Once`` (Spark's
    ``ReadAllAvailable``) and ``Trigger.AvailableNow``, whose end is fixed at start.
    """
    end = dict(latest) if max_rows is None else rate_limit(start, latest, max_rows)
    available = sum(end[tp] - start.get(tp, end[tp]) for tp in end)
    if min_rows is not None and available < min_rows and waited_ms < max_delay_ms:
        return WAIT
    return end


def plan_ranges(
    start: Mapping[TopicPartition, int],
    end: Mapping[TopicPartition, int],
    *,
    min_partitions: int | None,
    max_records_per_partition: int | None,
) -> list[OffsetRange]:
    """Split ``[start, end)`` of each partition into task ranges.

    A range is cut into pieces of at most ``max_records_per_partition``;
    then, while there are fewer ranges than ``min_partitions``, ranges are
    split in proportion to their size (as Spark's Kafka source does).
    Empty ranges are dropped, so equal start and end plan nothing.
    """
    ranges: list[OffsetRange] = []
    for tp in sorted(end):
        s, e = start.get(tp, end[tp]), end[tp]
        if e <= s:
            continue
        ranges.extend(_split(OffsetRange(tp.topic, tp.partition, s, e), max_records_per_partition))
    if min_partitions and len(ranges) < min_partitions:
        total = sum(r.size for r in ranges)
        out: list[OffsetRange] = []
        for r in ranges:
            parts = max(1, round(min_partitions * r.size / total)) if total else 1
            out.extend(_split(r, math.ceil(r.size / parts)))
        ranges = out
    return ranges


def _split(r: OffsetRange, piece: int | None) -> list[OffsetRange]:
    if not piece or r.size <= piece:
        return [r]
    return [
        OffsetRange(r.topic, r.partition, s, min(s + piece, r.end))
        for s in range(r.start, r.end, piece)
    ]


def check_data_loss(
    start: Mapping[TopicPartition, int],
    bounds: Mapping[TopicPartition, PartitionBounds],
    *,
    fail_on_data_loss: bool,
    past_end: bool = False,
) -> dict[TopicPartition, int]:
    """Starts adjusted for data that is gone; raises when that is not allowed.

    A partition whose start is below its log start offset lost
    ``log_start - start`` offsets (retention or deleted records); a
    partition that disappeared lost everything after its start; a partition
    whose end is now below the start (checked with ``past_end``: a streaming
    query's next start, an offset it has read up to) lost records the query
    had already read (an unclean leader election on a cluster made a replica
    that lacked them the leader, and the log was cut back). With ``failOnDataLoss`` the query
    fails with a message naming the partition and the offsets; without it the
    loss is logged and reading continues at the log start, at the new end (as
    Spark's Kafka source does), or without the partition.
    """
    adjusted = dict(start)
    for tp, offset in start.items():
        b = bounds.get(tp)
        if b is None:
            msg = (f"partition {tp} was deleted (the query had read it up to offset {offset}); "
                   "records after that offset may be lost.")
            if fail_on_data_loss:
                raise DataLossError(msg + " Set failOnDataLoss to false to continue without it.")
            log.warning("%s Continuing without it (failOnDataLoss=false).", msg)
            del adjusted[tp]
        elif offset < b.log_start:
            msg = (f"offsets {offset} to {b.log_start - 1} of partition {tp} are no longer in the "
                   f"log (its log start offset is now {b.log_start}); they were deleted by retention "
                   "or delete-records before the query read them.")
            if fail_on_data_loss:
                raise DataLossError(
                    msg + " Set failOnDataLoss to false to continue from the log start offset, "
                    "or restart the query with a new checkpoint."
                )
            log.warning("%s Continuing at offset %d (failOnDataLoss=false).", msg, b.log_start)
            adjusted[tp] = b.log_start
        elif past_end and offset > b.end:
            msg = (f"partition {tp} now ends at offset {b.end}, before offset {offset} the query had "
                   "already read up to: its log was cut back (an unclean leader election made a "
                   "replica without those records the leader), so the records now written at "
                   f"offsets {b.end} to {offset - 1} are not the ones the query read.")
            if fail_on_data_loss:
                raise DataLossError(
                    msg + " Set failOnDataLoss to false to continue from the new end, "
                    "or restart the query with a new checkpoint."
                )
            log.warning("%s Continuing at offset %d (failOnDataLoss=false).", msg, b.end)
            adjusted[tp] = b.end
    return adjusted


def narrow_positions(
    client: BrokerClient,
    start: Mapping[TopicPartition, int],
    end: Mapping[TopicPartition, int],
    options: SourceOptions,
    *,
    keep: Callable[[TopicPartition], bool],
    offsets: tuple[int | None, int | None],
    timestamp_floor_ms: int | None,
) -> tuple[dict[TopicPartition, int], dict[TopicPartition, int]]:
    """``(start, end)`` of the partitions ``keep`` accepts, cut to what pushed filters can match.

    ``offsets`` is ``[low, high)`` (None: unbounded) that every matching offset lies in.
    With ``timestamp_floor_ms`` each start moves up to the first offset whose record's
    timestamp is at least that (ListOffsets by timestamp): the time index promises every
    record before it is older, so nothing skipped can match. When no readable record is
    that recent, the partition's range is empty. Never widens a range.
    """
    low, high = offsets
    new_start: dict[TopicPartition, int] = {}
    new_end: dict[TopicPartition, int] = {}
    for tp in end:
        if not keep(tp):
            continue
        s, e = start.get(tp, end[tp]), end[tp]
        if high is not None:
            e = min(e, max(high, s))
        if low is not None:
            s = max(s, low)
        new_start[tp], new_end[tp] = min(s, e), e
    if timestamp_floor_ms is not None and timestamp_floor_ms >= 0:
        wanted = {tp: timestamp_floor_ms for tp in new_end if new_start[tp] < new_end[tp]}
        if wanted:
            found = _with_retries(lambda: unwrap_items(
                wanted, client.list_offsets(wanted, isolation_level=options.isolation_level), what="offset"),
                "looking up offsets by timestamp", options)
            for tp, answer in found.items():
                first = new_end[tp] if answer.offset is None else answer.offset
                new_start[tp] = min(max(new_start[tp], first), new_end[tp])
    return new_start, new_end
