"""The untrusted-input fuzzer of the broker's RPCs: hostile requests and what an answer must be.

Used by ``tests/chaos/test_fuzz_rpc.py`` (a short, seeded run in the suite) and
``tests/support/fuzz_driver.py`` (``make fuzz``: a long run with a report). Every RPC
of the ``logstore.v1.Logstore`` service is found by iterating the service
descriptor, and its request is drawn by :func:`request_bytes`:

* random bytes;
* a request message built from the descriptor, field by field, with hostile
  values: int32/int64 extremes and negatives (partitions, offsets, max_bytes,
  producer ids and epochs), hostile names (``../``, NUL, 10 KB, unicode,
  ``__consumer_offsets``), and for ``bytes`` fields Arrow IPC streams: valid
  batches, batches of another schema, forged producer ids/epochs/sequences,
  truncated streams and streams whose length prefixes lie;
* such a message garbled: truncated, a byte flipped, a field with a huge
  length prefix appended, or its lists repeated past ``max_request_entries``.

:func:`check_answer` is the contract: the broker answers within the deadline
(a long poll the request asked for excepted), never with gRPC's UNKNOWN, never
with a traceback, every failed call carries a ``logstore-error-code`` of the
known set, and every item error in an answer too; UNKNOWN_SERVER_ERROR (an
unexpected exception in the broker) is a finding, and so is UNIMPLEMENTED (the
broker refuses to start with an RPC of the service left without a handler).
"""

from __future__ import annotations

import contextlib
import os
import struct
import tempfile
from collections import Counter
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from typing import Any

import grpc
import pyarrow as pa
from google.protobuf import message_factory
from google.protobuf.descriptor import Descriptor, FieldDescriptor
from google.protobuf.message import DecodeError, Message
from hypothesis import strategies as st

from logstore import Admin, NewTopic, errors
from logstore._proto import logstore_pb2 as pb
from logstore.broker.embedded import EmbeddedBroker
from logstore.broker.security.credentials import FileCredentials
from logstore.broker.security.principal import SESSION_METADATA_KEY
from logstore.client.sasl import SessionLogin
from logstore.client.security import ClientSecurity
from logstore.errors import WIRE_CODE_KEY, TopicAlreadyExistsError
from logstore.record import build_batch, encode_batch, encode_schema, untyped_schema
from logstore.scram import make_credential
from logstore.types import TopicPartition
from logstore.wire import encode_produce_request, encode_varint

SERVICE = pb.DESCRIPTOR.services_by_name["Logstore"]
METHODS = [m for m in SERVICE.methods]
METHOD_NAMES = [m.name for m in METHODS]
KNOWN_CODES = frozenset(
    c.code for c in vars(errors).values() if isinstance(c, type) and issubclass(c, errors.LogstoreError)
)
TOPIC = "fuzz"  # a topic that exists, so some requests reach past the name checks
GROUP = "fuzz-group"
FORGED_TOKEN = "A" * 43  # the shape of a real session token (secrets.token_urlsafe(32))
LONG_POLL_CAP_MS = 1_500  # generated max_wait_ms above this is cut to it (the broker caps at 60 s)

INT32 = (-(2**31), -(2**31) + 1, -2, -1, 0, 1, 2, 7, 2**15, 2**31 - 2, 2**31 - 1)
INT64 = (-(2**63), -(2**63) + 1, -(2**31), -2, -1, 0, 1, 2, 2**31, 2**53 + 1, 2**63 - 2, 2**63 - 1)
UINT32 = (0, 1, 2**31, 2**32 - 1)
UINT64 = (0, 1, 2**63, 2**64 - 1)
NAMES = (
    "", ".", "..", "../", "../../x", "../../../../tmp/fuzz-escape", "a/b", "/abs", "a\\b", "..\\..\\x",
    "a\x00b", "\x00", "x" * 10_240, "t" * 249, "t" * 250, "名前-ünïcödé-🙂", "\u202e", " ", "\n", "%2e%2e",
    "__consumer_offsets", "__transaction_state", "__cluster_metadata", TOPIC, GROUP, "CON", "*", "-", "fuzz-0",
)


def ints(fd: FieldDescriptor) -> st.SearchStrategy[int]:
    t = fd.type
    if t in (FieldDescriptor.TYPE_INT64, FieldDescriptor.TYPE_SINT64, FieldDescriptor.TYPE_SFIXED64):
        extreme = INT64
        lo, hi = -(2**63), 2**63 - 1
    elif t in (FieldDescriptor.TYPE_UINT64, FieldDescriptor.TYPE_FIXED64):
        extreme, lo, hi = UINT64, 0, 2**64 - 1
    elif t in (FieldDescriptor.TYPE_UINT32, FieldDescriptor.TYPE_FIXED32):
        extreme, lo, hi = UINT32, 0, 2**32 - 1
    else:
        extreme, lo, hi = INT32, -(2**31), 2**31 - 1
    # Extremes, plausible small values (acks -1/0/1, offsets, epochs) and anything in range.
    strategy = st.one_of(st.sampled_from(extreme), st.sampled_from((-1, 0, 1)), st.integers(-3, 20),
                         st.integers(lo, hi))
    if fd.name in ("partition", "partitions"):
        strategy = st.one_of(st.sampled_from((0, 1)), strategy)  # the fuzz topic's partitions
    if fd.name == "max_wait_ms":
        strategy = strategy.map(lambda v: min(v, LONG_POLL_CAP_MS))
    return strategy


def names() -> st.SearchStrategy[str]:
    return st.one_of(st.just(TOPIC), st.just(GROUP), st.sampled_from(NAMES), st.text(max_size=12))


# --------------------------------------------------------------------------- Arrow payloads


def _stream(schema: pa.Schema, batch: pa.RecordBatch, **header: int) -> bytes:
    return encode_schema(schema) + encode_batch(batch, base_offset=0, **header).to_bytes()


def _untyped(n: int) -> tuple[pa.Schema, pa.RecordBatch]:
    schema = untyped_schema()
    return schema, build_batch(schema, values=[b"v%d" % i for i in range(n)], timestamps_ms=[1_000 + i for i in range(n)],
                               keys=[None] * n)


def _lie(data: bytes, at: int, length: int) -> bytes:
    """``data`` with the IPC message at ``at`` claiming ``length`` bytes of metadata."""
    if len(data) < at + 8:
        return data
    return data[:at + 4] + struct.pack("<i", length) + data[at + 8:]


@st.composite
def arrow_payloads(draw: Any) -> bytes:
    """Arrow IPC streams: valid, of the wrong schema, forged producer fields, truncated, lying."""
    n = draw(st.integers(1, 4))
    schema, batch = _untyped(n)
    kind = draw(st.sampled_from(["valid", "wrong_schema", "forged", "truncated", "lying", "schema_only",
                                 "two_schemas", "batch_only"]))
    if kind == "valid":
        return _stream(schema, batch)
    if kind == "wrong_schema":
        other = pa.schema([("a", pa.int32()), ("b", pa.string())])
        wrong = pa.record_batch([pa.array(list(range(n)), pa.int32()), pa.array(["x"] * n)], schema=other)
        stream = pa.BufferOutputStream()
        with pa.ipc.new_stream(stream, other) as w:
            w.write_batch(wrong)
        return bytes(stream.getvalue().to_pybytes())
    if kind == "forged":
        # Extreme ids, and small ones: the ids the broker hands out to real producers.
        return _stream(schema, batch, producer_id=draw(st.one_of(st.sampled_from(INT64), st.integers(0, 5))),
                       producer_epoch=draw(st.sampled_from((-(2**15), -1, 0, 1, 2**15 - 1))),
                       base_sequence=draw(st.sampled_from(INT32)))
    data = _stream(schema, batch)
    if kind == "truncated":
        return data[:draw(st.integers(0, len(data) - 1))]
    if kind == "lying":
        at = draw(st.sampled_from([0, len(encode_schema(schema))]))
        return _lie(data, at, draw(st.sampled_from([-(2**31), -8, -1, 0, 7, 2**20, 2**31 - 1])))
    if kind == "schema_only":
        return encode_schema(schema)
    if kind == "two_schemas":
        return encode_schema(schema) + data
    return data[len(encode_schema(schema)):]


# --------------------------------------------------------------------------- messages


def _scalar(fd: FieldDescriptor) -> st.SearchStrategy[Any]:
    if fd.type == FieldDescriptor.TYPE_STRING:
        return names()
    if fd.type == FieldDescriptor.TYPE_BYTES:
        return st.one_of(st.binary(max_size=64), arrow_payloads())
    if fd.type == FieldDescriptor.TYPE_BOOL:
        return st.booleans()
    if fd.type in (FieldDescriptor.TYPE_DOUBLE, FieldDescriptor.TYPE_FLOAT):
        return st.floats(allow_nan=True, allow_infinity=True, width=32 if fd.type == FieldDescriptor.TYPE_FLOAT else 64)
    if fd.type == FieldDescriptor.TYPE_ENUM:
        return st.one_of(st.sampled_from([v.number for v in fd.enum_type.values]), st.sampled_from(INT32))
    return ints(fd)


def messages(descriptor: Descriptor, depth: int = 0) -> st.SearchStrategy[Message]:
    """Messages of ``descriptor`` with every field optional and hostile (lists of up to 3)."""
    cls = message_factory.GetMessageClass(descriptor)
    optional: dict[str, st.SearchStrategy[Any]] = {}
    for fd in descriptor.fields:
        if fd.type == FieldDescriptor.TYPE_MESSAGE:
            if fd.message_type.GetOptions().map_entry:
                key_fd, value_fd = fd.message_type.fields_by_name["key"], fd.message_type.fields_by_name["value"]
                value = (_scalar(value_fd) if value_fd.type != FieldDescriptor.TYPE_MESSAGE
                         else messages(value_fd.message_type, depth + 1))
                optional[fd.name] = st.dictionaries(_scalar(key_fd), value, max_size=3)
                continue
            if depth >= 3:
                continue
            value = messages(fd.message_type, depth + 1)
        else:
            value = _scalar(fd)
        optional[fd.name] = st.lists(value, max_size=3) if fd.is_repeated else value
    return st.fixed_dictionaries({}, optional=optional).map(lambda kw: _build(cls, kw))


def _build(cls: Any, kwargs: dict[str, Any]) -> Message:
    msg = cls()
    for name, value in kwargs.items():
        try:
            target = getattr(msg, name)
            if isinstance(value, dict):
                for k, v in value.items():
                    if isinstance(v, Message):
                        target[k].CopyFrom(v)
                    else:
                        target[k] = v
            elif isinstance(value, list):
                if value and isinstance(value[0], Message):
                    target.extend(value)
                else:
                    target.extend(value)
            elif isinstance(value, Message):
                target.CopyFrom(value)
            else:
                setattr(msg, name, value)
        except (TypeError, ValueError):  # e.g. a float for a float32 field out of range: leave it out
            continue
    return msg


def _huge_length_field(number: int) -> bytes:
    return encode_varint(number << 3 | 2) + encode_varint(2**62) + b"xx"


def _targeted_produce(draw: Any) -> bytes:
    """A Produce to the fuzz topic's partitions (past the name checks): hostile records, acks, ids."""
    parts = draw(st.lists(st.tuples(st.sampled_from((0, 1, 2, -1)), arrow_payloads()), min_size=1, max_size=3))
    return encode_produce_request(
        [(TopicPartition(TOPIC, p), records) for p, records in parts], acks=draw(st.sampled_from((-1, 0, 1))),
        timeout_ms=draw(st.sampled_from((0, 1, 1000, 2**31 - 1, -1))),
        transactional_id=draw(st.one_of(st.just(""), names())),
    )


def _targeted_fetch(draw: Any) -> bytes:
    """A Fetch of the fuzz topic's partitions with hostile offsets, sizes and isolation."""
    offsets = st.one_of(st.sampled_from(INT64), st.integers(-3, 5))
    sizes = st.sampled_from(INT32)
    partitions = st.builds(pb.FetchPartition, topic=st.just(TOPIC), partition=st.sampled_from((0, 1, 2, -1)),
                           fetch_offset=offsets, partition_max_bytes=sizes,
                           current_leader_epoch=st.sampled_from((-1, 0, 1, 2**31 - 1)))
    request = pb.FetchRequest(
        max_wait_ms=draw(st.sampled_from((-1, 0, 1, 100, LONG_POLL_CAP_MS))), min_bytes=draw(sizes),
        max_bytes=draw(sizes), isolation_level=draw(st.sampled_from((0, 1, 7, -1))),
        partitions=draw(st.lists(partitions, min_size=1, max_size=3)),
    )
    return request.SerializeToString()


# Requests aimed at what exists (the fuzz topic), so that they reach validation and storage.
TARGETED: dict[str, Callable[[Any], bytes]] = {"Produce": _targeted_produce, "Fetch": _targeted_fetch}


@st.composite
def request_bytes(draw: Any, method: Any) -> bytes:
    """The bytes of one request of ``method`` (a MethodDescriptor): see the module docstring."""
    kinds = ["random", "message", "message", "message", "garbled", "huge_length", "flood"]
    if method.name in TARGETED:
        kinds += ["targeted"] * 4
    kind = draw(st.sampled_from(kinds))
    if kind == "targeted":
        return TARGETED[method.name](draw)
    if kind == "random":
        return draw(st.binary(max_size=256))
    msg = draw(messages(method.input_type))
    data = msg.SerializeToString()
    if kind == "message":
        return data
    if kind == "huge_length":
        numbers = [fd.number for fd in method.input_type.fields] or [1]
        return data + _huge_length_field(draw(st.sampled_from(numbers)))
    if kind == "flood":
        repeated = [fd for fd in method.input_type.fields if fd.is_repeated]
        if not repeated:
            return data
        fd = draw(st.sampled_from(repeated))
        entry = (encode_varint(fd.number << 3 | 2) + encode_varint(1) + b"a"
                 if fd.type in (FieldDescriptor.TYPE_STRING, FieldDescriptor.TYPE_BYTES, FieldDescriptor.TYPE_MESSAGE)
                 else encode_varint(fd.number << 3) + b"\x01")
        return data + entry * draw(st.sampled_from([10_001, 50_000]))
    # garbled
    if not data:
        return b"\xff"
    how = draw(st.sampled_from(["truncate", "flip", "insert"]))
    i = draw(st.integers(0, len(data) - 1))
    if how == "truncate":
        return data[:i]
    if how == "flip":
        return data[:i] + bytes([data[i] ^ draw(st.integers(1, 255))]) + data[i + 1:]
    return data[:i] + draw(st.binary(min_size=1, max_size=8)) + data[i:]


@st.composite
def calls(draw: Any, method: Any) -> list[bytes]:
    """The messages of one call: one for a unary method, 0-3 for a client-streaming one."""
    if method.client_streaming:
        return draw(st.lists(request_bytes(method), max_size=3))
    return [draw(request_bytes(method))]


# --------------------------------------------------------------------------- calling and checking


@dataclass
class Outcome:
    """What one call got: its gRPC status, the error code of the call, the item codes."""

    status: grpc.StatusCode
    code: str = ""
    item_codes: list[str] = field(default_factory=list)
    details: str = ""


class Caller:
    """Raw calls (bytes in, bytes out) to every method of one broker, with a deadline each."""

    def __init__(self, address: str, deadline_s: float = 10.0, *, security: ClientSecurity | None = None) -> None:
        """With ``security`` (SASL), every call carries a session token of that user (logged in once)."""
        self.channel = grpc.insecure_channel(address, options=[("grpc.max_receive_message_length", 256 << 20)])
        self.deadline_s = deadline_s
        self._login = SessionLogin(address, security, self.channel) if security is not None else None
        self._calls = 0
        self._unary = {m.name: self.channel.unary_unary(f"/{SERVICE.full_name}/{m.name}") for m in METHODS
                       if not m.client_streaming}
        self._stream = {m.name: self.channel.stream_unary(f"/{SERVICE.full_name}/{m.name}") for m in METHODS
                        if m.client_streaming and not m.server_streaming}
        # Bidirectional (ProduceStream): every answer of the stream is read.
        self._bidi = {m.name: self.channel.stream_stream(f"/{SERVICE.full_name}/{m.name}") for m in METHODS
                      if m.client_streaming and m.server_streaming}

    def call(self, method: Any, payload: list[bytes], *, forge: bool | None = None) -> Outcome:
        """One call; with SASL, every 8th call (or as ``forge`` says) carries a forged token."""
        metadata: tuple[tuple[str, str], ...] = ()
        self._calls += 1
        if self._login is not None:
            forged = self._calls % 8 == 0 if forge is None else forge
            token = FORGED_TOKEN if forged else self._login.token(self.deadline_s)
            metadata = ((SESSION_METADATA_KEY, token),)
        try:
            if method.client_streaming and method.server_streaming:
                responses = list(self._bidi[method.name](iter(payload), timeout=self.deadline_s, metadata=metadata))
            elif method.client_streaming:
                response, call = self._stream[method.name].with_call(iter(payload), timeout=self.deadline_s,
                                                                     metadata=metadata)
                responses = [response]
            else:
                response, call = self._unary[method.name].with_call(payload[0], timeout=self.deadline_s,
                                                                    metadata=metadata)
                responses = [response]
        except grpc.RpcError as e:
            trailing = dict(e.trailing_metadata() or ())
            return Outcome(e.code(), str(trailing.get(WIRE_CODE_KEY, "")), details=str(e.details() or ""))
        out_cls = message_factory.GetMessageClass(method.output_type)
        codes: list[str] = []
        for response in responses:
            try:
                codes += _error_codes(out_cls.FromString(response))
            except DecodeError as e:
                return Outcome(grpc.StatusCode.OK, item_codes=["<unparseable answer>"],
                               details=f"the answer does not parse as {method.output_type.name}: {e}")
        return Outcome(grpc.StatusCode.OK, item_codes=codes)

    def close(self) -> None:
        self.channel.close()


def _error_codes(msg: Message) -> Iterable[str]:
    """Every ``Error.code`` inside ``msg`` (non-empty ones)."""
    if msg.DESCRIPTOR.full_name == pb.Error.DESCRIPTOR.full_name:
        if msg.code:  # type: ignore[attr-defined]
            yield msg.code  # type: ignore[attr-defined]
        return
    for fd, value in msg.ListFields():
        if fd.type != FieldDescriptor.TYPE_MESSAGE:
            continue
        if fd.message_type.GetOptions().map_entry:
            items = [v for v in value.values() if isinstance(v, Message)]
        elif fd.is_repeated:
            items = list(value)
        else:
            items = [value]
        for item in items:
            yield from _error_codes(item)


def long_poll_asked(method: Any, payload: list[bytes], deadline_s: float) -> bool:
    """Whether the request asked to wait about as long as the deadline (a deadline then is no hang)."""
    if method.name not in ("Fetch", "ConsumerGroupHeartbeat") or method.client_streaming:
        return False
    try:
        msg = message_factory.GetMessageClass(method.input_type).FromString(payload[0])
    except DecodeError:
        return False
    return bool(getattr(msg, "max_wait_ms", 0) >= deadline_s * 1000 * 0.5)


def problems(method: Any, payload: list[bytes], out: Outcome, deadline_s: float) -> list[str]:
    """What is wrong with ``out`` as the answer to ``payload`` (empty: nothing)."""
    found = []
    if out.status == grpc.StatusCode.OK:
        for code in out.item_codes:
            if code not in KNOWN_CODES or code == "UNKNOWN_SERVER_ERROR":
                found.append(f"item error {code!r}")
        return found
    if out.status == grpc.StatusCode.DEADLINE_EXCEEDED:
        if not long_poll_asked(method, payload, deadline_s):
            found.append(f"no answer within {deadline_s} s")
        return found
    if out.status == grpc.StatusCode.UNKNOWN:
        found.append("gRPC status UNKNOWN")
    if "Traceback" in out.details or 'File "' in out.details:
        found.append("a traceback in the status details")
    if out.code not in KNOWN_CODES:
        found.append(f"status {out.status.name} without a known {WIRE_CODE_KEY} ({out.code!r})")
    elif out.code == "UNKNOWN_SERVER_ERROR":
        found.append(f"UNKNOWN_SERVER_ERROR: {out.details[:300]}")
    return found


def codes_of(out: Outcome) -> list[str]:
    return [out.code or out.status.name] if out.status != grpc.StatusCode.OK else (out.item_codes or ["OK"])


# --------------------------------------------------------------------------- the broker process


def rss_bytes(pid: int) -> int:
    with open(f"/proc/{pid}/status") as f:
        for line in f:
            if line.startswith("VmRSS:"):
                return int(line.split()[1]) * 1024
    return 0


def snapshot(roots: Iterable[str], skip: str, *, shallow: Iterable[str] = ()) -> set[str]:
    """Every path under ``roots`` except under ``skip`` (the broker's data dir), the entries of the
    ``shallow`` directories, and anything named like the fuzzer's escape attempts in the temp dir."""
    out = set()
    for root in roots:
        for dirpath, dirnames, filenames in os.walk(root):
            dirnames[:] = [d for d in dirnames if os.path.join(dirpath, d) != skip]
            out.update(os.path.join(dirpath, n) for n in dirnames + filenames)
    for root in shallow:
        out.update(os.path.join(root, n) for n in os.listdir(root))
    tmp = tempfile.gettempdir()
    out.update(os.path.join(tmp, n) for n in os.listdir(tmp) if "fuzz-escape" in n)
    return out


def ensure_topic(bootstrap: str, security: ClientSecurity | None = None) -> None:
    """(Re)create the fuzz topic: a fuzzed DeleteTopics may have deleted it, and requests aimed at
    it should reach validation and storage, not stop at UNKNOWN_TOPIC_OR_PARTITION."""
    with Admin(bootstrap, security=security) as admin, contextlib.suppress(TopicAlreadyExistsError):
        admin.create_topics([NewTopic(TOPIC, 2)])


def fuzz_broker_overrides() -> dict[str, Any]:
    """A broker that answers long operations quickly and keeps a fuzzer's creations small."""
    return {"group_heartbeat_interval_ms": 500, "group_session_timeout_ms": 3000,
            "max_partitions_per_broker": 300, "retention_check_interval_ms": 2000}


# The authenticated broker: SASL_PLAINTEXT with the authorizer on; the fuzzer logs in as a super
# user (so requests reach past authorization into every handler) and also sends forged tokens.
FUZZ_USER, FUZZ_PASSWORD = "fuzzer", "fuzz-Pa55word"
SASL = ClientSecurity(security_protocol="SASL_PLAINTEXT", sasl_mechanism="SCRAM-SHA-256",
                      sasl_plain_username=FUZZ_USER, sasl_plain_password=FUZZ_PASSWORD)


def start_fuzz_broker(data_dir: str, mode: str) -> EmbeddedBroker:
    """A child broker for the fuzzer: ``plaintext`` (no authentication) or ``sasl`` (SCRAM login,
    authorizer on, the fuzz user a super user); the fuzz topic exists."""
    overrides = fuzz_broker_overrides()
    if mode == "sasl":
        FileCredentials(data_dir).alter(FUZZ_USER, [make_credential("SCRAM-SHA-256", FUZZ_PASSWORD)], [])
        overrides.update({"security_protocol": "SASL_PLAINTEXT", "sasl_failure_delay_ms": 0,
                          "authorizer": True, "super_users": f"User:{FUZZ_USER}"})
    elif mode != "plaintext":
        raise ValueError(f"mode must be plaintext or sasl, got {mode!r}")
    broker = EmbeddedBroker(data_dir, subprocess=True, overrides=overrides).start()
    ensure_topic(broker.bootstrap, security_of(mode))
    return broker


def security_of(mode: str) -> ClientSecurity | None:
    return SASL if mode == "sasl" else None


@dataclass
class Tally:
    """Counts of a fuzz run, for the report."""

    requests: int = 0
    codes: Counter[str] = field(default_factory=Counter)
    per_method: Counter[str] = field(default_factory=Counter)
    findings: list[str] = field(default_factory=list)
    echo: bool = False  # print each finding as it is found

    def add(self, method: Any, payload: list[bytes], out: Outcome, found: list[str],
            describe: Callable[[], str] = lambda: "") -> None:
        self.requests += 1
        self.per_method[method.name] += 1
        self.codes.update(codes_of(out))
        for f in found:
            self.findings.append(f"{method.name}: {f} {describe()}")
            if self.echo:
                print("FINDING", self.findings[-1][:600], flush=True)
