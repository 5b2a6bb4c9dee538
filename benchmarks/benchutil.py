"""Small helpers shared by the benchmark scripts (not a library: each script stays readable alone).

* :class:`Timer` — wall-clock and this process's CPU seconds of a block;
* :func:`process_cpu_s` — CPU seconds (user + sys) of another process, from /proc;
* :func:`child_pid` — the pid of a child process whose command line contains a word
  (how a script finds the broker that :class:`logstore.broker.embedded.EmbeddedBroker` started);
* :func:`machine_line` — the machine facts every benchmark prints (``os.cpu_count()``,
  load average, versions);
* :func:`verdict` — ``PASS``/``MISS`` against a target.
"""

from __future__ import annotations

import contextlib
import os
import platform
import time
from collections.abc import Iterator

import numpy as np
import pyarrow as pa

_HZ = os.sysconf("SC_CLK_TCK") if hasattr(os, "sysconf") else 100


class Timer:
    """Wall-clock and process CPU seconds of a block (``with Timer() as t: ...``)."""

    def __enter__(self) -> Timer:
        self.wall, self.cpu = time.perf_counter(), time.process_time()
        return self

    def __exit__(self, *exc: object) -> None:
        self.wall = time.perf_counter() - self.wall
        self.cpu = time.process_time() - self.cpu


def process_cpu_s(pid: int | str | None, *, reaped_children: bool = False) -> float:
    """User + system CPU seconds of process ``pid`` so far, with ``reaped_children`` also those
    of its children that have ended (0.0 when unknown)."""
    if pid is None:
        return 0.0
    try:
        with open(f"/proc/{pid}/stat") as f:
            fields = f.read().rsplit(")", 1)[1].split()
    except OSError:
        return 0.0
    return sum(int(x) for x in fields[11:15 if reaped_children else 13]) / _HZ


def cpu_by_role(roles: dict[str, str]) -> dict[str, float]:
    """CPU seconds so far (user + system, reaped children included) of every process on the
    machine, summed per role: a process's role is the first of ``roles`` (role → word) whose
    word its command line contains, else ``"other"``. Differences of two calls profile a phase
    across processes (a broker, Spark executors, their Python workers)."""
    out = dict.fromkeys([*roles, "other"], 0.0)
    for pid in os.listdir("/proc"):
        if not pid.isdigit():
            continue
        try:
            with open(f"/proc/{pid}/cmdline", "rb") as f:
                cmdline = f.read()
        except OSError:
            continue  # gone meanwhile
        role = next((r for r, word in roles.items() if word.encode() in cmdline), "other")
        out[role] += process_cpu_s(pid, reaped_children=True)
    return out


def child_pid(word: str) -> int | None:
    """The pid of a child of this process whose command line contains ``word`` (None if none)."""
    pids: list[str] = []
    try:
        for tid in os.listdir("/proc/self/task"):
            with open(f"/proc/self/task/{tid}/children") as f:
                pids += f.read().split()
    except OSError:
        return None
    for pid in pids:
        try:
            with open(f"/proc/{pid}/cmdline", "rb") as f:
                if word.encode() in f.read():
                    return int(pid)
        except OSError:
            continue
    return None


def machine_line() -> str:
    load = "?"
    with contextlib.suppress(OSError):
        load = " ".join(f"{x:.2f}" for x in os.getloadavg())
    return (f"machine     os.cpu_count()={os.cpu_count()}  load average {load}  "
            f"python {platform.python_version()}  pyarrow {pa.__version__}  {platform.machine()}")


def verdict(ok: bool) -> str:
    return "PASS" if ok else "MISS"


def value_tables(records: int, *, rows: int = 200_000, value_bytes: int = 100, seed: int = 1) -> Iterator[pa.Table]:
    """``records`` random values of ``value_bytes`` each, in tables of ``rows`` with one
    binary column ``value``, built straight from buffers (the same seed gives the same bytes)."""
    rng = np.random.default_rng(seed)
    for start in range(0, records, rows):
        n = min(rows, records - start)
        offsets = np.arange(0, (n + 1) * value_bytes, value_bytes, dtype=np.int32)
        values = pa.Array.from_buffers(pa.binary(), n, [None, pa.py_buffer(offsets),
                                                        pa.py_buffer(rng.bytes(n * value_bytes))])
        yield pa.table({"value": values})
