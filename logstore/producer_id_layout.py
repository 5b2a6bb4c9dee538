"""The layout of a producer id: a plain counter, or a counter bound to a principal (issue 22).

A producer id is a non-negative int64. The allocator (the producer-id block of a single
broker, or etcd's counter on a cluster) hands out **counters**. With the authorizer on,
an idempotent producer's id is *bound* (:mod:`logstore.broker.security.producer_ids`)::

    bit 63      0
    bit 62      1: a bound id
    bits 30-61  the counter (32 bits)
    bits 0-29   a MAC of the principal it was issued to

Anything that derives "the ids in use" from stored ids (the floor of the allocator after
a lost producer-id block) must compare :func:`counter_of` values, never the ids: a bound
id is far above every counter, and taking it for one would push the allocator past 2^62.

Thread-safety: pure functions.
"""

from __future__ import annotations

__all__ = ["BOUND_BIT", "COUNTER_BITS", "MAC_BITS", "counter_of", "is_bound"]

BOUND_BIT = 1 << 62
COUNTER_BITS = 32
MAC_BITS = 30
_COUNTER_MASK = (1 << COUNTER_BITS) - 1


def is_bound(producer_id: int) -> bool:
    """Whether ``producer_id`` is a bound idempotent id (not a plain counter)."""
    return producer_id >= 0 and bool(producer_id & BOUND_BIT)


def counter_of(producer_id: int) -> int:
    """The allocator's counter behind ``producer_id`` (the id itself for a plain one; -1 stays -1)."""
    return (producer_id >> MAC_BITS) & _COUNTER_MASK if is_bound(producer_id) else producer_id
