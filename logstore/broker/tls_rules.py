"""The TLS settings' rules that need no gRPC: principal mapping rules, PEM files, the plaintext rule.

Kept apart from :mod:`logstore.broker.security.tls` (which builds gRPC credentials and reads
calls' certificates) so that :mod:`logstore.broker.config` can validate a config without the
security package (which itself reads the config):

* :class:`PrincipalMapper` — Kafka's ``ssl.principal.mapping.rules`` applied to a client
  certificate's subject (RFC 2253 order, e.g. ``CN=alice,OU=eng,O=logstore``, as gRPC's auth
  context gives it). Rules are tried in order; the first whose pattern matches the whole
  subject gives the name: ``RULE:^CN=(.*?),OU=(.*?),.*$/$1@$2/L`` (``$n`` groups, optional
  ``L`` lower-case or ``U`` upper-case). ``DEFAULT`` is the certificate's common name (the
  issue's ``User:<CN>``; Kafka's default would be the whole subject).
* :func:`read_pem` — a PEM file's bytes, or an ``INVALID_CONFIG`` naming the key.
* :func:`check_listener` — a plaintext listener on a non-loopback address is refused
  (``INVALID_CONFIG``) unless ``allow_plaintext``, which logs a warning instead.

Thread-safety: immutable values and pure functions.
"""

from __future__ import annotations

import ipaddress
import logging
import re
import socket
from dataclasses import dataclass

from logstore.errors import InvalidConfigError

__all__ = ["PrincipalMapper", "check_listener", "is_loopback", "read_pem"]

log = logging.getLogger("logstore.broker")

# One rule of Kafka's syntax, then a comma or the end. Pattern and replacement may
# contain escaped slashes ("\/"); the pattern's own commas are fine (the rule ends at
# its third slash).
_RULE = re.compile(r"\s*(?:(DEFAULT)|RULE:((?:\\.|[^\\/])*)/((?:\\.|[^\\/])*)/([LU]?))\s*(?:,|$)")


@dataclass(frozen=True)
class _Rule:
    pattern: re.Pattern[str] | None  # None: DEFAULT
    replacement: str = ""
    case: str = ""


class PrincipalMapper:
    """Kafka's ``ssl.principal.mapping.rules`` (see the module docstring)."""

    def __init__(self, rules: str = "DEFAULT") -> None:
        self.rules_text = rules.strip() or "DEFAULT"
        self._rules: list[_Rule] = []
        pos = 0
        text = self.rules_text
        while pos < len(text):
            m = _RULE.match(text, pos)
            if m is None or m.end() == pos:
                raise InvalidConfigError(
                    f"ssl_principal_mapping_rules: cannot parse {text[pos:]!r} (expected DEFAULT or "
                    "RULE:pattern/replacement/[LU], comma-separated)")
            if m.group(1):
                self._rules.append(_Rule(None))
            else:
                try:
                    pattern = re.compile(m.group(2).replace("\\/", "/"))
                except re.error as e:
                    raise InvalidConfigError(f"ssl_principal_mapping_rules: bad pattern {m.group(2)!r}: {e}") from None
                replacement = re.sub(r"\$(\d+)", r"\\g<\1>", m.group(3).replace("\\/", "/"))
                self._rules.append(_Rule(pattern, replacement, m.group(4)))
            pos = m.end()

    def name_of(self, subject: str, common_name: str | None) -> str | None:
        """The principal's name (without ``User:``) for a certificate, or None when no rule matches."""
        for rule in self._rules:
            if rule.pattern is None:
                return common_name or subject or None
            m = rule.pattern.fullmatch(subject)
            if m is None:
                continue
            name = m.expand(rule.replacement)
            return name.lower() if rule.case == "L" else name.upper() if rule.case == "U" else name
        return None

    def principal(self, subject: str, common_name: str | None) -> str | None:
        name = self.name_of(subject, common_name)
        return None if not name else f"User:{name}"


def read_pem(path: str, what: str) -> bytes:
    """The bytes of a PEM file, or an :class:`InvalidConfigError` naming the config key."""
    try:
        with open(path, "rb") as f:
            data = f.read()
    except OSError as e:
        raise InvalidConfigError(f"{what}: cannot read {path}: {e.strerror}") from None
    if b"-----BEGIN" not in data:
        raise InvalidConfigError(f"{what}: {path} is not a PEM file")
    return data


def is_loopback(host: str) -> bool:
    """Whether ``host`` (an address or a name) is reachable from this machine only."""
    name = host.strip("[]")
    if name in ("localhost", "ip6-localhost"):
        return True
    try:
        return ipaddress.ip_address(name).is_loopback
    except ValueError:
        pass
    try:
        infos = socket.getaddrinfo(name, None)
    except OSError:
        return False
    return bool(infos) and all(ipaddress.ip_address(str(i[4][0]).split("%")[0]).is_loopback for i in infos)


def check_listener(host: str, *, tls: bool, allow_plaintext: bool, warn: bool = True) -> None:
    """Refuse a plaintext listener on a non-loopback ``host`` unless ``allow_plaintext`` (then, with
    ``warn``, log a warning: the broker does when it binds)."""
    if tls or is_loopback(host):
        return
    if not allow_plaintext:
        raise InvalidConfigError(
            f"refusing to listen on {host} in plaintext: anyone on the network could read and write "
            "every topic; give --tls-cert/--tls-key, or --allow-plaintext to accept that")
    if warn:
        log.warning("listening on %s in PLAINTEXT (allow_plaintext): traffic is neither encrypted nor "
                    "authenticated by certificates", host)
