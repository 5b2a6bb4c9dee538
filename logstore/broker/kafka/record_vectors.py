"""Kafka's records read and written a whole batch at a time, with numpy, instead of one by one.

The records of a RecordBatch v2 body (layout: :mod:`.record_batch`) are a sequence of::

    varint length, int8 attributes, varlong timestamp delta, varint offset delta,
    varint key length (-1: null) + key, varint value length (-1: null) + value,
    varint header count, then the headers

with every varint zigzag-encoded (protobuf's ``sint``). A Python loop over that costs
2-4 µs a record; here only the walk from one record's length to the next is a Python loop
(the lengths chain the records), and every field of every record is then read, checked and
gathered by array operations over the batch, and written the same way on the way out.

Both directions handle records **without headers**, the common case; :func:`read_records`
answers None for a batch in which some record has headers, and :func:`write_records` is
only called for such batches, so the caller's per-record path (:mod:`.record_batch`) serves
the rest. Bytes that are not well-formed records raise
:class:`~logstore.errors.CorruptRecordError`, with the same checks as the per-record path:
lengths within their record, offset deltas 0, 1, 2, ..., each record's fields ending
exactly at its length.

Thread-safety: pure functions.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from logstore.errors import CorruptRecordError

__all__ = ["ReadRecords", "read_records", "write_records"]

_VARINT_MAX_BYTES = 10
_U64 = np.uint64
_INLINE_BYTES = 12  # Arrow's binary view holds a string this short in the view itself
_HEADER_COUNT_0 = pa.scalar(b"\x00", pa.binary())
_NO_SEPARATOR = pa.scalar(b"", pa.binary())


@dataclass(frozen=True, slots=True)
class ReadRecords:
    """The records of one batch body as columns (keys and values null where the length was -1)."""

    timestamp_deltas: np.ndarray
    keys: pa.BinaryArray
    values: pa.BinaryArray


def read_records(body: memoryview, count: int, where: str) -> ReadRecords | None:
    """The ``count`` records of an uncompressed batch body, or None when a record has headers."""
    starts, ends = _record_bounds(body, count, where)
    buf = np.frombuffer(body, dtype=np.uint8)
    # Varints may be read up to 9 bytes past a record's last one, and a short key or value
    # up to 11: pad, then check every position against its record's end before anything
    # is gathered at it.
    padded = np.concatenate([buf, np.zeros(16, np.uint8)])

    def after(pos: np.ndarray) -> np.ndarray:
        if bool((pos > ends).any()):
            raise CorruptRecordError(f"{where}: a record's fields overrun its length")
        return pos

    pos = starts + 1  # the record attributes byte: unused
    ts_deltas, size = _read_varints(padded, after(pos), where)
    pos = after(pos + size)
    offset_deltas, size = _read_varints(padded, pos, where)
    bad = np.flatnonzero(offset_deltas != np.arange(count))
    if len(bad):
        i = int(bad[0])
        raise CorruptRecordError(f"{where}: record {i} has offset delta {int(offset_deltas[i])}; a producer's "
                                 "deltas are 0, 1, 2, ...")
    pos = after(pos + size)
    key_lengths, size = _read_varints(padded, pos, where)
    key_starts = after(pos + size)
    pos = after(key_starts + _lengths(key_lengths, where))
    value_lengths, size = _read_varints(padded, pos, where)
    value_starts = after(pos + size)
    pos = after(value_starts + _lengths(value_lengths, where))
    header_counts, size = _read_varints(padded, pos, where)
    if bool(header_counts.any()):
        return None
    if bool((pos + size != ends).any()):
        i = int(np.flatnonzero(pos + size != ends)[0])
        raise CorruptRecordError(f"{where}: record {i} is {int(ends[i] - starts[i])} bytes long but its fields are not")
    return ReadRecords(ts_deltas, _gather_binary(padded, key_starts, key_lengths),
                       _gather_binary(padded, value_starts, value_lengths))


def write_records(offset_deltas: np.ndarray, timestamp_deltas: np.ndarray, keys: pa.Array,
                  values: pa.Array) -> bytes:
    """Records without headers as a batch body (uncompressed); keys and values are binary arrays.

    Each record's varints before its key, and its value length, are written into small
    per-record strings; Arrow's element-wise join then lays out prefix, key, value length,
    value and a header count of 0 record after record, in C++."""
    key_lengths = _lengths_of(keys)
    value_lengths = _lengths_of(values)
    ts_z, od_z, kl_z, vl_z = (_zigzag(a) for a in (timestamp_deltas, offset_deltas, key_lengths, value_lengths))
    ts_s, od_s, kl_s, vl_s = (_varint_sizes(z) for z in (ts_z, od_z, kl_z, vl_z))
    # attributes + 4 varints + key + value + a header count of 0
    lengths = 2 + ts_s + od_s + kl_s + vl_s + np.maximum(key_lengths, 0) + np.maximum(value_lengths, 0)
    len_z = _zigzag(lengths)
    len_s = _varint_sizes(len_z)
    prefix = _strings([(len_z, len_s), None, (ts_z, ts_s), (od_z, od_s), (kl_z, kl_s)])
    middle = _strings([(vl_z, vl_s)])
    joined = pc.binary_join_element_wise(prefix, keys, middle, values, _HEADER_COUNT_0, _NO_SEPARATOR,
                                         null_handling="replace", null_replacement="")
    first, last = np.frombuffer(joined.buffers()[1], np.int32, count=len(joined) + 1,
                                offset=joined.offset * 4)[[0, -1]]
    return joined.buffers()[2][int(first):int(last)].to_pybytes()


def _record_bounds(body: memoryview, count: int, where: str) -> tuple[np.ndarray, np.ndarray]:
    """Where each record's fields start (after its length) and end: the lengths chain the
    records, so this walk is the one loop over records."""
    data = bytes(body)  # indexing bytes is several times faster than a memoryview
    starts = [0] * count
    ends = [0] * count
    pos, n = 0, len(data)
    try:
        for i in range(count):
            b = data[pos]
            if b < 0x80:
                z, pos = b, pos + 1
            else:
                z, shift, pos = b & 0x7F, 7, pos + 1
                while True:
                    b = data[pos]
                    z |= (b & 0x7F) << shift
                    pos += 1
                    if b < 0x80:
                        break
                    shift += 7
                    if shift >= 7 * 5:
                        raise CorruptRecordError(f"{where}: record {i}'s length is not a varint")
            length = (z >> 1) ^ -(z & 1)
            if length < 0 or pos + length > n:
                raise CorruptRecordError(f"{where}: record {i} length {length} overruns its batch")
            starts[i] = pos
            pos += length
            ends[i] = pos
    except IndexError:
        raise CorruptRecordError(f"{where}: a record does not parse (the batch ends inside one)") from None
    if pos != n:
        raise CorruptRecordError(f"{where}: the records do not fill their batch as its header says")
    return np.array(starts, np.int64), np.array(ends, np.int64)


def _read_varints(padded: np.ndarray, pos: np.ndarray, where: str) -> tuple[np.ndarray, np.ndarray]:
    """The zigzag varint at each position: (values as int64, sizes in bytes)."""
    value = np.zeros(len(pos), _U64)
    size = np.zeros(len(pos), np.int64)
    open_ = np.ones(len(pos), bool)
    for k in range(_VARINT_MAX_BYTES):
        b = padded[pos + k].astype(_U64)
        value |= np.where(open_, (b & _U64(0x7F)) << _U64(7 * k), _U64(0))
        ending = open_ & (b < 0x80)
        size[ending] = k + 1
        open_ &= ~ending
        if not open_.any():
            break
    else:
        raise CorruptRecordError(f"{where}: a record holds a varint longer than {_VARINT_MAX_BYTES} bytes")
    decoded = (value >> _U64(1)).astype(np.int64) ^ -(value & _U64(1)).astype(np.int64)
    return decoded, size


def _lengths(lengths: np.ndarray, where: str) -> np.ndarray:
    """A key or value length as bytes taken (-1, null, takes none); below -1 is corrupt."""
    if bool((lengths < -1).any()):
        raise CorruptRecordError(f"{where}: negative length {int(lengths.min())} in a record")
    return np.maximum(lengths, 0)


def _gather_binary(padded: np.ndarray, starts: np.ndarray, lengths: np.ndarray) -> pa.BinaryArray:
    """The byte strings at ``starts`` (``lengths`` long; -1: null) as a binary array: Arrow
    views into the body (a string of at most 12 bytes is held in its view), which Arrow's
    cast then copies out back to back."""
    n = len(lengths)
    valid = lengths >= 0
    taken = np.where(valid, lengths, 0)
    views = np.zeros((n, 16), np.uint8)
    words = views.view(np.int32)  # per view: length, then prefix or inline bytes, buffer index, offset
    words[:, 0] = taken
    inline = taken <= _INLINE_BYTES
    if inline.any():
        columns = np.arange(_INLINE_BYTES)
        at = starts[inline, None] + columns
        views[inline, 4:] = np.where(columns < taken[inline, None], padded[at], 0)
    outside = ~inline
    if outside.any():
        views[outside, 4:8] = padded[starts[outside, None] + np.arange(4)]
        words[outside, 3] = starts[outside]
    nulls = n - int(valid.sum())
    validity = pa.py_buffer(np.packbits(valid, bitorder="little")) if nulls else None
    array = pa.Array.from_buffers(pa.binary_view(), n, [validity, pa.py_buffer(views), pa.py_buffer(padded)],
                                  null_count=nulls)
    return array.cast(pa.binary())


def _lengths_of(array: pa.Array) -> np.ndarray:
    """A binary array's value lengths, -1 for a null."""
    lengths = pc.binary_length(array).fill_null(-1)
    return np.asarray(lengths, dtype=np.int64)


def _strings(fields: list[tuple[np.ndarray, np.ndarray] | None]) -> pa.BinaryArray:
    """One short string per record: its varints ``(zigzag values, sizes)`` one after another
    (None: one zero byte, the record attributes)."""
    sizes = [np.ones_like(fields[0][1]) if f is None else f[1] for f in fields]  # type: ignore[index]
    total = np.sum(sizes, axis=0)
    offsets = np.zeros(len(total) + 1, np.int64)
    np.cumsum(total, out=offsets[1:])
    out = np.zeros(int(offsets[-1]), np.uint8)
    pos = offsets[:-1].copy()
    for field, size in zip(fields, sizes, strict=True):
        if field is not None:
            _write_varints(out, pos, *field)
        pos += size
    return pa.Array.from_buffers(pa.binary(), len(total), [None, pa.py_buffer(offsets.astype(np.int32)),
                                                            pa.py_buffer(out)])


def _zigzag(values: np.ndarray) -> np.ndarray:
    v = np.asarray(values, np.int64)
    return ((v << 1) ^ (v >> 63)).view(_U64)


def _varint_sizes(z: np.ndarray) -> np.ndarray:
    size = np.ones(len(z), np.int64)
    for k in range(1, _VARINT_MAX_BYTES):
        size += z >= (_U64(1) << _U64(7 * k))
    return size


def _write_varints(out: np.ndarray, pos: np.ndarray, z: np.ndarray, sizes: np.ndarray) -> None:
    for k in range(int(sizes.max()) if len(sizes) else 0):
        m = sizes > k
        byte = ((z[m] >> _U64(7 * k)) & _U64(0x7F)).astype(np.uint8)
        byte |= np.where(sizes[m] > k + 1, np.uint8(0x80), np.uint8(0))
        out[pos[m] + k] = byte
