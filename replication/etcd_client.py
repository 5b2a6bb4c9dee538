"""The few etcd v3 calls the metadata store needs, over one gRPC channel, with one error type.

:mod:`replication.metadata_store` speaks in brokers, topics and partitions; this module speaks
in keys, revisions, transactions, leases and watches, and nothing else. It uses aetcd's
generated gRPC stubs directly rather than its ``Client`` because the store needs what that
client hides: the response header's revision of a transaction (a CAS returns the revision it
wrote, which is the next CAS's expected revision), a channel over several endpoints, and a
watch stream it can cancel and restart on its own terms.

Failure model: every call has a deadline (``timeout_s``); a call that fails or times out
raises :class:`MetadataStoreError` naming the endpoints and the call. The channel reconnects by
itself (backoff capped at 1 s, so a restarted etcd is seen again within about a second), and
HTTP/2 keep-alive pings (every 5 s, etcd's minimum) break a watch stream whose server stopped
answering (a SIGSTOPped etcd) instead of leaving it silent forever.

Several endpoints (an etcd cluster) become one gRPC target with the ``ipv4:`` resolver and
``pick_first``: calls go to the first member that answers and move on when it stops.

Thread-safety: one :class:`EtcdClient` belongs to one asyncio event loop.
"""

from __future__ import annotations

import asyncio
import contextlib
import socket
from collections.abc import AsyncIterator, Sequence
from dataclasses import dataclass

import grpc
from aetcd import rpc
from aetcd.utils import prefix_range_end

from logstore.defaults import RECONNECT_OPTIONS
from logstore.errors import MetadataStoreError

__all__ = ["EtcdClient", "KeyValue", "TxnResult", "compare_created", "compare_mod", "compare_value",
           "op_delete", "op_delete_prefix", "op_get", "op_put", "parse_metadata_url", "prefix_range_end"]

_CHANNEL_OPTIONS = (
    *RECONNECT_OPTIONS,  # reconnect within a second, and give a slow handshake time (logstore.defaults)
    # etcd refuses pings more often than every 5 s (--grpc-keepalive-min-time).
    ("grpc.keepalive_time_ms", 5000),
    ("grpc.keepalive_timeout_ms", 3000),
)


def parse_metadata_url(url: str) -> list[str]:
    """``etcd://h1:p1,h2:p2`` (or the bare ``h1:p1,h2:p2``) → ``["h1:p1", "h2:p2"]``."""
    rest = url.strip()
    if "://" in rest:
        scheme, rest = rest.split("://", 1)
        if scheme != "etcd":
            raise ValueError(f"metadata URL {url!r}: the scheme must be etcd://, not {scheme}://")
    endpoints = [e.strip().rstrip("/") for e in rest.split(",") if e.strip()]
    if not endpoints:
        raise ValueError(f"metadata URL {url!r} names no etcd endpoint (etcd://HOST:PORT[,HOST:PORT])")
    for e in endpoints:
        host, sep, port = e.rpartition(":")
        if not sep or not host or not port.isdigit():
            raise ValueError(f"metadata URL {url!r}: endpoint {e!r} is not HOST:PORT")
    return endpoints


def _target(endpoints: Sequence[str]) -> str:
    if len(endpoints) == 1:
        return endpoints[0]
    addrs = []
    for e in endpoints:
        host, _, port = e.rpartition(":")
        ip = socket.getaddrinfo(host, int(port), socket.AF_INET, socket.SOCK_STREAM)[0][4][0]
        addrs.append(f"{ip}:{port}")
    return "ipv4:" + ",".join(addrs)


@dataclass(frozen=True, slots=True)
class KeyValue:
    key: bytes
    value: bytes
    create_revision: int
    mod_revision: int
    lease: int


@dataclass(frozen=True, slots=True)
class TxnResult:
    """``succeeded``: whether every compare held; ``revision``: the store's revision after the
    transaction (the mod revision of what it wrote, if it wrote); ``gets``: the key-values of
    each get op of the branch that ran, in order."""

    succeeded: bool
    revision: int
    gets: list[list[KeyValue]]


def _kv(kv: rpc.KeyValue) -> KeyValue:
    return KeyValue(kv.key, kv.value, kv.create_revision, kv.mod_revision, kv.lease)


# ----------------------------------------------------------------- compares and ops (values)

def compare_created(key: bytes, revision: int) -> rpc.Compare:
    """The key's create revision equals ``revision`` (0: the key is absent)."""
    return rpc.Compare(result=rpc.Compare.EQUAL, target=rpc.Compare.CREATE, key=key,
                       create_revision=revision)


def compare_mod(key: bytes, revision: int) -> rpc.Compare:
    """The key's mod revision equals ``revision`` (0: the key is absent)."""
    return rpc.Compare(result=rpc.Compare.EQUAL, target=rpc.Compare.MOD, key=key, mod_revision=revision)


def compare_value(key: bytes, value: bytes) -> rpc.Compare:
    """The key exists and holds exactly ``value``."""
    return rpc.Compare(result=rpc.Compare.EQUAL, target=rpc.Compare.VALUE, key=key, value=value)


def op_put(key: bytes, value: bytes, *, lease: int = 0) -> rpc.RequestOp:
    return rpc.RequestOp(request_put=rpc.PutRequest(key=key, value=value, lease=lease))


def op_get(key: bytes) -> rpc.RequestOp:
    return rpc.RequestOp(request_range=rpc.RangeRequest(key=key))


def op_delete(key: bytes) -> rpc.RequestOp:
    return rpc.RequestOp(request_delete_range=rpc.DeleteRangeRequest(key=key))


def op_delete_prefix(prefix: bytes) -> rpc.RequestOp:
    return rpc.RequestOp(request_delete_range=rpc.DeleteRangeRequest(
        key=prefix, range_end=prefix_range_end(prefix)))


class EtcdClient:
    """One gRPC channel to etcd and the calls on it (see the module docstring)."""

    def __init__(self, endpoints: Sequence[str], *, timeout_s: float = 5.0,
                 credentials: grpc.ChannelCredentials | None = None) -> None:
        """``credentials``: TLS to an etcd serving https (its CA, and a client certificate when
        etcd runs with ``--client-cert-auth``); None: plaintext."""
        if not endpoints:
            raise ValueError("no etcd endpoints")
        self.endpoints = list(endpoints)
        self.timeout_s = timeout_s
        target = _target(self.endpoints)
        self._channel = (grpc.aio.secure_channel(target, credentials, options=_CHANNEL_OPTIONS)
                         if credentials is not None else grpc.aio.insecure_channel(target, options=_CHANNEL_OPTIONS))
        self._kv = rpc.KVStub(self._channel)
        self._lease = rpc.LeaseStub(self._channel)
        self._watch = rpc.WatchStub(self._channel)

    def _error(self, what: str, e: BaseException) -> MetadataStoreError:
        detail = e.details() if isinstance(e, grpc.aio.AioRpcError) else (str(e) or type(e).__name__)
        return MetadataStoreError(f"etcd at {','.join(self.endpoints)} failed {what}: {detail}")

    @contextlib.asynccontextmanager
    async def _call(self, what: str) -> AsyncIterator[None]:
        try:
            yield
        except (grpc.aio.AioRpcError, asyncio.TimeoutError, OSError) as e:
            raise self._error(what, e) from e

    async def close(self) -> None:
        await self._channel.close()

    # ------------------------------------------------------------------ KV

    async def get_prefix(self, prefix: bytes) -> tuple[int, list[KeyValue]]:
        """Every key under ``prefix`` at one revision: (that revision, the key-values)."""
        async with self._call(f"a range read of {prefix!r}"):
            resp = await self._kv.Range(rpc.RangeRequest(key=prefix, range_end=prefix_range_end(prefix)),
                                        timeout=self.timeout_s)
        return resp.header.revision, [_kv(kv) for kv in resp.kvs]

    async def get(self, key: bytes) -> tuple[int, KeyValue | None]:
        async with self._call(f"a read of {key!r}"):
            resp = await self._kv.Range(rpc.RangeRequest(key=key), timeout=self.timeout_s)
        return resp.header.revision, (_kv(resp.kvs[0]) if resp.kvs else None)

    async def put(self, key: bytes, value: bytes, *, lease: int = 0) -> int:
        async with self._call(f"a write of {key!r}"):
            resp = await self._kv.Put(rpc.PutRequest(key=key, value=value, lease=lease), timeout=self.timeout_s)
        return int(resp.header.revision)

    async def txn(self, compare: Sequence[rpc.Compare], success: Sequence[rpc.RequestOp],
                  failure: Sequence[rpc.RequestOp] = ()) -> TxnResult:
        async with self._call("a transaction"):
            resp = await self._kv.Txn(rpc.TxnRequest(compare=list(compare), success=list(success),
                                                     failure=list(failure)), timeout=self.timeout_s)
        gets = [[_kv(kv) for kv in r.response_range.kvs] for r in resp.responses
                if r.WhichOneof("response") == "response_range"]
        return TxnResult(bool(resp.succeeded), int(resp.header.revision), gets)

    # ------------------------------------------------------------------ leases

    async def grant_lease(self, ttl_s: int) -> tuple[int, int]:
        """A new lease: (its id, the TTL etcd granted, which may be longer than asked: etcd's
        minimum is 1.5 election timeouts, rounded up to whole seconds)."""
        async with self._call(f"a lease grant (ttl {ttl_s} s)"):
            resp = await self._lease.LeaseGrant(rpc.LeaseGrantRequest(TTL=ttl_s), timeout=self.timeout_s)
        if resp.error:
            raise MetadataStoreError(f"etcd refused a lease: {resp.error}")
        return int(resp.ID), int(resp.TTL)

    async def keep_alive_once(self, lease: int) -> int:
        """Refresh ``lease``; return its new TTL in seconds (≤ 0: etcd no longer has it)."""
        async with self._call(f"a keep-alive of lease {lease:x}"):
            call = self._lease.LeaseKeepAlive(iter([rpc.LeaseKeepAliveRequest(ID=lease)]),
                                              timeout=self.timeout_s)
            try:
                async for reply in call:
                    return int(reply.TTL)
            finally:
                call.cancel()
        return 0

    async def revoke_lease(self, lease: int) -> None:
        """Revoke ``lease`` (its keys vanish at once); a lease etcd no longer has is not an error."""
        try:
            async with self._call(f"a revoke of lease {lease:x}"):
                await self._lease.LeaseRevoke(rpc.LeaseRevokeRequest(ID=lease), timeout=self.timeout_s)
        except MetadataStoreError as e:
            if "lease not found" not in str(e):
                raise

    # ------------------------------------------------------------------ watch

    async def watch_prefix(self, prefix: bytes, start_revision: int) -> AsyncIterator[int]:
        """Yield, for every batch of changes under ``prefix`` from ``start_revision`` on, the
        highest revision in the batch. Raises :class:`MetadataStoreError` when the stream breaks
        or the start revision was compacted (the caller re-reads and watches again)."""
        stop = asyncio.Event()

        async def requests() -> AsyncIterator[rpc.WatchRequest]:
            yield rpc.WatchRequest(create_request=rpc.WatchCreateRequest(
                key=prefix, range_end=prefix_range_end(prefix), start_revision=start_revision))
            await stop.wait()  # keep the stream open: a half-closed watch ends server-side

        call = self._watch.Watch(requests())
        try:
            async with self._call(f"a watch of {prefix!r}"):
                async for resp in call:
                    if resp.compact_revision:
                        raise MetadataStoreError(
                            f"watch of {prefix!r} from revision {start_revision}: compacted up to "
                            f"{resp.compact_revision}")
                    if resp.canceled:
                        raise MetadataStoreError(f"etcd cancelled the watch of {prefix!r}: "
                                                 f"{resp.cancel_reason or 'no reason given'}")
                    if resp.events:
                        yield max(ev.kv.mod_revision for ev in resp.events)
            raise MetadataStoreError(f"etcd ended the watch of {prefix!r}")
        finally:
            stop.set()
            call.cancel()
