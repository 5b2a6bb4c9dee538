"""ACLs in Kafka's model, and the authorizer that decides with them (pure: no I/O).

An :class:`AclBinding` says: *principal* from *host* is ALLOWed (or DENYed)
*operation* on the resources named by (*resource_type*, *resource_name*,
*pattern_type*). Names are Kafka's upper-case spellings (the proto's):

* resource types: TOPIC, GROUP, TRANSACTIONAL_ID, CLUSTER (the one cluster
  resource is named ``kafka-cluster``, as Kafka's);
* pattern types: LITERAL (the name, or ``*`` for every resource of the type)
  and PREFIXED (every name starting with it);
* operations: READ, WRITE, CREATE, DELETE, ALTER, DESCRIBE, DESCRIBE_CONFIGS,
  ALTER_CONFIGS, IDEMPOTENT_WRITE, CLUSTER_ACTION, and ALL;
* principals ``User:<name>``, or ``User:*`` for every principal; hosts an IP
  address or ``*``.

:meth:`Authorizer.authorize` is Kafka's ``AclAuthorizer``:

1. a super user (``super_users``) may do everything;
2. the ACLs that *match* are those of the resource (literal name, literal
   ``*``, or a prefix of the name), of the principal (or ``User:*``) and of the
   host (or ``*``);
3. a matching DENY of the operation (or ALL) denies, whatever allows it: deny
   always wins;
4. a matching ALLOW of the operation, of ALL, or of an operation that implies
   it allows: READ, WRITE, DELETE and ALTER imply DESCRIBE; ALTER_CONFIGS
   implies DESCRIBE_CONFIGS;
5. otherwise denied, unless the resource has no ACL at all (for anyone) and
   ``allow_everyone_if_no_acl_found`` is set.

Filters (:class:`AclFilter`, for Describe/DeleteAcls) match bindings field by
field; a field that is None (or ``ANY`` on the wire) matches every value, and
the pattern type ``MATCH`` matches every binding that would apply to the
filter's resource name (literal, wildcard or prefix), as Kafka's.

Thread-safety: values are frozen; an :class:`Authorizer` is replaced whole
(:meth:`Authorizer.with_acls`), never changed in place, so readers on any
thread see one consistent set.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from typing import Any

from logstore.errors import InvalidRequestError

__all__ = [
    "ALL",
    "ANY",
    "CLUSTER_NAME",
    "OPERATIONS",
    "PATTERN_TYPES",
    "PERMISSIONS",
    "RESOURCE_TYPES",
    "WILDCARD",
    "AclBinding",
    "AclFilter",
    "Authorizer",
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
_IMPLIES: Mapping[str, frozenset[str]] = {
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
        return cls(rtype, resource_name, ptype, _check_principal(principal), host.strip() or WILDCARD,
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


@dataclass(frozen=True)
class Authorizer:
    """The decision (see the module docstring) over one immutable set of ACLs."""

    acls: frozenset[AclBinding] = frozenset()
    super_users: frozenset[str] = frozenset()
    allow_everyone_if_no_acl_found: bool = False
    _by_type: Mapping[str, tuple[AclBinding, ...]] = field(default_factory=dict, repr=False, compare=False)

    def __post_init__(self) -> None:
        by_type: dict[str, list[AclBinding]] = {}
        for acl in self.acls:
            by_type.setdefault(acl.resource_type, []).append(acl)
        object.__setattr__(self, "_by_type", {k: tuple(v) for k, v in by_type.items()})

    def with_acls(self, acls: Iterable[AclBinding]) -> Authorizer:
        """The same settings over ``acls`` (a new authorizer; this one is unchanged)."""
        return Authorizer(frozenset(acls), self.super_users, self.allow_everyone_if_no_acl_found)

    def authorize(self, principal: str, host: str, operation: str, resource_type: str, name: str) -> bool:
        """Whether ``principal`` from ``host`` may do ``operation`` on resource ``name``."""
        if principal in self.super_users:
            return True
        resource_acls = [a for a in self._by_type.get(resource_type, ()) if a.applies_to(resource_type, name)]
        if not resource_acls:
            return self.allow_everyone_if_no_acl_found
        mine = [a for a in resource_acls
                if a.principal in (principal, WILDCARD_PRINCIPAL) and a.host in (host, WILDCARD)]
        if any(a.permission == "DENY" and a.operation in (operation, ALL) for a in mine):
            return False
        allowing = _IMPLIES.get(operation, frozenset({operation, ALL}))
        return any(a.permission == "ALLOW" and a.operation in allowing for a in mine)

    def describe(self, flt: AclFilter) -> list[AclBinding]:
        return sorted(a for a in self.acls if flt.matches(a))
