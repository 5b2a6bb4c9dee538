"""Where a broker keeps SCRAM credentials: salt, iterations, StoredKey and ServerKey per user and
mechanism (:class:`logstore.scram.ScramCredential`), never a password.

* **Single broker**: the file ``<data_dir>/meta/scram-credentials.json`` (mode 0600),
  replaced atomically on every change (:func:`logstore.storage.fileutil.write_atomically`:
  after a crash it holds the old or the new set, never a mix). The data directory's lock
  (:mod:`logstore.storage.dir_lock`) makes the broker its only writer while it runs; with the
  broker stopped, ``logstore users create NAME --data-dir DIR`` writes it offline (the way
  to create the first user, like Kafka's ``kafka-storage format --add-scram``).
* **Cluster** (``metadata`` set): one etcd key per user, ``/logstore/<cluster>/scram/<user>``
  (:meth:`replication.metadata_store.MetadataStore.scram_credentials` and its siblings), each
  change a compare-and-swap on the key's revision; every broker reads it at login time, so a
  user created through one broker authenticates on every other.

Both hold the same JSON document per user::

    {"SCRAM-SHA-256": {"salt": "<base64>", "iterations": 4096,
                       "stored_key": "<base64>", "server_key": "<base64>"}, ...}

and the file is ``{"version": 1, "users": {"<user>": <that document>, ...}}``.

Thread-safety: :class:`FileCredentials` serializes its changes under a lock (the broker calls
it from its I/O pool); :class:`EtcdCredentials` belongs to the broker's event loop.
"""

from __future__ import annotations

import base64
import json
import os
import threading
from collections.abc import Awaitable, Callable, Mapping
from typing import TYPE_CHECKING, Any, Protocol, TypeVar

from logstore.errors import InvalidConfigError, LogstoreError, ResourceNotFoundError, StorageError
from logstore.scram import ScramCredential
from logstore.storage.fileutil import write_atomically

if TYPE_CHECKING:  # a single broker never loads etcd's client
    from replication.metadata_store import MetadataStore

__all__ = ["CREDENTIALS_FILE", "CredentialStore", "EtcdCredentials", "FileCredentials", "LocalCredentials",
           "decode_user", "encode_user"]

CREDENTIALS_FILE = os.path.join("meta", "scram-credentials.json")
_FORMAT_VERSION = 1
_CAS_ATTEMPTS = 20
T = TypeVar("T")

Credentials = dict[str, ScramCredential]  # one user's: mechanism -> credential
Alteration = tuple[list[ScramCredential], list[str]]  # one user's upserts and deleted mechanisms


def encode_user(credentials: Mapping[str, ScramCredential]) -> dict[str, Any]:
    """One user's credentials as the JSON document of the module docstring."""
    return {
        mech: {"salt": _b64(c.salt), "iterations": c.iterations,
               "stored_key": _b64(c.stored_key), "server_key": _b64(c.server_key)}
        for mech, c in sorted(credentials.items())
    }


def decode_user(doc: Mapping[str, Any], *, where: str) -> Credentials:
    """The inverse of :func:`encode_user`; a malformed document is a :class:`StorageError`."""
    try:
        return {
            mech: ScramCredential(mech, base64.b64decode(c["salt"]), int(c["iterations"]),
                                  base64.b64decode(c["stored_key"]), base64.b64decode(c["server_key"]))
            for mech, c in doc.items()
        }
    except (KeyError, TypeError, ValueError, AttributeError) as e:
        raise StorageError(f"SCRAM credentials in {where} are malformed ({type(e).__name__}: {e})") from None


def _b64(data: bytes) -> str:
    return base64.b64encode(data).decode("ascii")


class CredentialStore(Protocol):
    """What the broker's SCRAM handlers need of a store (async: the cluster's is etcd)."""

    async def get(self, user: str) -> Credentials:
        """The user's credentials by mechanism (empty: no such user)."""
        ...

    async def alter(self, user: str, upserts: list[ScramCredential], deletions: list[str]) -> Credentials:
        """Apply ``upserts`` and delete the ``deletions`` mechanisms at once; return the new set.
        A deletion of a mechanism the user has not is :class:`ResourceNotFoundError` (nothing changes)."""
        ...

    async def alter_many(self, changes: Mapping[str, Alteration]) -> dict[str, LogstoreError | None]:
        """:meth:`alter` for several users at once (one file write on a single broker); each
        user's outcome (None: applied)."""
        ...

    async def users(self) -> dict[str, Credentials]:
        """Every user's credentials."""
        ...


def _apply(current: Credentials, user: str, upserts: list[ScramCredential], deletions: list[str]) -> Credentials:
    new = dict(current)
    for mech in deletions:
        if mech not in new:
            raise ResourceNotFoundError(f"user {user!r} has no {mech} credential")
        del new[mech]
    for cred in upserts:
        new[cred.mechanism] = cred
    return new


class FileCredentials:
    """The single broker's credentials file (see the module docstring); synchronous."""

    def __init__(self, data_dir: str) -> None:
        self.path = os.path.join(data_dir, CREDENTIALS_FILE)
        self._lock = threading.Lock()
        self._users = self._load()

    def _load(self) -> dict[str, Credentials]:
        try:
            with open(self.path, "rb") as f:
                raw = f.read()
        except FileNotFoundError:
            return {}
        except OSError as e:
            raise StorageError(f"cannot read SCRAM credentials {self.path}: {e.strerror}") from None
        try:
            doc = json.loads(raw)
            if doc.get("version") != _FORMAT_VERSION:
                raise InvalidConfigError(
                    f"SCRAM credentials {self.path} have format version {doc.get('version')!r}; "
                    f"this broker reads version {_FORMAT_VERSION}")
            users = doc["users"]
            return {name: decode_user(creds, where=self.path) for name, creds in users.items()}
        except (ValueError, KeyError, AttributeError, TypeError) as e:
            raise StorageError(f"SCRAM credentials {self.path} are not valid ({type(e).__name__}: {e})") from None

    def get(self, user: str) -> Credentials:
        with self._lock:
            return dict(self._users.get(user, {}))

    def users(self) -> dict[str, Credentials]:
        with self._lock:
            return {u: dict(c) for u, c in self._users.items()}

    def alter(self, user: str, upserts: list[ScramCredential], deletions: list[str]) -> Credentials:
        error = self.alter_many({user: (upserts, deletions)})[user]
        if error is not None:
            raise error
        return self.get(user)

    def alter_many(self, changes: Mapping[str, Alteration]) -> dict[str, LogstoreError | None]:
        """Apply each user's change that is valid, in one atomic write; each user's outcome."""
        with self._lock:
            users = dict(self._users)
            outcome: dict[str, LogstoreError | None] = {}
            for user, (upserts, deletions) in changes.items():
                try:
                    new = _apply(users.get(user, {}), user, upserts, deletions)
                except LogstoreError as e:
                    outcome[user] = e
                    continue
                outcome[user] = None
                if new:
                    users[user] = new
                else:
                    users.pop(user, None)
            if any(e is None for e in outcome.values()):
                self._write(users)
                self._users = users
            return outcome

    def _write(self, users: Mapping[str, Credentials]) -> None:
        doc = {"version": _FORMAT_VERSION, "users": {u: encode_user(c) for u, c in sorted(users.items())}}
        os.makedirs(os.path.dirname(self.path), exist_ok=True)
        old_umask = os.umask(0o077)  # the temp file, and so the file, readable by the owner only
        try:
            write_atomically(self.path, json.dumps(doc, indent=1).encode())
        finally:
            os.umask(old_umask)


class LocalCredentials:
    """:class:`FileCredentials` as a :class:`CredentialStore`: changes run on the broker's I/O
    pool (``run``), reads come from memory."""

    def __init__(self, files: FileCredentials, run: Callable[..., Awaitable[Any]]) -> None:
        self.files = files
        self._run = run

    async def get(self, user: str) -> Credentials:
        return self.files.get(user)

    async def alter(self, user: str, upserts: list[ScramCredential], deletions: list[str]) -> Credentials:
        result: Credentials = await self._run(self.files.alter, user, upserts, deletions)
        return result

    async def alter_many(self, changes: Mapping[str, Alteration]) -> dict[str, LogstoreError | None]:
        result: dict[str, LogstoreError | None] = await self._run(self.files.alter_many, changes)
        return result

    async def users(self) -> dict[str, Credentials]:
        return self.files.users()


class EtcdCredentials:
    """The cluster's credentials in etcd (see the module docstring)."""

    def __init__(self, store: MetadataStore) -> None:
        self._store = store

    async def get(self, user: str) -> Credentials:
        raw, _ = await self._store.scram_credentials(user)
        return {} if raw is None else decode_user(json.loads(raw), where=f"etcd (user {user!r})")

    async def alter(self, user: str, upserts: list[ScramCredential], deletions: list[str]) -> Credentials:
        for _ in range(_CAS_ATTEMPTS):
            raw, revision = await self._store.scram_credentials(user)
            current = {} if raw is None else decode_user(json.loads(raw), where=f"etcd (user {user!r})")
            new = _apply(current, user, upserts, deletions)
            value = json.dumps(encode_user(new)).encode() if new else None
            if await self._store.put_scram_credentials(user, value, expected_revision=revision):
                return new
        raise StorageError(f"SCRAM credentials of {user!r} changed {_CAS_ATTEMPTS} times while being altered; try again")

    async def alter_many(self, changes: Mapping[str, Alteration]) -> dict[str, LogstoreError | None]:
        outcome: dict[str, LogstoreError | None] = {}
        for user, (upserts, deletions) in changes.items():  # one key per user: one CAS each
            try:
                await self.alter(user, upserts, deletions)
                outcome[user] = None
            except LogstoreError as e:
                outcome[user] = e
        return outcome

    async def users(self) -> dict[str, Credentials]:
        found = await self._store.all_scram_credentials()
        return {u: decode_user(json.loads(raw), where=f"etcd (user {u!r})") for u, raw in found.items()}
