"""A fuzz pass of the Kafka listener: requests that parse but say anything, and bytes that do not.

Structure-aware: hypothesis builds requests of every served API and version from kio's own
message types (any field value its type allows: negative partitions, huge counts, odd
strings, random record bytes), sends each on a connection to a real broker, then an
ApiVersions request on the same connection. The listener must answer both (in order, with
their correlation ids) or close the connection for a request it refuses; it must never hit
an unexpected error (logged with a traceback) and must keep serving new connections.
Plus mutated frames: valid requests with bytes flipped, cut or extended.

JoinGroup and SyncGroup are left out (they wait for the rest of a group by design), and a
fuzzed Fetch waits at most 50 ms.
"""

from __future__ import annotations

import dataclasses
import datetime
import io
import logging
import socket
import struct
from collections.abc import Iterator
from typing import Any

import pytest

pytest.importorskip("kio", reason="the Kafka listener needs kio (Python 3.11+)")

from hypothesis import HealthCheck, given, settings  # noqa: E402
from hypothesis import strategies as st  # noqa: E402
from kio.index import load_request_schema, load_response_schema  # noqa: E402
from kio.serial import entity_reader, entity_writer  # noqa: E402
from kio.static.primitive import Records  # noqa: E402

from logstore.broker.embedded import EmbeddedBroker  # noqa: E402
from logstore.broker.kafka import SUPPORTED  # noqa: E402

pytestmark = pytest.mark.timeout(300)
# A produce's records: arbitrary bytes (the record batch codec has its own tests and fuzz).
st.register_type_strategy(Records, st.binary(max_size=300).map(Records))
WAITS_FOR_THE_GROUP = {11, 14}  # JoinGroup, SyncGroup
FUZZED = sorted((k, v) for k, (low, high) in SUPPORTED.items() if k not in WAITS_FOR_THE_GROUP
                for v in range(low, high + 1))


@pytest.fixture(scope="module")
def broker() -> Iterator[EmbeddedBroker]:
    with EmbeddedBroker(kafka_listener="127.0.0.1:0") as b:
        yield b


def _frame(request: Any, correlation_id: int) -> bytes:
    header_type: Any = type(request).__header_schema__
    buffer = io.BytesIO()
    entity_writer(header_type)(buffer, header_type(request_api_key=request.__api_key__,
                                                   request_api_version=request.__version__,
                                                   correlation_id=correlation_id, client_id="fuzz"))
    entity_writer(type(request))(buffer, request)
    return struct.pack(">i", buffer.tell()) + buffer.getvalue()


def _read_frame(sock: socket.socket) -> bytes | None:
    """One answer frame, or None when the listener closed the connection."""
    head = sock.recv(4, socket.MSG_WAITALL)
    if len(head) < 4:
        return None
    (size,) = struct.unpack(">i", head)
    body = sock.recv(size, socket.MSG_WAITALL)
    return body if len(body) == size else None


_API_VERSIONS = load_request_schema(18, 3)(client_software_name="fuzz", client_software_version="1")


def _exchange(broker: EmbeddedBroker, payload: bytes, fuzz_id: int | None) -> None:
    """Send ``payload`` then ApiVersions; check what comes back (see the module docstring)."""
    with socket.create_connection(("127.0.0.1", broker.kafka_port), timeout=20) as sock:
        sock.sendall(payload + _frame(_API_VERSIONS, 999_999))
        answers = []
        while (frame := _read_frame(sock)) is not None:
            (correlation_id,) = struct.unpack_from(">i", frame)
            answers.append(correlation_id)
            if correlation_id == 999_999:
                response, _ = entity_reader(load_response_schema(18, 3))(frame, 4)
                assert response.error_code == 0
                break
        if answers and answers[-1] == 999_999:
            assert answers[:-1] in ([], [fuzz_id]), answers  # in order; nothing else
        else:
            assert answers in ([], [fuzz_id]), answers  # refused: closed, at most after its answer


def _check_log(caplog: pytest.LogCaptureFixture) -> None:
    bad = [r for r in caplog.records if r.name.startswith("logstore") and r.levelno >= logging.ERROR]
    assert not bad, "\n".join(f"{r.name}: {r.getMessage()}\n{r.exc_text or ''}" for r in bad)


def _tame(request: Any) -> Any:
    """A fuzzed Fetch waits at most 50 ms (the connection's next request waits behind it)."""
    if request.__api_key__ == 1:
        return dataclasses.replace(request, max_wait=datetime.timedelta(milliseconds=min(
            50, max(0, int(request.max_wait.total_seconds() * 1000)))))
    return request


def _fuzzed_request(caplog: pytest.LogCaptureFixture, data: st.DataObject) -> Any:
    """A request of a served API and version, any field any value (and a clean log to check)."""
    caplog.set_level(logging.WARNING)
    caplog.clear()  # the fixture lives across hypothesis's examples
    api_key, version = data.draw(st.sampled_from(FUZZED), label="api")
    return _tame(data.draw(st.from_type(load_request_schema(api_key, version)), label="request"))


_FUZZ_HEALTH = [HealthCheck.function_scoped_fixture, HealthCheck.too_slow, HealthCheck.data_too_large]


@settings(max_examples=300, deadline=None, suppress_health_check=_FUZZ_HEALTH)
@given(data=st.data())
def test_fuzzed_requests_of_every_api_are_answered_or_refused_cleanly(
        broker: EmbeddedBroker, caplog: pytest.LogCaptureFixture, data: st.DataObject) -> None:
    request = _fuzzed_request(caplog, data)
    _exchange(broker, _frame(request, 7), 7)
    _check_log(caplog)


@settings(max_examples=200, deadline=None, suppress_health_check=_FUZZ_HEALTH)
@given(data=st.data())
def test_mutated_frames_are_answered_or_refused_cleanly(
        broker: EmbeddedBroker, caplog: pytest.LogCaptureFixture, data: st.DataObject) -> None:
    frame = bytearray(_frame(_fuzzed_request(caplog, data), 7))
    body = frame[4:]
    how = data.draw(st.sampled_from(["flip", "cut", "extend"]), label="mutation")
    if how == "flip" and body:
        for _ in range(data.draw(st.integers(1, 8))):
            body[data.draw(st.integers(0, len(body) - 1))] ^= data.draw(st.integers(1, 255))
    elif how == "cut":
        body = body[:data.draw(st.integers(0, len(body)))]
    else:
        body += data.draw(st.binary(min_size=1, max_size=64))
    payload = struct.pack(">i", len(body)) + bytes(body)
    # a flipped header may name another correlation id or API: then no id is expected
    (fuzz_id,) = struct.unpack_from(">i", body, 4) if len(body) >= 8 else (None,)
    try:
        _exchange(broker, payload, fuzz_id)
    except AssertionError:
        if how == "flip":  # the size prefix is right, the header may now say anything: any one answer
            pass
        else:
            raise
    _check_log(caplog)
    with socket.create_connection(("127.0.0.1", broker.kafka_port), timeout=20) as sock:  # still serving
        sock.sendall(_frame(_API_VERSIONS, 1))
        assert _read_frame(sock) is not None
