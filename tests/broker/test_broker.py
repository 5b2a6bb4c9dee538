"""The broker over its raw gRPC surface: validation of untrusted input, long polls,
offsets, retention, restarts (graceful and SIGKILL). Clients are tested elsewhere;
these tests speak the protocol directly so that malformed requests can be sent.
"""

from __future__ import annotations

import os
import random
import struct
import threading
import time
from collections.abc import Iterator

import grpc
import numpy as np
import pyarrow as pa
import pytest
from broker_helpers import SCHEMA, create, fetch_values, produce, records, stub_for

from logstore._proto import logstore_pb2 as pb
from logstore._proto import logstore_pb2_grpc as pb_grpc
from logstore.broker.embedded import EmbeddedBroker
from logstore.errors import WIRE_CODE_KEY
from logstore.record import (
    build_batch,
    decode_schema,
    encode_batch,
    encode_schema,
    typed_schema,
)


@pytest.fixture(scope="module")
def broker() -> Iterator[EmbeddedBroker]:
    with EmbeddedBroker(overrides={"retention_check_interval_ms": 100}) as b:
        yield b


@pytest.fixture(scope="module")
def stub(broker: EmbeddedBroker) -> pb_grpc.LogstoreStub:
    return stub_for(broker)


def _topic(prefix: str) -> str:
    return f"{prefix}-{random.randrange(1 << 30)}"


@pytest.mark.timeout(60)
def test_produce_fetch_round_trip_keeps_bytes_and_offsets(stub: pb_grpc.LogstoreStub) -> None:
    t = _topic("rt")
    assert not create(stub, t, 3).code
    r1 = produce(stub, t, 1, records([b"a", b"b", b"c"]))
    r2 = produce(stub, t, 1, records([b"d"], compression="zstd"))
    assert not r1.error.code and list(r1.base_offsets) == [0]
    assert list(r2.base_offsets) == [3]
    assert fetch_values(stub, t, 1) == [(0, b"a"), (1, b"b"), (2, b"c"), (3, b"d")]
    assert fetch_values(stub, t, 1, offset=2) == [(2, b"c"), (3, b"d")]
    assert fetch_values(stub, t, 0) == []


@pytest.mark.timeout(60)
def test_malformed_produce_gets_clear_errors_and_broker_keeps_serving(stub: pb_grpc.LogstoreStub) -> None:
    t = _topic("bad")
    assert not create(stub, t, 1, **{"max.message.bytes": "100000"}).code
    good = records([b"x"])
    schema_len = len(encode_schema(SCHEMA))
    flipped = bytearray(good)
    flipped[-3] ^= 0xFF
    other_schema = typed_schema(pa.schema([("n", pa.int64())]))
    wrong = build_batch(other_schema, values=pa.array([{"n": 1}], other_schema.field("value").type),
                        timestamps_ms=[1])
    cases = {
        "garbage": (b"\x00garbage" * 10, "CORRUPT_MESSAGE"),
        "empty": (b"", "CORRUPT_MESSAGE"),
        "schema only": (encode_schema(SCHEMA), "CORRUPT_MESSAGE"),
        "truncated batch": (good[:-5], "CORRUPT_MESSAGE"),
        "crc mismatch": (bytes(flipped), "CORRUPT_MESSAGE"),
        "trailing garbage": (good + b"\xff\xff\xff\xff\x08\x00\x00\x00junkjunk", "CORRUPT_MESSAGE"),
        "wrong schema": (encode_schema(other_schema) + encode_batch(wrong, base_offset=0).to_bytes(),
                         "SCHEMA_MISMATCH"),
        "huge batch": (records([os.urandom(1000) for _ in range(200)]), "MESSAGE_TOO_LARGE"),
        "metadata lies": (good[:schema_len] + struct.pack("<Ii", 0xFFFFFFFF, 1 << 20) + b"\x00" * 64,
                          "CORRUPT_MESSAGE"),
    }
    for name, (data, code) in cases.items():
        resp = produce(stub, t, 0, data)
        assert resp.error.code == code, (name, resp.error)
        assert resp.error.message and "Traceback" not in resp.error.message, name
    # Nothing of the above was written; the partition is healthy.
    assert fetch_values(stub, t, 0) == []
    assert list(produce(stub, t, 0, good).base_offsets) == [0]
    assert fetch_values(stub, t, 0) == [(0, b"x")]


@pytest.mark.timeout(60)
def test_decompression_bomb_is_refused_before_inflating() -> None:
    with EmbeddedBroker(overrides={"max_decompressed_bytes": 1 << 20}) as b:
        stub = stub_for(b)
        assert not create(stub, "bomb").code
        bomb = records([b"\x00" * 100_000 for _ in range(50)], compression="zstd")
        assert len(bomb) < 100_000  # small on the wire ...
        resp = produce(stub, "bomb", 0, bomb)  # ... 5 MB once inflated
        assert resp.error.code == "MESSAGE_TOO_LARGE"
        assert "decompress" in resp.error.message


@pytest.mark.timeout(60)
def test_request_level_errors_carry_codes(stub: pb_grpc.LogstoreStub) -> None:
    with pytest.raises(grpc.RpcError) as info:
        stub.Produce(pb.ProduceRequest(acks=5), timeout=10)
    assert info.value.code() == grpc.StatusCode.INVALID_ARGUMENT
    assert dict(info.value.trailing_metadata())[WIRE_CODE_KEY] == "INVALID_REQUEST"


@pytest.mark.timeout(60)
def test_bad_topic_names_and_counts(stub: pb_grpc.LogstoreStub) -> None:
    for name in ["", ".", "..", "a/b", "../etc", "x" * 250, "sp ace", "ünï"]:
        assert create(stub, name).code == "INVALID_TOPIC", name
    assert create(stub, _topic("neg"), -1).code == "INVALID_PARTITIONS"
    assert create(stub, _topic("cfg"), 1, **{"retention.ms": "soon"}).code == "INVALID_CONFIG"
    assert create(stub, _topic("cfg"), 1, **{"no.such.key": "1"}).code == "INVALID_CONFIG"
    t = _topic("dup")
    assert not create(stub, t).code
    assert create(stub, t).code == "TOPIC_ALREADY_EXISTS"
    # No directory escaped the data dir.
    assert not os.path.exists("/etc-0")


@pytest.mark.timeout(60)
def test_fetch_errors_for_negative_and_out_of_range_offsets(stub: pb_grpc.LogstoreStub) -> None:
    t = _topic("oor")
    assert not create(stub, t).code
    produce(stub, t, 0, records([b"a", b"b"]))
    for offset in (-1, -5, 3, 1 << 40):
        resp = stub.Fetch(pb.FetchRequest(max_wait_ms=0, partitions=[
            pb.FetchPartition(topic=t, partition=0, fetch_offset=offset)]), timeout=10)
        assert resp.partitions[0].error.code == "OFFSET_OUT_OF_RANGE", offset
        assert "log end offset 2" in resp.partitions[0].error.message
        # The answer still tells the client where the log is, so it can reset.
        assert (resp.partitions[0].log_start_offset, resp.partitions[0].high_watermark) == (0, 2)
    resp = stub.Fetch(pb.FetchRequest(max_wait_ms=0, partitions=[
        pb.FetchPartition(topic="no-such-topic", partition=0, fetch_offset=0)]), timeout=10)
    assert resp.partitions[0].error.code == "UNKNOWN_TOPIC_OR_PARTITION"


@pytest.mark.timeout(60)
def test_long_poll_wakes_on_new_data_and_times_out_without(stub: pb_grpc.LogstoreStub) -> None:
    t = _topic("poll")
    assert not create(stub, t).code
    start = time.monotonic()
    resp = stub.Fetch(pb.FetchRequest(max_wait_ms=400, min_bytes=1, partitions=[
        pb.FetchPartition(topic=t, partition=0, fetch_offset=0)]), timeout=10)
    waited = time.monotonic() - start
    assert not resp.partitions[0].records
    assert 0.35 <= waited < 5

    def later() -> None:
        time.sleep(0.3)
        produce(stub, t, 0, records([b"late"]), acks=1)

    threading.Thread(target=later, daemon=True).start()
    start = time.monotonic()
    resp = stub.Fetch(pb.FetchRequest(max_wait_ms=20_000, min_bytes=1, partitions=[
        pb.FetchPartition(topic=t, partition=0, fetch_offset=0)]), timeout=30)
    waited = time.monotonic() - start
    assert resp.partitions[0].records, "the long poll returned without the new data"
    assert 0.25 <= waited < 5, f"long poll took {waited:.2f}s; it should wake when data arrives"


@pytest.mark.timeout(60)
def test_list_offsets_earliest_latest_and_by_timestamp(stub: pb_grpc.LogstoreStub) -> None:
    t = _topic("lo")
    assert not create(stub, t).code
    produce(stub, t, 0, records([b"a", b"b", b"c"], ts=10_000))  # ts 10000..10002
    produce(stub, t, 0, records([b"d", b"e"], ts=20_000))  # ts 20000, 20001

    def lookup(ts: int) -> int:
        resp = stub.ListOffsets(pb.ListOffsetsRequest(partitions=[
            pb.ListOffsetsPartition(topic=t, partition=0, timestamp=ts)]), timeout=10)
        assert not resp.partitions[0].error.code
        found = resp.partitions[0]
        if ts >= 0:
            # The answer carries the found record's own timestamp (records 0..4 have 10000..10002, 20000, 20001).
            stamps = [10_000, 10_001, 10_002, 20_000, 20_001]
            assert found.timestamp == (stamps[found.offset] if found.offset >= 0 else -1), (ts, found)
        return found.offset

    assert lookup(-2) == 0
    assert lookup(-1) == 5
    assert lookup(0) == 0
    assert lookup(10_001) == 1
    assert lookup(10_003) == 3
    assert lookup(20_001) == 4
    assert lookup(20_002) == -1
    resp = stub.ListOffsets(pb.ListOffsetsRequest(partitions=[
        pb.ListOffsetsPartition(topic=t, partition=0, timestamp=-7)]), timeout=10)
    assert resp.partitions[0].error.code == "INVALID_REQUEST"


@pytest.mark.timeout(60)
def test_retention_is_visible_through_metadata_and_fetch(stub: pb_grpc.LogstoreStub) -> None:
    t = _topic("ret")
    assert not create(stub, t, 1, **{"segment.bytes": "2048", "retention.bytes": "3000"}).code
    for i in range(10):
        produce(stub, t, 0, records([os.urandom(300) for _ in range(3)], ts=1_000 + i))
    # Retention runs every 100 ms, possibly mid-production too: wait until it has advanced
    # the log start offset and then left it alone for 0.5 s (several passes), so the fetch
    # below reads the final log start.
    deadline = time.monotonic() + 20
    start, stable_since = 0, time.monotonic()
    while time.monotonic() < deadline:
        meta = stub.Metadata(pb.MetadataRequest(topics=[t]), timeout=10).topics[0].partitions[0]
        if meta.log_start_offset != start:
            start, stable_since = meta.log_start_offset, time.monotonic()
        elif start > 0 and time.monotonic() - stable_since >= 0.5:
            break
        time.sleep(0.05)
    assert start > 0, "retention never advanced the log start offset"
    assert meta.log_end_offset == 30
    resp = stub.Fetch(pb.FetchRequest(max_wait_ms=0, partitions=[
        pb.FetchPartition(topic=t, partition=0, fetch_offset=0)]), timeout=10)
    assert resp.partitions[0].error.code == "OFFSET_OUT_OF_RANGE"
    assert [o for o, _ in fetch_values(stub, t, 0, offset=start)] == list(range(start, 30))


@pytest.mark.timeout(60)
def test_delete_records_and_configs(stub: pb_grpc.LogstoreStub) -> None:
    t = _topic("cfg")
    assert not create(stub, t, 2, **{"retention.ms": "1234"}).code
    produce(stub, t, 0, records([b"a", b"b", b"c"]))
    resp = stub.DeleteRecords(pb.DeleteRecordsRequest(partitions=[
        pb.DeleteRecordsPartition(topic=t, partition=0, offset=2)]), timeout=10)
    assert resp.partitions[0].low_watermark == 2
    assert fetch_values(stub, t, 0, offset=2) == [(2, b"c")]
    configs = stub.DescribeConfigs(pb.DescribeConfigsRequest(topics=[t]), timeout=10).results[0].configs
    assert configs["retention.ms"] == "1234" and configs["cleanup.policy"] == "delete"
    alt = stub.AlterConfigs(pb.AlterConfigsRequest(alterations=[
        pb.AlterConfigsRequest.Alteration(topic=t, set={"retention.ms": "99"})]), timeout=10)
    assert not alt.results[0].error.code
    bad = stub.AlterConfigs(pb.AlterConfigsRequest(alterations=[
        pb.AlterConfigsRequest.Alteration(topic=t, set={"retention.ms": "-7"})]), timeout=10)
    assert bad.results[0].error.code == "INVALID_CONFIG"
    configs = stub.DescribeConfigs(pb.DescribeConfigsRequest(topics=[t]), timeout=10).results[0].configs
    assert configs["retention.ms"] == "99"


@pytest.mark.timeout(120)
def test_topics_configs_and_schemas_survive_graceful_restart(tmp_path) -> None:  # type: ignore[no-untyped-def]
    with EmbeddedBroker(str(tmp_path)) as b:
        stub = stub_for(b)
        value_schema = pa.schema([("id", pa.int64()), ("name", pa.string())])
        resp = stub.CreateTopics(pb.CreateTopicsRequest(topics=[
            pb.NewTopic(name="typed", partitions=2, value_schema=value_schema.serialize().to_pybytes(),
                        configs={"retention.ms": "5555"})]), timeout=10)
        assert not resp.results[0].error.code
        schema = typed_schema(value_schema)
        batch = build_batch(schema, values=pa.array([{"id": 1, "name": "a"}, {"id": 2, "name": None}],
                                                    schema.field("value").type), timestamps_ms=[1, 2])
        data = encode_schema(schema) + encode_batch(batch, base_offset=0).to_bytes()
        assert list(produce(stub, "typed", 1, data).base_offsets) == [0]
        b.restart()
        assert os.path.exists(tmp_path / "typed-1")
        stub = stub_for(b)
        meta = stub.Metadata(pb.MetadataRequest(topics=["typed"]), timeout=10).topics[0]
        assert meta.typed and len(meta.partitions) == 2
        assert decode_schema(meta.schema)[0].equals(schema, check_metadata=False)
        assert meta.partitions[1].high_watermark == 2
        configs = stub.DescribeConfigs(pb.DescribeConfigsRequest(topics=["typed"]), timeout=10).results[0].configs
        assert configs["retention.ms"] == "5555"
        assert configs["schema"] == "id bigint, name string"
        # Graceful shutdown left clean-shutdown markers that the restart consumed.
        b.stop()
        assert os.path.exists(tmp_path / "typed-0" / "clean-shutdown")


@pytest.mark.timeout(240)
def test_sigkill_loses_no_acks_all_record(tmp_path) -> None:  # type: ignore[no-untyped-def]
    """Kill -9 the broker at random moments while a producer sends with acks=all.

    Every record acknowledged before the kill must be served after restart, at
    its acknowledged offset, byte for byte (DESIGN I6).
    """
    rng = random.Random(1234)
    acked: dict[int, bytes] = {}
    broker = EmbeddedBroker(str(tmp_path), subprocess=True)
    broker.start()
    try:
        stub = stub_for(broker)
        assert not create(stub, "durable").code
        for _round in range(4):
            stop = threading.Event()
            errors: list[BaseException] = []

            def send(stub: pb_grpc.LogstoreStub = stub, stop: threading.Event = stop,
                     errors: list[BaseException] = errors, round_no: int = _round) -> None:
                n = 0
                while not stop.is_set():
                    values = [b"%d-%d-%s" % (round_no, n, os.urandom(8).hex().encode()) for _ in range(rng.randint(1, 20))]
                    n += 1
                    try:
                        resp = produce(stub, "durable", 0, records(values))
                    except grpc.RpcError:
                        return  # the broker died mid-request: not acknowledged
                    except BaseException as e:  # pragma: no cover - surfaced below
                        errors.append(e)
                        return
                    if resp.error.code:
                        errors.append(AssertionError(resp.error))
                        return
                    base = resp.base_offsets[0]
                    for i, v in enumerate(values):
                        acked[base + i] = v

            sender = threading.Thread(target=send, daemon=True)
            before = len(acked)
            sender.start()
            # Let some appends be acknowledged (bounded wait), then kill at a random moment.
            deadline = time.monotonic() + 30
            while len(acked) < before + 20 and time.monotonic() < deadline and not errors:
                time.sleep(0.01)
            time.sleep(rng.uniform(0.0, 0.5))
            broker.kill()
            stop.set()
            sender.join(30)
            assert not sender.is_alive()
            assert not errors, errors
            broker.start()
            stub = stub_for(broker)
            served = dict(fetch_values(stub, "durable", 0))
            missing = [o for o in acked if served.get(o) != acked[o]]
            assert not missing, f"acknowledged offsets lost or changed after SIGKILL: {missing[:10]}"
            offsets = sorted(served)
            assert offsets == list(range(len(offsets))), "offsets must be dense and start at 0"
        assert len(acked) > 50
    finally:
        broker.close()


@pytest.mark.timeout(60)
def test_many_concurrent_long_polls_do_not_block_produce(stub: pb_grpc.LogstoreStub) -> None:
    """100 parked fetches must not starve a produce (no thread per waiting fetch)."""
    t = _topic("many")
    assert not create(stub, t).code
    futures = [
        stub.Fetch.future(pb.FetchRequest(max_wait_ms=10_000, min_bytes=1, partitions=[
            pb.FetchPartition(topic=t, partition=0, fetch_offset=0)]), timeout=30)
        for _ in range(100)
    ]
    time.sleep(0.2)
    start = time.monotonic()
    resp = produce(stub, t, 0, records([b"wake"]), acks=1)
    assert not resp.error.code
    results = [f.result(timeout=20) for f in futures]
    assert time.monotonic() - start < 8
    assert all(r.partitions[0].records for r in results)
    np.testing.assert_equal(len(results), 100)


def test_a_broker_with_an_rpc_left_without_a_handler_does_not_start(tmp_path) -> None:  # type: ignore[no-untyped-def]
    """A composed handler that forgot to list an RPC would leave gRPC's stub to answer
    UNIMPLEMENTED; the broker refuses to start instead."""
    from logstore.broker.config import load_broker_config
    from logstore.broker.service import Broker

    broker = Broker(load_broker_config(None, overrides={"data_dir": str(tmp_path), "port": 0}, env={}))
    broker.cleaning.rpcs = lambda: {}  # type: ignore[method-assign]
    with pytest.raises(RuntimeError, match="without a handler: DescribeCleaning, ReplaceSegments"):
        broker._rpc_implementations()
    broker._io.shutdown()


@pytest.mark.timeout(120)
def test_a_produce_stream_answers_what_it_read_before_a_request_that_does_not_parse(
        broker: EmbeddedBroker, stub: pb_grpc.LogstoreStub) -> None:
    """Found by the RPC fuzzer (issue 24's stream): the stream ended with the parse error while
    an earlier request's answer was still being written, and gRPC failed the call
    (TOO_MANY_OPERATIONS) or left it hanging. Each round: three appends, then bytes that are no
    ProduceRequest; the three are answered, then the stream ends with INVALID_REQUEST."""
    topic = "stream-unparsed"
    assert not create(stub, topic).code
    with grpc.insecure_channel(broker.bootstrap) as channel:
        raw = channel.stream_stream("/logstore.v1.Logstore/ProduceStream", request_serializer=None,
                                    response_deserializer=pb.ProduceResponse.FromString)
        for round_no in range(20):
            good = [pb.ProduceRequest(acks=1, correlation_id=n, partitions=[pb.ProducePartition(
                topic=topic, partition=0, records=records([b"r%d-%d" % (round_no, n)]))]).SerializeToString()
                for n in (1, 2, 3)]
            answers = []
            with pytest.raises(grpc.RpcError) as ended:
                for answer in raw(iter([*good, b"\xff"]), timeout=10):
                    answers.append(answer)
            assert sorted(a.correlation_id for a in answers) == [1, 2, 3], round_no
            assert all(not a.partitions[0].error.code for a in answers), answers
            assert ended.value.code() == grpc.StatusCode.INVALID_ARGUMENT, ended.value
            assert dict(ended.value.trailing_metadata() or ())[WIRE_CODE_KEY] == "INVALID_REQUEST"
