"""Clients send the transaction RPCs to the coordinator FindCoordinator names.

A small stand-in bootstrap server (a plain gRPC servicer of this test, answering
FindCoordinator with a real embedded broker's address, everything else with
NOT_COORDINATOR) shows that the client finds the coordinator, caches it per
coordinator key, and finds it again when the coordinator goes away. A single
broker answers that it coordinates itself (``local``): the calls go to the address
the client reached it by.
"""

from __future__ import annotations

import threading
from collections.abc import Iterator
from concurrent import futures
from pathlib import Path

import grpc
import pytest

from logstore._proto import logstore_pb2 as pb
from logstore._proto import logstore_pb2_grpc as pb_grpc
from logstore.broker.embedded import EmbeddedBroker
from logstore.client.rpc import BrokerClient
from logstore.errors import InvalidTxnStateError, NotCoordinatorError
from logstore.naming import coordinator_key
from logstore.types import TxnRef

pytestmark = pytest.mark.timeout(60)


class Bootstrap(pb_grpc.LogstoreServicer):
    """Knows where the coordinator is, coordinates nothing itself."""

    def __init__(self, coordinator: str) -> None:
        self.coordinator = coordinator
        self.lookups: list[list[str]] = []
        self.lock = threading.Lock()

    def FindCoordinator(self, request, context):  # type: ignore[no-untyped-def]
        with self.lock:
            self.lookups.append(list(request.keys))
            host, _, port = self.coordinator.rpartition(":")
        assert request.key_type == pb.TRANSACTION
        return pb.FindCoordinatorResponse(coordinators=[
            pb.Coordinator(key=k, node_id=1, host=host, port=int(port)) for k in request.keys])

    def InitProducerId(self, request, context):  # type: ignore[no-untyped-def]
        return pb.InitProducerIdResponse(error=pb.Error(code="NOT_COORDINATOR", message="ask the other one"))


@pytest.fixture(scope="module")
def broker(tmp_path_factory: pytest.TempPathFactory) -> Iterator[EmbeddedBroker]:
    with EmbeddedBroker(str(tmp_path_factory.mktemp("coord"))) as b:
        yield b


@pytest.fixture()
def bootstrap(broker: EmbeddedBroker) -> Iterator[tuple[Bootstrap, str]]:
    servicer = Bootstrap(broker.bootstrap)
    server = grpc.server(futures.ThreadPoolExecutor(max_workers=4))
    pb_grpc.add_LogstoreServicer_to_server(servicer, server)
    port = server.add_insecure_port("127.0.0.1:0")
    server.start()
    yield servicer, f"127.0.0.1:{port}"
    server.stop(0)


def test_txn_rpcs_go_to_the_coordinator_found_and_cached(bootstrap: tuple[Bootstrap, str]) -> None:
    servicer, address = bootstrap
    with BrokerClient(address) as client:
        pid, epoch = client.init_producer_id("sink-x/4/0.0", transaction_timeout_ms=60_000)
        pid2, epoch2 = client.init_producer_id("sink-x/4/0.0", transaction_timeout_ms=60_000)
        assert (pid2, epoch2) == (pid, epoch + 1)
        assert client.last_committed_batch("sink-x") == -1
        client.end_txn_group("sink-x", 4, [], abort_prefix="sink-x/4/", commit=False)
        ref = TxnRef("sink-x/4/0.0", pid, epoch2, 0)
        with pytest.raises(InvalidTxnStateError):  # the coordinator's answer: no such transaction open
            client.end_txn(ref, commit=True)
    assert servicer.lookups == [["sink-x"]], "one lookup for the sink's coordinator key, then the cache"


def test_the_coordinator_is_found_again_when_it_moves(bootstrap: tuple[Bootstrap, str], tmp_path: Path) -> None:
    servicer, address = bootstrap
    with BrokerClient(address, request_timeout_ms=3_000) as client:
        client.init_producer_id("moving", transaction_timeout_ms=60_000)
        with EmbeddedBroker(str(tmp_path)) as other:
            servicer.coordinator = other.bootstrap  # the coordinator "moves"
            servicer.lookups.clear()
            # The cached one still answers (it is a whole broker): make it refuse by pointing
            # the cache at the bootstrap stand-in, which answers NOT_COORDINATOR.
            client.transport.coordinators._known[(pb.TRANSACTION, "moving")] = address
            pid, epoch = client.init_producer_id("moving", transaction_timeout_ms=60_000)
            assert epoch == 0, "a new coordinator with its own state answered"
            assert servicer.lookups == [["moving"]]


def test_not_coordinator_until_the_deadline_is_raised(broker: EmbeddedBroker) -> None:
    servicer = Bootstrap("127.0.0.1:1")  # points nowhere useful: itself below
    server = grpc.server(futures.ThreadPoolExecutor(max_workers=2))
    pb_grpc.add_LogstoreServicer_to_server(servicer, server)
    port = server.add_insecure_port("127.0.0.1:0")
    server.start()
    try:
        servicer.coordinator = f"127.0.0.1:{port}"  # the coordinator named is the one refusing
        with BrokerClient(f"127.0.0.1:{port}", request_timeout_ms=800) as client, \
                pytest.raises(NotCoordinatorError):
            client.init_producer_id("lost", transaction_timeout_ms=60_000)
        assert len(servicer.lookups) >= 2, "it looked the coordinator up again after NOT_COORDINATOR"
    finally:
        server.stop(0)


def test_a_single_broker_coordinates_itself(broker: EmbeddedBroker) -> None:
    with BrokerClient(broker.bootstrap) as client:
        pid, epoch = client.init_producer_id("plain-broker", transaction_timeout_ms=60_000)
        assert client.init_producer_id("plain-broker", transaction_timeout_ms=60_000) == (pid, epoch + 1)
        assert client.transport.coordinators._known == {(pb.TRANSACTION, "plain-broker"): None}  # None: home
    with grpc.insecure_channel(broker.bootstrap) as ch:
        answer = pb_grpc.LogstoreStub(ch).FindCoordinator(pb.FindCoordinatorRequest(key_type=pb.TRANSACTION,
                                                                                      keys=["x"]))
    assert [(c.key, c.local, c.error.code) for c in answer.coordinators] == [("x", True, "")]


def test_coordinator_key() -> None:
    assert coordinator_key("a/b/c") == "a" and coordinator_key("abc") == "abc" and coordinator_key("/x") == ""
