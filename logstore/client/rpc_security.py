"""The security RPCs of :class:`~logstore.client.rpc.BrokerClient` (a mixin: rpc.py is at
its size limit): SCRAM credentials (``AlterUserScramCredentials``,
``DescribeUserScramCredentials``).

Errors are mapped as every call's (:mod:`logstore.client.error_mapping`); per-user
outcomes come back next to the user names.

Thread-safety: as :class:`~logstore.client.rpc.BrokerClient`.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import TYPE_CHECKING, Any

from logstore._proto import logstore_pb2 as pb
from logstore.client.credentials import (
    ScramCredentialInfo,
    UserScramCredentialDeletion,
    UserScramCredentialsDescription,
    UserScramCredentialUpsertion,
)
from logstore.client.error_mapping import error_from_item, raise_for_item
from logstore.errors import LogstoreError

__all__ = ["SecurityRpcs"]


class SecurityRpcs:
    """Mixed into :class:`~logstore.client.rpc.BrokerClient`."""

    if TYPE_CHECKING:  # BrokerClient's
        def _call(self, rpc: str, request: Any, *, timeout_s: float) -> Any: ...
        def _deadline_s(self, timeout_ms: int | None, extra_ms: int = 0) -> float: ...

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
        response = self._call("AlterUserScramCredentials", request, timeout_s=self._deadline_s(timeout_ms))
        return {r.user: error_from_item(r.error) for r in response.results}

    def describe_user_scram_credentials(
        self, users: Sequence[str] | None = None, *, timeout_ms: int | None = None,
    ) -> dict[str, UserScramCredentialsDescription | LogstoreError]:
        """Each named user's mechanisms (None or empty: every user), or its error (RESOURCE_NOT_FOUND)."""
        response = self._call("DescribeUserScramCredentials",
                              pb.DescribeUserScramCredentialsRequest(users=list(users or ())),
                              timeout_s=self._deadline_s(timeout_ms))
        raise_for_item(response.error)
        return {
            r.user: error_from_item(r.error) or UserScramCredentialsDescription(
                r.user, tuple(ScramCredentialInfo(c.mechanism, c.iterations) for c in r.credentials))
            for r in response.results
        }
