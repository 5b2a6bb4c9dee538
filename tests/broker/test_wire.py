"""The wire codec of Produce and Fetch (:mod:`logstore.wire`), round trips against protobuf.

All four directions: :func:`~logstore.wire.encode_produce_request` gives what
``SerializeToString`` gives; :func:`~logstore.wire.parse_produce_request` reads
what protobuf reads (checked against protobuf on generated messages, unknown
fields included), refuses what protobuf refuses with INVALID_REQUEST, and is
what the running broker uses; :func:`~logstore.wire.encode_fetch_response`
gives bytes that protobuf parses as the answer with its records;
:func:`~logstore.wire.decode_fetch_response` (and the client's
:func:`~logstore.client.messages.fetched_partitions` over it) reads what
protobuf reads."""

from __future__ import annotations

from typing import Any

import grpc
import pytest
from hypothesis import assume, given, settings
from hypothesis import strategies as st

from logstore._proto import logstore_pb2 as pb
from logstore.broker.embedded import EmbeddedBroker
from logstore.errors import WIRE_CODE_KEY, InvalidRequestError
from logstore.types import TopicPartition
from logstore.wire import (
    FETCH_PADDING_FIELD,
    decode_fetch_response,
    encode_fetch_response,
    encode_produce_request,
    parse_produce_request,
)
from logstore.wire import encode_varint as _varint

int32s = st.integers(min_value=-(2**31), max_value=2**31 - 1)
partitions = st.builds(
    pb.ProducePartition, topic=st.text(max_size=20), partition=int32s, records=st.binary(max_size=300),
    current_leader_epoch=st.none() | st.integers(0, 2**31 - 1),
)
requests = st.builds(
    pb.ProduceRequest, acks=int32s, timeout_ms=int32s, transactional_id=st.text(max_size=10),
    partitions=st.lists(partitions, max_size=4),
    correlation_id=st.integers(-(2**63), 2**63 - 1),  # ProduceStream's (issue 24)
)


def _same(data: bytes) -> None:
    expected = pb.ProduceRequest.FromString(data)
    got = parse_produce_request(data)
    assert (got.acks, got.timeout_ms, got.transactional_id, got.correlation_id) == (
        expected.acks, expected.timeout_ms, expected.transactional_id, expected.correlation_id)
    assert [(p.topic, p.partition, bytes(p.records), p.current_leader_epoch) for p in got.partitions] == [
        (p.topic, p.partition, p.records,
         p.current_leader_epoch if p.HasField("current_leader_epoch") else -1) for p in expected.partitions]


@settings(max_examples=300, deadline=None)
@given(requests)
def test_reads_what_protobuf_reads(request: pb.ProduceRequest) -> None:
    _same(request.SerializeToString())


@settings(max_examples=100, deadline=None)
@given(requests, st.lists(st.tuples(st.integers(5, 60), st.sampled_from([0, 1, 2, 5]),
                                    st.binary(max_size=12)), max_size=3))
def test_skips_unknown_fields_and_last_scalar_wins(request: pb.ProduceRequest, extra: list) -> None:
    data = request.SerializeToString()
    for number, wire_type, payload in extra:
        key = _varint(number << 3 | wire_type)
        if wire_type == 0:
            data += key + _varint(len(payload))
        elif wire_type == 1:
            data += key + payload.ljust(8, b"\0")[:8]
        elif wire_type == 5:
            data += key + payload.ljust(4, b"\0")[:4]
        else:
            data += key + _varint(len(payload)) + payload
    data += _varint(1 << 3) + _varint(7)  # acks again: the last one counts
    data += _varint(2 << 3 | 2) + _varint(1) + b"x"  # timeout_ms with a wrong wire type: unknown
    _same(data)


@settings(max_examples=300, deadline=None)
@given(requests, st.lists(st.integers(0, 5), max_size=4))
def test_produce_encoding_is_what_protobuf_serializes(request: pb.ProduceRequest, cuts: list) -> None:
    """Our encoder → protobuf: the same bytes as ``SerializeToString`` (records in pieces too)."""
    # leader epochs are given per partition: a request naming one partition twice cannot
    # give each its own (the client never sends one twice)
    assume(len({(p.topic, p.partition) for p in request.partitions}) == len(request.partitions))
    def pieces(records: bytes) -> list[bytes | memoryview]:
        bounds = sorted({0, len(records), *(min(c * 37, len(records)) for c in cuts)})
        return [memoryview(records)[a:b] for a, b in zip(bounds, bounds[1:], strict=False)]

    for split in (False, True):
        data = encode_produce_request(
            [(TopicPartition(p.topic, p.partition), pieces(p.records) if split else p.records)
             for p in request.partitions],
            acks=request.acks, timeout_ms=request.timeout_ms, transactional_id=request.transactional_id,
            leader_epochs={TopicPartition(p.topic, p.partition): p.current_leader_epoch
                           for p in request.partitions if p.HasField("current_leader_epoch")},
            correlation_id=request.correlation_id)
        assert data == request.SerializeToString()
        assert pb.ProduceRequest.FromString(data) == request


def test_records_are_views_of_the_request() -> None:
    data = encode_produce_request([(TopicPartition("t", 3), [b"r" * 1000])], acks=1, timeout_ms=5)
    parsed = parse_produce_request(data)
    assert isinstance(parsed.partitions[0].records, memoryview)
    assert parsed.partitions[0].records.obj is data


@pytest.mark.parametrize("data", [
    b"\x08",                      # truncated varint
    b"\x08" + b"\xff" * 11,       # overlong varint
    b"\x22\x05abc",               # partitions entry runs past the end
    b"\x1a\x02\xff\xfe",          # transactional_id is not UTF-8
    b"\x22\x04\x0a\x02\xc3\x28",  # topic is not UTF-8
    b"\x00\x01",                  # field number 0
    b"\x0b",                      # start group
])
def test_refuses_what_protobuf_refuses(data: bytes) -> None:
    with pytest.raises(Exception):  # noqa: B017 - protobuf's DecodeError
        pb.ProduceRequest.FromString(data)
    with pytest.raises(InvalidRequestError):
        parse_produce_request(data)


@pytest.mark.timeout(60)
def test_broker_parses_produce_in_wire_form() -> None:
    with EmbeddedBroker() as broker:
        channel = grpc.insecure_channel(broker.bootstrap)
        raw = channel.unary_unary("/logstore.v1.Logstore/Produce")
        with pytest.raises(grpc.RpcError) as info:
            raw(b"\x22\x05abc", timeout=10)
        # protobuf's deserializer would fail the call with INTERNAL and no logstore code
        assert info.value.code() == grpc.StatusCode.INVALID_ARGUMENT
        assert dict(info.value.trailing_metadata())[WIRE_CODE_KEY] == "INVALID_REQUEST"
        answer = pb.ProduceResponse.FromString(raw(
            encode_produce_request([(TopicPartition("missing", 0), b"x")], acks=1, timeout_ms=1000),
            timeout=10))
        assert answer.partitions[0].error.code == "UNKNOWN_TOPIC_OR_PARTITION"
        channel.close()


aborted = st.builds(pb.AbortedTransaction, producer_id=st.integers(-1, 2**40),
                    first_offset=st.integers(0, 2**40))
fetch_parts = st.tuples(
    st.builds(pb.FetchPartitionResponse, topic=st.text(max_size=20), partition=int32s,
              error=st.builds(pb.Error, code=st.text(max_size=8), message=st.text(max_size=20)),
              high_watermark=st.integers(-1, 2**40), last_stable_offset=st.integers(-1, 2**40),
              log_start_offset=st.integers(-1, 2**40), schema=st.binary(max_size=50),
              aborted_transactions=st.lists(aborted, max_size=3), next_offset=st.integers(0, 2**40)),
    st.binary(max_size=3000),
)


@settings(max_examples=300, deadline=None)
@given(st.lists(fetch_parts, max_size=4))
def test_fetch_answer_parses_as_protobuf_with_the_records(parts: list) -> None:
    expected = pb.FetchResponse()
    for resp, records in parts:
        full = pb.FetchPartitionResponse()
        full.CopyFrom(resp)
        full.records = records
        expected.partitions.append(full)
    got = encode_fetch_response([(resp, memoryview(records)) for resp, records in parts])
    parsed = pb.FetchResponse.FromString(got)
    # The only field protobuf does not know is the alignment padding: zero bytes.
    for partition in parsed.partitions:
        for number, wire_type, value in unknown_fields(partition):
            assert (number, wire_type, value.strip(b"\0")) == (FETCH_PADDING_FIELD, 2, b"")
    parsed.DiscardUnknownFields()
    assert parsed == expected


def unknown_fields(message: Any) -> list[tuple[int, int, bytes]]:
    """The unknown fields of ``message`` as (number, wire type, bytes)."""
    from google.protobuf.unknown_fields import UnknownFieldSet

    return [(f.field_number, f.wire_type, f.data) for f in UnknownFieldSet(message)]


@settings(max_examples=200, deadline=None)
@given(st.lists(fetch_parts, max_size=6), st.integers(0, 7))
def test_fetch_answer_puts_every_partitions_records_at_an_8_aligned_position(parts: list, shift: int) -> None:
    """So Arrow decodes them zero-copy: the padding keeps records aligned whatever precedes them."""
    answers = [(resp, memoryview(records)) for resp, records in parts]
    data = encode_fetch_response(answers)
    decoded = decode_fetch_response(data)
    assert [bytes(records) for _, records in decoded] == [bytes(records) for _, records in answers]
    view = memoryview(data)
    for _, records in decoded:
        if len(records):
            assert records.obj is data
            assert _position(view, records) % 8 == 0
    # The padding is a field of its own: no field of the schema may take its number.
    assert FETCH_PADDING_FIELD not in pb.FetchPartitionResponse.DESCRIPTOR.fields_by_number


def _position(whole: memoryview, part: memoryview) -> int:
    import pyarrow as pa

    return pa.py_buffer(part).address - pa.py_buffer(whole).address


@settings(max_examples=300, deadline=None)
@given(st.lists(fetch_parts, max_size=4), st.lists(st.tuples(st.integers(11, 60), st.binary(max_size=12)),
                                                    max_size=3))
def test_fetch_decoding_reads_what_protobuf_serializes(parts: list, extra: list) -> None:
    """Protobuf → our decoder: each partition's answer and its records (a view), unknown
    fields skipped, the last ``records`` field winning."""
    expected = pb.FetchResponse()
    for resp, records in parts:
        full = pb.FetchPartitionResponse()
        full.CopyFrom(resp)
        full.records = records
        expected.partitions.append(full)
    data = expected.SerializeToString()
    for number, payload in extra:  # unknown fields, at the top level
        data += _varint(number << 3 | 2) + _varint(len(payload)) + payload
    got = decode_fetch_response(data)
    assert len(got) == len(expected.partitions)
    for (resp, records), want in zip(got, expected.partitions, strict=True):
        assert isinstance(records, memoryview) and (not records or records.obj is data)
        assert resp.records == b""
        assert bytes(records) == want.records
        resp.records = bytes(records)
        assert resp == want
    if parts:  # one more partition whose entry has two records fields: the last one counts
        last = pb.FetchPartitionResponse()
        last.CopyFrom(expected.partitions[-1])
        entry = last.SerializeToString() + _varint(8 << 3 | 2) + _varint(3) + b"new"
        data = expected.SerializeToString() + _varint(1 << 3 | 2) + _varint(len(entry)) + entry
        [*_, (resp, records)] = decode_fetch_response(data)
        assert bytes(records) == pb.FetchResponse.FromString(data).partitions[-1].records == b"new"


@pytest.mark.timeout(60)
def test_broker_fetch_answer_in_wire_form() -> None:
    from logstore.client.admin import Admin
    from logstore.client.producer import Producer
    from logstore.client.results import FetchRequestPartition
    from logstore.client.rpc import BrokerClient

    with EmbeddedBroker() as broker:
        Admin(broker.bootstrap).create_topic("w", 1)
        with Producer(broker.bootstrap, acks=1) as producer:
            for i in range(50):
                producer.send("w", b"v%d" % i, partition=0)
        tp = TopicPartition("w", 0)
        with BrokerClient(broker.bootstrap) as client:
            [answer] = client.fetch([FetchRequestPartition(tp, 0, 1 << 20)], max_wait_ms=0)
            assert answer.error is None and answer.records and answer.next_offset == 50
            [missing] = client.fetch([FetchRequestPartition(TopicPartition("nope", 0), 0, 1 << 20)],
                                     max_wait_ms=0)
            assert missing.error is not None and missing.records == b""


@settings(max_examples=300, deadline=None)
@given(st.lists(fetch_parts, max_size=4), st.booleans())
def test_client_reads_fetch_answers_as_protobuf_does(parts: list, by_broker: bool) -> None:
    from logstore.client.error_mapping import error_from_item
    from logstore.client.messages import fetched_partitions

    def err(e):  # type: ignore[no-untyped-def]
        return None if e is None else (type(e), e.message)

    expected = pb.FetchResponse()
    for resp, records in parts:
        full = pb.FetchPartitionResponse()
        full.CopyFrom(resp)
        full.records = records
        expected.partitions.append(full)
    data = (encode_fetch_response([(resp, memoryview(records)) for resp, records in parts]) if by_broker
            else expected.SerializeToString())
    got = fetched_partitions(data)
    assert [(g.topic, g.partition, err(g.error), g.high_watermark, g.last_stable_offset,
             g.log_start_offset, g.schema, bytes(g.records),
             [(a.producer_id, a.first_offset) for a in g.aborted_transactions], g.next_offset)
            for g in got] == [
        (p.topic, p.partition, err(error_from_item(p.error)), p.high_watermark, p.last_stable_offset, p.log_start_offset,
         p.schema, p.records, [(a.producer_id, a.first_offset) for a in p.aborted_transactions],
         p.next_offset)
        for p in expected.partitions]


def test_client_fetch_records_are_views_and_malformed_answers_fail_cleanly() -> None:
    import pyarrow as pa

    from logstore.client.messages import fetched_partitions

    # Records are views of the answer where they sit at an 8-aligned address, else an aligned
    # copy (tests/broker/test_fetch_alignment.py). Our broker pads them into place; protobuf's
    # own serialization (another server) does not, and the topic name's length moves them.
    seen = set()
    for topic in ("t", "tt", "ttt", "tttt", "ttttt", "tttttt", "ttttttt", "tttttttt"):
        data = pb.FetchResponse(partitions=[pb.FetchPartitionResponse(topic=topic, records=b"r" * 100)]
                                ).SerializeToString()
        [got] = fetched_partitions(data)
        at = bytes(data).index(b"r" * 100)
        aligned_in_answer = (pa.py_buffer(data).address + at) % 8 == 0
        assert isinstance(got.records, memoryview) and bytes(got.records) == b"r" * 100
        assert (got.records.obj is data) == aligned_in_answer
        assert pa.py_buffer(got.records).address % 8 == 0
        seen.add(aligned_in_answer)
    assert seen == {True, False}  # both cases happened
    for bad in (data[:-1], b"\x0a\x05\x0a\x03ab", b"\x0b"):
        with pytest.raises(Exception) as info:
            fetched_partitions(bad)
        assert isinstance(info.value, ValueError) or type(info.value).__name__ == "DecodeError"
