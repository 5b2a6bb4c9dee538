"""A transaction's consumer offsets in the group coordinator (logstore.broker.groups.coordinator):
pending per producer until its marker, applied on COMMIT, dropped on ABORT, and the same after a
replay of the log, against the in-memory GroupLog and a simple model.

The model: a partition's committed offset is the one of its last record *in log order* among the
plain commits and the records of committed transactions (Kafka's rule: a transaction's offset
does not overwrite a commit appended after it); records of undecided transactions are pending
(unstable), those of aborted ones are nothing.
"""

from __future__ import annotations

import random
from collections.abc import Callable
from pathlib import Path

import pytest

from logstore.broker.groups.coordinator import GroupCoordinator
from logstore.broker.groups.model import GroupConfig, Heartbeat
from logstore.broker.groups.records import MemoryGroupLog
from logstore.broker.groups.service import OFFSETS_TOPIC, TopicGroupLog
from logstore.errors import (
    InvalidGroupIdError,
    InvalidRequestError,
    InvalidTxnStateError,
    UnknownMemberIdError,
)
from logstore.storage.config import LogConfig
from logstore.storage.log_manager import LogManager
from logstore.types import TopicPartition

G = "g"
TP0, TP1 = TopicPartition("t", 0), TopicPartition("t", 1)


def _coordinator(log: MemoryGroupLog) -> GroupCoordinator:
    coord = GroupCoordinator(GroupConfig(), log=log, topic_partitions=lambda topic: 2)
    coord.startup()
    return coord


def _txn_commit(coord: GroupCoordinator, pid: int, offsets: dict[TopicPartition, int], *,
                group: str = G, member_id: str = "", member_epoch: int = -1,
                verify: Callable[[], None] = lambda: None) -> None:
    coord.commit_txn_offsets(group, producer_id=pid, producer_epoch=0, member_id=member_id,
                             member_epoch=member_epoch, offsets={tp: (o, f"m{o}") for tp, o in offsets.items()},
                             verify=verify)


def _marker(log: MemoryGroupLog, coord: GroupCoordinator, pid: int, *, commit: bool) -> int:
    """What the broker does when a marker lands on the group's log partition."""
    log.append_marker(pid, commit=commit)
    return coord.complete_transaction(pid, commit=commit, owns=lambda group_id: True)


def _offsets(coord: GroupCoordinator, group: str = G) -> dict[TopicPartition, int]:
    return {tp: c.offset for tp, c in coord.fetch_offsets(group).items()}


def test_pending_offsets_are_invisible_until_the_commit_marker() -> None:
    log = MemoryGroupLog()
    coord = _coordinator(log)
    coord.commit_offsets(G, "", -1, {TP0: (3, "")})
    _txn_commit(coord, 7, {TP0: 10, TP1: 20})
    assert _offsets(coord) == {TP0: 3}
    assert coord.unstable_offsets(G) == {TP0, TP1}
    assert _marker(log, coord, 7, commit=True) == 2
    assert _offsets(coord) == {TP0: 10, TP1: 20}
    assert coord.fetch_offsets(G)[TP1].metadata == "m20"
    assert coord.unstable_offsets(G) == frozenset()
    assert _offsets(_coordinator(log)) == {TP0: 10, TP1: 20}  # a replay agrees


def test_an_abort_marker_drops_the_pending_offsets() -> None:
    log = MemoryGroupLog()
    coord = _coordinator(log)
    coord.commit_offsets(G, "", -1, {TP0: (3, "")})
    _txn_commit(coord, 7, {TP0: 10, TP1: 20})
    assert _marker(log, coord, 7, commit=False) == 0
    assert _offsets(coord) == {TP0: 3}
    assert coord.unstable_offsets(G) == frozenset()
    replayed = _coordinator(log)
    assert _offsets(replayed) == {TP0: 3} and replayed.unstable_offsets(G) == frozenset()


def test_undecided_offsets_stay_pending_across_a_replay_and_the_marker_then_applies_them() -> None:
    log = MemoryGroupLog()
    _txn_commit(_coordinator(log), 7, {TP0: 10})
    restarted = _coordinator(log)  # the broker restarted between TxnOffsetCommit and EndTxn
    assert _offsets(restarted) == {} and restarted.unstable_offsets(G) == {TP0}
    assert _marker(log, restarted, 7, commit=True) == 1
    assert _offsets(restarted) == {TP0: 10}
    assert _offsets(_coordinator(log)) == {TP0: 10}


def test_a_commit_appended_after_the_transactions_offset_wins_over_it() -> None:
    log = MemoryGroupLog()
    coord = _coordinator(log)
    _txn_commit(coord, 7, {TP0: 10, TP1: 20})
    coord.commit_offsets(G, "", -1, {TP0: (15, "")})  # later in the log than the transaction's offset
    assert _marker(log, coord, 7, commit=True) == 1
    assert _offsets(coord) == {TP0: 15, TP1: 20}
    assert _offsets(_coordinator(log)) == {TP0: 15, TP1: 20}


def test_producers_are_independent_and_a_marker_ends_only_its_producers_offsets() -> None:
    log = MemoryGroupLog()
    coord = _coordinator(log)
    _txn_commit(coord, 7, {TP0: 10})
    _txn_commit(coord, 8, {TP1: 30})
    _txn_commit(coord, 7, {TP0: 11})  # the same transaction commits again: the later offset
    _marker(log, coord, 8, commit=False)
    assert coord.unstable_offsets(G) == {TP0}
    _marker(log, coord, 7, commit=True)
    assert _offsets(coord) == {TP0: 11}
    assert _offsets(_coordinator(log)) == {TP0: 11}


def test_a_marker_only_reaches_the_groups_the_partition_owns() -> None:
    log = MemoryGroupLog()
    coord = _coordinator(log)
    _txn_commit(coord, 7, {TP0: 10}, group="a")
    _txn_commit(coord, 7, {TP0: 20}, group="b")
    assert coord.complete_transaction(7, commit=True, owns=lambda group_id: group_id == "a") == 1
    assert _offsets(coord, "a") == {TP0: 10} and _offsets(coord, "b") == {}
    assert coord.unstable_offsets("b") == {TP0}


def test_a_members_transactional_commit_is_fenced_as_its_plain_commits() -> None:
    log = MemoryGroupLog()
    coord = _coordinator(log)
    outcome = coord.heartbeat(Heartbeat(G, "m1", 0, subscribed_topics=("t",), request_seq=1))
    assert outcome.state is not None and outcome.state.assignment == {TP0, TP1}
    epoch = outcome.state.member_epoch
    _txn_commit(coord, 7, {TP0: 5}, member_id="m1", member_epoch=epoch)
    with pytest.raises(UnknownMemberIdError):
        _txn_commit(coord, 7, {TP0: 6}, member_id="zombie", member_epoch=epoch)
    _txn_commit(coord, 7, {TP1: 9})  # no member id (an older client): not fenced by the group
    _marker(log, coord, 7, commit=True)
    assert _offsets(coord) == {TP0: 5, TP1: 9}


def test_bad_transactional_commits_are_refused_before_anything_is_written() -> None:
    log = MemoryGroupLog()
    coord = _coordinator(log)
    with pytest.raises(InvalidRequestError):
        _txn_commit(coord, 7, {TP0: -1})
    with pytest.raises(InvalidGroupIdError):
        _txn_commit(coord, 7, {TP0: 1}, group="")
    assert log.records == [] and coord.unstable_offsets(G) == frozenset()


def test_deleting_a_group_removes_its_pending_offsets_for_good() -> None:
    log = MemoryGroupLog()
    coord = _coordinator(log)
    _txn_commit(coord, 7, {TP0: 10})
    coord.delete_group(G)
    _marker(log, coord, 7, commit=True)
    assert _offsets(coord) == {}
    assert _offsets(_coordinator(log)) == {}


@pytest.mark.parametrize("seed", range(20))
def test_random_commits_markers_and_replays_match_the_model(seed: int) -> None:
    rng = random.Random(seed)
    log = MemoryGroupLog()
    coord = _coordinator(log)
    records: list[tuple[int, TopicPartition, int]] = []  # (producer id or -1, tp, offset) in log order
    decided: dict[int, bool] = {}  # position in `records` of a transaction's record -> committed
    open_records: dict[int, list[int]] = {}  # producer id -> positions of its undecided records
    for _ in range(60):
        what = rng.random()
        tp, offset, pid = rng.choice([TP0, TP1]), rng.randrange(1000), rng.choice([1, 2, 3])
        if what < 0.3:
            coord.commit_offsets(G, "", -1, {tp: (offset, "")})
            records.append((-1, tp, offset))
        elif what < 0.7:
            _txn_commit(coord, pid, {tp: offset})
            open_records.setdefault(pid, []).append(len(records))
            records.append((pid, tp, offset))
        elif what < 0.9:
            commit = rng.random() < 0.6
            _marker(log, coord, pid, commit=commit)
            for position in open_records.pop(pid, []):
                decided[position] = commit
        else:
            coord = _coordinator(log)  # a restart: everything from the log
        expected: dict[TopicPartition, int] = {}
        for position, (producer, rtp, roffset) in enumerate(records):
            if producer < 0 or decided.get(position, False):
                expected[rtp] = roffset
        unstable = {records[p][1] for positions in open_records.values() for p in positions}
        assert _offsets(coord) == expected
        assert coord.unstable_offsets(G) == unstable
    replayed = _coordinator(log)
    assert _offsets(replayed) == _offsets(coord)
    assert replayed.unstable_offsets(G) == coord.unstable_offsets(G)


# ---------------------------------------------------------------------------- on __consumer_offsets


def test_on_the_offsets_topic_pending_offsets_hold_the_lso_and_replay_from_the_markers(tmp_path: Path) -> None:
    manager = LogManager(str(tmp_path), topic_defaults=LogConfig())
    manager.startup()
    coord = GroupCoordinator(GroupConfig(), log=TopicGroupLog(manager, partitions=3), topic_partitions=lambda t: 2)
    coord.startup()
    coord.commit_offsets(G, "", -1, {TP1: (4, "")})
    _txn_commit(coord, 7, {TP0: 10})
    part = manager.partition(OFFSETS_TOPIC, TopicGroupLog(manager, partitions=3).internal.partition_of(G))
    assert part.last_stable_offset < part.log.log_end_offset  # the transaction is open there
    restarted = GroupCoordinator(GroupConfig(), log=TopicGroupLog(manager, partitions=3), topic_partitions=lambda t: 2)
    restarted.startup()
    assert _offsets(restarted) == {TP1: 4} and restarted.unstable_offsets(G) == {TP0}
    assert part.append_marker(7, 0, commit=True) is not None
    assert restarted.complete_transaction(7, commit=True, owns=lambda group_id: True) == 1
    assert part.last_stable_offset == part.log.log_end_offset
    again = GroupCoordinator(GroupConfig(), log=TopicGroupLog(manager, partitions=3), topic_partitions=lambda t: 2)
    again.startup()
    assert _offsets(again) == {TP0: 10, TP1: 4} and again.unstable_offsets(G) == frozenset()
    manager.shutdown()


def test_a_transaction_that_ends_while_it_is_verified_is_not_reopened_on_the_offsets_topic(tmp_path: Path) -> None:
    manager = LogManager(str(tmp_path), topic_defaults=LogConfig())
    manager.startup()
    group_log = TopicGroupLog(manager, partitions=3)
    coord = GroupCoordinator(GroupConfig(), log=group_log, topic_partitions=lambda t: 2)
    coord.startup()
    _txn_commit(coord, 7, {TP0: 10})  # the producer's transaction is open on the group's partition
    part = manager.partition(OFFSETS_TOPIC, group_log.internal.partition_of(G))
    part.append_marker(7, 0, commit=False)
    coord.complete_transaction(7, commit=False, owns=lambda group_id: True)

    def aborted_meanwhile() -> None:  # the coordinator said yes, then the transaction timed out
        part.append_marker(7, 0, commit=False)
    end = part.log.log_end_offset
    with pytest.raises(InvalidTxnStateError):
        _txn_commit(coord, 7, {TP0: 20}, verify=aborted_meanwhile)
    assert part.log.log_end_offset == end and part.last_stable_offset == end  # nothing reopened
    assert coord.unstable_offsets(G) == frozenset() and _offsets(coord) == {}
    manager.shutdown()
