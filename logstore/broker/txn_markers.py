"""Transaction markers on a cluster: written by each partition's leader, wherever it is.

The transaction coordinator (:mod:`logstore.broker.transactions.coordinator`) ends a
transaction by writing one COMMIT or ABORT control batch into every partition the
transaction touched. On a single broker every such partition is local. On a cluster
the partitions are led by any broker, so :class:`MarkerSender` — the coordinator's
marker writer there —

1. groups the partitions by their current leader in the broker's
   :class:`~replication.state.ClusterView`;
2. writes the ones this broker leads itself (the same append as a single broker's,
   :meth:`~logstore.storage.partition.Partition.append_marker`), then waits until the
   in-sync replicas have the marker (a marker only the old leader had would leave the
   transaction open on that partition forever after a fail-over);
3. sends the others to their leaders with the inter-broker ``WriteTxnMarkers`` RPC,
   over a channel made as the replication links make theirs (TLS with the peers' CA
   and this broker's certificate, a SCRAM session of the inter-broker user on a SASL
   cluster: :mod:`replication.link_auth`). The leader's handler
   (:meth:`MarkerRpcs.WriteTxnMarkers`) does step 2 for its partitions and answers
   an error per partition (NOT_LEADER_OR_FOLLOWER when leadership moved meanwhile).

:meth:`MarkerSender.write` returns the partitions whose marker did not land (no
leader now, leader unreachable, leadership moved): the coordinator keeps the
transaction in PREPARE_* and retries exactly those in the background until they
land (see ``TransactionCoordinator.retry_markers``). A partition whose topic is no
longer in the cluster's metadata needs no marker (it was deleted).

Idempotence: a marker is written only while the producer has an open transaction
on the partition (``append_marker`` returns None otherwise), so a re-sent marker —
retried after a timeout, or written again by a new coordinator replaying the
decision — adds no second control batch. The coordinator never lets the producer
start its next transaction before every marker of the previous one landed
(CONCURRENT_TRANSACTIONS meanwhile), and a leader does not write a marker whose
request's deadline has passed (its sender gave up and retried), so a late marker
cannot end a newer transaction.

Thread-safety: :meth:`MarkerSender.write` runs on the I/O pool (the coordinator's
caller) and never on the event loop: local appends run in the calling thread, and
only the waits that need no pool thread (replication, RPCs) are handed to the loop
— so a coordinator call that holds a pool thread cannot starve the appends it waits
for. Channels are made and used on the loop only.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections import defaultdict
from collections.abc import Awaitable, Callable, Iterable
from typing import TYPE_CHECKING, Any, TypeVar

import grpc

from logstore._proto import logstore_pb2 as pb
from logstore.broker.rpc_errors import error_to_pb, unexpected
from logstore.errors import LogstoreError, NotLeaderError, RequestTimedOutError
from logstore.storage.log_manager import Partition

if TYPE_CHECKING:
    from logstore.broker.placement import Placement
    from logstore.broker.rpc_gate import RpcGate
    from replication.link_auth import LinkSession
    from replication.state import ClusterView

__all__ = ["MarkerRpcs", "MarkerSender", "TopicPartitionKey"]

T = TypeVar("T")
TopicPartitionKey = tuple[str, int]
log = logging.getLogger("logstore.broker.txn")

_SERVICE = "/logstore.v1.Logstore/"
_ATTEMPT_TIMEOUT_S = 2.0  # one attempt: an RPC to a leader, or the wait for the ISR


class MarkerSender:
    """Writes a transaction's markers on the leaders of its partitions; see the module docstring.

    ``local(topic, partition, producer_id, producer_epoch, commit, coordinator_epoch)`` appends a marker into a
    partition this broker leads (raising when it does not); ``replicated(topic, partition)``
    waits (a coroutine) until the ISR has the partition's log end; ``channel_for(node_id)``
    gives the channel and SASL session to reach a peer broker (made on the loop).
    """

    def __init__(self, node_id: int, *, view: Callable[[], ClusterView | None],
                 local: Callable[[str, int, int, int, bool, int], None],
                 replicated: Callable[[str, int], Awaitable[None]],
                 channel_for: Callable[[int], tuple[grpc.aio.Channel, LinkSession | None] | None],
                 loop: asyncio.AbstractEventLoop, timeout_s: float = _ATTEMPT_TIMEOUT_S) -> None:
        self._node_id = node_id
        self._view = view
        self._local = local
        self._replicated = replicated
        self._channel_for = channel_for
        self._loop = loop
        self._timeout_s = timeout_s

    def write(self, partitions: Iterable[TopicPartitionKey], producer_id: int, producer_epoch: int,
              commit: bool, coordinator_epoch: int) -> list[TopicPartitionKey]:
        """One attempt at every partition's marker; return the partitions still without one.

        A partition that refuses the marker as TRANSACTION_COORDINATOR_FENCED stays without
        one: this coordinator was deposed, and its successor writes the markers."""
        view = self._view()
        by_leader: dict[int, list[TopicPartitionKey]] = defaultdict(list)
        remaining: list[TopicPartitionKey] = []
        for tp in partitions:
            state = None if view is None else view.partitions.get(tp)
            if view is not None and state is None and not tp[0].startswith("__"):
                continue  # the topic is gone: nothing to end there
            leader = self._node_id if state is None else state.leader
            if leader < 0:
                remaining.append(tp)  # offline: retried once a leader is elected
            else:
                by_leader[leader].append(tp)
        for tp in by_leader.pop(self._node_id, []):
            try:
                self._local(tp[0], tp[1], producer_id, producer_epoch, commit, coordinator_epoch)
                self._wait(self._replicated(tp[0], tp[1]))
            except Exception as e:  # noqa: BLE001 - any failure of one partition: retry it later
                log.info("marker for %s-%d (producer %d) not written here yet: %s", tp[0], tp[1], producer_id, e)
                remaining.append(tp)
        for node, tps in by_leader.items():
            try:
                answer = self._wait(self._send(node, tps, producer_id, producer_epoch, commit, coordinator_epoch))
            except Exception as e:  # noqa: BLE001 - unreachable, timed out: retry all of them
                log.info("markers for producer %d to broker %d failed: %s", producer_id, node, e)
                remaining += tps
                continue
            failed = {(p.topic, p.partition) for m in answer.markers for p in m.partitions if p.error.code}
            answered = {(p.topic, p.partition) for m in answer.markers for p in m.partitions}
            remaining += [tp for tp in tps if tp in failed or tp not in answered]
        return remaining

    def _wait(self, coro: Awaitable[T]) -> T:
        async def bounded() -> T:
            return await asyncio.wait_for(coro, self._timeout_s)
        return asyncio.run_coroutine_threadsafe(bounded(), self._loop).result(self._timeout_s + 1)

    async def _send(self, node: int, tps: list[TopicPartitionKey], producer_id: int, producer_epoch: int,
                    commit: bool, coordinator_epoch: int) -> pb.WriteTxnMarkersResponse:
        found = self._channel_for(node)
        if found is None:
            raise NotLeaderError(f"broker {node} is not registered")
        channel, session = found
        metadata = await session.metadata(channel, self._timeout_s) if session is not None else None
        call = channel.unary_unary(_SERVICE + "WriteTxnMarkers",
                                   request_serializer=pb.WriteTxnMarkersRequest.SerializeToString,
                                   response_deserializer=pb.WriteTxnMarkersResponse.FromString)
        request = pb.WriteTxnMarkersRequest(markers=[pb.TxnMarker(
            producer_id=producer_id, producer_epoch=producer_epoch, commit=commit,
            coordinator_epoch=coordinator_epoch, partitions=[pb.TopicPartitionRef(topic=t, partition=p) for t, p in tps])])
        try:
            answer: pb.WriteTxnMarkersResponse = await call(request, timeout=self._timeout_s, metadata=metadata)
        except grpc.aio.AioRpcError:
            if session is not None:
                session.invalidate()  # refused for its session, perhaps: log in again next time
            raise
        return answer


class MarkerRpcs:
    """The ``WriteTxnMarkers`` handler, and the leader's side of a marker for the coordinator
    here: a coordinator (elsewhere, or this broker's own through :class:`MarkerSender`'s
    ``local``) asks this broker, as the leader, to write markers (the RPC is authorized as
    CLUSTER_ACTION by the guard of the cluster RPCs).

    ``leader(topic, partition)`` is the partition this broker leads; ``replicated(topic)``
    whether its markers must reach the in-sync replicas, through ``replicas()`` (None on a
    single broker); ``wake(topic, partition)`` wakes the fetches waiting on it (the data
    plane's), from any thread via ``loop()``; ``written(topic, partition, producer_id, commit)``
    is told of every marker written here, in the writing thread (the group coordinator applies
    or drops a transaction's offsets when its marker lands on ``__consumer_offsets``).
    """

    def __init__(self, *, placement: Placement, wake: Callable[[str, int], None],
                 loop: Callable[[], asyncio.AbstractEventLoop | None], gate: RpcGate,
                 written: Callable[[str, int, int, bool], None] = lambda topic, partition, pid, commit: None) -> None:
        self._placement = placement
        self._wake = wake
        self._loop = loop
        self._gate = gate
        self._written = written

    def rpcs(self) -> dict[str, Callable[..., Awaitable[Any]]]:
        """The RPCs this handler implements, by name."""
        return {"WriteTxnMarkers": self.WriteTxnMarkers}

    async def WriteTxnMarkers(self, request: pb.WriteTxnMarkersRequest,
                              context: grpc.aio.ServicerContext) -> pb.WriteTxnMarkersResponse:
        async def body() -> pb.WriteTxnMarkersResponse:
            results = []
            remaining = context.time_remaining()
            deadline = time.monotonic() + (remaining if remaining is not None else _ATTEMPT_TIMEOUT_S)
            for marker in request.markers:
                answers = await asyncio.gather(*(self._one_marker(marker, p.topic, p.partition, deadline)
                                                 for p in marker.partitions))
                results.append(pb.TxnMarkerResult(producer_id=marker.producer_id, partitions=answers))
            return pb.WriteTxnMarkersResponse(markers=results)
        return await self._gate.guard("WriteTxnMarkers", context, body)

    async def _one_marker(self, marker: pb.TxnMarker, topic: str, partition: int,
                          deadline: float) -> pb.TopicPartitionError:
        answer = pb.TopicPartitionError(topic=topic, partition=partition)

        def append() -> None:
            # A marker whose sender gave up must not be written late: the coordinator retried it
            # (a no-op then) and may have let the producer begin its next transaction here.
            if time.monotonic() >= deadline:
                raise RequestTimedOutError(f"the marker for {topic}-{partition} came after its deadline")
            self.append_marker_here(part, marker.producer_id, marker.producer_epoch, marker.commit,
                                    marker.coordinator_epoch)
        try:
            part = self._placement.leader(topic, partition)
            await self._gate.run_io(append)
            await self.marker_replicated(topic, partition, _ATTEMPT_TIMEOUT_S)
        except LogstoreError as e:
            answer.error.CopyFrom(error_to_pb(e))
        except Exception as e:  # noqa: BLE001
            answer.error.CopyFrom(error_to_pb(unexpected(e, "WriteTxnMarkers")))
        return answer

    def append_marker_here(self, part: Partition, producer_id: int, producer_epoch: int, commit: bool,
                           coordinator_epoch: int) -> None:
        """Append a marker into a partition this broker leads (none when the producer has no open
        transaction there: a re-sent marker; TRANSACTION_COORDINATOR_FENCED from a coordinator
        older than the last marker's), tell ``written``, then wake its waiting fetches."""
        if part.append_marker(producer_id, producer_epoch, commit=commit,
                              coordinator_epoch=coordinator_epoch) is not None:
            self._written(part.topic, part.partition, producer_id, commit)
            loop = self._loop()
            if loop is not None:
                loop.call_soon_threadsafe(self._wake, part.topic, part.partition)

    async def marker_replicated(self, topic: str, partition: int, timeout_s: float) -> None:
        """Wait until the in-sync replicas have everything this leader has of the partition
        (a no-op on a single broker and for internal topics)."""
        replicas = self._placement.replicas
        if replicas is None or not self._placement.replicated(topic):
            return
        part = self._placement.leader(topic, partition)
        await replicas.wait_replicated(topic, partition, part.log.log_end_offset, timeout_s)
