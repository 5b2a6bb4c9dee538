"""The cleaner checkpoint: how far a partition has been compacted.

File in a partition directory
-----------------------------
``cleaner-offset-checkpoint``
    The *first dirty offset* as a decimal line, replaced atomically (temp
    file, fsync, rename) by every successful segment swap
    (:mod:`logstore.storage.segment_replacement`): the segments wholly below
    it have been compacted. Absent (or unreadable) = nothing was compacted
    yet. It only steers *when* to compact (the dirty ratio, see
    :mod:`logstore.storage.cleanable`); losing it never loses data.

Crash behaviour: the file is either the old or the new line, never torn.

Thread-safety: plain file reads and atomic replacements; no state.
"""

from __future__ import annotations

import logging
import os

from logstore.storage.fileutil import read_text_or, write_atomically

__all__ = ["CLEANER_CHECKPOINT_FILE", "read_cleaner_checkpoint", "write_cleaner_checkpoint"]

log = logging.getLogger("logstore.storage.cleaner_checkpoint")

CLEANER_CHECKPOINT_FILE = "cleaner-offset-checkpoint"


def read_cleaner_checkpoint(directory: str) -> int | None:
    """The first dirty offset recorded in ``directory``, or None when there is none."""
    text = read_text_or(os.path.join(directory, CLEANER_CHECKPOINT_FILE), "").strip()
    if not text:
        return None
    try:
        return int(text)
    except ValueError:
        log.warning("%s: ignoring an unreadable cleaner checkpoint %r", directory, text[:40])
        return None


def write_cleaner_checkpoint(directory: str, offset: int) -> None:
    """Record ``offset`` as the first dirty offset, atomically (temp file, fsync, rename)."""
    write_atomically(os.path.join(directory, CLEANER_CHECKPOINT_FILE), f"{offset}\n".encode())
