"""SCRAM-SHA-256 and SCRAM-SHA-512 (RFC 5802, RFC 7677): the math both sides share.

Pure functions and one small client state machine; no I/O. The broker's
handlers (:mod:`logstore.broker.security.scram_service`) and the client's
login (:mod:`logstore.client.sasl`) are built on them.

The exchange, as Kafka runs it (no channel binding: the GS2 header is ``n,,``)::

    client-first   n,,n=<user>,r=<client nonce>
    server-first   r=<client nonce><server nonce>,s=<base64 salt>,i=<iterations>
    client-final   c=biws,r=<nonce>,p=<base64 ClientProof>
    server-final   v=<base64 ServerSignature>

Keys (``H`` the mechanism's hash, ``HMAC`` keyed with its first argument)::

    SaltedPassword  = Hi(password, salt, i)          # PBKDF2-HMAC-H
    ClientKey       = HMAC(SaltedPassword, "Client Key")
    StoredKey       = H(ClientKey)
    ServerKey       = HMAC(SaltedPassword, "Server Key")
    AuthMessage     = client-first-bare + "," + server-first + "," + client-final-without-proof
    ClientSignature = HMAC(StoredKey, AuthMessage);  ClientProof = ClientKey XOR ClientSignature
    ServerSignature = HMAC(ServerKey, AuthMessage)

A broker stores only (salt, iterations, StoredKey, ServerKey): enough to check a
proof and to prove itself, never enough to log in as the user. Passwords are
encoded as UTF-8 without SASLprep, as Kafka's clients do. User names are escaped
in messages (``,`` → ``=2C``, ``=`` → ``=3D``). Every comparison of secrets is
constant-time (:func:`hmac.compare_digest`).

Malformed messages raise :class:`~logstore.errors.SaslAuthenticationError`
(the wire code SASL_AUTHENTICATION_FAILED), a wrong mechanism
:class:`~logstore.errors.UnsupportedSaslMechanismError`.

Thread-safety: pure functions; a :class:`ScramClient` belongs to one exchange.
"""

from __future__ import annotations

import base64
import binascii
import hashlib
import hmac
import secrets
from dataclasses import dataclass, field

from logstore.errors import SaslAuthenticationError, UnsupportedSaslMechanismError

__all__ = [
    "MECHANISMS",
    "MIN_ITERATIONS",
    "MAX_ITERATIONS",
    "ScramClient",
    "ScramCredential",
    "ClientFirst",
    "check_mechanism",
    "client_final_without_proof",
    "client_proof",
    "escape_username",
    "make_credential",
    "make_nonce",
    "parse_client_final",
    "parse_client_first",
    "parse_server_first",
    "salted_password",
    "server_first_message",
    "server_signature",
    "unescape_username",
    "verify_client_proof",
]

# Mechanism name -> hashlib name.
MECHANISMS: dict[str, str] = {"SCRAM-SHA-256": "sha256", "SCRAM-SHA-512": "sha512"}
# Kafka's bounds on a credential's iteration count (ScramMechanism.minIterations; the controller's cap).
MIN_ITERATIONS = 4096
MAX_ITERATIONS = 16384
GS2_HEADER = "n,,"  # no channel binding, no authorization identity
_NONCE_BYTES = 24
_MAX_MESSAGE_CHARS = 4096  # any real message is far shorter; bounds the work on hostile input


def check_mechanism(mechanism: str) -> str:
    """The hashlib name of ``mechanism``, or :class:`UnsupportedSaslMechanismError`."""
    try:
        return MECHANISMS[mechanism]
    except KeyError:
        raise UnsupportedSaslMechanismError(
            f"SASL mechanism {mechanism!r} is not supported; use one of {', '.join(MECHANISMS)}"
        ) from None


def make_nonce() -> str:
    """A fresh nonce: 24 random bytes as URL-safe base64 (printable, no ``,``)."""
    return secrets.token_urlsafe(_NONCE_BYTES)


def salted_password(mechanism: str, password: str, salt: bytes, iterations: int) -> bytes:
    """``Hi(password, salt, iterations)``: PBKDF2-HMAC with the mechanism's hash."""
    return hashlib.pbkdf2_hmac(check_mechanism(mechanism), password.encode("utf-8"), salt, iterations)


def _hmac(mechanism: str, key: bytes, message: bytes) -> bytes:
    return hmac.new(key, message, MECHANISMS[mechanism]).digest()


def _hash(mechanism: str, data: bytes) -> bytes:
    return hashlib.new(MECHANISMS[mechanism], data).digest()


@dataclass(frozen=True)
class ScramCredential:
    """What a broker keeps of one user's password for one mechanism (never the password)."""

    mechanism: str
    salt: bytes = field(repr=False)
    iterations: int
    stored_key: bytes = field(repr=False)
    server_key: bytes = field(repr=False)

    @classmethod
    def from_salted_password(cls, mechanism: str, salt: bytes, iterations: int, salted: bytes) -> ScramCredential:
        """The credential of ``salted`` = Hi(password, salt, iterations) (what a client sends)."""
        check_mechanism(mechanism)
        client_key = _hmac(mechanism, salted, b"Client Key")
        return cls(mechanism, salt, iterations, _hash(mechanism, client_key), _hmac(mechanism, salted, b"Server Key"))


def make_credential(mechanism: str, password: str, *, iterations: int = MIN_ITERATIONS,
                    salt: bytes | None = None) -> ScramCredential:
    """A new credential for ``password`` with a random 32-byte salt (unless given)."""
    salt = secrets.token_bytes(32) if salt is None else salt
    return ScramCredential.from_salted_password(
        mechanism, salt, iterations, salted_password(mechanism, password, salt, iterations))


def escape_username(name: str) -> str:
    """RFC 5802 ``saslname``: ``=`` → ``=3D``, ``,`` → ``=2C``."""
    return name.replace("=", "=3D").replace(",", "=2C")


def unescape_username(saslname: str) -> str:
    """The inverse of :func:`escape_username`; any other ``=`` sequence is malformed."""
    out, i = [], 0
    while i < len(saslname):
        ch = saslname[i]
        if ch == "=":
            code = saslname[i + 1:i + 3]
            if code == "3D":
                out.append("=")
            elif code == "2C":
                out.append(",")
            else:
                raise SaslAuthenticationError("malformed SCRAM message: bad escape in the user name")
            i += 3
        elif ch == ",":
            raise SaslAuthenticationError("malformed SCRAM message: unescaped ',' in the user name")
        else:
            out.append(ch)
            i += 1
    return "".join(out)


def _attributes(message: str, expected: str) -> dict[str, str]:
    """``k=v,k=v`` as a dict; the keys must be exactly ``expected``, in order (RFC 5802's
    optional extensions are refused: none is defined for our use)."""
    if len(message) > _MAX_MESSAGE_CHARS:
        raise SaslAuthenticationError("malformed SCRAM message: too long")
    parts = message.split(",")
    keys = [p[:2] for p in parts]
    if keys != [k + "=" for k in expected]:
        raise SaslAuthenticationError(f"malformed SCRAM message: expected attributes {','.join(expected)}")
    return {p[0]: p[2:] for p in parts}


def _b64decode(text: str, what: str) -> bytes:
    try:
        return base64.b64decode(text.encode("ascii"), validate=True)
    except (binascii.Error, UnicodeEncodeError):
        raise SaslAuthenticationError(f"malformed SCRAM message: {what} is not base64") from None


def _check_nonce(nonce: str) -> str:
    if not nonce or any(not (0x21 <= ord(c) <= 0x7E) or c == "," for c in nonce):
        raise SaslAuthenticationError("malformed SCRAM message: the nonce must be printable ASCII without ','")
    return nonce


# ------------------------------------------------------------------ the server's side


@dataclass(frozen=True)
class ClientFirst:
    """A parsed client-first-message: the user, the client's nonce and the bare part."""

    user: str
    nonce: str
    bare: str


def parse_client_first(message: str) -> ClientFirst:
    """Parse ``n,,n=<user>,r=<nonce>`` (``y,,`` accepted too: the client supports channel binding
    but thinks we do not; ``p=`` and an authorization identity are refused)."""
    if len(message) > _MAX_MESSAGE_CHARS:
        raise SaslAuthenticationError("malformed SCRAM message: too long")
    if not message.startswith(("n,,", "y,,")):
        raise SaslAuthenticationError(
            "malformed SCRAM client-first message: it must start with 'n,,' (no channel binding, "
            "no authorization identity)")
    bare = message[3:]
    attrs = _attributes(bare, "nr")
    user = unescape_username(attrs["n"])
    if not user:
        raise SaslAuthenticationError("malformed SCRAM client-first message: empty user name")
    return ClientFirst(user, _check_nonce(attrs["r"]), bare)


def server_first_message(nonce: str, salt: bytes, iterations: int) -> str:
    """``r=<nonce>,s=<salt>,i=<iterations>`` (``nonce`` = client nonce + server nonce)."""
    return f"r={nonce},s={base64.b64encode(salt).decode('ascii')},i={iterations}"


def parse_client_final(message: str, expected_nonce: str) -> tuple[str, bytes]:
    """The client-final-message without its proof, and the proof; checks the channel binding
    (``biws`` = base64 ``n,,``, or ``eSws`` = ``y,,``) and the nonce."""
    attrs = _attributes(message, "crp")
    if attrs["c"] not in ("biws", "eSws"):
        raise SaslAuthenticationError("malformed SCRAM client-final message: unexpected channel binding")
    if not hmac.compare_digest(attrs["r"].encode(), expected_nonce.encode()):
        raise SaslAuthenticationError("SCRAM client-final message: the nonce does not match the exchange")
    without_proof = message[: message.rindex(",p=")]
    return without_proof, _b64decode(attrs["p"], "the proof")


def verify_client_proof(credential: ScramCredential, auth_message: str, proof: bytes) -> bool:
    """Whether ``proof`` shows knowledge of the password behind ``credential`` (constant time)."""
    signature = _hmac(credential.mechanism, credential.stored_key, auth_message.encode("utf-8"))
    if len(proof) != len(signature):
        return False
    client_key = bytes(a ^ b for a, b in zip(proof, signature, strict=True))
    return hmac.compare_digest(_hash(credential.mechanism, client_key), credential.stored_key)


def server_signature(credential: ScramCredential, auth_message: str) -> bytes:
    return _hmac(credential.mechanism, credential.server_key, auth_message.encode("utf-8"))


# ------------------------------------------------------------------ the client's side


def client_final_without_proof(nonce: str) -> str:
    return f"c={base64.b64encode(GS2_HEADER.encode()).decode('ascii')},r={nonce}"


def client_proof(mechanism: str, salted: bytes, auth_message: str) -> bytes:
    client_key = _hmac(mechanism, salted, b"Client Key")
    stored_key = _hash(mechanism, client_key)
    signature = _hmac(mechanism, stored_key, auth_message.encode("utf-8"))
    return bytes(a ^ b for a, b in zip(client_key, signature, strict=True))


def parse_server_first(message: str, client_nonce: str) -> tuple[str, bytes, int]:
    """(nonce, salt, iterations) of a server-first-message; the nonce must extend ours and the
    iterations be within Kafka's bounds (a hostile server could ask for billions)."""
    if message.startswith("e="):
        raise SaslAuthenticationError(f"the broker refused the SCRAM exchange: {message[2:]}")
    attrs = _attributes(message, "rsi")
    nonce = _check_nonce(attrs["r"])
    if not nonce.startswith(client_nonce) or len(nonce) == len(client_nonce):
        raise SaslAuthenticationError("SCRAM server-first message: the nonce does not extend the client's")
    try:
        iterations = int(attrs["i"])
    except ValueError:
        raise SaslAuthenticationError("malformed SCRAM server-first message: bad iteration count") from None
    if not MIN_ITERATIONS <= iterations <= MAX_ITERATIONS:
        raise SaslAuthenticationError(
            f"SCRAM server-first message: {iterations} iterations is outside {MIN_ITERATIONS}..{MAX_ITERATIONS}")
    return nonce, _b64decode(attrs["s"], "the salt"), iterations


class ScramClient:
    """One client exchange: :meth:`first`, then :meth:`final` with the server's first message,
    then :meth:`verify` with its final message (which proves the broker knew the credential)."""

    def __init__(self, mechanism: str, user: str, password: str, *, nonce: str | None = None) -> None:
        check_mechanism(mechanism)
        self.mechanism = mechanism
        self.user = user
        self._password = password
        self._nonce = _check_nonce(nonce) if nonce is not None else make_nonce()
        self._bare = f"n={escape_username(user)},r={self._nonce}"
        self._auth_message: str | None = None
        self._salted: bytes | None = None

    def __repr__(self) -> str:
        return f"ScramClient({self.mechanism!r}, {self.user!r})"

    def first(self) -> str:
        return GS2_HEADER + self._bare

    def final(self, server_first: str) -> str:
        nonce, salt, iterations = parse_server_first(server_first, self._nonce)
        self._salted = salted_password(self.mechanism, self._password, salt, iterations)
        without_proof = client_final_without_proof(nonce)
        self._auth_message = f"{self._bare},{server_first},{without_proof}"
        proof = client_proof(self.mechanism, self._salted, self._auth_message)
        return f"{without_proof},p={base64.b64encode(proof).decode('ascii')}"

    def verify(self, server_final: str) -> None:
        """Check the broker's signature; raise :class:`SaslAuthenticationError` when it is wrong."""
        if self._auth_message is None or self._salted is None:
            raise SaslAuthenticationError("SCRAM: verify() before final()")
        if server_final.startswith("e="):
            raise SaslAuthenticationError(f"the broker refused the SCRAM exchange: {server_final[2:]}")
        attrs = _attributes(server_final, "v")
        expected = _hmac(self.mechanism, _hmac(self.mechanism, self._salted, b"Server Key"),
                         self._auth_message.encode("utf-8"))
        if not hmac.compare_digest(_b64decode(attrs["v"], "the server signature"), expected):
            raise SaslAuthenticationError("the broker's SCRAM signature is wrong: it does not know the credential")
