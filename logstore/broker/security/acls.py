"""The authorizer: Kafka's ``AclAuthorizer`` decision over the ACLs of :mod:`logstore.acl`
(pure: no I/O).

:meth:`Authorizer.authorize`:

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

Thread-safety: an :class:`Authorizer` is replaced whole
(:meth:`Authorizer.with_acls`), never changed in place, so readers on any
thread see one consistent set.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field

from logstore.acl import (
    ALL,
    CLUSTER_NAME,
    IMPLIES,
    OPERATIONS,
    WILDCARD,
    WILDCARD_PRINCIPAL,
    AclBinding,
    AclFilter,
    normalize,
)

__all__ = ["CLUSTER_NAME", "OPERATIONS", "AclBinding", "AclFilter", "Authorizer", "normalize"]


@dataclass(frozen=True)
class Authorizer:
    """The decision (see the module docstring) over one immutable set of ACLs."""

    acls: frozenset[AclBinding] = frozenset()
    super_users: frozenset[str] = frozenset()
    allow_everyone_if_no_acl_found: bool = False
    # Per resource type: literal bindings by name (``*`` included) and prefixed bindings by
    # prefix, so a check costs one dict lookup per prefix of the name (at most its length, and
    # only lengths some prefixed ACL has), never a scan of the ACLs.
    _literal: Mapping[str, Mapping[str, tuple[AclBinding, ...]]] = field(
        default_factory=dict, repr=False, compare=False)
    _prefixed: Mapping[str, Mapping[str, tuple[AclBinding, ...]]] = field(
        default_factory=dict, repr=False, compare=False)
    _prefix_lengths: Mapping[str, tuple[int, ...]] = field(default_factory=dict, repr=False, compare=False)

    def __post_init__(self) -> None:
        literal: dict[str, dict[str, list[AclBinding]]] = {}
        prefixed: dict[str, dict[str, list[AclBinding]]] = {}
        for acl in self.acls:
            into = prefixed if acl.pattern_type == "PREFIXED" else literal
            into.setdefault(acl.resource_type, {}).setdefault(acl.resource_name, []).append(acl)
        object.__setattr__(self, "_literal", {t: {n: tuple(v) for n, v in by_name.items()}
                                              for t, by_name in literal.items()})
        object.__setattr__(self, "_prefixed", {t: {n: tuple(v) for n, v in by_prefix.items()}
                                               for t, by_prefix in prefixed.items()})
        object.__setattr__(self, "_prefix_lengths", {t: tuple(sorted({len(n) for n in by_prefix}))
                                                     for t, by_prefix in prefixed.items()})

    def _resource_acls(self, resource_type: str, name: str) -> list[AclBinding]:
        by_name = self._literal.get(resource_type, {})
        out = [*by_name.get(name, ()), *(by_name.get(WILDCARD, ()) if name != WILDCARD else ())]
        by_prefix = self._prefixed.get(resource_type)
        if by_prefix:
            for length in self._prefix_lengths[resource_type]:
                if length > len(name):
                    break
                out.extend(by_prefix.get(name[:length], ()))
        return out

    def with_acls(self, acls: Iterable[AclBinding]) -> Authorizer:
        """The same settings over ``acls`` (a new authorizer; this one is unchanged)."""
        return Authorizer(frozenset(acls), self.super_users, self.allow_everyone_if_no_acl_found)

    def authorize(self, principal: str, host: str, operation: str, resource_type: str, name: str) -> bool:
        """Whether ``principal`` from ``host`` may do ``operation`` on resource ``name``."""
        if principal in self.super_users:
            return True
        resource_acls = self._resource_acls(resource_type, name)
        if not resource_acls:
            return self.allow_everyone_if_no_acl_found
        mine = [a for a in resource_acls
                if a.principal in (principal, WILDCARD_PRINCIPAL) and a.host in (host, WILDCARD)]
        if any(a.permission == "DENY" and a.operation in (operation, ALL) for a in mine):
            return False
        allowing = IMPLIES.get(operation, frozenset({operation, ALL}))
        return any(a.permission == "ALLOW" and a.operation in allowing for a in mine)

    def describe(self, flt: AclFilter) -> list[AclBinding]:
        return sorted(a for a in self.acls if flt.matches(a))
