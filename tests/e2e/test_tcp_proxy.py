"""The harness's TCP proxy (logstore/dev/tcp_proxy.py): forwards, cuts (reset and blackhole), heals.

Plain sockets against an echo server pin the byte-level behaviour; a real gRPC broker
(EmbeddedBroker) behind the proxy shows what a replica fetcher will see through it.
"""

from __future__ import annotations

import socket
import threading
import time
from collections.abc import Iterator

import grpc
import pytest

from logstore._proto import logstore_pb2 as pb
from logstore._proto import logstore_pb2_grpc as pb_grpc
from logstore.broker.embedded import EmbeddedBroker
from logstore.dev.tcp_proxy import ProxyRunner, TcpProxy


@pytest.fixture
def echo_server() -> Iterator[str]:
    """A threaded TCP echo server on a free loopback port."""
    listener = socket.create_server(("127.0.0.1", 0))
    stop = threading.Event()

    def serve_one(conn: socket.socket) -> None:
        with conn:
            while not stop.is_set():
                try:
                    data = conn.recv(65536)
                except OSError:
                    return
                if not data:
                    return
                conn.sendall(data)

    def accept() -> None:
        while not stop.is_set():
            try:
                conn, _ = listener.accept()
            except OSError:
                return
            threading.Thread(target=serve_one, args=(conn,), daemon=True).start()

    threading.Thread(target=accept, daemon=True).start()
    yield f"127.0.0.1:{listener.getsockname()[1]}"
    stop.set()
    listener.close()


def _connect(address: str) -> socket.socket:
    host, _, port = address.rpartition(":")
    sock = socket.create_connection((host, int(port)), timeout=5)
    return sock


def _echo(sock: socket.socket, payload: bytes) -> bytes:
    sock.sendall(payload)
    got = b""
    while len(got) < len(payload):
        chunk = sock.recv(65536)
        if not chunk:
            break
        got += chunk
    return got


@pytest.mark.timeout(30)
def test_bytes_pass_through_both_ways_unchanged(echo_server: str) -> None:
    with TcpProxy.start(echo_server) as proxy:
        payload = bytes(range(256)) * 2000  # 512 KB: many reads and writes on the way
        with _connect(proxy.address) as sock:
            assert _echo(sock, payload) == payload
        assert proxy.bytes_forwarded == 2 * len(payload)
        assert proxy.connections_accepted == 1


@pytest.mark.timeout(30)
def test_reset_cut_breaks_open_connections_and_refuses_new_ones_until_heal(echo_server: str) -> None:
    with TcpProxy.start(echo_server) as proxy:
        sock = _connect(proxy.address)
        assert _echo(sock, b"before") == b"before"
        proxy.cut("reset")
        with pytest.raises(OSError):  # reset by peer (or EOF turned into an error below)
            data = sock.recv(10)
            if not data:
                raise ConnectionResetError("EOF")
        sock.close()
        # A new connection is accepted and reset at once: the reset may reach the client while
        # connect() is still returning (ECONNRESET there) or at its first read.
        with pytest.raises(OSError), _connect(proxy.address) as fresh:
            fresh.sendall(b"x")
            if not fresh.recv(10):
                raise ConnectionResetError("EOF")
        proxy.heal()
        with _connect(proxy.address) as healed:
            assert _echo(healed, b"after") == b"after"


@pytest.mark.timeout(30)
def test_blackhole_cut_silences_without_closing_and_heal_resets_the_silenced(echo_server: str) -> None:
    with TcpProxy.start(echo_server) as proxy:
        sock = _connect(proxy.address)
        assert _echo(sock, b"before") == b"before"
        proxy.cut("blackhole")
        sock.settimeout(0.5)
        sock.sendall(b"lost")
        with pytest.raises(socket.timeout):  # no answer, no close: a partition, not a crash
            sock.recv(10)
        with _connect(proxy.address) as fresh:  # a new connection is accepted, then nothing
            fresh.settimeout(0.5)
            fresh.sendall(b"lost too")
            with pytest.raises(socket.timeout):
                fresh.recv(10)
        proxy.heal()
        sock.settimeout(5)
        with pytest.raises(OSError):  # its bytes were dropped: it is reset, the peer reconnects
            if not sock.recv(10):
                raise ConnectionResetError("EOF")
        sock.close()
        with _connect(proxy.address) as healed:
            assert _echo(healed, b"after") == b"after"


@pytest.mark.timeout(30)
def test_a_runner_hosts_many_proxies_and_closes_them(echo_server: str) -> None:
    with ProxyRunner() as runner:
        proxies = [runner.start_proxy(echo_server) for _ in range(4)]
        assert len({p.port for p in proxies}) == 4
        proxies[1].cut()
        for i, p in enumerate(proxies):
            if i == 1:
                continue
            with _connect(p.address) as sock:
                assert _echo(sock, b"p%d" % i) == b"p%d" % i
    with pytest.raises(OSError):
        _connect(proxies[0].address).sendall(b"x")


# ---------------------------------------------------------------- gRPC through the proxy


@pytest.fixture(scope="module")
def broker() -> Iterator[EmbeddedBroker]:
    with EmbeddedBroker() as b:
        stub = pb_grpc.LogstoreStub(grpc.insecure_channel(b.bootstrap))
        resp = stub.CreateTopics(pb.CreateTopicsRequest(topics=[pb.NewTopic(name="proxied", partitions=1)]),
                                 timeout=30)
        assert not resp.results[0].error.code, resp.results[0].error
        yield b


def _stub(address: str) -> tuple[grpc.Channel, pb_grpc.LogstoreStub]:
    # A channel of its own (no shared subchannel pool), so every test sees its own connection.
    channel = grpc.insecure_channel(address, options=[("grpc.use_local_subchannel_pool", 1)])
    return channel, pb_grpc.LogstoreStub(channel)


def _long_poll(stub: pb_grpc.LogstoreStub, max_wait_ms: int, timeout_s: float) -> pb.FetchResponse:
    return stub.Fetch(pb.FetchRequest(max_wait_ms=max_wait_ms, partitions=[
        pb.FetchPartition(topic="proxied", partition=0, fetch_offset=0)]), timeout=timeout_s)


@pytest.mark.timeout(60)
def test_a_grpc_call_goes_through_and_a_reset_cut_fails_a_running_long_poll(broker: EmbeddedBroker) -> None:
    with TcpProxy.start(broker.bootstrap) as proxy:
        channel, stub = _stub(proxy.address)
        with channel:
            meta = stub.Metadata(pb.MetadataRequest(topics=["proxied"]), timeout=10)
            assert [t.name for t in meta.topics] == ["proxied"]
            assert proxy.bytes_forwarded > 0
            threading.Timer(0.5, proxy.cut).start()
            started = time.monotonic()
            with pytest.raises(grpc.RpcError) as err:
                _long_poll(stub, max_wait_ms=20_000, timeout_s=30)  # the broker would hold it 20 s
            assert err.value.code() == grpc.StatusCode.UNAVAILABLE
            assert time.monotonic() - started < 5
            proxy.heal()
            deadline = time.monotonic() + 10
            while True:  # the channel reconnects by itself (after its backoff)
                try:
                    meta = stub.Metadata(pb.MetadataRequest(topics=["proxied"]), timeout=2,
                                         wait_for_ready=True)
                    break
                except grpc.RpcError:
                    assert time.monotonic() < deadline, "no reconnect after heal"
            assert [t.name for t in meta.topics] == ["proxied"]


@pytest.mark.timeout(60)
def test_a_blackhole_cut_leaves_a_call_hanging_until_its_deadline(broker: EmbeddedBroker) -> None:
    with TcpProxy.start(broker.bootstrap) as proxy:
        channel, stub = _stub(proxy.address)
        with channel:
            stub.Metadata(pb.MetadataRequest(), timeout=10)
            proxy.cut("blackhole")
            started = time.monotonic()
            with pytest.raises(grpc.RpcError) as err:
                # The broker answers a 200 ms poll at once; through a blackhole nothing returns.
                _long_poll(stub, max_wait_ms=200, timeout_s=2)
            assert err.value.code() == grpc.StatusCode.DEADLINE_EXCEEDED
            assert time.monotonic() - started >= 1.9
            proxy.heal()
            deadline = time.monotonic() + 15
            while True:
                try:
                    resp = _long_poll(stub, max_wait_ms=0, timeout_s=2)
                    break
                except grpc.RpcError:
                    assert time.monotonic() < deadline, "no reconnect after heal"
            assert not resp.partitions[0].error.code
