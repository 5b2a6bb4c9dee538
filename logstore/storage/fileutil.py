"""Small durable-file helpers shared by the storage layer.

Thread-safety: functions are safe to call concurrently for different paths.
"""

from __future__ import annotations

import os

__all__ = ["write_atomically", "fsync_dir", "read_text_or"]

TMP_SUFFIX = ".tmp"


def fsync_dir(directory: str) -> None:
    """fsync a directory so that creates, renames and deletes in it are durable."""
    fd = os.open(directory, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def write_atomically(path: str, data: bytes) -> None:
    """Replace ``path`` with ``data``: write a temp file, fsync, rename, fsync the directory.

    After a crash ``path`` holds either the old or the new content, never a mix.
    """
    tmp = path + TMP_SUFFIX
    with open(tmp, "wb") as f:
        f.write(data)
        f.flush()
        os.fsync(f.fileno())
    os.replace(tmp, path)
    fsync_dir(os.path.dirname(path) or ".")


def read_text_or(path: str, default: str) -> str:
    """The file's text, or ``default`` when it does not exist."""
    try:
        with open(path, encoding="utf-8") as f:
            return f.read()
    except FileNotFoundError:
        return default
