"""The producer: :class:`Producer` batches records per partition and appends them.

Semantics (Kafka's, with Pythonic names)
----------------------------------------
* **Partition choice**: an explicit ``partition``; else a record with a key goes
  to ``partition_for_key(key, n)`` (Kafka's murmur2 formula, so keys land where
  the Java producer puts them; computed for all the records of a batch at
  once when it is sealed); else the topic's *sticky* partition (KIP-480),
  which moves on every time a batch for it is sealed.
* **Batching**: ``send()`` records of a topic accumulate column by column in
  one open buffer. It is sealed when adding a record would take it past
  ``batch_size`` bytes, when it has been open ``linger_ms``, or on
  :meth:`Producer.flush`, and is then cut into one batch per partition (each
  at most ``batch_size`` bytes). Sealed batches queue per partition.
* **Sending**: a background sender thread sends queued batches, with up to
  ``max_in_flight_requests_per_connection`` (default 5) requests in flight.
  With idempotence (the default) a partition's batches are pipelined (up to
  5 in flight) and the broker keeps them in order by sequence number, retries
  included; without idempotence a partition has one request in flight at a
  time, so its batches are appended in the order they were sealed. One
  request carries the ready batches of one or more partitions, up to 4 MiB
  (or ``max_request_size`` if smaller; a single larger batch goes alone).
* **Retries**: a batch that fails with a retriable error
  (:attr:`LogstoreError.retriable`; an unreachable broker is one) is sent
  again after an exponential backoff (``retry_backoff_ms`` doubling up to
  ``retry_backoff_max_ms``), up to ``retries`` times (by default unbounded)
  and never after ``delivery_timeout_ms`` since it was created.
* **Failed or unknown**: a send reported failed was not appended. When the
  broker may have appended it (a timeout or a connection lost after the
  request left, with no later answer), the send fails with
  :class:`~logstore.errors.UnknownProducerOutcomeError` instead: the record
  may or may not be in the log. With idempotence a retry that gets through
  settles it (the broker deduplicates by sequence).
* **Idempotence** (``enable_idempotence=True``, the default): the producer
  gets a producer id and epoch from the broker and numbers each partition's
  batches (``base_sequence``, counting records, assigned in queue order when a
  batch is sealed or enqueued). A retry after a *lost response* sends the
  same bytes; the broker recognises the sequence (among the producer's last
  5 batches of the partition) and answers with the original offsets, so
  nothing is appended twice. A batch refused with OUT_OF_ORDER_SEQUENCE_NUMBER
  because an earlier one did not arrive is resent after it, in order. After
  a batch failed for good (expired after an outage longer than
  ``delivery_timeout_ms``) or the broker lost acknowledged batches (an
  ``acks=1`` tail truncated by a leader change), the partition restarts its
  sequences under a new epoch once its requests in flight have answered
  (Kafka's KIP-360), so later sends succeed.
* **Transactions** (``transactional_id=...``): :meth:`Producer.init_transactions`
  once, then :meth:`~Producer.begin_transaction`, sends to any topics and
  partitions, and :meth:`~Producer.commit_transaction` or
  :meth:`~Producer.abort_transaction`. Partitions join the transaction
  (``AddPartitionsToTxn``) before their first batch is queued. Records of a
  transaction become visible to read_committed consumers atomically at commit;
  an aborted transaction's records never do. After a failed send the
  transaction can only abort; the abort bumps the epoch, so the next one can
  commit. A newer producer with the same transactional id fences this one
  (:class:`ProducerFencedError`, fatal: create a new producer).
* **Acknowledgement**: ``acks="all"`` (-1) waits for the batch to be durable on
  every in-sync replica (on a single broker: fsynced), ``acks=1`` for the
  leader's append, ``acks=0`` for nothing: futures complete with offset -1 as
  soon as the request is sent, and errors are only logged.
* **Back-pressure**: queued bytes are capped by ``buffer_memory``; ``send`` and
  ``send_batch`` block up to ``max_block_ms`` for room, then fail with
  :class:`RequestTimedOutError`.

``send`` returns a :class:`~logstore.client.producer.delivery.RecordFuture`
(a ``concurrent.futures.Future`` without a lock or condition of its own: its
outcome lives in the batch's completion), so a record costs list appends and
one small object, and nothing reaches the cyclic garbage collector.
``send`` raises synchronously for what it can know before queueing (bad
argument types, unknown topic, partition out of range, a value that does not
fit a typed topic's columns, a record bigger than ``max_request_size``);
everything after that is reported through the returned future and the
``on_delivery`` callback.

The columnar fast path :meth:`Producer.send_batch` converts a pyarrow
``Table``/``RecordBatch`` or a pandas ``DataFrame`` to the stored schema
column by column (:func:`~logstore.client.producer.arrow_input.to_stored_batch`),
partitions it with a vectorized murmur2
(:func:`~logstore.client.partitioner.murmur2_array`), cuts it into batches of at most
``batch_size`` bytes and encodes them in the calling thread while the sender
ships earlier ones.

Structure (Kafka's): :class:`Producer` validates input and wires four
collaborators: the record accumulator
(:mod:`~logstore.client.producer.accumulator`: per-partition batches, linger,
the memory bound), the sender (:mod:`~logstore.client.producer.sender`: the
thread with requests in flight, retries, answers), the transaction manager
(:mod:`~logstore.client.producer.transaction_manager`: producer id, the
init/begin/commit/abort state machine) and the topic metadata cache
(:mod:`~logstore.client.producer.metadata`); input conversion is in
:mod:`~logstore.client.producer.arrow_input`, futures and callbacks in
:mod:`~logstore.client.producer.delivery`.

Thread-safety: a :class:`Producer` is thread-safe; share one per process.
Delivery callbacks and future callbacks run on the sender thread: keep them
short and do not call :meth:`Producer.flush` or :meth:`Producer.close` from them.
"""

from __future__ import annotations

import concurrent.futures
import json
import time
from collections.abc import Iterable, Mapping
from typing import Any

import pyarrow as pa

from logstore.client.bootstrap import BootstrapArg, resolve_bootstrap
from logstore.client.client_config import accepts_client_config
from logstore.client.partitioner import StickyPartitioner
from logstore.client.producer.accumulator import RecordAccumulator
from logstore.client.producer.arrow_input import (
    header_entries,
    input_batches,
    to_bytes,
    to_stored_batch,
    typed_value,
    typed_value_size,
)
from logstore.client.producer.delivery import DeliveryCallback, RecordFuture, SendBatchCall
from logstore.client.producer.metadata import TopicInfo, TopicMetadata
from logstore.client.producer.record_buffer import KEYED, STICKY
from logstore.client.producer.sender import Sender
from logstore.client.producer.transaction_manager import TransactionManager
from logstore.client.rpc import DEFAULT_REQUEST_TIMEOUT_MS, BrokerClient
from logstore.client.security import ClientSecurity
from logstore.client.throttle import default_client_id
from logstore.errors import (
    LogstoreError,
    RecordTooLargeError,
    SchemaMismatchError,
    UnknownTopicOrPartitionError,
)
from logstore.types import SendBatchResult, TxnRef

__all__ = ["Producer", "DeliveryCallback", "parse_acks"]

HeadersArg = Mapping[str, bytes | str | None] | Iterable[tuple[str, bytes | str | None]] | None

#: Kafka's default ``retries`` (Integer.MAX_VALUE): retry until ``delivery_timeout_ms``.
DEFAULT_RETRIES = 2**31 - 1

_ACKS: dict[object, int] = {"all": -1, "-1": -1, -1: -1, "1": 1, 1: 1, "0": 0, 0: 0}
_COMPRESSIONS = (None, "lz4", "zstd")
# Fixed per-record overhead counted towards batch_size: offset, timestamp, validity, offsets.
_RECORD_OVERHEAD = 24


def parse_acks(acks: object) -> int:
    """``"all"``/-1 → -1, 1 → 1, 0 → 0 (strings accepted); anything else raises ValueError."""
    try:
        return _ACKS[acks]
    except (KeyError, TypeError):
        raise ValueError(f"acks must be 'all', -1, 1 or 0, got {acks!r}") from None


class Producer:
    """Appends records to topics; see the module docstring for the semantics.

    Options (keyword-only except ``bootstrap``; Kafka's names in snake case):

    * ``bootstrap`` — ``"host:port"`` of a broker (default ``$LOGSTORE_BOOTSTRAP``
      or ``127.0.0.1:9392``; a list or comma-separated string is accepted, see
      :mod:`logstore.client.bootstrap`);
    * ``bootstrap_servers`` — kafka-python's name for ``bootstrap`` (give one of them);
    * security — ``security_protocol``, ``ssl_cafile``, ``ssl_certfile``, ``ssl_keyfile``,
      ``sasl_mechanism``, ``sasl_plain_username``, ``sasl_plain_password`` (kafka-python's
      names) or ``security=ClientSecurity(...)``; or pass a confluent-style config dict
      first (:mod:`logstore.client.client_config`);
    * ``acks`` — ``"all"``/-1 (default), 1 or 0;
    * ``linger_ms`` — how long a batch stays open for more records (default 5);
    * ``batch_size`` — bytes per partition batch, uncompressed estimate (default 1 MiB);
    * ``max_request_size`` — bytes per produce request, and the largest record (default 16 MiB);
    * ``compression`` (kafka-python's ``compression_type``) — None, ``"lz4"`` or ``"zstd"``
      (Arrow IPC buffer compression; Arrow has no gzip or snappy);
    * ``retries`` — attempts after the first for a retriable error, an unreachable broker
      included (default ``2**31 - 1``: effectively until ``delivery_timeout_ms``, as Kafka);
    * ``retry_backoff_ms`` (default 100), ``retry_backoff_max_ms`` (default 1000) — the wait
      before a retry doubles per attempt from the first up to the second, ±20 % jitter;
    * ``request_timeout_ms`` — how long the broker and the client wait for one request (default 30 s);
    * ``delivery_timeout_ms`` — upper bound from ``send`` to success or failure (default 120 s);
    * ``buffer_memory`` — bytes of sealed batches waiting to be sent (default 128 MiB);
    * ``max_block_ms`` — how long ``send``/``send_batch`` wait for metadata or buffer room (default 60 s);
    * ``max_in_flight_requests_per_connection`` — produce requests in flight (default 5, at
      most 5 with idempotence, as Kafka);
    * ``enable_idempotence`` — number batches so retries never duplicate (default True);
    * ``transactional_id`` — makes the producer transactional (implies idempotence);
    * ``transaction_timeout_ms`` — the broker aborts a transaction open longer (default 60 s);
    * ``client_id`` — what broker quotas know this producer by (default ``logstore-producer-N``);
      a throttled producer waits the broker's throttle time before its next request.

    Use as a context manager, or call :meth:`close`. Thread-safe.
    """

    @accepts_client_config  # a confluent-style dict, kafka-python's security keywords
    def __init__(
        self,
        bootstrap: BootstrapArg = None,
        *,
        bootstrap_servers: BootstrapArg = None,
        security: ClientSecurity | None = None,
        acks: int | str = "all",
        linger_ms: int = 5,
        batch_size: int = 1 << 20,
        max_request_size: int = 16 << 20,
        compression: str | None = None,
        retries: int = DEFAULT_RETRIES,
        retry_backoff_ms: int = 100,
        retry_backoff_max_ms: int = 1000,
        request_timeout_ms: int = DEFAULT_REQUEST_TIMEOUT_MS,
        delivery_timeout_ms: int = 120_000,
        buffer_memory: int = 128 << 20,
        max_block_ms: int = 60_000,
        max_in_flight_requests_per_connection: int = 5,
        enable_idempotence: bool = True,
        transactional_id: str | None = None,
        transaction_timeout_ms: int = 60_000,
        client_id: str | None = None,
    ) -> None:
        if compression not in _COMPRESSIONS:
            raise ValueError(f"compression must be None, 'lz4' or 'zstd' (Arrow IPC has no gzip or snappy), "
                             f"got {compression!r}")
        for name, value, low in (
            ("linger_ms", linger_ms, 0), ("batch_size", batch_size, 1),
            ("max_request_size", max_request_size, 1), ("retries", retries, 0),
            ("retry_backoff_ms", retry_backoff_ms, 0), ("retry_backoff_max_ms", retry_backoff_max_ms, 0),
            ("request_timeout_ms", request_timeout_ms, 1),
            ("delivery_timeout_ms", delivery_timeout_ms, 1), ("buffer_memory", buffer_memory, 1),
            ("max_block_ms", max_block_ms, 0),
            ("max_in_flight_requests_per_connection", max_in_flight_requests_per_connection, 1),
        ):
            if not isinstance(value, int) or isinstance(value, bool) or value < low:
                raise ValueError(f"{name} must be an integer >= {low}, got {value!r}")
        acks_value = parse_acks(acks)
        if transactional_id is not None and (not isinstance(transactional_id, str) or not transactional_id):
            raise ValueError(f"transactional_id must be a non-empty str, got {transactional_id!r}")
        if transactional_id is not None and acks_value != -1:
            raise ValueError("a transactional producer needs acks='all'")
        idempotent = enable_idempotence or transactional_id is not None
        if idempotent and max_in_flight_requests_per_connection > 5:
            raise ValueError(
                "max_in_flight_requests_per_connection must be at most 5 with idempotence (the "
                f"broker remembers a producer's last 5 batches), got {max_in_flight_requests_per_connection}"
            )
        self._idempotent = idempotent
        self._max_request_size = max_request_size

        client = BrokerClient(resolve_bootstrap(bootstrap, bootstrap_servers), request_timeout_ms=request_timeout_ms,
                              security=security,
                              client_id=default_client_id("producer") if client_id is None else client_id)
        self._connection = client
        self._metadata = TopicMetadata(client, max_block_ms=max_block_ms)
        self._accumulator = RecordAccumulator(
            batch_size=batch_size, linger_ms=linger_ms, max_request_size=max_request_size,
            buffer_memory=buffer_memory, max_block_ms=max_block_ms,
            retry_backoff_ms=retry_backoff_ms, delivery_timeout_ms=delivery_timeout_ms,
            compression=compression, idempotent=idempotent,
            transactional=transactional_id is not None, sticky=StickyPartitioner(),
        )
        self._txn = TransactionManager(
            client, self._accumulator, transactional_id=transactional_id, idempotent=idempotent,
            transaction_timeout_ms=transaction_timeout_ms, delivery_timeout_ms=delivery_timeout_ms,
            retry_backoff_ms=retry_backoff_ms, retry_backoff_max_ms=retry_backoff_max_ms,
        )
        self._sender = Sender(
            client, self._accumulator, self._txn, acks=acks_value, retries=retries,
            retry_backoff_ms=retry_backoff_ms, retry_backoff_max_ms=retry_backoff_max_ms,
            delivery_timeout_ms=delivery_timeout_ms,
            request_timeout_ms=request_timeout_ms, forget_topic=self._metadata.forget,
            max_in_flight=max_in_flight_requests_per_connection,
        )
        self._sender.start()

    @property
    def _client(self) -> BrokerClient:
        """The broker connection, shared by the collaborators (tests swap it for a fake)."""
        return self._connection

    @_client.setter
    def _client(self, client: BrokerClient) -> None:
        self._connection = client
        self._metadata.client = client
        self._txn.client = client
        self._sender.client = client

    # ------------------------------------------------------------------ public API

    @property
    def bootstrap(self) -> str:
        return self._connection.bootstrap

    def __enter__(self) -> Producer:
        return self

    def __exit__(self, exc_type: type[BaseException] | None, *exc_info: object) -> None:
        # On KeyboardInterrupt/SystemExit (not an Exception) do not wait for outstanding records.
        interrupted = exc_type is not None and not issubclass(exc_type, Exception)
        self.close(timeout=0 if interrupted else None)

    def __reduce__(self) -> Any:
        raise TypeError("a Producer cannot be pickled; create one per process from its bootstrap")

    def partitions_for(self, topic: str) -> list[int]:
        """The partition numbers of ``topic`` (from cached metadata, fetched if needed)."""
        return list(range(self._metadata.topic(topic).num_partitions))

    def send(
        self,
        topic: str,
        value: bytes | str | Mapping[str, Any] | None = None,
        *,
        key: bytes | str | None = None,
        headers: HeadersArg = None,
        partition: int | None = None,
        timestamp_ms: int | None = None,
        on_delivery: DeliveryCallback | None = None,
    ) -> RecordFuture:
        """Queue one record; return a future of where it was appended.

        ``value``: bytes; str (UTF-8); a dict (JSON-encoded for an untyped
        topic, the row of value columns for a typed topic); None (a
        tombstone). ``key``: bytes, str (UTF-8) or None. ``headers``: a dict
        or a list of ``(str, bytes | str | None)`` pairs. ``timestamp_ms``
        defaults to now. ``on_delivery(error, metadata)`` runs on the sender
        thread once the record is acknowledged or has failed. Blocks up to
        ``max_block_ms`` while the buffer is full.

        Raises (synchronously) :class:`TypeError` for values of the wrong type, :class:`ValueError`
        for a timestamp beyond 64 bits,
        :class:`UnknownTopicOrPartitionError` for an unknown topic or partition,
        :class:`SchemaMismatchError` for a dict that names unknown value columns
        or lacks a NOT NULL one, :class:`RecordTooLargeError` for a record
        bigger than ``max_request_size``, :class:`RequestTimedOutError` when
        the buffer stays full, :class:`RuntimeError` after :meth:`close`.
        """
        acc = self._accumulator
        if acc.closing or acc.failure is not None:
            acc.check_open()
        if not self._txn.ready:
            self._txn.ensure_can_send()
        info = self._metadata.cached(topic)
        if info is None:
            info = self._metadata.topic(topic)
        # The common case first (bytes or None, no headers), without calls.
        key_bytes = key if key is None or type(key) is bytes else to_bytes(key, "key")
        if type(value) is bytes and info.value_schema is None:
            stored_value: Any = value
            value_size = len(value)
        else:
            stored_value, value_size = self._stored_value(info, value)
        size = _RECORD_OVERHEAD + value_size
        if key_bytes is not None:
            size += len(key_bytes)
        header_list = None
        if headers is not None:
            header_list = header_entries(headers)
            if header_list:
                size += sum(len(h["key"]) + len(h["value"] or b"") + 8 for h in header_list)
        if size > self._max_request_size:
            raise RecordTooLargeError(
                f"the record is about {size} bytes, larger than max_request_size "
                f"({self._max_request_size})"
            )
        if timestamp_ms is None:
            ts = time.time_ns() // 1_000_000
        else:
            ts = int(timestamp_ms)
            if not -(2**63) <= ts < 2**63:
                raise ValueError(f"timestamp_ms must fit in 64 bits, got {timestamp_ms!r}")
        if partition is not None:
            part = info.check_partition(partition)
        elif key_bytes is not None:
            part = KEYED  # hashed with the batch's other keys when it is sealed
        else:
            part = STICKY
        return acc.append(info, part, key_bytes, stored_value, ts, header_list, size, on_delivery)

    def _stored_value(self, info: TopicInfo, value: object) -> tuple[Any, int]:
        """``value`` as stored (bytes, or a typed topic's row), and its size estimate."""
        if info.value_schema is None:
            if isinstance(value, Mapping):
                value = json.dumps(value, separators=(",", ":")).encode()
            stored: Any = to_bytes(value, "value")
            return stored, len(stored) if stored is not None else 0
        stored = typed_value(info, value)
        if stored is None:
            return None, 0
        if self._idempotent:
            # A batch's sequence numbers are reserved when it is sealed, so a record
            # that would fail conversion later must fail here instead.
            try:
                pa.array([stored], info.value_type)
            except (pa.ArrowException, TypeError, ValueError) as e:
                raise SchemaMismatchError(
                    f"record value does not fit the columns of topic {info.name!r}: {e}"
                ) from None
        return stored, typed_value_size(stored)

    def send_batch(
        self,
        topic: str,
        data: Any,
        *,
        partition: int | None = None,
        key_column: str | None = None,
    ) -> concurrent.futures.Future[SendBatchResult]:
        """Append a columnar batch of records: the fast path (no per-row Python objects).

        ``data`` is a pyarrow ``Table``/``RecordBatch`` or a pandas
        ``DataFrame`` whose columns are described in :func:`to_stored_batch`.
        Rows go to ``partition`` if given; else to the row's ``partition``
        column; else by key (``key_column``, default the ``key`` column) with
        Kafka's murmur2, vectorized; rows without a key go to the topic's
        sticky partition, and a keyless input is cut into ``batch_size``
        chunks spread round-robin over the partitions. Each partition's rows
        keep their input order and are cut into batches of at most
        ``batch_size`` bytes (a single larger row makes its own batch).

        Conversion and encoding run in the calling thread while the sender
        ships earlier batches; this call blocks while the buffer is full (up
        to ``max_block_ms``). The future holds a :class:`SendBatchResult`
        (base offset and count of every batch) or the first error. Batches are
        not atomic as a group (until transactions): some may be appended when
        the future fails.

        Raises synchronously for bad input (:class:`TypeError`,
        :class:`ValueError`, :class:`SchemaMismatchError`), unknown topics or
        partitions, and after :meth:`close`.
        """
        self._accumulator.check_open()
        self._txn.ensure_can_send()
        info = self._metadata.topic(topic)
        if partition is not None:
            info.check_partition(partition)
        n = info.num_partitions
        now_ms = int(time.time() * 1000)
        # Convert everything first, so that bad input fails before anything is queued.
        converted = [
            to_stored_batch(rb, info.schema, key_column=key_column, now_ms=now_ms)
            for rb in input_batches(data)
            if rb.num_rows
        ]
        for _, parts in converted:
            if parts is not None and partition is None and len(parts):
                low, high = int(parts.min()), int(parts.max())
                if low < 0 or high >= n:
                    raise UnknownTopicOrPartitionError(
                        f"partition {low if low < 0 else high} of topic {topic!r} does not exist "
                        f"(it has {n} partitions)"
                    )
        call = SendBatchCall()
        try:
            for stored, parts in converted:
                for p, chunk in self._accumulator.split(info, stored, partition, parts):
                    self._accumulator.append_encoded(info, p, chunk, call)
        except LogstoreError as e:
            call.seal(e)
            return call.future
        call.seal()
        return call.future

    # ------------------------------------------------------------------ transactions

    def init_transactions(self) -> None:
        """Register the transactional id: fences older producers with the same id and aborts
        their open transaction. Call once, before the first transaction."""
        self._txn.init_transactions()

    def begin_transaction(self) -> None:
        """Start a transaction: records sent until commit/abort belong to it."""
        self._txn.begin()

    def transaction_ref(self) -> TxnRef | None:
        """The open transaction as the broker knows it (None before it touched a partition)."""
        return self._txn.transaction_ref()

    def prepare_transaction(self) -> TxnRef | None:
        """Flush and check the open transaction without ending it; return its reference.

        For writers whose transaction another process ends (the Spark sink's
        driver ends a micro-batch's transactions together).
        """
        return self._txn.prepare()

    def commit_transaction(self) -> None:
        """Flush, then commit: every record of the transaction becomes visible atomically."""
        self._txn.commit()

    def abort_transaction(self) -> None:
        """Flush, then abort: no record of the transaction ever becomes visible to read_committed."""
        self._txn.abort()

    # ------------------------------------------------------------------ flush and close

    def flush(self, timeout: float | None = None) -> int:
        """Send every record queued so far and wait for their outcomes.

        Returns the number of those records still undelivered when ``timeout``
        seconds passed (0 = each was acknowledged or failed; see its future).
        """
        return self._accumulator.flush(timeout)

    def close(self, timeout: float | None = None) -> None:
        """Flush, then stop the sender and close the connection. Idempotent.

        Records not delivered within ``timeout`` seconds (None = no limit)
        fail with :class:`RequestTimedOutError`; :meth:`send` raises
        RuntimeError afterwards. An open transaction is left open, as Kafka's
        producer leaves it: another process may end it (the Spark sink's
        driver does), or the broker aborts it after ``transaction_timeout_ms``.
        """
        deadline = None if timeout is None else time.monotonic() + timeout
        acc = self._accumulator
        with acc.lock:
            first = not acc.closing
            acc.closing = True
        if first:
            self.flush(timeout)
            self._sender.stop(deadline)
            self._connection.close()  # cancels what is still in flight
        self._sender.join()
