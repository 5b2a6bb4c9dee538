"""What a ``logstore`` verb needs, whoever defines it: the CLI's own verbs and the command
groups other packages add through the ``logstore.cli`` entry points (:mod:`logstore.cli.plugins`;
``logstore jobs ...`` is one).

The conventions (the CLI's, :mod:`logstore.cli.common`, which builds on this):

* a failure is one line on stderr, ``error: [CODE] message``, and exit code 1, never a
  traceback: :func:`cli_errors` turns :class:`~logstore.errors.LogstoreError` and
  :class:`OSError` into that line; :class:`CliError` is the exception a verb raises itself;
* ``--bootstrap HOST:PORT`` (Kafka's ``--bootstrap-server``, ``--broker-list`` and ``-b`` too) and
  ``--command-config FILE`` for the client's security (:func:`bootstrap_option`; the verb
  passes ``security=cli_security()``, :mod:`.security_options`);
* ``--format table|json`` (:func:`format_option`): :func:`print_table` for people,
  :func:`print_json` for scripts.

This package imports the clients and the top of ``logstore`` only, so a plugin can use it
without importing the CLI (an import contract says so).

Thread-safety: meant for the CLI's main thread.
"""

from __future__ import annotations

import functools
import json
import sys
from collections.abc import Callable, Iterable, Sequence
from typing import Any, TypeVar

import click
from rich.console import Console
from rich.table import Table

from logstore.cli_api.security_options import cli_security, command_config_option
from logstore.defaults import default_bootstrap
from logstore.errors import LogstoreError

__all__ = [
    "CliError",
    "cli_errors",
    "bootstrap_option",
    "cli_security",
    "command_config_option",
    "format_option",
    "console",
    "print_table",
    "print_json",
]

F = TypeVar("F", bound=Callable[..., Any])


class CliError(click.ClickException):
    """A failure the CLI reports as one line, ``error: [CODE] message``, and exit code 1."""

    exit_code = 1

    def __init__(self, message: str, *, code: str | None = None) -> None:
        super().__init__(message)
        self.code = code

    def format_message(self) -> str:
        text = " ".join(str(self.message).split("\n")).strip()
        return f"[{self.code}] {text}" if self.code else text

    def show(self, file: Any = None) -> None:
        click.echo(f"error: {self.format_message()}", file=file or sys.stderr)

    @classmethod
    def from_exception(cls, exc: BaseException) -> CliError:
        if isinstance(exc, LogstoreError):
            return cls(exc.message, code=exc.code)
        if isinstance(exc, OSError):
            where = f" ({exc.filename})" if getattr(exc, "filename", None) else ""
            return cls(f"{exc.strerror or exc}{where}", code="OS_ERROR")
        return cls(str(exc))


def cli_errors(fn: F) -> F:
    """Report :class:`LogstoreError` and :class:`OSError` raised by ``fn`` as one line (exit 1)."""

    @functools.wraps(fn)
    def wrapper(*args: Any, **kwargs: Any) -> Any:
        try:
            return fn(*args, **kwargs)
        except (LogstoreError, OSError) as e:
            if isinstance(e, BrokenPipeError):
                raise
            raise CliError.from_exception(e) from None

    return wrapper  # type: ignore[return-value]


# --------------------------------------------------------------------------- options


def bootstrap_option(fn: F) -> F:
    """``--bootstrap`` and, for the client's security, ``--command-config FILE``
    (:mod:`logstore.cli_api.security_options`; verbs pass ``security=cli_security()``)."""
    return command_config_option(click.option(
        "--bootstrap", "--bootstrap-server", "--broker-list", "-b", "bootstrap",
        metavar="HOST:PORT",
        default=default_bootstrap,
        show_default="$LOGSTORE_BOOTSTRAP or 127.0.0.1:9392",
        help="Address of a broker (--bootstrap-server, --broker-list and -b are Kafka's spellings).",
    )(fn))


def format_option(*choices: str, default: str = "table") -> Callable[[F], F]:
    names = choices or ("table", "json")

    def decorate(fn: F) -> F:
        return click.option(
            "--format", "output_format",
            type=click.Choice(names), default=default, show_default=True,
            help="table: a readable table; json: JSON for scripts"
            + ("; lines: one value per line" if "lines" in names else "") + ".",
        )(fn)

    return decorate


# --------------------------------------------------------------------------- output


def console() -> Console:
    """A rich console on the current stdout; wide when stdout is not a terminal (pipes)."""
    out = Console(soft_wrap=False, highlight=False)
    if not out.is_terminal:
        out = Console(soft_wrap=False, highlight=False, width=200)
    return out


def print_table(
    title: str | None,
    columns: Sequence[str],
    rows: Iterable[Sequence[Any]],
    *,
    numeric: Iterable[str] = (),
) -> None:
    right = set(numeric)
    table = Table(title=title, title_justify="left", show_lines=False)
    for name in columns:
        table.add_column(name, justify="right" if name in right else "left", overflow="fold")
    for row in rows:
        table.add_row(*("-" if v is None else str(v) for v in row))
    console().print(table)


def print_json(doc: Any, *, lines: bool = False) -> None:
    """One JSON document (indented), or with ``lines`` one compact document per line."""
    if lines:
        click.echo(json.dumps(doc, separators=(",", ":"), ensure_ascii=False))
    else:
        click.echo(json.dumps(doc, indent=2, ensure_ascii=False))
