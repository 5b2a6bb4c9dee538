"""The leader's ISR bookkeeping (:class:`replication.leader.LeaderState`) on a real log.

A follower that fell behind and catches up in parts (each fetch bounded) reaches the HWM
before it reaches where the leader was at its previous fetch, so its last caught-up time is
still the one from before it fell behind. Rejoining the ISR makes it caught up as of then;
before, the next lag check took it out again at once (the resumed replica seen leaving the
ISR right after it rejoined).
"""

from __future__ import annotations

import pytest
from storage_helpers import SCHEMA, config, produced, simple_batch

from logstore.storage.log import Log
from logstore.storage.partition import Partition
from replication.leader import LeaderState
from replication.state import PartitionState

pytestmark = pytest.mark.timeout(60)

LAG_MS = 1_000


def test_a_follower_that_rejoins_the_isr_is_not_shrunk_out_at_the_next_check(tmp_path) -> None:  # type: ignore[no-untyped-def]
    part = Partition("t", 0, Log.open(str(tmp_path / "p"), config=config(), schema=SCHEMA), replicated=True)
    part.become_leader(1)
    state = PartitionState("t", 0, replicas=(1, 2, 3), leader=1, leader_epoch=1, isr=(1, 2))
    leader = LeaderState(part, state, node_id=1, min_insync_replicas=1, replica_lag_time_max_ms=LAG_MS, now_ms=0)
    for _ in range(10):
        part.append(*produced(simple_batch(1)), fsync=False)
    assert part.log.log_end_offset == 10
    leader.on_follower_fetch(3, 0, now_ms=0)         # node 3 far behind: the leader's LEO was 10
    leader.on_follower_fetch(2, 4, now_ms=5_000)     # node 2 in the ISR: the HWM is 4
    assert part.high_watermark == 4
    leader.on_follower_fetch(3, 6, now_ms=5_000)     # node 3 got part of it: past the HWM, short of 10
    assert leader.expand_candidate(3, now_ms=5_000)
    leader.set_state(state.with_isr((1, 2, 3)))
    assert 3 not in leader.shrink_candidates(5_001)      # caught up as of its rejoining
    assert 3 in leader.shrink_candidates(5_000 + LAG_MS + 1)   # and lagging again if it stops there
    part.close()
