"""The compaction RPCs of the broker: DescribeCleaning and ReplaceSegments.

:class:`CleaningRpcs` is a handler the broker composes (its collaborators are
constructor arguments: the log manager, where partitions are led, the I/O pool and the
:class:`~logstore.broker.rpc_gate.RpcGate`). DescribeCleaning reports each partition's cleanable range
(:func:`logstore.storage.cleanable.cleaning_state`) so the Spark compaction job
can plan; ReplaceSegments receives the job's compacted segments as a
client stream and swaps them in through
:class:`logstore.storage.segment_replacement.SegmentReplacement` (the commit
point and crash recovery are storage's; see that module). On a cluster the
job compacts every replica: the leader's first, then each follower's own
segments (``follower`` in the request) with the leader's compacted batches of
that range — stored batches are the same bytes on every replica, only segment
boundaries differ.

Thread-safety: handlers run on the event loop; file work runs on the I/O pool.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Awaitable, Callable
from concurrent.futures import Future, ThreadPoolExecutor
from typing import TYPE_CHECKING, Any, TypeVar

import grpc

from logstore._proto import logstore_pb2 as pb
from logstore.broker.rpc_errors import error_to_pb
from logstore.cleaning import CleanableSegment
from logstore.errors import InvalidRequestError, LogstoreError
from logstore.storage.cleanable import cleaning_state
from logstore.storage.log_manager import LogManager
from logstore.storage.segment_replacement import SegmentReplacement

if TYPE_CHECKING:
    from logstore.broker.placement import Placement
    from logstore.broker.rpc_gate import RpcGate

__all__ = ["CleaningRpcs"]

T = TypeVar("T")
log = logging.getLogger("logstore.broker")


class CleaningRpcs:
    """The compaction RPCs; see the module docstring. ``leader(topic, partition)`` is the
    partition this broker leads (the errors of KIP-320 otherwise); ``io`` the broker's I/O
    pool (a replacement's abort is submitted there even when the call was cancelled)."""

    def __init__(self, *, manager: LogManager, placement: Placement, io: ThreadPoolExecutor,
                 gate: RpcGate) -> None:
        self._manager = manager
        self._placement = placement
        self._io = io
        self._gate = gate

    def rpcs(self) -> dict[str, Callable[..., Awaitable[Any]]]:
        """The RPCs this handler implements, by name."""
        return {"DescribeCleaning": self.DescribeCleaning, "ReplaceSegments": self.ReplaceSegments}

    async def DescribeCleaning(self, request: pb.DescribeCleaningRequest, context: grpc.aio.ServicerContext) -> pb.DescribeCleaningResponse:
        """Per-partition cleaning state (:class:`logstore.cleaning.CleaningState`) of the named topics,
        or of every topic whose cleanup.policy includes compact."""
        async def body() -> pb.DescribeCleaningResponse:
            principal = self._gate.principal(context)
            now_ms = request.now_ms or int(time.time() * 1000)
            names = list(request.topics) or [t.name for t in self._manager.topics() if t.config.compact
                                             and self._gate.allowed(principal, "DESCRIBE", "TOPIC", t.name)]
            out = []
            for name in names:
                try:
                    self._gate.check(principal, "DESCRIBE", "TOPIC", name)
                except LogstoreError as e:
                    out.append(pb.TopicCleaning(name=name, error=error_to_pb(e)))
                    continue
                out.append(await self._gate.run_io(self._topic_cleaning, name, now_ms))
            return pb.DescribeCleaningResponse(topics=out)
        return await self._gate.guard("DescribeCleaning", context, body)

    def _topic_cleaning(self, name: str, now_ms: int) -> pb.TopicCleaning:
        try:
            info = self._manager.topic(name)
            parts = self._manager.partitions_of(name)
        except LogstoreError as e:
            return pb.TopicCleaning(name=name, error=error_to_pb(e))
        cfg = info.config
        out = pb.TopicCleaning(
            name=name, cleanup_policy=cfg.cleanup_policy, min_cleanable_dirty_ratio=cfg.min_cleanable_dirty_ratio,
            delete_retention_ms=cfg.delete_retention_ms, min_compaction_lag_ms=cfg.min_compaction_lag_ms,
            segment_bytes=cfg.segment_bytes,
        )
        for part in parts:
            try:
                s = cleaning_state(part.log, last_stable_offset=part.last_stable_offset, now_ms=now_ms)
            except LogstoreError as e:
                out.partitions.append(pb.PartitionCleaning(partition=part.partition, error=error_to_pb(e)))
                continue
            out.partitions.append(pb.PartitionCleaning(
                partition=part.partition, log_start_offset=s.log_start_offset, log_end_offset=s.log_end_offset,
                last_stable_offset=s.last_stable_offset, active_segment_base=s.active_segment_base,
                first_dirty_offset=s.first_dirty_offset, cleanable_end_offset=s.cleanable_end_offset,
                clean_bytes=s.clean_bytes, dirty_bytes=s.dirty_bytes, dirty_ratio=s.dirty_ratio,
                segments=[pb.CleanableSegment(base_offset=g.base_offset, next_offset=g.next_offset,
                                              size_bytes=g.size_bytes, max_timestamp=g.max_timestamp)
                          for g in s.segments],
                in_progress=s.in_progress,
            ))
        return out

    async def ReplaceSegments(self, request_iterator: Any, context: grpc.aio.ServicerContext) -> pb.ReplaceSegmentsResponse:
        """Client-streaming swap of closed segments for compacted ones (logstore.storage.segment_replacement).

        A stream that ends early, a failed check or a cancelled call discards
        what was written; only a complete, valid replacement of unchanged
        segments is swapped in.
        """
        async def body() -> pb.ReplaceSegmentsResponse:
            requests = request_iterator.__aiter__()
            try:
                first = await requests.__anext__()
            except StopAsyncIteration:
                raise InvalidRequestError("ReplaceSegments: empty stream; the first message must be begin") from None
            if first.WhichOneof("part") != "begin":
                raise InvalidRequestError("ReplaceSegments: the first message must be begin")
            begin = first.begin
            self._gate.check(self._gate.principal(context), "ALTER", "TOPIC", begin.topic)
            # A follower's replica takes the leader's compacted batches for its own segments below its
            # own last stable offset, which never passes its HWM: the records there are the leader's.
            part = (self._manager.partition(begin.topic, begin.partition) if begin.follower
                    else self._placement.leader(begin.topic, begin.partition))
            config = part.log.config
            if not config.compact:
                raise InvalidRequestError(
                    f"topic {begin.topic!r} has cleanup.policy={config.cleanup_policy}; only topics whose "
                    "cleanup.policy includes compact can be compacted"
                )
            replaced = [CleanableSegment(s.base_offset, s.next_offset, s.size_bytes, s.max_timestamp)
                        for s in begin.segments]
            replacement = await self._begin_replacement(lambda: SegmentReplacement.begin(
                part.log, replaced=replaced, end_offset=begin.end_offset, checkpoint=begin.cleaner_checkpoint,
            ))
            try:
                chunks, ended = 0, False
                async for message in requests:
                    kind = message.WhichOneof("part")
                    if ended or kind not in ("chunk", "end"):
                        raise InvalidRequestError("ReplaceSegments: begin, then chunks, then end")
                    if kind == "end":
                        if message.end.chunks != chunks:
                            raise InvalidRequestError(f"ReplaceSegments: end says {message.end.chunks} chunks, "
                                                      f"{chunks} came; nothing was replaced")
                        ended = True
                        continue
                    chunks += 1
                    await self._gate.run_io(replacement.add, message.chunk.schema, message.chunk.records)
                if not ended:  # an abandoned stream can read as ended here: never swap a part in
                    raise InvalidRequestError("ReplaceSegments: the stream ended without its end message; "
                                              "nothing was replaced")
                new = await self._gate.run_io(lambda: part.log.replace_segments(
                    replacement, max_end_offset=part.last_stable_offset))
            finally:
                await self._discard(replacement)
            before = sum(s.size_bytes for s in replaced)
            after = sum(s.size for s in new)
            log.info("compacted %s-%d: %d segments, %d bytes -> %d segments, %d bytes (%d records)",
                     begin.topic, begin.partition, len(replaced), before, len(new), after, replacement.records)
            return pb.ReplaceSegmentsResponse(
                new_base_offsets=[s.base_offset for s in new], bytes_before=before, bytes_after=after,
                batches=replacement.batches, records=replacement.records,
                cleaner_checkpoint=replacement.checkpoint,
            )
        return await self._gate.guard("ReplaceSegments", context, body)

    async def _begin_replacement(self, begin: Callable[[], SegmentReplacement]) -> SegmentReplacement:
        """Run ``begin`` on the I/O pool; when this call is cancelled meanwhile
        (the client went away), ``begin`` never runs if it still waits for a
        pool thread, else the replacement it returns is aborted, so the
        partition is not left marked as being compacted."""
        started = self._io.submit(begin)
        try:
            return await asyncio.shield(asyncio.wrap_future(started))
        except asyncio.CancelledError:
            if not started.cancel():  # not still queued: abort what it begins, on the pool thread
                started.add_done_callback(_abort_begun)
            raise

    async def _discard(self, replacement: SegmentReplacement) -> None:
        """Abort ``replacement`` on the I/O pool (a no-op after its commit). A cancelled call
        does not cancel the abort, even while it still waits for a pool thread: before, a busy
        pool left the partition marked as being compacted until the broker restarted."""
        await asyncio.shield(asyncio.wrap_future(self._io.submit(replacement.abort)))


def _abort_begun(started: Future[SegmentReplacement]) -> None:
    if not started.cancelled() and started.exception() is None:
        started.result().abort()
