"""Storage benchmark: Log.append and Log.read against raw sequential file writes (DESIGN §7).

Measured in one run, on one disk, best of ``--repeats`` runs (a and b alternate):

(a) raw write   the exact bytes the log stores (pre-encoded, not timed), written
                to a plain file with one ``pwrite`` per batch, as the segment writes
                one batch per call;
(b) Log.append_stored  the broker's append: batches of ``--batch-size`` records
                (100-byte random values, 8-16 byte random keys, no headers) as a
                producer sends them, parsed and decoded as the broker's validation
                leaves them (not timed), each appended as sent, its base offset,
                leader epoch and offsets patched in place (format 2), no fsync:
                patch + write + indexes;
(b') validate + (b)  the same with the broker's validation of each batch first
                (CRC, full Arrow validation, offsets, max timestamp): what a
                produce costs the broker besides gRPC;
(c) Log.read    everything appended in (b) read back from the page cache with
                Log.read and decoded to Arrow record batches.

All writers write the same number of bytes (checked), so their MB/s and
records/s ratios are the same. Targets (issue "produce path"): (b)/(a) >= 0.8
and >= 2,000,000 records/s appended. Wall-clock time is the measurement; the
process CPU time (user + sys) is printed next to it because on a shared
machine other processes stretch wall time but not CPU time.

Files are deleted between runs and nothing is fsynced: deleting a file drops
its dirty pages, whereas leaving them would make the kernel write back
hundreds of megabytes in the middle of the next measurement, which would then
measure the disk's writeback rather than the code.

Run: ``make bench`` or ``.venv/bin/python benchmarks/bench_log.py [--records N]``.
"""

from __future__ import annotations

import argparse
import os
import platform
import shutil
import sys
import tempfile
import time

import numpy as np
import pyarrow as pa

from logstore.record import build_batch, encode_batch, encode_schema, untyped_schema
from logstore.record_reader import StoredBatch, parse_batch_at
from logstore.storage.config import LogConfig
from logstore.storage.log import Log
from logstore.storage.validation import validate_records

SCHEMA = untyped_schema()
VALUE_BYTES = 100
BASE_TIMESTAMP_MS = 1_700_000_000_000


def make_batches(records: int, batch_size: int, seed: int = 1) -> list[pa.RecordBatch]:
    """Random keys (8-16 bytes) and values (100 bytes), built straight from buffers."""
    rng = np.random.default_rng(seed)
    out = []
    for start in range(0, records, batch_size):
        n = min(batch_size, records - start)
        values = pa.Array.from_buffers(
            pa.binary(), n,
            [None, pa.py_buffer(np.arange(0, (n + 1) * VALUE_BYTES, VALUE_BYTES, dtype=np.int32)),
             pa.py_buffer(rng.bytes(n * VALUE_BYTES))],
        )
        key_lengths = rng.integers(8, 17, n, dtype=np.int32)
        key_offsets = np.zeros(n + 1, dtype=np.int32)
        np.cumsum(key_lengths, out=key_offsets[1:])
        keys = pa.Array.from_buffers(
            pa.binary(), n,
            [None, pa.py_buffer(key_offsets), pa.py_buffer(rng.bytes(int(key_offsets[-1])))],
        )
        stamps = np.arange(BASE_TIMESTAMP_MS + start, BASE_TIMESTAMP_MS + start + n, dtype=np.int64)
        out.append(build_batch(SCHEMA, values=values, keys=keys, timestamps_ms=stamps))
    return out


class Timer:
    """Wall-clock and process CPU seconds of a block."""

    def __enter__(self) -> Timer:
        self.wall, self.cpu = time.perf_counter(), time.process_time()
        return self

    def __exit__(self, *exc: object) -> None:
        self.wall = time.perf_counter() - self.wall
        self.cpu = time.process_time() - self.cpu


def raw_write(directory: str, encoded: list[bytes]) -> tuple[Timer, int]:
    """(time, bytes) to write the schema message and the ``encoded`` batches to a new file."""
    path = os.path.join(directory, "raw.bin")
    head = encode_schema(SCHEMA)
    timer = Timer().__enter__()
    fd = os.open(path, os.O_RDWR | os.O_CREAT | os.O_EXCL, 0o644)
    try:
        os.pwrite(fd, head, 0)
        position = len(head)
        for data in encoded:
            written = os.pwrite(fd, data, position)
            assert written == len(data)
            position += written
    finally:
        os.close(fd)
        timer.__exit__()
    return timer, position


def log_append_validated(directory: str, sent: list[bytes]) -> tuple[Timer, Log]:
    """Time to validate and append the producer's ``sent`` batches to a new log as the
    broker does (opening it is not timed)."""
    log = Log.open(os.path.join(directory, "bench-0"), config=LogConfig(), schema=SCHEMA)
    head = encode_schema(SCHEMA)
    with Timer() as timer:
        for data in sent:
            [(stored, batch)] = validate_records(
                head + data, log_schema=SCHEMA, max_message_bytes=1 << 30,
                max_decompressed_bytes=1 << 30, where="bench",
            ).batches
            log.append_stored(stored, batch, SCHEMA)
    return timer, log


def log_append_parsed(directory: str, parsed: list[tuple[StoredBatch, pa.RecordBatch]]) -> tuple[Timer, Log]:
    """Time to append batches the broker's validation has already parsed and decoded."""
    log = Log.open(os.path.join(directory, "bench-0"), config=LogConfig(), schema=SCHEMA)
    with Timer() as timer:
        for stored, batch in parsed:
            log.append_stored(stored, batch, SCHEMA)
    return timer, log


def log_read(log: Log, records: int) -> Timer:
    """Time to read the whole log back with Log.read and decode every batch."""
    offset, seen = 0, 0
    with Timer() as timer:
        while offset < log.log_end_offset:
            res = log.read(offset, max_bytes=16 << 20)
            seen += sum(b.num_rows for b in res.decode())
            offset = res.next_offset
    assert seen == records, (seen, records)
    return timer


def fresh_dir(root: str) -> str:
    shutil.rmtree(root, ignore_errors=True)
    os.makedirs(root)
    return root


def describe_dir(path: str) -> str:
    """The directory, and the filesystem it is on (from /proc/mounts when available)."""
    real = os.path.realpath(path)
    best = ("?", "?")
    try:
        with open("/proc/mounts") as f:
            mounts = [line.split()[:3] for line in f]
        for device, mount_point, fs_type in mounts:
            if (real == mount_point or real.startswith(mount_point.rstrip("/") + "/")) and len(mount_point) >= len(best[0]):
                best = (mount_point, f"{fs_type} on {device}")
    except OSError:
        pass
    return f"{path}  (filesystem {best[1]}, mounted at {best[0]})"


def load_average() -> str:
    """The 1-minute load average: other work on the machine stretches wall-clock times."""
    try:
        return f"{os.getloadavg()[0]:.2f}"
    except OSError:
        return "unknown"


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n", 1)[0])
    parser.add_argument("--records", type=int, default=3_000_000)
    parser.add_argument("--batch-size", type=int, default=10_000)
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--dir", default=None, help="where to write (default: a new temp dir under $TMPDIR or /tmp)")
    args = parser.parse_args(argv)

    root = tempfile.mkdtemp(prefix="logstore-bench-", dir=args.dir)
    work = os.path.join(root, "run")
    print(f"logstore storage benchmark: {args.records:,} records in batches of {args.batch_size:,}, "
          f"{VALUE_BYTES}-byte values, 8-16 byte keys, no headers, no fsync")
    print(f"directory   {describe_dir(root)}")
    print(f"machine     os.cpu_count()={os.cpu_count()}  python {platform.python_version()}  "
          f"pyarrow {pa.__version__}  {platform.machine()}  load average {load_average()}")
    try:
        print("preparing input batches and their encoded bytes (not timed) ...", flush=True)
        batches = make_batches(args.records, args.batch_size)
        encoded, base = [], 0
        for b in batches:
            encoded.append(encode_batch(b, base_offset=base).to_bytes())
            base += b.num_rows
        sent = [encode_batch(b, base_offset=0).to_bytes() for b in batches]  # as a producer sends them
        del batches
        parsed = [(stored, stored.decode(SCHEMA)) for stored in (parse_batch_at(memoryview(d), 0) for d in sent)]
        best: dict[str, float] = {}
        best_cpu: dict[str, float] = {}
        stored_bytes = 0

        def keep_best(name: str, timer: Timer) -> None:
            best[name] = min(best.get(name, float("inf")), timer.wall)
            best_cpu[name] = min(best_cpu.get(name, float("inf")), timer.cpu)

        for i in range(args.repeats):
            raw, stored_bytes = raw_write(fresh_dir(work), encoded)
            keep_best("a", raw)
            shutil.rmtree(work)
            checked, log = log_append_validated(fresh_dir(work), sent)
            keep_best("v", checked)
            del log
            shutil.rmtree(work)
            append, log = log_append_parsed(fresh_dir(work), parsed)
            keep_best("b", append)
            assert log.size_bytes == stored_bytes, (log.size_bytes, stored_bytes)  # the same bytes
            read = log_read(log, args.records)
            keep_best("c", read)
            del log  # no close: closing would fsync everything just written
            shutil.rmtree(work)
            print(f"  run {i + 1}/{args.repeats}: raw write {raw.wall:.3f}s, append_stored {append.wall:.3f}s, "
                  f"validate+append {checked.wall:.3f}s, Log.read+decode {read.wall:.3f}s", flush=True)
    finally:
        shutil.rmtree(root, ignore_errors=True)

    mb = stored_bytes / 1e6
    rows = [
        ("(a) raw sequential write", best["a"]),
        ("(b) Log.append_stored", best["b"]),
        ("(b') validate + (b)", best["v"]),
        ("(c) Log.read + decode", best["c"]),
    ]
    print()
    print(f"{'best of ' + str(args.repeats):<28}{'seconds':>10}{'records/s':>16}{'MB/s':>10}{'CPU s':>10}")
    for (name, seconds), key in zip(rows, "abvc", strict=True):
        print(f"{name:<28}{seconds:>10.3f}{args.records / seconds:>16,.0f}{mb / seconds:>10.1f}"
              f"{best_cpu[key]:>10.3f}")
    append_ratio = best["a"] / best["b"]
    read_ratio = best["a"] / best["c"]
    appended_per_s = args.records / best["b"]
    print()
    print(f"stored bytes written by (a), (b) and (b'): {stored_bytes:,} ({stored_bytes / args.records:.1f} per record)")
    print(f"ratio (b)/(a) = {append_ratio:.2f}   target >= 0.80: {'met' if append_ratio >= 0.8 else 'MISSED'}")
    print(f"ratio (b')/(a) = {best['a'] / best['v']:.2f}")
    print(f"ratio (c)/(a) = {read_ratio:.2f}")
    print(f"(CPU-time ratios, less sensitive to other load: (b)/(a) = {best_cpu['a'] / best_cpu['b']:.2f}, "
          f"(c)/(a) = {best_cpu['a'] / best_cpu['c']:.2f})")
    print(f"appended records/s = {appended_per_s:,.0f}   target >= 2,000,000: "
          f"{'met' if appended_per_s >= 2_000_000 else 'MISSED'}")
    print(f"load average at the end {load_average()}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
