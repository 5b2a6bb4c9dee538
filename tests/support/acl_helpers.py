"""A real broker with SCRAM logins and the authorizer on (alice, bob, admin), and ACL helpers."""

from __future__ import annotations

import grpc

from logstore._proto import logstore_pb2 as pb
from logstore._proto import logstore_pb2_grpc as pb_grpc
from logstore.acl import AclBinding
from logstore.broker.embedded import EmbeddedBroker
from logstore.broker.security.credentials import FileCredentials
from logstore.broker.security.principal import SESSION_METADATA_KEY
from logstore.client.acls import binding_to_pb
from logstore.client.sasl import SessionLogin
from logstore.client.security import ClientSecurity
from logstore.record import (
    ATTR_TRANSACTIONAL,
    build_batch,
    encode_batch,
    encode_schema,
    untyped_schema,
)
from logstore.scram import make_credential

TOPIC, GROUP, TXN, SINK = "acl-t", "acl-g", "acl-tx", "acl-sink"


PASSWORD = "acl-test-Pa55"


Metadata = tuple[tuple[str, str], ...]


class ServedBroker:
    """A real broker on a SASL_PLAINTEXT listener with the authorizer on; alice, bob and admin
    (a super user) log in with SCRAM, and calls carry their session tokens."""

    def __init__(self, data_dir: str) -> None:
        for user in ("alice", "bob", "admin"):  # as ``logstore users create --data-dir`` does
            FileCredentials(data_dir).alter(user, [make_credential("SCRAM-SHA-256", PASSWORD)], [])
        self.embedded = EmbeddedBroker(data_dir, overrides={
            "security_protocol": "SASL_PLAINTEXT", "sasl_failure_delay_ms": 0,
            "authorizer": True, "super_users": "User:admin"}).start()
        self.data_dir = data_dir
        self._connect()

    def _connect(self) -> None:
        self.channel = grpc.insecure_channel(self.embedded.bootstrap)
        self.stub = pb_grpc.LogstoreStub(self.channel)
        self.tokens: dict[str, str] = {}
        for user in ("alice", "bob", "admin"):
            security = ClientSecurity(security_protocol="SASL_PLAINTEXT", sasl_mechanism="SCRAM-SHA-256",
                                      sasl_plain_username=user, sasl_plain_password=PASSWORD)
            login = SessionLogin(self.embedded.bootstrap, security, self.channel)
            self.tokens[f"User:{user}"] = login.token(10)
            assert login.principal == f"User:{user}"

    def md(self, principal: str | None) -> Metadata:
        return () if principal is None else ((SESSION_METADATA_KEY, self.tokens[principal]),)

    def restart(self) -> None:
        """Stop and start the broker on the same data directory; log everyone in again."""
        self.channel.close()
        self.embedded.restart()
        self._connect()

    def close(self) -> None:
        self.channel.close()
        self.embedded.close()


def acl(op: str, rtype: str = "TOPIC", name: str = TOPIC, *, pattern: str = "LITERAL",
        principal: str = "User:alice") -> AclBinding:
    return AclBinding.create(resource_type=rtype, resource_name=name, principal=principal, operation=op,
                             pattern_type=pattern)


def records(n: int = 1, *, pid: int = -1, epoch: int = -1, seq: int = -1, txn: bool = False) -> bytes:
    schema = untyped_schema()
    batch = build_batch(schema, values=[b"v"] * n, timestamps_ms=[1_000] * n)
    return encode_schema(schema) + encode_batch(batch, base_offset=0, producer_id=pid, producer_epoch=epoch,
                                                base_sequence=seq,
                                                attributes=ATTR_TRANSACTIONAL if txn else 0).to_bytes()


def set_acls(served: ServedBroker, bindings: tuple[AclBinding, ...], permission: str) -> None:
    r = served.stub.CreateAcls(pb.CreateAclsRequest(creations=[
        binding_to_pb(AclBinding.create(**{**b.to_dict(), "permission": permission})) for b in bindings]),
        metadata=served.md("User:admin"))
    assert not [e for e in r.results if e.code], r


def clear_acls(served: ServedBroker) -> None:
    served.stub.DeleteAcls(pb.DeleteAclsRequest(filters=[pb.AclBinding(principal="User:alice"),
                                                         pb.AclBinding(principal="User:nobody")]),
                           metadata=served.md("User:admin"))
    served.stub.DeleteAcls(pb.DeleteAclsRequest(filters=[pb.AclBinding(principal="User:bob")]),
                           metadata=served.md("User:admin"))
