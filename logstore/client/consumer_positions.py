"""The consumer's position bookkeeping: :class:`Positions` (Kafka's ``SubscriptionState``).

A consumer reads a set of assigned partitions; for each it keeps an
:class:`AssignedPartition`: its *position* (the offset of the next record it
returns; None until resolved), the batches fetched but not yet returned
(``buffer``, in offset order, and ``buffer_end``, the offset the next fetch
starts at once the buffer is drained) and the high-water mark of the last
fetch answer (-1 before any). Positions are the consumer's own state; the
broker keeps none (DESIGN I4).

Resolving a position (:meth:`Positions.init`): the group's committed offset
when the consumer has a ``group_id``, else ``auto_offset_reset``:
``"earliest"`` (the log start offset), ``"latest"`` (the end: the LSO for
read_committed, else the HWM; end offsets are exclusive) or ``"none"``
(:class:`OffsetOutOfRangeError`). The same policy applies when a fetch finds
the position out of range (:meth:`Positions.reset`). Seeking drops the
partition's buffer.

:meth:`Positions.drain` hands out buffered records (up to a count), advancing
positions; a batch list never mixes schemas.

The ``assigned`` dict is shared with the consumer's group coordinator: it is
mutated in place and never rebound.

Thread-safety: none; used from the consumer's polling thread.
"""

from __future__ import annotations

import logging
from collections import deque
from collections.abc import Callable, Iterable, Mapping, Sequence

import pyarrow as pa

from logstore.client.error_mapping import unwrap_items
from logstore.client.rpc import EARLIEST_TIMESTAMP, LATEST_TIMESTAMP, BrokerClient
from logstore.errors import OffsetOutOfRangeError
from logstore.types import ListedOffset, TopicPartition

__all__ = ["AssignedPartition", "Positions"]

log = logging.getLogger("logstore.client.consumer")


class AssignedPartition:
    """Per-partition state: position, fetched-but-unreturned batches, last known HWM."""

    __slots__ = ("position", "buffer", "buffer_end", "high_watermark")

    def __init__(self) -> None:
        self.position: int | None = None
        self.buffer: deque[pa.RecordBatch] = deque()
        self.buffer_end = -1
        self.high_watermark = -1

    def clear(self) -> None:
        self.buffer.clear()
        self.buffer_end = -1


class Positions:
    """The assigned partitions of one consumer and their positions; see the module docstring.

    ``check_open`` raises if the consumer is closed (called before each
    ListOffsets request).
    """

    def __init__(
        self,
        client: BrokerClient,
        *,
        isolation_level: str,
        auto_offset_reset: str,
        group_id: str | None,
        check_open: Callable[[], None],
    ) -> None:
        self._client = client
        self._isolation_level = isolation_level
        self._auto_offset_reset = auto_offset_reset
        self._group_id = group_id
        self._check_open = check_open
        self.assigned: dict[TopicPartition, AssignedPartition] = {}

    def assign(self, partitions: list[TopicPartition]) -> None:
        """Exactly ``partitions`` from now on; those that stay keep their state."""
        states = {tp: self.assigned.get(tp) or AssignedPartition() for tp in partitions}
        self.assigned.clear()
        self.assigned.update(states)

    def add(self, partitions: list[TopicPartition]) -> None:
        """Own ``partitions`` too (a group assignment) and resolve their positions."""
        for tp in partitions:
            self.assigned[tp] = AssignedPartition()
        self.init(partitions)

    def state(self, tp: TopicPartition) -> AssignedPartition:
        try:
            return self.assigned[tp]
        except KeyError:
            raise ValueError(f"{tp} is not assigned to this consumer; call assign() first") from None

    def targets(self, partitions: Sequence[TopicPartition]) -> list[TopicPartition]:
        """``partitions`` (default: every assigned one), each checked to be assigned."""
        targets = list(partitions) or list(self.assigned)
        for tp in targets:
            self.state(tp)
        return targets

    def seek(self, tp: TopicPartition, offset: int) -> None:
        """Make ``offset`` the next offset returned from ``tp``."""
        if not isinstance(offset, int) or offset < 0:
            raise ValueError(f"offset must be a non-negative int, got {offset!r}")
        state = self.state(tp)
        state.position = offset
        state.clear()

    def seek_to(self, targets: list[TopicPartition], which: int) -> None:
        """Seek to the start (EARLIEST_TIMESTAMP) or end (LATEST_TIMESTAMP) of each target."""
        for tp, offset in self.bounds(targets, which).items():
            self.seek(tp, offset)

    def list_offsets(self, timestamps: Mapping[TopicPartition, int]) -> dict[TopicPartition, ListedOffset]:
        """ListOffsets, with an error for a partition raised as its :class:`LogstoreError`."""
        if not timestamps:
            return {}
        self._check_open()
        return unwrap_items(timestamps, self._client.list_offsets(timestamps, isolation_level=self._isolation_level),
                            what="offset")

    def bounds(self, partitions: Iterable[TopicPartition], which: int) -> dict[TopicPartition, int]:
        """The start (EARLIEST_TIMESTAMP) or end (LATEST_TIMESTAMP) offset of each partition."""
        found = self.list_offsets(dict.fromkeys(partitions, which))
        return {tp: listed.offset if listed.offset is not None else 0 for tp, listed in found.items()}

    def reset(self, partitions: list[TopicPartition], *, reason: str = "") -> None:
        """Give ``partitions`` a position by ``auto_offset_reset`` (raise for "none")."""
        if not partitions:
            return
        if self._auto_offset_reset == "none":
            tp = partitions[0]
            why = reason or f"{tp} has no position"
            raise OffsetOutOfRangeError(
                f"{why} and auto_offset_reset is 'none'; call seek(), seek_to_beginning() or "
                "seek_to_end(), or set auto_offset_reset to 'earliest' or 'latest'"
            )
        which = EARLIEST_TIMESTAMP if self._auto_offset_reset == "earliest" else LATEST_TIMESTAMP
        for tp, offset in self.bounds(partitions, which).items():
            if reason:
                log.warning("%s; resetting to the %s offset %d", reason, self._auto_offset_reset, offset)
            self.seek(tp, offset)

    def skip_lost(self, tp: TopicPartition, end: int, *, reason: str) -> None:
        """The position of ``tp`` is inside offsets the broker lost (an operator accepted the
        loss, see ``logstore partitions recover``): raise for ``auto_offset_reset="none"``,
        else warn (data loss) and go on at ``end``, where the log continues."""
        if self._auto_offset_reset == "none":
            raise OffsetOutOfRangeError(f"{reason} and auto_offset_reset is 'none'; seek() past the gap")
        log.warning("%s: data loss; skipping to offset %d", reason, end)
        self.seek(tp, end)

    def init(self, partitions: list[TopicPartition]) -> None:
        """Positions for ``partitions``: the group's committed offsets, else ``auto_offset_reset``."""
        if not partitions:
            return
        if self._group_id is not None:
            committed = self._client.groups.fetch_committed_offsets(self._group_id, partitions)
            for tp in partitions:
                found = committed.get(tp)
                if found is not None:
                    self.seek(tp, found.offset)
            partitions = [tp for tp in partitions if self.assigned[tp].position is None]
            reason = (f"no committed offset for {partitions[0]} in group {self._group_id!r}"
                      if partitions else "")
            self.reset(partitions, reason=reason if self._auto_offset_reset == "none" else "")
            return
        self.reset(partitions)

    def init_missing(self) -> None:
        """Resolve the position of every assigned partition that has none."""
        self.init([tp for tp, s in self.assigned.items() if s.position is None])

    def drain(self, limit: int) -> dict[TopicPartition, list[pa.RecordBatch]]:
        """Take up to ``limit`` buffered records, advancing positions."""
        out: dict[TopicPartition, list[pa.RecordBatch]] = {}
        for tp, state in self.assigned.items():
            if limit <= 0:
                break
            taken: list[pa.RecordBatch] = []
            while state.buffer and limit > 0:
                rb = state.buffer[0]
                if taken and not rb.schema.equals(taken[0].schema):
                    break
                if rb.num_rows <= limit:
                    state.buffer.popleft()
                    part = rb
                else:
                    part = rb.slice(0, limit)
                    state.buffer[0] = rb.slice(limit)
                taken.append(part)
                limit -= part.num_rows
                state.position = int(part.column(0)[part.num_rows - 1].as_py()) + 1
            if not state.buffer and state.buffer_end >= 0:
                state.position = max(state.position or 0, state.buffer_end)
                state.buffer_end = -1
            if taken:
                out[tp] = taken
        return out
