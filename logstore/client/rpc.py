"""The typed connection to a broker: :class:`BrokerClient`, composed of RPC parts.

Every RPC of ``logstore/_proto/logstore.proto`` has one typed method on the
client or on one of its parts;
:class:`~logstore.client.producer.Producer`, :class:`~logstore.client.consumer.Consumer`,
:class:`~logstore.client.admin.Admin` and the Spark connectors build on them and
never touch protobuf or grpc themselves. The client's own methods are topics,
produce, fetch, offsets and transactions; the parts, each handed the client's
:class:`~logstore.client.transport.Transport` in its constructor and none
importing another, are ``client.groups`` (:mod:`.rpc_groups`),
``client.cleaning`` (:mod:`.rpc_cleaning`) and ``client.scram``
(:mod:`.rpc_scram`); the admin's ACL and reassignment calls
(:mod:`.acls`, :mod:`.reassignments`) use the same transport.

Around this module: channels, deadlines, routing and the one gRPC call path
are the transport's (:mod:`logstore.client.transport`); errors are mapped in
one place, at that boundary (:mod:`logstore.client.error_mapping`); the
values returned are in :mod:`logstore.client.results`; requests and answers are
translated by :mod:`logstore.client.messages`, Produce and Fetch in the wire
form of :mod:`logstore.wire` (records copied once in, never out).

Every call has a deadline: ``request_timeout_ms`` (per client, overridable
per call); a fetch gets its long-poll wait on top.

Thread-safety: a :class:`BrokerClient` is safe to share between threads (the
underlying gRPC channel is). It pickles as its bootstrap address and options:
unpickling builds a new transport and parts and opens a new channel, so Spark
tasks get their own connections.
"""

from __future__ import annotations

import concurrent.futures
import functools
import time
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import replace
from typing import Any, TypeVar

from google.protobuf.message import DecodeError

from logstore._proto import logstore_pb2 as pb
from logstore.client import messages
from logstore.client.bootstrap import parse_bootstrap_list
from logstore.client.coordinator_lookup import TRANSACTION
from logstore.client.error_mapping import error_from_item, raise_for_item
from logstore.client.fanout import join_fetch, join_produce
from logstore.client.leader_offsets import with_leader_offsets
from logstore.client.results import (
    ClusterMetadata,
    ConfigAlteration,
    FetchedPartition,
    FetchRequestPartition,
    ProducedPartition,
    RpcFuture,
)
from logstore.client.routing import LEADER_ERRORS, MAX_MESSAGE_BYTES
from logstore.client.rpc_cleaning import CleaningRpcs
from logstore.client.rpc_groups import GroupRpcs
from logstore.client.rpc_scram import ScramRpcs
from logstore.client.security import ClientSecurity
from logstore.client.throttle import default_client_id
from logstore.client.transport import Transport
from logstore.defaults import default_bootstrap
from logstore.errors import (
    BrokerUnavailableError,
    LogstoreError,
    OffsetNotAvailableError,
    UnknownServerError,
)
from logstore.naming import coordinator_key
from logstore.types import (
    ListedOffset,
    NewTopic,
    TopicPartition,
    TxnRef,
)
from logstore.wire import RecordsArg, encode_produce_request

__all__ = ["BrokerClient", "ISOLATION_LEVELS", "EARLIEST_TIMESTAMP", "LATEST_TIMESTAMP", "MAX_MESSAGE_BYTES",
           "DEFAULT_REQUEST_TIMEOUT_MS"]

DEFAULT_REQUEST_TIMEOUT_MS = 30_000
# ListOffsets sentinels (the proto's conventions).
EARLIEST_TIMESTAMP = -2
LATEST_TIMESTAMP = -1
ISOLATION_LEVELS: dict[str, pb.IsolationLevel] = {"read_uncommitted": pb.READ_UNCOMMITTED,
                                                   "read_committed": pb.READ_COMMITTED}

_T = TypeVar("_T")
# Between asking partitions again whose leader moved (the metadata is refreshed meanwhile).
_REROUTE_PAUSE_S = 0.05

# --------------------------------------------------------------------------- the client


def _encode_produce(partitions: Sequence[tuple[TopicPartition, RecordsArg]], correlation_id: int, *, acks: int,
                    timeout_ms: int, transactional_id: str, leader_epochs: Mapping[TopicPartition, int]) -> bytes:
    return encode_produce_request(partitions, acks=acks, timeout_ms=timeout_ms, transactional_id=transactional_id,
                                  leader_epochs=leader_epochs, correlation_id=correlation_id)


def _rebuild_client(bootstrap: str, request_timeout_ms: int, security: ClientSecurity | None = None,
                    client_id: str | None = None) -> BrokerClient:
    return BrokerClient(bootstrap, request_timeout_ms=request_timeout_ms, security=security, client_id=client_id)


class BrokerClient:
    """A connection to one broker with a typed method per RPC.

    ``bootstrap`` is ``"host:port"`` (default :func:`logstore.defaults.default_bootstrap`:
    ``$LOGSTORE_BOOTSTRAP`` or ``127.0.0.1:9392``). The channel connects lazily;
    a broker that is down surfaces as :class:`BrokerUnavailableError` on the
    first call. Use :meth:`close` (or ``with``) to release the channel.

    Built from parts that share one :attr:`transport` (channels, deadlines,
    routes; :mod:`logstore.client.transport`): topics, produce, fetch, offsets
    and transactions are methods here; the consumer group calls are
    :attr:`groups` (:mod:`.rpc_groups`), the compaction calls :attr:`cleaning`
    (:mod:`.rpc_cleaning`), the SCRAM credential calls :attr:`scram`
    (:mod:`.rpc_scram`).

    Thread-safe; picklable (see the module docstring).
    """

    def __init__(
        self,
        bootstrap: str | Sequence[str] | None = None,
        *,
        request_timeout_ms: int = DEFAULT_REQUEST_TIMEOUT_MS,
        security: ClientSecurity | None = None,
        client_id: str | None = None,
    ) -> None:
        # Malformed addresses: InvalidBootstrapError (also a ValueError), see logstore.client.bootstrap.
        entries = parse_bootstrap_list(bootstrap or default_bootstrap())
        if request_timeout_ms <= 0:
            raise ValueError(f"request_timeout_ms must be positive, got {request_timeout_ms}")
        self._request_timeout_ms = int(request_timeout_ms)
        self._security = security  # TLS and SCRAM (logstore.client.security); None: plaintext
        # Sent with every call: what broker quotas know this client by (logstore.client.throttle).
        self._client_id = default_client_id() if client_id is None else str(client_id)
        self.transport = Transport(entries, request_timeout_ms=self._request_timeout_ms, security=security,
                                   client_id=self._client_id)
        self.groups = GroupRpcs(self.transport)
        self.cleaning = CleaningRpcs(self.transport)
        self.scram = ScramRpcs(self.transport)

    @classmethod
    def from_bootstrap(cls, bootstrap: str) -> BrokerClient:
        """A client for ``bootstrap`` with default options (what a Spark task calls)."""
        return cls(bootstrap)

    @property
    def bootstrap(self) -> str:
        return self.transport.bootstrap

    @property
    def request_timeout_ms(self) -> int:
        return self._request_timeout_ms

    @property
    def closed(self) -> bool:
        return self.transport.closed

    @property
    def client_id(self) -> str:
        return self._client_id

    def throttle_stats(self) -> tuple[int, int]:
        """(requests a broker throttled, their throttle times summed in ms): quota pressure."""
        return self.transport.router.throttle_stats()

    def __reduce__(self) -> tuple[Callable[..., BrokerClient], tuple[str, int, ClientSecurity | None, str]]:
        # The parts and their transport are not pickled: unpickling builds them anew.
        return (_rebuild_client, (self.bootstrap, self._request_timeout_ms, self._security, self._client_id))

    def __repr__(self) -> str:
        return f"BrokerClient({self.bootstrap!r})"

    def close(self) -> None:
        """Close the channels; calls in flight fail. Idempotent."""
        self.transport.close()

    def __enter__(self) -> BrokerClient:
        return self

    def __exit__(self, *exc_info: object) -> None:
        self.close()

    # ------------------------------------------------------------------ topics

    def create_topics(
        self, topics: Sequence[NewTopic], *, validate_only: bool = False,
        timeout_ms: int | None = None,
    ) -> dict[str, LogstoreError | None]:
        """Create ``topics``; return each name's error (None = created or, with validate_only, valid)."""
        request = pb.CreateTopicsRequest(topics=[messages.new_topic(t) for t in topics],
                                         validate_only=validate_only)
        response = self.transport.call("CreateTopics", request, timeout_s=self.transport.deadline_s(timeout_ms))
        return {r.name: error_from_item(r.error) for r in response.results}

    def delete_topics(
        self, names: Sequence[str], *, timeout_ms: int | None = None
    ) -> dict[str, LogstoreError | None]:
        """Delete topics; return each name's error (None = deleted)."""
        response = self.transport.call(
            "DeleteTopics", pb.DeleteTopicsRequest(names=list(names)),
            timeout_s=self.transport.deadline_s(timeout_ms),
        )
        return {r.name: error_from_item(r.error) for r in response.results}

    def create_partitions(
        self, counts: Mapping[str, int], *, validate_only: bool = False, timeout_ms: int | None = None
    ) -> dict[str, LogstoreError | None]:
        """Grow each topic to its new partition count; return each topic's error (None = done)."""
        request = pb.CreatePartitionsRequest(
            topics=[pb.CreatePartitionsRequest.Topic(name=n, count=c) for n, c in counts.items()],
            validate_only=validate_only)
        response = self.transport.call("CreatePartitions", request, timeout_s=self.transport.deadline_s(timeout_ms))
        return {r.name: error_from_item(r.error) for r in response.results}

    def metadata(self, topics: Sequence[str] | None = None, *, timeout_ms: int | None = None,
                 leader_offsets: bool = False) -> ClusterMetadata:
        """Describe ``topics`` (None or empty = every topic).

        A topic the broker could not describe (e.g. unknown) is in ``topic_errors``
        instead of ``topics``. With ``leader_offsets``, each partition's offsets are
        its leader's (on a cluster, one more call per leader: :mod:`.leader_offsets`).
        """
        timeout_s = self.transport.deadline_s(timeout_ms)
        response = self.transport.call("Metadata", pb.MetadataRequest(topics=list(topics or ())), timeout_s=timeout_s)
        self.transport.router.learn(response)
        if leader_offsets:
            response = with_leader_offsets(response, lambda address, names: self.transport.call(
                "Metadata", pb.MetadataRequest(topics=names), timeout_s=timeout_s,
                conn=self.transport.router.connection(address)))
        return messages.cluster_metadata(response)

    def describe_configs(
        self, topics: Sequence[str], *, timeout_ms: int | None = None
    ) -> dict[str, dict[str, str] | LogstoreError]:
        """Each topic's effective configs (Kafka names, string values), or its error."""
        response = self.transport.call(
            "DescribeConfigs", pb.DescribeConfigsRequest(topics=list(topics)),
            timeout_s=self.transport.deadline_s(timeout_ms),
        )
        return {r.name: error_from_item(r.error) or dict(r.configs) for r in response.results}

    def alter_configs(
        self, alterations: Mapping[str, ConfigAlteration], *, validate_only: bool = False,
        timeout_ms: int | None = None,
    ) -> dict[str, LogstoreError | None]:
        """Apply config changes per topic; return each topic's error (None = applied)."""
        request = messages.alter_configs_request(alterations, validate_only=validate_only)
        response = self.transport.call("AlterConfigs", request, timeout_s=self.transport.deadline_s(timeout_ms))
        return {r.name: error_from_item(r.error) for r in response.results}

    # ------------------------------------------------------------------ produce

    def produce_async(
        self,
        partitions: Sequence[tuple[TopicPartition, RecordsArg]],
        *,
        acks: int,
        timeout_ms: int | None = None,
        transactional_id: str = "",
    ) -> concurrent.futures.Future[list[ProducedPartition]]:
        """Send a Produce request without blocking.

        Each item is a partition and a complete Arrow IPC stream (stored
        schema message + batch messages), as bytes or as a sequence of
        bytes-like pieces to be concatenated. The future holds one
        :class:`ProducedPartition` per item (item errors inside), or raises
        the mapped error when the whole call failed. The broker gets
        ``timeout_ms`` to satisfy ``acks``; the call's deadline adds
        ``request_timeout_ms`` to that.
        """
        wait_ms = self._request_timeout_ms if timeout_ms is None else timeout_ms
        timeout_s = self.transport.deadline_s(wait_ms, self._request_timeout_ms)
        tps = [tp for tp, _ in partitions]
        calls = []
        for conn, indexes, epochs in self.transport.router.split(tps) or [(self.transport.router.home, [], {})]:
            encode = functools.partial(_encode_produce, [partitions[i] for i in indexes], acks=acks,
                                       timeout_ms=wait_ms, transactional_id=transactional_id, leader_epochs=epochs)
            calls.append((indexes, self.transport.produce_future(
                encode, timeout_s=timeout_s, convert=self._produced, conn=conn)))
        return calls[0][1] if len(calls) == 1 else join_produce(tps, calls)

    def _produced(self, response: pb.ProduceResponse) -> list[ProducedPartition]:
        answers = messages.produced_partitions(response)
        self.transport.router.note_errors((TopicPartition(a.topic, a.partition), a.error) for a in answers)
        return answers

    def produce(
        self,
        partitions: Sequence[tuple[TopicPartition, RecordsArg]],
        *,
        acks: int,
        timeout_ms: int | None = None,
    ) -> list[ProducedPartition]:
        """Blocking form of :meth:`produce_async`."""
        return self.produce_async(partitions, acks=acks, timeout_ms=timeout_ms).result()

    # ------------------------------------------------------------------ fetch

    def fetch(
        self,
        partitions: Sequence[FetchRequestPartition],
        *,
        max_wait_ms: int,
        min_bytes: int = 1,
        max_bytes: int = 64 << 20,
        isolation_level: str = "read_committed",
        timeout_ms: int | None = None,
    ) -> list[FetchedPartition]:
        """Fetch stored batches (long poll: the broker answers once ``min_bytes``
        are available or ``max_wait_ms`` passed).

        Returns one :class:`FetchedPartition` per partition in the answer, with
        item errors (e.g. OFFSET_OUT_OF_RANGE) inside. The call's deadline is
        ``max_wait_ms`` plus ``timeout_ms`` (default ``request_timeout_ms``).
        """
        return self.fetch_async(partitions, max_wait_ms=max_wait_ms, min_bytes=min_bytes, max_bytes=max_bytes,
                                isolation_level=isolation_level, timeout_ms=timeout_ms).result()

    def fetch_async(
        self,
        partitions: Sequence[FetchRequestPartition],
        *,
        max_wait_ms: int,
        min_bytes: int = 1,
        max_bytes: int = 64 << 20,
        isolation_level: str = "read_committed",
        timeout_ms: int | None = None,
    ) -> RpcFuture[list[FetchedPartition]]:
        """:meth:`fetch` without blocking; ``cancel_call()`` on the future abandons the long poll."""
        level = _isolation(isolation_level)
        timeout_s = self.transport.deadline_s(timeout_ms, max(0, max_wait_ms))
        calls = []
        for conn, indexes, epochs in (self.transport.router.split([p.topic_partition for p in partitions])
                                     or [(self.transport.router.home, [], {})]):
            chosen = [partitions[i] for i in indexes]
            if epochs:
                chosen = [replace(p, current_leader_epoch=epochs.get(p.topic_partition, p.current_leader_epoch))
                          for p in chosen]
            request = messages.fetch_request(chosen, max_wait_ms=max_wait_ms, min_bytes=min_bytes,
                                             max_bytes=max_bytes, isolation_level=level)
            calls.append(self.transport.call_future("Fetch", request, timeout_s=timeout_s, convert=self._fetched,
                                                    conn=conn))
        return calls[0] if len(calls) == 1 else join_fetch(calls)

    def _fetched(self, response: bytes) -> list[FetchedPartition]:
        try:
            answers = messages.fetched_partitions(response)
        except (ValueError, DecodeError) as e:
            raise UnknownServerError(f"Fetch: a broker's answer is malformed: {e}") from None
        self.transport.router.note_errors((a.topic_partition, a.error) for a in answers)
        return answers

    # ------------------------------------------------------------------ offsets

    def list_offsets(
        self,
        timestamps: Mapping[TopicPartition, int],
        *,
        isolation_level: str = "read_uncommitted",
        timeout_ms: int | None = None,
    ) -> dict[TopicPartition, ListedOffset | LogstoreError]:
        """Look up offsets: timestamp -2 = earliest, -1 = latest, else the first
        offset whose record timestamp is ``>=`` it (``ListedOffset.offset`` None if none).
        """
        level = _isolation(isolation_level)
        return self._per_leader(
            "ListOffsets", timestamps, lambda part: messages.list_offsets_request(part, isolation_level=level),
            messages.listed_offsets, timeout_ms)

    def delete_records(
        self, before: Mapping[TopicPartition, int], *, timeout_ms: int | None = None
    ) -> dict[TopicPartition, int | LogstoreError]:
        """Delete records below each offset (-1 = the HWM); return the new log start offsets."""
        return self._per_leader("DeleteRecords", before, messages.delete_records_request,
                                messages.low_watermarks, timeout_ms)

    def _per_leader(
        self, rpc: str, items: Mapping[TopicPartition, int], build: Callable[[dict[TopicPartition, int]], Any],
        parse: Callable[[Any], Mapping[TopicPartition, _T | LogstoreError]], timeout_ms: int | None,
    ) -> dict[TopicPartition, _T | LogstoreError]:
        """``rpc`` about ``items``, one call per leader; partitions whose answer says the leader is
        elsewhere, or whose leader cannot be reached (killed: a new one is being elected), are
        asked again (after the routes refresh) until the deadline."""
        deadline = time.monotonic() + self.transport.deadline_s(timeout_ms)
        out: dict[TopicPartition, _T | LogstoreError] = {}
        todo = dict(items)
        while True:
            tps = list(todo)
            for conn, indexes, _ in self.transport.router.split(tps) or [(self.transport.router.home, [], {})]:
                asked = {tps[i]: todo[tps[i]] for i in indexes}
                try:
                    response = self.transport.call(rpc, build(asked), timeout_s=max(deadline - time.monotonic(), 0.001),
                                          conn=conn)
                except BrokerUnavailableError as e:
                    if not asked:
                        raise
                    out.update(dict.fromkeys(asked, e))
                    continue
                out.update(parse(response))
            moved = [tp for tp in todo if isinstance(out.get(tp), (*LEADER_ERRORS, BrokerUnavailableError))]
            if moved:
                self.transport.router.forget(moved)
            # A new leader that does not know its end yet: same leader, ask again shortly.
            again = moved + [tp for tp in todo if isinstance(out.get(tp), OffsetNotAvailableError)]
            if not again or time.monotonic() + _REROUTE_PAUSE_S >= deadline:
                return out
            time.sleep(_REROUTE_PAUSE_S)
            todo = {tp: todo[tp] for tp in again}

    # ------------------------------------------------------------------ transactions

    def _txn_call(self, transactional_id: str, rpc: str, request: Any, timeout_ms: int | None) -> Any:
        """``rpc`` on the transaction coordinator of ``transactional_id`` (found and cached, found
        again on NOT_COORDINATOR and the like); its ``error`` raised."""
        return self.transport.on_coordinator(coordinator_key(transactional_id), rpc, request, timeout_ms,
                                             key_type=TRANSACTION)

    def init_producer_id(
        self, transactional_id: str = "", *, transaction_timeout_ms: int = 60_000,
        timeout_ms: int | None = None, current: tuple[int, int] | None = None,
    ) -> tuple[int, int]:
        """A producer id and epoch (empty ``transactional_id``: an idempotent producer).

        For a transactional id this fences any earlier producer with the same id
        and aborts its open transaction (asked of the id's coordinator).
        ``current`` (the producer's id and epoch) asks for a bumped epoch of the
        same id instead (KIP-360): PRODUCER_FENCED unless they are still current.
        """
        request = pb.InitProducerIdRequest(transactional_id=transactional_id,
                                           transaction_timeout_ms=transaction_timeout_ms)
        if current is not None:
            request.producer_id, request.producer_epoch = current
        if transactional_id:
            r = self._txn_call(transactional_id, "InitProducerId", request, timeout_ms)
        else:
            r = self.transport.call("InitProducerId", request, timeout_s=self.transport.deadline_s(timeout_ms))
            raise_for_item(r.error)
        return r.producer_id, r.producer_epoch

    def add_partitions_to_txn(
        self, ref: TxnRef, partitions: Iterable[TopicPartition], *, timeout_ms: int | None = None
    ) -> int:
        """Add partitions to the open (or a new) transaction of ``ref``; return its number."""
        r = self._txn_call(ref.transactional_id, "AddPartitionsToTxn", pb.AddPartitionsToTxnRequest(
            transactional_id=ref.transactional_id, producer_id=ref.producer_id,
            producer_epoch=ref.producer_epoch,
            partitions=[pb.TopicPartitionRef(topic=tp.topic, partition=tp.partition) for tp in partitions],
        ), timeout_ms)
        return r.txn_number

    def end_txn(self, ref: TxnRef, *, commit: bool, timeout_ms: int | None = None) -> None:
        """Commit or abort transaction ``ref.txn_number`` (idempotent for a retried request)."""
        self._txn_call(ref.transactional_id, "EndTxn", pb.EndTxnRequest(
            transactional_id=ref.transactional_id, producer_id=ref.producer_id,
            producer_epoch=ref.producer_epoch, txn_number=ref.txn_number, commit=commit,
        ), timeout_ms)

    def end_txn_group(
        self, group_id: str, batch_id: int, txns: Iterable[TxnRef], *, abort_prefix: str,
        commit: bool, timeout_ms: int | None = None,
    ) -> tuple[bool, int]:
        """End a transaction group's batch; return (committed now?, last committed batch id)."""
        r = self._txn_call(group_id, "EndTxnGroup", pb.EndTxnGroupRequest(
            group_id=group_id, batch_id=batch_id, abort_prefix=abort_prefix, commit=commit,
            txns=[messages.txn_ref(t) for t in txns],
        ), timeout_ms)
        return r.committed, r.last_committed_batch_id

    def last_committed_batch(self, group_id: str, *, timeout_ms: int | None = None) -> int:
        """The last batch id committed by transaction group ``group_id`` (-1 if none)."""
        r = self._txn_call(group_id, "DescribeTxnGroup", pb.DescribeTxnGroupRequest(group_id=group_id), timeout_ms)
        return int(r.last_committed_batch_id)


def _isolation(level: str) -> pb.IsolationLevel:
    try:
        return ISOLATION_LEVELS[level]
    except KeyError:
        raise ValueError(
            f"isolation_level must be one of {sorted(ISOLATION_LEVELS)}, got {level!r}"
        ) from None
