"""How a follower reaches its leader: the :class:`LeaderLink` protocol and two transports.

A follower's fetcher (:mod:`replication.follower`) speaks to one leader broker
through a :class:`LeaderLink`: a replica ``Fetch`` (answers decoded as
:func:`logstore.wire.decode_fetch_response` gives them: each partition's answer
and its records) and ``OffsetsForLeaderEpoch``. A broken link raises
:class:`LinkError`; the fetcher backs off and tries again. Per-partition
errors (``NOT_LEADER_OR_FOLLOWER``, ``FENCED_LEADER_EPOCH``, ...) travel in
the answers, not as exceptions.

* :class:`GrpcLeaderLink` — a ``grpc.aio`` channel to the leader's advertised
  ``host:port`` (TLS with the given channel credentials when the brokers' listeners are TLS:
  the broker's CA, and its own certificate as the client certificate for mTLS), calling the
  broker's ``/logstore.v1.Logstore/Fetch`` (answer in wire form) and
  ``/logstore.v1.Logstore/OffsetsForLeaderEpoch``; on a SASL cluster each call
  carries the session of the inter-broker user (:mod:`replication.link_auth`);
* :class:`InProcessNetwork` / :class:`InProcessLink` — calls another replica
  manager's serving methods in this process, through the same wire encoding
  (:func:`~logstore.wire.encode_fetch_response` then decode: the follower gets
  its own copy of the bytes, as over a socket). Links between two nodes can be
  cut and healed (:meth:`InProcessNetwork.cut`), so deterministic tests drive
  network splits without sockets. It is a real transport, not a mock.

Thread-safety: event loop only.
"""

from __future__ import annotations

from typing import Protocol

import grpc

from logstore._proto import logstore_pb2 as pb
from logstore.errors import WIRE_CODE_KEY, LogstoreError, SaslAuthenticationError
from logstore.wire import decode_fetch_response, encode_fetch_response
from replication.link_auth import LinkSession

__all__ = [
    "FetchAnswer",
    "LeaderLink",
    "LinkError",
    "ReplicaServer",
    "GrpcLeaderLink",
    "InProcessNetwork",
    "InProcessLink",
]

FetchAnswer = list[tuple[pb.FetchPartitionResponse, memoryview]]
_SERVICE = "/logstore.v1.Logstore/"


class LinkError(Exception):
    """The leader could not be reached or failed the whole request (``code``: its error code, if any)."""

    def __init__(self, message: str, *, code: str = "") -> None:
        super().__init__(message)
        self.code = code


class LeaderLink(Protocol):
    """A follower's connection to one leader broker."""

    async def fetch(self, request: pb.FetchRequest) -> FetchAnswer: ...

    async def offsets_for_leader_epoch(
        self, request: pb.OffsetsForLeaderEpochRequest
    ) -> pb.OffsetsForLeaderEpochResponse: ...

    async def close(self) -> None: ...


class ReplicaServer(Protocol):
    """The leader's side, as a broker serves it (its data plane's fetch path over its replica manager)."""

    async def serve_replica_fetch(self, request: pb.FetchRequest) -> FetchAnswer: ...

    def end_offsets_for_epochs(self, request: pb.OffsetsForLeaderEpochRequest) -> pb.OffsetsForLeaderEpochResponse: ...


class GrpcLeaderLink:
    """A :class:`LeaderLink` over gRPC to ``address`` (``host:port``); ``timeout_s`` bounds each call
    (a fetch's long poll included: give it more than ``replica_fetch_wait_max_ms``)."""

    def __init__(self, address: str, *, timeout_s: float = 30.0, max_message_bytes: int = 256 << 20,
                 session: LinkSession | None = None, credentials: grpc.ChannelCredentials | None = None) -> None:
        """``session``: log in to a SASL leader as the inter-broker user (:mod:`replication.link_auth`);
        ``credentials``: TLS to the leader (None: plaintext)."""
        self.address = address
        self._timeout_s = timeout_s
        self._session = session
        options = [("grpc.max_receive_message_length", max_message_bytes),
                   ("grpc.max_send_message_length", max_message_bytes)]
        self._channel = (grpc.aio.secure_channel(address, credentials, options=options) if credentials is not None
                         else grpc.aio.insecure_channel(address, options=options))
        self._fetch = self._channel.unary_unary(
            _SERVICE + "Fetch", request_serializer=pb.FetchRequest.SerializeToString,
        )
        self._epochs = self._channel.unary_unary(
            _SERVICE + "OffsetsForLeaderEpoch",
            request_serializer=pb.OffsetsForLeaderEpochRequest.SerializeToString,
            response_deserializer=pb.OffsetsForLeaderEpochResponse.FromString,
        )

    async def fetch(self, request: pb.FetchRequest) -> FetchAnswer:
        try:
            data = await self._fetch(request, timeout=self._timeout_s, metadata=await self._metadata())
        except grpc.aio.AioRpcError as e:
            raise self._error("Fetch", e) from None
        return decode_fetch_response(data)

    async def offsets_for_leader_epoch(
        self, request: pb.OffsetsForLeaderEpochRequest
    ) -> pb.OffsetsForLeaderEpochResponse:
        try:
            answer: pb.OffsetsForLeaderEpochResponse = await self._epochs(
                request, timeout=self._timeout_s, metadata=await self._metadata())
        except grpc.aio.AioRpcError as e:
            raise self._error("OffsetsForLeaderEpoch", e) from None
        return answer

    async def _metadata(self) -> tuple[tuple[str, str], ...] | None:
        """The session metadata of a SASL link (None: a plaintext link); a failed login is a LinkError."""
        if self._session is None:
            return None
        try:
            return await self._session.metadata(self._channel, self._timeout_s)
        except grpc.aio.AioRpcError as e:
            raise _link_error(self.address, "SaslAuthenticate", e) from None
        except LogstoreError as e:
            raise LinkError(f"SaslAuthenticate to leader {self.address} failed: {e.message}", code=e.code) from None

    def _error(self, what: str, e: grpc.aio.AioRpcError) -> LinkError:
        error = _link_error(self.address, what, e)
        if self._session is not None and error.code == SaslAuthenticationError.code:
            self._session.invalidate()  # the next call logs in again
        return error

    async def close(self) -> None:
        await self._channel.close()


def _link_error(address: str, what: str, e: grpc.aio.AioRpcError) -> LinkError:
    code = ""
    for key, value in e.trailing_metadata() or ():
        if key == WIRE_CODE_KEY:
            code = str(value)
    return LinkError(f"{what} to leader {address} failed: {e.code().name}: {e.details()}", code=code)


class InProcessNetwork:
    """Replica managers of one process, reachable by node id; links can be cut (tests)."""

    def __init__(self) -> None:
        self._servers: dict[int, ReplicaServer] = {}
        self._cut: set[frozenset[int]] = set()

    def register(self, node_id: int, server: ReplicaServer) -> None:
        self._servers[node_id] = server

    def unregister(self, node_id: int) -> None:
        self._servers.pop(node_id, None)

    def cut(self, a: int, b: int) -> None:
        """Cut the link between ``a`` and ``b`` (both directions) until :meth:`heal`."""
        self._cut.add(frozenset((a, b)))

    def heal(self, a: int, b: int) -> None:
        self._cut.discard(frozenset((a, b)))

    def link(self, source: int, target: int) -> InProcessLink:
        return InProcessLink(self, source, target)

    def server(self, source: int, target: int) -> ReplicaServer:
        if frozenset((source, target)) in self._cut:
            raise LinkError(f"the link from broker {source} to broker {target} is cut")
        server = self._servers.get(target)
        if server is None:
            raise LinkError(f"broker {target} is not running")
        return server


class InProcessLink:
    """A :class:`LeaderLink` from node ``source`` to node ``target`` of an :class:`InProcessNetwork`."""

    def __init__(self, network: InProcessNetwork, source: int, target: int) -> None:
        self._network = network
        self.source = source
        self.target = target
        self.closed = False

    async def fetch(self, request: pb.FetchRequest) -> FetchAnswer:
        answer = await self._network.server(self.source, self.target).serve_replica_fetch(request)
        wire = encode_fetch_response(answer)
        self._network.server(self.source, self.target)  # cut while the answer was in flight: lost
        return decode_fetch_response(wire)

    async def offsets_for_leader_epoch(
        self, request: pb.OffsetsForLeaderEpochRequest
    ) -> pb.OffsetsForLeaderEpochResponse:
        answer = self._network.server(self.source, self.target).end_offsets_for_epochs(request)
        return pb.OffsetsForLeaderEpochResponse.FromString(answer.SerializeToString())

    async def close(self) -> None:
        self.closed = True
