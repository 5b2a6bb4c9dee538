"""Apache Kafka's own Java tools and clients, for tests of the Kafka listener.

``make kafka-jars`` (which ``make test`` runs) resolves Kafka's jars with Maven into
``$LOGSTORE_KAFKA_JARS`` or ``.cache/kafka-jars``; :func:`kafka_classpath` finds them.
:func:`kafka_call` sends one request of Kafka's protocol (kio's messages) over a raw socket,
for what Kafka's clients do not expose (FindCoordinator); :class:`KafkaConnection` keeps one
open (plaintext or TLS) for several, and logs in with SASL SCRAM first when asked
(:meth:`KafkaConnection.login`).
"""

from __future__ import annotations

import io
import os
import socket
import ssl
import struct
import subprocess
import time
from collections.abc import Sequence
from typing import Any

__all__ = ["CLIENT_CONF", "KafkaConnection", "kafka_call", "kafka_classpath", "kafka_values", "NO_KAFKA_JARS",
           "recv_exactly"]

# confluent-kafka settings of the tests: a broker that goes away is noticed, and found again, quickly.
CLIENT_CONF = {"socket.timeout.ms": 10_000, "reconnect.backoff.max.ms": 500}

NO_KAFKA_JARS = ("no Apache Kafka jars cached (make kafka-jars, which make test runs, resolves them "
                 "with mvn) or no java")


def kafka_classpath() -> str | None:
    """The classpath of Apache Kafka's jars if cached, and Java to run them; else None."""
    configured = os.environ.get("LOGSTORE_KAFKA_JARS")
    repo = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
    folder = configured if configured else os.path.join(repo, ".cache", "kafka-jars")
    folder = folder if os.path.isabs(folder) else os.path.join(repo, folder)
    if not any(n.startswith("kafka-clients-") for n in (os.listdir(folder) if os.path.isdir(folder) else ())):
        return None
    if subprocess.run(["java", "-version"], capture_output=True).returncode != 0:
        return None
    return os.path.join(folder, "*")


def kafka_values(kafka_bootstrap: str, topic: str, *, isolation: str, expected: int,
                 partitions: Sequence[int] = (0, 1)) -> list[bytes]:
    """Every value a confluent-kafka consumer with ``isolation.level`` ``isolation`` reads from
    ``partitions`` of ``topic``, sorted: read until ``expected`` came (at most 20 s), then 1.5 s
    more, so that a value beyond what is expected shows up too."""
    import confluent_kafka as ck

    consumer = ck.Consumer({"bootstrap.servers": kafka_bootstrap, "group.id": f"{isolation}-{topic}",
                            "isolation.level": isolation, "auto.offset.reset": "earliest",
                            "enable.auto.commit": False, **CLIENT_CONF})
    try:
        consumer.assign([ck.TopicPartition(topic, p, 0) for p in partitions])
        got: list[bytes] = []
        deadline = time.monotonic() + 20
        while time.monotonic() < deadline and len(got) < expected:
            message = consumer.poll(0.5)
            if message is not None and message.error() is None:
                got.append(message.value())
        end = time.monotonic() + 1.5
        while time.monotonic() < end:
            message = consumer.poll(0.3)
            if message is not None and message.error() is None:
                got.append(message.value())
        return sorted(got)
    finally:
        consumer.close()


def kafka_call(address: str, api_key: int, version: int, *, timeout_s: float = 10.0, **fields: Any) -> Any:
    """The response to one request (API ``api_key`` at ``version``, its body ``fields``) sent
    to the Kafka listener at ``address`` (``host:port``) on a connection of its own."""
    with KafkaConnection(address, timeout_s=timeout_s) as connection:
        return connection.call(api_key, version, **fields)


def request_bytes(api_key: int, version: int, correlation_id: int = 1, client_id: str = "test",
                  **fields: Any) -> bytes:
    """A request (API ``api_key`` at ``version``, its body ``fields``) framed for the wire."""
    from kio.index import load_request_schema
    from kio.serial import entity_writer

    request_type: Any = load_request_schema(api_key, version)
    header_type: Any = request_type.__header_schema__
    buffer = io.BytesIO()
    entity_writer(header_type)(buffer, header_type(request_api_key=api_key, request_api_version=version,
                                                   correlation_id=correlation_id, client_id=client_id))
    entity_writer(request_type)(buffer, request_type(**fields))
    return struct.pack(">i", buffer.tell()) + buffer.getvalue()


class KafkaConnection:
    """One connection to a Kafka listener at ``address`` (``host:port``); TLS when ``tls`` (an
    :class:`ssl.SSLContext`) is given. :meth:`call` sends a request and reads its answer."""

    def __init__(self, address: str, *, tls: ssl.SSLContext | None = None, timeout_s: float = 10.0,
                 client_id: str = "test") -> None:
        host, _, port = address.rpartition(":")
        sock = socket.create_connection((host, int(port)), timeout=timeout_s)
        self.sock: socket.socket = tls.wrap_socket(sock, server_hostname=host) if tls is not None else sock
        self.client_id = client_id
        self._correlation_id = 0

    def __enter__(self) -> KafkaConnection:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def close(self) -> None:
        self.sock.close()

    def send(self, api_key: int, version: int, **fields: Any) -> int:
        """Send a request; return its correlation id."""
        self._correlation_id += 1
        self.sock.sendall(request_bytes(api_key, version, self._correlation_id, self.client_id, **fields))
        return self._correlation_id

    def receive(self, api_key: int, version: int, correlation_id: int) -> Any:
        """The answer to the request ``correlation_id`` (of API ``api_key`` at ``version``)."""
        from kio.index import load_response_schema
        from kio.serial import entity_reader

        (size,) = struct.unpack(">i", recv_exactly(self.sock, 4))
        frame = recv_exactly(self.sock, size)
        response_type: Any = load_response_schema(api_key, version)
        header, at = entity_reader(response_type.__header_schema__)(frame, 0)
        assert header.correlation_id == correlation_id, header
        return entity_reader(response_type)(frame, at)[0]

    def call(self, api_key: int, version: int, **fields: Any) -> Any:
        return self.receive(api_key, version, self.send(api_key, version, **fields))

    def closed_by_peer(self, timeout_s: float = 10.0) -> bool:
        """Whether the broker closes the connection within ``timeout_s`` (nothing else arrives)."""
        self.sock.settimeout(timeout_s)
        try:
            return self.sock.recv(1) == b""
        except (ConnectionError, ssl.SSLError):
            return True

    def login(self, user: str, password: str, mechanism: str = "SCRAM-SHA-512", *,
              authenticate_version: int = 2) -> Any:
        """SaslHandshake v1 and SaslAuthenticate (client-first, client-final); the final answer.
        A refusal is returned as it came (its error code set), without the broker's signature checked."""
        from logstore.scram import ScramClient

        handshake = self.call(17, 1, mechanism=mechanism)
        assert handshake.error_code == 0, handshake
        client = ScramClient(mechanism, user, password)
        first = self.call(36, authenticate_version, auth_bytes=client.first().encode())
        if first.error_code != 0:
            return first
        final = self.call(36, authenticate_version, auth_bytes=client.final(first.auth_bytes.decode()).encode())
        if final.error_code == 0:
            client.verify(final.auth_bytes.decode())
        return final


def recv_exactly(sock: socket.socket, n: int) -> bytes:
    """``n`` bytes from ``sock`` (ConnectionError when it closes first)."""
    data = b""
    while len(data) < n:
        chunk = sock.recv(n - len(data))
        if not chunk:
            raise ConnectionError(f"closed after {len(data)} of {n} bytes")
        data += chunk
    return data
