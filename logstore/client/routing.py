"""Where a client sends each call: the bootstrap brokers, and each partition's leader.

A single broker leads every partition, so a client talks to its bootstrap
address only and this module adds nothing to its calls. On a cluster, calls
about partitions (produce, fetch, list offsets, delete records) must reach each
partition's leader; :class:`Router` keeps what the client learned:

* **connections**, one gRPC channel per broker address, made on first use (TLS with
  :func:`~logstore.client.security.channel_credentials` when the client's security protocol
  is SSL or SASL_SSL; an unreachable broker's error then names TLS as a possible cause,
  :meth:`Connection.explain`);
* **home**: the bootstrap entry calls that name no partition go to (metadata,
  topics, groups, transactions). When it is unreachable, the next entry of the
  bootstrap list becomes home (``bootstrap="b1:9392,b2:9392,b3:9392"``);
* **routes**: partition → leader address and leader epoch, learned from every
  Metadata answer that lists more than one broker (the producer and consumer
  ask for metadata before they send, so routes are known before the first
  produce or fetch). A partition without a route goes to home.

A route is forgotten when a call says it is wrong — NOT_LEADER_OR_FOLLOWER,
FENCED_LEADER_EPOCH, UNKNOWN_LEADER_EPOCH, LEADER_NOT_AVAILABLE — or when its
broker is unreachable or a call to it timed out (a broker that is frozen or cut
off keeps its connections open and answers nothing; its partitions have
usually been moved by then, as Kafka's clients assume after
``request.timeout.ms``); the next call that needs a route first refreshes the
metadata (at most every ``REFRESH_INTERVAL_S``). The callers' own retries of
those retriable errors (the producer's, the consumer's, the Spark source's)
then reach the new leader. An unreachable or timed-out home gives way to the
next bootstrap entry, for the refresh too.

Thread-safety: a Router is shared by a client's threads; its maps change under
one lock, and no RPC is made while holding it.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable, Iterable, Sequence
from typing import Any, TypeVar

import grpc

from logstore._proto import logstore_pb2 as pb
from logstore._proto import logstore_pb2_grpc as pb_grpc
from logstore.client.endpoint_names import certificate_name
from logstore.client.sasl import SessionInterceptor, SessionLogin
from logstore.client.security import (
    ClientSecurity,
    channel_credentials,
    client_identity,
    trusted_certificates,
)
from logstore.client.throttle import CallHooks
from logstore.defaults import RECONNECT_OPTIONS
from logstore.errors import (
    BrokerUnavailableError,
    FencedLeaderEpochError,
    LeaderNotAvailableError,
    LogstoreError,
    NotLeaderError,
    RequestTimedOutError,
    UnknownLeaderEpochError,
)
from logstore.types import TopicPartition

__all__ = ["Connection", "Router", "LEADER_ERRORS", "MAX_MESSAGE_BYTES", "REFRESH_INTERVAL_S"]

# gRPC message size limit on both directions; the broker caps requests itself.
MAX_MESSAGE_BYTES = 256 << 20
REFRESH_INTERVAL_S = 0.1
# Errors that mean "this broker is not (or no longer) where the partition is led".
LEADER_ERRORS: tuple[type[LogstoreError], ...] = (
    NotLeaderError, FencedLeaderEpochError, UnknownLeaderEpochError, LeaderNotAvailableError,
)
_CHANNEL_OPTIONS = [
    ("grpc.max_send_message_length", MAX_MESSAGE_BYTES),
    ("grpc.max_receive_message_length", MAX_MESSAGE_BYTES),
    # Brokers are addressed directly; never route through an HTTP proxy.
    ("grpc.enable_http_proxy", 0),
    # A broker that restarts is reachable again within a second (logstore.defaults) ...
    *RECONNECT_OPTIONS,
    # ... on a connection of this client's own: the process-wide subchannel
    # pool can hand a new client one still backing off from refused attempts.
    ("grpc.use_local_subchannel_pool", 1),
]

_T = TypeVar("_T")


class Connection:
    """One channel to one broker address: the typed stub, and Produce and Fetch in wire form."""

    def __init__(self, address: str, security: ClientSecurity | None = None, *, client_id: str = "") -> None:
        self.address = address
        self.security = security
        if security is not None and security.tls:
            options: list[tuple[str, Any]] = list(_CHANNEL_OPTIONS)
            if not security.verify_host_name:  # ssl.endpoint.identification.algorithm= (empty)
                name = certificate_name(address, trusted_certificates(security), client_identity(security))
                options.append(("grpc.ssl_target_name_override", name))
            self.channel = grpc.secure_channel(address, channel_credentials(security), options=options)
        else:
            self.channel = grpc.insecure_channel(address, options=_CHANNEL_OPTIONS)
        # SASL: the first call logs in (SCRAM), every call carries the session (logstore.client.sasl).
        self.login = SessionLogin(address, security, self.channel) if security is not None and security.sasl else None
        if self.login is not None:
            self.channel = grpc.intercept_channel(self.channel, SessionInterceptor(self.login))
        # Every call carries the client id and waits out a throttle time (logstore.client.throttle).
        self.hooks = CallHooks(client_id)
        self.channel = grpc.intercept_channel(self.channel, *self.hooks.interceptors())
        self.stub = pb_grpc.LogstoreStub(self.channel)
        # Produce takes a request already in wire form (logstore.wire.encode_produce_request):
        # the records are copied once into it instead of three times.
        self.produce_raw = self.channel.unary_unary(
            "/logstore.v1.Logstore/Produce", request_serializer=None,
            response_deserializer=pb.ProduceResponse.FromString,
        )
        # Fetch answers arrive in wire form: the records stay views of the answer.
        self.fetch_raw = self.channel.unary_unary(
            "/logstore.v1.Logstore/Fetch", request_serializer=pb.FetchRequest.SerializeToString,
            response_deserializer=None,
        )

    def method(self, rpc: str) -> Any:
        if rpc == "Produce":
            return self.produce_raw
        if rpc == "Fetch":
            return self.fetch_raw
        return getattr(self.stub, rpc)

    def close(self) -> None:
        self.channel.close()

    def explain(self, error: LogstoreError) -> LogstoreError:
        """``error`` with a word on TLS when the broker was reachable but the connection failed:
        a failed handshake (certificate not trusted, none presented) or a TLS/plaintext mismatch
        surface as gRPC UNAVAILABLE like a broker that is down."""
        if not isinstance(error, BrokerUnavailableError) or "refused" in error.message.lower():
            return error
        tls = self.security is not None and self.security.tls
        hint = ("TLS: the handshake failed or the broker closed the connection; check ssl_cafile (the CA "
                "of the broker's certificate), and that the broker accepts this client's certificate "
                "(ssl_certfile/ssl_keyfile) if it requires one (mTLS)" if tls else
                "TLS: if the broker's listener uses TLS, set security_protocol=SSL (or SASL_SSL) and ssl_cafile")
        return type(error)(f"{error.message} [{hint}]")


class Router:
    """Connections, home and partition routes of one client (see the module docstring)."""

    def __init__(self, entries: Sequence[str], *, refresh: Callable[[Connection, list[str]], pb.MetadataResponse],
                 security: ClientSecurity | None = None, client_id: str = "") -> None:
        """``entries``: the bootstrap addresses; ``refresh(connection, topics)`` asks one broker
        for the metadata of ``topics`` (the client's Metadata call, errors mapped); every
        connection uses ``security`` (TLS, SCRAM; None: plaintext) and sends ``client_id``."""
        self.entries = list(entries)
        self._security = security
        self.client_id = client_id
        self._refresh_call = refresh
        self._lock = threading.Lock()
        self._home = 0
        self._connections: dict[str, Connection] = {}
        self._routes: dict[TopicPartition, tuple[str, int]] = {}
        self._topics: set[str] = set()
        self._stale = False
        self._last_refresh = 0.0

    # ------------------------------------------------------------------ connections

    def connection(self, address: str) -> Connection:
        with self._lock:
            conn = self._connections.get(address)
            if conn is None:
                conn = self._connections[address] = Connection(address, self._security, client_id=self.client_id)
            return conn

    @property
    def home(self) -> Connection:
        return self.connection(self.entries[self._home])

    def next_home(self, failed: Connection) -> Connection | None:
        """After ``failed`` (home) was unreachable: the next bootstrap entry, or None when there is
        only one."""
        if len(self.entries) == 1:
            return None
        with self._lock:
            if self.entries[self._home] == failed.address:
                self._home = (self._home + 1) % len(self.entries)
        return self.home

    def throttle_stats(self) -> tuple[int, int]:
        """(throttled requests, their throttle times summed in ms) over every connection."""
        with self._lock:
            connections = list(self._connections.values())
        return (sum(c.hooks.throttled_requests for c in connections),
                sum(c.hooks.throttle_time_ms_total for c in connections))

    def close(self) -> None:
        with self._lock:
            connections, self._connections = list(self._connections.values()), {}
        for conn in connections:
            conn.close()

    # ------------------------------------------------------------------ routes

    def learn(self, response: pb.MetadataResponse) -> None:
        """Take the leaders of a Metadata answer (a single broker's answer changes nothing)."""
        if len(response.brokers) <= 1:
            with self._lock:
                self._routes.clear()
                self._stale = False
            return
        addresses = {b.node_id: f"{b.host}:{b.port}" for b in response.brokers}
        with self._lock:
            for t in response.topics:
                if t.error.code:
                    continue
                self._topics.add(t.name)
                for p in t.partitions:
                    tp = TopicPartition(t.name, p.partition)
                    address = addresses.get(p.leader)
                    if address is None:
                        self._routes.pop(tp, None)
                    else:
                        self._routes[tp] = (address, p.leader_epoch)
            self._stale = False

    def forget(self, tps: Iterable[TopicPartition] = (), *, address: str | None = None) -> None:
        """Drop the routes of ``tps`` (and of every partition led at ``address``); the next call
        that needs a route refreshes the metadata first."""
        with self._lock:
            for tp in tps:
                self._routes.pop(tp, None)
                self._topics.add(tp.topic)
            if address is not None:
                for tp in [tp for tp, (a, _) in self._routes.items() if a == address]:
                    del self._routes[tp]
                    self._topics.add(tp.topic)
            self._stale = True

    def note_errors(self, items: Iterable[tuple[TopicPartition, LogstoreError | None]]) -> None:
        """Forget the routes of items whose error says the leader is elsewhere."""
        wrong = [tp for tp, err in items if isinstance(err, LEADER_ERRORS)]
        if wrong:
            self.forget(wrong)

    def note_failure(self, conn: Connection, error: BaseException) -> None:
        """A call to ``conn`` failed as a whole: an unreachable broker's routes are forgotten, and an
        unreachable home gives way to the next bootstrap entry. A call that timed out does the
        same on a cluster (the broker may be frozen or cut off, its partitions led elsewhere);
        a single broker's client has nowhere else to go, and just retries."""
        if isinstance(error, BrokerUnavailableError):
            self.forget(address=conn.address)
            self.next_home(conn)
        elif isinstance(error, RequestTimedOutError):
            with self._lock:
                led_there = [tp for tp, (a, _) in self._routes.items() if a == conn.address]
            if led_there:
                self.forget(led_there)
            self.next_home(conn)

    def _maybe_refresh(self) -> None:
        with self._lock:
            due = self._stale and time.monotonic() - self._last_refresh >= REFRESH_INTERVAL_S
            if due:
                self._last_refresh = time.monotonic()
            topics = sorted(self._topics)
        if not due:
            return
        for _ in self.entries:
            home = self.home
            try:
                self.learn(self._refresh_call(home, topics))
                return
            except (BrokerUnavailableError, RequestTimedOutError):
                if self.next_home(home) is None:
                    return
            except LogstoreError:
                return  # the call that needed the route reports the real problem

    def route(self, tp: TopicPartition) -> tuple[Connection, int]:
        """Where ``tp`` is led, and the leader epoch known for it (-1: unknown, home)."""
        if self._stale:
            self._maybe_refresh()
        with self._lock:
            found = self._routes.get(tp)
        if found is None:
            return self.home, -1
        return self.connection(found[0]), found[1]

    def split(self, tps: Sequence[TopicPartition]) -> list[tuple[Connection, list[int], dict[TopicPartition, int]]]:
        """Group the indexes of ``tps`` by the connection of their leader, with the leader epochs
        known; the single-broker case is one group (home) with no epochs."""
        groups: dict[str, tuple[Connection, list[int], dict[TopicPartition, int]]] = {}
        for i, tp in enumerate(tps):
            conn, epoch = self.route(tp)
            group = groups.setdefault(conn.address, (conn, [], {}))
            group[1].append(i)
            if epoch >= 0:
                group[2][tp] = epoch
        return list(groups.values())
