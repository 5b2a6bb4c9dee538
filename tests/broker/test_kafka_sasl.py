"""The Kafka listener's SASL state per connection (logstore.broker.kafka.sasl), without a network.

A :class:`SaslAuthenticator` driven with kio's SaslHandshake and SaslAuthenticate requests and
a client's SCRAM messages (:class:`logstore.scram.ScramClient`), against the broker's real SCRAM
server over an in-memory credential store, on a hand-moved clock: the order of the steps, the
mechanisms offered, the session's end and re-authentication as the same principal only, and
SaslHandshake v0's bare messages. tests/broker/test_kafka_security.py runs the same over sockets
with real clients.
"""

from __future__ import annotations

import asyncio
import datetime
from collections.abc import Mapping
from typing import Any

import pytest

pytest.importorskip("kio", reason="the Kafka listener needs kio (Python 3.11+)")

from kio.index import load_request_schema  # noqa: E402
from storage_helpers import ManualClock  # noqa: E402

from logstore.broker.config import BrokerConfig  # noqa: E402
from logstore.broker.kafka.sasl import SaslAuthenticator, SaslSettings  # noqa: E402
from logstore.broker.security.scram_exchange import ScramExchanges  # noqa: E402
from logstore.errors import LogstoreError, SaslAuthenticationError  # noqa: E402
from logstore.scram import ScramClient, ScramCredential, make_credential  # noqa: E402

MECHANISMS = ("SCRAM-SHA-256", "SCRAM-SHA-512")
LIFETIME_MS = 10_000
SASL_FAILED, ILLEGAL_SASL_STATE, UNSUPPORTED_MECHANISM = 58, 34, 33


class MemoryCredentials:
    """A :class:`~logstore.broker.security.credentials.CredentialStore` in a dict (reads only)."""

    def __init__(self, users: Mapping[str, str]) -> None:
        self._users = {u: {m: make_credential(m, pw) for m in MECHANISMS} for u, pw in users.items()}

    async def get(self, user: str) -> dict[str, ScramCredential]:
        return dict(self._users.get(user, {}))

    async def alter(self, user: str, upserts: list[ScramCredential], deletions: list[str]) -> Any:
        raise NotImplementedError

    async def alter_many(self, changes: Mapping[str, Any]) -> Any:
        raise NotImplementedError

    async def users(self) -> dict[str, dict[str, ScramCredential]]:
        return {u: dict(c) for u, c in self._users.items()}


def _authenticator(clock: ManualClock) -> SaslAuthenticator:
    store = MemoryCredentials({"alice": "alice-pw", "bob": "bob-pw"})
    exchanges = ScramExchanges(config=BrokerConfig(sasl_failure_delay_ms=0), credentials=lambda: store)
    return SaslAuthenticator(SaslSettings(exchanges, MECHANISMS, LIFETIME_MS), host="10.0.0.1",
                             connection="kafka:test", clock=clock)


def _handshake(mechanism: str, version: int = 1) -> Any:
    return load_request_schema(17, version)(mechanism=mechanism)


def _authenticate(data: bytes, version: int = 2) -> Any:
    return load_request_schema(36, version)(auth_bytes=data)


def _login(sasl: SaslAuthenticator, user: str, password: str, mechanism: str = "SCRAM-SHA-512") -> Any:
    """Handshake v1, then the two SCRAM steps; the final answer (or the first refusal)."""
    async def run() -> Any:
        assert sasl.handshake(_handshake(mechanism)).error_code == 0
        client = ScramClient(mechanism, user, password)
        first = await sasl.authenticate(_authenticate(client.first().encode()))
        if first.error_code != 0:
            return first
        final = await sasl.authenticate(_authenticate(client.final(first.auth_bytes.decode()).encode()))
        if final.error_code == 0:
            client.verify(final.auth_bytes.decode())
        return final
    return asyncio.run(run())


def test_a_login_gives_the_principal_and_the_session_lifetime(clock: ManualClock) -> None:
    sasl = _authenticator(clock)
    assert not sasl.authenticated and sasl.principal is None
    final = _login(sasl, "alice", "alice-pw")
    assert final.error_code == 0 and final.session_lifetime == datetime.timedelta(milliseconds=LIFETIME_MS)
    assert sasl.authenticated and sasl.principal == "User:alice" and sasl.failure is None
    clock.advance(LIFETIME_MS - 1)
    assert sasl.authenticated
    clock.advance(1)
    assert not sasl.authenticated and sasl.expired  # the listener now closes on anything but a new login


def test_re_authentication_renews_the_session_as_the_same_principal_only(clock: ManualClock) -> None:
    sasl = _authenticator(clock)
    assert _login(sasl, "alice", "alice-pw").error_code == 0
    clock.advance(LIFETIME_MS - 1_000)
    assert _login(sasl, "alice", "alice-pw", "SCRAM-SHA-256").error_code == 0
    clock.advance(2_000)  # past the first session's end
    assert sasl.authenticated and sasl.principal == "User:alice"
    refused = _login(sasl, "bob", "bob-pw")
    assert refused.error_code == SASL_FAILED and "keeps its principal" in refused.error_message
    assert sasl.failure is not None


def test_a_wrong_password_and_an_unknown_user_fail_alike(clock: ManualClock) -> None:
    answers = []
    for user, password in (("alice", "wrong"), ("nobody", "alice-pw")):
        sasl = _authenticator(clock)
        answer = _login(sasl, user, password)
        assert answer.error_code == SASL_FAILED and sasl.failure is not None and sasl.principal is None
        answers.append(answer.error_message)
    assert answers[0] == answers[1]


@pytest.mark.parametrize("steps, code", [
    (["authenticate"], ILLEGAL_SASL_STATE),  # no handshake first
    (["handshake", "handshake"], ILLEGAL_SASL_STATE),  # a second handshake mid-login
])
def test_steps_out_of_order_fail_the_connection(clock: ManualClock, steps: list[str], code: int) -> None:
    sasl = _authenticator(clock)

    async def run() -> Any:
        answer = None
        for step in steps:
            answer = (sasl.handshake(_handshake("SCRAM-SHA-256")) if step == "handshake"
                      else await sasl.authenticate(_authenticate(b"n,,n=alice,r=abcdefghijklmnop")))
        return answer
    assert asyncio.run(run()).error_code == code and sasl.failure is not None


def test_a_mechanism_not_enabled_is_refused_with_the_list(clock: ManualClock) -> None:
    sasl = _authenticator(clock)
    answer = sasl.handshake(_handshake("PLAIN"))
    assert answer.error_code == UNSUPPORTED_MECHANISM and answer.mechanisms == MECHANISMS
    assert sasl.failure is not None


def test_handshake_v0_takes_bare_scram_messages(clock: ManualClock) -> None:
    sasl = _authenticator(clock)
    assert sasl.handshake(_handshake("SCRAM-SHA-256", version=0)).error_code == 0 and sasl.raw_tokens

    async def run() -> None:
        client = ScramClient("SCRAM-SHA-256", "alice", "alice-pw")
        server_first = await sasl.raw_token(client.first().encode())
        client.verify((await sasl.raw_token(client.final(server_first.decode()).encode())).decode())
    asyncio.run(run())
    assert sasl.authenticated and not sasl.raw_tokens  # Kafka requests from now on
    bad = _authenticator(clock)
    bad.handshake(_handshake("SCRAM-SHA-256", version=0))

    async def wrong() -> None:
        client = ScramClient("SCRAM-SHA-256", "alice", "wrong")
        server_first = await bad.raw_token(client.first().encode())
        await bad.raw_token(client.final(server_first.decode()).encode())
    with pytest.raises(SaslAuthenticationError):
        asyncio.run(wrong())
    assert bad.failure is not None and not bad.authenticated


def test_the_scram_server_refuses_a_mechanism_not_enabled() -> None:
    exchanges = ScramExchanges(config=BrokerConfig(sasl_enabled_mechanisms="SCRAM-SHA-512"),
                               credentials=lambda: MemoryCredentials({}))
    with pytest.raises(LogstoreError, match="not enabled on this broker; it offers SCRAM-SHA-512"):
        exchanges.check_enabled("SCRAM-SHA-256")
