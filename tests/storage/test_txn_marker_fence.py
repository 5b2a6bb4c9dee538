"""A deposed transaction coordinator's marker is refused (Kafka's coordinator epoch).

A marker carries the epoch of the coordinator that wrote it (the leader epoch of its
``__transaction_state`` partition). A partition remembers, per producer, the newest one
and refuses a marker from an older coordinator with TRANSACTION_COORDINATOR_FENCED, so a
coordinator that lost its partition and sends a marker late cannot end the producer's next
transaction. The epoch is kept in the marker's batch facts: a partition reopened without
its producer-state snapshot replays it from the log (the cluster end is in
tests/e2e/test_cluster_transactions.py).
"""

from __future__ import annotations

import os

import pytest
from storage_helpers import SCHEMA, config, produced, simple_batch

from logstore.errors import TransactionCoordinatorFencedError
from logstore.storage.log import Log
from logstore.storage.partition import Partition
from logstore.storage.producer_state import PRODUCER_STATE_FILE

pytestmark = pytest.mark.timeout(60)

PID, EPOCH = 41, 0


def leader(path: str) -> Partition:
    part = Partition("t", 0, Log.open(path, config=config(), schema=SCHEMA), replicated=True)
    part.become_leader(1)
    return part


def send(part: Partition, seq: int) -> None:
    part.append(*produced(simple_batch(1, tag=f"s{seq}".encode()), producer_id=PID, producer_epoch=EPOCH,
                          base_sequence=seq, attributes=1), fsync=False, txn_guard=part.verification_guard(PID))


@pytest.mark.parametrize("snapshot", [True, False])
def test_a_marker_from_an_older_coordinator_than_the_last_is_refused(tmp_path, snapshot: bool) -> None:  # type: ignore[no-untyped-def]
    path = str(tmp_path / "p")
    part = leader(path)
    send(part, 0)
    assert part.append_marker(PID, EPOCH, commit=True, coordinator_epoch=2) is not None
    part.close()
    if not snapshot:
        os.remove(os.path.join(path, PRODUCER_STATE_FILE))   # the epoch comes back from the log
    part = leader(path)
    send(part, 1)                         # the producer's next transaction
    end = part.log.log_end_offset
    with pytest.raises(TransactionCoordinatorFencedError, match="coordinator epoch 1 is fenced"):
        part.append_marker(PID, EPOCH, commit=False, coordinator_epoch=1)
    assert part.log.log_end_offset == end and part.in_open_transaction(PID, EPOCH)   # nothing written
    assert part.append_marker(PID, EPOCH, commit=True, coordinator_epoch=2) == end   # its own coordinator's
    assert not part.in_open_transaction(PID, EPOCH)
    part.close()


def test_a_marker_without_an_epoch_is_not_fenced(tmp_path) -> None:  # type: ignore[no-untyped-def]
    """Markers written before the epoch was kept (-1), and a single broker's, pass."""
    part = leader(str(tmp_path / "p"))
    send(part, 0)
    assert part.append_marker(PID, EPOCH, commit=True, coordinator_epoch=3) is not None
    send(part, 1)
    assert part.append_marker(PID, EPOCH, commit=True) is not None
    part.close()
