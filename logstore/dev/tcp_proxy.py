"""A TCP proxy the fault harness controls: the network partitions of the cluster tests.

Brokers of a :class:`~logstore.dev.local_cluster.LocalCluster` reach their peers through one
proxy per ordered pair, so a test can cut replication between two brokers while clients
still reach both. A proxy listens on a loopback port and forwards each accepted connection
to one target, byte for byte, in both directions. It has three states:

* **forwarding** (the start, and after :meth:`AsyncTcpProxy.heal`): new connections are
  forwarded.
* **cut, reset** (``cut("reset")``): every open connection is aborted with a TCP RST on both
  sides (``SO_LINGER`` 0), and every new one is accepted and reset at once: the peer sees
  "connection reset" or "unavailable" immediately, like a process whose port is closed.
* **cut, blackhole** (``cut("blackhole")``): open connections go silent (bytes from either
  side are read and dropped, nothing is forwarded, nothing is closed) and new ones are
  accepted and never forwarded: the peer sees nothing at all until its own deadline or
  keep-alive gives up, like a partition that drops packets.

:meth:`~AsyncTcpProxy.heal` returns to forwarding; the connections that were blackholed are
reset then (bytes were dropped, so their streams cannot continue) and the peers reconnect.

:class:`AsyncTcpProxy` lives on the caller's event loop. Sync code (tests, the harness's
nemesis) uses :class:`ProxyRunner`, one background thread with an event loop hosting any
number of proxies, and the :class:`TcpProxy` handles it returns.

Thread-safety: an :class:`AsyncTcpProxy` belongs to its event loop's thread; :class:`TcpProxy`
methods may be called from any thread (they run on the runner's loop and wait for it).
"""

from __future__ import annotations

import asyncio
import contextlib
import socket
import struct
import threading
from collections.abc import Coroutine
from typing import Any, Literal, TypeVar

__all__ = ["CutMode", "AsyncTcpProxy", "ProxyRunner", "TcpProxy"]

CutMode = Literal["reset", "blackhole"]
_T = TypeVar("_T")
_CHUNK = 64 * 1024
_CALL_TIMEOUT_S = 10.0


def _reset(writer: asyncio.StreamWriter) -> None:
    """Abort a connection with an RST, not a FIN: the peer's next read fails at once."""
    sock = writer.get_extra_info("socket")
    if sock is not None:
        with contextlib.suppress(OSError):
            sock.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
    writer.transport.abort()


class _Connection:
    """One accepted client connection and (when forwarding) its upstream connection."""

    def __init__(self, client: asyncio.StreamWriter) -> None:
        self.client = client
        self.upstream: asyncio.StreamWriter | None = None
        self.silenced = False
        self.tasks: list[asyncio.Task[None]] = []

    def reset(self) -> None:
        for writer in (self.client, self.upstream):
            if writer is not None:
                _reset(writer)
        for task in self.tasks:
            task.cancel()


class AsyncTcpProxy:
    """Forwards ``listen host:port`` → ``target``; :meth:`cut` and :meth:`heal` flip it."""

    def __init__(self, target: str, *, host: str = "127.0.0.1", port: int = 0) -> None:
        """``target`` is ``"host:port"``; ``port`` 0 picks a free one (see :attr:`port`)."""
        target_host, _, target_port = target.rpartition(":")
        self.target_host = target_host
        self.target_port = int(target_port)
        self.host = host
        self.port = port
        self.mode: CutMode | None = None
        self.connections_accepted = 0
        self.bytes_forwarded = 0
        self._connections: set[_Connection] = set()
        self._server: asyncio.base_events.Server | None = None

    @property
    def address(self) -> str:
        return f"{self.host}:{self.port}"

    @property
    def target(self) -> str:
        return f"{self.target_host}:{self.target_port}"

    @property
    def open_connections(self) -> int:
        return len(self._connections)

    async def start(self) -> AsyncTcpProxy:
        self._server = await asyncio.start_server(self._accept, self.host, self.port, reuse_address=True)
        self.port = self._server.sockets[0].getsockname()[1]
        return self

    def cut(self, mode: CutMode = "reset") -> None:
        """Partition the link: reset (or silence, for ``"blackhole"``) every open connection,
        and reset (or swallow) every new one until :meth:`heal`."""
        if mode not in ("reset", "blackhole"):
            raise ValueError(f"cut mode must be 'reset' or 'blackhole', got {mode!r}")
        self.mode = mode
        for conn in list(self._connections):
            if mode == "reset":
                self._drop(conn)
            else:
                conn.silenced = True

    def heal(self) -> None:
        """Forward again; connections silenced by a blackhole are reset so peers reconnect."""
        self.mode = None
        for conn in list(self._connections):
            if conn.silenced:
                self._drop(conn)

    async def close(self) -> None:
        """Stop listening and reset every connection."""
        if self._server is not None:
            self._server.close()
        for conn in list(self._connections):
            self._drop(conn)
        if self._server is not None:
            await self._server.wait_closed()
            self._server = None

    def _drop(self, conn: _Connection) -> None:
        self._connections.discard(conn)
        conn.reset()

    async def _accept(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        self.connections_accepted += 1
        conn = _Connection(writer)
        if self.mode == "reset":
            _reset(writer)
            return
        self._connections.add(conn)
        if self.mode == "blackhole":
            conn.silenced = True
            await self._swallow(reader, conn)
            return
        try:
            up_reader, up_writer = await asyncio.open_connection(self.target_host, self.target_port)
        except OSError:  # the target is down: the client sees what it would see without us
            self._drop(conn)
            return
        conn.upstream = up_writer
        if conn not in self._connections:  # cut while connecting
            _reset(up_writer)
            return
        if conn.silenced:
            await self._swallow(reader, conn)
            return
        loop = asyncio.get_running_loop()
        conn.tasks = [loop.create_task(self._pump(reader, up_writer, conn)),
                      loop.create_task(self._pump(up_reader, writer, conn))]
        await asyncio.gather(*conn.tasks, return_exceptions=True)
        if conn in self._connections:
            self._connections.discard(conn)
            for w in (writer, up_writer):
                w.close()

    async def _swallow(self, reader: asyncio.StreamReader, conn: _Connection) -> None:
        """Read and drop until the client goes away or the connection is reset."""
        with contextlib.suppress(OSError, asyncio.CancelledError):
            while await reader.read(_CHUNK):
                pass
        if conn in self._connections:  # the client left (not reset by heal or close)
            self._drop(conn)

    async def _pump(self, src: asyncio.StreamReader, dst: asyncio.StreamWriter, conn: _Connection) -> None:
        """Copy ``src`` → ``dst`` until EOF; while silenced, drop what arrives instead."""
        try:
            while True:
                data = await src.read(_CHUNK)
                if not data:
                    break
                if conn.silenced:
                    continue
                self.bytes_forwarded += len(data)  # counted first: a reader sees the bytes after
                dst.write(data)
                await dst.drain()
        except (OSError, asyncio.IncompleteReadError):
            pass
        finally:
            # One side ended: end the whole connection (gRPC never half-closes a channel).
            for task in conn.tasks:
                if task is not asyncio.current_task():
                    task.cancel()


class ProxyRunner:
    """A background thread running an event loop that hosts :class:`TcpProxy` instances."""

    def __init__(self) -> None:
        self._loop = asyncio.new_event_loop()
        self._thread = threading.Thread(target=self._loop.run_forever, name="tcp-proxy", daemon=True)
        self._thread.start()
        self._proxies: list[TcpProxy] = []

    def call(self, coro: Coroutine[Any, Any, _T]) -> _T:
        return asyncio.run_coroutine_threadsafe(coro, self._loop).result(_CALL_TIMEOUT_S)

    def start_proxy(self, target: str, *, host: str = "127.0.0.1", port: int = 0) -> TcpProxy:
        """A started proxy to ``target`` on ``host:port`` (0: a free port)."""
        inner = self.call(AsyncTcpProxy(target, host=host, port=port).start())
        proxy = TcpProxy(self, inner)
        self._proxies.append(proxy)
        return proxy

    def close(self) -> None:
        """Close every proxy and stop the thread."""
        for proxy in self._proxies:
            proxy.close()
        self._proxies.clear()
        if self._thread.is_alive():
            self._loop.call_soon_threadsafe(self._loop.stop)
            self._thread.join(_CALL_TIMEOUT_S)
        if not self._loop.is_running():
            self._loop.close()

    def __enter__(self) -> ProxyRunner:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


class TcpProxy:
    """A sync handle on a proxy hosted by a :class:`ProxyRunner`."""

    def __init__(self, runner: ProxyRunner, inner: AsyncTcpProxy) -> None:
        self._runner = runner
        self._inner = inner
        self._closed = False

    @classmethod
    def start(cls, target: str, *, host: str = "127.0.0.1", port: int = 0) -> TcpProxy:
        """A proxy on a runner of its own, closed with it (for a test that needs just one)."""
        runner = ProxyRunner()
        proxy = runner.start_proxy(target, host=host, port=port)
        proxy._own_runner = runner
        return proxy

    _own_runner: ProxyRunner | None = None

    @property
    def port(self) -> int:
        return self._inner.port

    @property
    def address(self) -> str:
        return self._inner.address

    @property
    def target(self) -> str:
        return self._inner.target

    @property
    def is_cut(self) -> bool:
        return self._inner.mode is not None

    @property
    def connections_accepted(self) -> int:
        return self._inner.connections_accepted

    @property
    def bytes_forwarded(self) -> int:
        return self._inner.bytes_forwarded

    @property
    def open_connections(self) -> int:
        return self._inner.open_connections

    def cut(self, mode: CutMode = "reset") -> None:
        self._runner.call(_run(self._inner.cut, mode))

    def heal(self) -> None:
        self._runner.call(_run(self._inner.heal))

    def close(self) -> None:
        if self._closed:
            return
        self._closed = True
        self._runner.call(self._inner.close())
        if self._own_runner is not None:
            runner, self._own_runner = self._own_runner, None
            runner.close()

    def __enter__(self) -> TcpProxy:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


async def _run(fn: Any, *args: Any) -> None:
    """Run a sync method of an :class:`AsyncTcpProxy` on its loop's thread."""
    fn(*args)
