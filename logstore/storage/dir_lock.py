"""An exclusive lock on a data directory: one broker (or offline tool) at a time.

Two brokers on one data directory would append to the same segment files and
write ``clean-shutdown`` markers into each other's partitions. Whoever opens
a data directory — the broker's :class:`~logstore.storage.log_manager.LogManager`,
the offline ``logstore partitions recover`` — first takes
:class:`DataDirLock`: ``flock(LOCK_EX | LOCK_NB)`` on ``<data_dir>/.lock``,
which then holds the holder's pid (as Kafka's ``.lock`` file). A second
taker fails at once with :class:`DataDirLockedError` naming that pid; it
never waits. The kernel drops the lock when its holder exits, however it
exits (kill -9 included), so a stale file never blocks a restart.

Thread-safety: one instance per process and directory; acquire/release are
not meant to race.
"""

from __future__ import annotations

import contextlib
import fcntl
import os

from logstore.errors import StorageError

__all__ = ["DataDirLock", "DataDirLockedError", "LOCK_FILE"]

LOCK_FILE = ".lock"


class DataDirLockedError(StorageError):
    """Another process holds the data directory's lock (waiting will not help: not retriable)."""

    retriable = False


class DataDirLock:
    """The held lock of one data directory; see the module docstring."""

    def __init__(self, path: str, fd: int) -> None:
        self.path = path
        self._fd: int | None = fd

    @classmethod
    def acquire(cls, data_dir: str, *, purpose: str = "broker") -> DataDirLock:
        """Take the lock of ``data_dir`` (created if missing) or raise :class:`DataDirLockedError`."""
        os.makedirs(data_dir, exist_ok=True)
        path = os.path.join(data_dir, LOCK_FILE)
        fd = os.open(path, os.O_RDWR | os.O_CREAT, 0o644)
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            holder = _holder(fd)
            os.close(fd)
            raise DataDirLockedError(
                f"data directory {os.path.abspath(data_dir)} is in use by another process "
                f"({holder}); stop it first, or use another data directory"
            ) from None
        except BaseException:
            os.close(fd)
            raise
        os.ftruncate(fd, 0)
        os.pwrite(fd, f"pid {os.getpid()}, {purpose}\n".encode(), 0)
        return cls(path, fd)

    @property
    def held(self) -> bool:
        return self._fd is not None

    def release(self) -> None:
        """Give the lock up (idempotent). The file stays: removing it could let two takers
        lock two different files of the same name."""
        if self._fd is None:
            return
        fd, self._fd = self._fd, None
        with contextlib.suppress(OSError):
            os.ftruncate(fd, 0)
        os.close(fd)  # closing the last descriptor releases the flock


def _holder(fd: int) -> str:
    """What the lock file says about its holder."""
    try:
        text = os.pread(fd, 200, 0).decode(errors="replace").strip()
    except OSError:
        text = ""
    return text or "pid unknown"
