"""Validation of a producer's records before append (:mod:`logstore.storage.validation`),
without a broker; and, through one, that a stream refused for a later batch leaves
nothing of its earlier batches in the log."""

from __future__ import annotations

import os

import pyarrow as pa
import pytest

from logstore.broker.embedded import EmbeddedBroker
from logstore.client.admin import Admin
from logstore.client.results import FetchRequestPartition
from logstore.client.rpc import BrokerClient
from logstore.errors import (
    CorruptRecordError,
    InvalidRequestError,
    RecordTooLargeError,
    SchemaMismatchError,
)
from logstore.record import (
    ATTR_CONTROL,
    ATTR_TRANSACTIONAL,
    build_batch,
    encode_batch,
    encode_schema,
    typed_schema,
    untyped_schema,
)
from logstore.storage.validation import validate_records
from logstore.types import TopicPartition

SCHEMA = untyped_schema()
LIMITS = {"max_message_bytes": 100_000, "max_decompressed_bytes": 1 << 20}


def batch_bytes(values: list[bytes], *, base: int = 0, compression: str | None = None, **header: int) -> bytes:
    batch = build_batch(SCHEMA, values=values, timestamps_ms=[1_000 + i for i in range(len(values))])
    return encode_batch(batch, base_offset=base, compression=compression, **header).to_bytes()


def validate(data: bytes, **limits: int):  # type: ignore[no-untyped-def]
    return validate_records(data, log_schema=SCHEMA, where="produce to t-0", **{**LIMITS, **limits})


def test_a_valid_stream_gives_its_schema_and_batches_in_order() -> None:
    data = encode_schema(SCHEMA) + batch_bytes([b"a", b"b"]) + batch_bytes([b"c"], base=2)
    valid = validate(data)
    assert valid.schema.equals(SCHEMA)
    assert [b.to_pydict()["value"] for _, b in valid.batches] == [[b"a", b"b"], [b"c"]]
    assert [s.header.record_count for s, _ in valid.batches] == [2, 1]


def test_each_check_refuses_with_its_error() -> None:
    good = encode_schema(SCHEMA) + batch_bytes([b"x"])
    flipped = bytearray(good)
    flipped[-3] ^= 0xFF
    other = typed_schema(pa.schema([("n", pa.int64())]))
    wrong = build_batch(other, values=pa.array([{"n": 1}], other.field("value").type), timestamps_ms=[1])
    cases = {
        "empty": (b"", CorruptRecordError),
        "schema only": (encode_schema(SCHEMA), CorruptRecordError),
        "truncated batch": (good[:-5], CorruptRecordError),
        "crc mismatch": (bytes(flipped), CorruptRecordError),
        "wrong schema": (encode_schema(other) + encode_batch(wrong, base_offset=0).to_bytes(),
                         SchemaMismatchError),
        "huge batch": (encode_schema(SCHEMA) + batch_bytes([os.urandom(1000) for _ in range(200)]),
                       RecordTooLargeError),
        "control batch": (encode_schema(SCHEMA) + batch_bytes([b"x"], attributes=ATTR_CONTROL),
                          InvalidRequestError),
        "transactional without producer id": (
            encode_schema(SCHEMA) + batch_bytes([b"x"], attributes=ATTR_TRANSACTIONAL), InvalidRequestError),
    }
    for name, (data, error) in cases.items():
        with pytest.raises(error) as info:
            validate(data)
        assert info.value.message, name


def test_decompressed_size_is_summed_before_inflating() -> None:
    bomb = encode_schema(SCHEMA) + batch_bytes([b"\0" * 100_000 for _ in range(20)], compression="zstd")
    assert len(bomb) < 100_000
    with pytest.raises(RecordTooLargeError, match="decompress"):
        validate(bomb)
    assert len(validate(bomb, max_decompressed_bytes=4 << 20).batches) == 1


def test_a_bad_later_batch_refuses_the_whole_stream() -> None:
    data = encode_schema(SCHEMA) + batch_bytes([b"ok"]) + batch_bytes([b"x"], base=1, attributes=ATTR_CONTROL)
    with pytest.raises(InvalidRequestError, match="control batches"):
        validate(data)


@pytest.mark.timeout(60)
def test_broker_writes_nothing_of_a_stream_with_a_control_batch() -> None:
    data = encode_schema(SCHEMA) + batch_bytes([b"ok"]) + batch_bytes([b"x"], base=1, attributes=ATTR_CONTROL)
    tp = TopicPartition("v", 0)
    with EmbeddedBroker() as broker, BrokerClient(broker.bootstrap) as client:
        Admin(broker.bootstrap).create_topic("v", 1)
        [answer] = client.produce([(tp, data)], acks=-1)
        assert isinstance(answer.error, InvalidRequestError)
        [fetched] = client.fetch([FetchRequestPartition(tp, 0, 1 << 20)], max_wait_ms=0)
        assert fetched.error is None and fetched.high_watermark == 0 and not fetched.records
