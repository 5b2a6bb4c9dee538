"""kill -9 tests of the partition log (DESIGN §1 I1, I2, I6 and §7: durability claims are
checked by killing processes).

A child process appends batches in a loop to a :class:`~logstore.storage.log.Log`,
some with ``fsync=True``, and after each acknowledged append writes one line
``<base_offset> <last_offset> <fsynced 0/1>`` to its stdout (a file, written
with one ``write`` call per line). The parent kills it with SIGKILL after a
random delay, reopens the log (an unclean open: the child never closed it) and
checks that

* the log holds a prefix of what was appended: offsets 0..LEO-1 with no gap,
  every record byte-identical to what the child wrote at that offset, batch
  boundaries as acknowledged;
* every batch the child reported as fsynced is present — and, since a killed
  process loses nothing the kernel already accepted, so is every acknowledged
  batch; at most one unacknowledged batch (written, killed before reporting)
  follows them;
* no corrupt batch is served (CRC verified by ``read``, full Arrow validation);
* the leader epoch cache stays consistent;
* appending after recovery works, and the log survives one more reopen.

Several rounds run on the same directory, so recovery also runs on logs that
were recovered before.
"""

from __future__ import annotations

import os
import random
import signal
import subprocess
import sys
import time

import pyarrow.ipc
import pytest

from logstore.record import untyped_schema
from logstore.storage.config import LogConfig
from logstore.storage.log import Log

pytestmark = [pytest.mark.slow, pytest.mark.timeout(240)]

SCHEMA = untyped_schema()

# Shared by the child and the parent: what the record at an offset must hold.
RECORD_CONTENT = '''
import hashlib

def value_for(offset):
    if offset % 17 == 0:
        return None
    return b"%d:" % offset + hashlib.blake2b(b"%d" % offset, digest_size=16).digest() * (offset % 5)

def key_for(offset):
    return None if offset % 10 == 0 else b"k%d" % (offset % 13)

def timestamp_for(offset):
    return 1_600_000_000_000 + offset * 3 - (offset % 7) * 5
'''

CHILD = RECORD_CONTENT + '''
import os, random, sys
from logstore.storage.config import LogConfig
from logstore.storage.log import Log
from logstore.record import build_batch, untyped_schema

directory, seed, epoch = sys.argv[1], int(sys.argv[2]), int(sys.argv[3])
props = dict(p.split("=", 1) for p in sys.argv[4:])
log = Log.open(directory, config=LogConfig.from_properties(props), schema=untyped_schema())
rng = random.Random(seed)
os.write(1, b"ready %d\\n" % log.log_end_offset)
while True:
    n = rng.randint(1, 60)
    base = log.log_end_offset
    offsets = range(base, base + n)
    batch = build_batch(
        untyped_schema(),
        values=[value_for(o) for o in offsets],
        keys=[key_for(o) for o in offsets],
        timestamps_ms=[timestamp_for(o) for o in offsets],
    )
    res = log.append(batch, fsync=rng.random() < 0.25, leader_epoch=epoch,
                     compression=rng.choice([None, None, "lz4", "zstd"]))
    assert res.base_offset == base and res.last_offset == base + n - 1
    fsynced = log.recovery_point > res.last_offset
    os.write(1, b"%d %d %d\\n" % (res.base_offset, res.last_offset, fsynced))
'''

namespace: dict = {}
exec(RECORD_CONTENT, namespace)  # the parent's copy of value_for / key_for / timestamp_for
value_for, key_for, timestamp_for = namespace["value_for"], namespace["key_for"], namespace["timestamp_for"]


def read_text(path: str) -> str:
    with open(path, errors="replace") as f:
        return f.read()


def wait_for_lines(path: str, proc: subprocess.Popen, count: int, timeout_s: float) -> None:
    """Wait until the child has written ``count`` complete lines (the first is ``ready``)."""
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        with open(path, "rb") as f:
            if f.read().count(b"\n") >= count:
                return
        if proc.poll() is not None:
            raise AssertionError(f"child exited early with {proc.returncode}")
        time.sleep(0.005)
    raise AssertionError(f"child wrote fewer than {count} lines within {timeout_s}s")


def acknowledged(path: str) -> list[tuple[int, int, bool]]:
    """The complete ``base last fsynced`` lines (a line cut by the kill is ignored)."""
    with open(path, "rb") as f:
        text = f.read().decode()
    lines = text.split("\n")[:-1]  # the last element is "" or an incomplete line
    assert lines and lines[0].startswith("ready")
    out = []
    for line in lines[1:]:
        base, last, fsynced = line.split()
        out.append((int(base), int(last), fsynced == "1"))
    return out


def check_log(log: Log, acked: list[tuple[int, int, bool]], epochs_used: list[int]) -> None:
    leo = log.log_end_offset
    assert log.log_start_offset == 0
    fsynced = [(b, last) for b, last, f in acked if f]
    for base, last in fsynced:
        assert last < leo, f"fsynced batch [{base}, {last}] lost: LEO is {leo}"
    for base, last, _ in acked:
        assert last < leo, f"acknowledged batch [{base}, {last}] lost: LEO is {leo}"
    boundaries = []
    offset = 0
    while offset < leo:
        res = log.read(offset, max_bytes=1 << 20)  # verifies every CRC
        assert res.batches
        for stored in res.batches:
            h = stored.header
            batch = stored.decode(res.schema, validate=True)
            offsets = batch.column("offset").to_pylist()
            assert offsets == list(range(h.base_offset, h.next_offset)), "offsets must have no gap"
            assert batch.column("value").to_pylist() == [value_for(o) for o in offsets]
            assert batch.column("key").to_pylist() == [key_for(o) for o in offsets]
            assert batch.column("timestamp").cast("int64").to_pylist() == [timestamp_for(o) for o in offsets]
            boundaries.append((h.base_offset, h.last_offset))
        offset = res.next_offset
    assert offset == leo
    acked_boundaries = [(b, last) for b, last, _ in acked]
    assert boundaries[: len(acked_boundaries)] == acked_boundaries
    assert len(boundaries) - len(acked_boundaries) <= 1, "more than one unacknowledged batch"
    # The newest segments (where a crash lands) are still plain Arrow IPC streams.
    for seg in log.segments[-3:]:
        table = pyarrow.ipc.open_stream(seg.path).read_all()
        assert table.column("offset").to_pylist() == list(range(seg.base_offset, seg.next_offset))
    entries = log.epochs.entries
    assert [e.start_offset for e in entries] == sorted({e.start_offset for e in entries})
    assert all(e.start_offset < leo for e in entries)
    assert {e.epoch for e in entries} <= set(epochs_used)


def append_one(log: Log, epoch: int) -> tuple[int, int, bool]:
    from logstore.record import build_batch

    base = log.log_end_offset
    offsets = range(base, base + 3)
    batch = build_batch(SCHEMA, values=[value_for(o) for o in offsets], keys=[key_for(o) for o in offsets],
                        timestamps_ms=[timestamp_for(o) for o in offsets])
    res = log.append(batch, fsync=True, leader_epoch=epoch)
    assert (res.base_offset, res.last_offset) == (base, base + 2)
    return (res.base_offset, res.last_offset, True)


CONFIGS = {
    "rolls, fsync per append only": {"segment.bytes": "65536", "index.interval.bytes": "4096"},
    "small segments, flush.messages": {"segment.bytes": "16384", "index.interval.bytes": "0",
                                       "flush.messages": "150"},
}


@pytest.mark.parametrize("props", CONFIGS.values(), ids=list(CONFIGS))
def test_kill_9_while_appending_loses_nothing_acknowledged(tmp_path, props) -> None:
    directory = str(tmp_path / "t-0")
    config = LogConfig.from_properties(props)
    rng = random.Random(1234 + len(props))
    acked: list[tuple[int, int, bool]] = []
    epochs_used: list[int] = []
    for round_no in range(7):
        epoch = round_no + 1
        epochs_used.append(epoch)
        out_path = str(tmp_path / f"child-{round_no}.out")
        err_path = str(tmp_path / f"child-{round_no}.err")
        with open(out_path, "wb") as out, open(err_path, "wb") as err:
            proc = subprocess.Popen(
                [sys.executable, "-c", CHILD, directory, str(rng.randrange(2**31)), str(epoch),
                 *(f"{k}={v}" for k, v in props.items())],
                stdout=out, stderr=err,
            )
        try:
            # Kill at a random moment after a random number (1-40) of acknowledged appends,
            # so that every round makes progress however loaded the machine is.
            wait_for_lines(out_path, proc, 1 + rng.randint(1, 40), timeout_s=120)
            time.sleep(rng.uniform(0.0, 0.5))
            assert proc.poll() is None, f"child died on its own: {read_text(err_path)}"
            os.kill(proc.pid, signal.SIGKILL)
            proc.wait(timeout=30)
        finally:
            if proc.poll() is None:
                proc.kill()
                proc.wait(timeout=30)
        assert proc.returncode == -signal.SIGKILL, read_text(err_path)
        new = acknowledged(out_path)
        assert new, "the child was killed after acknowledging appends"
        assert new[0][0] == (acked[-1][1] + 1 if acked else 0), "the child continued at the LEO"
        acked.extend(new)

        log = Log.open(directory, config=config, schema=SCHEMA)  # unclean: recovery runs
        check_log(log, acked, epochs_used)
        # If the child wrote one more batch before it could report it, it is now part of the log.
        leo = log.log_end_offset
        if leo > (acked[-1][1] + 1 if acked else 0):
            acked.append((acked[-1][1] + 1 if acked else 0, leo - 1, False))
        acked.append(append_one(log, epoch))
        # Reopen once more: cleanly in odd rounds, as after another crash in even ones.
        if round_no % 2:
            log.close()
        else:
            del log
        log = Log.open(directory, config=config, schema=SCHEMA)
        check_log(log, acked, epochs_used)
        assert len(log.segments) >= 1
        if round_no % 2:
            log.close()
        else:
            del log
    assert any(f for _, _, f in acked) and not all(f for _, _, f in acked)
