"""Small durable-file helpers shared by the storage layer.

Thread-safety: functions are safe to call concurrently for different paths.
"""

from __future__ import annotations

import hashlib
import os

__all__ = ["write_atomically", "fsync_dir", "read_text_or", "tmp_path_for", "NAME_MAX"]

TMP_SUFFIX = ".tmp"
# The longest file name (bytes) of the file systems we run on (ext4, xfs, tmpfs, btrfs).
NAME_MAX = 255


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
    tmp = tmp_path_for(path)
    with open(tmp, "wb") as f:
        f.write(data)
        f.flush()
        os.fsync(f.fileno())
    os.replace(tmp, path)
    fsync_dir(os.path.dirname(path) or ".")


def tmp_path_for(path: str) -> str:
    """The temp file :func:`write_atomically` uses for ``path``: ``<name>.tmp``, or when that
    name would exceed :data:`NAME_MAX` bytes (a 249-character topic's ``<topic>.json``), the
    name cut short plus a digest of the whole name; either way it ends with ``.tmp``."""
    directory, name = os.path.split(path)
    tmp = name + TMP_SUFFIX
    if len(tmp.encode()) <= NAME_MAX:
        return os.path.join(directory, tmp)
    raw = name.encode()
    digest = hashlib.sha256(raw).hexdigest()[:16]
    short = raw[:200].decode(errors="ignore")
    return os.path.join(directory, f"{short}.{digest}{TMP_SUFFIX}")


def read_text_or(path: str, default: str) -> str:
    """The file's text, or ``default`` when it does not exist."""
    try:
        with open(path, encoding="utf-8") as f:
            return f.read()
    except FileNotFoundError:
        return default
