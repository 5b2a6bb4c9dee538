"""Bounded work per request (issue 14, findings 2 and 8): entry caps on every RPC's lists,
fetch answers within max_bytes, no state for unknown topics, clear codes for
undecodable requests, a rate-limited log. The broker is real (in-process, or a child for RSS);
requests are sent raw so that malformed and oversized ones can be.
"""

from __future__ import annotations

import logging
import random
import time
from collections.abc import Iterator

import grpc
import pytest
from broker_helpers import produce, records, stub_for

from logstore._proto import logstore_pb2 as pb
from logstore.broker.config import load_broker_config
from logstore.broker.embedded import EmbeddedBroker
from logstore.broker.request_bounds import check_request, count_entries
from logstore.errors import WIRE_CODE_KEY, InvalidConfigError, InvalidRequestError
from logstore.log_limits import RepeatedMessageFilter
from logstore.wire import decode_fetch_response, encode_varint

CAP = 500


@pytest.fixture(scope="module")
def broker() -> Iterator[EmbeddedBroker]:
    with EmbeddedBroker(overrides={"max_request_entries": CAP, "max_fetch_reply_bytes": 200_000}) as b:
        stub = stub_for(b)
        stub.CreateTopics(pb.CreateTopicsRequest(topics=[pb.NewTopic(name="t", partitions=2)]), timeout=30)
        for i in range(20):
            produce(stub, "t", 0, records([b"v%d-" % i + b"x" * 2_000]))
        yield b


def _channel(broker: EmbeddedBroker) -> grpc.Channel:
    return grpc.insecure_channel(broker.bootstrap, options=[("grpc.max_send_message_length", 64 << 20),
                                                            ("grpc.max_receive_message_length", 256 << 20)])


def _code(err: grpc.RpcError) -> str | None:
    return dict(err.trailing_metadata() or ()).get(WIRE_CODE_KEY)


def _refused(call: grpc.UnaryUnaryMultiCallable, request: object) -> grpc.RpcError:
    with pytest.raises(grpc.RpcError) as info:
        call(request, timeout=30)
    return info.value


# ------------------------------------------------------------------ entry caps


def _oversized(cap: int) -> dict[str, object]:
    n = cap + 1
    tps = [pb.TopicPartitionRef(topic="t", partition=0)] * n
    return {
        "Produce": pb.ProduceRequest(acks=1, partitions=[pb.ProducePartition(topic="t", partition=0)] * n),
        "Fetch": pb.FetchRequest(max_wait_ms=0, partitions=[pb.FetchPartition(topic="t", partition=0)] * n),
        "ListOffsets": pb.ListOffsetsRequest(partitions=[pb.ListOffsetsPartition(topic="t", timestamp=-1)] * n),
        "DeleteRecords": pb.DeleteRecordsRequest(partitions=[pb.DeleteRecordsPartition(topic="nope")] * n),
        "Metadata": pb.MetadataRequest(topics=["t"] * n),
        "CreateTopics": pb.CreateTopicsRequest(topics=[pb.NewTopic(name="x")] * n, validate_only=True),
        "DeleteTopics": pb.DeleteTopicsRequest(names=["nope"] * n),
        "DescribeConfigs": pb.DescribeConfigsRequest(topics=["t"] * n),
        # One entry at the top, the rest nested: the cap counts every depth.
        "AlterConfigs": pb.AlterConfigsRequest(validate_only=True, alterations=[
            pb.AlterConfigsRequest.Alteration(topic="t", delete=["retention.ms"] * n)]),
        "OffsetCommit": pb.OffsetCommitRequest(group_id="g", partitions=[
            pb.OffsetCommitPartition(topic="t", partition=0, offset=0)] * n),
        # A packed list of ints counts one entry per int.
        "OffsetFetch": pb.OffsetFetchRequest(group_id="g", partitions=[
            pb.TopicPartitions(topic="t", partitions=list(range(n)))]),
        "DescribeGroups": pb.DescribeGroupsRequest(group_ids=["g"] * n),
        "DeleteGroups": pb.DeleteGroupsRequest(group_ids=["g"] * n),
        "AddPartitionsToTxn": pb.AddPartitionsToTxnRequest(transactional_id="x", partitions=tps),
        "EndTxnGroup": pb.EndTxnGroupRequest(group_id="g", commit=True, txns=[pb.TxnRef(transactional_id="x")] * n),
        "DescribeCleaning": pb.DescribeCleaningRequest(topics=["t"] * n),
        "ConsumerGroupHeartbeat": pb.ConsumerGroupHeartbeatRequest(group_id="g", subscribed_topics=["t"] * n),
    }


@pytest.mark.timeout(60)
@pytest.mark.parametrize("method", sorted(_oversized(1)))
def test_request_with_more_entries_than_the_cap_is_refused(broker: EmbeddedBroker, method: str) -> None:
    stub = stub_for(broker)
    err = _refused(getattr(stub, method), _oversized(CAP)[method])
    assert err.code() == grpc.StatusCode.INVALID_ARGUMENT, err
    assert _code(err) == "INVALID_REQUEST"
    assert "max_request_entries" in (err.details() or "") and str(CAP) in (err.details() or "")


@pytest.mark.timeout(60)
def test_streamed_request_with_more_entries_than_the_cap_is_refused(broker: EmbeddedBroker) -> None:
    begin = pb.ReplaceSegmentsBegin(topic="t", partition=0, segments=[pb.CleanableSegment()] * (CAP + 1))
    with pytest.raises(grpc.RpcError) as info:
        stub_for(broker).ReplaceSegments(iter([pb.ReplaceSegmentsRequest(begin=begin)]), timeout=30)
    assert info.value.code() == grpc.StatusCode.INVALID_ARGUMENT, info.value
    assert _code(info.value) == "INVALID_REQUEST" and "max_request_entries" in (info.value.details() or "")


@pytest.mark.timeout(60)
def test_request_at_the_cap_is_served(broker: EmbeddedBroker) -> None:
    stub = stub_for(broker)
    resp = stub.Metadata(pb.MetadataRequest(topics=["t"] * CAP), timeout=30)
    assert len(resp.topics) == CAP
    answer = stub.Fetch(pb.FetchRequest(max_wait_ms=0, partitions=[pb.FetchPartition(topic="t", partition=1)] * CAP),
                        timeout=30)
    assert len(answer.partitions) == CAP


@pytest.mark.timeout(60)
def test_huge_produce_is_refused_quickly(broker: EmbeddedBroker) -> None:
    """300 k entries (the issue's 2.6 MiB request took 36.8 s and 2.3 GB) are refused at once."""
    entry = pb.ProducePartition(topic="t", partition=0).SerializeToString()
    data = b"".join([b"\x22", bytes([len(entry)]), entry] * 300_000)
    call = _channel(broker).unary_unary("/logstore.v1.Logstore/Produce")
    started = time.monotonic()
    with pytest.raises(grpc.RpcError) as info:
        call(data, timeout=30)
    assert info.value.code() == grpc.StatusCode.INVALID_ARGUMENT
    assert time.monotonic() - started < 5


@pytest.mark.timeout(60)
@pytest.mark.parametrize("flood", ["acks", "partition"])
def test_produce_repeating_a_singular_field_is_refused_quickly(broker: EmbeddedBroker, flood: str) -> None:
    """3 M repetitions of acks (or of one partition entry's partition number) cost the
    parser as many steps as 3 M entries would: refused at 16 fields per allowed entry."""
    if flood == "acks":
        data = b"\x08\x01" * 3_000_000
    else:
        entry = b"\x10\x00" * 3_000_000
        data = b"\x22" + encode_varint(len(entry)) + entry
    started = time.monotonic()
    with pytest.raises(grpc.RpcError) as info:
        _channel(broker).unary_unary("/logstore.v1.Logstore/Produce")(data, timeout=30)
    assert info.value.code() == grpc.StatusCode.INVALID_ARGUMENT, info.value
    assert "max_request_entries" in (info.value.details() or "")
    assert time.monotonic() - started < 2


@pytest.mark.parametrize("key", ["max_request_entries", "max_fetch_reply_bytes"])
def test_request_bounds_must_be_positive(key: str) -> None:
    assert getattr(load_broker_config(overrides={key: 7}, env={}), key) == 7
    with pytest.raises(InvalidConfigError, match=f"{key} must be at least 1, got 0"):
        load_broker_config(overrides={key: 0}, env={})


def test_count_entries_stops_at_the_cap() -> None:
    request = pb.MetadataRequest(topics=["a"] * 10).SerializeToString()
    assert count_entries(request, pb.MetadataRequest.DESCRIPTOR, 100) == 10
    assert count_entries(request, pb.MetadataRequest.DESCRIPTOR, 5) == 6
    nested = pb.OffsetFetchRequest(partitions=[pb.TopicPartitions(topic="t", partitions=[1, 300, 70000])] * 2)
    assert count_entries(nested.SerializeToString(), pb.OffsetFetchRequest.DESCRIPTOR, 100) == 8


def test_check_request_counts_what_protobuf_accepts_and_the_walk_does_not() -> None:
    """An unknown group field (protobuf skips it; the wire walk refuses groups): counted after parsing."""
    data = pb.MetadataRequest(topics=["a"] * 20).SerializeToString() + b"\x1b\x1c"
    assert list(check_request("Metadata", data, pb.MetadataRequest, 20).topics) == ["a"] * 20
    with pytest.raises(InvalidRequestError, match="max_request_entries = 5"):
        check_request("Metadata", data, pb.MetadataRequest, 5)
    with pytest.raises(InvalidRequestError, match="not a valid logstore.v1.MetadataRequest"):
        check_request("Metadata", b"\x0a\x05ab" * 10, pb.MetadataRequest, 5)


# ------------------------------------------------------------------ bounded fetch answers


def _fetch_raw(broker: EmbeddedBroker, request: pb.FetchRequest) -> bytes:
    call = _channel(broker).unary_unary(
        "/logstore.v1.Logstore/Fetch", request_serializer=pb.FetchRequest.SerializeToString)
    return call(request, timeout=30)  # type: ignore[no-any-return]


@pytest.mark.timeout(60)
def test_fetch_answer_honours_max_bytes_across_partitions(broker: EmbeddedBroker) -> None:
    # The same partition named many times, a batch each: each entry reads
    # the same batch (about 3 kB stored), and its schema (about 0.5 kB) comes with it.
    max_bytes = 30_000
    data = _fetch_raw(broker, pb.FetchRequest(max_wait_ms=0, max_bytes=max_bytes, partitions=[
        pb.FetchPartition(topic="t", partition=0, fetch_offset=0, partition_max_bytes=4_000)] * 200))
    answer = decode_fetch_response(data)
    served = [r for r, recs in answer if len(recs)]
    assert served and answer[0][1].nbytes > 0  # the first partition with data is served
    assert len(answer) == 200
    # Records and schemas within max_bytes; the rest are the small per-partition headers.
    payload = sum(len(recs) + len(r.schema) for r, recs in answer)
    assert payload <= max_bytes, payload
    assert len(data) < max_bytes + 200 * 64, len(data)
    # Partitions past the budget carry their bounds and no records, for the consumer to ask again.
    last, recs = answer[-1]
    assert not len(recs) and not last.schema and last.high_watermark == 20 and last.next_offset == 0


@pytest.mark.timeout(60)
def test_fetch_always_returns_the_first_batch(broker: EmbeddedBroker) -> None:
    answer = decode_fetch_response(_fetch_raw(broker, pb.FetchRequest(max_wait_ms=0, max_bytes=1, partitions=[
        pb.FetchPartition(topic="t", partition=0, fetch_offset=5)] * 3)))
    assert answer[0][0].next_offset == 6 and len(answer[0][1]) > 1
    assert [len(recs) for _, recs in answer[1:]] == [0, 0]


@pytest.mark.timeout(60)
def test_fetch_answer_within_the_broker_ceiling(broker: EmbeddedBroker) -> None:
    """max_bytes 0 (no limit) or above max_fetch_reply_bytes (200 000 here) gets the ceiling."""
    for max_bytes in (0, 1 << 30):
        data = _fetch_raw(broker, pb.FetchRequest(max_wait_ms=0, max_bytes=max_bytes, partitions=[
            pb.FetchPartition(topic="t", partition=0, fetch_offset=0)] * CAP))
        assert len(data) < 200_000 + CAP * 64, len(data)


# ------------------------------------------------------------------ no state for unknown topics


def _rss_kb(pid: int) -> int:
    with open(f"/proc/{pid}/status") as f:
        for line in f:
            if line.startswith("VmRSS:"):
                return int(line.split()[1])
    raise AssertionError("no VmRSS")


@pytest.mark.timeout(120)
def test_fetches_naming_unknown_topics_keep_no_state() -> None:
    with EmbeddedBroker(subprocess=True) as b:
        stub = stub_for(b)
        pid = b._proc.pid  # type: ignore[union-attr]

        def flood(prefix: str, requests: int) -> None:
            for i in range(requests):
                stub.Fetch(pb.FetchRequest(max_wait_ms=0, partitions=[
                    pb.FetchPartition(topic=f"{prefix}-{i}-{j}-{'x' * 40}") for j in range(1_000)]), timeout=30)

        flood("warm", 10)  # allocator and gRPC warm-up
        before = _rss_kb(pid)
        flood("unknown", 60)  # 60 000 distinct unknown names
        grown_kb = _rss_kb(pid) - before
        print(f"RSS {before} kB -> {before + grown_kb} kB after 60 000 unknown names")
        assert grown_kb < 12_000, f"the broker grew {grown_kb} kB for 60 000 unknown topic names"


# ------------------------------------------------------------------ undecodable requests


def _methods() -> list[tuple[str, bool]]:
    service = pb.DESCRIPTOR.services_by_name["Logstore"]
    return [(m.name, m.client_streaming) for m in service.methods]


@pytest.mark.timeout(120)
def test_random_bytes_to_every_rpc_get_a_clear_error() -> None:
    rng = random.Random(14)
    ours = {grpc.StatusCode.OK, grpc.StatusCode.INVALID_ARGUMENT}
    with EmbeddedBroker(overrides={"group_heartbeat_interval_ms": 100}) as b:
        channel = _channel(b)
        seen: dict[str, int] = {}
        for _ in range(16):
            for name, streaming in _methods():
                path = f"/logstore.v1.Logstore/{name}"
                data = rng.randbytes(rng.choice([1, 3, 8, 40, 200]))
                try:
                    if streaming:
                        channel.stream_unary(path)(iter([data]), timeout=10)
                    else:
                        channel.unary_unary(path)(data, timeout=10)
                    code, wire = grpc.StatusCode.OK, None
                except grpc.RpcError as e:
                    code, wire = e.code(), _code(e)
                    assert code != grpc.StatusCode.UNKNOWN, (name, data, e.details())
                    assert code in ours or wire is not None, (name, data, code, e.details())
                    if code == grpc.StatusCode.INVALID_ARGUMENT:
                        assert wire is not None and "Traceback" not in (e.details() or ""), (name, e.details())
                seen[code.name] = seen.get(code.name, 0) + 1
        print(seen)
        assert seen.get("INVALID_ARGUMENT", 0) > 100, seen
        # Still serving normally.
        stub = stub_for(b)
        stub.CreateTopics(pb.CreateTopicsRequest(topics=[pb.NewTopic(name="after")]), timeout=30)
        assert not produce(stub, "after", 0, records([b"ok"])).error.code
        answer = stub.Fetch(pb.FetchRequest(max_wait_ms=0, partitions=[pb.FetchPartition(topic="after")]), timeout=30)
        assert answer.partitions[0].records and answer.partitions[0].high_watermark == 1


@pytest.mark.timeout(60)
def test_undecodable_request_names_the_rpc_and_message(broker: EmbeddedBroker) -> None:
    call = _channel(broker).unary_unary("/logstore.v1.Logstore/Metadata")
    with pytest.raises(grpc.RpcError) as info:
        call(b"\x0a\x05ab", timeout=30)  # a string field that runs past the end
    assert info.value.code() == grpc.StatusCode.INVALID_ARGUMENT
    assert _code(info.value) == "INVALID_REQUEST"
    assert "Metadata" in (info.value.details() or "") and "MetadataRequest" in (info.value.details() or "")


# ------------------------------------------------------------------ rate-limited log


def test_repeated_message_filter_limits_each_template_and_counts_the_rest() -> None:
    now = [0.0]
    limit = RepeatedMessageFilter(burst=3, interval_s=60.0, clock=lambda: now[0])

    def record(msg: str, *args: object, level: int = logging.WARNING, name: str = "logstore.broker") -> logging.LogRecord:
        return logging.LogRecord(name, level, __file__, 1, msg, args, None)

    passed = [r for r in (record("refused %s from %s", "Fetch", i) for i in range(100)) if limit.filter(r)]
    assert [r.getMessage() for r in passed] == ["refused Fetch from 0", "refused Fetch from 1", "refused Fetch from 2"]
    # Another template, logger or level has its own allowance; info lines are never limited.
    assert limit.filter(record("other %s", 1))
    assert limit.filter(record("refused %s from %s", "Fetch", 1, name="logstore.other"))
    assert limit.filter(record("refused %s from %s", "Fetch", 1, level=logging.ERROR))
    assert all(limit.filter(record("refused %s from %s", "x", i, level=logging.INFO)) for i in range(50))
    now[0] = 61.0
    later = record("refused %s from %s", "Fetch", 100)
    assert limit.filter(later)
    assert later.getMessage() == "refused Fetch from 100 [suppressed 97 similar messages]"
    again = record("refused %s from %s", "Fetch", 101)
    assert limit.filter(again) and again.getMessage() == "refused Fetch from 101"


@pytest.mark.timeout(120)
def test_a_flood_of_bad_requests_logs_a_bounded_number_of_lines(capfd: pytest.CaptureFixture[str]) -> None:
    rng = random.Random(8)
    with EmbeddedBroker(subprocess=True) as b:
        capfd.readouterr()
        channel = _channel(b)
        for i in range(300):
            method = ("Metadata", "Fetch", "Produce", "ListOffsets")[i % 4]
            with pytest.raises(grpc.RpcError) as info:
                channel.unary_unary(f"/logstore.v1.Logstore/{method}")(b"\xff" + rng.randbytes(20), timeout=10)
            assert info.value.code() == grpc.StatusCode.INVALID_ARGUMENT
        stub_for(b).Metadata(pb.MetadataRequest(), timeout=30)  # still serving
    lines = capfd.readouterr().err.splitlines()
    refused = [line for line in lines if "refused a" in line]
    assert 1 <= len(refused) <= 10, refused  # one template, burst 10 a minute
    assert len(lines) < 40, lines
