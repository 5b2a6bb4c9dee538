"""Partition offsets as each partition's **leader** reports them, and group lag computed from them.

Why not the offsets of :meth:`Admin.describe_topics`: on a cluster, the
Metadata answer carries the offsets of the answering broker's *local*
replica (``logstore/broker/cluster_topics.py``: "local offsets where a
replica is here"): a follower reports its own high-water mark (0 until it
learns one) and a broker without a replica reports none. The console would
show a follower's view, and lag of 0. ``ListOffsets`` is routed to each
partition's leader by the client, so the console asks it:

* log start offset: ``earliest``;
* high-water mark: ``latest`` with read_uncommitted;
* last stable offset: ``latest`` with read_committed.

LEO and size stay the metadata's (the answering replica's): the leader's LEO
is not in any answer, and sizes differ little between in-sync replicas. A
partition whose leader cannot answer (offline) keeps the metadata's values.

Group lag (:func:`group_lag`) is the leader's high-water mark minus the
group's committed offset, per partition of the topics the group subscribes
to or committed offsets for (as :meth:`Admin.group_lag`, which takes the
high-water mark from Metadata).

Thread-safety: blocking functions over a thread-safe :class:`Admin`.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Iterable, Mapping

from logstore.client.admin import Admin
from logstore.errors import LogstoreError
from logstore.types import (
    GroupDescription,
    PartitionInfo,
    PartitionLag,
    TopicDescription,
    TopicPartition,
)

__all__ = ["leader_high_watermarks", "leader_offsets", "with_leader_offsets", "group_lag", "group_topics", "lag_rows"]


def _listed(admin: Admin, tps: list[TopicPartition], spec: str, isolation_level: str) -> dict[TopicPartition, int]:
    """One ListOffsets lookup for ``tps``; partitions that fail on their own are left out."""
    if not tps:
        return {}
    try:
        found = admin.list_offsets({tp: spec for tp in tps}, isolation_level=isolation_level)
        return {tp: o.offset for tp, o in found.items() if o.offset is not None}
    except LogstoreError:
        if len(tps) == 1:
            return {}
    out: dict[TopicPartition, int] = {}
    for tp in tps:  # one failed: ask one by one so the others still get theirs
        out.update(_listed(admin, [tp], spec, isolation_level))
    return out


def leader_high_watermarks(admin: Admin, tps: Iterable[TopicPartition]) -> dict[TopicPartition, int]:
    """``tp → high-water mark`` from each partition's leader (one ListOffsets lookup)."""
    return _listed(admin, sorted(set(tps)), "latest", "read_uncommitted")


def leader_offsets(admin: Admin, tps: Iterable[TopicPartition]) -> dict[TopicPartition, tuple[int, int, int]]:
    """``tp → (log start, high-water mark, LSO)`` from each partition's leader (see the module
    docstring); partitions whose leader did not answer are absent."""
    wanted = sorted(set(tps))
    start = _listed(admin, wanted, "earliest", "read_uncommitted")
    hwm = _listed(admin, wanted, "latest", "read_uncommitted")
    lso = _listed(admin, wanted, "latest", "read_committed")
    return {tp: (start[tp], hwm[tp], lso[tp]) for tp in wanted if tp in start and tp in hwm and tp in lso}


def _fixed(p: PartitionInfo, offsets: Mapping[TopicPartition, tuple[int, int, int]]) -> PartitionInfo:
    got = offsets.get(p.topic_partition)
    if got is None:
        return p
    start, hwm, lso = got
    return dataclasses.replace(p, log_start_offset=start, high_watermark=hwm, last_stable_offset=lso,
                               log_end_offset=max(p.log_end_offset, hwm))


def with_leader_offsets(admin: Admin, topics: Mapping[str, TopicDescription]) -> dict[str, TopicDescription]:
    """``topics`` with each partition's offsets replaced by its leader's."""
    offsets = leader_offsets(admin, (p.topic_partition for d in topics.values() for p in d.partitions
                                     if p.error is None))
    return {name: dataclasses.replace(d, partitions=tuple(_fixed(p, offsets) for p in d.partitions))
            for name, d in topics.items()}


def lag_rows(desc: GroupDescription, partitions: Iterable[TopicPartition],
             high_watermarks: Mapping[TopicPartition, int]) -> list[PartitionLag]:
    """Per partition (those given, plus any the group committed for): committed offset, high-water
    mark (-1 when unknown), lag and owner; sorted by topic and partition."""
    rows = []
    for tp in sorted(set(partitions) | set(desc.offsets)):
        committed = desc.offsets.get(tp)
        end = high_watermarks.get(tp, -1)
        offset = committed.offset if committed is not None else None
        owner = desc.owner(tp)
        rows.append(PartitionLag(
            topic=tp.topic, partition=tp.partition, committed_offset=offset, log_end_offset=end,
            lag=max(0, end - offset) if offset is not None and end >= 0 else None,
            member_id=owner.member_id if owner is not None else None,
            client_host=owner.client_host if owner is not None else ""))
    return rows


def group_topics(desc: GroupDescription) -> set[str]:
    topics = {tp.topic for tp in desc.offsets}
    for m in desc.members:
        topics.update(m.subscribed_topics)
    return topics


def group_lag(admin: Admin, group_id: str) -> tuple[GroupDescription, list[PartitionLag]]:
    """``group_id``'s description and its lag per partition, against the leaders' high-water marks."""
    desc = admin.describe_group(group_id)
    names = sorted(group_topics(desc))
    described = admin.describe_topics(None) if names else {}
    tps = [p.topic_partition for n in names if n in described for p in described[n].partitions]
    return desc, lag_rows(desc, tps, leader_high_watermarks(admin, tps))
