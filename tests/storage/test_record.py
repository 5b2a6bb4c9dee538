"""The batch format (logstore.record): encoding, facts, CRC32C, parsing, schema checks."""

from __future__ import annotations

import contextlib
import io
from pathlib import Path

import numpy as np
import pyarrow as pa
import pytest
from storage_helpers import SCHEMA, make_batch, records_of, simple_batch

from logstore.errors import CorruptRecordError, InvalidTimestampError, SchemaMismatchError
from logstore.record import (
    ATTR_CONTROL,
    ATTR_TRANSACTIONAL,
    EncodedBatch,
    build_batch,
    check_schema_evolution,
    decode_schema,
    encode_batch,
    encode_schema,
    is_typed_schema,
    typed_schema,
    untyped_schema,
    value_schema_of,
)
from logstore.record_layout import BROKER_FACTS, CRC_FACT, FACT_FIELDS, FACT_SLICES, FACTS_LENGTH
from logstore.record_reader import IncompleteBatchError, StoredBatch, iter_batches, parse_batch_at

VALUE_SCHEMA = pa.schema([pa.field("id", pa.int64(), nullable=False), pa.field("name", pa.string())])


def stored(batch: pa.RecordBatch, **kw: object) -> StoredBatch:
    encoded = encode_batch(batch, **kw)  # type: ignore[arg-type]
    return parse_batch_at(memoryview(encoded.to_bytes()), 0)


@pytest.mark.parametrize("compression", [None, "lz4", "zstd"])
def test_encode_parse_decode_round_trip(compression: str | None) -> None:
    drafts = [
        (5, b"k0", b"v0", None),
        (3, None, None, [("h", b"x"), ("h2", b"")]),
        (9, b"", b"\x00\xff" * 50, []),
    ]
    encoded = encode_batch(
        make_batch(drafts), base_offset=100, leader_epoch=4, producer_id=77, producer_epoch=2,
        base_sequence=10, attributes=ATTR_TRANSACTIONAL, compression=compression,
    )
    data = encoded.to_bytes()
    assert len(data) == encoded.size
    b = parse_batch_at(memoryview(data), 0, where="test")
    h = b.header
    assert h == encoded.header
    assert (h.base_offset, h.last_offset, h.next_offset, h.record_count) == (100, 102, 103, 3)
    assert (h.max_timestamp, h.leader_epoch, h.producer_id, h.producer_epoch, h.base_sequence) == (
        9, 4, 77, 2, 10,
    )
    assert h.is_transactional and not h.is_control
    assert h.compression == compression
    b.verify_crc()
    assert records_of([b.decode(SCHEMA, validate=True)]) == [
        (100 + i, ts, k, v, hd) for i, (ts, k, v, hd) in enumerate(drafts)
    ]


def test_facts_are_one_fixed_width_string_in_the_custom_metadata() -> None:
    encoded = encode_batch(simple_batch(2), base_offset=7, leader_epoch=3, attributes=ATTR_CONTROL)
    reader = pa.ipc.open_stream(io.BytesIO(encode_schema(SCHEMA) + encoded.to_bytes()))
    batch, custom = reader.read_next_batch_with_custom_metadata()
    assert set(custom) == {b"logstore.batch"}
    facts = custom[b"logstore.batch"].decode()
    assert len(facts) == FACTS_LENGTH
    fields = facts.split(" ")
    assert [len(f) for f in fields] == [width for _, width in FACT_FIELDS]
    assert fields[:5] == ["2", "+0000000000000000007", "+0000000003", "+0000000001", "+0000000002"]
    assert int(fields[9]) == ATTR_CONTROL and int(fields[10]) == encoded.header.crc
    assert batch.column("offset").to_pylist() == [7, 8]


def test_explicit_offsets_with_gaps_keep_next_offset_after_the_last() -> None:
    b = stored(simple_batch(3), base_offset=10, offsets=np.array([10, 15, 20], dtype=np.int64))
    assert (b.header.record_count, b.header.last_offset_delta, b.header.next_offset) == (3, 10, 21)
    assert b.decode(SCHEMA).column("offset").to_pylist() == [10, 15, 20]


@pytest.mark.parametrize("offsets", [[10, 10, 11], [11, 12, 13], [10, 12]])
def test_bad_explicit_offsets_are_rejected(offsets: list[int]) -> None:
    with pytest.raises(ValueError):
        encode_batch(simple_batch(3), base_offset=10, offsets=np.array(offsets, dtype=np.int64))


def test_empty_batch_is_rejected() -> None:
    with pytest.raises(CorruptRecordError):
        encode_batch(simple_batch(1).slice(0, 0), base_offset=0)


@pytest.mark.parametrize("nulls", [[None, 5], [None, None]])
def test_null_timestamps_are_rejected(nulls: list[int | None]) -> None:
    ts = pa.array(nulls, pa.timestamp("ms", tz="UTC"))
    batch = build_batch(SCHEMA, values=[b"a", b"b"], timestamps_ms=ts)
    with pytest.raises(InvalidTimestampError) as info:
        encode_batch(batch, base_offset=0)
    assert "timestamp" in info.value.message


def test_unknown_compression_is_rejected() -> None:
    with pytest.raises(ValueError):
        encode_batch(simple_batch(1), base_offset=0, compression="gzip")


def test_encoding_is_deterministic() -> None:
    # The property tests compare stored bytes with a fresh encoding of the same input.
    for compression in (None, "lz4", "zstd"):
        a = encode_batch(simple_batch(20), base_offset=3, compression=compression).to_bytes()
        b = encode_batch(simple_batch(20), base_offset=3, compression=compression).to_bytes()
        assert a == b


# ----------------------------------------------------------------------------- CRC


def _flip(data: bytes, i: int) -> StoredBatch:
    damaged = bytearray(data)
    damaged[i] ^= 0x01
    return parse_batch_at(memoryview(bytes(damaged)), 0)


def test_crc_covers_every_byte_but_the_leader_epoch_and_its_own_digits() -> None:
    """Flip each byte of a message: verification catches every flip but those in the leader
    epoch and CRC digits (as Kafka's CRC leaves out the partition leader epoch). The base offset
    digits are outside the CRC, but the offsets enter it relative to them, so a damaged base
    offset or offset value is caught too."""
    data = encode_batch(simple_batch(4), base_offset=1000, producer_id=9, base_sequence=3).to_bytes()
    good = parse_batch_at(memoryview(data), 0)
    good.verify_crc()
    f = good.layout().facts_at
    epoch = FACT_SLICES["leader_epoch"]
    uncovered = {*range(f + epoch.start, f + epoch.stop), *range(f + CRC_FACT.start, f + CRC_FACT.stop)}
    for i in range(len(data)):
        try:
            b = _flip(data, i)
        except CorruptRecordError:
            continue  # the flip broke the framing or a fact's digits: caught before the CRC
        if i in uncovered:
            continue
        with pytest.raises(CorruptRecordError) as info:  # a CRC mismatch, or metadata that no longer parses
            b.verify_crc(where="seg")
        assert info.value.code == "CORRUPT_MESSAGE", i
        if i >= b.body_start:
            assert "CRC32C mismatch" in info.value.message, i


def test_a_new_base_offset_patched_in_place_keeps_the_crc() -> None:
    """What the broker does on append: base offset and leader epoch digits, and the offset values."""
    data = encode_batch(simple_batch(3), base_offset=0, producer_id=77).to_bytes()
    b = parse_batch_at(memoryview(data), 0)
    f, (o0, o1) = b.layout().facts_at, b.layout().offsets
    assert o1 - o0 == 3 * 8
    patched = bytearray(data)
    patched[f + BROKER_FACTS.start:f + BROKER_FACTS.stop] = b"+0000000000000001000 +0000000012"
    patched[o0:o1] = np.arange(1000, 1003, dtype="<i8").tobytes()
    p = parse_batch_at(memoryview(bytes(patched)), 0)
    p.verify_crc()
    assert (p.header.base_offset, p.header.leader_epoch, p.header.producer_id) == (1000, 12, 77)
    assert p.decode(SCHEMA).column("offset").to_pylist() == [1000, 1001, 1002]
    # Only the base offset, or only the offsets: caught.
    for half in ((f + BROKER_FACTS.start, f + BROKER_FACTS.start + 20), (o0, o1)):
        once = bytearray(data)
        once[half[0]:half[1]] = patched[half[0]:half[1]]
        with pytest.raises(CorruptRecordError, match="CRC32C mismatch"):
            parse_batch_at(memoryview(bytes(once)), 0).verify_crc()
    # A producer-owned fact is covered: the same kind of edit to the producer id is caught.
    at = data.index(b"+0000000000000000077")
    tampered = data[:at] + b"+0000000000000000078" + data[at + 20:]
    with pytest.raises(CorruptRecordError, match="CRC32C mismatch"):
        parse_batch_at(memoryview(tampered), 0).verify_crc()


# ----------------------------------------------------------------------------- parsing


def test_parse_reports_incomplete_batches_with_the_needed_size() -> None:
    data = encode_batch(simple_batch(3), base_offset=0).to_bytes()
    for cut in (0, 4, 8, 20, len(data) - 1):
        with pytest.raises(IncompleteBatchError) as info:
            parse_batch_at(memoryview(data[:cut]), 0)
        if cut >= 8 + 8:  # the metadata length is known once the prefix is there
            assert info.value.needed in (len(data), parse_batch_at(memoryview(data), 0).body_start)


def test_parse_rejects_garbage() -> None:
    with pytest.raises(CorruptRecordError) as info:
        parse_batch_at(memoryview(b"\x00" * 64), 0, where="f.arrow")
    assert "f.arrow" in info.value.message
    assert not isinstance(info.value, IncompleteBatchError)
    # A schema message where a batch should be.
    with pytest.raises(CorruptRecordError):
        parse_batch_at(memoryview(encode_schema(SCHEMA)), 0)


def test_iter_batches_reports_file_positions() -> None:
    a = encode_batch(simple_batch(2), base_offset=0).to_bytes()
    b = encode_batch(simple_batch(3), base_offset=2).to_bytes()
    got = list(iter_batches(memoryview(a + b), base_position=1000))
    assert [(x.position, x.header.base_offset) for x in got] == [(1000, 0), (1000 + len(a), 2)]
    with pytest.raises(IncompleteBatchError):
        list(iter_batches(memoryview(a + b[:-1])))


def test_schema_message_round_trip_and_damage() -> None:
    head = encode_schema(SCHEMA)
    schema, size = decode_schema(head + b"rest")
    assert size == len(head)
    assert schema.equals(SCHEMA)
    for bad in (b"", head[:6], b"\x00" * 16, head[: len(head) // 2]):
        with pytest.raises(CorruptRecordError):
            decode_schema(bad, where="x.arrow")
    other = pa.schema([pa.field("a", pa.int32())])
    with pytest.raises(SchemaMismatchError):
        decode_schema(encode_schema(other))


# ----------------------------------------------------------------------------- schemas


def test_typed_schema_shape() -> None:
    s = typed_schema(VALUE_SCHEMA)
    assert s.names == ["offset", "timestamp", "key", "value", "headers"]
    assert is_typed_schema(s) and not is_typed_schema(untyped_schema())
    assert value_schema_of(s).equals(VALUE_SCHEMA)
    assert value_schema_of(untyped_schema()) is None
    with pytest.raises(SchemaMismatchError):
        typed_schema(pa.schema([]))
    with pytest.raises(SchemaMismatchError):
        typed_schema(pa.schema([pa.field("a", pa.int8()), pa.field("a", pa.int8())]))


def evolve(*fields: pa.Field) -> pa.Schema:
    return typed_schema(pa.schema(list(fields)))


ID, NAME = VALUE_SCHEMA.field("id"), VALUE_SCHEMA.field("name")


def test_schema_evolution_rules() -> None:
    current = typed_schema(VALUE_SCHEMA)
    assert check_schema_evolution(current, typed_schema(VALUE_SCHEMA)) is False
    assert check_schema_evolution(current, evolve(ID, NAME, pa.field("extra", pa.float64()))) is True
    rejected = {
        "removed": evolve(ID),
        "retyped": evolve(ID, pa.field("name", pa.large_string())),
        "renamed": evolve(ID, pa.field("label", pa.string())),
        "reordered": evolve(NAME, ID),
        "not nullable": evolve(ID, NAME, pa.field("extra", pa.int8(), nullable=False)),
        "inserted": evolve(ID, pa.field("extra", pa.int8()), NAME),
        "untyped": untyped_schema(),
    }
    for why, proposed in rejected.items():
        with pytest.raises(SchemaMismatchError) as info:
            check_schema_evolution(current, proposed)
        assert info.value.code == "SCHEMA_MISMATCH", why
    # Fixed columns may not change either.
    wrong_key = pa.schema([f if f.name != "key" else pa.field("key", pa.string()) for f in current])
    with pytest.raises(SchemaMismatchError, match="'key'"):
        check_schema_evolution(current, wrong_key)
    missing = pa.schema([f for f in current if f.name != "headers"])
    with pytest.raises(SchemaMismatchError):
        check_schema_evolution(current, missing)
    # An untyped topic does not accept a typed value.
    with pytest.raises(SchemaMismatchError):
        check_schema_evolution(untyped_schema(), current)


@pytest.mark.parametrize(
    ("column", "field"),
    [
        ("offset", pa.field("offset", pa.int64())),  # nullable
        ("offset", pa.field("offset", pa.duration("s"), nullable=False)),
        ("timestamp", pa.field("timestamp", pa.timestamp("s", tz="UTC"), nullable=False)),
        ("timestamp", pa.field("timestamp", pa.timestamp("ms", tz="Etc/GMT+1"), nullable=False)),
        ("key", pa.field("key", pa.large_string())),
        ("value", pa.field("value", pa.large_string())),
        ("headers", pa.field("headers", pa.list_(pa.struct([("key", pa.string()), ("falue", pa.binary())])))),
    ],
)
def test_decode_schema_checks_the_stored_column_types(column: str, field: pa.Field) -> None:
    # A damaged segment schema must not be used to decode its batches.
    schema = pa.schema([field if f.name == column else f for f in SCHEMA])
    with pytest.raises(SchemaMismatchError, match=column):
        decode_schema(encode_schema(schema))
    with pytest.raises(SchemaMismatchError):
        check_schema_evolution(SCHEMA, schema)


def test_decode_schema_turns_every_parse_failure_into_corrupt_message() -> None:
    head = encode_schema(SCHEMA)
    for i in range(len(head)):
        damaged = bytearray(head)
        damaged[i] ^= 0x10
        with contextlib.suppress(CorruptRecordError, SchemaMismatchError):
            decode_schema(bytes(damaged))


def test_encoded_body_pieces_are_zero_copy_views_of_the_batch() -> None:
    values = pa.array([b"x" * 100] * 1000, pa.binary())
    batch = build_batch(SCHEMA, values=values, timestamps_ms=list(range(1000)))
    encoded = encode_batch(batch, base_offset=0)
    data = encoded.to_bytes()
    assert len(data) == encoded.size == len(encoded.head) + encoded.body_size
    assert bytes(encoded.body) == data[len(encoded.head):]
    value_data = values.buffers()[2]
    assert any(
        isinstance(p, pa.Buffer) and p.address == value_data.address for p in encoded.body_pieces
    ), "the value bytes should be written from the batch's own buffer, not a copy"
    parse_batch_at(memoryview(data), 0).verify_crc()


# Format 1, written by the code before the package layout change (commit b63739b): still
# read, with every fact, CRC included (a renamed metadata key once lost the leader epoch).
GOLDEN_V1 = Path(__file__).parent / "golden" / "untyped-batch-v1.arrow"
# Format 2: the stored format must not drift — same bytes for the same input.
GOLDEN_V2 = Path(__file__).parent / "golden" / "untyped-batch-v2.arrow"


def _golden_input() -> tuple[pa.Schema, EncodedBatch]:
    schema = untyped_schema()
    rb = build_batch(schema, values=[b"v0", None, b"value-2"],
                     timestamps_ms=[1_700_000_000_000, 1_700_000_000_001, 1_700_000_000_002],
                     keys=[b"k0", b"k1", None], headers=[[("h", b"x")], [], None])
    return schema, encode_batch(rb, base_offset=42, leader_epoch=7, producer_id=1001, producer_epoch=3,
                                base_sequence=5, attributes=ATTR_TRANSACTIONAL)


def test_golden_batch_is_written_byte_for_byte_as_before() -> None:
    schema, encoded = _golden_input()
    assert encode_schema(schema) + encoded.to_bytes() == GOLDEN_V2.read_bytes()


@pytest.mark.parametrize(("golden", "version"), [(GOLDEN_V1, 1), (GOLDEN_V2, 2)])
def test_golden_batch_reads_back_with_every_fact(golden: Path, version: int) -> None:
    data = memoryview(golden.read_bytes())
    schema, size = decode_schema(data)
    assert schema == untyped_schema()
    (stored,) = list(iter_batches(data, start=size))
    assert stored.version == version
    stored.verify_crc()
    h = stored.header
    assert (h.base_offset, h.record_count, h.leader_epoch) == (42, 3, 7)
    assert (h.producer_id, h.producer_epoch, h.base_sequence) == (1001, 3, 5)
    assert h.is_transactional and not h.is_control
    assert h.max_timestamp == 1_700_000_000_002
    rb = pa.ipc.open_stream(golden.read_bytes()).read_next_batch()
    assert rb.column("offset").to_pylist() == [42, 43, 44]
    assert rb.column("value").to_pylist() == [b"v0", None, b"value-2"]


def test_batches_encoded_on_kept_writers_equal_those_of_a_new_writer() -> None:
    """encode_batch keeps one IPC writer open per schema and compression (per thread): the
    bytes of a batch must not depend on what that writer wrote before, across schemas,
    compressions and threads. (Checked once against the encoder that opened a stream per
    batch: 400 interleaved batches, byte for byte equal.)"""
    import random
    from concurrent.futures import ThreadPoolExecutor

    from logstore import record

    rng = random.Random(7)
    typed = typed_schema(VALUE_SCHEMA)
    cases = []
    for i in range(60):
        n = rng.randint(1, 30)
        if i % 2:
            values = pa.array([{"id": rng.randint(0, 9), "name": "x" * rng.randint(0, 9)} for _ in range(n)],
                              typed.field("value").type)
            schema = typed
        else:
            values, schema = pa.array([bytes(rng.randint(0, 200)) for _ in range(n)], pa.binary()), untyped_schema()
        batch = build_batch(schema, values=values, timestamps_ms=[rng.randint(0, 2**40) for _ in range(n)],
                            keys=[b"k%d" % rng.randint(0, 99) for _ in range(n)], headers=None)
        cases.append((batch, rng.choice([None, "lz4", "zstd"]), rng.randint(0, 10**9)))

    def encode(case: tuple[pa.RecordBatch, str | None, int]) -> bytes:
        return encode_batch(case[0], base_offset=case[2], compression=case[1]).to_bytes()

    def encode_on_a_new_writer(case: tuple[pa.RecordBatch, str | None, int]) -> bytes:
        record._WRITERS.writers = []
        return encode(case)

    kept = [encode(c) for c in cases]
    with ThreadPoolExecutor(4) as pool:
        assert list(pool.map(encode, cases)) == kept
    assert [encode_on_a_new_writer(c) for c in cases] == kept
    for (batch, _, _), data in zip(cases, kept, strict=True):
        ours = parse_batch_at(memoryview(data), 0)
        ours.verify_crc(where="test")
        assert ours.decode(batch.schema).column(3).equals(batch.column(3))
