"""Idempotent producer ids bound to the principal they were issued to (issue 22).

A producer id is not a credential (issue 12), yet anyone who reads a topic sees
the producer ids in its batch headers, and ids counted up from 0 are guessable.
With the authorizer on, an idempotent producer id is therefore *bound*: it
carries a MAC over the principal it was issued to, so any broker can tell, with
no table and after any restart or fail-over, whether a caller may produce with
it (the layout is :mod:`logstore.producer_id_layout`, which storage reads too)::

    bit 63      0 (ids are non-negative int64)
    bit 62      1: a bound id
    bits 30-61  the counter the coordinator allocated (32 bits, never reused)
    bits 0-29   HMAC-SHA256(key, "idempotent" NUL principal NUL counter as 8 bytes), first 30 bits

Why a MAC and not a persisted map: a map would have to follow every partition's
leadership (followers copy batch bytes, which name no principal) and would
grow with every InitProducerId (100k calls pushed the victim out of the old
in-memory table). A bound id needs only one key per cluster: on a single broker
``<data_dir>/meta/producer-id-key`` (created on first start, mode 0600), on a
cluster one etcd key created by CAS, so every broker checks with the same key.
Guessing the 30 MAC bits of another principal's counter takes ~10^9 refused
produces; reading someone's id from a fetch does not help, because the MAC is
over *their* principal.

Transactional ids' producer ids stay plain counters (below 2^62): they act for
their transactional id, whoever holds WRITE on it, and the coordinator knows
which id is whose. A non-transactional batch must carry an id bound to the
caller, so a transactional producer's id (or a plain one from before this
scheme) cannot be used outside its transactional id; a transactional batch must
not carry a bound id.

For a floor of ids in use (the producer-id block after a lost
``meta/producer-id-block``), count :func:`counter_of` of every id seen, not the
id itself.

Thread-safety: :class:`ProducerIdBinder` is immutable after construction.
"""

from __future__ import annotations

import hashlib
import hmac
import os
import secrets
from dataclasses import dataclass

from logstore.errors import InvalidConfigError
from logstore.producer_id_layout import BOUND_BIT, COUNTER_BITS, MAC_BITS, counter_of, is_bound

__all__ = ["BOUND_BIT", "KEY_FILE", "ProducerIdBinder", "counter_of", "is_bound", "load_or_create_key"]

_MAC_MASK = (1 << MAC_BITS) - 1
_COUNTER_MASK = (1 << COUNTER_BITS) - 1
KEY_FILE = "producer-id-key"
_KEY_BYTES = 32


@dataclass(frozen=True, slots=True)
class ProducerIdBinder:
    """Binds counters to principals and checks bound ids, with one cluster-wide ``key``."""

    key: bytes

    def _mac(self, counter: int, principal: str) -> int:
        message = b"idempotent\0" + principal.encode("utf-8", "surrogatepass") + b"\0" + counter.to_bytes(8, "big")
        return int.from_bytes(hmac.new(self.key, message, hashlib.sha256).digest()[:4], "big") & _MAC_MASK

    def bind(self, counter: int, principal: str) -> int:
        """The id to hand ``principal`` for the allocator's ``counter``."""
        if not 0 <= counter <= _COUNTER_MASK:
            raise ValueError(f"producer id counter {counter} does not fit {COUNTER_BITS} bits")
        return BOUND_BIT | (counter << MAC_BITS) | self._mac(counter, principal)

    def issued_to(self, producer_id: int, principal: str) -> bool:
        """Whether ``producer_id`` was bound to ``principal`` (with this key)."""
        if not is_bound(producer_id):
            return False
        counter = (producer_id >> MAC_BITS) & _COUNTER_MASK
        return hmac.compare_digest((producer_id & _MAC_MASK).to_bytes(4, "big"),
                                   self._mac(counter, principal).to_bytes(4, "big"))


def load_or_create_key(meta_dir: str) -> bytes:
    """A single broker's key: ``<meta_dir>/producer-id-key`` (hex), created on first use
    (written to a temporary file, fsynced, renamed; readable by the owner only)."""
    path = os.path.join(meta_dir, KEY_FILE)
    try:
        with open(path, encoding="ascii") as f:
            text = f.read().strip()
    except FileNotFoundError:
        text = ""
    except (OSError, UnicodeDecodeError) as e:
        raise InvalidConfigError(f"cannot read the producer id key {path}: {e}") from e
    if text:
        try:
            key = bytes.fromhex(text)
        except ValueError:
            key = b""
        if len(key) != _KEY_BYTES:
            raise InvalidConfigError(
                f"the producer id key {path} is damaged (expected {_KEY_BYTES * 2} hex digits); restore it "
                "from a backup, or delete it to make a new one (idempotent producers then start again)")
        return key
    key = secrets.token_bytes(_KEY_BYTES)
    os.makedirs(meta_dir, exist_ok=True)
    tmp = f"{path}.tmp"
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    try:
        os.write(fd, key.hex().encode("ascii"))
        os.fsync(fd)
    finally:
        os.close(fd)
    os.replace(tmp, path)
    dir_fd = os.open(meta_dir, os.O_RDONLY)
    try:
        os.fsync(dir_fd)
    finally:
        os.close(dir_fd)
    return key
