"""The admin client: :class:`Admin` creates, describes, configures and trims topics, and
manages consumer groups (list, describe with lag, reset offsets, delete) and ACLs
(:mod:`logstore.client.acls`).

Every method sends one request and raises the mapped
:class:`~logstore.errors.LogstoreError` when the broker refuses it, e.g.
:class:`TopicAlreadyExistsError`, :class:`UnknownTopicOrPartitionError`,
:class:`InvalidConfigError`, :class:`SchemaMismatchError`. Methods that take
several items act on each independently (no atomicity across topics): if
some fail, the others are still applied and the first failure is raised,
its message prefixed with the item it is about.

Thread-safety: an :class:`Admin` is thread-safe.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence

import pyarrow as pa

from logstore.acl import AclBinding, AclFilter
from logstore.client import acls as acl_calls
from logstore.client import reassignments as reassign_calls
from logstore.client.bootstrap import BootstrapArg, resolve_bootstrap
from logstore.client.client_config import accepts_client_config
from logstore.client.credentials import (
    UserScramCredentialDeletion,
    UserScramCredentialsDescription,
    UserScramCredentialUpsertion,
)
from logstore.client.error_mapping import about, raise_for_errors, unwrap_items
from logstore.client.results import ClusterMetadata, ConfigAlteration, TopicCleaning
from logstore.client.rpc import (
    DEFAULT_REQUEST_TIMEOUT_MS,
    EARLIEST_TIMESTAMP,
    ISOLATION_LEVELS,
    LATEST_TIMESTAMP,
    BrokerClient,
)
from logstore.client.security import ClientSecurity
from logstore.errors import (
    GroupIdNotFoundError,
    InvalidPartitionsError,
    InvalidRequestError,
    LogstoreError,
    NonEmptyGroupError,
    UnknownServerError,
    UnknownTopicOrPartitionError,
)
from logstore.types import (
    GroupDescription,
    GroupListing,
    ListedOffset,
    NewTopic,
    OffsetAndMetadata,
    PartitionLag,
    TopicDescription,
    TopicPartition,
)

__all__ = ["Admin", "OffsetSpec"]

# What list_offsets accepts per partition: "earliest", "latest" or a timestamp in ms.
OffsetSpec = str | int


class Admin:
    """Topic administration against one broker.

    ``bootstrap`` is ``"host:port"`` (default ``$LOGSTORE_BOOTSTRAP`` or
    ``127.0.0.1:9392``; a list or comma-separated string is accepted, see
    :mod:`logstore.client.bootstrap`), or give it as ``bootstrap_servers=``
    (kafka-python's name); every call has the deadline ``request_timeout_ms``. Security:
    kafka-python's ``security_protocol``, ``ssl_*``, ``sasl_*`` keywords (or ``security=``), or
    a confluent-style config dict first (:mod:`logstore.client.client_config`);
    ``client_id`` is what broker quotas know it by (default ``logstore-python-VERSION``).
    Use as a context manager or call :meth:`close`. Thread-safe.
    """

    @accepts_client_config  # a confluent-style dict, kafka-python's security keywords
    def __init__(
        self, bootstrap: BootstrapArg = None, *, bootstrap_servers: BootstrapArg = None,
        request_timeout_ms: int = DEFAULT_REQUEST_TIMEOUT_MS, security: ClientSecurity | None = None,
        client_id: str | None = None,
    ) -> None:
        self._client = BrokerClient(resolve_bootstrap(bootstrap, bootstrap_servers),
                                    request_timeout_ms=request_timeout_ms, security=security,
                                    client_id=client_id)

    @property
    def bootstrap(self) -> str:
        return self._client.bootstrap

    def close(self) -> None:
        self._client.close()

    def __enter__(self) -> Admin:
        return self

    def __exit__(self, *exc_info: object) -> None:
        self.close()

    # ------------------------------------------------------------------ topics

    def create_topics(self, topics: Sequence[NewTopic], *, validate_only: bool = False) -> None:
        """Create ``topics`` (or, with ``validate_only``, only check that they could be).

        Raises e.g. :class:`TopicAlreadyExistsError`, :class:`InvalidTopicError`,
        :class:`InvalidPartitionsError`, :class:`InvalidConfigError`,
        :class:`SchemaMismatchError` (an unusable value schema).
        """
        topics = list(topics)
        for t in topics:
            if not isinstance(t, NewTopic):
                raise TypeError(f"create_topics takes NewTopic objects, got {t!r}")
            if t.value_schema is not None and not isinstance(t.value_schema, pa.Schema):
                raise TypeError(f"value_schema of {t.name!r} must be a pyarrow.Schema")
            # On the wire 0 means "the broker's default count": refuse it here.
            if not isinstance(t.num_partitions, int) or t.num_partitions < 1:
                raise InvalidPartitionsError(
                    f"topic {t.name!r}: num_partitions must be a positive integer, got {t.num_partitions!r}"
                )
        results = self._client.create_topics(topics, validate_only=validate_only)
        raise_for_errors(
            (f"topic {t.name!r}", _result(results, t.name)) for t in topics
        )

    def create_topic(
        self,
        name: str,
        num_partitions: int = 1,
        *,
        configs: Mapping[str, str] | None = None,
        value_schema: pa.Schema | None = None,
    ) -> None:
        """Create one topic; shorthand for ``create_topics([NewTopic(...)])``."""
        self.create_topics([
            NewTopic(name, num_partitions, configs=dict(configs or {}), value_schema=value_schema)
        ])

    def delete_topics(self, names: Iterable[str]) -> None:
        """Delete topics and their data. Raises :class:`UnknownTopicOrPartitionError` for unknown ones
        and :class:`InternalTopicError` for internal ones (``__consumer_offsets``, any ``__`` name)."""
        names = list(names)
        results = self._client.delete_topics(names)
        raise_for_errors((f"topic {n!r}", _result(results, n)) for n in names)

    def create_partitions(self, counts: Mapping[str, int], *, validate_only: bool = False) -> None:
        """Grow topics to new partition counts (``{"orders": 6}``), as Kafka's createPartitions.
        Partitions cannot be removed: a count that does not grow raises
        :class:`InvalidPartitionsError`. Keyed records hash over the new count from then on."""
        results = self._client.create_partitions(counts, validate_only=validate_only)
        raise_for_errors((f"topic {n!r}", _result(results, n)) for n in counts)

    def describe_cluster(self) -> ClusterMetadata:
        """The cluster: its id, the live brokers, the active controller and every topic's partitions
        (leader, replicas, ISR); a single broker is a cluster of one."""
        return self._client.metadata()

    def list_topics(self) -> list[str]:
        """The names of every topic, sorted."""
        md = self._client.metadata()
        return sorted(md.topics)

    def describe_topics(self, names: Iterable[str] | None = None) -> dict[str, TopicDescription]:
        """Describe ``names`` (None = every topic): schema, partitions, offsets, HWM and LSO."""
        wanted = None if names is None else list(names)
        md = self._client.metadata(wanted, leader_offsets=True)
        if wanted is None:
            return dict(md.topics)
        out: dict[str, TopicDescription] = {}
        for name in wanted:
            err = md.topic_errors.get(name)
            if err is not None:
                raise about(err, f"topic {name!r}")
            desc = md.topics.get(name)
            if desc is None:
                raise UnknownTopicOrPartitionError(f"topic {name!r} does not exist")
            out[name] = desc
        return out

    # ------------------------------------------------------------------ configs

    def describe_configs(self, topics: Iterable[str]) -> dict[str, dict[str, str]]:
        """Each topic's effective configuration: every key, Kafka names, string values."""
        names = list(topics)
        return unwrap_items(names, self._client.describe_configs(names), what="configs", label=_topic)

    def alter_configs(
        self, changes: Mapping[str, Mapping[str, object | None]], *, validate_only: bool = False
    ) -> None:
        """Change topic configs: ``{topic: {key: value}}``; a None value resets the key to the default.

        Keys not named keep their values (an incremental alter). Raises
        :class:`InvalidConfigError` for unknown keys or bad values.
        """
        alterations = {
            topic: ConfigAlteration(
                set={k: str(v) for k, v in conf.items() if v is not None},
                delete=tuple(k for k, v in conf.items() if v is None),
            )
            for topic, conf in changes.items()
        }
        results = self._client.alter_configs(alterations, validate_only=validate_only)
        raise_for_errors((f"topic {t!r}", _result(results, t)) for t in alterations)

    # ------------------------------------------------------------------ offsets

    def list_offsets(
        self,
        specs: Mapping[TopicPartition, OffsetSpec],
        *,
        isolation_level: str = "read_uncommitted",
    ) -> dict[TopicPartition, ListedOffset]:
        """Look up offsets: ``"earliest"`` (log start offset), ``"latest"`` (HWM, or LSO with
        read_committed) or a timestamp in ms (first record at or after it; ``offset`` None if none).
        """
        if isolation_level not in ISOLATION_LEVELS:
            raise ValueError(f"isolation_level must be one of {sorted(ISOLATION_LEVELS)}")
        timestamps: dict[TopicPartition, int] = {}
        for tp, spec in specs.items():
            if spec == "earliest":
                timestamps[tp] = EARLIEST_TIMESTAMP
            elif spec == "latest":
                timestamps[tp] = LATEST_TIMESTAMP
            elif isinstance(spec, int) and not isinstance(spec, bool) and spec >= 0:
                timestamps[tp] = spec
            else:
                raise ValueError(
                    f"offset spec for {tp} must be 'earliest', 'latest' or a timestamp in ms >= 0, "
                    f"got {spec!r}"
                )
        return unwrap_items(timestamps, self._client.list_offsets(timestamps, isolation_level=isolation_level),
                            what="offset")

    def delete_records(self, before: Mapping[TopicPartition, int]) -> dict[TopicPartition, int]:
        """Delete the records below each offset (-1 = the high watermark); return the new
        log start offsets. Raises :class:`OffsetOutOfRangeError` for an offset above the HWM.
        """
        for tp, offset in before.items():
            if not isinstance(offset, int) or offset < -1:
                raise ValueError(f"offset for {tp} must be an int >= -1, got {offset!r}")
        return unwrap_items(before, self._client.delete_records(before), what="log start offset")


    # ------------------------------------------------------------------ compaction

    def describe_cleaning(
        self, topics: Iterable[str] | None = None, *, now_ms: int | None = None
    ) -> dict[str, TopicCleaning]:
        """The compaction state of ``topics`` (None = every topic whose cleanup.policy
        includes compact): their compaction configs and, per partition, clean and
        dirty bytes, dirty ratio, first dirty offset, cleanable end offset, active
        segment base, LSO and the closed segments a compaction would replace.

        ``now_ms`` is the clock for ``min.compaction.lag.ms`` (default: the
        broker's). Raises :class:`UnknownTopicOrPartitionError` for an unknown topic.
        """
        names = None if topics is None else list(topics)
        found = self._client.cleaning.describe_cleaning(names, now_ms=now_ms)
        return unwrap_items(names if names is not None else sorted(found), found, what="cleaning state",
                            label=_topic)


    # ------------------------------------------------------------------ consumer groups

    def list_groups(self) -> list[GroupListing]:
        """Every consumer group: id, state (Empty, Reconciling, Stable), member count, assignor."""
        return sorted(self._client.groups.list_groups(), key=lambda g: g.group_id)

    def describe_groups(self, group_ids: Iterable[str]) -> dict[str, GroupDescription]:
        """Members (with their assignments) and committed offsets of each group.
        Raises :class:`GroupIdNotFoundError` for a group that does not exist."""
        ids = list(group_ids)
        return unwrap_items(ids, self._client.groups.describe_groups(ids), what="description",
                            label=lambda group_id: f"group {group_id!r}")

    def describe_group(self, group_id: str) -> GroupDescription:
        """:meth:`describe_groups` for one group."""
        return self.describe_groups([group_id])[group_id]

    def list_group_offsets(
        self, group_id: str, partitions: Iterable[TopicPartition] | None = None
    ) -> dict[TopicPartition, OffsetAndMetadata]:
        """The group's committed offsets (of ``partitions`` only, when given; absent = none)."""
        found = self._client.groups.fetch_committed_offsets(group_id, None if partitions is None else list(partitions))
        return {tp: o for tp, o in sorted(found.items()) if o is not None}

    def group_lag(self, group_id: str) -> list[PartitionLag]:
        """Per partition of the topics the group subscribes to or committed offsets for: the
        committed offset, the log end (high-water mark), the lag (their difference) and the
        member that owns the partition now. Sorted by topic and partition."""
        desc = self.describe_group(group_id)
        topics = {tp.topic for tp in desc.offsets}
        for m in desc.members:
            topics.update(m.subscribed_topics)
        md = self._client.metadata(sorted(topics), leader_offsets=True) if topics else None
        rows: list[PartitionLag] = []
        seen: set[TopicPartition] = set()
        for name in sorted(md.topics if md is not None else ()):
            assert md is not None
            for p in md.topics[name].partitions:
                tp = p.topic_partition
                seen.add(tp)
                rows.append(_lag_row(desc, tp, p.high_watermark))
        for tp in sorted(set(desc.offsets) - seen):  # committed for a topic that is gone
            rows.append(_lag_row(desc, tp, -1))
        return sorted(rows, key=lambda r: (r.topic, r.partition))

    def alter_group_offsets(
        self, group_id: str, offsets: Mapping[TopicPartition, int | OffsetAndMetadata]
    ) -> None:
        """Set committed offsets of a group from outside it. Raises
        :class:`NonEmptyGroupError` while the group has active members."""
        for tp, value in offsets.items():
            o = value.offset if isinstance(value, OffsetAndMetadata) else value
            if not isinstance(o, int) or isinstance(o, bool) or o < 0:
                raise ValueError(f"offset for {tp} must be an int >= 0, got {value!r}")
        self._client.groups.commit_offsets(group_id, offsets)

    def reset_group_offsets(
        self,
        group_id: str,
        partitions: Iterable[TopicPartition],
        *,
        to_earliest: bool = False,
        to_latest: bool = False,
        to_offset: int | None = None,
        to_timestamp_ms: int | None = None,
        shift_by: int | None = None,
        dry_run: bool = False,
    ) -> dict[TopicPartition, int]:
        """Move the group's committed offsets of ``partitions``, like Kafka's
        ``kafka-consumer-groups --reset-offsets``; give exactly one of:

        * ``to_earliest`` / ``to_latest`` — the log start offset / the high-water mark;
        * ``to_offset`` — that offset (clamped into ``[log start, high-water mark]``);
        * ``to_timestamp_ms`` — the first record at or after that time (the end if none);
        * ``shift_by`` — the committed offset plus N (clamped; the partition must have one).

        Refused with :class:`NonEmptyGroupError` while the group has active members
        (checked again, atomically, by the broker). Returns the new offsets; with
        ``dry_run`` nothing is changed.
        """
        chosen = [n for n, v in (("to_earliest", to_earliest), ("to_latest", to_latest),
                                 ("to_offset", to_offset is not None),
                                 ("to_timestamp_ms", to_timestamp_ms is not None),
                                 ("shift_by", shift_by is not None)) if v]
        if len(chosen) != 1:
            raise ValueError("give exactly one of to_earliest, to_latest, to_offset, to_timestamp_ms and "
                             f"shift_by (got {', '.join(chosen) or 'none'})")
        tps = sorted(set(partitions))
        if not tps:
            raise ValueError("reset_group_offsets needs at least one partition")
        try:
            desc: GroupDescription | None = self.describe_group(group_id)
        except GroupIdNotFoundError:
            desc = None
        if desc is not None and desc.members:
            raise NonEmptyGroupError(
                f"group {group_id!r} has {len(desc.members)} active member(s) ("
                + ", ".join(m.client_id or m.member_id for m in desc.members[:3])
                + (" ..." if len(desc.members) > 3 else "")
                + "); offsets can only be reset while it has none: stop its consumers first"
            )
        earliest = {tp: o.offset or 0 for tp, o in self.list_offsets(dict.fromkeys(tps, "earliest")).items()}
        latest = {tp: o.offset or 0 for tp, o in self.list_offsets(dict.fromkeys(tps, "latest")).items()}

        def clamp(tp: TopicPartition, offset: int) -> int:
            return max(earliest[tp], min(latest[tp], offset))

        new: dict[TopicPartition, int] = {}
        if to_earliest:
            new = dict(earliest)
        elif to_latest:
            new = dict(latest)
        elif to_offset is not None:
            if to_offset < 0:
                raise ValueError(f"to_offset must be >= 0, got {to_offset}")
            new = {tp: clamp(tp, to_offset) for tp in tps}
        elif to_timestamp_ms is not None:
            found = self.list_offsets(dict.fromkeys(tps, to_timestamp_ms))
            new = {tp: latest[tp] if found[tp].offset is None else clamp(tp, found[tp].offset or 0) for tp in tps}
        else:
            assert shift_by is not None
            current = self.list_group_offsets(group_id, tps)
            missing = [tp for tp in tps if tp not in current]
            if missing:
                raise InvalidRequestError(
                    f"group {group_id!r} has no committed offset to shift for "
                    + ", ".join(map(str, missing[:5])) + (" ..." if len(missing) > 5 else "")
                    + "; reset those with to_earliest, to_latest or to_offset"
                )
            new = {tp: clamp(tp, current[tp].offset + shift_by) for tp in tps}
        if not dry_run:
            self._client.groups.commit_offsets(group_id, new)
        return new

    def delete_groups(self, group_ids: Iterable[str]) -> None:
        """Delete groups and their committed offsets. Raises :class:`NonEmptyGroupError` for a group
        with active members, :class:`GroupIdNotFoundError` for an unknown one."""
        ids = list(group_ids)
        results = self._client.groups.delete_groups(ids)
        raise_for_errors((f"group {g!r}", _result(results, g)) for g in ids)

    # ------------------------------------------------------------------ ACLs

    def create_acls(self, acls: Iterable[AclBinding]) -> None:
        """Create ACL bindings (build them with :meth:`AclBinding.create`). Needs ALTER on the
        cluster; a broker without an authorizer raises :class:`SecurityDisabledError`."""
        acl_calls.create_acls(self._client.transport, acls)

    def describe_acls(self, acl_filter: AclFilter | None = None) -> list[AclBinding]:
        """The bindings ``acl_filter`` matches (default: all). Needs DESCRIBE on the cluster."""
        return acl_calls.describe_acls(self._client.transport, acl_filter or AclFilter())

    def delete_acls(self, filters: Iterable[AclFilter]) -> list[AclBinding]:
        """Delete the bindings any filter matches; return them. Needs ALTER on the cluster."""
        return acl_calls.delete_acls(self._client.transport, filters)


    # ------------------------------------------------------------------ SCRAM users

    def alter_user_scram_credentials(
        self, alterations: Iterable[UserScramCredentialUpsertion | UserScramCredentialDeletion],
    ) -> None:
        """Create, replace or delete users' SCRAM credentials (Kafka's alterUserScramCredentials).

        Passwords are salted and hashed here; the broker stores StoredKey and ServerKey only.
        Deleting a credential ends the user's sessions. Raises the first user's error, e.g.
        :class:`ResourceNotFoundError` (no such credential), :class:`InvalidRequestError`
        (iterations outside 4096..16384), an authorization error without ALTER on the cluster.
        """
        alterations = list(alterations)
        upserts = [a for a in alterations if isinstance(a, UserScramCredentialUpsertion)]
        deletions = [a for a in alterations if isinstance(a, UserScramCredentialDeletion)]
        if len(upserts) + len(deletions) != len(alterations):
            raise TypeError("alter_user_scram_credentials takes UserScramCredentialUpsertion and "
                            "UserScramCredentialDeletion objects")
        results = self._client.scram.alter_user_scram_credentials(upserts, deletions)
        raise_for_errors((f"user {a.user!r}", results.get(a.user)) for a in alterations)

    def describe_user_scram_credentials(
        self, users: Iterable[str] | None = None,
    ) -> dict[str, UserScramCredentialsDescription]:
        """The mechanisms and iteration counts of ``users`` (None: every user). Raises
        :class:`ResourceNotFoundError` for a named user without credentials."""
        names = list(users or ())
        found = self._client.scram.describe_user_scram_credentials(names)
        return unwrap_items(found, found, what="credentials", label=lambda user: f"user {user!r}")

    # ------------------------------------------------------------------ reassignment, elections

    def alter_partition_reassignments(self, plan: Mapping[TopicPartition, Sequence[int] | None], *,
                                      throttle_bytes_per_sec: int = 0) -> None:
        """Move partitions onto new replicas (preferred leader first; None or [] cancels a running
        move), copying at most ``throttle_bytes_per_sec`` per new replica (0: no throttle).
        Raises the first partition's error, e.g. :class:`InvalidReplicaAssignmentError`,
        :class:`NoReassignmentInProgressError`. Returns once the move has started."""
        reassign_calls.alter_partition_reassignments(self._client.transport, plan, throttle_bytes_per_sec)

    def list_partition_reassignments(self, topics: Iterable[str] | None = None,
                                     ) -> dict[TopicPartition, reassign_calls.PartitionReassignment]:
        """The running moves (of ``topics``; None: all) with each one's copy progress."""
        return reassign_calls.list_partition_reassignments(self._client.transport, topics)

    def elect_leaders(self, election_type: str = "preferred", partitions: Iterable[TopicPartition] | None = None,
                      ) -> dict[TopicPartition, LogstoreError | None]:
        """Elect ``"preferred"`` (the first replica) or ``"unclean"`` leaders for ``partitions``
        (None: all); per partition None (done) or the reason, e.g. ElectionNotNeededError."""
        return reassign_calls.elect_leaders(self._client.transport, election_type, partitions)


def _lag_row(desc: GroupDescription, tp: TopicPartition, log_end: int) -> PartitionLag:
    committed = desc.offsets.get(tp)
    owner = desc.owner(tp)
    offset = committed.offset if committed is not None else None
    return PartitionLag(
        topic=tp.topic, partition=tp.partition, committed_offset=offset, log_end_offset=log_end,
        lag=max(0, log_end - offset) if offset is not None and log_end >= 0 else None,
        member_id=owner.member_id if owner is not None else None,
        client_host=owner.client_host if owner is not None else "",
    )


def _result(results: Mapping[str, LogstoreError | None], name: str) -> LogstoreError | None:
    if name not in results:
        return UnknownServerError("the broker's answer does not mention it")
    return results[name]


def _topic(name: str) -> str:
    return f"topic {name!r}"
