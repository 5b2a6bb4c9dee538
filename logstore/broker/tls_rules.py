"""The TLS settings' rules that need no gRPC: principal mapping rules, PEM files, the plaintext rule.

Kept apart from :mod:`logstore.broker.security.tls` (which builds gRPC credentials and reads
calls' certificates) so that :mod:`logstore.broker.config` can validate a config without the
security package (which itself reads the config):

* :class:`PrincipalMapper` — Kafka's ``ssl.principal.mapping.rules`` applied to a client
  certificate's subject (RFC 2253 order, e.g. ``CN=alice,OU=eng,O=logstore``, as gRPC's auth
  context gives it). Rules are tried in order; the first whose pattern matches the whole
  subject gives the name: ``RULE:^CN=(.*?),OU=(.*?),.*$/$1@$2/L`` (``$n`` groups, optional
  ``L`` lower-case or ``U`` upper-case). ``DEFAULT`` is the certificate's *most specific*
  common name (the issue's ``User:<CN>``; Kafka's default would be the whole subject): the
  CN of the first RDN of the RFC 2253 subject that has one (:func:`most_specific_cn`). So
  ``CN=alice,CN=admin,O=x`` (made from ``/O=x/CN=admin/CN=alice``) is ``alice``, not the
  ``admin`` gRPC's ``x509_common_name`` would give, and ``UID=x+CN=admin,O=x`` is ``admin``
  (the CN of a multi-valued RDN); an RDN with two CNs (``CN=a+CN=b``) is ambiguous and maps
  to nothing (the certificate is refused); a subject without a CN is its own name.
* :func:`rfc2253_subject` — a certificate's subject as Python's :mod:`ssl` gives it (the Kafka
  listener's TLS), written as gRPC's auth context writes it (OpenSSL's RFC 2253 form), so the
  mapping rules give the same principal on both listeners.
* :func:`read_pem` — a PEM file's bytes, or an ``INVALID_CONFIG`` naming the key.
* :func:`check_key_pair` — a certificate and its private key load and belong together, or an
  ``INVALID_CONFIG`` saying which is wrong (gRPC itself only says "Failed to bind").
* :func:`check_listener` — a plaintext listener on a non-loopback address is refused
  (``INVALID_CONFIG``) unless ``allow_plaintext``, which logs a warning instead.

Thread-safety: immutable values and pure functions.
"""

from __future__ import annotations

import ipaddress
import logging
import re
import socket
import ssl
from dataclasses import dataclass

from logstore.errors import InvalidConfigError

__all__ = ["PrincipalMapper", "check_key_pair", "check_listener", "is_loopback", "most_specific_cn", "read_pem",
           "rfc2253_subject"]

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
        """The principal's name (without ``User:``) for a certificate, or None when no rule matches.
        ``common_name`` is used by DEFAULT only for a certificate without a subject string."""
        for rule in self._rules:
            if rule.pattern is None:
                if not subject:
                    return common_name or None
                try:
                    return most_specific_cn(subject) or subject  # no CN at all: the whole subject
                except ValueError:
                    return None  # ambiguous: refused
            m = rule.pattern.fullmatch(subject)
            if m is None:
                continue
            name = m.expand(rule.replacement)
            return name.lower() if rule.case == "L" else name.upper() if rule.case == "U" else name
        return None

    def principal(self, subject: str, common_name: str | None) -> str | None:
        name = self.name_of(subject, common_name)
        return None if not name else f"User:{name}"


def _split_unescaped(text: str, separators: str) -> list[str]:
    parts, current, i = [], [], 0
    while i < len(text):
        c = text[i]
        if c == "\\" and i + 1 < len(text):
            current.append(text[i:i + 2])
            i += 2
            continue
        if c in separators:
            parts.append("".join(current))
            current = []
        else:
            current.append(c)
        i += 1
    parts.append("".join(current))
    return parts


def _unescape(value: str) -> str:
    """An RFC 2253 attribute value without its escapes (``\\,`` and ``\\XX`` hex pairs, UTF-8)."""
    out, i = bytearray(), 0
    while i < len(value):
        c = value[i]
        if c == "\\" and re.fullmatch(r"[0-9a-fA-F]{2}", value[i + 1:i + 3]):
            out.append(int(value[i + 1:i + 3], 16))
            i += 3
        elif c == "\\" and i + 1 < len(value):
            out += value[i + 1].encode()
            i += 2
        else:
            out += c.encode()
            i += 1
    return out.decode("utf-8", "replace")


def most_specific_cn(subject: str) -> str | None:
    """The CN of the first RDN of an RFC 2253 ``subject`` (most specific first) that has a CN,
    or None when none has one. Raises ValueError when that RDN has two (``CN=a+CN=b``)."""
    for rdn in _split_unescaped(subject, ",;"):
        names = [_unescape(ava.split("=", 1)[1].strip()) for ava in _split_unescaped(rdn, "+")
                 if "=" in ava and ava.split("=", 1)[0].strip().upper() in ("CN", "2.5.4.3")]
        if len(names) > 1:
            raise ValueError(f"the RDN {rdn!r} has {len(names)} common names")
        if names:
            return names[0]
    return None


# OpenSSL's short names of the attributes Python's ssl names by their long names (the others:
# as given, which for an attribute without a name is its dotted OID, as OpenSSL writes it too).
_SHORT_NAMES = {
    "commonName": "CN", "countryName": "C", "localityName": "L", "stateOrProvinceName": "ST",
    "organizationName": "O", "organizationalUnitName": "OU", "streetAddress": "street", "domainComponent": "DC",
    "userId": "UID", "surname": "SN", "givenName": "GN", "initials": "initials", "title": "title",
    "serialNumber": "serialNumber", "emailAddress": "emailAddress", "pseudonym": "pseudonym",
    "generationQualifier": "generationQualifier", "dnQualifier": "dnQualifier", "name": "name",
    "businessCategory": "businessCategory", "postalCode": "postalCode",
}


def _escape_2253(value: str) -> str:
    """``value`` escaped as OpenSSL's ``XN_FLAG_RFC2253`` escapes it: the RFC 2253 specials and
    a leading ``#`` or space or trailing space with a backslash, control characters and every
    byte of a non-ASCII character as ``\\XX``."""
    out = []
    for i, c in enumerate(value):
        if c in ',+"\\<>;' or (i == 0 and c in "# ") or (i == len(value) - 1 and c == " "):
            out.append("\\" + c)
        elif ord(c) < 0x20 or ord(c) >= 0x7F:
            out.append("".join(f"\\{b:02X}" for b in c.encode("utf-8")))
        else:
            out.append(c)
    return "".join(out)


def rfc2253_subject(subject: tuple[tuple[tuple[str, str], ...], ...]) -> str:
    """A subject as :meth:`ssl.SSLSocket.getpeercert` gives it (RDNs most general first, each a
    tuple of (long name, value)) in RFC 2253 form: most specific RDN first, ``+`` between the
    values of one RDN, e.g. ``CN=alice,OU=eng,O=logstore`` (what gRPC's auth context says)."""
    return ",".join("+".join(f"{_SHORT_NAMES.get(name, name)}={_escape_2253(value)}" for name, value in rdn)
                    for rdn in reversed(subject))


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


def check_key_pair(cert: str, key: str, *, what: str = "tls_cert/tls_key") -> None:
    """Raise :class:`InvalidConfigError` unless PEM files ``cert`` and ``key`` load and the key is the
    certificate's (checked with the standard library's TLS, as the handshake would)."""
    encrypted = []

    def no_password() -> bytes:
        encrypted.append(True)
        return b""
    try:
        ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER).load_cert_chain(cert, key, password=no_password)
    except ssl.SSLError as e:
        reason = getattr(e, "reason", None) or str(e)
        if reason == "KEY_VALUES_MISMATCH":
            raise InvalidConfigError(
                f"{what}: the private key {key} does not belong to the certificate {cert} (their public keys "
                "differ); give the key the certificate was made for") from None
        if encrypted:
            raise InvalidConfigError(
                f"{what}: the private key {key} is encrypted; give an unencrypted PEM key "
                "(readable by the broker's user only)") from None
        raise InvalidConfigError(f"{what}: cannot load the certificate {cert} with the key {key}: {reason}") from None
    except OSError as e:
        raise InvalidConfigError(f"{what}: cannot read {cert} or {key}: {e.strerror or e}") from None


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
