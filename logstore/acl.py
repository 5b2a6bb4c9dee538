"""ACL bindings and filters in Kafka's model: the value types the admin client sends and
the broker's authorizer (:mod:`logstore.broker.security.acls`) decides with.

An :class:`AclBinding` says: *principal* from *host* is ALLOWed (or DENYed)
*operation* on the resources named by (*resource_type*, *resource_name*,
*pattern_type*). Names are Kafka's upper-case spellings (the proto's), and
:meth:`AclBinding.create` accepts Kafka tools' spellings too (``Write``,
``TransactionalId``, ``describe-configs``):

* resource types: TOPIC, GROUP, TRANSACTIONAL_ID, CLUSTER (the one cluster
  resource is named ``kafka-cluster``, as Kafka's);
* pattern types: LITERAL (the name, or ``*`` for every resource of the type)
  and PREFIXED (every name starting with it);
* operations: READ, WRITE, CREATE, DELETE, ALTER, DESCRIBE, DESCRIBE_CONFIGS,
  ALTER_CONFIGS, IDEMPOTENT_WRITE, CLUSTER_ACTION, and ALL;
* principals ``User:<name>``, or ``User:*`` for every principal; hosts an IP
  address or ``*``.

Filters (:class:`AclFilter`, for Describe/DeleteAcls) match bindings field by
field; a field that is None (or ``ANY`` on the wire) matches every value, and
the pattern type ``MATCH`` matches every binding that would apply to the
filter's resource name (literal, wildcard or prefix), as Kafka's.

Thread-safety: values are frozen.
"""


from __future__ import annotations

import ipaddress
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from logstore.errors import InvalidRequestError

__all__ = [
    "ALL",
    "ANY",
    "CLUSTER_NAME",
    "IMPLIES",
    "MATCH",
    "OPERATIONS",
    "PATTERN_TYPES",
    "PERMISSIONS",
    "RESOURCE_TYPES",
    "WILDCARD",
    "WILDCARD_PRINCIPAL",
    "AclBinding",
    "AclFilter",
    "normalize",
]

RESOURCE_TYPES = ("TOPIC", "GROUP", "TRANSACTIONAL_ID", "CLUSTER")
PATTERN_TYPES = ("LITERAL", "PREFIXED")
OPERATIONS = ("READ", "WRITE", "CREATE", "DELETE", "ALTER", "DESCRIBE", "DESCRIBE_CONFIGS",
              "ALTER_CONFIGS", "IDEMPOTENT_WRITE", "CLUSTER_ACTION", "ALL")
PERMISSIONS = ("ALLOW", "DENY")
ALL = "ALL"
ANY = "ANY"
MATCH = "MATCH"
WILDCARD = "*"
WILDCARD_PRINCIPAL = "User:*"
CLUSTER_NAME = "kafka-cluster"

# An ALLOW of the key also allows these (Kafka's implied operations).
IMPLIES: Mapping[str, frozenset[str]] = {
    "DESCRIBE": frozenset({"DESCRIBE", "READ", "WRITE", "DELETE", "ALTER", ALL}),
    "DESCRIBE_CONFIGS": frozenset({"DESCRIBE_CONFIGS", "ALTER_CONFIGS", ALL}),
}


def normalize(kind: str, value: str, allowed: tuple[str, ...], *, any_ok: bool = False) -> str:
    """``value`` in Kafka's upper-case spelling: ``Write`` → WRITE, ``TransactionalId`` →
    TRANSACTIONAL_ID, ``describe-configs`` → DESCRIBE_CONFIGS; INVALID_REQUEST otherwise."""
    out = value.strip()
    if any(c.islower() for c in out[1:]) and "_" not in out and "-" not in out:  # CamelCase
        out = "".join("_" + c if c.isupper() and i else c for i, c in enumerate(out))
    out = out.replace("-", "_").upper()
    if out in allowed or (any_ok and out in (ANY, MATCH)):
        return out
    raise InvalidRequestError(f"{kind} must be one of {', '.join(allowed)}, got {value!r}")


def _check_principal(principal: str) -> str:
    kind, sep, name = principal.partition(":")
    if not sep or not kind or not name:
        raise InvalidRequestError(f"principal must be TYPE:NAME, e.g. User:alice or User:*, got {principal!r}")
    return principal


def _check_host(host: str) -> str:
    host = host.strip() or WILDCARD
    if host != WILDCARD:
        try:
            host = str(ipaddress.ip_address(host))
        except ValueError:
            raise InvalidRequestError(f"host must be '*' or an IP address (as the broker sees the client), "
                                      f"got {host!r}") from None
    return host


@dataclass(frozen=True, slots=True, order=True)
class AclBinding:
    """One ACL (see the module docstring); build checked ones with :meth:`create`."""

    resource_type: str
    resource_name: str
    pattern_type: str
    principal: str
    host: str
    operation: str
    permission: str

    @classmethod
    def create(cls, *, resource_type: str, resource_name: str, principal: str, operation: str,
               permission: str = "ALLOW", pattern_type: str = "LITERAL", host: str = WILDCARD) -> AclBinding:
        """A binding with every field checked and spelled as Kafka's (INVALID_REQUEST otherwise)."""
        rtype = normalize("resource type", resource_type, RESOURCE_TYPES)
        ptype = normalize("pattern type", pattern_type, PATTERN_TYPES)
        if rtype == "CLUSTER":
            resource_name = resource_name or CLUSTER_NAME
            if resource_name != CLUSTER_NAME or ptype != "LITERAL":
                raise InvalidRequestError(f"the cluster resource is LITERAL {CLUSTER_NAME!r}, got "
                                          f"{ptype} {resource_name!r}")
        if not resource_name:
            raise InvalidRequestError(f"an ACL on a {rtype} needs a resource name (or '*' for all)")
        if ptype == "PREFIXED" and resource_name == WILDCARD:
            raise InvalidRequestError("a PREFIXED ACL cannot be '*': use a LITERAL '*' for every resource")
        return cls(rtype, resource_name, ptype, _check_principal(principal), _check_host(host),
                   normalize("operation", operation, OPERATIONS),
                   normalize("permission", permission, PERMISSIONS))

    def applies_to(self, resource_type: str, name: str) -> bool:
        """Whether this binding covers resource ``name`` of ``resource_type``."""
        if self.resource_type != resource_type:
            return False
        if self.pattern_type == "PREFIXED":
            return name.startswith(self.resource_name)
        return self.resource_name in (name, WILDCARD)

    def to_dict(self) -> dict[str, str]:
        return {"resource_type": self.resource_type, "resource_name": self.resource_name,
                "pattern_type": self.pattern_type, "principal": self.principal, "host": self.host,
                "operation": self.operation, "permission": self.permission}

    @classmethod
    def from_dict(cls, d: Mapping[str, Any]) -> AclBinding:
        return cls.create(resource_type=str(d["resource_type"]), resource_name=str(d["resource_name"]),
                          pattern_type=str(d["pattern_type"]), principal=str(d["principal"]),
                          host=str(d["host"]), operation=str(d["operation"]), permission=str(d["permission"]))


@dataclass(frozen=True, slots=True)
class AclFilter:
    """Which bindings Describe/DeleteAcls act on: None in a field matches every value."""

    resource_type: str | None = None
    resource_name: str | None = None
    pattern_type: str | None = None  # LITERAL, PREFIXED, MATCH, or None (any)
    principal: str | None = None
    host: str | None = None
    operation: str | None = None
    permission: str | None = None

    @classmethod
    def create(cls, **fields: str | None) -> AclFilter:
        """A filter from wire strings: empty or ``ANY`` means any; the rest is checked."""
        def opt(key: str, allowed: tuple[str, ...] | None = None) -> str | None:
            value = fields.get(key)
            if value is None or value.strip() == "" or value.strip().upper() == ANY:
                return None
            return normalize(key.replace("_", " "), value, allowed, any_ok=True) if allowed else value
        return cls(opt("resource_type", RESOURCE_TYPES), opt("resource_name"),
                   opt("pattern_type", PATTERN_TYPES), opt("principal"), opt("host"),
                   opt("operation", OPERATIONS), opt("permission", PERMISSIONS))

    def matches(self, acl: AclBinding) -> bool:
        if self.resource_type is not None and acl.resource_type != self.resource_type:
            return False
        if self.pattern_type == MATCH:
            if self.resource_name is not None and not acl.applies_to(acl.resource_type, self.resource_name):
                return False
        else:
            if self.pattern_type is not None and acl.pattern_type != self.pattern_type:
                return False
            if self.resource_name is not None and acl.resource_name != self.resource_name:
                return False
        return all(want is None or want == have for want, have in (
            (self.principal, acl.principal), (self.host, acl.host),
            (self.operation, acl.operation), (self.permission, acl.permission)))
