"""Where a single broker's producer-id counter starts: never at an id a partition already holds.

``meta/producer-id-block`` holds one decimal number, the end (exclusive) of the
last block of producer ids the broker took (:class:`~logstore.broker.transactions.coordinator.TransactionCoordinator`
writes it, atomically, before it hands out an id of a new block). A start-up
reads it with :func:`producer_id_start`.

The file alone cannot be trusted: lost (a wiped ``meta/``), reset (a restored
backup) or garbage, the broker would hand out ids again, and a new producer
that got an old producer's id has its first batches answered as *duplicates*
of the old producer's, acknowledged and never written (issue 22). So the
start is at least the **floor**: one past the largest producer id any
partition's producer state has seen
(:meth:`~logstore.storage.log_manager.LogManager.producer_id_floor`) and any
transactional id holds (``issued``). When the file is missing, unreadable or
behind the floor, the floor is used (logged, and written back: the file is
written at the first start of a data directory too, so that afterwards a
missing file means a lost one); when, in
addition, some partition is offline (its producer state unknown, so the floor
itself is unknown), the broker refuses to start with
:class:`~logstore.errors.ProducerIdFloorUnknownError` naming the partitions
and the two ways out. A readable file at or above the floor is used as it is.

On a cluster the blocks come from the metadata store (unique across brokers);
the file is then not consulted for safety (``floor`` None), and garbage in it
is ignored.

Thread-safety: called once, at start-up, under the coordinator's lock.
"""

from __future__ import annotations

import logging
import os
from collections.abc import Callable

from logstore.errors import ProducerIdFloorUnknownError
from logstore.storage.fileutil import read_text_or, write_atomically

__all__ = ["ProducerIdFloor", "producer_id_start"]

log = logging.getLogger("logstore.broker.transactions")

# () -> (one past the largest producer id the partitions hold, the partitions that could not say)
ProducerIdFloor = Callable[[], tuple[int, list[str]]]


def producer_id_start(path: str, *, floor: ProducerIdFloor | None, issued: int) -> int:
    """The first producer id this broker may hand out (see the module docstring).

    ``issued`` is one past the largest producer id a loaded transactional id holds.
    Raises :class:`ProducerIdFloorUnknownError` when it cannot be decided.
    """
    stored, problem = _read(path)
    if floor is None:
        return max(stored or 0, issued)
    low, unknown = floor()
    low = max(low, issued)
    if stored is not None and stored >= low:
        return stored
    if problem is None and stored is not None:
        problem = f"it says {stored}, but partitions hold producer ids up to {low - 1}"
    if unknown:
        shown = ", ".join(unknown[:10]) + (f" and {len(unknown) - 10} more" if len(unknown) > 10 else "")
        raise ProducerIdFloorUnknownError(
            f"{path} {problem}, and the producer state of {shown} cannot be read (offline), so the "
            "largest producer id in use cannot be decided; refusing to start rather than hand out a "
            "producer id twice (a reused id makes new records look like duplicates, which are "
            "acknowledged and not written). Repair the offline partitions ('logstore partitions "
            "recover'), or write into the file a number above every producer id ever issued")
    if low > 0 or os.path.exists(path):
        log.warning("%s %s: producer ids start at %d, one past the largest held by the partitions",
                    path, problem, low, extra={"event": "producer_id_floor", "floor": low})
    # Written even on a fresh data directory: from then on a missing file means a lost one.
    os.makedirs(os.path.dirname(path), exist_ok=True)
    write_atomically(path, f"{low}\n".encode())
    return low


def _read(path: str) -> tuple[int | None, str | None]:
    """The file's number (None when missing or unreadable) and what is wrong with it."""
    try:
        text = read_text_or(path, "")
    except (OSError, ValueError) as e:  # a directory, unreadable, not UTF-8
        return None, f"cannot be read ({type(e).__name__}: {e})"
    if not text.strip():
        return None, "is missing or empty"
    try:
        value = int(text.strip())
    except ValueError:
        return None, f"is not a number ({text.strip()[:40]!r})"
    if value < 0:
        return None, f"holds a negative number ({value})"
    return value, None
