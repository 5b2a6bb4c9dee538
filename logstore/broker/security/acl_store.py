"""Where the ACLs live: where the cluster metadata lives (issue 12).

* A single broker: ``<data_dir>/meta/acls.json``, a JSON list of bindings
  (:meth:`~logstore.broker.security.acls.AclBinding.to_dict`), replaced whole
  by :func:`~logstore.storage.fileutil.write_atomically` — after a crash the
  file holds the old set or the new one, never a mix.
* A cluster: one etcd key, ``/logstore/<cluster_id>/acls``, with the same
  JSON, changed by compare-and-swap on its revision
  (:meth:`replication.metadata_store.MetadataStore.update_acls`); every broker
  watches the key and applies a change as soon as etcd reports it (well within
  a second on loopback).

Both stores offer the same two coroutines, :meth:`load` and :meth:`update`
(``change`` maps the current set to the new one and runs again if another
writer won the race). A file or key that is not valid JSON of bindings is an
error naming the path: the broker must not start with a silently empty (or
half-read) set of ACLs.

Thread-safety: :class:`FileAclStore` serialises its updates with a lock and
does its file work on the caller's I/O pool; :class:`EtcdAclStore` belongs to
the broker's event loop.
"""

from __future__ import annotations

import json
import os
import threading
from collections.abc import AsyncIterator, Awaitable, Callable
from typing import TYPE_CHECKING, Any, Protocol

from logstore.broker.security.acls import AclBinding
from logstore.errors import InvalidConfigError, LogstoreError
from logstore.storage.fileutil import read_text_or, write_atomically

if TYPE_CHECKING:
    from replication.metadata_store import MetadataStore

__all__ = ["AclStore", "EtcdAclStore", "FileAclStore", "decode_acls", "encode_acls", "ACLS_FILE"]

ACLS_FILE = os.path.join("meta", "acls.json")
Change = Callable[[frozenset[AclBinding]], frozenset[AclBinding]]


def encode_acls(acls: frozenset[AclBinding]) -> bytes:
    return json.dumps([a.to_dict() for a in sorted(acls)], indent=1).encode() + b"\n"


def decode_acls(data: bytes | str, where: str) -> frozenset[AclBinding]:
    """The bindings of ``data``; :class:`InvalidConfigError` naming ``where`` if it is not that."""
    if not data or not str(data if isinstance(data, str) else data.decode("utf-8", "replace")).strip():
        return frozenset()
    try:
        items: Any = json.loads(data)
        if not isinstance(items, list):
            raise ValueError("not a JSON list")
        return frozenset(AclBinding.from_dict(d) for d in items)
    except (ValueError, KeyError, TypeError, LogstoreError) as e:
        raise InvalidConfigError(f"the ACLs in {where} cannot be read ({e}); fix or remove it") from None


class AclStore(Protocol):
    async def load(self) -> frozenset[AclBinding]: ...

    async def update(self, change: Change) -> frozenset[AclBinding]: ...


class FileAclStore:
    """The ACLs of a single broker, in ``<data_dir>/meta/acls.json``."""

    def __init__(self, data_dir: str, run_io: Callable[..., Awaitable[Any]]) -> None:
        self.path = os.path.join(data_dir, ACLS_FILE)
        self._run_io = run_io
        self._lock = threading.Lock()

    def _read(self) -> frozenset[AclBinding]:
        return decode_acls(read_text_or(self.path, ""), self.path)

    async def load(self) -> frozenset[AclBinding]:
        acls: frozenset[AclBinding] = await self._run_io(self._read)
        return acls

    async def update(self, change: Change) -> frozenset[AclBinding]:
        def apply() -> frozenset[AclBinding]:
            with self._lock:
                old = self._read()
                new = change(old)
                if new != old:
                    os.makedirs(os.path.dirname(self.path), exist_ok=True)
                    write_atomically(self.path, encode_acls(new))
                return new
        acls: frozenset[AclBinding] = await self._run_io(apply)
        return acls


class EtcdAclStore:
    """The ACLs of a cluster, in one etcd key (see the module docstring)."""

    def __init__(self, store: MetadataStore) -> None:
        self._store = store

    async def load(self) -> frozenset[AclBinding]:
        _, value = await self._store.read_acls()
        return decode_acls(value or b"", "etcd key 'acls'")

    async def update(self, change: Change) -> frozenset[AclBinding]:
        while True:
            revision, value = await self._store.read_acls()
            old = decode_acls(value or b"", "etcd key 'acls'")
            new = change(old)
            if new == old or await self._store.write_acls(encode_acls(new), expected_revision=revision):
                return new

    async def watch(self) -> AsyncIterator[frozenset[AclBinding]]:
        """The current set, then the set after every change (a broken watch is resumed)."""
        async for value in self._store.watch_acls():
            yield decode_acls(value or b"", "etcd key 'acls'")  # unreadable: raises (the caller keeps its set)
