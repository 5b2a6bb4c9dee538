"""Option parsing and offset planning of the Spark source, without Spark or a broker."""

from __future__ import annotations

import json

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from logstore.types import TopicPartition
from spark_source.options import SourceOptionError, parse_duration_ms, parse_source_options
from spark_source.planner import (
    WAIT,
    DataLossError,
    OffsetRange,
    PartitionBounds,
    admit,
    check_data_loss,
    from_spark_offsets,
    plan_ranges,
    rate_limit,
    to_spark_offsets,
)

BOOT = {"logstore.bootstrap.servers": "127.0.0.1:9999"}


def parse(streaming: bool = True, **opts: str):  # type: ignore[no-untyped-def]
    return parse_source_options({**BOOT, **{k.lower(): v for k, v in opts.items()}}, streaming=streaming)


def test_subscription_forms() -> None:
    assert parse(subscribe="a, b").subscribe == ("a", "b")
    assert parse(subscribePattern="ord.*").matches("orders")
    assert not parse(subscribePattern="ord.*").matches("xorders")
    assert parse(assign='{"a": [0, 2]}').assign == {"a": (0, 2)}


@pytest.mark.parametrize(
    ("opts", "fragment"),
    [
        ({}, "exactly one of the options subscribe, subscribePattern and assign"),
        ({"subscribe": "a", "assign": '{"a":[0]}'}, "got subscribe, assign"),
        ({"subscribe": "a", "bogus": "1"}, "unknown option 'bogus'"),
        ({"subscribe": "a", "kafka.bootstrap.servers": "x:1"}, "are the same option with different values"),
        ({"subscribePattern": "("}, "not a valid regex"),
        ({"assign": "[1]"}, "must be JSON like"),
        ({"subscribe": "a", "startingOffsets": "{bad"}, "startingOffsets"),
        ({"subscribe": "a", "startingOffsets": '{"a": {"0": -3}}'}, "offset -3 for a-0 is invalid"),
        ({"subscribe": "a", "endingOffsets": "latest"}, "batch queries only"),
        ({"subscribe": "a", "maxOffsetsPerTrigger": "0"}, "maxOffsetsPerTrigger must be >= 1"),
        ({"subscribe": "a", "maxOffsetsPerTrigger": "ten"}, "is not an integer"),
        ({"subscribe": "a", "minOffsetsPerTrigger": "10", "maxOffsetsPerTrigger": "5"}, "exceeds"),
        ({"subscribe": "a", "maxTriggerDelay": "soon"}, "is not a duration"),
        ({"subscribe": "a", "failOnDataLoss": "maybe"}, "failOnDataLoss must be true or false"),
        ({"subscribe": "a", "isolationLevel": "dirty"}, "isolationLevel must be"),
        ({"subscribe": "a", "startingOffsetsByTimestampStrategy": "x"}, "error or latest"),
        ({"subscribe": "a", "logstore.bootstrap.servers": "nohost"}, "must be host:port"),
    ],
)
def test_bad_stream_options_name_the_option(opts: dict[str, str], fragment: str) -> None:
    with pytest.raises(SourceOptionError) as info:
        parse_source_options({**BOOT, **{k.lower(): v for k, v in opts.items()}}, streaming=True)
    assert fragment in str(info.value)
    assert info.value.code == "INVALID_CONFIG"


def test_batch_rules() -> None:
    with pytest.raises(SourceOptionError, match="not valid for batch"):
        parse(streaming=False, subscribe="a", startingOffsets="latest")
    with pytest.raises(SourceOptionError, match="cannot be 'earliest'"):
        parse(streaming=False, subscribe="a", endingOffsets="earliest")
    with pytest.raises(SourceOptionError, match="streaming queries only"):
        parse(streaming=False, subscribe="a", maxOffsetsPerTrigger="5")
    opts = parse(streaming=False, subscribe="a", endingOffsets='{"a": {"0": 10, "1": -1}}')
    assert opts.starting.kind == "earliest"
    assert opts.ending.offsets == {"a": {0: 10, 1: -1}}


def test_defaults_and_precedence() -> None:
    o = parse(subscribe="a")
    assert o.starting.kind == "latest" and o.fail_on_data_loss and o.read_committed
    assert not o.include_headers and o.max_trigger_delay_ms == 15 * 60_000
    o = parse(subscribe="a", startingOffsets="earliest", startingTimestamp="5",
              startingOffsetsByTimestamp='{"a": {"0": 7}}')
    assert o.starting.kind == "timestamps"
    o = parse(subscribe="a", startingOffsets="earliest", startingTimestamp="5")
    assert o.starting.kind == "timestamp" and o.starting.timestamp_ms == 5


def test_durations() -> None:
    assert parse_duration_ms("15m", option="x") == 900_000
    assert parse_duration_ms("30s", option="x") == 30_000
    assert parse_duration_ms("250", option="x") == 250
    assert parse_duration_ms("2h", option="x") == 7_200_000


def test_offsets_round_trip_and_golden_checkpoint_form() -> None:
    # The checkpoint form is {topic: {"partition": next_offset}}; old checkpoints must stay readable.
    golden = json.loads('{"orders": {"0": 15000, "1": 14990}, "customers": {"3": 7}}')
    offsets = from_spark_offsets(golden)
    assert offsets == {TopicPartition("orders", 0): 15000, TopicPartition("orders", 1): 14990,
                       TopicPartition("customers", 3): 7}
    assert to_spark_offsets(offsets) == golden


def tp(p: int) -> TopicPartition:
    return TopicPartition("t", p)


def test_rate_limit_splits_by_lag_and_is_exact() -> None:
    start = {tp(0): 0, tp(1): 100, tp(2): 50}
    latest = {tp(0): 600, tp(1): 400, tp(2): 150}  # lags 600, 300, 100
    end = rate_limit(start, latest, 100)
    assert end == {tp(0): 60, tp(1): 130, tp(2): 60}
    assert rate_limit(start, latest, 10_000) == latest


@settings(max_examples=200, deadline=None)
@given(
    lags=st.lists(st.integers(0, 10_000), min_size=1, max_size=8),
    starts=st.lists(st.integers(0, 1000), min_size=8, max_size=8),
    limit=st.integers(1, 20_000),
)
def test_rate_limit_properties(lags: list[int], starts: list[int], limit: int) -> None:
    start = {tp(i): starts[i] for i in range(len(lags))}
    latest = {tp(i): starts[i] + lag for i, lag in enumerate(lags)}
    end = rate_limit(start, latest, limit)
    taken = [end[t] - start[t] for t in start]
    assert all(0 <= taken[i] <= lags[i] for i in range(len(lags)))
    assert sum(taken) == min(limit, sum(lags))


def test_plan_ranges_min_partitions_and_max_records() -> None:
    start = {tp(0): 0, tp(1): 0, tp(2): 5}
    end = {tp(0): 100, tp(1): 10, tp(2): 5}
    assert plan_ranges(start, end, min_partitions=None, max_records_per_partition=None) == [
        OffsetRange("t", 0, 0, 100), OffsetRange("t", 1, 0, 10)]
    ranges = plan_ranges(start, end, min_partitions=10, max_records_per_partition=None)
    assert len(ranges) >= 10
    assert sum(r.size for r in ranges if r.partition == 0) == 100
    by_partition = sorted((r.partition, r.start, r.end) for r in ranges)
    for (p1, _, e1), (p2, s2, _) in zip(by_partition, by_partition[1:], strict=False):
        if p1 == p2:
            assert e1 == s2, "split ranges must be contiguous"
    capped = plan_ranges(start, end, min_partitions=None, max_records_per_partition=30)
    assert [r.size for r in capped if r.partition == 0] == [30, 30, 30, 10]
    assert plan_ranges(start, start, min_partitions=4, max_records_per_partition=None) == []


def test_data_loss_fails_or_continues() -> None:
    bounds = {tp(0): PartitionBounds(log_start=50, end=80), tp(1): PartitionBounds(0, 10)}
    with pytest.raises(DataLossError) as info:
        check_data_loss({tp(0): 20, tp(1): 3}, bounds, fail_on_data_loss=True)
    msg = str(info.value)
    assert "offsets 20 to 49 of partition t-0" in msg and "failOnDataLoss" in msg
    assert check_data_loss({tp(0): 20, tp(1): 3}, bounds, fail_on_data_loss=False) == {tp(0): 50, tp(1): 3}
    with pytest.raises(DataLossError, match="t-2 was deleted"):
        check_data_loss({tp(2): 4}, bounds, fail_on_data_loss=True)
    assert check_data_loss({tp(2): 4}, bounds, fail_on_data_loss=False) == {}
    # A log cut back below what was read (unclean election): only where the start is a read position.
    assert check_data_loss({tp(1): 12}, bounds, fail_on_data_loss=True) == {tp(1): 12}
    with pytest.raises(DataLossError, match=r"now ends at offset 10, before offset 12.*offsets 10 to 11"):
        check_data_loss({tp(1): 12}, bounds, fail_on_data_loss=True, past_end=True)
    assert check_data_loss({tp(1): 12}, bounds, fail_on_data_loss=False, past_end=True) == {tp(1): 10}
    assert check_data_loss({tp(1): 10}, bounds, fail_on_data_loss=True, past_end=True) == {tp(1): 10}


def test_admit_waits_for_min_rows_until_the_delay() -> None:
    """admit(): minOffsetsPerTrigger holds a small batch back until maxTriggerDelay, counted from
    the last release; maxOffsetsPerTrigger caps it; no minimum never waits."""
    a0, a1 = TopicPartition("a", 0), TopicPartition("a", 1)
    start, latest = {a0: 10, a1: 0}, {a0: 13, a1: 2}
    rules = {"max_delay_ms": 1000}
    assert admit(start, latest, max_rows=None, min_rows=10, waited_ms=0, **rules) is WAIT
    assert admit(start, latest, max_rows=None, min_rows=10, waited_ms=999, **rules) is WAIT
    assert admit(start, latest, max_rows=None, min_rows=10, waited_ms=1000, **rules) == latest
    assert admit(start, latest, max_rows=None, min_rows=5, waited_ms=0, **rules) == latest
    assert admit(start, latest, max_rows=None, min_rows=None, waited_ms=0, **rules) == latest
    # The cap counts: 4 of the 5 available records are fewer than a minimum of 5.
    assert admit(start, latest, max_rows=4, min_rows=5, waited_ms=0, **rules) is WAIT
    capped = admit(start, latest, max_rows=4, min_rows=4, waited_ms=0, **rules)
    assert capped is not None and sum(capped[tp] - start[tp] for tp in capped) == 4


@given(st.dictionaries(st.integers(0, 3), st.tuples(st.integers(0, 50), st.integers(0, 50)), min_size=1),
       st.one_of(st.none(), st.integers(1, 60)), st.one_of(st.none(), st.integers(1, 60)),
       st.integers(0, 2000))
@settings(max_examples=200, deadline=None)
def test_admit_against_a_model(parts: dict[int, tuple[int, int]], max_rows: int | None,
                               min_rows: int | None, waited_ms: int) -> None:
    start = {TopicPartition("t", p): a for p, (a, _) in parts.items()}
    latest = {TopicPartition("t", p): a + b for p, (a, b) in parts.items()}
    end = admit(start, latest, max_rows=max_rows, min_rows=min_rows, waited_ms=waited_ms, max_delay_ms=1000)
    backlog = sum(latest[tp] - start[tp] for tp in start)
    batch = min(backlog, max_rows) if max_rows is not None else backlog
    if min_rows is not None and batch < min_rows and waited_ms < 1000:
        assert end is WAIT
    else:
        assert end is not None and sum(end[tp] - start[tp] for tp in end) == batch
        assert all(start[tp] <= end[tp] <= latest[tp] for tp in end)
