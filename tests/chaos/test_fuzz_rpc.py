"""Hostile requests to every RPC of a real broker (a child process): no crash, no hang, codes.

A short, seeded run of the fuzzer of ``tests/support/fuzz_rpc_helpers.py`` (hypothesis,
``derandomize``: the same examples every run); ``make fuzz`` runs the same
generator for many thousands of requests (``tests/support/fuzz_driver.py``). Each RPC
found in the service descriptor gets its own examples; then the broker must
still serve a good produce and fetch, its RSS must have stayed bounded, and no
file may have appeared outside its data directory.

Two brokers: unauthenticated, and SASL_PLAINTEXT with the authorizer on, where the
fuzzer logs in as a super user (so requests reach every handler) and every 8th
call carries a forged session token instead (SASL_AUTHENTICATION_FAILED).
"""

from __future__ import annotations

import os
from collections.abc import Iterator
from dataclasses import dataclass

import grpc
import pytest
from fuzz_rpc_helpers import (
    GROUP,
    METHOD_NAMES,
    SERVICE,
    TOPIC,
    Caller,
    Tally,
    calls,
    ensure_topic,
    problems,
    rss_bytes,
    security_of,
    snapshot,
    start_fuzz_broker,
)
from hypothesis import HealthCheck, Phase, given, settings

from logstore import Admin, Consumer, NewTopic, Producer, TopicPartition
from logstore._proto import logstore_pb2 as pb
from logstore._proto import logstore_pb2_grpc as pb_grpc
from logstore.broker.embedded import EmbeddedBroker
from logstore.broker.rpc_errors import MAX_STATUS_DETAILS_BYTES, status_details

EXAMPLES = 15  # per RPC and broker: ~30 RPCs, 2 brokers, ~900 requests, ~25 s in all
DEADLINE_S = 5.0
RSS_GROWTH_LIMIT = 256 << 20


@dataclass
class Target:
    broker: EmbeddedBroker
    caller: Caller
    parent: str
    before: set[str]
    rss_start: int
    mode: str = "plaintext"
    rss_max: int = 0
    tally: Tally | None = None


@pytest.fixture(scope="module", params=["plaintext", "sasl"])
def target(request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Target]:
    """A child broker: unauthenticated, or SASL with the authorizer on (the fuzzer a super user)."""
    mode = request.param
    parent = str(tmp_path_factory.mktemp(f"fuzz-{mode}"))
    data_dir = os.path.join(parent, "data")
    os.mkdir(data_dir)
    before = snapshot([parent], data_dir, shallow=[os.path.dirname(parent), os.getcwd()])
    broker = start_fuzz_broker(data_dir, mode)
    try:
        with Producer(broker.bootstrap, security=security_of(mode)) as p:
            p.send(TOPIC, b"seed", partition=0).result(30)
        caller = Caller(broker.bootstrap, DEADLINE_S, security=security_of(mode))
        t = Target(broker, caller, parent, before, rss_bytes(broker.pid), mode=mode, tally=Tally())
        t.rss_max = t.rss_start
        yield t
        caller.close()
    finally:
        broker.stop()


@pytest.mark.timeout(180)
@pytest.mark.parametrize("name", METHOD_NAMES)
def test_every_rpc_answers_hostile_requests_with_a_stable_code(target: Target, name: str) -> None:
    method = SERVICE.methods_by_name[name]
    ensure_topic(target.broker.bootstrap, security_of(target.mode))  # DeleteTopics' examples may have deleted it

    @settings(max_examples=EXAMPLES, deadline=None, database=None, derandomize=True,
              phases=[Phase.explicit, Phase.generate, Phase.shrink], suppress_health_check=list(HealthCheck))
    @given(payload=calls(method))
    def one(payload: list[bytes]) -> None:
        out = target.caller.call(method, payload)
        found = problems(method, payload, out, DEADLINE_S)
        assert target.tally is not None
        target.tally.add(method, payload, out, found)
        target.rss_max = max(target.rss_max, rss_bytes(target.broker.pid))
        assert target.broker.running, f"the broker died after a {name} request"
        assert not found, f"{name}: {found} for {[p[:200] for p in payload]!r}"
    one()


@pytest.mark.timeout(60)
@pytest.mark.parametrize("name", ["x" * 10_240, "名" * 10_240])
def test_a_huge_transactional_id_is_refused_with_a_code(target: Target, name: str) -> None:
    """Regression (found by the fuzzer): a 10 KB transactional id was a file name too long
    (ENAMETOOLONG: UNKNOWN_SERVER_ERROR), and the status message quoting its path twice passed
    gRPC's 16 KiB trailer limit, so the client got RESOURCE_EXHAUSTED without a code. Since
    issue 22 transactional ids follow the group id rules (at most 249 characters): refused
    with INVALID_REQUEST, a code and a short message."""
    method = SERVICE.methods_by_name["InitProducerId"]
    request = pb.InitProducerIdRequest(transactional_id=name, transaction_timeout_ms=1000).SerializeToString()
    out = target.caller.call(method, [request], forge=False)
    assert out.status == grpc.StatusCode.INVALID_ARGUMENT and out.code == "INVALID_REQUEST", out


@pytest.mark.timeout(60)
@pytest.mark.parametrize("name", ["x" * 249, "名" * 249])
def test_the_longest_transactional_id_is_served_and_survives_a_restart(name: str) -> None:
    """The longest transactional id allowed (249 characters, 747 bytes of UTF-8) is served and
    its producer persisted across a restart."""
    request = pb.InitProducerIdRequest(transactional_id=name, transaction_timeout_ms=1000)
    with EmbeddedBroker() as broker:
        with grpc.insecure_channel(broker.bootstrap) as channel:
            first = pb_grpc.LogstoreStub(channel).InitProducerId(request, timeout=10)
        broker.stop()
        broker.start()
        with grpc.insecure_channel(broker.bootstrap) as channel:
            again = pb_grpc.LogstoreStub(channel).InitProducerId(request, timeout=10)
    assert not first.error.code and not again.error.code
    assert (again.producer_id, again.producer_epoch) == (first.producer_id, first.producer_epoch + 1)  # it was persisted


def test_status_details_are_cut_to_what_grpc_trailers_carry() -> None:
    for message in ("x" * 20_000, "名" * 20_000, "short"):
        cut = status_details(message)
        assert len(cut.encode()) <= MAX_STATUS_DETAILS_BYTES
        assert cut == message if message == "short" else cut.endswith("bytes cut)")


@pytest.mark.timeout(120)
def test_the_broker_survives_the_fuzzer(target: Target) -> None:
    """After every RPC's examples: alive and serving, RSS bounded, nothing written outside its data dir."""
    assert target.tally is not None and target.tally.requests >= len(METHOD_NAMES)
    assert target.broker.running
    security = security_of(target.mode)
    with Admin(target.broker.bootstrap, security=security) as admin:
        admin.create_topics([NewTopic("after-fuzz", 1)])
    with Producer(target.broker.bootstrap, security=security) as p:
        md = p.send("after-fuzz", b"still here").result(30)
    with Consumer(target.broker.bootstrap, auto_offset_reset="earliest", group_id=GROUP + "-after",
                  security=security) as c:
        c.assign([TopicPartition("after-fuzz", 0)])
        got = []
        for _ in range(20):
            got += [r.value for r in c.poll(timeout_ms=500)]
            if got:
                break
    assert got == [b"still here"] and md.offset == 0
    growth = target.rss_max - target.rss_start
    print(f"fuzz ({target.mode}): {target.tally.requests} requests, {len(target.tally.codes)} distinct answers "
          f"{dict(target.tally.codes.most_common(12))}; broker RSS {target.rss_start >> 20} MiB -> max "
          f"{target.rss_max >> 20} MiB")
    assert growth < RSS_GROWTH_LIMIT, f"the broker's RSS grew by {growth >> 20} MiB"
    data_dir = os.path.join(target.parent, "data")
    after = snapshot([target.parent], data_dir, shallow=[os.path.dirname(target.parent), os.getcwd()])
    new = {p for p in after - target.before if ".pytest_cache" not in p and "__pycache__" not in p
           and ".hypothesis" not in p}
    assert not new, f"files appeared outside the data dir: {sorted(new)[:10]}"
