"""Bounded requests: every RPC's bytes are checked before they become objects or work.

Two things happen to a request before its handler runs, both here:

* **Entry cap.** ``max_request_entries`` (broker config) bounds the entries of
  every list in a request, counted together at every depth (a Produce's or a
  Fetch's partitions, Metadata's topic names, an AlterConfigs alteration's keys,
  the partitions of a TopicPartitions...). The count is taken on the wire form,
  and stops at the cap: a request of millions of entries costs at most ``cap``
  steps, never millions of parsed objects. Requests that cannot hold more are
  not walked at all: those of at most ``cap`` bytes (the smallest entry, an int
  of a packed list, takes a byte), and those where the first bytes of the lists'
  field keys occur at most ``cap`` times (every entry of a list of messages or
  strings starts with its key; counted by ``bytes.count``, at C speed). So the
  requests clients send pay a few microseconds, not a walk.
* **Parse errors.** Bytes protobuf cannot parse end the call with gRPC
  ``INVALID_ARGUMENT`` and ``INVALID_REQUEST`` in the ``logstore-error-code``
  trailing metadata, and a message naming the RPC and the message type — never
  gRPC's ``UNKNOWN`` (which a failing deserializer gives, since it runs before
  any handler). To get there, :func:`method_handlers` registers every method
  with an identity deserializer and parses in the handler.

* **Admission.** The entry cap bounds one request, not a client: twenty requests
  at the cap sent at once by one client used to take the broker from everyone
  else. Each unary call is weighed by its list entries (the same C-speed upper
  bound; Produce and a consumer's Fetch by their partitions, once parsed). A call
  below ``light`` entries (1% of the cap, at least 2: a call of one entry always)
  is admitted at once, uncounted, so ordinary calls pay nothing. Heavier ones go through :class:`Admission`: the
  in-flight weight of one connection (gRPC peer) stays within ``per_connection``
  (one request at the cap) and the broker's within ``overall`` (four at the
  cap); a call that does not fit waits until earlier ones end. And one request
  has at most ``FANOUT`` of its partitions in progress at once
  (:func:`logstore.broker.data_plane.fanout.gather_bounded`: a Produce of 10,000 partitions used to queue 10,000
  jobs on the I/O threads ahead of everyone else's). So one client's heavy requests run one after
  another, a few jobs at a time, while other clients' requests keep being
  served. Replica fetches are never held (replication must not wait for
  clients). The server also takes at most ``MAX_CONCURRENT_RPCS`` calls at once
  (gRPC's ``maximum_concurrent_rpcs``; beyond that a call ends with
  RESOURCE_EXHAUSTED).

Each refusal is logged as a warning naming the RPC, the client and the reason
(repeated ones are rate-limited by the broker's log filter,
:class:`logstore.log_limits.RepeatedMessageFilter`).

Produce has its own parser (:func:`logstore.wire.parse_produce_request`, which
counts its partitions against the same cap while it parses).

Thread-safety: the functions are pure; the handlers run on the event loop.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import AsyncIterator, Awaitable, Callable, Mapping
from typing import Any, TypeVar

import grpc
from google.protobuf.descriptor import Descriptor, FieldDescriptor
from google.protobuf.message import DecodeError

from logstore._proto import logstore_pb2 as pb
from logstore.broker.rpc_errors import status_details
from logstore.errors import WIRE_CODE_KEY, InvalidRequestError
from logstore.wire import MalformedMessageError, encode_varint, iter_fields

__all__ = ["Admission", "admission_for", "MAX_CONCURRENT_RPCS", "count_entries", "check_request",
           "method_handlers", "note_refused", "request_weight"]

log = logging.getLogger("logstore.broker")

SERVICE = "logstore.v1.Logstore"
_FIELDS_PER_ENTRY = 16  # a walk also stops after this many fields per allowed entry
_LENGTH_DELIMITED = 2
_HIGH_BYTES = bytes(range(0x80, 0x100))
MAX_CONCURRENT_RPCS = 20_000  # calls in flight on one broker (long-polls included)
T = TypeVar("T")


class _TooMany(Exception):
    pass


def count_entries(data: bytes | memoryview, descriptor: Descriptor, cap: int) -> int:
    """The entries of the lists of message ``descriptor`` in wire form ``data``, at every depth.

    Stops counting past ``cap`` (the result is then ``cap + 1``), and after
    ``16 * cap`` fields of any kind (a flood of repeated singular fields; also
    ``cap + 1``). Raises :class:`~logstore.wire.MalformedMessageError` for bytes
    that are not a protobuf message.
    """
    budget = [cap, _FIELDS_PER_ENTRY * max(cap, 1)]
    try:
        _walk(memoryview(data), descriptor, budget)
    except _TooMany:
        return cap + 1
    return cap - budget[0]


def _walk(data: memoryview, descriptor: Descriptor, budget: list[int]) -> None:
    by_number = descriptor.fields_by_number
    for f in iter_fields(data):
        budget[1] -= 1
        if budget[1] < 0:
            raise _TooMany
        fd = by_number.get(f.number)
        if fd is None:
            continue
        if fd.is_repeated:
            if (f.wire_type == _LENGTH_DELIMITED and isinstance(f.value, memoryview)
                    and fd.type not in (FieldDescriptor.TYPE_MESSAGE, FieldDescriptor.TYPE_STRING,
                                        FieldDescriptor.TYPE_BYTES)):
                # A packed list of varints: one entry per terminating byte (high bit clear).
                budget[0] -= len(bytes(f.value).translate(None, _HIGH_BYTES))
            else:
                budget[0] -= 1
            if budget[0] < 0:
                raise _TooMany
        if (fd.type == FieldDescriptor.TYPE_MESSAGE and f.wire_type == _LENGTH_DELIMITED
                and isinstance(f.value, memoryview) and _has_lists(fd.message_type)):
            _walk(f.value, fd.message_type, budget)


_LISTS: dict[str, bool] = {}


def _has_lists(descriptor: Descriptor) -> bool:
    """Whether messages of ``descriptor`` can hold a list at any depth (memoized)."""
    known = _LISTS.get(descriptor.full_name)
    if known is None:
        _LISTS[descriptor.full_name] = False  # recursion guard
        known = any(
            fd.is_repeated
            or (fd.type == FieldDescriptor.TYPE_MESSAGE and _has_lists(fd.message_type))
            for fd in descriptor.fields
        )
        _LISTS[descriptor.full_name] = known
    return known


_KEY_BYTES: dict[str, tuple[bytes, ...] | None] = {}


def _entries_at_most(data: bytes, descriptor: Descriptor) -> int:
    """An upper bound of the list entries in ``data``, at C speed: every entry of a list
    (of messages or strings) starts with its field's key, so the occurrences of the keys'
    first bytes bound them. ``len(data)`` for messages that can hold packed lists."""
    if descriptor.full_name not in _KEY_BYTES:
        _KEY_BYTES[descriptor.full_name] = _list_key_bytes(descriptor, set())
    keys = _KEY_BYTES[descriptor.full_name]
    if keys is None:
        return len(data)
    return sum(data.count(k) for k in keys)


def _list_key_bytes(descriptor: Descriptor, seen: set[str]) -> tuple[bytes, ...] | None:
    """The first bytes of the keys of the lists reachable from ``descriptor`` (None: a packable
    list of numbers is reachable, whose entries carry no key)."""
    seen.add(descriptor.full_name)
    out: set[bytes] = set()
    for fd in descriptor.fields:
        if fd.is_repeated:
            if fd.type not in (FieldDescriptor.TYPE_MESSAGE, FieldDescriptor.TYPE_STRING, FieldDescriptor.TYPE_BYTES):
                return None
            out.add(encode_varint(fd.number << 3 | _LENGTH_DELIMITED)[:1])
        if fd.type == FieldDescriptor.TYPE_MESSAGE and fd.message_type.full_name not in seen:
            nested = _list_key_bytes(fd.message_type, seen)
            if nested is None:
                return None
            out |= set(nested)
    return tuple(sorted(out))


def request_weight(data: bytes, message: Any, light: int) -> int:
    """How heavy a request is: an upper bound of its list entries (1 when it cannot hold ``light``)."""
    if len(data) < light:
        return 1
    return max(_entries_at_most(data, message.DESCRIPTOR), 1)


class Admission:
    """In-flight weight bounded per connection and overall (see the module docstring).

    :meth:`slot` admits a call lighter than ``light`` at once; a heavier one waits until
    its weight fits both bounds (a weight above ``per_connection`` counts as
    ``per_connection``: it runs alone on its connection), and releases it when the call
    ends, however it ends. Event loop only; not locked."""

    def __init__(self, *, per_connection: int, overall: int, light: int) -> None:
        if not 1 <= per_connection <= overall:
            raise ValueError("need 1 <= per_connection <= overall")
        self.per_connection, self.overall, self.light = per_connection, overall, max(light, 1)
        self._by_connection: dict[str, int] = {}
        self._total = 0
        self._changed: asyncio.Condition | None = None
        self.waited = 0

    def in_flight(self, connection: str | None = None) -> int:
        return self._total if connection is None else self._by_connection.get(connection, 0)

    def _fits(self, connection: str, weight: int) -> bool:
        return (self._by_connection.get(connection, 0) + weight <= self.per_connection
                and self._total + weight <= self.overall)

    @contextlib.asynccontextmanager
    async def slot(self, connection: str, weight: int) -> AsyncIterator[None]:
        if weight < self.light:
            yield
            return
        weight = min(weight, self.per_connection)
        if self._changed is None:
            self._changed = asyncio.Condition()
        if not self._fits(connection, weight):
            self.waited += 1
            async with self._changed:
                await self._changed.wait_for(lambda: self._fits(connection, weight))
        self._by_connection[connection] = self._by_connection.get(connection, 0) + weight
        self._total += weight
        try:
            yield
        finally:
            left = self._by_connection[connection] - weight
            if left:
                self._by_connection[connection] = left
            else:
                del self._by_connection[connection]
            self._total -= weight
            changed = self._changed

            async def wake() -> None:
                async with changed:
                    changed.notify_all()
            with contextlib.suppress(RuntimeError):  # no running loop (a closing server)
                asyncio.get_running_loop().create_task(wake())


def admission_for(cap: int) -> Admission:
    """The broker's :class:`Admission` for entry cap ``cap`` (see the module docstring)."""
    return Admission(per_connection=cap, overall=4 * cap, light=max(cap // 100, 2))


def check_request(method: str, data: bytes, message: Any, cap: int) -> Any:
    """Parse ``data`` as a ``message`` (a generated class) for RPC ``method``, within the entry cap.

    Raises :class:`InvalidRequestError` naming the RPC when the request holds more
    than ``cap`` list entries (``max_request_entries``) or is not a ``message``.
    """
    walked = len(data) <= cap or _entries_at_most(data, message.DESCRIPTOR) <= cap
    if not walked:
        try:
            count = count_entries(data, message.DESCRIPTOR, cap)
        except MalformedMessageError:
            pass  # protobuf's parse below has the last word on what is malformed
        else:
            walked = True
            if count > cap:
                raise InvalidRequestError(
                    f"{method}: the request has more than {cap} list entries "
                    f"(max_request_entries = {cap}); split it into smaller requests"
                )
    try:
        request = message.FromString(data)
    except (DecodeError, RuntimeError, ValueError) as e:
        raise InvalidRequestError(
            f"{method}: the request is not a valid {message.DESCRIPTOR.full_name} message ({e})"
        ) from None
    if not walked:  # bytes our walk refused but protobuf accepted: count the parsed lists
        count = _count_parsed(request, cap)
        if count > cap:
            raise InvalidRequestError(
                f"{method}: the request has {count} list entries or more "
                f"(max_request_entries = {cap}); split it into smaller requests"
            )
    return request


def _count_parsed(message: Any, cap: int) -> int:
    total = 0
    for fd, value in message.ListFields():
        if fd.is_repeated:
            total += len(value)
            if fd.type == FieldDescriptor.TYPE_MESSAGE and not fd.message_type.GetOptions().map_entry:
                for item in value:
                    total += _count_parsed(item, cap)
                    if total > cap:
                        return total
        elif fd.type == FieldDescriptor.TYPE_MESSAGE:
            total += _count_parsed(value, cap)
        if total > cap:
            return total
    return total


def note_refused(method: str, context: grpc.aio.ServicerContext, exc: InvalidRequestError) -> None:
    """Log a refused request (a warning; one template, so the log's rate limit groups them)."""
    log.warning("refused a %s request from %s: %s", method, context.peer(), exc.message)


async def abort_invalid(context: grpc.aio.ServicerContext, exc: InvalidRequestError) -> None:
    """End the call with INVALID_ARGUMENT and the error's code in the trailing metadata."""
    context.set_trailing_metadata(((WIRE_CODE_KEY, exc.code),))
    await context.abort(grpc.StatusCode.INVALID_ARGUMENT, status_details(exc.message))


def method_handlers(implementations: Mapping[str, Callable[..., Awaitable[Any]]], cap: int, *,
                    skip: frozenset[str] = frozenset(), admission: Admission | None = None) -> dict[str, Any]:
    """gRPC handlers for every method of the service except ``skip``, parsing in the handler.

    Each handler takes the request's bytes (identity deserializer), parses them
    with :func:`check_request` (a failure ends the call with INVALID_ARGUMENT and
    ``INVALID_REQUEST``), then calls ``implementations[name]`` (the broker's table of
    RPC implementations), a unary one inside an :class:`Admission` slot of the
    request's weight. A client-streaming method's messages are each parsed and
    checked that way.
    """
    handlers: dict[str, Any] = {}
    for method in pb.DESCRIPTOR.services_by_name["Logstore"].methods:
        if method.name in skip:
            continue
        request_cls = getattr(pb, method.input_type.name)
        response_cls = getattr(pb, method.output_type.name)
        impl = implementations[method.name]
        if method.server_streaming:
            raise NotImplementedError(f"{method.name}: server-streaming methods are not registered here")
        if method.client_streaming:
            handlers[method.name] = grpc.stream_unary_rpc_method_handler(
                _stream_handler(method.name, request_cls, impl, cap),
                response_serializer=response_cls.SerializeToString,
            )
        else:
            handlers[method.name] = grpc.unary_unary_rpc_method_handler(
                _unary_handler(method.name, request_cls, impl, cap, admission),
                response_serializer=response_cls.SerializeToString,
            )
    return handlers


def _unary_handler(name: str, request_cls: Any, impl: Callable[..., Awaitable[Any]], cap: int,
                   admission: Admission | None) -> Callable[[bytes, grpc.aio.ServicerContext], Awaitable[Any]]:
    async def handle(data: bytes, context: grpc.aio.ServicerContext) -> Any:
        try:
            request = check_request(name, data, request_cls, cap)
        except InvalidRequestError as e:
            note_refused(name, context, e)
            await abort_invalid(context, e)
            raise AssertionError("unreachable") from None  # context.abort raises
        if admission is None:
            return await impl(request, context)
        async with admission.slot(str(context.peer()), request_weight(data, request_cls, admission.light)):
            return await impl(request, context)
    return handle


def _stream_handler(name: str, request_cls: Any, impl: Callable[..., Awaitable[Any]], cap: int
                    ) -> Callable[[Any, grpc.aio.ServicerContext], Awaitable[Any]]:
    async def handle(request_iterator: Any, context: grpc.aio.ServicerContext) -> Any:
        # The servicer's own error path (its _guard) turns an InvalidRequestError raised
        # while it iterates into INVALID_ARGUMENT with the code.
        async def parsed() -> AsyncIterator[Any]:
            async for data in request_iterator:
                try:
                    request = check_request(name, data, request_cls, cap)
                except InvalidRequestError as e:
                    note_refused(name, context, e)
                    raise
                yield request
        return await impl(parsed(), context)
    return handle
