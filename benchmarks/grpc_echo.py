"""The raw gRPC baseline of the client benchmarks: a bytes-in/bytes-out server in a child process.

``python benchmarks/grpc_echo.py`` serves two unary methods with a generic
handler and identity serializers (no protobuf, no logstore code), on the same
server stack as the broker (``grpc.aio``, one event loop, the same message
size options), and prints ``listening on HOST:PORT`` once bound:

* ``/bench.Echo/Echo`` answers with the request's bytes (a true echo: the
  round-trip baseline of the latency benchmark);
* ``/bench.Echo/Ack`` answers with 8 bytes (the request's length): the
  shape of a produce, where megabytes go up and a few bytes come back.

:class:`EchoServer` starts and stops that child; :class:`EchoClient` calls
it from a channel opened with the options :class:`logstore.client.rpc.BrokerClient`
uses, and :meth:`EchoClient.pump` sends a byte string ``count`` times with up
to ``concurrency`` calls in flight (completions on gRPC's callback thread, as
the producer's sender sees them).

Thread-safety: an :class:`EchoClient` may be shared (its channel is).
"""

from __future__ import annotations

import argparse
import asyncio
import subprocess as sp
import sys
import threading
import time

import grpc

from logstore.client.rpc import MAX_MESSAGE_BYTES

SERVICE = "bench.Echo"
_START_TIMEOUT_S = 30.0


async def _serve(host: str, port: int) -> None:
    async def echo(request: bytes, context: grpc.aio.ServicerContext) -> bytes:
        return request

    async def ack(request: bytes, context: grpc.aio.ServicerContext) -> bytes:
        return len(request).to_bytes(8, "little")

    handler = grpc.method_handlers_generic_handler(SERVICE, {
        "Echo": grpc.unary_unary_rpc_method_handler(echo),
        "Ack": grpc.unary_unary_rpc_method_handler(ack),
    })
    server = grpc.aio.server(options=[
        ("grpc.max_receive_message_length", MAX_MESSAGE_BYTES),
        ("grpc.max_send_message_length", MAX_MESSAGE_BYTES),
        ("grpc.so_reuseport", 0),
    ])
    server.add_generic_rpc_handlers((handler,))
    bound = server.add_insecure_port(f"{host}:{port}")
    await server.start()
    print(f"listening on {host}:{bound}", flush=True)
    # Run until stdin closes (the parent exited or called stop()).
    await asyncio.get_running_loop().run_in_executor(None, sys.stdin.read)
    await server.stop(0)


class EchoServer:
    """The echo server as a child process (its own interpreter, so its own GIL)."""

    def __init__(self, host: str = "127.0.0.1") -> None:
        self.host = host
        self.port = 0
        self._proc: sp.Popen[str] | None = None

    @property
    def target(self) -> str:
        return f"{self.host}:{self.port}"

    def start(self) -> EchoServer:
        self._proc = sp.Popen([sys.executable, __file__, "--host", self.host, "--port", "0"],
                              stdin=sp.PIPE, stdout=sp.PIPE, text=True)
        result: list[str] = []
        reader = threading.Thread(target=lambda: result.append(self._proc.stdout.readline()),  # type: ignore[union-attr]
                                  daemon=True)
        reader.start()
        reader.join(_START_TIMEOUT_S)
        line = result[0].strip() if result else ""
        if not line.startswith("listening on "):
            self._proc.kill()
            raise RuntimeError(f"echo server did not start (said {line!r})")
        self.port = int(line.rsplit(":", 1)[1])
        return self

    def stop(self) -> None:
        if self._proc is not None and self._proc.poll() is None:
            assert self._proc.stdin is not None and self._proc.stdout is not None
            self._proc.stdin.close()
            try:
                self._proc.wait(10)
            except sp.TimeoutExpired:
                self._proc.kill()
                self._proc.wait(10)
            self._proc.stdout.close()

    def __enter__(self) -> EchoServer:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()


class EchoClient:
    def __init__(self, target: str) -> None:
        # The options of logstore.client.rpc.BrokerClient's channel.
        self._channel = grpc.insecure_channel(target, options=[
            ("grpc.max_send_message_length", MAX_MESSAGE_BYTES),
            ("grpc.max_receive_message_length", MAX_MESSAGE_BYTES),
            ("grpc.enable_http_proxy", 0),
        ])
        self.echo = self._channel.unary_unary(f"/{SERVICE}/Echo")
        self.ack = self._channel.unary_unary(f"/{SERVICE}/Ack")

    def close(self) -> None:
        self._channel.close()

    def __enter__(self) -> EchoClient:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def pump(self, payload: bytes, count: int, *, concurrency: int, timeout_s: float = 60.0) -> int:
        """Send ``payload`` ``count`` times to Ack, at most ``concurrency`` in flight; return bytes acked."""
        room = threading.Semaphore(concurrency)
        done = threading.Event()
        state = {"left": count, "acked": 0, "error": None}
        lock = threading.Lock()

        def finished(f: grpc.Future) -> None:
            try:
                n = int.from_bytes(f.result(), "little")
            except Exception as e:  # noqa: BLE001 - reported by pump
                state["error"] = e
                n = 0
            with lock:
                state["acked"] += n
                state["left"] -= 1
                if state["left"] == 0:
                    done.set()
            room.release()

        for _ in range(count):
            room.acquire()
            self.ack.future(payload, timeout=timeout_s).add_done_callback(finished)
        if count:
            done.wait()
        if state["error"] is not None:
            raise RuntimeError(f"echo call failed: {state['error']!r}")
        return int(state["acked"])  # type: ignore[call-overload]

    def round_trips(self, payload: bytes, count: int, *, interval_s: float = 0.0) -> list[float]:
        """``count`` sequential Echo calls of ``payload``; return each round-trip time in seconds."""
        out = []
        next_at = time.perf_counter()
        for _ in range(count):
            if interval_s:
                next_at += interval_s
                delay = next_at - time.perf_counter()
                if delay > 0:
                    time.sleep(delay)
            t0 = time.perf_counter()
            answer = self.echo(payload, timeout=10)
            out.append(time.perf_counter() - t0)
            assert len(answer) == len(payload)
        return out


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description="raw gRPC echo server (benchmark baseline)")
    parser.add_argument("--host", default="127.0.0.1")
    parser.add_argument("--port", type=int, default=0)
    args = parser.parse_args(argv)
    asyncio.run(_serve(args.host, args.port))
    return 0


if __name__ == "__main__":
    sys.exit(main())
