"""Where a new topic's replicas go: Kafka's assignment, rack-aware when racks are known.

:func:`assign_replicas` is Kafka's ``AdminUtils.assignReplicasToBrokers`` in Python, for the same
reasons:

* **Leaders spread evenly.** Partition ``p``'s first replica (its preferred leader) is broker
  ``(start + p) mod n`` of the brokers sorted by id, so every broker leads ``partitions / n``
  partitions (±1).
* **Followers spread evenly too.** The followers are taken at a shift from the leader that grows
  by one after every ``n`` partitions, so the followers of one broker's partitions land on
  different brokers, and when that broker dies its load spreads instead of doubling one peer.
* **Random start.** Without ``start`` the start index and the first shift are random, so topic
  after topic does not pile its partition 0 leaders on the lowest broker id.
* **Racks.** When every broker declares a rack, the brokers are first arranged rack-alternating
  (r1's first, r2's first, r3's first, r1's second, ...), and each follower is the next broker
  at the shift whose rack has no replica of the partition yet, until every rack has one; so a
  partition survives the loss of a whole rack when it has replicas on more than one.

A pure function: no I/O, deterministic given ``start``.
"""

from __future__ import annotations

import random
from collections.abc import Sequence

from logstore.errors import InvalidReplicationFactorError
from replication.state import BrokerRegistration

__all__ = ["assign_replicas"]


def _replica_index(first: int, shift: int, j: int, n: int) -> int:
    """Kafka's follower index: ``j``-th follower of the replica at ``first``, at ``shift``."""
    return (first + 1 + (shift + j) % (n - 1)) % n


def assign_replicas(partitions: int, replication_factor: int, brokers: Sequence[BrokerRegistration],
                    *, start: int | None = None) -> dict[int, list[int]]:
    """Replica lists (preferred leader first) for partitions ``0..partitions-1``.

    Raises :class:`InvalidReplicationFactorError` if ``replication_factor`` is below 1 or above
    the number of ``brokers`` (the live ones: a replica on a dead broker would start offline).
    """
    n = len(brokers)
    if replication_factor < 1 or replication_factor > n:
        raise InvalidReplicationFactorError(
            f"replication factor {replication_factor} is not possible with {n} live broker(s): "
            f"it must be between 1 and {n}")
    if partitions < 1:
        raise ValueError(f"a topic needs at least one partition, not {partitions}")
    rng = random.Random()
    start_index = start if start is not None else rng.randrange(n)
    shift = start if start is not None else rng.randrange(n)
    if all(b.rack for b in brokers):
        return _rack_aware(partitions, replication_factor, brokers, start_index, shift)
    ids = sorted(b.node_id for b in brokers)
    out: dict[int, list[int]] = {}
    for p in range(partitions):
        if p > 0 and p % n == 0:
            shift += 1
        first = (p + start_index) % n
        out[p] = [ids[first]] + [ids[_replica_index(first, shift, j, n)] for j in range(replication_factor - 1)]
    return out


def _rack_alternated(brokers: Sequence[BrokerRegistration]) -> list[BrokerRegistration]:
    by_rack: dict[str, list[BrokerRegistration]] = {}
    for b in sorted(brokers, key=lambda b: b.node_id):
        by_rack.setdefault(b.rack, []).append(b)
    racks = [by_rack[r] for r in sorted(by_rack)]
    out: list[BrokerRegistration] = []
    for i in range(max(len(r) for r in racks)):
        out.extend(r[i] for r in racks if i < len(r))
    return out


def _rack_aware(partitions: int, rf: int, brokers: Sequence[BrokerRegistration],
                start_index: int, shift: int) -> dict[int, list[int]]:
    arranged = _rack_alternated(brokers)
    n = len(arranged)
    num_racks = len({b.rack for b in arranged})
    out: dict[int, list[int]] = {}
    for p in range(partitions):
        if p > 0 and p % n == 0:
            shift += 1
        first = (p + start_index) % n
        leader = arranged[first]
        replicas = [leader.node_id]
        racks_used = {leader.rack}
        k = 0
        for _ in range(rf - 1):
            while True:
                b = arranged[_replica_index(first, shift * num_racks, k, n)]
                k += 1
                rack_ok = b.rack not in racks_used or len(racks_used) == num_racks
                broker_ok = b.node_id not in replicas
                if rack_ok and broker_ok:
                    replicas.append(b.node_id)
                    racks_used.add(b.rack)
                    break
        out[p] = replicas
    return out
