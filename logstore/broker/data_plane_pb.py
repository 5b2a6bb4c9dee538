"""The gRPC front end's side of the data plane: protobuf requests in, protobuf answers out.

The data plane (:mod:`logstore.broker.data_plane`) speaks in plain values; this module
converts at the edge, once: a ``FetchRequest`` into
:class:`~logstore.broker.data_plane.params.FetchParams` (the wait clamped, a consumer's
to 60 s and a follower's to 30 s; the isolation level into its enum), and the answers
back into the messages the wire codec (:mod:`logstore.wire`) encodes.

Thread-safety: pure functions.
"""

from __future__ import annotations

from collections.abc import Sequence

from logstore._proto import logstore_pb2 as pb
from logstore.broker.data_plane import (
    FetchParams,
    FetchPartition,
    Isolation,
    PartitionAppend,
    PartitionRead,
)
from logstore.broker.rpc_errors import error_to_pb

__all__ = ["appends_to_pb", "fetch_params_from_pb", "reads_to_pb"]

_CONSUMER_MAX_WAIT_MS = 60_000
_REPLICA_MAX_WAIT_MS = 30_000


def fetch_params_from_pb(request: pb.FetchRequest) -> FetchParams:
    """A ``FetchRequest`` (a consumer's, or a follower's with ``replica_id``) as the data plane's params."""
    replica_id = request.replica_id if request.HasField("replica_id") else None
    cap_ms = _CONSUMER_MAX_WAIT_MS if replica_id is None else _REPLICA_MAX_WAIT_MS
    return FetchParams(
        partitions=tuple(FetchPartition(p.topic, p.partition, p.fetch_offset, p.partition_max_bytes,
                                        p.current_leader_epoch) for p in request.partitions),
        max_wait_s=min(max(request.max_wait_ms, 0), cap_ms) / 1000,
        min_bytes=max(request.min_bytes, 0),
        max_bytes=request.max_bytes,
        isolation=Isolation.READ_COMMITTED if request.isolation_level == pb.READ_COMMITTED
        else Isolation.READ_UNCOMMITTED,
        replica_id=replica_id,
    )


def reads_to_pb(reads: Sequence[PartitionRead]) -> list[tuple[pb.FetchPartitionResponse, memoryview]]:
    """Each partition's answer without its records, and the records (for :func:`logstore.wire.encode_fetch_response`)."""
    out = []
    for r in reads:
        resp = pb.FetchPartitionResponse(
            topic=r.topic, partition=r.partition, next_offset=r.next_offset, high_watermark=r.high_watermark,
            last_stable_offset=r.last_stable_offset, log_start_offset=r.log_start_offset, schema=r.schema,
            aborted_transactions=[pb.AbortedTransaction(producer_id=a.producer_id, first_offset=a.first_offset)
                                  for a in r.aborted])
        if r.error is not None:
            resp.error.CopyFrom(error_to_pb(r.error))
        out.append((resp, r.records))
    return out


def appends_to_pb(appends: Sequence[PartitionAppend]) -> pb.ProduceResponse:
    """A produce's answers as a ``ProduceResponse``."""
    out = []
    for a in appends:
        if a.error is not None:
            out.append(pb.ProducePartitionResponse(topic=a.topic, partition=a.partition, error=error_to_pb(a.error)))
        else:
            out.append(pb.ProducePartitionResponse(
                topic=a.topic, partition=a.partition, base_offsets=a.base_offsets,
                log_append_time_ms=a.log_append_time_ms, log_start_offset=a.log_start_offset))
    return pb.ProduceResponse(partitions=out)
