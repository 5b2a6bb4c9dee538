"""``logstore users create|delete|list``: SCRAM users (Kafka's ``kafka-configs --alter
--add-config SCRAM-SHA-256=[...] --entity-type users``).

create NAME [--mechanism M]... [--iterations N] [--password-stdin]
    Creates the user, or replaces its password, for each mechanism (default both
    SCRAM-SHA-256 and SCRAM-SHA-512, so a client may use either). The password is read
    from the first line of stdin with ``--password-stdin``, else asked twice at a hidden
    prompt; it is never a flag (flags end up in shell histories and ``ps``), never
    printed, and never sent: the salted hash is computed here.
delete NAME [--mechanism M]...
    Deletes the user's credentials (default: every mechanism it has); the broker
    ends the user's sessions.
list [--format table|json]
    Every user and its mechanisms with their iteration counts (never a key).

Where the credentials go:

* ``--bootstrap HOST:PORT`` (the default): through a running broker
  (``AlterUserScramCredentials``), authenticated as the client options say
  (``LOGSTORE_SECURITY_PROTOCOL``, ``LOGSTORE_SASL_MECHANISM``, ``LOGSTORE_SASL_USERNAME``,
  ``LOGSTORE_SASL_PASSWORD``, ...); on a cluster every broker sees the change.
* ``--data-dir DIR``: straight into a stopped single broker's data directory, the way
  to create the first user before anyone can authenticate (Kafka's ``kafka-storage format
  --add-scram``). The data directory's lock says whether a broker runs there: then
  this fails at once with one line naming the holder's pid.
* ``--metadata etcd://HOST:PORT [--cluster-id ID]``: straight into a cluster's metadata
  store, the way to create a cluster's first user and its inter-broker user (whoever
  can write to etcd owns the cluster anyway); brokers read credentials at each login.

Failures are one line, ``error: [CODE] message``.
"""

from __future__ import annotations

import asyncio
import os
import sys
from collections.abc import Awaitable, Callable, Iterator
from contextlib import contextmanager
from typing import Any, TypeVar

import click

from logstore.broker.security.credentials import FileCredentials
from logstore.cli.common import (
    CliError,
    bootstrap_option,
    cli_errors,
    cli_security,
    format_option,
    print_json,
    print_table,
)
from logstore.client.admin import Admin
from logstore.client.credentials import (
    ScramCredentialInfo,
    UserScramCredentialDeletion,
    UserScramCredentialsDescription,
    UserScramCredentialUpsertion,
)
from logstore.client.security import ClientSecurity
from logstore.scram import (
    MAX_ITERATIONS,
    MECHANISMS,
    MIN_ITERATIONS,
    ScramCredential,
    make_credential,
)
from logstore.storage.dir_lock import DataDirLock

__all__ = ["users"]

F = TypeVar("F", bound=Callable[..., Any])

def _client_security() -> ClientSecurity | None:
    """The verb's ``--command-config`` file over ``LOGSTORE_*`` (:mod:`logstore.cli_api.security_options`)."""
    return cli_security()


def _mechanism_option(help_text: str) -> Callable[[F], F]:
    return click.option("--mechanism", "mechanisms", multiple=True, type=click.Choice(list(MECHANISMS)),
                        help=help_text)


def _data_dir_option() -> Callable[[F], F]:
    return click.option("--data-dir", type=click.Path(file_okay=False), default=None,
                        help="Write into this stopped broker's data directory instead of through a broker.")


def _metadata_options(fn: F) -> F:
    fn = click.option("--cluster-id", default="logstore", show_default=True,
                      help="With --metadata: the cluster's id (its brokers' cluster_id).")(fn)
    return click.option("--metadata", default=None, metavar="etcd://HOST:PORT[,HOST:PORT]",
                        help="Write into this cluster's metadata store (etcd) instead of through a broker.")(fn)


class _EtcdStore:
    """A cluster's credentials in etcd, with :class:`FileCredentials`' synchronous methods."""

    def __init__(self, url: str, cluster_id: str) -> None:
        self._url, self._cluster_id = url, cluster_id

    def _run(self, fn: Callable[[Any], Awaitable[Any]]) -> Any:
        from logstore.broker.security.credentials import EtcdCredentials
        from replication.metadata_store import MetadataStore

        async def go() -> Any:
            store = await MetadataStore.connect(self._url, cluster_id=self._cluster_id)
            try:
                return await fn(EtcdCredentials(store))
            finally:
                await store.close()
        return asyncio.run(go())

    def get(self, user: str) -> Any:
        return self._run(lambda c: c.get(user))

    def users(self) -> Any:
        return self._run(lambda c: c.users())

    def alter(self, user: str, upserts: list[ScramCredential], deletions: list[str]) -> Any:
        return self._run(lambda c: c.alter(user, upserts, deletions))


@contextmanager
def _offline(data_dir: str | None, metadata: str | None, cluster_id: str, *,
             create: bool = False) -> Iterator[FileCredentials | _EtcdStore]:
    """The credentials of a cluster's etcd, or of ``data_dir`` under the directory's lock (no
    broker runs there); ``create``: a data directory that does not exist yet is made (the first
    user of a broker that has never run)."""
    if data_dir is not None and metadata is not None:
        raise click.UsageError("give --data-dir (a single broker) or --metadata (a cluster), not both")
    if metadata is not None:
        if not metadata.startswith("etcd://"):
            raise CliError(f"--metadata must be etcd://HOST:PORT[,HOST:PORT], got {metadata!r}", code="INVALID_CONFIG")
        yield _EtcdStore(metadata, cluster_id)
        return
    assert data_dir is not None
    if not create and not os.path.isdir(data_dir):
        raise CliError(f"data directory {data_dir} does not exist", code="INVALID_CONFIG")
    lock = DataDirLock.acquire(data_dir, purpose="logstore users")
    try:
        yield FileCredentials(data_dir)
    finally:
        lock.release()


def _read_password(from_stdin: bool) -> str:
    if from_stdin:
        password = sys.stdin.readline().rstrip("\r\n")
    elif sys.stdin.isatty():
        password = click.prompt("Password", hide_input=True, confirmation_prompt=True, err=True)
    else:
        raise CliError("stdin is not a terminal: give the password on stdin with --password-stdin",
                       code="INVALID_CONFIG")
    if not password:
        raise CliError("the password is empty", code="INVALID_CONFIG")
    return password


@click.group()
def users() -> None:
    """Create, delete and list SCRAM users."""


@users.command("create")
@click.argument("name")
@_mechanism_option("SCRAM mechanism (repeat for several; default: SCRAM-SHA-256 and SCRAM-SHA-512).")
@click.option("--iterations", type=click.IntRange(MIN_ITERATIONS, MAX_ITERATIONS), default=MIN_ITERATIONS,
              show_default=True, help="PBKDF2 iterations of the salted password (Kafka's bounds).")
@click.option("--password-stdin", is_flag=True, help="Read the password from the first line of stdin.")
@_data_dir_option()
@_metadata_options
@bootstrap_option
@cli_errors
def create(name: str, mechanisms: tuple[str, ...], iterations: int, password_stdin: bool,
           data_dir: str | None, metadata: str | None, cluster_id: str, bootstrap: str) -> None:
    """Create user NAME, or set its password (never given as a flag: stdin or a prompt)."""
    chosen = list(dict.fromkeys(mechanisms)) or list(MECHANISMS)
    password = _read_password(password_stdin)
    if data_dir is not None or metadata is not None:
        with _offline(data_dir, metadata, cluster_id, create=True) as store:
            store.alter(name, [make_credential(m, password, iterations=iterations) for m in chosen], [])
    else:
        with Admin(bootstrap, security=_client_security()) as admin:
            admin.alter_user_scram_credentials(
                [UserScramCredentialUpsertion(name, password, m, iterations) for m in chosen])
    click.echo(f"user {name}: {', '.join(chosen)} ({iterations} iterations)")


@users.command("delete")
@click.argument("name")
@_mechanism_option("Delete only this mechanism's credential (repeatable; default: all of them).")
@_data_dir_option()
@_metadata_options
@bootstrap_option
@cli_errors
def delete(name: str, mechanisms: tuple[str, ...], data_dir: str | None, metadata: str | None, cluster_id: str,
           bootstrap: str) -> None:
    """Delete user NAME (its sessions end)."""
    if data_dir is not None or metadata is not None:
        with _offline(data_dir, metadata, cluster_id) as store:
            chosen = list(dict.fromkeys(mechanisms)) or sorted(store.get(name)) or list(MECHANISMS)
            store.alter(name, [], chosen)
    else:
        with Admin(bootstrap, security=_client_security()) as admin:
            chosen = list(dict.fromkeys(mechanisms)) or [
                c.mechanism for c in admin.describe_user_scram_credentials([name])[name].credentials]
            admin.alter_user_scram_credentials([UserScramCredentialDeletion(name, m) for m in chosen])
    click.echo(f"user {name}: deleted {', '.join(chosen)}")


@users.command("list")
@format_option()
@_data_dir_option()
@_metadata_options
@bootstrap_option
@cli_errors
def list_(output_format: str, data_dir: str | None, metadata: str | None, cluster_id: str, bootstrap: str) -> None:
    """List users and their SCRAM mechanisms."""
    if data_dir is not None or metadata is not None:
        with _offline(data_dir, metadata, cluster_id) as store:
            found = {
                user: UserScramCredentialsDescription(
                    user, tuple(ScramCredentialInfo(m, c.iterations) for m, c in sorted(creds.items())))
                for user, creds in store.users().items()
            }
    else:
        with Admin(bootstrap, security=_client_security()) as admin:
            found = admin.describe_user_scram_credentials()
    docs: list[dict[str, Any]] = [
        {"user": d.user, "credentials": [{"mechanism": c.mechanism, "iterations": c.iterations} for c in d.credentials]}
        for d in sorted(found.values(), key=lambda d: d.user)]
    if output_format == "json":
        print_json(docs)
        return
    if not docs:
        click.echo("no users")
        return
    print_table(None, ("user", "mechanisms"),
                ((d["user"], ", ".join(f"{c['mechanism']} ({c['iterations']})" for c in d["credentials"]))
                 for d in docs))
