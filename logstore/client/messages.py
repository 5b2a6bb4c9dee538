"""Protobuf ↔ client values: the requests :class:`~logstore.client.rpc.BrokerClient` builds
and how it reads the answers.

Builders take values of :mod:`logstore.types` and :mod:`logstore.client.results`
and give the request message; readers take an answer and give those values,
each item-level ``Error`` mapped by :func:`~logstore.client.error_mapping.error_from_item`
and returned next to its item (or instead of it, for a topic or group that could
not be described). Produce requests and Fetch answers are in wire form
(:mod:`logstore.wire`): :func:`fetched_partitions` reads the latter, records
staying views of the answer.

Thread-safety: pure functions.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence

import pyarrow as pa

from logstore._proto import logstore_pb2 as pb
from logstore.client.error_mapping import error_from_item
from logstore.client.results import (
    AbortedTransaction,
    BrokerInfo,
    CleanableSegment,
    ClusterMetadata,
    ConfigAlteration,
    FetchedPartition,
    FetchRequestPartition,
    GroupHeartbeat,
    PartitionCleaning,
    ProducedPartition,
    ReplacedSegments,
    TopicCleaning,
)
from logstore.errors import LogstoreError
from logstore.record import decode_schema, value_schema_of
from logstore.types import (
    GroupDescription,
    ListedOffset,
    MemberDescription,
    NewTopic,
    OffsetAndMetadata,
    PartitionInfo,
    TopicDescription,
    TopicPartition,
    TxnRef,
)
from logstore.wire import decode_fetch_response

__all__ = [
    "new_topic",
    "alter_configs_request",
    "list_offsets_request",
    "delete_records_request",
    "offset_commit_request",
    "fetch_request",
    "topic_partitions",
    "txn_ref",
    "replace_segments_begin",
    "cluster_metadata",
    "produced_partitions",
    "fetched_partitions",
    "group_heartbeat",
    "group_description",
    "topic_cleaning",
    "listed_offsets",
    "low_watermarks",
    "committed_offsets",
    "replaced_segments",
]


# --------------------------------------------------------------------------- requests


def new_topic(t: NewTopic) -> pb.NewTopic:
    return pb.NewTopic(
        name=t.name,
        partitions=t.num_partitions,
        replication_factor=t.replication_factor or 0,  # 0: the broker's default
        configs={str(k): str(v) for k, v in t.configs.items()},
        value_schema=t.value_schema.serialize().to_pybytes() if t.value_schema is not None else b"",
    )


def fetch_request(
    partitions: Sequence[FetchRequestPartition], *, max_wait_ms: int, min_bytes: int, max_bytes: int,
    isolation_level: pb.IsolationLevel,
) -> pb.FetchRequest:
    return pb.FetchRequest(
        max_wait_ms=max_wait_ms,
        min_bytes=min_bytes,
        max_bytes=max_bytes,
        isolation_level=isolation_level,
        partitions=[
            pb.FetchPartition(
                topic=p.topic_partition.topic,
                partition=p.topic_partition.partition,
                fetch_offset=p.offset,
                partition_max_bytes=p.max_bytes,
                current_leader_epoch=p.current_leader_epoch,
            )
            for p in partitions
        ],
    )


def alter_configs_request(
    alterations: Mapping[str, ConfigAlteration], *, validate_only: bool
) -> pb.AlterConfigsRequest:
    return pb.AlterConfigsRequest(
        alterations=[
            pb.AlterConfigsRequest.Alteration(
                topic=topic,
                set={str(k): str(v) for k, v in a.set.items()},
                delete=list(a.delete),
            )
            for topic, a in alterations.items()
        ],
        validate_only=validate_only,
    )


def list_offsets_request(
    timestamps: Mapping[TopicPartition, int], *, isolation_level: pb.IsolationLevel
) -> pb.ListOffsetsRequest:
    return pb.ListOffsetsRequest(
        isolation_level=isolation_level,
        partitions=[
            pb.ListOffsetsPartition(topic=tp.topic, partition=tp.partition, timestamp=ts)
            for tp, ts in timestamps.items()
        ],
    )


def delete_records_request(before: Mapping[TopicPartition, int]) -> pb.DeleteRecordsRequest:
    return pb.DeleteRecordsRequest(
        partitions=[
            pb.DeleteRecordsPartition(topic=tp.topic, partition=tp.partition, offset=offset)
            for tp, offset in before.items()
        ]
    )


def offset_commit_request(
    group_id: str, offsets: Mapping[TopicPartition, int | OffsetAndMetadata], *, member_id: str,
    member_epoch: int,
) -> pb.OffsetCommitRequest:
    request = pb.OffsetCommitRequest(group_id=group_id, member_id=member_id, member_epoch=member_epoch)
    for tp, value in offsets.items():
        o = value if isinstance(value, OffsetAndMetadata) else OffsetAndMetadata(int(value))
        request.partitions.add(topic=tp.topic, partition=tp.partition, offset=o.offset, metadata=o.metadata)
    return request


def topic_partitions(tps: Iterable[TopicPartition], *, sort: bool = False) -> list[pb.TopicPartitions]:
    """``tps`` grouped by topic (topics and partitions sorted when ``sort``, else in first-seen order)."""
    by_topic: dict[str, list[int]] = {}
    for tp in tps:
        by_topic.setdefault(tp.topic, []).append(tp.partition)
    if sort:
        return [pb.TopicPartitions(topic=t, partitions=sorted(ps)) for t, ps in sorted(by_topic.items())]
    return [pb.TopicPartitions(topic=t, partitions=ps) for t, ps in by_topic.items()]


def txn_ref(t: TxnRef) -> pb.TxnRef:
    return pb.TxnRef(transactional_id=t.transactional_id, producer_id=t.producer_id,
                     producer_epoch=t.producer_epoch, txn_number=t.txn_number)


def replace_segments_begin(
    tp: TopicPartition, segments: Sequence[CleanableSegment], *, end_offset: int, cleaner_checkpoint: int,
    follower: bool = False,
) -> pb.ReplaceSegmentsRequest:
    """The first message of a ReplaceSegments stream (the chunks follow)."""
    return pb.ReplaceSegmentsRequest(begin=pb.ReplaceSegmentsBegin(
        topic=tp.topic, partition=tp.partition, end_offset=end_offset,
        cleaner_checkpoint=cleaner_checkpoint, follower=follower,
        segments=[pb.CleanableSegment(base_offset=s.base_offset, next_offset=s.next_offset,
                                      size_bytes=s.size_bytes, max_timestamp=s.max_timestamp)
                  for s in segments],
    ))


# --------------------------------------------------------------------------- answers


def cluster_metadata(response: pb.MetadataResponse) -> ClusterMetadata:
    """A Metadata answer; a topic the broker could not describe is in ``topic_errors``."""
    described: dict[str, TopicDescription] = {}
    errors: dict[str, LogstoreError] = {}
    for t in response.topics:
        err = error_from_item(t.error)
        if err is not None:
            errors[t.name] = err
            continue
        schema, _ = decode_schema(t.schema, where=f"metadata of topic {t.name!r}")
        partitions = tuple(
            sorted(
                (
                    PartitionInfo(
                        topic=t.name,
                        partition=p.partition,
                        leader=p.leader,
                        leader_epoch=p.leader_epoch,
                        replicas=tuple(p.replicas),
                        isr=tuple(p.isr),
                        log_start_offset=p.log_start_offset,
                        log_end_offset=p.log_end_offset,
                        high_watermark=p.high_watermark,
                        last_stable_offset=p.last_stable_offset,
                        size_bytes=p.size_bytes,
                        error=error_from_item(p.error),
                    )
                    for p in t.partitions
                ),
                key=lambda p: p.partition,
            )
        )
        described[t.name] = TopicDescription(
            name=t.name,
            topic_id=t.topic_id,
            schema=schema,
            value_schema=value_schema_of(schema),
            partitions=partitions,
        )
    return ClusterMetadata(
        cluster_id=response.cluster_id,
        controller_id=response.controller_id,
        brokers=tuple(BrokerInfo(b.node_id, b.host, b.port, b.rack) for b in response.brokers),
        topics=described,
        topic_errors=errors,
    )


def produced_partitions(response: pb.ProduceResponse) -> list[ProducedPartition]:
    """A Produce answer as one :class:`ProducedPartition` per partition (item errors inside)."""
    return [
        ProducedPartition(
            topic=r.topic,
            partition=r.partition,
            error=error_from_item(r.error),
            base_offsets=tuple(r.base_offsets),
            log_append_time_ms=r.log_append_time_ms,
            log_start_offset=r.log_start_offset,
        )
        for r in response.partitions
    ]


def aligned(records: memoryview) -> memoryview:
    """``records`` at an 8-byte-aligned address: as it is when it is, else copied once.

    A fetch answer's records follow protobuf framing, so they start at any address, and the
    Arrow batches decoded from them zero-copy inherit that. Arrow's compute engine (Acero:
    group-by, joins, as in the compaction job) wants aligned buffers and warns "An input
    buffer was poorly aligned" (and copies) for every one that is not. Stored batch messages
    are whole multiples of 8 bytes, so one aligned start aligns every batch after it.
    """
    if not len(records) or pa.py_buffer(records).address % 8 == 0:
        return records
    out = memoryview(pa.allocate_buffer(len(records))).cast("B")  # 64-byte aligned
    out[:] = records.cast("B") if records.format != "B" else records
    return out


def fetched_partitions(data: bytes) -> list[FetchedPartition]:
    """A ``FetchResponse`` in wire form (see :func:`logstore.wire.decode_fetch_response`) as
    :class:`FetchedPartition` objects; their records are views of ``data``, or of an aligned
    copy (:func:`aligned`)."""
    return [
        FetchedPartition(
            topic=r.topic,
            partition=r.partition,
            error=error_from_item(r.error),
            high_watermark=r.high_watermark,
            last_stable_offset=r.last_stable_offset,
            log_start_offset=r.log_start_offset,
            schema=r.schema,
            records=aligned(records),
            aborted_transactions=tuple(
                AbortedTransaction(a.producer_id, a.first_offset) for a in r.aborted_transactions
            ),
            next_offset=r.next_offset,
        )
        for r, records in decode_fetch_response(data)
    ]


def group_heartbeat(r: pb.ConsumerGroupHeartbeatResponse) -> GroupHeartbeat:
    """A heartbeat answer (without its error; the caller raises that)."""
    return GroupHeartbeat(
        member_id=r.member_id, member_epoch=r.member_epoch,
        heartbeat_interval_ms=r.heartbeat_interval_ms, session_timeout_ms=r.session_timeout_ms,
        assignment=frozenset(TopicPartition(a.topic, p) for a in r.assignment for p in a.partitions),
    )


def group_description(g: pb.GroupDescription) -> GroupDescription | LogstoreError:
    """A described group: members, assignments, committed offsets; or the group's error."""
    err = error_from_item(g.error)
    if err is not None:
        return err
    return GroupDescription(
        group_id=g.group_id, state=g.state, group_epoch=g.group_epoch,
        assignment_epoch=g.assignment_epoch, assignor=g.assignor,
        members=tuple(MemberDescription(
            member_id=m.member_id, instance_id=m.instance_id, client_id=m.client_id,
            client_host=m.client_host, member_epoch=m.member_epoch,
            subscribed_topics=tuple(m.subscribed_topics), assignment=_tps(m.assignment),
            pending_revocation=_tps(m.pending_revocation), target_assignment=_tps(m.target_assignment),
            assignor=m.server_assignor, left=m.left,
        ) for m in g.members),
        offsets={TopicPartition(c.topic, c.partition): OffsetAndMetadata(c.offset, c.metadata,
                                                                          c.commit_timestamp_ms)
                 for c in g.offsets},
    )


def _tps(items: Iterable[pb.TopicPartitions]) -> frozenset[TopicPartition]:
    return frozenset(TopicPartition(i.topic, p) for i in items for p in i.partitions)


def topic_cleaning(t: pb.TopicCleaning) -> TopicCleaning | LogstoreError:
    """A topic's cleaning state, partitions in partition order; or the topic's error."""
    err = error_from_item(t.error)
    if err is not None:
        return err
    return TopicCleaning(
        name=t.name, cleanup_policy=t.cleanup_policy,
        min_cleanable_dirty_ratio=t.min_cleanable_dirty_ratio,
        delete_retention_ms=t.delete_retention_ms, min_compaction_lag_ms=t.min_compaction_lag_ms,
        segment_bytes=t.segment_bytes,
        partitions=tuple(
            PartitionCleaning(
                topic=t.name, partition=p.partition, error=error_from_item(p.error),
                log_start_offset=p.log_start_offset, log_end_offset=p.log_end_offset,
                last_stable_offset=p.last_stable_offset, active_segment_base=p.active_segment_base,
                first_dirty_offset=p.first_dirty_offset, cleanable_end_offset=p.cleanable_end_offset,
                clean_bytes=p.clean_bytes, dirty_bytes=p.dirty_bytes,
                segments=tuple(
                    CleanableSegment(s.base_offset, s.next_offset, s.size_bytes, s.max_timestamp)
                    for s in p.segments
                ),
                in_progress=p.in_progress,
            )
            for p in sorted(t.partitions, key=lambda p: p.partition)
        ),
    )


def listed_offsets(response: pb.ListOffsetsResponse) -> dict[TopicPartition, ListedOffset | LogstoreError]:
    """Each partition's offset (``ListedOffset.offset`` None: no record at or after the timestamp)."""
    out: dict[TopicPartition, ListedOffset | LogstoreError] = {}
    for r in response.partitions:
        tp = TopicPartition(r.topic, r.partition)
        err = error_from_item(r.error)
        out[tp] = err if err is not None else ListedOffset(
            offset=r.offset if r.offset >= 0 else None, timestamp_ms=r.timestamp
        )
    return out


def low_watermarks(response: pb.DeleteRecordsResponse) -> dict[TopicPartition, int | LogstoreError]:
    """Each partition's new log start offset after DeleteRecords, or its error."""
    out: dict[TopicPartition, int | LogstoreError] = {}
    for r in response.partitions:
        err = error_from_item(r.error)
        out[TopicPartition(r.topic, r.partition)] = err if err is not None else r.low_watermark
    return out


def committed_offsets(r: pb.OffsetFetchResponse) -> dict[TopicPartition, OffsetAndMetadata | None]:
    """An OffsetFetch answer (None where nothing is committed; its error is the caller's)."""
    return {
        TopicPartition(c.topic, c.partition):
            OffsetAndMetadata(c.offset, c.metadata, c.commit_timestamp_ms) if c.offset >= 0 else None
        for c in r.offsets
    }


def replaced_segments(r: pb.ReplaceSegmentsResponse) -> ReplacedSegments:
    return ReplacedSegments(
        new_base_offsets=tuple(r.new_base_offsets), bytes_before=r.bytes_before,
        bytes_after=r.bytes_after, batches=r.batches, records=r.records,
        cleaner_checkpoint=r.cleaner_checkpoint,
    )
