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

Failures are one line, ``error: [CODE] message``.
"""

from __future__ import annotations

import os
import sys
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from typing import Any, TypeVar

import click

from logstore.broker.security.credentials import FileCredentials
from logstore.cli.common import (
    CliError,
    bootstrap_option,
    cli_errors,
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
from logstore.client.security import ClientSecurity, security_from_options
from logstore.scram import MAX_ITERATIONS, MECHANISMS, MIN_ITERATIONS, make_credential
from logstore.storage.dir_lock import DataDirLock

__all__ = ["users"]

F = TypeVar("F", bound=Callable[..., Any])

# LOGSTORE_* variables -> client security options (the names of logstore.client.security).
_ENV_OPTIONS = {
    "LOGSTORE_SECURITY_PROTOCOL": "security_protocol",
    "LOGSTORE_SSL_CAFILE": "ssl_cafile",
    "LOGSTORE_SSL_CERTFILE": "ssl_certfile",
    "LOGSTORE_SSL_KEYFILE": "ssl_keyfile",
    "LOGSTORE_SASL_MECHANISM": "sasl_mechanism",
    "LOGSTORE_SASL_USERNAME": "sasl_plain_username",
    "LOGSTORE_SASL_PASSWORD": "sasl_plain_password",
}


def _client_security() -> ClientSecurity | None:
    return security_from_options({opt: os.environ.get(var) for var, opt in _ENV_OPTIONS.items()})


def _mechanism_option(help_text: str) -> Callable[[F], F]:
    return click.option("--mechanism", "mechanisms", multiple=True, type=click.Choice(list(MECHANISMS)),
                        help=help_text)


def _data_dir_option() -> Callable[[F], F]:
    return click.option("--data-dir", type=click.Path(file_okay=False), default=None,
                        help="Write into this stopped broker's data directory instead of through a broker.")


@contextmanager
def _offline(data_dir: str) -> Iterator[FileCredentials]:
    """The credentials file of ``data_dir``, under the directory's lock (no broker runs there)."""
    if not os.path.isdir(data_dir):
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
@bootstrap_option
@cli_errors
def create(name: str, mechanisms: tuple[str, ...], iterations: int, password_stdin: bool,
           data_dir: str | None, bootstrap: str) -> None:
    """Create user NAME, or set its password (never given as a flag: stdin or a prompt)."""
    chosen = list(dict.fromkeys(mechanisms)) or list(MECHANISMS)
    password = _read_password(password_stdin)
    if data_dir is not None:
        with _offline(data_dir) as store:
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
@bootstrap_option
@cli_errors
def delete(name: str, mechanisms: tuple[str, ...], data_dir: str | None, bootstrap: str) -> None:
    """Delete user NAME (its sessions end)."""
    if data_dir is not None:
        with _offline(data_dir) as store:
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
@bootstrap_option
@cli_errors
def list_(output_format: str, data_dir: str | None, bootstrap: str) -> None:
    """List users and their SCRAM mechanisms."""
    if data_dir is not None:
        with _offline(data_dir) as store:
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
