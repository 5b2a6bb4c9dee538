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

Security (:mod:`.security`): the listener speaks the broker's ``security_protocol`` with its
TLS material. A connection's principal is its SASL login's (:mod:`.sasl`; on a SASL listener
a connection that has not logged in may send ApiVersions, SaslHandshake and SaslAuthenticate
only, and one whose session ran out may only log in again), else its client certificate's
(mTLS), else ``User:ANONYMOUS``, at the peer's address; each request is handled for it
(:class:`~.request_context.RequestContext`: the handlers ask the authorizer). With quotas on,
each answer is counted against the caller's quotas and a throttled one says its throttle time,
after which the connection is muted that long (:mod:`.throttling`).

What closes a connection, with one log line at WARNING (rate-limited like every
repeated warning of the broker): a frame larger than ``max_request_bytes`` (512 KiB before
a SASL login, Kafka's ``sasl.server.max.receive.size``) or smaller than a header, a request
whose lists hold more than ``max_request_entries`` entries, bytes that do not parse as the
header and body of the version they name, an API this broker does not serve, or a version
outside its range (except
ApiVersions, answered in v0 with UNSUPPORTED_VERSION and the supported range, as Kafka
does so a client can retry with a version it knows), a request before a SASL login, a
client certificate no mapping rule matches. A failed SASL login closes its connection after
its answer, logged at DEBUG (the SCRAM server reports failed logins, once per interval).
Bytes after a request's body are ignored, as Kafka's broker ignores them. An unexpected
exception in a handler is logged with its traceback and closes the connection: nothing but
Kafka messages goes on the wire.

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
from logstore.broker.kafka.request_context import RequestContext
from logstore.broker.kafka.sasl import SASL_AUTHENTICATE, SASL_HANDSHAKE, SaslAuthenticator
from logstore.broker.kafka.security import ListenerSecurity
from logstore.broker.kafka.throttling import KafkaThrottling, with_throttle_time
from logstore.broker.security.principal import Principal
from logstore.errors import InvalidRequestError, SaslAuthenticationError

__all__ = ["KafkaListener"]

log = logging.getLogger("logstore.broker.kafka")

_SIZE = struct.Struct(">i")
_HEAD = struct.Struct(">hhi")  # api key, api version, correlation id: the start of every request header
_BEFORE_LOGIN = frozenset({API_VERSIONS_KEY, SASL_HANDSHAKE, SASL_AUTHENTICATE})
# The largest frame of a connection that has not logged in (Kafka's sasl.server.max.receive.size):
# nobody unauthenticated makes the broker read max_request_bytes.
MAX_UNAUTHENTICATED_BYTES = 512 * 1024
_MAX_CLIENT_ID_CHARS = 255


class _Malformed(Exception):
    """A request that closes its connection; the message is the log line's reason."""


class _LoginFailed(Exception):
    """A SASL login that failed: the connection closes (logged at DEBUG); the message says why."""


@dataclasses.dataclass
class _Connection:
    """One connection's state: its peer, its principal before any login, its SASL state."""

    peer: Any
    host: str
    principal: str
    sasl: SaslAuthenticator | None

    def context(self, client_id: str | None) -> RequestContext:
        """A request's context: the connection's principal, the header's client id (cut to
        255 characters, as the quotas cut gRPC's)."""
        name = self.sasl.principal if self.sasl is not None and self.sasl.principal is not None else self.principal
        return RequestContext(Principal(name, self.host), (client_id or "")[:_MAX_CLIENT_ID_CHARS])


@dataclasses.dataclass(frozen=True, slots=True)
class _Answer:
    """What a request gets: its bytes (None: none, acks=0), and how long to mute the connection."""

    data: bytes | None
    throttle_ms: int = 0


class KafkaListener:
    """Serves :class:`KafkaApis` on ``host:port`` (port 0: any free one); see the module docstring.
    ``security`` says how connections authenticate (default: plaintext, anonymous);
    ``throttling`` counts answers against the quotas (None: no quotas)."""

    def __init__(self, *, apis: KafkaApis, host: str, port: int, max_request_bytes: int,
                 security: ListenerSecurity | None = None, throttling: KafkaThrottling | None = None) -> None:
        self._apis = apis
        self._host = host
        self._port = port
        self._max_request_bytes = max_request_bytes
        self._security = security if security is not None else ListenerSecurity()
        self._throttling = throttling
        self._server: asyncio.Server | None = None
        self._connections: set[asyncio.Task[None]] = set()

    @property
    def port(self) -> int:
        """The bound port (the configured one until :meth:`start`)."""
        return self._port

    async def start(self) -> int:
        """Bind and accept connections; return the bound port. Raises OSError when the address is taken."""
        self._security.check_bind(self._host)
        self._server = await asyncio.start_server(self._serve, self._host, self._port, reuse_address=True,
                                                  ssl=self._security.ssl_context)
        self._port = self._server.sockets[0].getsockname()[1]
        log.info("kafka listener on %s:%d (%s)", self._host, self._port, self._security.describe())
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

    def _connection(self, writer: asyncio.StreamWriter) -> _Connection:
        """A new connection's state; raises SaslAuthenticationError for a certificate no rule maps."""
        peer = writer.get_extra_info("peername")
        host = str(peer[0]) if isinstance(peer, tuple) and peer else "*"
        security = self._security
        principal = security.connection_principal(writer.get_extra_info("peercert"))
        sasl = (None if security.sasl is None else
                SaslAuthenticator(security.sasl, host=host, connection=f"kafka:{peer}"))
        return _Connection(peer, host, principal, sasl)

    async def _serve(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        task = asyncio.current_task()
        assert task is not None
        self._connections.add(task)
        peer = writer.get_extra_info("peername")
        try:
            connection = self._connection(writer)
            while True:
                try:
                    size_bytes = await reader.readexactly(4)
                except (asyncio.IncompleteReadError, ConnectionError):
                    return  # the client closed the connection
                (size,) = _SIZE.unpack(size_bytes)
                sasl = connection.sasl
                raw = sasl is not None and sasl.raw_tokens  # a bare SASL message
                if sasl is not None and not sasl.authenticated and size > MAX_UNAUTHENTICATED_BYTES:
                    raise _Malformed(f"a request of {size} bytes before a SASL login (at most "
                                     f"{MAX_UNAUTHENTICATED_BYTES})")
                if size < (0 if raw else _HEAD.size) or size > self._max_request_bytes:
                    raise _Malformed(f"a request of {size} bytes (at most {self._max_request_bytes}, "
                                     "max_request_bytes)")
                try:
                    frame = await reader.readexactly(size)
                except (asyncio.IncompleteReadError, ConnectionError):
                    return
                if raw:
                    assert sasl is not None
                    answer = _Answer(await self._raw_token(sasl, frame))
                else:
                    answer = await self._handle(frame, connection)
                if answer.data is not None:
                    writer.write(answer.data)
                    await writer.drain()
                if connection.sasl is not None and connection.sasl.failure is not None:
                    raise _LoginFailed(connection.sasl.failure)
                if answer.throttle_ms > 0:  # KIP-219: answered, then muted for the throttle time
                    await asyncio.sleep(answer.throttle_ms / 1000)
        except _Malformed as e:
            log.warning("kafka listener: closing the connection from %s: %s", peer, e)
        except _LoginFailed as e:
            log.debug("kafka listener: closing the connection from %s: authentication failed: %s", peer, e)
        except SaslAuthenticationError as e:  # a client certificate no rule maps
            log.warning("kafka listener: closing the connection from %s: %s", peer, e.message)
        except (ConnectionError, asyncio.CancelledError, asyncio.IncompleteReadError):
            pass
        except Exception:  # a bug: logged with its traceback, never sent
            log.exception("kafka listener: unexpected error serving %s; closing its connection", peer)
        finally:
            self._connections.discard(task)
            writer.close()
            with contextlib.suppress(Exception):
                await writer.wait_closed()

    @staticmethod
    async def _raw_token(sasl: SaslAuthenticator, token: bytes) -> bytes:
        """The answer to a bare SCRAM message (after SaslHandshake v0), framed; a failed login
        closes the connection without an answer, as Kafka's broker does."""
        try:
            answer = await sasl.raw_token(token)
        except SaslAuthenticationError as e:
            raise _LoginFailed(e.message) from None
        return _SIZE.pack(len(answer)) + answer

    async def _handle(self, frame: bytes, connection: _Connection) -> _Answer:
        """The answer to one request frame (size prefix excluded) of ``connection``."""
        api_key, version, correlation_id = _HEAD.unpack_from(frame)
        supported = self._apis.versions.get(api_key)
        if supported is None:
            raise _Malformed(f"API key {api_key}, which this broker does not serve (ApiVersions lists those it does)")
        sasl = connection.sasl
        if sasl is not None and not sasl.authenticated and api_key not in _BEFORE_LOGIN:
            raise _Malformed(f"API key {api_key} " + (
                "after the connection's SASL session ended (re-authenticate before sasl_session_lifetime_ms "
                "runs out)" if sasl.expired else "before a SASL login (this listener is "
                f"{self._security.protocol}: send SaslHandshake and SaslAuthenticate first)"))
        if not supported[0] <= version <= supported[1]:
            if api_key == API_VERSIONS_KEY:  # answered in v0 so the client can pick a version we know
                return _Answer(_frame(correlation_id, self._apis.unsupported_api_versions()))
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
        context = connection.context(header.client_id)
        try:
            if api_key == SASL_HANDSHAKE and sasl is not None:
                response = sasl.handshake(request)
            elif api_key == SASL_AUTHENTICATE and sasl is not None:
                response = await sasl.authenticate(request)
            else:
                response = await self._apis.handle(request, context)
        except InvalidRequestError as e:  # over the request bounds
            raise _Malformed(e.message) from None
        data = None if response is None else _frame(correlation_id, response)
        if self._throttling is None:
            return _Answer(data)
        throttle_ms = self._throttling.throttle_ms(
            api_key, context.principal.name, context.client_id, request_bytes=len(frame) + _SIZE.size,
            response_bytes=0 if data is None else len(data))
        if throttle_ms > 0 and response is not None:
            data = _frame(correlation_id, with_throttle_time(response, throttle_ms))
        return _Answer(data, throttle_ms)


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
