"""The Spark driver JVM's stderr, filtered: errors through, start-up chatter out.

Why: PySpark starts the driver JVM with ``spark-submit``, which inherits the
Python process's stderr. Before any log4j configuration applies, four things
write there that a job's user has no use for: the JVM itself (``WARNING:
Using incubator modules: jdk.incubator.vector`` — Spark's launcher always
adds that module, and the JVM has no switch to silence the notice), Spark's
start-up banners, SparkSubmit's Ivy resolution report for
``spark.jars.packages`` (~90 lines for Delta; Spark 4.2's ``MavenUtils``
sets Ivy's ``quiet`` log option only in its test mode, so no
``ivysettings.xml`` or Spark conf hides it), and gRPC's fork handler when
this process runs a broker or client while the JVM is forked (``make demo``:
"Other threads are currently calling into gRPC, skipping fork() handlers").
Log4j's own lines are made quiet at the cause by
``jobs/log4j2-quiet.properties``; this module handles the rest.

How: :func:`capturing_jvm_stderr` points file descriptor 2 at a pipe while the
session is created (the JVM, and the Python workers it later forks, inherit
the pipe), then restores it. A daemon thread reads the pipe for the process's
lifetime:

* while the session starts, lines are buffered; if start-up fails, the whole
  buffer is written out (an unresolved Delta package or a JVM that cannot
  start must stay visible); if it succeeds, Ivy's whole report is dropped
  (on a first run it also lists each download, proxy hints and a "problems
  summary" of mirrors that lacked a file: ~260 lines, none of which matter
  once the jars resolved) and of the rest only lines that are not known
  start-up chatter (:data:`CHATTER`) are written;
* afterwards every line is passed through (the JVM logs only errors by then),
  except the same known chatter.

Nothing of ours is filtered: the Python process's own writes to ``sys.stderr``
go to the restored descriptor once the session exists (during start-up they
pass through the same buffer and filter, which only drops JVM/Ivy patterns).

Thread-safety: :func:`capturing_jvm_stderr` swaps a process-wide descriptor;
call it from one thread at a time (session creation is single-threaded).
"""

from __future__ import annotations

import contextlib
import os
import re
import sys
import threading
from collections.abc import Iterator

__all__ = ["CHATTER", "StartupOutput", "capturing_jvm_stderr", "is_chatter", "without_ivy_report"]

# Lines the JVM, Spark's launcher and SparkSubmit's Ivy report print on every start.
CHATTER = re.compile(
    r"^(?:WARNING: Using incubator modules"
    r"|Using Spark's default log4j profile"
    r"|Setting default log level to"
    r"|To adjust logging level use sc\.setLogLevel"
    r"|:: (?:loading settings|resolving dependencies|resolution report|retrieving|modules in use"
    r"|evicted modules) ::"
    r"|Ivy Default Cache set to:"
    r"|The jars for the packages stored in:"
    r"|\S+#\S+ added as a dependency$"
    r"|\t(?:confs: |found |\S+#\S+;\S+ (?:from|by) |\d+ artifacts copied)"
    r"|\t:: (?:modules in use|evicted modules):$"
    r"|\t-{20,}$"
    r"|\t\|"
    # gRPC's fork handler, when the JVM is forked from a process that runs a broker or client:
    r"|I\d{4} [\d:.]+ +\d+ fork_posix\.cc:\d+\] Other threads are currently calling into gRPC"
    r")"
)


# Ivy's report for spark.jars.packages: from its first line to "N artifacts copied" at its end.
_IVY_FIRST = re.compile(r"^(?::: loading settings ::|Ivy Default Cache set to:)")
_IVY_LAST = re.compile(r"^\t\d+ artifacts copied")


def without_ivy_report(lines: list[str]) -> list[str]:
    """``lines`` without Ivy's report of a resolution that succeeded.

    A report that never reaches its last line (Ivy died) is kept whole.
    """
    first = next((i for i, line in enumerate(lines) if _IVY_FIRST.match(line)), None)
    if first is None:
        return lines
    last = next((i for i in range(first, len(lines)) if _IVY_LAST.match(lines[i])), None)
    if last is None:
        return lines
    return lines[:first] + lines[last + 1:]


def is_chatter(line: str) -> bool:
    """True for a known start-up line of the JVM, Spark's launcher or Ivy (see :data:`CHATTER`)."""
    return CHATTER.match(line) is not None


class _Forwarder(threading.Thread):
    """Reads the pipe line by line; buffers during start-up, then forwards all but chatter."""

    def __init__(self, read_fd: int, out_fd: int) -> None:
        super().__init__(name="jvm-stderr", daemon=True)
        self._read = os.fdopen(read_fd, "rb", buffering=0)
        self._out_fd = out_fd
        self._lock = threading.Lock()
        self._buffer: list[bytes] | None = []   # None once start-up ended
        self.ended = threading.Event()   # the pipe's writers are all gone

    def run(self) -> None:
        try:
            self._forward()
        finally:
            self.ended.set()

    def _forward(self) -> None:
        pending = b""
        while True:
            try:
                chunk = self._read.read(65536)
            except OSError:
                return
            if not chunk:
                return
            pending += chunk
            *lines, pending = pending.split(b"\n")
            for raw in lines:
                self._line(raw + b"\n")

    def _line(self, raw: bytes) -> None:
        with self._lock:
            if self._buffer is not None:
                self._buffer.append(raw)
                return
        if not is_chatter(raw.decode("utf-8", "replace")):
            self._write(raw)

    def _write(self, raw: bytes) -> None:
        with contextlib.suppress(OSError):
            os.write(self._out_fd, raw)

    def end_startup(self, *, failed: bool) -> list[str]:
        """Release the start-up buffer: everything if start-up ``failed``, else all but chatter.

        Returns the lines that were not chatter (what a failed start's error message can quote).
        """
        with self._lock:
            buffered, self._buffer = self._buffer or [], None
        if not failed:
            texts = without_ivy_report([raw.decode("utf-8", "replace") for raw in buffered])
            buffered = [text.encode("utf-8") for text in texts]
        kept = []
        for raw in buffered:
            line = raw.decode("utf-8", "replace")
            if not is_chatter(line):
                kept.append(line.rstrip("\n"))
            if failed or not is_chatter(line):
                self._write(raw)
        return kept


class StartupOutput:
    """What the JVM printed while the session started, minus chatter; filled when the block ends."""

    def __init__(self) -> None:
        self.lines: list[str] = []

    def tail(self, count: int = 5) -> str:
        """The last ``count`` lines that say something, joined; ``""`` if there were none."""
        said = [line for line in self.lines if line.strip()]
        return "\n".join(said[-count:])


# How long a failed start waits for the dead JVM's last lines to come through the pipe.
_DRAIN_S = 2.0


@contextlib.contextmanager
def capturing_jvm_stderr() -> Iterator[StartupOutput]:
    """Within the block, descriptor 2 is a filtered pipe; a JVM started there keeps it.

    Yields a :class:`StartupOutput`: if the block raised, its ``lines`` hold what the
    JVM said (so the caller's error can name the cause, not only "the gateway exited").
    If ``LOGSTORE_SPARK_VERBOSE`` is set (to anything but ``0``), does nothing:
    everything the JVM and Ivy print reaches the terminal as without logstore.
    """
    output = StartupOutput()
    if os.environ.get("LOGSTORE_SPARK_VERBOSE", "0") not in ("", "0"):
        yield output
        return
    sys.stderr.flush()
    read_fd, write_fd = os.pipe()
    saved = os.dup(2)
    forwarder = _Forwarder(read_fd, os.dup(saved))
    forwarder.start()
    os.dup2(write_fd, 2)
    os.close(write_fd)
    failed = True
    try:
        yield output
        failed = False
    finally:
        sys.stderr.flush()
        os.dup2(saved, 2)
        os.close(saved)
        if failed:   # a JVM that died holds the pipe no more: its last lines are on the way
            forwarder.ended.wait(_DRAIN_S)
        output.lines = forwarder.end_startup(failed=failed)
