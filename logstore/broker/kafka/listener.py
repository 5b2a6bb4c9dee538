"""The Kafka protocol's TCP listener: framing, request headers, one request at a time per connection.

Wire format (Kafka's): every request and response is an int32 size, then that many
bytes. A request starts with its header (api key, api version, correlation id, client
id; tagged fields from the flexible versions on), then the body; a response starts with
the correlation id (plus tagged fields when flexible; never for ApiVersions). The
headers and bodies are (de)serialized by kio, from Kafka's own message schemas.

Per connection, requests are read, handled and answered in order, one at a time (Kafka's
broker mutes a channel while a request of it is in flight the same way): answers keep
the order of their requests, and a long-polling fetch holds only its own connection.
A produce with ``acks=0`` gets no answer, as in Kafka.

What closes a connection, with one log line at WARNING (rate-limited like every
repeated warning of the broker): a frame larger than ``max_request_bytes`` or smaller
than a header, a request whose lists hold more than ``max_request_entries`` entries,
bytes that do not parse as the header and body of the version they
name, an API this broker does not serve, or a version outside its range (except
ApiVersions, answered in v0 with UNSUPPORTED_VERSION and the supported range, as Kafka
does so a client can retry with a version it knows). Bytes after a request's body are
ignored, as Kafka's broker ignores them. An unexpected exception in a
handler is logged with its traceback and closes the connection: nothing but Kafka
messages goes on the wire.

Thread-safety: event loop only.
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import functools
import io
import logging
import struct
import types
from typing import Any

from kio.index import load_request_schema
from kio.serial import entity_reader, entity_writer

from logstore.broker.kafka.apis import API_VERSIONS_KEY, KafkaApis
from logstore.errors import InvalidRequestError

__all__ = ["KafkaListener"]

log = logging.getLogger("logstore.broker.kafka")

_SIZE = struct.Struct(">i")
_HEAD = struct.Struct(">hhi")  # api key, api version, correlation id: the start of every request header


class _Malformed(Exception):
    """A request that closes its connection; the message is the log line's reason."""


class KafkaListener:
    """Serves :class:`KafkaApis` on ``host:port`` (port 0: any free one); see the module docstring."""

    def __init__(self, *, apis: KafkaApis, host: str, port: int, max_request_bytes: int) -> None:
        self._apis = apis
        self._host = host
        self._port = port
        self._max_request_bytes = max_request_bytes
        self._server: asyncio.Server | None = None
        self._connections: set[asyncio.Task[None]] = set()

    @property
    def port(self) -> int:
        """The bound port (the configured one until :meth:`start`)."""
        return self._port

    async def start(self) -> int:
        """Bind and accept connections; return the bound port. Raises OSError when the address is taken."""
        self._server = await asyncio.start_server(self._serve, self._host, self._port, reuse_address=True)
        self._port = self._server.sockets[0].getsockname()[1]
        log.info("kafka listener on %s:%d", self._host, self._port)
        return self._port

    async def stop(self) -> None:
        """Stop accepting, and close every connection (a request in flight is abandoned)."""
        if self._server is not None:
            self._server.close()
        for task in list(self._connections):
            task.cancel()
        for task in list(self._connections):
            with contextlib.suppress(asyncio.CancelledError, Exception):
                await task
        if self._server is not None:
            with contextlib.suppress(Exception):
                await self._server.wait_closed()

    async def _serve(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        task = asyncio.current_task()
        assert task is not None
        self._connections.add(task)
        peer = writer.get_extra_info("peername")
        try:
            while True:
                try:
                    size_bytes = await reader.readexactly(4)
                except (asyncio.IncompleteReadError, ConnectionError):
                    return  # the client closed the connection
                (size,) = _SIZE.unpack(size_bytes)
                if size < _HEAD.size or size > self._max_request_bytes:
                    raise _Malformed(f"a request of {size} bytes (at most {self._max_request_bytes}, "
                                     "max_request_bytes)")
                try:
                    frame = await reader.readexactly(size)
                except (asyncio.IncompleteReadError, ConnectionError):
                    return
                answer = await self._handle(frame)
                if answer is not None:
                    writer.write(answer)
                    await writer.drain()
        except _Malformed as e:
            log.warning("kafka listener: closing the connection from %s: %s", peer, e)
        except (ConnectionError, asyncio.CancelledError):
            pass
        except Exception:  # a bug: logged with its traceback, never sent
            log.exception("kafka listener: unexpected error serving %s; closing its connection", peer)
        finally:
            self._connections.discard(task)
            writer.close()
            with contextlib.suppress(Exception):
                await writer.wait_closed()

    async def _handle(self, frame: bytes) -> bytes | None:
        """The answer to one request frame (size prefix included), or None (no answer: acks=0)."""
        api_key, version, correlation_id = _HEAD.unpack_from(frame)
        supported = self._apis.versions.get(api_key)
        if supported is None:
            raise _Malformed(f"API key {api_key}, which this broker does not serve (ApiVersions lists those it does)")
        if not supported[0] <= version <= supported[1]:
            if api_key == API_VERSIONS_KEY:  # answered in v0 so the client can pick a version we know
                return _frame(correlation_id, self._apis.unsupported_api_versions())
            raise _Malformed(f"API key {api_key} version {version}; this broker serves "
                             f"{supported[0]} to {supported[1]}")
        request_type: Any = load_request_schema(api_key, version)
        try:
            header, at = entity_reader(request_type.__header_schema__)(frame, 0)
            request, size = entity_reader(request_type)(frame, at)
        except Exception as e:  # kio's decoders raise many kinds on arbitrary bytes
            raise _Malformed(f"API key {api_key} v{version} does not parse: {type(e).__name__}: {e}") from None
        null = _null_where_not_allowed(request)
        if null is not None:  # kio reads a length of -1 as None whatever the schema says
            raise _Malformed(f"API key {api_key} v{version}: {null} is null, which its schema does not allow")
        if at + size != len(frame):  # ignored, as Kafka's broker does (librdkafka's Metadata v12 has 3)
            log.debug("kafka listener: %d bytes after the body of API key %d v%d", len(frame) - at - size,
                      api_key, version)
        try:
            response = await self._apis.handle(request, client_id=header.client_id)
        except InvalidRequestError as e:  # over the request bounds
            raise _Malformed(e.message) from None
        return None if response is None else _frame(correlation_id, response)


def _null_where_not_allowed(entity: Any, path: str = "") -> str | None:
    """The path of the first field of ``entity`` (and the entities in its lists) that is None
    although its type is not nullable; None when there is none."""
    for name, nullable in _fields(type(entity)):  # type: ignore[arg-type]
        value = getattr(entity, name)
        if value is None:
            if not nullable:
                return f"{path}{name}"
        elif isinstance(value, tuple):
            for i, item in enumerate(value):
                if dataclasses.is_dataclass(item):
                    found = _null_where_not_allowed(item, f"{path}{name}[{i}].")
                    if found is not None:
                        return found
    return None


@functools.cache
def _fields(entity_type: type) -> tuple[tuple[str, bool], ...]:
    """Each field of a kio entity type and whether it may be None."""
    return tuple((f.name, isinstance(f.type, types.UnionType) and type(None) in f.type.__args__)
                 for f in dataclasses.fields(entity_type))


def _frame(correlation_id: int, response: Any) -> bytes:
    """``response`` with its header and size prefix."""
    header_type: Any = response.__header_schema__
    buffer = io.BytesIO()
    buffer.write(b"\0\0\0\0")
    entity_writer(header_type)(buffer, header_type(correlation_id=correlation_id))
    entity_writer(type(response))(buffer, response)
    data = buffer.getbuffer()
    _SIZE.pack_into(data, 0, len(data) - 4)
    out = bytes(data)
    data.release()
    return out
