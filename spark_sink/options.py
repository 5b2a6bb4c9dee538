"""Options of the ``logstore`` Spark sink, parsed and validated once.

=============================  ================================================================
``logstore.bootstrap.servers``  ``host:port`` of a broker (default ``$LOGSTORE_BOOTSTRAP`` or the
                                embedded default)
``topic``                       the topic to write when rows have no ``topic`` column (a
                                ``topic`` column, when present, wins row by row, as in Spark's
                                Kafka sink)
``sinkId``                      the sink's identity in the log (default: derived from the
                                streaming query's ``checkpointLocation``; required for batch
                                writes that must be idempotent, see ``batchId``)
``batchId``                     batch writes only: the batch number under ``sinkId``; a batch
                                id at or below the last committed one is not written again
``transaction.timeout.ms``      how long a task's open transaction may wait for the driver's
                                commit before the broker aborts it (default 900000)
``compression``                 ``none`` (default), ``lz4`` or ``zstd``
``batch.size``                  bytes per partition batch (default 4 MiB)
``linger.ms``                   (default 0: a task sends as it converts)
=============================  ================================================================

Security: ``logstore.security.protocol``, ``logstore.ssl.*``, ``logstore.sasl.*`` and their
``kafka.`` spellings, as the source takes them (:mod:`spark_source.options`).

``kafka.bootstrap.servers`` (Spark's Kafka sink spelling) is a synonym of
``logstore.bootstrap.servers``; both with different values is an error.

Exactly-once needs ``acks=all``: the sink always uses it.

Thread-safety: instances are frozen and picklable.
"""

from __future__ import annotations

import hashlib
import os
import re
from collections.abc import Mapping
from dataclasses import dataclass

from logstore.client.bootstrap import parse_bootstrap_list
from logstore.client.security import ClientSecurity, security_from_prefixed_options
from logstore.defaults import default_bootstrap
from logstore.errors import InvalidBootstrapError, InvalidConfigError
from logstore.naming import validate_topic_name

__all__ = ["SinkOptions", "SinkOptionError", "parse_sink_options"]

# Spark's own writer settings, which it passes to the sink with the options.
_SPARKS = {"checkpointlocation", "path", "queryname"}
_KNOWN = {
    "logstore.bootstrap.servers", "topic", "sinkid", "batchid", "transaction.timeout.ms",
    "compression", "batch.size", "linger.ms", *_SPARKS,
}
# Spark's Kafka sink spellings (lower-cased) -> ours.
SYNONYMS = {"kafka.bootstrap.servers": "logstore.bootstrap.servers"}


class SinkOptionError(InvalidConfigError):
    """An option of the logstore Spark sink is unknown or malformed."""


@dataclass(frozen=True, slots=True)
class SinkOptions:
    bootstrap: str
    topic: str | None
    sink_id: str | None
    batch_id: int | None
    transaction_timeout_ms: int
    compression: str | None
    batch_size: int
    linger_ms: int
    # TLS/SCRAM of every connection, the driver's and the tasks' (its repr hides the password).
    security: ClientSecurity | None = None


def _int(opts: Mapping[str, str], key: str, default: int, *, minimum: int) -> int:
    raw = opts.get(key)
    if raw is None:
        return default
    try:
        value = int(raw)
    except ValueError:
        raise SinkOptionError(f"option {key} = {raw!r} is not an integer") from None
    if value < minimum:
        raise SinkOptionError(f"option {key} must be >= {minimum}, got {value}")
    return value


def sink_id_for_checkpoint(checkpoint: str) -> str:
    """A stable sink identity for a streaming query's checkpoint location."""
    normalized = os.path.normpath(os.path.abspath(checkpoint)) if "://" not in checkpoint else checkpoint
    return "ckpt-" + hashlib.sha256(normalized.encode()).hexdigest()[:24]


def _apply_synonyms(opts: Mapping[str, str]) -> dict[str, str]:
    """``opts`` with Spark's Kafka spellings renamed to ours; both with different values is an error."""
    out = {k: v for k, v in opts.items() if k not in SYNONYMS}
    for theirs, ours in SYNONYMS.items():
        if theirs not in opts:
            continue
        if ours in out and out[ours].strip() != opts[theirs].strip():
            raise SinkOptionError(
                f"options {theirs} = {opts[theirs]!r} and {ours} = {out[ours]!r} are the same option "
                "with different values; give one of them"
            )
        out[ours] = opts[theirs]
    return out


def parse_sink_options(options: Mapping[str, str], *, streaming: bool) -> SinkOptions:
    opts = _apply_synonyms({str(k).lower(): str(v) for k, v in options.items()})
    try:  # logstore.security.protocol, logstore.ssl.*, logstore.sasl.* and their kafka.* spellings
        security, security_keys = security_from_prefixed_options(opts)
    except InvalidConfigError as e:
        raise SinkOptionError(e.message) from None
    for key in opts.keys() - security_keys:
        if key not in _KNOWN:
            raise SinkOptionError(
                f"unknown option {key!r} for writing format logstore; known options: "
                + ", ".join(sorted((_KNOWN - _SPARKS) | set(SYNONYMS)))
            )
    topic = opts.get("topic")
    if topic is not None:
        validate_topic_name(topic)
    bootstrap = opts.get("logstore.bootstrap.servers") or default_bootstrap()
    try:
        bootstrap = ",".join(parse_bootstrap_list(bootstrap))  # a cluster: several brokers
    except InvalidBootstrapError as e:
        raise SinkOptionError(
            f"option logstore.bootstrap.servers = {bootstrap!r} must be host:port[,host:port]: {e.message}"
        ) from None
    sink_id = opts.get("sinkid")
    if sink_id is not None and not re.fullmatch(r"[A-Za-z0-9._-]{1,200}", sink_id):
        raise SinkOptionError(
            f"option sinkId = {sink_id!r} must be 1-200 characters from [A-Za-z0-9._-]"
        )
    if streaming:
        if "batchid" in opts:
            raise SinkOptionError("option batchId is for batch writes; a stream numbers its own batches")
        if sink_id is None:
            checkpoint = opts.get("checkpointlocation")
            if checkpoint is None:
                raise SinkOptionError(
                    "an exactly-once streaming write needs an identity: set checkpointLocation "
                    "(or the option sinkId)"
                )
            sink_id = sink_id_for_checkpoint(checkpoint)
    batch_id = None
    if "batchid" in opts:
        batch_id = _int(opts, "batchid", 0, minimum=0)
        if sink_id is None:
            raise SinkOptionError("option batchId needs the option sinkId (the writer's identity)")
    compression = opts.get("compression", "none").strip().lower()
    if compression not in ("none", "lz4", "zstd"):
        raise SinkOptionError(f"option compression must be none, lz4 or zstd, got {compression!r}")
    return SinkOptions(
        bootstrap=bootstrap.strip(),
        topic=topic,
        sink_id=sink_id,
        batch_id=batch_id,
        transaction_timeout_ms=_int(opts, "transaction.timeout.ms", 900_000, minimum=1000),
        compression=None if compression == "none" else compression,
        batch_size=_int(opts, "batch.size", 4 << 20, minimum=1024),
        linger_ms=_int(opts, "linger.ms", 0, minimum=0),
        security=security,
    )
