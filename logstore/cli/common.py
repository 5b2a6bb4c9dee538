"""What the ``logstore`` CLI verbs share: options, errors, output and value rendering.

The errors, ``--bootstrap``, ``--format`` and the output functions are the plugin API's
(:mod:`logstore.cli_api`, which verbs defined outside the CLI use too); they are named here
as well, so the CLI's verbs import everything they share from this one module.

Conventions every verb follows:

* ``--bootstrap HOST:PORT`` (default :func:`logstore.defaults.default_bootstrap`:
  ``$LOGSTORE_BOOTSTRAP`` or ``127.0.0.1:9392``), also spelled as Kafka's tools do,
  ``--bootstrap-server`` and ``-b``; a malformed address is the one line
  ``error: [INVALID_BOOTSTRAP] ...`` (see :mod:`logstore.client.bootstrap`).
* A verb that works on one topic takes it as the argument ``TOPIC`` or, as
  Kafka's tools, ``--topic TOPIC`` (:func:`topic_argument`).
* Exit code 0 on success. On failure, exactly one line on stderr,
  ``error: [CODE] message``, and a non-zero exit code; never a traceback.
  :func:`cli_errors` turns :class:`~logstore.errors.LogstoreError` and
  :class:`OSError` into that line; :class:`CliError` is the exception a verb
  raises itself.
* ``--format table|json`` where the output is tabular: ``table`` is a rich
  table for people, ``json`` one JSON document (or one per line for streams)
  for scripts.

Bytes in JSON output (:func:`jsonable`): UTF-8 text when the bytes decode,
else ``{"base64": "..."}``. Typed values are objects; timestamps and dates
are ISO-8601 strings, decimals strings.

Thread-safety: pure helpers, except :func:`configure_logging` (process-wide).
"""

from __future__ import annotations

import base64
import datetime as dt
import decimal
import functools
import logging
import math
from collections.abc import Callable, Iterable, Mapping
from typing import Any, TypeVar

import click

from logstore.cli_api import (
    CliError,
    bootstrap_option,
    cli_errors,
    cli_security,
    console,
    format_option,
    print_json,
    print_table,
)
from logstore.errors import InvalidConfigError
from logstore.log_limits import RepeatedMessageFilter

__all__ = [
    "CliError",
    "cli_errors",
    "bootstrap_option",
    "cli_security",
    "topic_argument",
    "format_option",
    "parse_config_pairs",
    "parse_time",
    "jsonable",
    "text_or_base64",
    "iso_ms",
    "console",
    "print_table",
    "print_json",
    "configure_logging",
]

F = TypeVar("F", bound=Callable[..., Any])


# --------------------------------------------------------------------------- options


def topic_argument(dest: str = "topic") -> Callable[[F], F]:
    """The topic of a verb as the argument ``TOPIC`` or the option ``--topic TOPIC`` (Kafka's
    tools spell it that way): one of them, or both naming the same topic. The command receives
    it as ``dest``; neither, or two different names, is a usage error."""

    def decorate(fn: F) -> F:
        @functools.wraps(fn)
        def wrapper(*args: Any, **kwargs: Any) -> Any:
            positional = kwargs.pop("topic_argument")
            option = kwargs.pop("topic_option")
            if positional is not None and option is not None and positional != option:
                raise click.UsageError(f"give the topic once: {positional!r} or --topic {option!r}")
            name = positional if positional is not None else option
            if name is None:
                raise click.UsageError("missing the topic: give it as TOPIC or --topic TOPIC")
            kwargs[dest] = name
            return fn(*args, **kwargs)

        with_option = click.option("--topic", "topic_option", metavar="TOPIC", default=None,
                                   help="The topic (the same as the TOPIC argument; Kafka's spelling).")(wrapper)
        return click.argument("topic_argument", metavar="[TOPIC]", required=False)(with_option)  # type: ignore[return-value]

    return decorate


def parse_config_pairs(pairs: Iterable[str], *, option: str = "--config") -> dict[str, str]:
    """``["k=v", ...]`` → ``{k: v}``; a pair without ``=`` or with an empty key is an
    :class:`InvalidConfigError` naming it (unknown keys are the broker's to reject)."""
    out: dict[str, str] = {}
    for pair in pairs:
        key, sep, value = pair.partition("=")
        key = key.strip()
        if not sep or not key:
            raise InvalidConfigError(f"{option} {pair!r} is not key=value (e.g. retention.ms=3600000)")
        out[key] = value.strip()
    return out


def parse_time(text: str) -> str | int:
    """``earliest``/``latest``, milliseconds since the epoch, or ISO-8601 → ``"earliest"``,
    ``"latest"`` or ms. A time without a UTC offset is UTC. Raises ValueError."""
    spec = text.strip()
    if spec.lower() in ("earliest", "latest"):
        return spec.lower()
    if spec.isdigit():
        return int(spec)
    iso = spec[:-1] + "+00:00" if spec.endswith(("Z", "z")) else spec
    try:
        when = dt.datetime.fromisoformat(iso)
    except ValueError:
        raise ValueError(
            f"{text!r} is not earliest, latest, milliseconds since the epoch or an ISO-8601 time "
            "(e.g. 2024-05-01T12:00:00Z)"
        ) from None
    if when.tzinfo is None:
        when = when.replace(tzinfo=dt.timezone.utc)
    ms = int(when.timestamp() * 1000)
    if ms < 0:
        raise ValueError(f"{text!r} is before 1970-01-01")
    return ms


# --------------------------------------------------------------------------- values


def iso_ms(timestamp_ms: int) -> str:
    """``2024-05-01T12:00:00.123Z`` (UTC, milliseconds)."""
    when = dt.datetime.fromtimestamp(timestamp_ms / 1000, tz=dt.timezone.utc)
    return when.strftime("%Y-%m-%dT%H:%M:%S.") + f"{timestamp_ms % 1000:03d}Z"


def text_or_base64(data: bytes) -> str | dict[str, str]:
    """UTF-8 text when ``data`` decodes, else ``{"base64": ...}``."""
    try:
        return data.decode("utf-8")
    except UnicodeDecodeError:
        return {"base64": base64.b64encode(data).decode("ascii")}


def jsonable(value: Any) -> Any:
    """A JSON-serializable form of a decoded record value (see the module docstring)."""
    if value is None or isinstance(value, (str, bool, int)):
        return value
    if isinstance(value, float):
        return value if math.isfinite(value) else str(value)
    if isinstance(value, (bytes, bytearray, memoryview)):
        return text_or_base64(bytes(value))
    if isinstance(value, Mapping):
        return {str(k): jsonable(v) for k, v in value.items()}
    if isinstance(value, dt.datetime):
        return value.isoformat().replace("+00:00", "Z")
    if isinstance(value, (dt.date, dt.time)):
        return value.isoformat()
    if isinstance(value, dt.timedelta):
        return value.total_seconds()
    if isinstance(value, decimal.Decimal):
        return str(value)
    if isinstance(value, (list, tuple)):
        # Arrow maps come back as lists of (key, value) pairs.
        return [jsonable(v) for v in value]
    return str(value)


# --------------------------------------------------------------------------- output


# --------------------------------------------------------------------------- logging


class _EchoHandler(logging.Handler):
    """Writes ``warning: message`` to whatever ``sys.stderr`` is at the time (tests swap it)."""

    def emit(self, record: logging.LogRecord) -> None:
        try:
            click.echo(f"{record.levelname.lower()}: {record.getMessage()}", err=True)
        except Exception:  # noqa: BLE001 - logging must never raise
            self.handleError(record)


_configured = False


def configure_logging() -> None:
    """Client warnings (retries while a broker is away) as short stderr lines, rate-limited.

    Does nothing when the root logger already has handlers (an embedding
    program configured logging) or when called before.
    """
    global _configured
    if _configured or logging.getLogger().handlers:
        return
    _configured = True
    handler = _EchoHandler()
    # One line per logger every 5 s (retry loops warn often); the next says how many were dropped.
    handler.addFilter(RepeatedMessageFilter(burst=1, interval_s=5.0, min_level=logging.NOTSET, by="logger"))
    logger = logging.getLogger("logstore")
    logger.addHandler(handler)
    logger.setLevel(logging.WARNING)
    logger.propagate = False
