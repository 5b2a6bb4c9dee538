"""The compaction job's calls, ``BrokerClient.cleaning``: what is cleanable
(DescribeCleaning) and the atomic segment swap (ReplaceSegments).

A part of :class:`~logstore.client.rpc.BrokerClient` of its own, so ``rpc.py``
stays one concept per module; the calls share the client's deadlines, routing
and error mapping through the :class:`~logstore.client.transport.Transport`
they are given.

Thread-safety: as :class:`~logstore.client.rpc.BrokerClient`.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence

from logstore._proto import logstore_pb2 as pb
from logstore.client import messages
from logstore.client.results import CleanableSegment, ReplacedSegments, TopicCleaning
from logstore.client.transport import Transport
from logstore.errors import LogstoreError
from logstore.types import TopicPartition

__all__ = ["CleaningRpcs"]


class CleaningRpcs:
    """DescribeCleaning and ReplaceSegments, sent through ``transport``."""

    def __init__(self, transport: Transport) -> None:
        self._transport = transport

    def describe_cleaning(
        self, topics: Sequence[str] | None = None, *, now_ms: int | None = None,
        timeout_ms: int | None = None,
    ) -> dict[str, TopicCleaning | LogstoreError]:
        """Cleaning state of ``topics`` (None or empty = every topic whose cleanup.policy
        includes compact), or each topic's error. ``now_ms`` is the clock for
        ``min.compaction.lag.ms`` (default: the broker's). A partition that could
        not be described carries its error in ``PartitionCleaning.error``."""
        response = self._transport.call(
            "DescribeCleaning", pb.DescribeCleaningRequest(topics=list(topics or ()), now_ms=now_ms or 0),
            timeout_s=self._transport.deadline_s(timeout_ms),
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
        follower: bool = False,
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
        ``follower``: replace the home broker's own replica (a follower's, on a cluster)
        instead of the leader's.
        """
        failure: list[BaseException] = []

        def requests() -> Iterable[pb.ReplaceSegmentsRequest]:
            yield messages.replace_segments_begin(tp, segments, end_offset=end_offset,
                                                  cleaner_checkpoint=cleaner_checkpoint, follower=follower)
            sent = 0
            try:
                for schema, records in chunks:
                    yield pb.ReplaceSegmentsRequest(chunk=pb.ReplacementChunk(schema=schema, records=records))
                    sent += 1
            except BaseException as e:
                failure.append(e)
                raise
            # Only this makes the broker swap: a stream cut short can look ended to it.
            yield pb.ReplaceSegmentsRequest(end=pb.ReplaceSegmentsEnd(chunks=sent))

        try:
            r = self._transport.call("ReplaceSegments", requests(), timeout_s=self._transport.deadline_s(timeout_ms),
                                     conn=None if follower else self._transport.router.route(tp)[0])
        except LogstoreError:
            if failure:
                raise failure[0] from None
            raise
        return messages.replaced_segments(r)
