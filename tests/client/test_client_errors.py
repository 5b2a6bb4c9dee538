"""BrokerClient without a broker: error mapping (gRPC status, trailing metadata, item
errors), construction, pickling, and a refused connection."""

from __future__ import annotations

import pickle
import socket

import grpc
import pytest

from logstore._proto import logstore_pb2 as pb
from logstore.client.error_mapping import about, error_from_item, error_from_rpc, raise_for_errors
from logstore.client.rpc import BrokerClient
from logstore.errors import (
    WIRE_CODE_KEY,
    BrokerUnavailableError,
    InvalidConfigError,
    InvalidRequestError,
    LogstoreError,
    OffsetOutOfRangeError,
    RecordTooLargeError,
    RequestTimedOutError,
    SchemaMismatchError,
    TopicAlreadyExistsError,
    UnknownServerError,
    UnknownTopicOrPartitionError,
)


class FakeRpcError(grpc.RpcError, grpc.Call):  # type: ignore[misc]
    """What grpc raises for a failed call: an RpcError that is also a Call."""

    def __init__(self, code: grpc.StatusCode, details: str = "", metadata: tuple = ()) -> None:
        self._code = code
        self._details = details
        self._metadata = metadata

    def code(self) -> grpc.StatusCode:
        return self._code

    def details(self) -> str:
        return self._details

    def trailing_metadata(self) -> tuple:
        return self._metadata

    def initial_metadata(self) -> tuple:
        return ()

    def is_active(self) -> bool:
        return False

    def time_remaining(self) -> None:
        return None

    def cancel(self) -> bool:
        return False

    def add_callback(self, callback: object) -> bool:
        return False


@pytest.mark.parametrize(
    ("status", "expected"),
    [
        (grpc.StatusCode.UNAVAILABLE, BrokerUnavailableError),
        (grpc.StatusCode.DEADLINE_EXCEEDED, RequestTimedOutError),
        (grpc.StatusCode.INVALID_ARGUMENT, InvalidRequestError),
        (grpc.StatusCode.RESOURCE_EXHAUSTED, RecordTooLargeError),
        (grpc.StatusCode.INTERNAL, UnknownServerError),
        (grpc.StatusCode.UNKNOWN, UnknownServerError),
        (grpc.StatusCode.CANCELLED, UnknownServerError),
    ],
)
def test_grpc_status_maps_to_error_class(status: grpc.StatusCode, expected: type[LogstoreError]) -> None:
    err = error_from_rpc(FakeRpcError(status, "boom"), rpc="Fetch", target="h:1")
    assert type(err) is expected
    assert err.code == expected.code
    assert "h:1" in err.message and "boom" in err.message


def test_wire_code_in_trailing_metadata_wins_over_status() -> None:
    exc = FakeRpcError(
        grpc.StatusCode.INVALID_ARGUMENT, "topic exists",
        ((WIRE_CODE_KEY, "TOPIC_ALREADY_EXISTS"),),
    )
    err = error_from_rpc(exc, rpc="CreateTopics", target="h:1")
    assert isinstance(err, TopicAlreadyExistsError)
    assert err.message == "topic exists"


def test_unknown_wire_code_becomes_unknown_server_error() -> None:
    exc = FakeRpcError(grpc.StatusCode.INTERNAL, "odd", ((WIRE_CODE_KEY, "SOMETHING_NEW"),))
    err = error_from_rpc(exc, rpc="Produce", target="h:1")
    assert isinstance(err, UnknownServerError)
    assert "SOMETHING_NEW" in err.message


def test_retriable_flags_survive_mapping() -> None:
    assert error_from_rpc(FakeRpcError(grpc.StatusCode.UNAVAILABLE), rpc="x", target="t").retriable
    assert not error_from_rpc(FakeRpcError(grpc.StatusCode.INTERNAL), rpc="x", target="t").retriable


def test_item_errors() -> None:
    assert error_from_item(pb.Error()) is None
    assert error_from_item(None) is None
    err = error_from_item(pb.Error(code="OFFSET_OUT_OF_RANGE", message="offset 9 > LEO 3"))
    assert isinstance(err, OffsetOutOfRangeError)
    assert err.message == "offset 9 > LEO 3"
    assert isinstance(error_from_item(pb.Error(code="SCHEMA_MISMATCH", message="x")), SchemaMismatchError)
    assert isinstance(error_from_item(pb.Error(code="UNKNOWN_TOPIC_OR_PARTITION")), UnknownTopicOrPartitionError)


def test_raise_for_errors_raises_the_first_with_the_item_named() -> None:
    raise_for_errors([("a", None), ("b", None)])
    with pytest.raises(InvalidConfigError) as info:
        raise_for_errors([("a", None), ("topic 'b'", InvalidConfigError("bad retention.ms")),
                          ("c", TopicAlreadyExistsError("x"))])
    assert info.value.message == "topic 'b': bad retention.ms"
    assert about(TopicAlreadyExistsError("exists"), "t").code == "TOPIC_ALREADY_EXISTS"


def test_client_pickles_as_its_bootstrap() -> None:
    client = BrokerClient("127.0.0.1:1234", request_timeout_ms=1234)
    clone = pickle.loads(pickle.dumps(client))
    try:
        assert isinstance(clone, BrokerClient)
        assert clone is not client
        assert clone.bootstrap == "127.0.0.1:1234"
        assert clone.request_timeout_ms == 1234
        assert BrokerClient.from_bootstrap("h:9").bootstrap == "h:9"
    finally:
        client.close()
        clone.close()


def test_an_unpickled_client_builds_its_own_transport_and_parts() -> None:
    client = BrokerClient("127.0.0.1:1234", request_timeout_ms=1234)
    clone = pickle.loads(pickle.dumps(client))
    try:
        assert clone.transport is not client.transport
        client.close()
        assert client.closed and not clone.closed
        # Each part calls through its own client's transport: closed here, open in the clone.
        for call in (client.groups.list_groups, client.cleaning.describe_cleaning,
                     client.scram.describe_user_scram_credentials):
            with pytest.raises(RuntimeError, match="is closed"):
                call()
    finally:
        client.close()
        clone.close()


def test_default_bootstrap_comes_from_the_environment(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("LOGSTORE_BOOTSTRAP", "example:4321")
    with BrokerClient() as client:
        assert client.bootstrap == "example:4321"


def test_bad_construction() -> None:
    with pytest.raises(ValueError, match="host:port"):
        BrokerClient("nohost")
    with pytest.raises(ValueError, match="request_timeout_ms"):
        BrokerClient("h:1", request_timeout_ms=0)


def test_closed_client_refuses_calls() -> None:
    client = BrokerClient("127.0.0.1:1")
    client.close()
    client.close()  # idempotent
    assert client.closed
    with pytest.raises(RuntimeError, match="closed"):
        client.metadata()


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


@pytest.mark.timeout(30)
def test_nothing_listening_is_broker_unavailable() -> None:
    with BrokerClient(f"127.0.0.1:{_free_port()}", request_timeout_ms=5_000) as client:
        with pytest.raises(BrokerUnavailableError) as info:
            client.metadata()
        assert info.value.retriable
        assert "unavailable" in info.value.message
        future = client.produce_async([], acks=-1)
        with pytest.raises(BrokerUnavailableError):
            future.result(timeout=20)


@pytest.mark.parametrize("acks", [-1, 0, 1])
@pytest.mark.parametrize("timeout_ms", [0, 1, 30_000, 2**31 - 1])
def test_hand_built_produce_request_matches_protobuf(acks: int, timeout_ms: int) -> None:
    from logstore.types import TopicPartition
    from logstore.wire import encode_produce_request

    items = [
        (TopicPartition("t", 0), b"abc"),
        (TopicPartition("topic.with-ütf8", 7), [b"x" * 300, memoryview(b"yz")]),
        (TopicPartition("empty", 2**31 - 1), b""),
        (TopicPartition("big", 1), [b"\x00" * 70_000]),
    ]
    for txn in ("", "txn-1"):
        expected = pb.ProduceRequest(
            acks=acks, timeout_ms=timeout_ms, transactional_id=txn,
            partitions=[
                pb.ProducePartition(
                    topic=tp.topic, partition=tp.partition,
                    records=r if isinstance(r, bytes) else b"".join(bytes(p) for p in r),
                )
                for tp, r in items
            ],
        )
        got = encode_produce_request(items, acks=acks, timeout_ms=timeout_ms, transactional_id=txn)
        assert got == expected.SerializeToString()
        assert pb.ProduceRequest.FromString(got) == expected


def test_per_item_answers_unwrap_to_values_or_the_first_items_error() -> None:
    """One rule for every per-item answer the admin, consumer and Spark source unwrap."""
    from logstore.client.error_mapping import unwrap_items
    from logstore.errors import UnknownServerError, UnknownTopicOrPartitionError

    found = {"a": 1, "b": UnknownTopicOrPartitionError("no such topic"), "c": 3}
    assert unwrap_items(["c", "a"], found, what="configs") == {"c": 3, "a": 1}
    with pytest.raises(UnknownTopicOrPartitionError, match=r"topic 'b': no such topic$"):
        unwrap_items(["a", "b", "c"], found, what="configs", label=lambda name: f"topic {name!r}")
    with pytest.raises(UnknownServerError, match="the broker's answer has no configs for d"):
        unwrap_items(["a", "d"], found, what="configs")
