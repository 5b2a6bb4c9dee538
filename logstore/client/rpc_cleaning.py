"""The compaction job's calls of :class:`~logstore.client.rpc.BrokerClient`:
what is cleanable (DescribeCleaning) and the atomic segment swap (ReplaceSegments).

A mixin, so ``rpc.py`` stays one concept per module; the calls share the
client's deadlines, routing and error mapping (``_call``).
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Sequence
from typing import Any

from logstore._proto import logstore_pb2 as pb
from logstore.client import messages
from logstore.client.results import CleanableSegment, ReplacedSegments, TopicCleaning
from logstore.client.routing import Router
from logstore.errors import LogstoreError
from logstore.types import TopicPartition

__all__ = ["CleaningCalls"]


class CleaningCalls:
    """DescribeCleaning and ReplaceSegments (mixin of BrokerClient)."""

    _router: Router
    _call: Callable[..., Any]
    _deadline_s: Callable[..., float]

    def describe_cleaning(
        self, topics: Sequence[str] | None = None, *, now_ms: int | None = None,
        timeout_ms: int | None = None,
    ) -> dict[str, TopicCleaning | LogstoreError]:
        """Cleaning state of ``topics`` (None or empty = every topic whose cleanup.policy
        includes compact), or each topic's error. ``now_ms`` is the clock for
        ``min.compaction.lag.ms`` (default: the broker's). A partition that could
        not be described carries its error in ``PartitionCleaning.error``."""
        response = self._call(
            "DescribeCleaning", pb.DescribeCleaningRequest(topics=list(topics or ()), now_ms=now_ms or 0),
            timeout_s=self._deadline_s(timeout_ms),
        )
        return {t.name: messages.topic_cleaning(t) for t in response.topics}

    def replace_segments(
        self,
        tp: TopicPartition,
        *,
        segments: Sequence[CleanableSegment],
        end_offset: int,
        chunks: Iterable[tuple[bytes, bytes]],
        cleaner_checkpoint: int = -1,
        timeout_ms: int = 600_000,
    ) -> ReplacedSegments:
        """Replace the consecutive closed ``segments`` of ``tp`` (ending where the segment
        at ``end_offset`` starts) with a compacted copy, atomically.

        ``chunks`` yields ``(schema_message, records)`` pairs streamed to the broker
        as they are produced: a stored schema message (empty = unchanged) and
        whole stored batch messages in offset order, with their original offsets
        and CRCs. Raises :class:`CompactionConflictError` (retriable; nothing
        changed) when the segments changed meanwhile or another compaction of the
        partition runs, other errors as mapped; an exception raised by ``chunks``
        cancels the call (the broker discards what it got) and is re-raised.
        """
        failure: list[BaseException] = []

        def requests() -> Iterable[pb.ReplaceSegmentsRequest]:
            yield messages.replace_segments_begin(tp, segments, end_offset=end_offset,
                                         cleaner_checkpoint=cleaner_checkpoint)
            try:
                for schema, records in chunks:
                    yield pb.ReplaceSegmentsRequest(chunk=pb.ReplacementChunk(schema=schema, records=records))
            except BaseException as e:
                failure.append(e)
                raise

        try:
            r = self._call("ReplaceSegments", requests(), timeout_s=self._deadline_s(timeout_ms),
                           conn=self._router.route(tp)[0])
        except LogstoreError:
            if failure:
                raise failure[0] from None
            raise
        return messages.replaced_segments(r)
