"""A partition's offsets as its leader knows them, in a Metadata answer from a cluster.

A broker's Metadata answer carries the log offsets (log start, LEO, HWM, LSO,
size) of its own replica of each partition. On a cluster that replica may be a
follower's, or absent, so the offsets of partitions led elsewhere can be behind or
zero (a follower's HWM trails the leader's; a broker with no replica reports 0).
What an operator asks of ``describe_topics``/``group_lag`` is the leader's view:
:func:`with_leader_offsets` asks each leader once for the topics it leads and
takes its numbers for its partitions. A single broker's answer is already that.

Thread-safety: pure function of its arguments (``ask`` makes the calls).
"""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Callable

from logstore._proto import logstore_pb2 as pb
from logstore.errors import LogstoreError

__all__ = ["with_leader_offsets"]

_OFFSET_FIELDS = ("log_start_offset", "log_end_offset", "high_watermark", "last_stable_offset", "size_bytes")


def with_leader_offsets(response: pb.MetadataResponse,
                        ask: Callable[[str, list[str]], pb.MetadataResponse]) -> pb.MetadataResponse:
    """``response`` with each partition's offsets taken from its leader's own answer.

    ``ask(address, topics)`` is a Metadata call to one broker. A leader that cannot
    be asked (unreachable, restarting) leaves the answering broker's numbers in place.
    """
    if len(response.brokers) <= 1:
        return response
    addresses = {b.node_id: f"{b.host}:{b.port}" for b in response.brokers}
    led: dict[int, set[str]] = defaultdict(set)
    for topic in response.topics:
        for part in topic.partitions:
            if part.leader in addresses:
                led[part.leader].add(topic.name)
    for leader, names in led.items():
        try:
            answer = ask(addresses[leader], sorted(names))
        except LogstoreError:
            continue
        theirs = {(t.name, p.partition): p for t in answer.topics for p in t.partitions if p.leader == leader}
        for topic in response.topics:
            for part in topic.partitions:
                own = theirs.get((topic.name, part.partition))
                if part.leader == leader and own is not None:
                    for field in _OFFSET_FIELDS:
                        setattr(part, field, getattr(own, field))
    return response
