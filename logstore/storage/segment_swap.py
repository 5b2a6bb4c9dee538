"""The on-disk half of a segment swap: its files, its commit point, rolling it
forward, and recovering one a crash interrupted.

:mod:`logstore.storage.segment_replacement` writes replacement segments and
decides *whether* to swap them in; this module owns the files that make the
swap atomic and the steps that are repeated after a crash. It knows nothing
of logs: it works on a partition directory.

Files in a partition directory
------------------------------
``<base>.arrow.cleaned``, ``<base>.index.cleaned``, ``<base>.timeindex.cleaned``
    A replacement segment being written: same formats as a segment
    (:mod:`logstore.storage.segment`, :mod:`logstore.storage.index`). Never part of the log.
``<base>.arrow.swap``, ``<base>.index.swap``, ``<base>.timeindex.swap``
    A complete, fsynced replacement segment, renamed from ``.cleaned`` just
    before the commit point.
``swap-manifest``
    The commit record of one swap, JSON written atomically::

        {"version": 1, "replaced": [base offsets of the replaced segments],
         "segments": [base offsets of the replacement segments], "checkpoint": 1234}
``cleaner-offset-checkpoint``
    See :mod:`logstore.storage.cleaner_checkpoint`; written by step 5.

Commit and roll forward (steps 4 and 5 of the swap protocol in
:mod:`logstore.storage.segment_replacement`)
----------------------------------------------------------------------------
4. ``swap-manifest`` is written atomically: **the commit point**
   (:func:`commit_swap`).
5. Roll forward: the replaced segments' files whose base offset is not a
   replacement's are deleted; every ``.swap`` file is renamed over its final
   name (replacing the replaced segment of the same base offset); fsync the
   directory; write the cleaner checkpoint; remove ``swap-manifest``; fsync.

Crash behaviour
---------------
:func:`recover_interrupted_swap` runs when a log opens, before its segments are
listed. With a ``swap-manifest`` it repeats step 5 (each step is idempotent,
so a crash during recovery is recovered the same way); without one it deletes
every ``.cleaned`` and ``.swap`` file: the swap did not commit and the
replaced segments were never touched. A crash at any moment therefore leaves
either all the old or all the new segments, never a mix.

Test seam: :func:`set_swap_hook` installs a function called with a step name
at every step of a swap and of its recovery, so crash tests can fail or exit
right after any of them.

Thread-safety: the functions hold no state of their own; the caller makes
sure one swap per directory runs at a time (the log's lock, or the log being
opened).
"""

from __future__ import annotations

import contextlib
import json
import logging
import os
from collections.abc import Callable

from logstore.errors import CorruptRecordError
from logstore.storage.cleaner_checkpoint import write_cleaner_checkpoint
from logstore.storage.fileutil import fsync_dir, read_text_or, write_atomically
from logstore.storage.segment import (
    INDEX_SUFFIX,
    SEGMENT_SUFFIX,
    TIMEINDEX_SUFFIX,
    segment_file_name,
)

__all__ = [
    "SWAP_MANIFEST_FILE",
    "CLEANED_SUFFIX",
    "SWAP_SUFFIX",
    "SEGMENT_FILE_SUFFIXES",
    "commit_swap",
    "recover_interrupted_swap",
    "remove_leftovers",
    "run_swap_hook",
    "set_swap_hook",
]

log = logging.getLogger("logstore.storage.segment_swap")

SWAP_MANIFEST_FILE = "swap-manifest"
CLEANED_SUFFIX = ".cleaned"
SWAP_SUFFIX = ".swap"
_MANIFEST_VERSION = 1
# A segment's files; the data file last, so it is renamed after its indexes.
SEGMENT_FILE_SUFFIXES = (INDEX_SUFFIX, TIMEINDEX_SUFFIX, SEGMENT_SUFFIX)


# --------------------------------------------------------------------------- test hook

SwapHook = Callable[[str], None]
_swap_hook: SwapHook | None = None


def set_swap_hook(hook: SwapHook | None) -> SwapHook | None:
    """Install ``hook`` (called with a step name at every step of a swap and of its
    recovery, e.g. ``"manifest-written"``); return the previous one.

    For crash tests only: a hook that raises, or calls ``os._exit``, simulates a
    failure or a crash right after that step.
    """
    global _swap_hook
    previous, _swap_hook = _swap_hook, hook
    return previous


def run_swap_hook(step: str) -> None:
    """Call the hook :func:`set_swap_hook` installed, if any, with ``step``."""
    if _swap_hook is not None:
        _swap_hook(step)


# --------------------------------------------------------------------------- commit and roll forward


def commit_swap(directory: str, *, replaced: list[int], segments: list[int], checkpoint: int) -> None:
    """Steps 4 and 5: write ``swap-manifest`` (the commit point) naming the base offsets
    of the ``replaced`` segments and of the replacement ``segments`` (whose ``.swap``
    files are complete and fsynced), then roll forward."""
    manifest = {
        "version": _MANIFEST_VERSION,
        "replaced": replaced,
        "segments": segments,
        "checkpoint": checkpoint,
    }
    write_atomically(os.path.join(directory, SWAP_MANIFEST_FILE), json.dumps(manifest).encode())
    run_swap_hook("manifest-written")
    _roll_forward(directory, manifest)


def remove_leftovers(directory: str) -> list[str]:
    """Delete ``.cleaned`` and ``.swap`` files (an uncommitted swap's); return their names."""
    names = sorted(n for n in os.listdir(directory) if n.endswith((CLEANED_SUFFIX, SWAP_SUFFIX)))
    for name in names:
        with contextlib.suppress(FileNotFoundError):
            os.remove(os.path.join(directory, name))
    if names:
        fsync_dir(directory)
    return names


def _roll_forward(directory: str, manifest: dict[str, object]) -> None:
    """Step 5 of the swap protocol, idempotent: what remains to do after the commit point."""
    replaced = [int(b) for b in manifest["replaced"]]  # type: ignore[attr-defined]
    segments = [int(b) for b in manifest["segments"]]  # type: ignore[attr-defined]
    checkpoint = manifest.get("checkpoint")
    new = set(segments)
    for base in replaced:
        if base in new:
            continue
        for suffix in SEGMENT_FILE_SUFFIXES:
            with contextlib.suppress(FileNotFoundError):
                os.remove(os.path.join(directory, segment_file_name(base, suffix)))
        run_swap_hook(f"old-deleted:{base}")
    for base in segments:
        for suffix in SEGMENT_FILE_SUFFIXES:
            final = os.path.join(directory, segment_file_name(base, suffix))
            if os.path.exists(final + SWAP_SUFFIX):
                os.replace(final + SWAP_SUFFIX, final)
        if not os.path.exists(os.path.join(directory, segment_file_name(base))):
            raise CorruptRecordError(
                f"{directory}: {SWAP_MANIFEST_FILE} names replacement segment {base}, but neither "
                f"{segment_file_name(base)}{SWAP_SUFFIX} nor {segment_file_name(base)} exists"
            )
        run_swap_hook(f"final-renamed:{base}")
    fsync_dir(directory)
    run_swap_hook("renamed")
    if checkpoint is not None:
        write_cleaner_checkpoint(directory, int(checkpoint))  # type: ignore[call-overload]
        run_swap_hook("checkpoint-written")
    os.remove(os.path.join(directory, SWAP_MANIFEST_FILE))
    fsync_dir(directory)
    run_swap_hook("manifest-removed")


# --------------------------------------------------------------------------- recovery


def recover_interrupted_swap(directory: str) -> str | None:
    """Finish or roll back a swap a crash interrupted in ``directory`` (see the module
    docstring); return ``"completed"``, ``"rolled back"`` or None (nothing to do).

    Raises :class:`CorruptRecordError` when ``swap-manifest`` is unreadable or
    names a replacement segment that is missing (neither can happen without
    outside damage: the manifest is written atomically after its files).
    """
    path = os.path.join(directory, SWAP_MANIFEST_FILE)
    text = read_text_or(path, "")
    if text:
        try:
            manifest = json.loads(text)
            if manifest.get("version") != _MANIFEST_VERSION:
                raise ValueError(f"unknown version {manifest.get('version')!r}")
            [int(b) for b in manifest["replaced"]]
            [int(b) for b in manifest["segments"]]
        except (ValueError, KeyError, TypeError, AttributeError) as e:
            raise CorruptRecordError(f"{path}: unreadable swap manifest ({e})") from None
        log.warning("%s: completing a segment swap interrupted by a crash (segments %s replace %s)",
                    directory, manifest["segments"], manifest["replaced"])
        _roll_forward(directory, manifest)
        return "completed"
    removed = remove_leftovers(directory)
    if removed:
        log.warning("%s: discarded the files of an uncommitted segment swap: %s", directory, removed)
        return "rolled back"
    return None
