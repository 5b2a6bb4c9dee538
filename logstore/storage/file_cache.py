"""A bounded pool of open segment file descriptors, closed least-recently-used first.

Why: a broker keeps many partitions, each of many segments; keeping one
descriptor per segment lets client-settable configs (small ``segment.bytes``,
many partitions) exhaust the process's descriptor limit, after which every
write fails and even gRPC cannot start. Here every segment file is a
:class:`CachedFile`: a path opened on first use, kept open while recently
used, and closed when more than ``capacity`` descriptors are open. The limit
is process-wide (so is ``RLIMIT_NOFILE``): one :class:`FileCache`,
:func:`default_cache`, serves every log of the process; the broker sizes it
with :func:`configure` from its ``max_open_segment_files`` config.

Use::

    with cached_file as fd:      # pins the descriptor: never closed under a reader
        os.pread(fd, n, position)

A pinned descriptor is never closed by eviction; when every open descriptor
is pinned the pool holds more than ``capacity`` for the moment and closes
the surplus as the pins are released. An ``open`` failing with EMFILE/ENFILE
(the process is out of descriptors for other reasons) closes every unpinned
descriptor of the pool and tries once more.

Identity: the owner calls :meth:`CachedFile.mark_gone` when the path stops
being its file (the segment was deleted by retention or topic deletion, or
replaced by a compaction swap). While its descriptor stays open it keeps
reading the old file, as an open file on POSIX does; once the pool has
closed it, the next use raises :class:`FileGoneError` rather than opening
whatever the path holds now. As a second line, a reopened file whose device
and inode differ from the first open's raises the same (inode numbers can be
reused, so this alone would not do). :meth:`CachedFile.close` (called when the owning segment is
closed or garbage-collected) closes the descriptor as soon as no one pins it.

Thread-safety: all state is guarded by the pool's lock; ``open``/``close``
system calls run under it (they are short), reads and writes on a pinned
descriptor do not.
"""

from __future__ import annotations

import errno
import os
import threading
from collections import OrderedDict

from logstore.errors import StorageError

__all__ = [
    "CachedFile",
    "FileCache",
    "FileGoneError",
    "DEFAULT_MAX_OPEN_SEGMENT_FILES",
    "configure",
    "default_cache",
]

# Well below the common soft limit of 1024 (and far below 65536), leaving room for
# sockets, gRPC's own descriptors and short-lived metadata files.
DEFAULT_MAX_OPEN_SEGMENT_FILES = 256


class FileGoneError(StorageError):
    """A segment file was deleted or replaced while its descriptor was closed (retry the read)."""


class CachedFile:
    """A file opened on demand through a :class:`FileCache`; ``with f as fd`` pins it."""

    __slots__ = ("path", "_cache", "_fd", "_pins", "_identity", "_closed", "_gone", "__weakref__")

    def __init__(self, cache: FileCache, path: str, fd: int = -1) -> None:
        self.path = path
        self._cache = cache
        self._fd = -1
        self._pins = 0
        self._identity: tuple[int, int] | None = None
        self._closed = False
        self._gone = False
        if fd >= 0:
            cache._adopt(self, fd)

    def __enter__(self) -> int:
        return self._cache._pin(self)

    def __exit__(self, *exc: object) -> None:
        self._cache._unpin(self)

    @property
    def is_open(self) -> bool:
        """Whether a descriptor is open now (for tests and metrics)."""
        return self._fd >= 0

    def mark_gone(self) -> None:
        """The path no longer holds this file: never reopen it (the open descriptor stays usable)."""
        self._gone = True

    def close(self) -> None:
        """No more uses: close the descriptor now, or when the last pin is released."""
        self._cache._close(self)

    def __repr__(self) -> str:
        return f"CachedFile({self.path!r}, fd={self._fd}, pins={self._pins})"


class FileCache:
    """At most ``capacity`` unpinned open descriptors, least recently used closed first."""

    def __init__(self, capacity: int = DEFAULT_MAX_OPEN_SEGMENT_FILES) -> None:
        if capacity < 1:
            raise ValueError(f"capacity must be >= 1, got {capacity}")
        self.capacity = capacity
        self._lock = threading.Lock()
        self._open: OrderedDict[CachedFile, None] = OrderedDict()
        self.opens = 0  # descriptors opened so far (a counter for tests and metrics)

    def open_count(self) -> int:
        """Descriptors this pool holds open now."""
        with self._lock:
            return len(self._open)

    def set_capacity(self, capacity: int) -> None:
        if capacity < 1:
            raise ValueError(f"capacity must be >= 1, got {capacity}")
        with self._lock:
            self.capacity = capacity
            self._evict_locked()

    def file(self, path: str, fd: int = -1) -> CachedFile:
        """A :class:`CachedFile` for ``path``; ``fd`` (optional) is an already open descriptor it takes over."""
        return CachedFile(self, path, fd)

    # ------------------------------------------------------------------ internals

    def _adopt(self, f: CachedFile, fd: int) -> None:
        st = os.fstat(fd)
        with self._lock:
            f._fd = fd
            f._identity = (st.st_dev, st.st_ino)
            self._open[f] = None
            self._evict_locked()

    def _pin(self, f: CachedFile) -> int:
        with self._lock:
            if f._fd < 0:
                self._open_locked(f)
            else:
                self._open.move_to_end(f)
            f._pins += 1
            return f._fd

    def _unpin(self, f: CachedFile) -> None:
        with self._lock:
            f._pins -= 1
            if f._pins == 0 and (f._closed or len(self._open) > self.capacity):
                if f._closed:
                    self._close_locked(f)
                else:
                    self._evict_locked()

    def _close(self, f: CachedFile) -> None:
        with self._lock:
            f._closed = True
            if f._pins == 0 and f._fd >= 0:
                self._close_locked(f)

    def _open_locked(self, f: CachedFile) -> None:
        if f._closed:
            raise FileGoneError(f"{f.path}: the segment is closed")
        if f._gone:
            raise FileGoneError(f"{f.path}: the segment was deleted or replaced")
        self._evict_locked(room=1)
        try:
            fd = self._os_open(f.path)
        except FileNotFoundError:
            raise FileGoneError(f"{f.path}: the segment file was deleted") from None
        st = os.fstat(fd)
        identity = (st.st_dev, st.st_ino)
        if f._identity is not None and identity != f._identity:
            os.close(fd)
            raise FileGoneError(f"{f.path}: the segment file was replaced")
        f._identity = identity
        f._fd = fd
        self._open[f] = None
        self.opens += 1

    def _os_open(self, path: str) -> int:
        try:
            return os.open(path, os.O_RDWR)
        except OSError as e:
            if e.errno not in (errno.EMFILE, errno.ENFILE):
                raise
        # Out of descriptors: give back every one we can and try once more.
        for victim in [f for f in self._open if f._pins == 0]:
            self._close_locked(victim)
        return os.open(path, os.O_RDWR)

    def _evict_locked(self, room: int = 0) -> None:
        excess = len(self._open) + room - self.capacity
        if excess <= 0:
            return
        victims = []
        for f in self._open:
            if f._pins == 0:
                victims.append(f)
                if len(victims) >= excess:
                    break
        for f in victims:
            self._close_locked(f)

    def _close_locked(self, f: CachedFile) -> None:
        fd, f._fd = f._fd, -1
        self._open.pop(f, None)
        if fd >= 0:
            os.close(fd)


_default = FileCache()


def default_cache() -> FileCache:
    """The process-wide pool every segment uses."""
    return _default


def configure(max_open_segment_files: int) -> int:
    """Resize the process-wide pool (the broker calls this at start-up); return the capacity.

    The capacity is also held to half the process's soft descriptor limit
    (``RLIMIT_NOFILE``), so a config larger than ``ulimit -n`` allows still
    leaves the other half for sockets, gRPC and metadata files.
    """
    capacity = max_open_segment_files
    try:
        import resource

        soft, _hard = resource.getrlimit(resource.RLIMIT_NOFILE)
        if soft != resource.RLIM_INFINITY:
            capacity = min(capacity, max(1, soft // 2))
    except (ImportError, OSError, ValueError):  # pragma: no cover - not POSIX
        pass
    _default.set_capacity(capacity)
    return capacity
