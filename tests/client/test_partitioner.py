"""Tests for logstore.client.partitioner: Kafka-compatible murmur2, keyed and sticky partitioning."""

from __future__ import annotations

import random
import threading

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from logstore.client.partitioner import (
    StickyPartitioner,
    murmur2,
    partition_for_key,
    to_positive,
)

INT32_MIN = -(2**31)
INT32_MAX = 2**31 - 1

# ---------------------------------------------------------------------------
# Reference vectors (copied from the sources named; not computed here)
# ---------------------------------------------------------------------------

# Kafka's own murmur2 vectors, copied verbatim from UtilsTest.testMurmur2 in
# repo apache/kafka, path clients/src/test/java/org/apache/kafka/common/utils/UtilsTest.java
# (read at commit f55581dc73953c3509a4702433aeeeddc2970779).
KAFKA_MURMUR2_VECTORS: dict[bytes, int] = {
    b"21": -973932308,
    b"foobar": -790332482,
    b"a-little-bit-long-string": -985981536,
    b"a-little-bit-longer-string": -1486304829,
    b"lkjh234lh9fiuh90y23oiuhsafujhadof229phr9h19h89h8": -58897971,
    b"abc": 479470107,
}

# The Kafka table has no 0- or 1-byte tail. librdkafka checks its rd_murmur2
# against Java's output in unittest_murmur2, so we use its table as well:
# repo confluentinc/librdkafka, path src/rdmurmur2.c, `java_murmur2_results`
# (read at commit 6cbbd2f7aee9cad3be4aea2c169f12b5b3d787b0). The values are
# the C test's 32-bit hex patterns; `_as_int32` turns them into Java ints.
# The C "unaligned + i" keys are written out here as the suffixes they point at.
LIBRDKAFKA_MURMUR2_VECTORS: dict[bytes, int] = {
    b"kafka": 0xD067CF64,
    b"giberish123456789": 0x8F552B0C,
    b"1234": 0x9FC97B14,
    b"234": 0xE7C009CA,
    b"34": 0x873930DA,
    b"4": 0x5A4B5CA1,
    b"PreAmbleWillBeRemoved,ThePrePartThatIs": 0x78424F1C,
    b"reAmbleWillBeRemoved,ThePrePartThatIs": 0x4A62B377,
    b"eAmbleWillBeRemoved,ThePrePartThatIs": 0xE0E4E09E,
    b"AmbleWillBeRemoved,ThePrePartThatIs": 0x62B8B43F,
    b"": 0x106E08D9,
}

# Partitions out of 1000 for the Java producer's default partitioner, from
# test_murmur2_java_compatibility in repo dpkp/kafka-python, path
# test/producer/test_partitioner.py ("compare with output from Kafka's
# org.apache.kafka.clients.producer.Partitioner").
KAFKA_PYTHON_PARTITIONS_OF_1000: dict[bytes, int] = {
    b"": 681,
    b"a": 524,
    b"ab": 434,
    b"abc": 107,
    b"123456789": 566,
    b"\x00 ": 742,
}

# to_positive(h) % n, worked out by hand from KAFKA_MURMUR2_VECTORS
# (h & 0x7fffffff, then % n). For example "21": -973932308 & 0x7fffffff
# = 1173551340. Every Kafka hash except "abc" is negative, so using abs()
# instead of to_positive() gives different answers (abs(-973932308) % 10 = 8,
# not 0).
DERIVED_PARTITIONS: dict[bytes, dict[int, int]] = {
    b"21": {1: 0, 2: 0, 3: 0, 7: 3, 10: 0, 12: 0, 100: 40, 1000: 340},
    b"foobar": {1: 0, 2: 0, 3: 0, 7: 0, 10: 6, 12: 6, 100: 66, 1000: 166},
    b"a-little-bit-long-string": {1: 0, 2: 0, 3: 2, 7: 1, 10: 2, 12: 8, 100: 12, 1000: 112},
    b"a-little-bit-longer-string": {1: 0, 2: 1, 3: 2, 7: 0, 10: 9, 12: 11, 100: 19, 1000: 819},
    b"lkjh234lh9fiuh90y23oiuhsafujhadof229phr9h19h89h8": {
        1: 0, 2: 1, 3: 2, 7: 3, 10: 7, 12: 5, 100: 77, 1000: 677,
    },
    b"abc": {1: 0, 2: 1, 3: 0, 7: 4, 10: 7, 12: 3, 100: 7, 1000: 107},
}  # fmt: skip


def _as_int32(u: int) -> int:
    """Read a 32-bit pattern as a signed Java int."""
    return u - 2**32 if u >= 2**31 else u


def _java_murmur2_reference(data: bytes) -> int:
    """Slow line-by-line copy of Kafka's Java Utils.murmur2 with Java int overflow.

    This is the oracle for property tests. It reads bytes one at a time, unlike
    the block/struct code under test. It is checked against the published
    vectors below.
    """

    def i32(x: int) -> int:
        return _as_int32(x & 0xFFFFFFFF)

    def ushr(x: int, s: int) -> int:  # Java's >>>
        return (x & 0xFFFFFFFF) >> s

    length = len(data)
    m = 0x5BD1E995
    r = 24
    h = i32(0x9747B28C ^ length)
    for i in range(length // 4):
        i4 = i * 4
        k = i32(data[i4] + (data[i4 + 1] << 8) + (data[i4 + 2] << 16) + (data[i4 + 3] << 24))
        k = i32(k * m)
        k = i32(k ^ ushr(k, r))
        k = i32(k * m)
        h = i32(h * m)
        h = i32(h ^ k)
    rem = length % 4
    base = length & ~3
    if rem >= 3:
        h = i32(h ^ (data[base + 2] << 16))
    if rem >= 2:
        h = i32(h ^ (data[base + 1] << 8))
    if rem >= 1:
        h = i32(h ^ data[base])
        h = i32(h * m)
    h = i32(h ^ ushr(h, 13))
    h = i32(h * m)
    h = i32(h ^ ushr(h, 15))
    return h


# ---------------------------------------------------------------------------
# murmur2
# ---------------------------------------------------------------------------


@pytest.mark.parametrize(("data", "expected"), sorted(KAFKA_MURMUR2_VECTORS.items()))
def test_murmur2_matches_kafka_utils_test_vectors(data: bytes, expected: int) -> None:
    assert murmur2(data) == expected


@pytest.mark.parametrize(("data", "expected_u32"), sorted(LIBRDKAFKA_MURMUR2_VECTORS.items()))
def test_murmur2_matches_librdkafka_java_vectors(data: bytes, expected_u32: int) -> None:
    assert murmur2(data) == _as_int32(expected_u32)


def test_murmur2_accepts_bytearray_and_memoryview() -> None:
    for data, expected in KAFKA_MURMUR2_VECTORS.items():
        assert murmur2(bytearray(data)) == expected
        assert murmur2(memoryview(data)) == expected


def test_reference_oracle_matches_published_vectors() -> None:
    # The oracle used by the property test must itself agree with Kafka.
    for data, expected in KAFKA_MURMUR2_VECTORS.items():
        assert _java_murmur2_reference(data) == expected
    for data, expected_u32 in LIBRDKAFKA_MURMUR2_VECTORS.items():
        assert _java_murmur2_reference(data) == _as_int32(expected_u32)


@given(st.binary(max_size=200))
def test_murmur2_matches_java_reference_and_is_signed_int32(data: bytes) -> None:
    h = murmur2(data)
    assert INT32_MIN <= h <= INT32_MAX
    assert h == _java_murmur2_reference(data)


def test_murmur2_uses_unsigned_bytes_for_high_bytes() -> None:
    # Bytes >= 0x80 are negative in Java and need `& 0xff`; compare with the oracle
    # for every tail length, plus whole blocks.
    for n in range(0, 9):
        data = bytes(range(0xF8, 0xF8 + n))
        assert murmur2(data) == _java_murmur2_reference(data)


# ---------------------------------------------------------------------------
# to_positive
# ---------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("n", "expected"),
    [
        (0, 0),
        (5, 5),
        (INT32_MAX, INT32_MAX),
        (-1, INT32_MAX),
        (-10, 2147483638),
        (INT32_MIN, 0),
        (-973932308, 1173551340),  # Kafka's murmur2("21")
        (-58897971, 2088585677),
    ],
)
def test_to_positive(n: int, expected: int) -> None:
    assert to_positive(n) == expected


@given(st.integers(min_value=INT32_MIN, max_value=INT32_MAX))
def test_to_positive_clears_sign_bit(n: int) -> None:
    result = to_positive(n)
    assert 0 <= result <= INT32_MAX
    assert result == (n if n >= 0 else n + 2**31)


# ---------------------------------------------------------------------------
# partition_for_key
# ---------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("key", "num_partitions", "expected"),
    [(k, n, p) for k, table in DERIVED_PARTITIONS.items() for n, p in table.items()],
)
def test_partition_for_key_derived_from_kafka_vectors(
    key: bytes, num_partitions: int, expected: int
) -> None:
    assert partition_for_key(key, num_partitions) == expected


@pytest.mark.parametrize(("key", "expected"), sorted(KAFKA_PYTHON_PARTITIONS_OF_1000.items()))
def test_partition_for_key_matches_java_producer_partitions(key: bytes, expected: int) -> None:
    assert partition_for_key(key, 1000) == expected


def test_partition_for_key_is_not_abs_based() -> None:
    # abs(-973932308) % 10 == 8; Kafka's toPositive gives 0.
    assert partition_for_key(b"21", 10) == 0


@given(st.binary(max_size=64), st.integers(min_value=1, max_value=10_000))
def test_partition_for_key_in_range_and_deterministic(key: bytes, num_partitions: int) -> None:
    p = partition_for_key(key, num_partitions)
    assert 0 <= p < num_partitions
    assert p == partition_for_key(bytes(key), num_partitions)
    assert p == (_java_murmur2_reference(key) & 0x7FFFFFFF) % num_partitions


@pytest.mark.parametrize("bad", [0, -1, -100])
def test_partition_for_key_rejects_non_positive_partition_count(bad: int) -> None:
    with pytest.raises(ValueError, match="num_partitions must be >= 1"):
        partition_for_key(b"key", bad)


# ---------------------------------------------------------------------------
# StickyPartitioner
# ---------------------------------------------------------------------------


def test_sticky_rng_is_keyword_only() -> None:
    with pytest.raises(TypeError):
        StickyPartitioner(random.Random(1))  # type: ignore[call-arg]


@pytest.mark.parametrize("seed", range(20))
def test_sticky_stays_until_on_new_batch_then_switches(seed: int) -> None:
    sp = StickyPartitioner(rng=random.Random(seed))
    n = 8
    first = sp.partition("t", n)
    assert 0 <= first < n
    assert all(sp.partition("t", n) == first for _ in range(100))

    sp.on_new_batch("t", n, first)
    second = sp.partition("t", n)
    assert 0 <= second < n
    assert second != first
    assert all(sp.partition("t", n) == second for _ in range(100))

    sp.on_new_batch("t", n, second)
    third = sp.partition("t", n)
    assert third != second


def test_sticky_two_partitions_alternate() -> None:
    sp = StickyPartitioner(rng=random.Random(7))
    current = sp.partition("t", 2)
    for _ in range(50):
        sp.on_new_batch("t", 2, current)
        nxt = sp.partition("t", 2)
        assert nxt == 1 - current
        current = nxt


def test_sticky_new_partition_is_random_among_the_others() -> None:
    # Switching away from the same partition many times should reach every other
    # partition (not a fixed next-partition rule) and never the previous one.
    sp = StickyPartitioner(rng=random.Random(1234))
    n = 5
    seen: set[int] = set()
    for _ in range(300):
        prev = sp.partition("t", n)
        sp.on_new_batch("t", n, prev)
        new = sp.partition("t", n)
        assert new != prev
        if prev == 0:
            seen.add(new)
    assert seen == {1, 2, 3, 4}


def test_sticky_single_partition_always_zero() -> None:
    sp = StickyPartitioner(rng=random.Random(0))
    assert sp.partition("t", 1) == 0
    sp.on_new_batch("t", 1, 0)
    assert sp.partition("t", 1) == 0


def test_sticky_stale_on_new_batch_is_ignored() -> None:
    sp = StickyPartitioner(rng=random.Random(3))
    n = 10
    current = sp.partition("t", n)
    stale = (current + 1) % n
    for _ in range(20):
        sp.on_new_batch("t", n, stale)
        assert sp.partition("t", n) == current


def test_sticky_topics_are_independent() -> None:
    sp = StickyPartitioner(rng=random.Random(11))
    a = sp.partition("a", 10)
    b = sp.partition("b", 10)
    sp.on_new_batch("a", 10, a)
    assert sp.partition("a", 10) != a
    assert sp.partition("b", 10) == b


def test_sticky_on_new_batch_before_partition_sets_one() -> None:
    sp = StickyPartitioner(rng=random.Random(5))
    sp.on_new_batch("t", 6, -1)
    p = sp.partition("t", 6)
    assert 0 <= p < 6
    assert sp.partition("t", 6) == p


def test_sticky_repicks_when_partition_count_shrinks() -> None:
    sp = StickyPartitioner(rng=random.Random(0))
    n = 100
    p = sp.partition("t", n)
    while p < 10:  # get a sticky partition that is out of range for n=10
        sp.on_new_batch("t", n, p)
        p = sp.partition("t", n)
    q = sp.partition("t", 10)
    assert 0 <= q < 10
    assert sp.partition("t", 10) == q


def test_sticky_same_seed_same_choices() -> None:
    def run(seed: int) -> list[int]:
        sp = StickyPartitioner(rng=random.Random(seed))
        out = []
        for _ in range(20):
            p = sp.partition("t", 16)
            out.append(p)
            sp.on_new_batch("t", 16, p)
        return out

    assert run(42) == run(42)


@pytest.mark.parametrize("bad", [0, -1])
def test_sticky_rejects_non_positive_partition_count(bad: int) -> None:
    sp = StickyPartitioner()
    with pytest.raises(ValueError, match="num_partitions must be >= 1"):
        sp.partition("t", bad)
    with pytest.raises(ValueError, match="num_partitions must be >= 1"):
        sp.on_new_batch("t", bad, 0)


_ops = st.lists(
    st.tuples(
        st.sampled_from(["partition", "new_batch_current", "new_batch_other"]),
        st.sampled_from(["a", "b"]),
        st.integers(min_value=1, max_value=40),
        st.integers(min_value=-5, max_value=60),
    ),
    max_size=60,
)


@settings(max_examples=200)
@given(seed=st.integers(min_value=0, max_value=2**32 - 1), ops=_ops)
def test_sticky_always_in_range_and_only_moves_on_matching_batch(
    seed: int, ops: list[tuple[str, str, int, int]]
) -> None:
    sp = StickyPartitioner(rng=random.Random(seed))
    for op, topic, n, other in ops:
        before = sp.partition(topic, n)
        assert 0 <= before < n
        if op == "partition":
            assert sp.partition(topic, n) == before
        elif op == "new_batch_current":
            sp.on_new_batch(topic, n, before)
            after = sp.partition(topic, n)
            assert 0 <= after < n
            if n > 1:
                assert after != before
            else:
                assert after == 0
        else:
            sp.on_new_batch(topic, n, other)
            after = sp.partition(topic, n)
            assert 0 <= after < n
            if other != before:
                assert after == before
            elif n > 1:
                assert after != before


def _concurrent_switch(seed: int, n: int, threads_count: int) -> tuple[int, int, set[int]]:
    """Let ``threads_count`` threads call on_new_batch(p0) together, then read.

    Returns (expected partition after one switch, final partition, all partitions
    that the threads read after their on_new_batch call).
    """
    expected = StickyPartitioner(rng=random.Random(seed))
    p0 = expected.partition("t", n)
    expected.on_new_batch("t", n, p0)
    expected_after = expected.partition("t", n)

    sp = StickyPartitioner(rng=random.Random(seed))
    assert sp.partition("t", n) == p0
    barrier = threading.Barrier(threads_count)
    errors: list[BaseException] = []
    seen: list[int] = []

    def worker() -> None:
        try:
            barrier.wait()
            sp.on_new_batch("t", n, p0)
            for _ in range(200):
                seen.append(sp.partition("t", n))
        except BaseException as exc:  # pragma: no cover - reported below
            errors.append(exc)

    threads = [threading.Thread(target=worker) for _ in range(threads_count)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(timeout=10)
    assert not errors
    assert not any(t.is_alive() for t in threads)
    return expected_after, sp.partition("t", n), set(seen)


@pytest.mark.parametrize("seed", range(10))
def test_sticky_concurrent_on_new_batch_switches_once(seed: int) -> None:
    # Many threads report the same full batch at the same moment. As in Kafka,
    # only one switch may happen. The state must then match a single switch by
    # an identically seeded partitioner, and every call must stay in range.
    expected_after, final, seen = _concurrent_switch(seed, n=50, threads_count=16)
    assert final == expected_after
    assert seen == {expected_after}
