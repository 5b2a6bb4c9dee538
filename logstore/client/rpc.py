"""The one place that talks gRPC: :class:`BrokerClient`, a typed connection to a broker.

Every RPC of ``logstore/_proto/logstore.proto`` has one typed method here;
:class:`~logstore.client.producer.Producer`, :class:`~logstore.client.consumer.Consumer`,
:class:`~logstore.client.admin.Admin` and the Spark connectors build on them and
never touch protobuf or grpc themselves.

Around this module (channel, deadlines, one method per RPC): errors are mapped
in one place, at this boundary (:mod:`logstore.client.error_mapping`); the
values returned are in :mod:`logstore.client.results`; requests and answers are
translated by :mod:`logstore.client.messages`, Produce and Fetch in the wire
form of :mod:`logstore.wire` (records copied once in, never out).

Every call has a deadline: ``request_timeout_ms`` (per client, overridable
per call); a fetch gets its long-poll wait on top.

Thread-safety: a :class:`BrokerClient` is safe to share between threads (the
underlying gRPC channel is). It pickles as its bootstrap address and options:
unpickling opens a new channel, so Spark tasks get their own connections.
"""

from __future__ import annotations

import concurrent.futures
import time
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import replace
from typing import Any, TypeVar

import grpc
from google.protobuf.message import DecodeError

from logstore._proto import logstore_pb2 as pb
from logstore.client import messages
from logstore.client.bootstrap import parse_bootstrap_list
from logstore.client.coordinator_lookup import TRANSACTION, CoordinatorLookup
from logstore.client.error_mapping import (
    error_from_item,
    error_from_rpc,
    raise_for_item,
)
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
from logstore.client.routing import LEADER_ERRORS, MAX_MESSAGE_BYTES, Connection, Router
from logstore.client.rpc_cleaning import CleaningCalls
from logstore.client.rpc_groups import GroupCalls
from logstore.client.rpc_security import SecurityRpcs
from logstore.client.security import ClientSecurity
from logstore.client.throttle import default_client_id
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


def _rebuild_client(bootstrap: str, request_timeout_ms: int, security: ClientSecurity | None = None,
                    client_id: str | None = None) -> BrokerClient:
    return BrokerClient(bootstrap, request_timeout_ms=request_timeout_ms, security=security, client_id=client_id)


class BrokerClient(CleaningCalls, GroupCalls, SecurityRpcs):
    """A connection to one broker with a typed method per RPC.

    ``bootstrap`` is ``"host:port"`` (default :func:`logstore.defaults.default_bootstrap`:
    ``$LOGSTORE_BOOTSTRAP`` or ``127.0.0.1:9392``). The channel connects lazily;
    a broker that is down surfaces as :class:`BrokerUnavailableError` on the
    first call. Use :meth:`close` (or ``with``) to release the channel.

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
        self._bootstrap = ",".join(entries)
        self._request_timeout_ms = int(request_timeout_ms)
        self._security = security  # TLS and SCRAM (logstore.client.security); None: plaintext
        # Sent with every call: what broker quotas know this client by (logstore.client.throttle).
        self._client_id = default_client_id() if client_id is None else str(client_id)
        # Where each call goes: home (a bootstrap entry) or a partition's leader (logstore.client.routing).
        self._router = Router(entries, refresh=self._metadata_from, security=security, client_id=self._client_id)
        # Where each group's (transactional id's) coordinator is (logstore.client.coordinator_lookup).
        self._coordinators = CoordinatorLookup(self._router, lambda request, timeout_s: self._call(
            "FindCoordinator", request, timeout_s=timeout_s))
        self._closed = False

    @classmethod
    def from_bootstrap(cls, bootstrap: str) -> BrokerClient:
        """A client for ``bootstrap`` with default options (what a Spark task calls)."""
        return cls(bootstrap)

    @property
    def bootstrap(self) -> str:
        return self._bootstrap

    @property
    def request_timeout_ms(self) -> int:
        return self._request_timeout_ms

    @property
    def closed(self) -> bool:
        return self._closed

    @property
    def client_id(self) -> str:
        return self._client_id

    def throttle_stats(self) -> tuple[int, int]:
        """(requests a broker throttled, their throttle times summed in ms): quota pressure."""
        return self._router.throttle_stats()

    def __reduce__(self) -> tuple[Callable[..., BrokerClient], tuple[str, int, ClientSecurity | None, str]]:
        return (_rebuild_client, (self._bootstrap, self._request_timeout_ms, self._security, self._client_id))

    def __repr__(self) -> str:
        return f"BrokerClient({self._bootstrap!r})"

    def close(self) -> None:
        """Close the channels; calls in flight fail. Idempotent."""
        if not self._closed:
            self._closed = True
            self._router.close()

    def __enter__(self) -> BrokerClient:
        return self

    def __exit__(self, *exc_info: object) -> None:
        self.close()

    # ------------------------------------------------------------------ plumbing

    def _deadline_s(self, timeout_ms: int | None, extra_ms: int = 0) -> float:
        return ((timeout_ms if timeout_ms is not None else self._request_timeout_ms) + extra_ms) / 1000

    def _call(self, rpc: str, request: Any, *, timeout_s: float, conn: Connection | None = None) -> Any:
        """Call ``rpc`` on ``conn`` (a partition's leader), or on home, moving to the next bootstrap
        entry while home is unreachable."""
        if self._closed:
            raise RuntimeError(f"{rpc}: the client for {self._bootstrap} is closed")
        target = conn or self._router.home
        failover = conn is None or conn.address == self._router.home.address  # unrouted: any broker answers
        deadline = time.monotonic() + timeout_s
        for attempt in range(1, len(self._router.entries) + 1):
            try:
                return target.method(rpc)(request, timeout=max(deadline - time.monotonic(), 0.001))
            except grpc.RpcError as e:
                err = target.explain(error_from_rpc(e, rpc=rpc, target=target.address))
            self._router.note_failure(target, err)  # an unreachable home: the next entry is home now
            following = self._router.home
            if (not failover or not isinstance(err, BrokerUnavailableError) or attempt == len(self._router.entries)
                    or following.address == target.address or time.monotonic() >= deadline):
                raise err from None
            target = following
        raise AssertionError("unreachable: the last attempt raises")

    def _call_future(
        self, rpc: str, request: Any, *, timeout_s: float, convert: Callable[[Any], _T],
        conn: Connection | None = None,
    ) -> RpcFuture[_T]:
        """Start ``rpc`` without blocking; the future holds ``convert(response)`` or the mapped error."""
        if self._closed:
            raise RuntimeError(f"{rpc}: the client for {self._bootstrap} is closed")
        target = conn or self._router.home
        out: RpcFuture[_T] = RpcFuture()
        out.set_running_or_notify_cancel()
        call = target.method(rpc).future(request, timeout=timeout_s)
        out._call = call

        def done(f: grpc.Future) -> None:
            try:
                response = f.result()
            except grpc.RpcError as e:
                err = target.explain(error_from_rpc(e, rpc=rpc, target=target.address))
                self._router.note_failure(target, err)  # the next call tries the next bootstrap entry
                out.set_exception(err)
                return
            except grpc.FutureCancelledError:
                out.set_exception(BrokerUnavailableError(f"{rpc} to {target.address} was cancelled"))
                return
            try:
                out.set_result(convert(response))
            except BaseException as e:  # a malformed answer must still complete the future
                out.set_exception(e)

        call.add_done_callback(done)
        return out

    def _metadata_from(self, conn: Connection, topics: list[str]) -> pb.MetadataResponse:
        """The Router's refresh: one Metadata call to ``conn``."""
        return self._call("Metadata", pb.MetadataRequest(topics=topics),
                          timeout_s=self._deadline_s(None), conn=conn)

    # ------------------------------------------------------------------ topics

    def create_topics(
        self, topics: Sequence[NewTopic], *, validate_only: bool = False,
        timeout_ms: int | None = None,
    ) -> dict[str, LogstoreError | None]:
        """Create ``topics``; return each name's error (None = created or, with validate_only, valid)."""
        request = pb.CreateTopicsRequest(topics=[messages.new_topic(t) for t in topics],
                                         validate_only=validate_only)
        response = self._call("CreateTopics", request, timeout_s=self._deadline_s(timeout_ms))
        return {r.name: error_from_item(r.error) for r in response.results}

    def delete_topics(
        self, names: Sequence[str], *, timeout_ms: int | None = None
    ) -> dict[str, LogstoreError | None]:
        """Delete topics; return each name's error (None = deleted)."""
        response = self._call(
            "DeleteTopics", pb.DeleteTopicsRequest(names=list(names)),
            timeout_s=self._deadline_s(timeout_ms),
        )
        return {r.name: error_from_item(r.error) for r in response.results}

    def create_partitions(
        self, counts: Mapping[str, int], *, validate_only: bool = False, timeout_ms: int | None = None
    ) -> dict[str, LogstoreError | None]:
        """Grow each topic to its new partition count; return each topic's error (None = done)."""
        request = pb.CreatePartitionsRequest(
            topics=[pb.CreatePartitionsRequest.Topic(name=n, count=c) for n, c in counts.items()],
            validate_only=validate_only)
        response = self._call("CreatePartitions", request, timeout_s=self._deadline_s(timeout_ms))
        return {r.name: error_from_item(r.error) for r in response.results}

    def metadata(self, topics: Sequence[str] | None = None, *, timeout_ms: int | None = None,
                 leader_offsets: bool = False) -> ClusterMetadata:
        """Describe ``topics`` (None or empty = every topic).

        A topic the broker could not describe (e.g. unknown) is in ``topic_errors``
        instead of ``topics``. With ``leader_offsets``, each partition's offsets are
        its leader's (on a cluster, one more call per leader: :mod:`.leader_offsets`).
        """
        timeout_s = self._deadline_s(timeout_ms)
        response = self._call("Metadata", pb.MetadataRequest(topics=list(topics or ())), timeout_s=timeout_s)
        self._router.learn(response)
        if leader_offsets:
            response = with_leader_offsets(response, lambda address, names: self._call(
                "Metadata", pb.MetadataRequest(topics=names), timeout_s=timeout_s,
                conn=self._router.connection(address)))
        return messages.cluster_metadata(response)

    def describe_configs(
        self, topics: Sequence[str], *, timeout_ms: int | None = None
    ) -> dict[str, dict[str, str] | LogstoreError]:
        """Each topic's effective configs (Kafka names, string values), or its error."""
        response = self._call(
            "DescribeConfigs", pb.DescribeConfigsRequest(topics=list(topics)),
            timeout_s=self._deadline_s(timeout_ms),
        )
        return {r.name: error_from_item(r.error) or dict(r.configs) for r in response.results}

    def alter_configs(
        self, alterations: Mapping[str, ConfigAlteration], *, validate_only: bool = False,
        timeout_ms: int | None = None,
    ) -> dict[str, LogstoreError | None]:
        """Apply config changes per topic; return each topic's error (None = applied)."""
        request = messages.alter_configs_request(alterations, validate_only=validate_only)
        response = self._call("AlterConfigs", request, timeout_s=self._deadline_s(timeout_ms))
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
        timeout_s = self._deadline_s(wait_ms, self._request_timeout_ms)
        tps = [tp for tp, _ in partitions]
        calls = []
        for conn, indexes, epochs in self._router.split(tps) or [(self._router.home, [], {})]:
            request = encode_produce_request(
                [partitions[i] for i in indexes], acks=acks, timeout_ms=wait_ms,
                transactional_id=transactional_id, leader_epochs=epochs,
            )
            calls.append((indexes, self._call_future(
                "Produce", request, timeout_s=timeout_s, convert=self._produced, conn=conn)))
        return calls[0][1] if len(calls) == 1 else join_produce(tps, calls)

    def _produced(self, response: pb.ProduceResponse) -> list[ProducedPartition]:
        answers = messages.produced_partitions(response)
        self._router.note_errors((TopicPartition(a.topic, a.partition), a.error) for a in answers)
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
        timeout_s = self._deadline_s(timeout_ms, max(0, max_wait_ms))
        calls = []
        for conn, indexes, epochs in (self._router.split([p.topic_partition for p in partitions])
                                     or [(self._router.home, [], {})]):
            chosen = [partitions[i] for i in indexes]
            if epochs:
                chosen = [replace(p, current_leader_epoch=epochs.get(p.topic_partition, p.current_leader_epoch))
                          for p in chosen]
            request = messages.fetch_request(chosen, max_wait_ms=max_wait_ms, min_bytes=min_bytes,
                                             max_bytes=max_bytes, isolation_level=level)
            calls.append(self._call_future("Fetch", request, timeout_s=timeout_s, convert=self._fetched, conn=conn))
        return calls[0] if len(calls) == 1 else join_fetch(calls)

    def _fetched(self, response: bytes) -> list[FetchedPartition]:
        try:
            answers = messages.fetched_partitions(response)
        except (ValueError, DecodeError) as e:
            raise UnknownServerError(f"Fetch: a broker's answer is malformed: {e}") from None
        self._router.note_errors((a.topic_partition, a.error) for a in answers)
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
        deadline = time.monotonic() + self._deadline_s(timeout_ms)
        out: dict[TopicPartition, _T | LogstoreError] = {}
        todo = dict(items)
        while True:
            tps = list(todo)
            for conn, indexes, _ in self._router.split(tps) or [(self._router.home, [], {})]:
                asked = {tps[i]: todo[tps[i]] for i in indexes}
                try:
                    response = self._call(rpc, build(asked), timeout_s=max(deadline - time.monotonic(), 0.001),
                                          conn=conn)
                except BrokerUnavailableError as e:
                    if not asked:
                        raise
                    out.update(dict.fromkeys(asked, e))
                    continue
                out.update(parse(response))
            moved = [tp for tp in todo if isinstance(out.get(tp), (*LEADER_ERRORS, BrokerUnavailableError))]
            if moved:
                self._router.forget(moved)
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
        return self._on_coordinator(coordinator_key(transactional_id), rpc, request, timeout_ms, key_type=TRANSACTION)

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
            r = self._call("InitProducerId", request, timeout_s=self._deadline_s(timeout_ms))
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
