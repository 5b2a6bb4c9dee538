"""The SCRAM credential calls, ``BrokerClient.scram`` (``AlterUserScramCredentials``,
``DescribeUserScramCredentials``): a part of :class:`~logstore.client.rpc.BrokerClient`
of its own, so ``rpc.py`` stays one concept per module; sent through the
:class:`~logstore.client.transport.Transport` it is given.

Errors are mapped as every call's (:mod:`logstore.client.error_mapping`); per-user
outcomes come back next to the user names.

Thread-safety: as :class:`~logstore.client.rpc.BrokerClient`.
"""

from __future__ import annotations

from collections.abc import Sequence

from logstore._proto import logstore_pb2 as pb
from logstore.client.credentials import (
    ScramCredentialInfo,
    UserScramCredentialDeletion,
    UserScramCredentialsDescription,
    UserScramCredentialUpsertion,
)
from logstore.client.error_mapping import error_from_item, raise_for_item
from logstore.client.transport import Transport
from logstore.errors import LogstoreError

__all__ = ["ScramRpcs"]


class ScramRpcs:
    """Alter and describe users' SCRAM credentials, sent through ``transport``."""

    def __init__(self, transport: Transport) -> None:
        self._transport = transport

    def alter_user_scram_credentials(
        self, upsertions: Sequence[UserScramCredentialUpsertion] = (),
        deletions: Sequence[UserScramCredentialDeletion] = (), *, timeout_ms: int | None = None,
    ) -> dict[str, LogstoreError | None]:
        """Apply the changes (passwords salted here, never sent); return each user's error (None = done)."""
        request = pb.AlterUserScramCredentialsRequest(
            deletions=[pb.ScramCredentialDeletion(user=d.user, mechanism=d.mechanism) for d in deletions])
        for u in upsertions:
            salt, salted = u.salted()
            request.upsertions.add(user=u.user, mechanism=u.mechanism, iterations=u.iterations,
                                   salt=salt, salted_password=salted)
        response = self._transport.call("AlterUserScramCredentials", request,
                                        timeout_s=self._transport.deadline_s(timeout_ms))
        return {r.user: error_from_item(r.error) for r in response.results}

    def describe_user_scram_credentials(
        self, users: Sequence[str] | None = None, *, timeout_ms: int | None = None,
    ) -> dict[str, UserScramCredentialsDescription | LogstoreError]:
        """Each named user's mechanisms (None or empty: every user), or its error (RESOURCE_NOT_FOUND)."""
        response = self._transport.call("DescribeUserScramCredentials",
                                        pb.DescribeUserScramCredentialsRequest(users=list(users or ())),
                                        timeout_s=self._transport.deadline_s(timeout_ms))
        raise_for_item(response.error)
        return {
            r.user: error_from_item(r.error) or UserScramCredentialsDescription(
                r.user, tuple(ScramCredentialInfo(c.mechanism, c.iterations) for c in r.credentials))
            for r in response.results
        }
