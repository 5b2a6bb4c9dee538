"""Storage support for replicas: byte-identical follower appends, HWM as state, truncation,
end offsets of leader epochs, and a broker hosting a subset of a topic's partitions."""

from __future__ import annotations

import json
import os
from pathlib import Path

import pyarrow as pa
import pytest
from storage_helpers import SCHEMA, config, produced, read_all, simple_batch

from logstore.errors import CorruptRecordError, NotLeaderError
from logstore.record import build_batch, encode_batch, encode_schema, typed_schema
from logstore.storage.config import LogConfig
from logstore.storage.log import Log
from logstore.storage.log_manager import LogManager
from logstore.storage.partition import Partition

pytestmark = pytest.mark.timeout(60)


def leader_and_follower(tmp_path, cfg: LogConfig | None = None) -> tuple[Partition, Partition]:  # type: ignore[no-untyped-def]
    cfg = cfg or config()
    leader = Partition("t", 0, Log.open(str(tmp_path / "leader"), config=cfg, schema=SCHEMA), replicated=True)
    leader.become_leader(3)
    follower = Partition("t", 0, Log.open(str(tmp_path / "follower"), config=cfg, schema=SCHEMA),
                         replicated=True)
    follower.become_follower(3)
    return leader, follower


def fetch_into(leader: Partition, follower: Partition) -> int:
    """What a replica fetch does: read from the follower's LEO to the leader's, append as is."""
    while follower.log.log_end_offset < leader.log.log_end_offset:
        got = leader.log.read(follower.log.log_end_offset, max_bytes=1 << 20)
        follower.append_replica(encode_schema(got.schema), got.data)
    return follower.log.log_end_offset


def stored(part: Partition) -> list[bytes]:
    return [bytes(b.data) for seg in part.log.segments for b in seg.iter_batches()]


def test_a_follower_stores_the_leaders_batches_byte_for_byte(tmp_path) -> None:  # type: ignore[no-untyped-def]
    leader, follower = leader_and_follower(tmp_path)
    leader.append(*produced(simple_batch(3)), fsync=False)
    leader.append(*produced(simple_batch(2, tag=b"p"), producer_id=5, producer_epoch=0, base_sequence=0),
                  fsync=False)
    leader.append(*produced(simple_batch(1, tag=b"t"), producer_id=6, producer_epoch=0, base_sequence=0,
                            attributes=1), fsync=False)
    assert fetch_into(leader, follower) == leader.log.log_end_offset == 6
    assert stored(follower) == stored(leader)
    assert follower.log.epochs.entries == leader.log.epochs.entries
    assert read_all(follower.log) == read_all(leader.log)
    # Producer state came along: the open transaction, and producer 5's sequences.
    follower.update_high_watermark(6)
    assert follower.last_stable_offset == 5
    follower.become_leader(4)
    assert follower.append(*produced(simple_batch(2, tag=b"p"), producer_id=5, producer_epoch=0,
                                     base_sequence=0), fsync=False)[0] == 3  # a duplicate


def test_a_corrupted_or_cut_batch_is_refused_and_nothing_is_written(tmp_path) -> None:  # type: ignore[no-untyped-def]
    leader, follower = leader_and_follower(tmp_path)
    leader.append(*produced(simple_batch(3)), fsync=False)
    leader.append(*produced(simple_batch(3, tag=b"w")), fsync=False)
    got = leader.log.read(0, max_bytes=1 << 20)
    schema = encode_schema(got.schema)
    size = os.path.getsize(follower.log.segments[-1].path)
    damaged = bytearray(got.data)
    damaged[-20] ^= 0xFF  # in the second batch's body
    with pytest.raises(CorruptRecordError, match="CRC32C mismatch"):
        follower.append_replica(schema, memoryview(bytes(damaged)))
    with pytest.raises(CorruptRecordError):
        follower.append_replica(schema, got.data[:-7])
    assert follower.log.log_end_offset == 0 and os.path.getsize(follower.log.segments[-1].path) == size
    follower.append_replica(schema, got.data)
    with pytest.raises(CorruptRecordError, match="does not follow"):
        follower.append_replica(schema, got.data)  # offsets below the LEO
    assert stored(follower) == stored(leader)


def test_gaps_are_kept_and_a_new_schema_rolls_a_segment(tmp_path) -> None:  # type: ignore[no-untyped-def]
    value_v1 = pa.schema([pa.field("a", pa.int64())])
    value_v2 = pa.schema([pa.field("a", pa.int64()), pa.field("b", pa.string(), nullable=True)])
    s1, s2 = typed_schema(value_v1), typed_schema(value_v2)
    follower = Partition("t", 0, Log.open(str(tmp_path / "f"), config=config(), schema=s1), replicated=True)
    b1 = build_batch(s1, values=pa.array([{"a": 1}, {"a": 2}], s1.field("value").type), timestamps_ms=[1, 2])
    b2 = build_batch(s2, values=pa.array([{"a": 3, "b": "x"}], s2.field("value").type), timestamps_ms=[3])
    first = encode_batch(b1, base_offset=4).to_bytes()  # offsets 0-3 were compacted away
    assert follower.append_replica(encode_schema(s1), memoryview(first)) == 6
    second = encode_batch(b2, base_offset=10).to_bytes()
    assert follower.append_replica(encode_schema(s2), memoryview(second)) == 11
    segs = follower.log.segments
    assert [s.base_offset for s in segs] == [0, 6] and segs[-1].schema.equals(s2)
    assert stored(follower) == [first, second]
    assert [b.header.base_offset for s in segs for b in s.iter_batches()] == [4, 10]


def test_the_hwm_is_state_for_a_replicated_partition_and_the_leo_otherwise(tmp_path) -> None:  # type: ignore[no-untyped-def]
    plain = Partition("p", 0, Log.open(str(tmp_path / "plain"), config=config(), schema=SCHEMA))
    plain.append(*produced(simple_batch(2)), fsync=False)
    assert plain.high_watermark == plain.log.log_end_offset == 2
    leader, follower = leader_and_follower(tmp_path)
    leader.append(*produced(simple_batch(4)), fsync=False)
    assert leader.high_watermark == 0
    assert leader.update_high_watermark(3) and leader.high_watermark == 3
    assert not leader.update_high_watermark(1) and leader.high_watermark == 3  # a leader's only grows
    leader.update_high_watermark(99)
    assert leader.high_watermark == 4  # clamped to the LEO
    fetch_into(leader, follower)
    follower.update_high_watermark(3)
    follower.update_high_watermark(2)
    assert follower.high_watermark == 2  # a follower takes the leader's
    # The LSO never exceeds the HWM, open transaction or not.
    leader.append(*produced(simple_batch(1), producer_id=8, producer_epoch=0, base_sequence=0, attributes=1),
                  fsync=False)
    assert leader.last_stable_offset == 4
    # A leader that stepped down refuses producer appends; a leader takes no replica appends.
    follower.become_follower(5)
    with pytest.raises(NotLeaderError):
        follower.append(*produced(simple_batch(1)), fsync=False)
    with pytest.raises(NotLeaderError):
        leader.append_replica(encode_schema(SCHEMA), memoryview(b""))


def test_truncation_rebuilds_producer_state_and_lowers_the_hwm(tmp_path) -> None:  # type: ignore[no-untyped-def]
    leader, follower = leader_and_follower(tmp_path)
    leader.append(*produced(simple_batch(2)), fsync=False)
    leader.append(*produced(simple_batch(1), producer_id=8, producer_epoch=0, base_sequence=0, attributes=1),
                  fsync=False)
    fetch_into(leader, follower)
    follower.update_high_watermark(3)
    assert follower.last_stable_offset == 2
    follower.truncate_to(2)
    assert follower.log.log_end_offset == 2 and follower.high_watermark == 2
    assert follower.last_stable_offset == 2 and not follower.producers.has_open_transaction(8)
    # The snapshot written by the truncation is the one a reopen loads.
    follower.close()
    reopened = Partition("t", 0, Log.open(str(tmp_path / "follower"), config=config(), schema=SCHEMA),
                         replicated=True, high_watermark=2)
    assert not reopened.producers.has_open_transaction(8) and reopened.high_watermark == 2


def test_end_offset_for_epoch_has_kafkas_semantics(tmp_path) -> None:  # type: ignore[no-untyped-def]
    part = Partition("t", 0, Log.open(str(tmp_path / "p"), config=config(), schema=SCHEMA), replicated=True)
    assert part.end_offset_for_epoch(0) == (-1, -1)  # nothing known
    for epoch, n in ((2, 3), (4, 2), (7, 1)):
        part.become_leader(epoch)
        part.append(*produced(simple_batch(n)), fsync=False)
    assert [(e.epoch, e.start_offset) for e in part.log.epochs.entries] == [(2, 0), (4, 3), (7, 5)]
    assert part.end_offset_for_epoch(7) == (7, 6)  # the latest: the LEO
    assert part.end_offset_for_epoch(4) == (4, 5)
    assert part.end_offset_for_epoch(5) == (4, 5)  # the floor epoch, where it ends
    assert part.end_offset_for_epoch(1) == (1, 0)  # below every epoch: the first start
    assert part.end_offset_for_epoch(8) == (-1, -1)  # newer than this log knows
    # Becoming leader writes the epoch's start at once (before any append), as Kafka does.
    part.become_leader(9)
    assert part.end_offset_for_epoch(7) == (7, 6) and part.end_offset_for_epoch(9) == (9, 6)


def test_a_broker_hosts_a_subset_of_a_replicated_topic(tmp_path) -> None:  # type: ignore[no-untyped-def]
    data = str(tmp_path / "data")
    manager = LogManager(data, topic_defaults=LogConfig())
    manager.startup()
    manager.create_topic("local", partitions=2, configs={}, value_schema=None)
    info = manager.ensure_replicated_topic("r", topic_id="abc", partitions=4, configs={"min.insync.replicas": "2"},
                                           value_schema=None, replication_factor=3)
    assert info.replicated and info.config.min_insync_replicas == 2 and manager.partitions_of("r") == []
    p1 = manager.ensure_partition("r", 1)
    p3 = manager.ensure_partition("r", 3)
    assert manager.ensure_partition("r", 1) is p1 and p1.replicated and not p1.is_leader
    p1.become_leader(0)
    p1.append(*produced(simple_batch(5)), fsync=False)
    p1.update_high_watermark(3)
    manager.remove_partition("r", 3)
    assert not os.path.exists(p3.log.directory)
    manager.shutdown()
    doc = json.loads(Path(data, "meta", "topics", "r.json").read_text())
    assert (doc["replicated"], doc["replication_factor"]) == (True, 3)
    assert "replicated" not in json.loads(Path(data, "meta", "topics", "local.json").read_text())

    again = LogManager(data, topic_defaults=LogConfig())
    again.startup()
    assert [p.partition for p in again.partitions_of("r")] == [1]
    assert [p.partition for p in again.partitions_of("local")] == [0, 1]
    assert not again.partition("local", 0).replicated
    r1 = again.partition("r", 1)
    assert (r1.high_watermark, r1.log.log_end_offset) == (3, 5)  # from the checkpoint
    # The topic was deleted and re-created with another id while this broker was away.
    again.ensure_replicated_topic("r", topic_id="new", partitions=2, configs={}, value_schema=None,
                                  replication_factor=3)
    assert again.partitions_of("r") == [] and not os.path.exists(r1.log.directory)
    again.shutdown()


def test_truncating_to_a_segment_boundary_makes_the_older_segment_active_again(tmp_path) -> None:  # type: ignore[no-untyped-def]
    leader, follower = leader_and_follower(tmp_path)
    for i in range(3):
        leader.append(*produced(simple_batch(2, tag=b"%d" % i)), fsync=False)
        leader.log.roll()
    fetch_into(leader, follower)
    follower.log.roll()
    assert [s.base_offset for s in follower.log.segments] == [0, 6]
    follower.truncate_to(4)
    assert [s.base_offset for s in follower.log.segments] == [0] and follower.log.log_end_offset == 4
    fetch_into(leader, follower)
    assert stored(follower) == stored(leader)
    follower.close()
    reopened = Log.open(str(tmp_path / "follower"), config=config(), schema=SCHEMA)
    assert read_all(reopened) == read_all(leader.log)


def test_a_follower_behind_the_leaders_log_start_starts_over_there(tmp_path) -> None:  # type: ignore[no-untyped-def]
    leader, follower = leader_and_follower(tmp_path)
    leader.append(*produced(simple_batch(2)), fsync=False)
    fetch_into(leader, follower)
    for i in range(3):
        leader.append(*produced(simple_batch(2, tag=b"%d" % i)), fsync=False)
        leader.log.roll()
    leader.log.delete_records_before(6)
    follower.truncate_fully_and_start_at(leader.log.log_start_offset)
    assert (follower.log.log_start_offset, follower.log.log_end_offset, follower.high_watermark) == (6, 6, 6)
    assert follower.log.epochs.entries == []
    fetch_into(leader, follower)
    assert read_all(follower.log) == read_all(leader.log, 6)
    follower.close()
    reopened = Log.open(str(tmp_path / "follower"), config=config(), schema=SCHEMA)
    assert (reopened.log_start_offset, reopened.log_end_offset) == (6, 8)


@pytest.mark.parametrize("replication_factor", [1, 3])
def test_a_lost_tail_below_the_checkpoint_is_refetched_only_with_other_replicas(
        tmp_path, replication_factor: int) -> None:  # type: ignore[no-untyped-def]
    data = str(tmp_path / "data")
    manager = LogManager(data, topic_defaults=LogConfig())
    manager.startup()
    manager.ensure_replicated_topic("r", topic_id="abc", partitions=1, configs={}, value_schema=None,
                                    replication_factor=replication_factor)
    part = manager.ensure_partition("r", 0)
    part.become_leader(0)
    for i in range(3):
        part.append(*produced(simple_batch(2, tag=b"%d" % i)), fsync=False)
    part.update_high_watermark(6)
    segment = part.log.segments[-1].path
    manager.shutdown()
    # A power loss took the last batch (never fsynced) after the checkpoint recorded HWM 6.
    os.remove(os.path.join(part.log.directory, "clean-shutdown"))
    os.truncate(segment, os.path.getsize(segment) - 10)
    again = LogManager(data, topic_defaults=LogConfig())
    again.startup()
    reopened = again.partition("r", 0)
    if replication_factor == 1:
        assert reopened.log.offline_reason is not None and "high-water mark" in reopened.log.offline_reason
    else:
        assert reopened.log.offline_reason is None
        assert (reopened.log.log_end_offset, reopened.high_watermark) == (4, 4)
    again.shutdown()
