"""The ACL model and the authorizer (logstore.broker.security.acls), against Kafka's rules;
the file store's round trip; the broker config keys."""

from __future__ import annotations

import asyncio
import json
import os

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from logstore.broker.config import load_broker_config
from logstore.broker.security.acl_store import FileAclStore
from logstore.broker.security.acls import OPERATIONS, AclBinding, AclFilter, Authorizer, normalize
from logstore.errors import InvalidConfigError, InvalidRequestError


def acl(op: str, name: str = "orders", *, rtype: str = "TOPIC", principal: str = "User:alice",
        pattern: str = "LITERAL", permission: str = "ALLOW", host: str = "*") -> AclBinding:
    return AclBinding.create(resource_type=rtype, resource_name=name, principal=principal, operation=op,
                             permission=permission, pattern_type=pattern, host=host)


def can(authz: Authorizer, op: str, name: str = "orders", *, rtype: str = "TOPIC",
        principal: str = "User:alice", host: str = "10.0.0.1") -> bool:
    return authz.authorize(principal, host, op, rtype, name)


def test_names_are_normalized_to_kafkas_spelling() -> None:
    assert normalize("op", "Write", OPERATIONS) == "WRITE"
    assert normalize("op", "DescribeConfigs", OPERATIONS) == "DESCRIBE_CONFIGS"
    assert normalize("op", "idempotent-write", OPERATIONS) == "IDEMPOTENT_WRITE"
    b = AclBinding.create(resource_type="TransactionalId", resource_name="t", principal="User:a",
                          operation="Write")
    assert (b.resource_type, b.operation, b.permission, b.host) == ("TRANSACTIONAL_ID", "WRITE", "ALLOW", "*")
    with pytest.raises(InvalidRequestError, match="operation must be one of"):
        normalize("operation", "Fly", OPERATIONS)
    with pytest.raises(InvalidRequestError, match="TYPE:NAME"):
        acl("READ", principal="alice")
    with pytest.raises(InvalidRequestError, match="cluster resource"):
        acl("ALTER", "other", rtype="CLUSTER")
    assert acl("ALTER", "", rtype="CLUSTER").resource_name == "kafka-cluster"
    assert acl("READ", host="::1").host == "::1" and acl("READ", host="").host == "*"
    with pytest.raises(InvalidRequestError, match="IP address"):
        acl("READ", host="example.com")


def test_no_acl_denies_unless_allow_everyone() -> None:
    assert not can(Authorizer(), "READ")
    assert can(Authorizer(allow_everyone_if_no_acl_found=True), "READ")
    # The resource has an ACL (for someone else): allow_everyone no longer applies.
    other = Authorizer(frozenset({acl("READ", principal="User:bob")}), allow_everyone_if_no_acl_found=True)
    assert not can(other, "READ")
    assert can(other, "READ", "payments")


def test_literal_wildcard_and_prefixed_names() -> None:
    authz = Authorizer(frozenset({acl("READ", "orders"), acl("WRITE", "*"), acl("DELETE", "tmp-", pattern="PREFIXED")}))
    assert can(authz, "READ", "orders") and not can(authz, "READ", "orders2")
    assert can(authz, "WRITE", "anything")
    assert can(authz, "DELETE", "tmp-1") and not can(authz, "DELETE", "tm")
    assert not can(authz, "READ", "orders", rtype="GROUP")


def test_principal_and_host_matching() -> None:
    authz = Authorizer(frozenset({acl("READ", principal="User:*"), acl("WRITE", host="10.0.0.1")}))
    assert can(authz, "READ", principal="User:zoe")
    assert can(authz, "WRITE", host="10.0.0.1") and not can(authz, "WRITE", host="10.0.0.2")
    assert not can(authz, "WRITE", principal="User:bob", host="10.0.0.1")


def test_implied_operations() -> None:
    for op in ("READ", "WRITE", "DELETE", "ALTER"):
        assert can(Authorizer(frozenset({acl(op)})), "DESCRIBE"), op
    assert not can(Authorizer(frozenset({acl("CREATE")})), "DESCRIBE")
    assert can(Authorizer(frozenset({acl("ALTER_CONFIGS")})), "DESCRIBE_CONFIGS")
    assert not can(Authorizer(frozenset({acl("DESCRIBE")})), "READ")
    every = Authorizer(frozenset({acl("ALL")}))
    assert all(can(every, op) for op in OPERATIONS)


def test_deny_wins_and_super_users_bypass() -> None:
    authz = Authorizer(frozenset({acl("ALL"), acl("WRITE", permission="DENY")}), frozenset({"User:admin"}))
    assert can(authz, "READ") and not can(authz, "WRITE")
    # A DENY of READ does not deny DESCRIBE (Kafka: deny matches the operation or ALL only).
    assert can(Authorizer(frozenset({acl("ALL"), acl("READ", permission="DENY")})), "DESCRIBE")
    assert not can(Authorizer(frozenset({acl("READ"), acl("ALL", "*", permission="DENY")})), "READ")
    assert can(authz, "WRITE", principal="User:admin")
    assert can(Authorizer(super_users=frozenset({"User:admin"})), "ALTER", "kafka-cluster", rtype="CLUSTER",
               principal="User:admin")


def test_filters() -> None:
    a, b, c = acl("READ", "orders"), acl("WRITE", "ord", pattern="PREFIXED"), acl("READ", "g", rtype="GROUP")
    acls = [a, b, c]
    assert [x for x in acls if AclFilter().matches(x)] == acls
    assert [x for x in acls if AclFilter.create(resource_type="topic").matches(x)] == [a, b]
    assert [x for x in acls if AclFilter.create(resource_name="orders", pattern_type="ANY").matches(x)] == [a]
    assert [x for x in acls if AclFilter.create(resource_name="orders", pattern_type="MATCH").matches(x)] == [a, b]
    assert [x for x in acls if AclFilter.create(operation="Write", principal="User:alice").matches(x)] == [b]


_ops = st.sampled_from(OPERATIONS)
_names = st.sampled_from(["orders", "ord", "o", "*", "payments"])
_principals = st.sampled_from(["User:alice", "User:bob", "User:*"])
_bindings = st.builds(
    lambda op, name, pattern, principal, permission, host: AclBinding.create(
        resource_type="TOPIC", resource_name=name, principal=principal, operation=op, permission=permission,
        pattern_type="LITERAL" if name == "*" else pattern, host=host),
    _ops, _names, st.sampled_from(["LITERAL", "PREFIXED"]), _principals,
    st.sampled_from(["ALLOW", "DENY"]), st.sampled_from(["*", "10.0.0.1", "10.0.0.2"]))


@settings(max_examples=300, deadline=None)
@given(st.frozensets(_bindings, max_size=8), _ops, st.sampled_from(["orders", "payments", "ordinal"]),
       st.booleans())
def test_deny_always_wins(acls: frozenset[AclBinding], op: str, name: str, allow_everyone: bool) -> None:
    """Adding a matching DENY (of the operation or ALL) to any set of ACLs denies, whatever else
    allows; and removing every DENY never denies what was allowed."""
    base = Authorizer(acls, allow_everyone_if_no_acl_found=allow_everyone)
    for deny_op in (op, "ALL"):
        for deny_name, pattern in ((name, "LITERAL"), ("*", "LITERAL"), (name[:2], "PREFIXED")):
            deny = AclBinding.create(resource_type="TOPIC", resource_name=deny_name, principal="User:alice",
                                     operation=deny_op, permission="DENY", pattern_type=pattern)
            assert not base.with_acls(acls | {deny}).authorize("User:alice", "10.0.0.1", op, "TOPIC", name)
    if base.authorize("User:alice", "10.0.0.1", op, "TOPIC", name):
        allows = frozenset(a for a in acls if a.permission == "ALLOW")
        assert base.with_acls(allows).authorize("User:alice", "10.0.0.1", op, "TOPIC", name) or not allows


def test_file_store_round_trip_and_corrupt_file(tmp_path: object) -> None:
    data_dir = str(tmp_path)

    async def run_io(fn: object) -> object:
        return fn()  # type: ignore[operator]

    async def scenario() -> None:
        store = FileAclStore(data_dir, run_io)
        assert await store.load() == frozenset()
        a, b = acl("READ"), acl("WRITE", permission="DENY")
        assert await store.update(lambda old: old | {a, b}) == {a, b}
        assert await FileAclStore(data_dir, run_io).load() == {a, b}  # reopened from disk
        assert await store.update(lambda old: old - {a}) == {b}
        with open(store.path) as f:
            assert json.load(f)[0]["permission"] == "DENY"
        with open(store.path, "w") as f:
            f.write("{not json")
        with pytest.raises(InvalidConfigError, match="acls.json"):
            await store.load()
    asyncio.run(scenario())
    assert not [n for n in os.listdir(os.path.join(data_dir, "meta")) if n.endswith(".tmp")]


def test_broker_config_keys(tmp_path: object) -> None:
    path = os.path.join(str(tmp_path), "broker.toml")
    with open(path, "w") as f:
        f.write('authorizer = true\nsuper_users = ["User:admin", "User:broker"]\n')
    cfg = load_broker_config(path, env={})
    assert cfg.authorizer and cfg.super_users == ("User:admin", "User:broker")
    assert not cfg.allow_everyone_if_no_acl_found
    cfg = load_broker_config(None, env={"LOGSTORE_SUPER_USERS": "User:a, User:b",
                                        "LOGSTORE_ALLOW_EVERYONE_IF_NO_ACL_FOUND": "true"})
    assert cfg.super_users == ("User:a", "User:b") and cfg.allow_everyone_if_no_acl_found and not cfg.authorizer
    with pytest.raises(InvalidConfigError, match="true or false"):
        load_broker_config(None, env={"LOGSTORE_AUTHORIZER": "maybe"})


def _naive(acls: frozenset[AclBinding], principal: str, host: str, op: str, name: str) -> bool:
    """Kafka's rules read straight off the module docstring, scanning every ACL."""
    on_resource = [a for a in acls if a.applies_to("TOPIC", name)]
    if not on_resource:
        return False
    mine = [a for a in on_resource if a.principal in (principal, "User:*") and a.host in (host, "*")]
    if any(a.permission == "DENY" and a.operation in (op, "ALL") for a in mine):
        return False
    implied = {"DESCRIBE": {"READ", "WRITE", "DELETE", "ALTER"}, "DESCRIBE_CONFIGS": {"ALTER_CONFIGS"}}
    return any(a.permission == "ALLOW" and a.operation in {op, "ALL", *implied.get(op, ())} for a in mine)


@settings(max_examples=300, deadline=None)
@given(st.frozensets(_bindings, max_size=12), _ops, st.sampled_from(["orders", "payments", "ordinal", "*"]),
       _principals, st.sampled_from(["10.0.0.1", "10.0.0.2"]))
def test_the_indexed_authorizer_agrees_with_a_scan(acls: frozenset[AclBinding], op: str, name: str,
                                                   principal: str, host: str) -> None:
    assert Authorizer(acls).authorize(principal, host, op, "TOPIC", name) == _naive(acls, principal, host, op, name)
