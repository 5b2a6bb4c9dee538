"""The fault harness (tests/support/cluster_harness.py): its checker catches what it must, and a
bounded chaos run on a real 3-broker cluster loses and duplicates nothing.

The long run (100+ faults) is ``make chaos`` (benchmarks/chaos.py).
"""

from __future__ import annotations

import os
import shutil
from pathlib import Path

import pytest
from cluster_harness import Ack, check_reads, compare_replicas, run_chaos

from logstore import Admin, Producer
from logstore._proto import logstore_pb2 as pb
from logstore.broker.embedded import EmbeddedBroker
from logstore.record import decode_schema
from logstore.record_reader import iter_batches

# ---------------------------------------------------------------- the checker can fail


def test_the_read_check_finds_lost_misplaced_duplicated_and_conflicting_records() -> None:
    acks = [Ack(0, 0, b"a"), Ack(0, 1, b"b"), Ack(0, 2, b"c"), Ack(1, 0, b"d"), Ack(1, 1, b"e"),
            Ack(1, 1, b"f")]  # two acknowledgements naming one offset: one of them was overwritten
    log = {0: {0: b"a", 1: b"c", 2: b"c"},  # b is gone, c sits at two offsets
           1: {0: b"d", 1: b"e"}}
    result = check_reads(acks, 3, log)
    assert not result.ok
    assert result.lost == [Ack(0, 1, b"b"), Ack(1, 1, b"f")]
    assert result.duplicated == [b"c"]
    assert result.conflicting == [(1, 1)]
    assert (result.acknowledged, result.failed_sends, result.read) == (6, 3, 5)


def test_the_read_check_accepts_a_log_with_unacknowledged_extras() -> None:
    # A failed send may still be in the log (an unknown outcome): that is neither loss nor a duplicate.
    acks = [Ack(0, 0, b"a"), Ack(0, 2, b"c")]
    result = check_reads(acks, 1, {0: {0: b"a", 1: b"maybe", 2: b"c"}})
    assert result.ok, result.summary()


@pytest.mark.timeout(60)
def test_the_replica_check_finds_a_flipped_byte_and_a_missing_batch(tmp_path: Path) -> None:
    leader_dir = tmp_path / "broker-1"
    with EmbeddedBroker(str(leader_dir)) as broker, Producer(broker.bootstrap, linger_ms=0) as producer:
        with Admin(broker.bootstrap) as admin:
            admin.create_topic("t", 1)
        for i in range(5):  # five batches
            producer.send("t", b"value-%d" % i, partition=0).result(30)
    part = leader_dir / "t-0"
    segments = sorted(part.glob("*.arrow"))
    assert segments, f"no segment in {part}: {os.listdir(leader_dir)}"
    for n in (2, 3, 4):
        shutil.copytree(part, tmp_path / f"broker-{n}" / "t-0")
    md = pb.MetadataResponse(topics=[pb.TopicMetadata(name="t", partitions=[pb.PartitionMetadata(
        partition=0, leader=1, replicas=[1, 2, 3, 4], isr=[1, 2, 3, 4], high_watermark=5)])])

    def data_dir_of(n: int) -> Path:
        return tmp_path / f"broker-{n}"

    same = compare_replicas(data_dir_of, md)
    assert same.problems == [] and same.batches == 15  # 3 followers x 5 batches

    # Broker 3: one byte of the last batch's body flipped. Broker 4: the last batch cut off.
    seg3 = tmp_path / "broker-3" / "t-0" / segments[-1].name
    data = bytearray(seg3.read_bytes())
    _, start = decode_schema(memoryview(bytes(data)))
    last = list(iter_batches(memoryview(bytes(data)), start=start))[-1]
    data[last.position + last.size - 1] ^= 0xFF
    seg3.write_bytes(bytes(data))
    seg4 = tmp_path / "broker-4" / "t-0" / segments[-1].name
    seg4.write_bytes(seg4.read_bytes()[:last.position])

    problems = compare_replicas(data_dir_of, md).problems
    assert len(problems) == 2, problems
    assert "replica 3 differs" in problems[0] and "at batch #4" in problems[0]
    assert "replica 4 differs" in problems[1] and "4 vs 5 batches" in problems[1]


# ---------------------------------------------------------------- a bounded chaos run


@pytest.mark.slow
@pytest.mark.timeout(240)
def test_a_bounded_chaos_run_loses_and_duplicates_nothing(tmp_path: Path) -> None:
    report = run_chaos(tmp_path / "cluster", faults=6, seed=11, rate=200, log=print)  # shown on failure
    print(report.summary())
    assert len(report.faults) == 6
    assert {f.kind for f in report.faults} == {"kill_leader", "pause", "cut_link"}
    assert report.result.acknowledged > 500, report.summary()
    assert report.result.replica_batches_compared > 0, report.summary()
    assert report.result.ok, (report.summary(), report.result.lost[:10], report.result.duplicated[:10],
                              report.result.conflicting[:10], report.result.replica_mismatches)
