"""Kafka-compatible record partitioning.

A record with a key always lands on the same partition as it would with the
Java Kafka producer's default partitioner; a record without a key goes to a
"sticky" partition, as in KIP-480.

Keyed records
-------------
``partition_for_key(key, n) == to_positive(murmur2(key)) % n``. This is the
formula Kafka's producer uses for keyed records (``BuiltInPartitioner`` /
the old ``DefaultPartitioner``).

``murmur2(data)`` is a bit-for-bit port of
``org.apache.kafka.common.utils.Utils.murmur2``, which is 32-bit MurmurHash2
with these properties:

* seed ``0x9747b28c``, multiplier ``m = 0x5bd1e995``, shift ``r = 24``;
* ``h = seed ^ len(data)``;
* each whole 4-byte block is read as a little-endian unsigned 32-bit ``k``,
  then ``k *= m; k ^= k >>> r; k *= m; h *= m; h ^= k``;
* the 1-3 trailing bytes are handled as in Java's fall-through ``switch``:
  ``h ^= b[2] << 16`` (if 3 left), ``h ^= b[1] << 8`` (if 2 or more),
  ``h ^= b[0]; h *= m`` (if 1 or more); bytes are unsigned (``& 0xff``);
* final mix: ``h ^= h >>> 13; h *= m; h ^= h >>> 15``;
* every operation wraps modulo 2**32, and the result is returned as a
  *signed* 32-bit integer in ``[-2**31, 2**31)``, the same as Java's ``int``.

``to_positive(n)`` is ``Utils.toPositive``: ``n & 0x7fffffff``. It clears the
sign bit; it is *not* ``abs``. For example, ``to_positive(-1) == 2**31 - 1``
and ``to_positive(-2**31) == 0``. For any ``n`` in the int32 range, the
result is ``n`` if ``n >= 0`` and ``n + 2**31`` otherwise.

Records without a key (sticky partitioning, KIP-480)
-----------------------------------------------------
``StickyPartitioner`` has one current ("sticky") partition per topic and
behaves like Kafka's ``StickyPartitionCache``:

* ``partition(topic, n)`` returns the topic's sticky partition. On first use
  it picks one uniformly at random from ``range(n)``. It picks again the same
  way if the stored one is no longer ``< n``.
* ``on_new_batch(topic, n, previous_partition)`` is called by the producer
  when the batch for ``previous_partition`` fills up or is sent. If
  ``previous_partition`` is the topic's current sticky partition, a new one is
  chosen uniformly at random from the *other* ``n - 1`` partitions when
  ``n > 1``; when ``n == 1`` it stays ``0``. If ``previous_partition`` is not
  the current sticky partition, the call is stale: another caller has already
  moved on. It then does nothing, so that two callbacks for the same full batch
  cause only one switch, as Kafka does. If the topic has no sticky partition
  yet, one is chosen as in ``partition``.

Every partition returned is in ``range(n)``. Both methods are thread-safe: a
single ``threading.Lock`` covers each read-modify-write of the per-topic state
and every draw from the random generator. Pass ``rng=random.Random(seed)`` to
make the choices reproducible, for example in tests. By default a fresh
``random.Random()`` seeded by the OS is used.

Many keys at once (the columnar producer path)
----------------------------------------------
``murmur2_array(keys)`` is ``murmur2`` of every key of an Arrow binary or
string array, computed with numpy on the Arrow buffers (one pass per 4-byte
block of the longest key), and ``partitions_for_keys(keys, n)`` is
``partition_for_key`` of every key, with -1 for null keys. Both equal the
scalar functions key for key (tests check them against Kafka's vectors).

Errors
------
``partition_for_key``, ``partitions_for_keys``, ``StickyPartitioner.partition``
and ``StickyPartitioner.on_new_batch`` raise ``ValueError`` if
``num_partitions < 1``.

The scalar functions and ``StickyPartitioner`` use only the standard library;
the vectorized ones use numpy and pyarrow.
"""

from __future__ import annotations

import random
import struct
import threading

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

__all__ = [
    "StickyPartitioner",
    "murmur2",
    "murmur2_array",
    "partition_for_key",
    "partitions_for_keys",
    "to_positive",
]

_MASK32 = 0xFFFFFFFF
_SIGN_BIT = 0x80000000
_SEED = 0x9747B28C
_M = 0x5BD1E995
_R = 24
_BLOCK = struct.Struct("<I")


def murmur2(data: bytes | bytearray | memoryview) -> int:
    """Return Kafka's ``Utils.murmur2`` of ``data`` as a signed 32-bit int.

    See the module docstring for the exact algorithm. ``bytearray`` and
    byte-format (``"B"``) ``memoryview`` objects are accepted as well as ``bytes``.
    """
    length = len(data)
    tail_len = length & 3
    body_len = length - tail_len
    m = _M
    mask = _MASK32

    h = (_SEED ^ length) & mask
    if body_len:
        for (k,) in _BLOCK.iter_unpack(memoryview(data)[:body_len]):
            k = (k * m) & mask
            k ^= k >> _R
            k = (k * m) & mask
            h = ((h * m) & mask) ^ k

    if tail_len:
        if tail_len == 3:
            h ^= data[body_len + 2] << 16
        if tail_len >= 2:
            h ^= data[body_len + 1] << 8
        h ^= data[body_len]
        h = (h * m) & mask

    h ^= h >> 13
    h = (h * m) & mask
    h ^= h >> 15
    return h - 0x100000000 if h & _SIGN_BIT else h


def to_positive(n: int) -> int:
    """Return Kafka's ``Utils.toPositive(n)``: ``n & 0x7fffffff`` (not ``abs``)."""
    return n & 0x7FFFFFFF


def _check_num_partitions(num_partitions: int) -> None:
    if num_partitions < 1:
        raise ValueError(f"num_partitions must be >= 1, got {num_partitions!r}")


def partition_for_key(key: bytes | bytearray | memoryview, num_partitions: int) -> int:
    """Return the partition of a keyed record, as Kafka's default partitioner does.

    Computes ``to_positive(murmur2(key)) % num_partitions``.

    Raises:
        ValueError: if ``num_partitions < 1``.
    """
    _check_num_partitions(num_partitions)
    return to_positive(murmur2(key)) % num_partitions


_M_U32 = np.uint32(_M)


def murmur2_array(keys: pa.Array | pa.ChunkedArray) -> np.ndarray:
    """Kafka's ``murmur2`` of every key of a binary/string array, as int32 (vectorized).

    Equal to ``[murmur2(k) for k in keys]`` for non-null keys; null keys hash
    like the empty key (callers mask them). Works on the Arrow buffers
    directly: one numpy pass per 4-byte block of the longest key.
    """
    if isinstance(keys, pa.ChunkedArray):
        keys = keys.combine_chunks() if keys.num_chunks != 1 else keys.chunk(0)
    if not (pa.types.is_binary(keys.type) or pa.types.is_large_binary(keys.type)):
        keys = keys.cast(pa.large_binary() if pa.types.is_large_string(keys.type) else pa.binary())
    n = len(keys)
    if n == 0:
        return np.zeros(0, dtype=np.int32)
    offset_type = np.int64 if pa.types.is_large_binary(keys.type) else np.int32
    _, offsets_buf, data_buf = keys.buffers()
    offsets = np.frombuffer(offsets_buf, dtype=offset_type, count=keys.offset + n + 1)[keys.offset:]
    starts = offsets[:-1].astype(np.int64)
    lengths = (offsets[1:] - offsets[:-1]).astype(np.int64)
    if data_buf is None or len(data_buf) == 0:
        data = np.zeros(8, dtype=np.uint8)
    else:
        # Pad so that reads of up to 3 bytes past a key's end stay in bounds.
        raw = np.frombuffer(data_buf, dtype=np.uint8)
        data = np.concatenate([raw, np.zeros(8, dtype=np.uint8)])
    with np.errstate(over="ignore"):
        h = np.uint32(_SEED) ^ lengths.astype(np.uint32)
        nblocks = lengths >> 2
        max_blocks = int(nblocks.max()) if n else 0
        for j in range(max_blocks):
            rows = np.flatnonzero(nblocks > j)
            at = starts[rows] + 4 * j
            k = (
                data[at].astype(np.uint32)
                | (data[at + 1].astype(np.uint32) << np.uint32(8))
                | (data[at + 2].astype(np.uint32) << np.uint32(16))
                | (data[at + 3].astype(np.uint32) << np.uint32(24))
            )
            k = k * _M_U32
            k ^= k >> np.uint32(24)
            k = k * _M_U32
            h[rows] = (h[rows] * _M_U32) ^ k
        tail = lengths & 3
        tail_at = starts + (nblocks << 2)
        t3 = tail == 3
        h[t3] ^= data[tail_at[t3] + 2].astype(np.uint32) << np.uint32(16)
        t2 = tail >= 2
        h[t2] ^= data[tail_at[t2] + 1].astype(np.uint32) << np.uint32(8)
        t1 = tail >= 1
        h[t1] ^= data[tail_at[t1]].astype(np.uint32)
        h[t1] = h[t1] * _M_U32
        h ^= h >> np.uint32(13)
        h = h * _M_U32
        h ^= h >> np.uint32(15)
    return h.view(np.int32)


def partitions_for_keys(keys: pa.Array | pa.ChunkedArray, num_partitions: int) -> np.ndarray:
    """``partition_for_key`` of every key (int32 array; null keys give -1)."""
    _check_num_partitions(num_partitions)
    hashes = murmur2_array(keys)
    parts = ((hashes.astype(np.int64) & 0x7FFFFFFF) % num_partitions).astype(np.int32)
    if keys.null_count:
        valid = np.asarray(pc.is_valid(keys).to_numpy(zero_copy_only=False), dtype=bool)
        parts[~valid] = -1
    return parts


class StickyPartitioner:
    """Sticky partition choice for records without a key (KIP-480).

    Each topic stays on one partition until ``on_new_batch`` is called for that
    partition. It then moves to a different partition chosen at random, if the
    topic has more than one partition. See the module docstring for the exact
    rules.

    Thread-safe: each method holds an internal ``threading.Lock`` while it reads
    or updates the per-topic state and while it draws from ``rng``.
    """

    __slots__ = ("_lock", "_rng", "_sticky")

    def __init__(self, *, rng: random.Random | None = None) -> None:
        self._rng: random.Random = rng if rng is not None else random.Random()
        self._lock = threading.Lock()
        self._sticky: dict[str, int] = {}

    def partition(self, topic: str, num_partitions: int) -> int:
        """Return the sticky partition of ``topic``, choosing one if needed.

        Raises:
            ValueError: if ``num_partitions < 1``.
        """
        _check_num_partitions(num_partitions)
        with self._lock:
            current = self._sticky.get(topic)
            if current is None or current >= num_partitions:
                current = self._pick(num_partitions, avoid=None)
                self._sticky[topic] = current
            return current

    def on_new_batch(self, topic: str, num_partitions: int, previous_partition: int) -> None:
        """Move ``topic`` to a new sticky partition after the batch for ``previous_partition``.

        Nothing happens if ``previous_partition`` is not the topic's current
        sticky partition (a stale callback). If ``num_partitions > 1``, the new
        partition is never ``previous_partition``.

        Raises:
            ValueError: if ``num_partitions < 1``.
        """
        _check_num_partitions(num_partitions)
        with self._lock:
            current = self._sticky.get(topic)
            if current is None or current >= num_partitions:
                self._sticky[topic] = self._pick(num_partitions, avoid=None)
            elif current == previous_partition:
                self._sticky[topic] = self._pick(num_partitions, avoid=current)

    def _pick(self, num_partitions: int, avoid: int | None) -> int:
        """Draw a partition uniformly from ``range(num_partitions)``, minus ``avoid``.

        ``avoid`` is only left out when it is in range and there is another
        partition to choose. The caller must hold ``self._lock``.
        """
        if num_partitions == 1:
            return 0
        if avoid is None or not 0 <= avoid < num_partitions:
            return self._rng.randrange(num_partitions)
        choice = self._rng.randrange(num_partitions - 1)
        return choice + 1 if choice >= avoid else choice
