"""Bootstrap addresses: what ``bootstrap=`` / ``bootstrap_servers=`` / ``--bootstrap`` accept.

A bootstrap is ``"host:port"``; like Kafka's ``bootstrap.servers`` it may also
be a comma-separated string or a list of them (``"b1:9392,b2:9392"``,
``["b1:9392", "b2:9392"]``). Every entry is checked: the host is non-empty
(an IPv6 address in brackets, ``[::1]:9392``) and the port an integer in
1..65535. A client starts with the first entry and moves to the next while
one is unreachable (:mod:`logstore.client.routing`).

A malformed address is an :class:`~logstore.errors.InvalidBootstrapError`
(code ``INVALID_BOOTSTRAP``, also a :class:`ValueError`) raised before
anything is sent, with a message that names the bad entry and the fix:
``localhost`` → "'localhost' has no port: use host:port, e.g. localhost:9392".
The CLI prints it as its usual one line (``error: [INVALID_BOOTSTRAP] ...``).

Thread-safety: pure functions.
"""

from __future__ import annotations

from collections.abc import Sequence

from logstore.defaults import DEFAULT_PORT
from logstore.errors import InvalidBootstrapError

__all__ = ["BootstrapArg", "parse_bootstrap", "parse_bootstrap_list", "resolve_bootstrap"]

# What the clients accept as a bootstrap (None: $LOGSTORE_BOOTSTRAP or the default).
BootstrapArg = str | Sequence[str] | None


def _entries(value: str | Sequence[str]) -> list[str]:
    if isinstance(value, str):
        return [e.strip() for e in value.split(",")]
    if isinstance(value, (bytes, bytearray)) or not isinstance(value, Sequence):
        raise InvalidBootstrapError(
            f"bootstrap must be 'host:port' or a list of them, got {type(value).__name__} {value!r}"
        )
    out: list[str] = []
    for item in value:
        if not isinstance(item, str):
            raise InvalidBootstrapError(f"bootstrap entries must be 'host:port' strings, got {item!r}")
        out.append(item.strip())
    return out


def _check_entry(entry: str) -> str:
    example = f"e.g. localhost:{DEFAULT_PORT}"
    if not entry:
        raise InvalidBootstrapError(f"bootstrap has an empty address: use host:port, {example}")
    if "://" in entry:
        raise InvalidBootstrapError(f"bootstrap {entry!r} has a scheme: use host:port without it, {example}")
    if entry.startswith("["):  # [IPv6]:port
        close = entry.find("]")
        host, rest = entry[1:close], entry[close + 1:] if close > 0 else ""
        if close < 0 or not rest.startswith(":"):
            raise InvalidBootstrapError(f"bootstrap {entry!r} has no port: use [address]:port, e.g. [::1]:{DEFAULT_PORT}")
        port_text = rest[1:]
    else:
        host, sep, port_text = entry.rpartition(":")
        if not sep:
            raise InvalidBootstrapError(f"bootstrap {entry!r} has no port: use host:port, e.g. {entry}:{DEFAULT_PORT}")
        if ":" in host:
            raise InvalidBootstrapError(
                f"bootstrap {entry!r}: write an IPv6 address in brackets, e.g. [::1]:{DEFAULT_PORT}"
            )
    if not host:
        raise InvalidBootstrapError(f"bootstrap {entry!r} has no host: use host:port, {example}")
    if not port_text.isdigit() or not 1 <= int(port_text) <= 65535:
        raise InvalidBootstrapError(
            f"bootstrap {entry!r}: the port {port_text!r} is not a number in 1..65535 ({example})"
        )
    return entry


def parse_bootstrap_list(value: str | Sequence[str]) -> list[str]:
    """Every entry of ``value``, checked. Raises :class:`InvalidBootstrapError` naming the first bad one."""
    entries = _entries(value)
    if not entries or entries == [""]:
        raise InvalidBootstrapError(f"bootstrap is empty: use host:port, e.g. localhost:{DEFAULT_PORT}")
    for entry in entries:
        _check_entry(entry)
    return entries


def parse_bootstrap(value: str | Sequence[str]) -> str:
    """The first address of ``value`` after checking every entry (:func:`parse_bootstrap_list`)."""
    return parse_bootstrap_list(value)[0]


def resolve_bootstrap(bootstrap: BootstrapArg, bootstrap_servers: BootstrapArg) -> BootstrapArg:
    """Merge a client's first argument and its kafka-python synonym ``bootstrap_servers``.

    Either may be given (or neither: the default applies later); both at once is an
    :class:`InvalidBootstrapError` unless they name the same addresses.
    """
    if bootstrap_servers is None:
        return bootstrap
    if bootstrap is not None and _entries(bootstrap) != _entries(bootstrap_servers):
        raise InvalidBootstrapError(
            f"give bootstrap or bootstrap_servers, not both ({bootstrap!r} vs {bootstrap_servers!r})"
        )
    return bootstrap_servers
