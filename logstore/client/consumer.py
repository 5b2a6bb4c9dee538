"""The consumer: :class:`Consumer` reads assigned partitions, alone or in a consumer group.

Reading model
-------------
A consumer is *assigned* partitions (:meth:`Consumer.assign`) or gets them as a
member of a consumer group (see below), and keeps one *position* per partition
(:mod:`logstore.client.consumer_positions`): the offset of the next record it will
return. Positions are the consumer's own state (the broker keeps none, see
DESIGN I4). A partition without a position gets one from ``auto_offset_reset``
on first use: ``"earliest"`` (the log start offset), ``"latest"`` (the end:
the LSO for read_committed, else the HWM) or ``"none"`` (raise
:class:`OffsetOutOfRangeError`). The same policy applies when a fetch
finds the position out of range (records deleted by retention or
``delete_records``, or a truncated log). A position inside offsets the broker
lost and an operator accepted to lose (``logstore partitions recover
--accept-data-loss``) raises :class:`OffsetOutOfRangeError` with ``"none"``;
otherwise the consumer logs the data loss and goes on where the log continues.

Fetches are long polls: the broker answers once ``fetch_min_bytes`` are
available or ``fetch_max_wait_ms`` passed, so :meth:`Consumer.poll` returns
as soon as data arrives. A poll that returns a backlog-sized answer sends the
next fetch before returning, so it waits at the broker while the caller works
(:mod:`logstore.client.prefetch`; not for group members). Answers are decoded by :mod:`logstore.client.fetcher`
(:func:`~logstore.client.fetcher.decode_fetched`): each batch's CRC32C is
verified (``check_crcs``), control batches and (read_committed) batches of
aborted transactions are skipped, and records below the fetch offset are
dropped from the first batch. :meth:`Consumer.poll_arrow` hands out
the decoded Arrow batches as they are (zero-copy for uncompressed bodies);
:meth:`Consumer.poll` turns them into :class:`ConsumerRecord` objects.

Visibility: a read_committed consumer never sees records at or above the
last stable offset, a read_uncommitted one never at or above the high-water
mark; the broker enforces both.

Consumer groups
---------------
``Consumer(group_id="g", subscribe=["events"])`` joins group ``g``: the broker's
group coordinator splits the partitions of the subscribed topics among the
members and moves them incrementally as members come and go (a partition is
revoked from one member before another gets it; members that keep their
partitions are not interrupted; see :mod:`logstore.broker.groups.coordinator`). A
background thread heartbeats (:mod:`logstore.client.group_member`); everything else
happens inside :meth:`Consumer.poll` (:mod:`logstore.client.consumer_coordinator`),
in this order:

* revoked partitions: their positions are committed (with auto-commit), then
  ``on_partitions_revoked(partitions)`` runs, then they are given up;
* lost partitions (the session expired, the member was fenced): dropped without a
  commit, ``on_partitions_lost`` (default: ``on_partitions_revoked``);
* assigned partitions: each resumes at the group's committed offset (else by
  ``auto_offset_reset``; ``"none"`` raises :class:`OffsetOutOfRangeError`), then
  ``on_partitions_assigned(partitions)`` runs.

Committed offsets (the next offset to read) are stored by the broker in
``__consumer_offsets``: :meth:`Consumer.commit` commits the positions (or given
offsets) synchronously; with ``enable_auto_commit`` (the default) the positions
are committed every ``auto_commit_interval_ms`` from :meth:`poll`, before a
revocation and on :meth:`close`. That is at-least-once: records returned after
the last commit are delivered again to the next owner. A consumer with a
``group_id`` that uses :meth:`assign` (no subscription) starts at the group's
committed offsets too and commits from outside the group (allowed only while
the group has no members).

Thread-safety: a :class:`Consumer` is **not** thread-safe (like Kafka's): use
it from one thread. The one exception is :meth:`Consumer.close`, which another
thread may call to stop a blocked :meth:`Consumer.poll` or an iteration.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Iterable, Iterator, Mapping, Sequence
from typing import Any

import pyarrow as pa

from logstore.client.bootstrap import BootstrapArg, resolve_bootstrap
from logstore.client.client_config import accepts_client_config, poll_timeout_ms
from logstore.client.consumer_coordinator import ConsumerCoordinator, RebalanceCallback
from logstore.client.consumer_positions import Positions
from logstore.client.error_mapping import about
from logstore.client.fetch_errors import FetchErrorLog
from logstore.client.fetcher import decode_fetched, records_from_batch
from logstore.client.group_member import GroupMembership
from logstore.client.prefetch import PREFETCH_MIN_RECORDS, Prefetch, fetch_request_partitions
from logstore.client.results import FetchedPartition, FetchRequestPartition
from logstore.client.rpc import (
    DEFAULT_REQUEST_TIMEOUT_MS,
    EARLIEST_TIMESTAMP,
    ISOLATION_LEVELS,
    LATEST_TIMESTAMP,
    BrokerClient,
)
from logstore.client.security import ClientSecurity
from logstore.errors import (
    LogOfflineError,
    LogstoreError,
    OffsetOutOfRangeError,
    RequestTimedOutError,
)
from logstore.types import ConsumerRecord, OffsetAndMetadata, TopicPartition

__all__ = ["Consumer", "AUTO_OFFSET_RESET"]

log = logging.getLogger(__name__)

AUTO_OFFSET_RESET = ("earliest", "latest", "none")
_RETRY_BACKOFF_S = 0.1
_CALL_DEADLINE_GRACE_S = 0.5


# --------------------------------------------------------------------------- the consumer


class Consumer:
    """Reads records from assigned partitions; see the module docstring.

    Options (keyword-only except ``bootstrap``; Kafka's names in snake case):

    * ``bootstrap`` — ``"host:port"`` (default ``$LOGSTORE_BOOTSTRAP`` or ``127.0.0.1:9392``;
      a list or comma-separated string is accepted, see :mod:`logstore.client.bootstrap`);
    * ``bootstrap_servers`` — kafka-python's name for ``bootstrap`` (give one of them);
    * security — kafka-python's ``security_protocol``, ``ssl_*``, ``sasl_*`` keywords (or
      ``security=``), or a confluent-style config dict first (:mod:`logstore.client.client_config`);
    * ``isolation_level`` — ``"read_committed"`` (default) or ``"read_uncommitted"``;
    * ``auto_offset_reset`` — ``"latest"`` (default), ``"earliest"`` or ``"none"``;
    * ``fetch_max_wait_ms`` (500), ``fetch_min_bytes`` (1), ``fetch_max_bytes`` (64 MiB),
      ``max_partition_fetch_bytes`` (8 MiB; a larger first batch still comes through);
    * ``max_poll_records`` — default cap of :meth:`poll` (500);
    * ``check_crcs`` — verify every batch's CRC32C (default True);
    * ``request_timeout_ms`` — deadline of each request beyond its long-poll wait.

    Consumer groups (see the module docstring):

    * ``group_id`` — the group to join (with ``subscribe``) or to commit for;
    * ``subscribe`` — topics to consume as a member of ``group_id`` (or call :meth:`subscribe`);
    * ``group_instance_id`` — makes the member static: a restarted process with the
      same id takes its partitions back without a reshuffle;
    * ``enable_auto_commit`` (True), ``auto_commit_interval_ms`` (5000);
    * ``on_partitions_revoked``, ``on_partitions_assigned``, ``on_partitions_lost`` —
      callables taking a ``set[TopicPartition]``, run inside :meth:`poll`;
    * ``group_remote_assignor`` — ``"uniform"`` or ``"range"`` (default: the broker's);
    * ``max_poll_interval_ms`` (300000) — also the time the member has to revoke partitions;
      a member that does not call :meth:`poll` for that long leaves the group;
    * ``client_id`` — shown by ``logstore groups describe``, and what broker quotas know this
      consumer by (default ``logstore-python-VERSION``).

    Not thread-safe (see the module docstring). Use as a context manager or call :meth:`close`.
    """

    @accepts_client_config  # a confluent-style dict, kafka-python's security keywords
    def __init__(
        self,
        bootstrap: BootstrapArg = None,
        *,
        bootstrap_servers: BootstrapArg = None,
        security: ClientSecurity | None = None,
        isolation_level: str = "read_committed",
        auto_offset_reset: str = "latest",
        fetch_max_wait_ms: int = 500,
        fetch_min_bytes: int = 1,
        fetch_max_bytes: int = 64 << 20,
        max_partition_fetch_bytes: int = 8 << 20,
        max_poll_records: int = 500,
        check_crcs: bool = True,
        request_timeout_ms: int = DEFAULT_REQUEST_TIMEOUT_MS,
        group_id: str | None = None,
        subscribe: Sequence[str] | None = None,
        group_instance_id: str | None = None,
        enable_auto_commit: bool = True,
        auto_commit_interval_ms: int = 5_000,
        on_partitions_revoked: RebalanceCallback | None = None,
        on_partitions_assigned: RebalanceCallback | None = None,
        on_partitions_lost: RebalanceCallback | None = None,
        group_remote_assignor: str | None = None,
        max_poll_interval_ms: int = 300_000,
        client_id: str | None = None,
    ) -> None:
        if isolation_level not in ISOLATION_LEVELS:
            raise ValueError(
                f"isolation_level must be one of {sorted(ISOLATION_LEVELS)}, got {isolation_level!r}"
            )
        if auto_offset_reset not in AUTO_OFFSET_RESET:
            raise ValueError(
                f"auto_offset_reset must be one of {list(AUTO_OFFSET_RESET)}, got {auto_offset_reset!r}"
            )
        for name, value, low in (
            ("fetch_max_wait_ms", fetch_max_wait_ms, 0), ("fetch_min_bytes", fetch_min_bytes, 0),
            ("fetch_max_bytes", fetch_max_bytes, 1),
            ("max_partition_fetch_bytes", max_partition_fetch_bytes, 1),
            ("max_poll_records", max_poll_records, 1),
        ):
            if not isinstance(value, int) or isinstance(value, bool) or value < low:
                raise ValueError(f"{name} must be an integer >= {low}, got {value!r}")
        self._isolation_level = isolation_level
        self._read_committed = isolation_level == "read_committed"
        self._fetch_max_wait_ms = fetch_max_wait_ms
        self._fetch_min_bytes = fetch_min_bytes
        self._fetch_max_bytes = fetch_max_bytes
        self._max_partition_fetch_bytes = max_partition_fetch_bytes
        self._max_poll_records = max_poll_records
        self._check_crcs = check_crcs
        self._client = BrokerClient(resolve_bootstrap(bootstrap, bootstrap_servers),
                                    request_timeout_ms=request_timeout_ms, security=security, client_id=client_id)
        self._closed = False
        self._prefetch = Prefetch(self._client, max_wait_ms=fetch_max_wait_ms, min_bytes=fetch_min_bytes,
                                  max_bytes=fetch_max_bytes, partition_max_bytes=max_partition_fetch_bytes,
                                  isolation_level=isolation_level)
        self._last_fetch_records = 0  # records in the last fetch answer (see logstore.client.prefetch)
        self._fetch_errors = FetchErrorLog(log)  # a partition's retriable errors, logged once per episode
        # Consumer groups
        if group_id is not None and (not isinstance(group_id, str) or not group_id):
            raise ValueError(f"group_id must be a non-empty string, got {group_id!r}")
        for name, value, low in (("auto_commit_interval_ms", auto_commit_interval_ms, 0),
                                 ("max_poll_interval_ms", max_poll_interval_ms, 1)):
            if not isinstance(value, int) or isinstance(value, bool) or value < low:
                raise ValueError(f"{name} must be an integer >= {low}, got {value!r}")
        if group_remote_assignor not in (None, "uniform", "range"):
            raise ValueError(f"group_remote_assignor must be 'uniform' or 'range', got {group_remote_assignor!r}")
        self._group_id = group_id
        self._wakeup = threading.Event()
        self._positions = Positions(
            self._client, isolation_level=isolation_level, auto_offset_reset=auto_offset_reset,
            group_id=group_id, check_open=self._check_open,
        )
        self._assigned = self._positions.assigned  # the same dict, never rebound
        self._group: ConsumerCoordinator | None = None
        if group_id is not None:
            self._group = ConsumerCoordinator(
                self._client, group_id, assigned=self._assigned, add_partitions=self._positions.add,
                wakeup=self._wakeup, instance_id=group_instance_id or "",
                assignor=group_remote_assignor or "", rebalance_timeout_ms=max_poll_interval_ms,
                client_id=self._client.client_id, auto_commit=enable_auto_commit,
                auto_commit_interval_ms=auto_commit_interval_ms, on_revoked=on_partitions_revoked,
                on_assigned=on_partitions_assigned, on_lost=on_partitions_lost,
            )
        if subscribe is not None:
            try:
                self.subscribe(subscribe)
            except BaseException:
                self._client.close()
                raise

    # ------------------------------------------------------------------ lifecycle

    @property
    def bootstrap(self) -> str:
        return self._client.bootstrap

    def close(self) -> None:
        """Close the connection; a poll blocked in another thread returns. Idempotent.

        A group member first commits its positions (with auto-commit), runs
        ``on_partitions_revoked`` for what it owns and leaves the group, so its
        partitions move at once (a static member leaves *for now*: they wait for
        it until its session times out).
        """
        if self._closed:
            return
        if self._group is not None and self._group.membership is not None:
            self._wakeup.set()
            self._group.leave()
        self._closed = True
        self._prefetch.cancel()
        self._client.close()

    def __enter__(self) -> Consumer:
        return self

    def __exit__(self, *exc_info: object) -> None:
        self.close()

    def __reduce__(self) -> Any:
        raise TypeError("a Consumer cannot be pickled; use fetch_range with a BrokerClient")

    def __iter__(self) -> Iterator[ConsumerRecord]:
        """Yield records as they arrive, blocking between them; ends when the consumer is closed."""
        while not self._closed:
            try:
                records = self.poll(timeout_ms=1000)
            except RuntimeError:
                if self._closed:
                    return
                raise
            yield from records

    # ------------------------------------------------------------------ assignment and positions

    def assign(self, partitions: Iterable[TopicPartition]) -> None:
        """Read exactly ``partitions`` from now on (replacing the previous assignment).

        Positions of partitions that stay assigned are kept; new ones start
        from ``auto_offset_reset`` unless :meth:`seek` is called.
        """
        if self._membership is not None:
            raise ValueError("this consumer is subscribed as a member of a group; call unsubscribe() "
                             "before assign()")
        wanted: list[TopicPartition] = []
        for tp in partitions:
            if not isinstance(tp, TopicPartition):
                raise TypeError(f"assign takes TopicPartition objects, got {tp!r}")
            wanted.append(tp)
        self._positions.assign(wanted)

    def assignment(self) -> set[TopicPartition]:
        return set(self._assigned)

    def seek(self, tp: TopicPartition, offset: int) -> None:
        """Make ``offset`` the next offset :meth:`poll` returns from ``tp``."""
        self._positions.seek(tp, offset)

    def seek_to_beginning(self, *partitions: TopicPartition) -> None:
        """Seek to the log start offset of ``partitions`` (default: every assigned one)."""
        self._positions.seek_to(self._positions.targets(partitions), EARLIEST_TIMESTAMP)

    def seek_to_end(self, *partitions: TopicPartition) -> None:
        """Seek to the end (LSO for read_committed, else HWM) of ``partitions`` (default: all)."""
        self._positions.seek_to(self._positions.targets(partitions), LATEST_TIMESTAMP)

    def seek_to_timestamp(self, timestamp_ms: int, *partitions: TopicPartition) -> None:
        """Seek to the first record with timestamp ``>= timestamp_ms`` (the end if none)."""
        targets = self._positions.targets(partitions)
        found = self.offsets_for_times(dict.fromkeys(targets, timestamp_ms))
        missing = [tp for tp, offset in found.items() if offset is None]
        for tp, offset in found.items():
            if offset is not None:
                self.seek(tp, offset)
        if missing:
            self.seek_to_end(*missing)

    def offsets_for_times(self, timestamps: Mapping[TopicPartition, int]) -> dict[TopicPartition, int | None]:
        """The first offset with timestamp ``>=`` the given one per partition (None when no such record)."""
        for tp, ts in timestamps.items():
            if not isinstance(ts, int) or ts < 0:
                raise ValueError(f"timestamp for {tp} must be a non-negative int of ms, got {ts!r}")
        return {tp: listed.offset for tp, listed in self._positions.list_offsets(timestamps).items()}

    def beginning_offsets(self, partitions: Iterable[TopicPartition]) -> dict[TopicPartition, int]:
        """The log start offset of each partition."""
        return self._positions.bounds(partitions, EARLIEST_TIMESTAMP)

    def end_offsets(self, partitions: Iterable[TopicPartition]) -> dict[TopicPartition, int]:
        """The end offset of each partition (LSO for read_committed, else HWM; exclusive)."""
        return self._positions.bounds(partitions, LATEST_TIMESTAMP)

    def position(self, tp: TopicPartition) -> int:
        """The offset of the next record :meth:`poll` returns from ``tp`` (resolving a reset first)."""
        state = self._positions.state(tp)
        if state.position is None:
            self._positions.init([tp])
        assert state.position is not None
        return state.position

    def highwater(self, tp: TopicPartition) -> int | None:
        """The high-water mark of ``tp`` from the last fetch answer (None before any)."""
        hwm = self._positions.state(tp).high_watermark
        return hwm if hwm >= 0 else None

    # ------------------------------------------------------------------ polling

    def _check_open(self) -> None:
        if self._closed:
            raise RuntimeError("the consumer is closed")

    def poll(self, timeout: float | None = None, *, timeout_ms: int | None = None,
             max_records: int | None = None) -> list[ConsumerRecord]:
        """Return the next records of the assigned partitions, waiting up to ``timeout`` seconds.

        The wait is ``timeout`` in **seconds** (a float, positional or by name, as
        confluent-kafka's ``poll(timeout)``) or ``timeout_ms`` in milliseconds
        (keyword only, as kafka-python's ``poll(timeout_ms=...)``); not both.
        Neither: do not wait (one fetch, answered at once). ``poll(3.0)`` and
        ``poll(timeout_ms=3000)`` both wait up to three seconds.

        Returns as soon as some records are available (at most
        ``max_records``, default ``max_poll_records``), or an empty list when
        the timeout passes. Records of a partition come in offset order and
        each poll continues where the previous one stopped. Values are bytes
        (untyped topics) or dicts (typed topics); tombstones are None.
        Raises :class:`OffsetOutOfRangeError` when a position is out of range
        and ``auto_offset_reset`` is ``"none"``, :class:`CorruptRecordError`
        for a batch failing its CRC, :class:`LogOfflineError` naming the
        partition when the broker keeps it offline (damaged files: it will not
        heal by polling), and other non-retriable errors as their
        :class:`LogstoreError`; retriable errors are retried until the timeout.
        """
        wait_ms = poll_timeout_ms(timeout, timeout_ms)
        limit = max_records if max_records is not None else self._max_poll_records
        if limit < 1:
            raise ValueError(f"max_records must be >= 1, got {limit}")
        out: list[ConsumerRecord] = []
        for tp, batches in self._poll_batches(wait_ms, limit).items():
            for rb in batches:
                out.extend(records_from_batch(tp.topic, tp.partition, rb))
        return out

    def poll_arrow(self, timeout: float | None = None, *, timeout_ms: int | None = None,
                   max_records: int | None = None) -> dict[TopicPartition, pa.Table]:
        """The columnar :meth:`poll`: the next records of each partition as one Arrow table.

        ``timeout`` (seconds) or ``timeout_ms`` as for :meth:`poll`.

        Tables have the stored schema (offset, timestamp, key, value,
        headers; a typed topic's value is a struct of its columns: use
        ``table.column("value").flatten()`` or ``pyarrow.compute.struct_field``).
        No per-row Python objects are made; uncompressed batches are not
        copied. ``max_records`` (default unlimited) caps the total rows.
        A table never mixes schemas: after a schema change the rest waits for
        the next call.
        """
        wait_ms = poll_timeout_ms(timeout, timeout_ms)
        limit = max_records if max_records is not None else 2**62
        if limit < 1:
            raise ValueError(f"max_records must be >= 1, got {limit}")
        return {
            tp: pa.Table.from_batches(batches)
            for tp, batches in self._poll_batches(wait_ms, limit).items()
            if batches
        }

    def _poll_batches(self, timeout_ms: int, limit: int) -> dict[TopicPartition, list[pa.RecordBatch]]:
        self._check_open()
        if not self._assigned and self._membership is None:
            raise ValueError("no partitions are assigned; call assign() or subscribe() first")
        deadline = time.monotonic() + max(0, timeout_ms) / 1000
        if self._membership is not None:
            self._membership.note_poll()
            assert self._group is not None
            self._group.maybe_auto_commit()
        else:
            self._positions.init_missing()
        first = True
        while True:
            if self._membership is not None:
                self._membership.note_poll()  # blocking inside poll() counts as polling
                try:
                    assert self._group is not None
                    self._group.reconcile()
                    self._positions.init_missing()
                except LogstoreError as e:
                    if self._closed or not e.retriable:
                        raise
                    log.warning("group %r: %s; retrying", self._group_id, e)
                    time.sleep(min(_RETRY_BACKOFF_S, max(0.0, deadline - time.monotonic())))
                    if time.monotonic() >= deadline:
                        return {}
                    continue
            drained = self._positions.drain(limit)
            if drained:
                if self._membership is None and self._last_fetch_records >= PREFETCH_MIN_RECORDS:
                    self._prefetch.start(self._fetchable())  # see logstore.client.prefetch
                return drained
            remaining_ms = int((deadline - time.monotonic()) * 1000)
            if not first and remaining_ms <= 0:
                return {}
            first = False
            try:
                self._fetch(max(0, min(self._fetch_max_wait_ms, remaining_ms)))
            except LogstoreError as e:
                if self._closed:
                    return {}
                if not e.retriable or isinstance(e, LogOfflineError):
                    raise
                log.warning("fetch failed: %s; retrying", e)
                time.sleep(min(_RETRY_BACKOFF_S, max(0.0, deadline - time.monotonic())))
            except (RuntimeError, ValueError):
                if self._closed:  # closed from another thread
                    return {}
                raise

    def _fetchable(self) -> dict[TopicPartition, int]:
        """Where to fetch each assigned partition whose buffer is empty (its position)."""
        return {
            tp: state.position
            for tp, state in self._assigned.items()
            if not state.buffer and state.position is not None
        }

    def _fetch(self, max_wait_ms: int) -> None:
        """One Fetch for every assigned partition whose buffer is empty (or the prefetch's answer)."""
        requested = self._fetchable()
        if not requested:
            if self._membership is not None:  # nothing to read yet: wait for an assignment
                self._wakeup.wait(max_wait_ms / 1000)
                self._wakeup.clear()
            return
        partitions = fetch_request_partitions(requested, self._max_partition_fetch_bytes)
        if self._membership is None:
            prefetched = self._prefetch.take(requested, max_wait_ms)
            answers = prefetched if prefetched is not None else self._client.fetch(
                partitions,
                max_wait_ms=max_wait_ms,
                min_bytes=self._fetch_min_bytes,
                max_bytes=self._fetch_max_bytes,
                isolation_level=self._isolation_level,
            )
        else:
            found = self._fetch_interruptible(partitions, max_wait_ms)
            if found is None:
                return
            answers = found
        out_of_range: list[TopicPartition] = []
        records = 0
        retry_later = False
        for fetched in answers:
            tp = fetched.topic_partition
            state = self._assigned.get(tp)
            offset = requested.get(tp)
            if state is None or offset is None or state.position != offset:
                continue  # not asked for, or the position moved meanwhile
            if fetched.error is not None:
                if isinstance(fetched.error, OffsetOutOfRangeError) and fetched.next_offset > offset:
                    # Inside a range of offsets the broker lost: the log goes on at next_offset.
                    self._positions.skip_lost(tp, fetched.next_offset, reason=f"{tp}: {fetched.error.message}")
                elif isinstance(fetched.error, OffsetOutOfRangeError):
                    out_of_range.append(tp)
                elif isinstance(fetched.error, LogOfflineError):
                    # Damaged files: polling again would only return nothing, forever.
                    raise about(fetched.error, tp)
                elif fetched.error.retriable:
                    self._fetch_errors.note(tp, offset, fetched.error)
                    retry_later = True
                else:
                    raise about(fetched.error, tp)
                continue
            self._fetch_errors.clear(tp)
            state.high_watermark = fetched.high_watermark
            decoded = decode_fetched(
                fetched, fetch_offset=offset, check_crcs=self._check_crcs,
                read_committed=self._read_committed,
            )
            state.buffer.extend(decoded.batches)
            state.buffer_end = decoded.next_offset
            records += decoded.record_count
        self._last_fetch_records = records
        if retry_later and not records:
            # The leader moved: give the metadata a moment rather than asking again at once.
            time.sleep(min(_RETRY_BACKOFF_S, max_wait_ms / 1000))
        for tp in out_of_range:
            self._positions.reset(
                [tp], reason=f"offset {self._assigned[tp].position} of {tp} is out of range"
            )

    # ------------------------------------------------------------------ consumer groups

    @property
    def group_id(self) -> str | None:
        return self._group_id

    @property
    def _membership(self) -> GroupMembership | None:
        """The group membership while subscribed (None otherwise)."""
        return self._group.membership if self._group is not None else None

    @property
    def member_id(self) -> str | None:
        """This consumer's member id in its group (None when it is not subscribed)."""
        return self._membership.member_id if self._membership is not None else None

    @property
    def member_epoch(self) -> int:
        """The member epoch the coordinator last gave (0 before joining; -1 when not subscribed)."""
        return self._membership.member_epoch if self._membership is not None else -1

    def subscribe(self, topics: Iterable[str]) -> None:
        """Consume ``topics`` as a member of ``group_id`` (joins the group at once).

        Calling it again changes the subscription (the group rebalances).
        Partitions arrive in :meth:`poll`.
        """
        names = [topics] if isinstance(topics, str) else list(topics)
        if not names or not all(isinstance(t, str) and t for t in names):
            raise ValueError(f"subscribe takes a non-empty list of topic names, got {topics!r}")
        if self._group is None:
            raise ValueError("subscribe needs a group_id; pass Consumer(group_id=...) or use assign()")
        self._check_open()
        self._group.subscribe(names)

    def unsubscribe(self) -> None:
        """Give up the group's partitions (committing them with auto-commit) and leave the group."""
        if self._group is not None:
            self._group.unsubscribe()

    def commit(self, offsets: Mapping[TopicPartition, int | OffsetAndMetadata] | None = None) -> None:
        """Commit offsets for the group, synchronously: ``offsets`` (the next offset to read, per
        partition), or by default the current position of every owned partition.

        Raises :class:`StaleMemberEpochError` for partitions this member no longer owns,
        :class:`UnknownMemberIdError` / :class:`FencedInstanceIdError` when it is no longer in
        the group, :class:`NonEmptyGroupError` for a commit from outside an active group.
        """
        if self._group is None:
            raise ValueError("commit needs a group_id; pass Consumer(group_id=...)")
        self._check_open()
        self._group.commit(offsets)

    def committed(self, partitions: Iterable[TopicPartition]) -> dict[TopicPartition, OffsetAndMetadata | None]:
        """The group's committed offsets of ``partitions`` (None where nothing is committed)."""
        if self._group is None:
            raise ValueError("committed needs a group_id; pass Consumer(group_id=...)")
        self._check_open()
        return self._group.committed(partitions)

    def _fetch_interruptible(self, partitions: list[FetchRequestPartition],
                             max_wait_ms: int) -> list[FetchedPartition] | None:
        """A fetch that a rebalance (or close) interrupts: None when interrupted."""
        self._wakeup.clear()
        if self._membership is not None:
            snap = self._membership.snapshot()
            if snap.lost or snap.fatal is not None or snap.assignment != set(self._assigned):
                return None
        future = self._client.fetch_async(
            partitions, max_wait_ms=max_wait_ms, min_bytes=self._fetch_min_bytes,
            max_bytes=self._fetch_max_bytes, isolation_level=self._isolation_level,
        )
        future.add_done_callback(lambda _: self._wakeup.set())
        # A moment past the call's own deadline, so that a leader that answers nothing times the
        # call out (and the client forgets its routes) before this gives up and cancels it.
        deadline = (time.monotonic() + max_wait_ms / 1000 + self._client.request_timeout_ms / 1000
                    + _CALL_DEADLINE_GRACE_S)
        while not future.done():
            if not self._wakeup.wait(max(0.0, deadline - time.monotonic())):
                break
            self._wakeup.clear()
            if future.done() or self._closed:
                break
            now = self._membership.snapshot() if self._membership is not None else None
            if now is None or now.lost or now.fatal is not None or now.assignment != set(self._assigned):
                break
        if not future.done():
            future.cancel_call()
            if self._closed:
                return None
            if time.monotonic() >= deadline:
                raise RequestTimedOutError(f"fetch from {self._client.bootstrap} timed out")
            return None
        return future.result()
