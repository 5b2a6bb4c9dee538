"""The cluster's metadata in etcd: broker liveness, controller election, topics and partition
states, each change a compare-and-swap (DESIGN.md §4b).

Key layout, under ``/logstore/<cluster_id>/`` (values are the JSON of :mod:`replication.state`):

======================  =====================================  ================================
key                     value                                  lifetime
======================  =====================================  ================================
``brokers/<id>``        :class:`BrokerRegistration`            the broker's lease (its session)
``controller``          ``{"node_id": N, "epoch": E}``         the controller's broker lease
``controller_epoch``    ``E`` (decimal)                        forever; +1 per new controller
``topics/<name>``       :class:`TopicRecord`                   until the topic is deleted
``partitions/<t>/<p>``  :class:`PartitionState`                until the topic is deleted
``shutdown/<id>``       ``{"node_id": N}``                     the broker's lease
``scram/<user>``        SCRAM credentials (salted keys only)   until the user is deleted
``acls``                the ACLs (JSON list, see                forever; replaced whole by CAS
                        ``logstore.broker.security.acl_store``)
======================  =====================================  ================================

Fencing, the point of the layout (Kafka did the same with ZooKeeper znode versions):

* a partition state is only ever written by a transaction that compares its mod revision with
  the revision the writer read (:attr:`PartitionState.revision`); so a leader's ISR change
  (:meth:`MetadataStore.alter_isr`) made on a stale state fails instead of undoing the
  controller's newer decision;
* the controller's writes (:meth:`MetadataStore.write_partition`) also compare
  ``controller_epoch`` with the epoch the controller won and ``controller`` with the value it
  wrote: a controller that lost its session or was replaced writes nothing;
* a broker's registration, its controller key and its shutdown request hang on its lease: when
  the session ends (process death, a pause longer than the session timeout) etcd deletes them
  at one revision, and every watcher sees the broker leave.

Sessions: :meth:`MetadataStore.register_broker` grants a lease of the session timeout and
refreshes it every third of it from a background task. If refreshes fail for longer than the
TTL, or etcd says the lease is gone, the session is lost: ``on_session_lost`` runs (the broker
must stop acting as leader or controller), and the task registers again with a new lease as
soon as etcd answers.

Thread-safety: a :class:`MetadataStore` belongs to one asyncio event loop.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
import math
import time
import urllib.parse
from collections.abc import AsyncIterator, Callable, Mapping, Sequence
from dataclasses import replace

import grpc

from logstore.errors import (
    MetadataStoreError,
    TopicAlreadyExistsError,
    UnknownTopicOrPartitionError,
)
from replication.etcd_client import (
    EtcdClient,
    KeyValue,
    compare_created,
    compare_mod,
    compare_value,
    op_delete,
    op_delete_prefix,
    op_get,
    op_put,
    parse_metadata_url,
)
from replication.state import BrokerRegistration, ClusterView, PartitionState, TopicRecord

__all__ = ["MetadataStore", "parse_metadata_url", "decode_view"]

log = logging.getLogger(__name__)

_RETRY_S = 0.2


def decode_view(prefix: bytes, revision: int, kvs: Sequence[KeyValue]) -> ClusterView:
    """The :class:`ClusterView` that the key-values under ``prefix`` describe (pure)."""
    brokers: dict[int, BrokerRegistration] = {}
    topics: dict[str, TopicRecord] = {}
    partitions: dict[tuple[str, int], PartitionState] = {}
    shutting_down: set[int] = set()
    controller_id, controller_epoch = -1, 0
    for kv in kvs:
        name = kv.key[len(prefix):].decode()
        kind, _, rest = name.partition("/")
        if kind == "brokers":
            brokers[int(rest)] = BrokerRegistration.from_json(kv.value)
        elif kind == "topics":
            topics[rest] = TopicRecord.from_json(kv.value)
        elif kind == "partitions":
            topic, _, p = rest.rpartition("/")
            partitions[(topic, int(p))] = PartitionState.from_json(topic, int(p), kv.value,
                                                                   revision=kv.mod_revision)
        elif kind == "shutdown":
            shutting_down.add(int(rest))
        elif kind == "controller":
            controller_id = int(json.loads(kv.value)["node_id"])
        elif kind == "controller_epoch":
            controller_epoch = int(kv.value)
    return ClusterView(revision, brokers, topics, partitions, controller_id, controller_epoch,
                       frozenset(shutting_down))


class MetadataStore:
    """The etcd-backed metadata of one cluster; create with :meth:`connect`."""

    def __init__(self, client: EtcdClient, cluster_id: str) -> None:
        self._etcd = client
        self.cluster_id = cluster_id
        self._prefix = f"/logstore/{cluster_id}/".encode()
        # The session (set by register_broker).
        self._registration: BrokerRegistration | None = None
        self._lease = 0
        self._ttl_s = 0  # asked for
        self._granted_ttl_s = 0  # what etcd granted (keep-alives and loss detection use it)
        self._session_ok = asyncio.Event()
        self._keepalive: asyncio.Task[None] | None = None
        self._on_session_lost: Callable[[], None] | None = None
        # The controller key this store wrote when it won an election (compared by writes).
        self._controller_value = b""
        self._controller_lease = 0
        self._controller_epoch = 0
        self._closed = False

    @classmethod
    async def connect(cls, endpoints: Sequence[str] | str, *, cluster_id: str = "logstore",
                      timeout_s: float = 5.0, wait_s: float = 0.0,
                      credentials: grpc.ChannelCredentials | None = None) -> MetadataStore:
        """Connect to etcd (``host:port`` strings, or one ``etcd://h:p,h:p`` URL; TLS with
        ``credentials``) and check it answers within ``timeout_s``; ask again until ``wait_s``
        has passed (a broker starting beside an etcd that is starting or slow too), then raise
        :class:`MetadataStoreError`."""
        eps = parse_metadata_url(endpoints) if isinstance(endpoints, str) else list(endpoints)
        deadline = time.monotonic() + wait_s
        while True:
            client = EtcdClient(eps, timeout_s=timeout_s, credentials=credentials)
            try:
                await client.get(b"/logstore/")
                return cls(client, cluster_id)
            except MetadataStoreError as e:
                await client.close()
                if time.monotonic() >= deadline:
                    raise MetadataStoreError(f"cannot reach the metadata store (etcd) at {','.join(eps)} within "
                                             f"{max(wait_s, timeout_s):g} s: is etcd running? ({e})") from e
                log.warning("the metadata store (etcd) at %s does not answer yet (%s); asking again for up to "
                            "%.0f s more", ",".join(eps), e, deadline - time.monotonic())
                await asyncio.sleep(min(_RETRY_S * 5, max(deadline - time.monotonic(), 0.0)))

    async def close(self) -> None:
        """Stop the session's keep-alive (without revoking: see :meth:`deregister`) and close;
        a :meth:`watch_view` still iterating ends."""
        self._closed = True
        await self._stop_keepalive()
        await self._etcd.close()

    def _key(self, *parts: object) -> bytes:
        return self._prefix + "/".join(str(p) for p in parts).encode()

    # ------------------------------------------------------------------ broker sessions

    @property
    def lease_id(self) -> int:
        """The current session's lease (0: not registered, or the session is lost)."""
        return self._lease if self._session_ok.is_set() else 0

    async def register_broker(self, reg: BrokerRegistration, *, session_timeout_ms: int,
                              on_session_lost: Callable[[], None] | None = None) -> None:
        """Register ``reg`` on a new lease and keep the lease alive (see the module docstring).

        Raises :class:`MetadataStoreError` if a live broker at another address holds the same
        node id. An earlier incarnation at the same address (this broker, restarted before its
        old session expired) is replaced at once, so a restart need not wait out the session."""
        if self._keepalive is not None:
            raise RuntimeError(f"node {self._registration and self._registration.node_id} is already registered")
        self._registration = reg
        self._ttl_s = max(1, math.ceil(session_timeout_ms / 1000))
        self._on_session_lost = on_session_lost
        await self._register_once(reg)
        self._keepalive = asyncio.get_running_loop().create_task(
            self._keep_alive(), name=f"etcd-session-{reg.node_id}")

    async def _register_once(self, reg: BrokerRegistration, *, replacing_lease: int = 0) -> None:
        """Put the registration on a new lease. The key may already exist: held by
        ``replacing_lease`` (this store's own lost session), or by an earlier incarnation of this
        broker at the same address (a process restarted before its old session ran out: the old
        one must be dead, or it would hold that address). Either is replaced, by a CAS, and its
        lease revoked, which also drops that session's controller and shutdown keys. A different
        address means another live broker has the id: refused."""
        key = self._key("brokers", reg.node_id)
        lease, granted_ttl_s = await self._etcd.grant_lease(self._ttl_s)
        for _ in range(3):
            result = await self._etcd.txn([compare_created(key, 0)], [op_put(key, reg.to_json(), lease=lease)],
                                          [op_get(key)])
            if result.succeeded:
                break
            holder = result.gets[0][0] if result.gets and result.gets[0] else None
            if holder is None:
                continue  # it vanished in between: try again
            ours = replacing_lease != 0 and holder.lease == replacing_lease
            earlier = not replacing_lease and BrokerRegistration.from_json(holder.value).address == reg.address
            if not (ours or earlier):
                await self._etcd.revoke_lease(lease)
                raise MetadataStoreError(f"node id {reg.node_id} is already registered by a live broker at "
                                         f"{BrokerRegistration.from_json(holder.value).address}")
            replaced = await self._etcd.txn([compare_mod(key, holder.mod_revision)],
                                            [op_put(key, reg.to_json(), lease=lease)])
            if replaced.succeeded:
                if earlier:
                    log.warning("node %d: replacing the registration of an earlier incarnation at %s "
                                "(lease %x)", reg.node_id, reg.address, holder.lease)
                if holder.lease:
                    await self._etcd.revoke_lease(holder.lease)
                break
        else:
            await self._etcd.revoke_lease(lease)
            raise MetadataStoreError(f"node id {reg.node_id}: the registration kept changing under us")
        self._lease, self._granted_ttl_s = lease, granted_ttl_s
        self._session_ok.set()
        log.info("node %d registered at %s (lease %x, ttl %d s)", reg.node_id, reg.address, lease, granted_ttl_s)

    async def _keep_alive(self) -> None:
        assert self._registration is not None
        last_ok = time.monotonic()
        while True:
            ttl_s = self._granted_ttl_s
            await asyncio.sleep(ttl_s / 3)
            if self._session_ok.is_set():
                try:
                    # A keep-alive that takes longer than a period is as good as lost: waiting
                    # longer would only report a lost session later than etcd ends it.
                    ttl = await asyncio.wait_for(self._etcd.keep_alive_once(self._lease), ttl_s / 3)
                except (MetadataStoreError, asyncio.TimeoutError) as e:
                    if time.monotonic() - last_ok <= ttl_s:
                        log.warning("etcd session keep-alive failed (will retry): %s", e)
                        continue
                    ttl = 0
                if ttl > 0:
                    last_ok = time.monotonic()
                    continue
                self._session_ok.clear()
                log.warning("node %d lost its etcd session (lease %x)", self._registration.node_id, self._lease)
                if self._on_session_lost is not None:
                    try:
                        self._on_session_lost()
                    except Exception:
                        log.exception("on_session_lost failed")
            try:
                await self._register_once(self._registration, replacing_lease=self._lease)
                last_ok = time.monotonic()
            except MetadataStoreError as e:
                log.warning("node %d cannot register again yet: %s", self._registration.node_id, e)

    async def _stop_keepalive(self) -> None:
        task, self._keepalive = self._keepalive, None
        if task is not None:
            task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await task

    async def deregister(self) -> None:
        """End the session now: stop refreshing and revoke the lease, so the registration (and a
        controller or shutdown key) vanish at once instead of after the session timeout."""
        await self._stop_keepalive()
        lease, self._lease = self._lease, 0
        self._session_ok.clear()
        if lease:
            await self._etcd.revoke_lease(lease)

    async def request_controlled_shutdown(self, node_id: int) -> None:
        """Ask the controller to move ``node_id``'s leaderships away (the key hangs on the
        session's lease, so it vanishes with the broker)."""
        if not self.lease_id:
            raise MetadataStoreError(f"node {node_id} has no live session to ask for a controlled shutdown")
        await self._etcd.put(self._key("shutdown", node_id), json.dumps({"node_id": node_id}).encode(),
                             lease=self._lease)

    # ------------------------------------------------------------------ topics

    async def create_topic(self, record: TopicRecord, assignment: Mapping[int, Sequence[int]]) -> None:
        """Create the topic and all its partition states in one transaction (leader = first
        replica, ISR = all replicas, epochs 0); :class:`TopicAlreadyExistsError` if it exists.

        etcd limits a transaction's operations (``--max-txn-ops``, 128 by default;
        :class:`EtcdServer` raises it to 10,000), so that bounds a topic's partition count."""
        if sorted(assignment) != list(range(record.partitions)):
            raise ValueError(f"topic {record.name}: assignment covers partitions {sorted(assignment)}, "
                             f"not 0..{record.partitions - 1}")
        key = self._key("topics", record.name)
        ops = [op_put(key, record.to_json())]
        for p, replicas in sorted(assignment.items()):
            if not replicas:
                raise ValueError(f"{record.name}-{p}: no replicas")
            state = PartitionState(record.name, p, tuple(replicas), replicas[0], 0, tuple(replicas), 0)
            ops.append(op_put(self._key("partitions", record.name, p), state.to_json()))
        result = await self._etcd.txn([compare_created(key, 0)], ops)
        if not result.succeeded:
            raise TopicAlreadyExistsError(f"topic {record.name!r} already exists")

    async def add_partitions(self, name: str, assignment: Mapping[int, Sequence[int]]) -> TopicRecord:
        """Add the partitions of ``assignment`` (numbered from the topic's count on) to topic
        ``name``, in one transaction that fails if the topic changed meanwhile."""
        key = self._key("topics", name)
        _, kv = await self._etcd.get(key)
        if kv is None:
            raise UnknownTopicOrPartitionError(f"unknown topic {name!r}")
        record = TopicRecord.from_json(kv.value)
        if sorted(assignment) != list(range(record.partitions, record.partitions + len(assignment))):
            raise ValueError(f"topic {name}: new partitions must follow its {record.partitions}")
        grown = replace(record, partitions=record.partitions + len(assignment))
        ops = [op_put(key, grown.to_json())]
        for p, replicas in sorted(assignment.items()):
            state = PartitionState(name, p, tuple(replicas), replicas[0], 0, tuple(replicas), 0)
            ops.append(op_put(self._key("partitions", name, p), state.to_json()))
        result = await self._etcd.txn([compare_mod(key, kv.mod_revision)], ops)
        if not result.succeeded:
            raise MetadataStoreError(f"topic {name!r} changed while partitions were added; try again")
        return grown

    async def delete_topic(self, name: str) -> None:
        """Delete the topic and its partition states in one transaction."""
        key = self._key("topics", name)
        result = await self._etcd.txn([compare_created(key, 0)], [],
                                      [op_delete(key), op_delete_prefix(self._key("partitions", name, ""))])
        if result.succeeded:  # the compare "absent" held
            raise UnknownTopicOrPartitionError(f"topic {name!r} does not exist")

    async def alter_topic_configs(self, name: str, configs: Mapping[str, str], *,
                                  value_schema: bytes | None = None, schema_from: bytes = b"") -> TopicRecord:
        """Replace the topic's config overrides with ``configs`` and, if ``value_schema`` is
        given, its value schema, which was checked as an evolution of ``schema_from`` (a CAS on
        the topic key, retried when another change raced in; a schema that changed meanwhile
        is an error to retry); returns the new record."""
        key = self._key("topics", name)
        while True:
            _, kv = await self._etcd.get(key)
            if kv is None:
                raise UnknownTopicOrPartitionError(f"topic {name!r} does not exist")
            current = TopicRecord.from_json(kv.value)
            if value_schema is not None and current.value_schema != schema_from:
                raise MetadataStoreError(f"the schema of topic {name!r} changed meanwhile; try again")
            new = replace(current, configs=dict(configs),
                          value_schema=current.value_schema if value_schema is None else value_schema)
            result = await self._etcd.txn([compare_mod(key, kv.mod_revision)], [op_put(key, new.to_json())])
            if result.succeeded:
                return new

    # ------------------------------------------------------------------ views

    async def view(self) -> ClusterView:
        """Everything under the cluster's prefix, read at one revision."""
        revision, kvs = await self._etcd.get_prefix(self._prefix)
        return decode_view(self._prefix, revision, kvs)

    async def watch_view(self) -> AsyncIterator[ClusterView]:
        """The current view, then a new view after every change.

        Changes are coalesced: a burst of events (a broker's session ending deletes several keys
        at once; a controller writes many partitions) yields one view read at a revision that
        includes them all. When the watch breaks (etcd restarted, compaction) the view is read
        again and the watch resumes from it; while etcd is unreachable nothing is yielded (and
        the iterator keeps retrying until the caller stops iterating or the store is closed)."""
        current: ClusterView | None = None
        while not self._closed:
            try:
                view = await self.view()
                if current is None or view.revision != current.revision:
                    current = view
                    yield view
                async for revision in self._etcd.watch_prefix(self._prefix, current.revision + 1):
                    if revision > current.revision:
                        current = await self.view()
                        yield current
            except asyncio.CancelledError:
                # close() cancels the channel's calls; only a cancelled task must see it.
                task = asyncio.current_task()
                if self._closed and task is not None and not getattr(task, "cancelling", lambda: 1)():
                    return
                raise
            except MetadataStoreError as e:
                if self._closed:
                    return
                log.info("metadata watch interrupted, resuming: %s", e)
                await asyncio.sleep(_RETRY_S)

    # ------------------------------------------------------------------ partition states

    async def alter_isr(self, state: PartitionState, isr: tuple[int, ...]) -> PartitionState | None:
        """The leader's ISR change (Kafka's AlterPartition): write ``state.with_isr(isr)`` only if
        the partition is still at ``state.revision``. Returns the written state (with its new
        revision), or None when the partition changed since (e.g. a new leader was elected)."""
        new = state.with_isr(tuple(isr))
        key = self._key("partitions", state.topic, state.partition)
        result = await self._etcd.txn([compare_mod(key, state.revision)], [op_put(key, new.to_json())])
        return replace(new, revision=result.revision) if result.succeeded else None

    async def put_partition(self, new: PartitionState, *, expected_revision: int) -> bool:
        """An administrative change (a reassignment, a leader election asked for by a client):
        write ``new`` only if the partition is still at ``expected_revision``."""
        key = self._key("partitions", new.topic, new.partition)
        result = await self._etcd.txn([compare_mod(key, expected_revision)], [op_put(key, new.to_json())])
        return result.succeeded

    async def write_partition(self, new: PartitionState, *, expected_revision: int,
                              controller_epoch: int) -> bool:
        """The controller's write: succeed only if the partition is still at
        ``expected_revision`` and this store's election at ``controller_epoch`` still holds
        (``controller_epoch`` unchanged and the ``controller`` key still ours)."""
        if controller_epoch != self._controller_epoch or not self._controller_value:
            return False
        key = self._key("partitions", new.topic, new.partition)
        result = await self._etcd.txn(
            [compare_mod(key, expected_revision),
             compare_value(self._key("controller_epoch"), str(controller_epoch).encode()),
             compare_value(self._key("controller"), self._controller_value)],
            [op_put(key, new.to_json())])
        return result.succeeded

    async def allocate_producer_ids(self, count: int) -> int:
        """Reserve ``count`` producer ids for one broker's coordinator; return the first.

        Producer ids must be unique in the cluster (a partition leader tells producers apart by
        them): each broker takes blocks from one counter, ``producer_id_block``, by CAS (Kafka's
        KIP-730 shape)."""
        key = self._key("producer_id_block")
        while True:
            _, kv = await self._etcd.get(key)
            start = int(kv.value) if kv is not None else 0
            result = await self._etcd.txn([compare_mod(key, kv.mod_revision if kv is not None else 0)],
                                          [op_put(key, str(start + count).encode())])
            if result.succeeded:
                return start

    # ------------------------------------------------------------------ controller election

    async def campaign(self, node_id: int) -> int:
        """Become the active controller; return the new controller epoch.

        Waits until no controller key exists (or it is this session's own, from an earlier
        win), then in one transaction creates it on this broker's lease and increments
        ``controller_epoch``. Needs a registered session; while it is lost, waits for it."""
        ckey, ekey = self._key("controller"), self._key("controller_epoch")
        while True:
            await self._session_ok.wait()
            lease = self._lease
            _, epoch_kv = await self._etcd.get(ekey)
            revision, holder = await self._etcd.get(ckey)
            if holder is not None:
                if holder.lease == lease and holder.value == self._controller_value:
                    return self._controller_epoch  # still ours (an earlier win on this lease)
                await self._wait_for_change(ckey, revision)
                continue
            epoch = (int(epoch_kv.value) if epoch_kv else 0) + 1
            value = json.dumps({"node_id": node_id, "epoch": epoch}).encode()
            result = await self._etcd.txn(
                [compare_created(ckey, 0), compare_mod(ekey, epoch_kv.mod_revision if epoch_kv else 0)],
                [op_put(ckey, value, lease=lease), op_put(ekey, str(epoch).encode())])
            if result.succeeded:
                self._controller_value, self._controller_lease, self._controller_epoch = value, lease, epoch
                log.info("node %d is the active controller (epoch %d)", node_id, epoch)
                return epoch

    async def _wait_for_change(self, key: bytes, revision: int) -> None:
        """Return after ``key`` changes past ``revision`` (or after a session's length, to look
        again: a watch can miss nothing, but a broken stream is simpler to retry than to trust)."""
        async def first_change() -> None:
            async for _ in self._etcd.watch_prefix(key, revision + 1):
                return

        with contextlib.suppress(MetadataStoreError, asyncio.TimeoutError):
            await asyncio.wait_for(first_change(), max(self._ttl_s, 1))

    async def resign(self) -> None:
        """Give up the controller role (delete the key if it is still this election's)."""
        value, self._controller_value, self._controller_epoch = self._controller_value, b"", 0
        if value:
            ckey = self._key("controller")
            await self._etcd.txn([compare_value(ckey, value)], [op_delete(ckey)])


    # ------------------------------------------------------------------ SCRAM credentials

    # One key per user, ``scram/<user, percent-encoded>``, holding the JSON of
    # logstore.broker.security.credentials (salted keys, never a password).

    def _scram_key(self, user: str) -> bytes:
        return self._key("scram", urllib.parse.quote(user, safe=""))

    async def scram_credentials(self, user: str) -> tuple[bytes | None, int]:
        """The user's credentials document and its key's mod revision (None, 0: no such user)."""
        _, kv = await self._etcd.get(self._scram_key(user))
        return (None, 0) if kv is None else (kv.value, kv.mod_revision)

    async def put_scram_credentials(self, user: str, value: bytes | None, *, expected_revision: int) -> bool:
        """Replace (``value`` None: delete) the user's document if its key is still at
        ``expected_revision`` (0: absent); False when someone changed it meanwhile."""
        key = self._scram_key(user)
        compare = compare_mod(key, expected_revision) if expected_revision else compare_created(key, 0)
        result = await self._etcd.txn([compare], [op_put(key, value) if value is not None else op_delete(key)])
        return result.succeeded

    async def all_scram_credentials(self) -> dict[str, bytes]:
        """Every user's credentials document, by user name."""
        prefix = self._key("scram", "")
        _, kvs = await self._etcd.get_prefix(prefix)
        return {urllib.parse.unquote(kv.key[len(prefix):].decode()): kv.value for kv in kvs}

    async def shared_secret(self, name: str, value: bytes) -> bytes:
        """The cluster-wide secret ``name``: the stored one, or ``value`` stored now if there is
        none (created once by CAS, so every broker ends up with the same bytes)."""
        key = self._key("secrets", name)
        while True:
            _, kv = await self._etcd.get(key)
            if kv is not None:
                return bytes(kv.value)
            result = await self._etcd.txn([compare_mod(key, 0)], [op_put(key, value)])
            if result.succeeded:
                return value

    # ------------------------------------------------------------------ ACLs

    async def read_acls(self) -> tuple[int, bytes | None]:
        """The ``acls`` key: (its mod revision, 0 if absent; its value or None)."""
        _, kv = await self._etcd.get(self._key("acls"))
        return (kv.mod_revision, kv.value) if kv is not None else (0, None)

    async def write_acls(self, value: bytes, *, expected_revision: int) -> bool:
        """Replace the ``acls`` key if it is still at ``expected_revision`` (0: absent)."""
        key = self._key("acls")
        result = await self._etcd.txn([compare_mod(key, expected_revision)], [op_put(key, value)])
        return result.succeeded

    async def watch_acls(self) -> AsyncIterator[bytes | None]:
        """The ``acls`` value now, then after every change; a broken watch is resumed after a
        fresh read, so no change is missed. Ends when the store is closed."""
        key = self._key("acls")
        while not self._closed:
            try:
                revision, kv = await self._etcd.get(key)
                yield kv.value if kv is not None else None
                async for _ in self._etcd.watch_prefix(key, revision + 1):
                    _, kv = await self._etcd.get(key)
                    yield kv.value if kv is not None else None
            except MetadataStoreError as e:
                if self._closed:
                    return
                log.info("ACL watch interrupted, resuming: %s", e)
                await asyncio.sleep(_RETRY_S)
