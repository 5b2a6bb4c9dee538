"""One writer thread and many reader threads on one partition log: the readers check every offset's content."""

from __future__ import annotations

import hashlib
import sys
import threading
import time

from storage_helpers import SCHEMA

from logstore.errors import OffsetOutOfRangeError
from logstore.record import build_batch
from logstore.storage.log import Log

WRITER_BATCHES = 600
READERS = 4


def value_for(offset: int) -> bytes:
    return b"%d|" % offset + hashlib.blake2b(b"%d" % offset, digest_size=8).digest() * (1 + offset % 9)


def batch_at(base: int, n: int):  # type: ignore[no-untyped-def]
    offsets = range(base, base + n)
    return build_batch(SCHEMA, values=[value_for(o) for o in offsets], timestamps_ms=[o for o in offsets])


def run(log: Log, writer_step, readers: int = READERS) -> list[int]:  # type: ignore[no-untyped-def]
    """Run the writer and ``readers`` reader threads; return how many records each reader checked."""
    done = threading.Event()
    errors: list[BaseException] = []
    checked = [0] * readers

    def writer() -> None:
        try:
            for i in range(WRITER_BATCHES):
                writer_step(i)
        except BaseException as e:  # noqa: BLE001 - reported by the test thread
            errors.append(e)
        finally:
            done.set()

    def reader(slot: int) -> None:
        try:
            offset = log.log_start_offset
            while True:
                finished = done.is_set()
                try:
                    res = log.read(offset, max_bytes=[1, 4096, 1 << 20][slot % 3])
                except OffsetOutOfRangeError:
                    # The log start offset moved past us: carry on from there.
                    assert offset < log.log_start_offset
                    offset = log.log_start_offset
                    continue
                if not res.batches:
                    if finished and offset >= log.log_end_offset:
                        return
                    log.wait_for_data(offset, 0.05)
                    continue
                for stored in res.batches:
                    stored.verify_crc()
                    batch = stored.decode(res.schema, validate=True)
                    assert batch.num_rows == stored.header.record_count
                    offsets = batch.column("offset").to_pylist()
                    assert offsets == list(range(stored.header.base_offset, stored.header.next_offset))
                    assert batch.column("value").to_pylist() == [value_for(o) for o in offsets]
                first = res.batches[0].header.base_offset
                assert first <= offset < res.batches[0].header.next_offset, (first, offset)
                for a, b in zip(res.batches, res.batches[1:], strict=False):
                    assert a.header.next_offset == b.header.base_offset
                checked[slot] += res.next_offset - offset
                offset = res.next_offset
        except BaseException as e:  # noqa: BLE001
            errors.append(e)

    # Switch threads as often as possible so reads land inside appends.
    old_interval = sys.getswitchinterval()
    sys.setswitchinterval(1e-6)
    try:
        return _join(threads_for(writer, reader, readers), errors, checked)
    finally:
        sys.setswitchinterval(old_interval)


def threads_for(writer, reader, readers: int) -> list[threading.Thread]:  # type: ignore[no-untyped-def]
    threads = [threading.Thread(target=writer, name="writer")]
    threads += [threading.Thread(target=reader, args=(i,), name=f"reader-{i}") for i in range(readers)]
    return threads


def _join(threads: list[threading.Thread], errors: list[BaseException], checked: list[int]) -> list[int]:
    for t in threads:
        t.start()
    deadline = time.monotonic() + 90
    for t in threads:
        t.join(timeout=max(0.0, deadline - time.monotonic()))
    assert not any(t.is_alive() for t in threads), "threads did not finish in time"
    if errors:
        raise errors[0]
    return checked
