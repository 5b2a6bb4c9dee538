"""``logstore acls create|list|delete``: ACLs, with Kafka's ``kafka-acls`` names.

create --principal User:alice --operation Write --topic orders [--prefixed] [--deny] [--host H]
    One binding per (principal, operation, resource): ``--principal``,
    ``--operation`` and the resource options may each be repeated, as
    ``kafka-acls --add``. Resources: ``--topic T``, ``--group G``,
    ``--transactional-id T``, ``--cluster``; ``--prefixed`` makes the names
    prefixes (Kafka's ``--resource-pattern-type prefixed``); ``--deny`` makes
    them DENY (deny always wins); ``--host`` restricts them to a client address
    (default ``*``).
list [--principal P] [--topic T | --group G | ...] [--operation O]
    The bindings that match (every one without options), as a table or JSON.
    With a resource, ``--prefixed`` lists only PREFIXED bindings; without it,
    every binding that applies to that name (Kafka's ``MATCH``).
delete (the options of create, as filters)
    Deletes the matching bindings and prints them. At least a principal or a
    resource is required: deleting every ACL at once is refused.

Operations and resource types take Kafka's spellings (``Write``, ``DescribeConfigs``,
``IdempotentWrite``, ``ClusterAction``, ``All``). Every command goes through
:class:`logstore.Admin` with the client security of ``--command-config FILE`` or the
``LOGSTORE_*`` environment (:mod:`logstore.cli_api.security_options`: log in as a super
user) and needs ALTER (DESCRIBE for list) on the cluster;
failures are one line, ``error: [CODE] message`` (e.g. ``SECURITY_DISABLED``,
``CLUSTER_AUTHORIZATION_FAILED``).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any, TypeVar

import click

from logstore.acl import AclBinding, AclFilter
from logstore.cli.common import bootstrap_option, cli_errors, format_option, print_json, print_table
from logstore.cli_api.security_options import cli_security
from logstore.client.admin import Admin

__all__ = ["acls"]

F = TypeVar("F", bound=Callable[..., Any])


def _binding_options(fn: F) -> F:
    options = [
        click.option("--principal", "principals", multiple=True, metavar="User:NAME",
                     help="The principal (User:alice, or User:* for every one); repeatable."),
        click.option("--operation", "operations", multiple=True, metavar="OP",
                     help="Read, Write, Create, Delete, Alter, Describe, DescribeConfigs, AlterConfigs, "
                          "IdempotentWrite, ClusterAction or All; repeatable."),
        click.option("--topic", "topics", multiple=True, metavar="NAME", help="A topic ('*': every topic)."),
        click.option("--group", "groups", multiple=True, metavar="NAME", help="A consumer group."),
        click.option("--transactional-id", "transactional_ids", multiple=True, metavar="NAME",
                     help="A transactional id."),
        click.option("--cluster", is_flag=True, help="The cluster resource."),
        click.option("--prefixed", is_flag=True, help="The names are prefixes (pattern type PREFIXED)."),
        click.option("--deny", is_flag=True, help="DENY instead of ALLOW (deny always wins)."),
        click.option("--host", default=None, metavar="ADDRESS", help="Only from this client address (default *)."),
    ]
    for option in reversed(options):
        fn = option(fn)
    return fn


def _resources(topics: tuple[str, ...], groups: tuple[str, ...], transactional_ids: tuple[str, ...],
               cluster: bool) -> list[tuple[str, str]]:
    return ([("TOPIC", t) for t in topics] + [("GROUP", g) for g in groups]
            + [("TRANSACTIONAL_ID", t) for t in transactional_ids] + ([("CLUSTER", "kafka-cluster")] if cluster else []))


def _rows(bindings: list[AclBinding]) -> list[tuple[str, ...]]:
    return [(b.principal, b.permission, b.operation, b.resource_type, b.resource_name, b.pattern_type, b.host)
            for b in bindings]


def _show(bindings: list[AclBinding], output_format: str, title: str | None, empty: str) -> None:
    if output_format == "json":
        print_json([b.to_dict() for b in bindings])
    elif not bindings:
        click.echo(empty)
    else:
        print_table(title, ("principal", "permission", "operation", "resource", "name", "pattern", "host"),
                    _rows(bindings))


def _filters(principals: tuple[str, ...], operations: tuple[str, ...], resources: list[tuple[str, str]],
             prefixed: bool, deny: bool | None, host: str | None, *, match: bool) -> list[AclFilter]:
    pattern = "PREFIXED" if prefixed else ("MATCH" if match else "LITERAL")
    permission = None if deny is None else ("DENY" if deny else "ALLOW")
    return [AclFilter.create(resource_type=rtype, resource_name=name, pattern_type=pattern if rtype else None,
                             principal=principal, host=host, operation=op, permission=permission)
            for rtype, name in (resources or [(None, None)])  # type: ignore[list-item]
            for principal in (principals or (None,))
            for op in (operations or (None,))]


@click.group()
def acls() -> None:
    """Create, list and delete ACLs (the broker needs authorizer = true)."""


@acls.command("create")
@_binding_options
@bootstrap_option
@cli_errors
def create(principals: tuple[str, ...], operations: tuple[str, ...], topics: tuple[str, ...],
           groups: tuple[str, ...], transactional_ids: tuple[str, ...], cluster: bool, prefixed: bool,
           deny: bool, host: str | None, bootstrap: str) -> None:
    """Add ACLs: every --principal may (or with --deny may not) do every --operation on every resource."""
    resources = _resources(topics, groups, transactional_ids, cluster)
    if not principals or not operations or not resources:
        raise click.UsageError("create needs --principal, --operation and a resource "
                               "(--topic, --group, --transactional-id or --cluster)")
    bindings = [AclBinding.create(resource_type=rtype, resource_name=name, principal=principal, operation=op,
                                  permission="DENY" if deny else "ALLOW",
                                  pattern_type="PREFIXED" if prefixed else "LITERAL", host=host or "*")
                for rtype, name in resources for principal in principals for op in operations]
    with Admin(bootstrap, security=cli_security()) as admin:
        admin.create_acls(bindings)
    _show(bindings, "table", "created", "")


@acls.command("list")
@_binding_options
@format_option()
@bootstrap_option
@cli_errors
def list_(principals: tuple[str, ...], operations: tuple[str, ...], topics: tuple[str, ...],
          groups: tuple[str, ...], transactional_ids: tuple[str, ...], cluster: bool, prefixed: bool,
          deny: bool, host: str | None, output_format: str, bootstrap: str) -> None:
    """List the ACLs that match the options (all of them without options)."""
    filters = _filters(principals, operations, _resources(topics, groups, transactional_ids, cluster),
                       prefixed, True if deny else None, host, match=True)
    found: dict[AclBinding, None] = {}
    with Admin(bootstrap, security=cli_security()) as admin:
        for f in filters:
            found.update(dict.fromkeys(admin.describe_acls(f)))
    _show(sorted(found), output_format, None, "no ACLs")


@acls.command("delete")
@_binding_options
@format_option()
@bootstrap_option
@cli_errors
def delete(principals: tuple[str, ...], operations: tuple[str, ...], topics: tuple[str, ...],
           groups: tuple[str, ...], transactional_ids: tuple[str, ...], cluster: bool, prefixed: bool,
           deny: bool, host: str | None, output_format: str, bootstrap: str) -> None:
    """Delete the ACLs that match the options; print what was deleted."""
    resources = _resources(topics, groups, transactional_ids, cluster)
    if not principals and not resources:
        raise click.UsageError("delete needs --principal or a resource: deleting every ACL at once is refused")
    filters = _filters(principals, operations, resources, prefixed, True if deny else None, host, match=False)
    with Admin(bootstrap, security=cli_security()) as admin:
        deleted = admin.delete_acls(filters)
    _show(sorted(set(deleted)), output_format, "deleted", "no ACL matched")
