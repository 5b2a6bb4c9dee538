"""SCRAM user credentials as the admin client sees them (Kafka's Admin API names).

* :class:`UserScramCredentialUpsertion` — create or replace a user's credential for one
  mechanism. The password is salted and hashed here, on the client
  (:meth:`~UserScramCredentialUpsertion.salted`: a random 32-byte salt,
  ``Hi(password, salt, iterations)``), as Kafka's ``AlterUserScramCredentials`` does:
  the broker never sees the password. Its ``repr`` hides the password.
* :class:`UserScramCredentialDeletion` — delete a user's credential for one mechanism
  (the broker then ends the user's sessions).
* :class:`UserScramCredentialsDescription` — a user's mechanisms and iteration counts
  (never a key or a salt).

Thread-safety: immutable values.
"""

from __future__ import annotations

import secrets
from dataclasses import dataclass, field

from logstore.scram import MIN_ITERATIONS, check_mechanism, salted_password

__all__ = [
    "ScramCredentialInfo",
    "UserScramCredentialDeletion",
    "UserScramCredentialUpsertion",
    "UserScramCredentialsDescription",
]

DEFAULT_MECHANISM = "SCRAM-SHA-256"
SALT_BYTES = 32


@dataclass(frozen=True)
class ScramCredentialInfo:
    """One mechanism of a user's credentials and its iteration count."""

    mechanism: str
    iterations: int


@dataclass(frozen=True)
class UserScramCredentialUpsertion:
    """Create or replace ``user``'s ``mechanism`` credential for ``password`` (see the module docstring)."""

    user: str
    password: str = field(repr=False)
    mechanism: str = DEFAULT_MECHANISM
    iterations: int = MIN_ITERATIONS

    def __post_init__(self) -> None:
        check_mechanism(self.mechanism)

    def salted(self) -> tuple[bytes, bytes]:
        """A fresh random salt and ``Hi(password, salt, iterations)``: what goes on the wire."""
        salt = secrets.token_bytes(SALT_BYTES)
        return salt, salted_password(self.mechanism, self.password, salt, self.iterations)


@dataclass(frozen=True)
class UserScramCredentialDeletion:
    """Delete ``user``'s ``mechanism`` credential."""

    user: str
    mechanism: str = DEFAULT_MECHANISM


@dataclass(frozen=True)
class UserScramCredentialsDescription:
    """A user and the mechanisms it can log in with."""

    user: str
    credentials: tuple[ScramCredentialInfo, ...]
