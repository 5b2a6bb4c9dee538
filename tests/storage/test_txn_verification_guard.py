"""The verification guard of a transactional batch whose coordinator is another broker (KIP-890).

A leader appends such a batch only if it continues the producer's open transaction on the
partition, or carries the guard the leader took before asking the coordinator; a marker
written meanwhile drops the guard, so a transaction that ended while its first batch was
being verified is not reopened by it (issue 22; the cluster end of it is in
tests/e2e/test_cluster_transactions.py).
"""

from __future__ import annotations

import pytest
from storage_helpers import SCHEMA, config, produced, simple_batch

from logstore.errors import InvalidTxnStateError, ProducerFencedError
from logstore.storage.log import Log
from logstore.storage.partition import Partition

pytestmark = pytest.mark.timeout(60)

PID, EPOCH = 41, 0


def leader(tmp_path) -> Partition:  # type: ignore[no-untyped-def]
    part = Partition("t", 0, Log.open(str(tmp_path / "p"), config=config(), schema=SCHEMA), replicated=True)
    part.become_leader(1)
    return part


def stable(part: Partition) -> bool:
    """Whether read_committed readers may read everything (no transaction left open)."""
    part.update_high_watermark(part.log.log_end_offset)
    return part.last_stable_offset == part.log.log_end_offset


def send(part: Partition, seq: int, guard: object, *, epoch: int = EPOCH) -> int:
    return part.append(*produced(simple_batch(1, tag=f"s{seq}".encode()), producer_id=PID, producer_epoch=epoch,
                                 base_sequence=seq, attributes=1), fsync=False, txn_guard=guard)[0]


def test_a_first_batch_needs_the_guard_and_later_ones_continue_the_transaction(tmp_path) -> None:  # type: ignore[no-untyped-def]
    part = leader(tmp_path)
    with pytest.raises(InvalidTxnStateError, match="no open transaction"):
        send(part, 0, object())          # not the partition's guard: never verified
    refused = part.verification_guard(PID)   # another request's, whose coordinator said no
    guard = part.verification_guard(PID)
    part.release_verification_guard(PID, refused)
    with pytest.raises(InvalidTxnStateError):
        send(part, 0, refused)                  # given back: it opens nothing
    assert send(part, 0, guard) == 0            # another request's guard is not spoiled by it
    part.release_verification_guard(PID, guard)
    assert part.in_open_transaction(PID, EPOCH)
    assert send(part, 1, object()) == 1             # continues the open transaction
    with pytest.raises(InvalidTxnStateError):
        send(part, 0, object(), epoch=EPOCH + 1)    # another epoch opens a new transaction: verify it
    part.append_marker(PID, EPOCH, commit=True)
    assert not part.in_open_transaction(PID, EPOCH)
    assert stable(part)


def test_a_marker_during_verification_keeps_the_batch_from_reopening_the_transaction(tmp_path) -> None:  # type: ignore[no-untyped-def]
    part = leader(tmp_path)
    guard = part.verification_guard(PID)
    assert send(part, 0, guard) == 0
    late = part.verification_guard(PID)   # a second request of the same transaction, asking
    part.append_marker(PID, EPOCH, commit=False)   # the coordinator aborts (a timeout) meanwhile
    with pytest.raises(InvalidTxnStateError, match="ended meanwhile"):
        send(part, 1, late)
    assert stable(part)   # nothing left open


def test_a_coordinators_transactional_append_needs_the_guard_to_open_a_transaction(tmp_path) -> None:  # type: ignore[no-untyped-def]
    """A transaction's consumer offsets (the group coordinator's append into __consumer_offsets)."""
    part = leader(tmp_path)
    guard = part.verification_guard(PID)
    part.append_marker(PID, EPOCH, commit=False)  # the transaction ended while it was being verified
    with pytest.raises(InvalidTxnStateError, match="ended while"):
        part.append_coordinator_transactional(simple_batch(1), producer_id=PID, producer_epoch=EPOCH, fsync=False,
                                              txn_guard=guard)
    assert stable(part) and part.log.log_end_offset == 0
    guard = part.verification_guard(PID)
    base, last = part.append_coordinator_transactional(simple_batch(2), producer_id=PID, producer_epoch=EPOCH,
                                                       fsync=False, txn_guard=guard)
    part.release_verification_guard(PID, guard)
    assert (base, last) == (0, 1) and not stable(part)  # open until its marker
    part.append_coordinator_transactional(simple_batch(1), producer_id=PID, producer_epoch=EPOCH, fsync=False,
                                          txn_guard=object())  # continues the open transaction
    assert part.append_marker(PID, EPOCH, commit=True) == 3
    assert stable(part)


def test_a_coordinators_transactional_append_of_an_older_epoch_is_fenced(tmp_path) -> None:  # type: ignore[no-untyped-def]
    part = leader(tmp_path)
    part.append_coordinator_transactional(simple_batch(1), producer_id=PID, producer_epoch=EPOCH + 1, fsync=False)
    with pytest.raises(ProducerFencedError):
        part.append_coordinator_transactional(simple_batch(1), producer_id=PID, producer_epoch=EPOCH, fsync=False)
    assert part.log.log_end_offset == 1
