"""Options of the ``logstore`` Spark source, parsed and validated once.

The names and meanings are those of Spark's Kafka source, so a Kafka user
needs no new vocabulary (option names are case-insensitive, as in Spark):

==============================  ==============================================================
``logstore.bootstrap.servers``  ``host:port`` of a broker, or a comma-separated list of a cluster's (default: ``$LOGSTORE_BOOTSTRAP`` or
                                the embedded default)
``subscribe``                   comma-separated topics                       } exactly one
``subscribePattern``            Java/Python regex over topic names           } of these
``assign``                      JSON ``{"topic": [0, 1]}``                   } three
``startingOffsets``             ``earliest`` | ``latest`` | JSON ``{"t": {"0": 23, "1": -2}}``
                                (-2 = earliest, -1 = latest); default latest (stream) /
                                earliest (batch)
``startingTimestamp``           ms since epoch, for every partition
``startingOffsetsByTimestamp``  JSON ``{"t": {"0": 1700000000000}}``
``startingOffsetsByTimestampStrategy``  ``error`` (default) | ``latest``: what to do when no
                                record is as recent as the timestamp
``endingOffsets``               batch only: ``latest`` | JSON (as startingOffsets, -1 = latest)
``endingTimestamp``             batch only: ms since epoch
``endingOffsetsByTimestamp``    batch only: JSON per partition
``minPartitions``               at least this many Spark tasks (large ranges are split)
``maxRecordsPerPartition``      at most this many offsets per Spark task
``maxOffsetsPerTrigger``        streaming: at most this many offsets per micro-batch,
                                split across partitions by lag
``minOffsetsPerTrigger``        streaming: wait for this many new offsets ...
``maxTriggerDelay``             ... but no longer than this (e.g. ``15m``, ``30s``; default 15m)
``failOnDataLoss``              ``true`` (default) | ``false``
``includeHeaders``              ``false`` (default) | ``true``
``isolationLevel``              ``read_committed`` (default) | ``read_uncommitted``
``fetchMaxBytes``               bytes per fetch request of a task (default 32 MiB)
``fetchTimeoutMs``              ms a task waits for the broker before failing (default 120000)
``fetchOffset.numRetries``      how many times the driver retries a retriable failure (broker
                                unavailable, timed out, not leader) when it looks up partitions
                                and offsets (default 3)
``fetchOffset.retryIntervalMs`` ms between those retries (default 10)
``pushFilters``                 batch reads: ``true`` (default) | ``false``: take no filters from
                                Spark (:mod:`spark_source.pushdown`); needed to read with the
                                session's ``spark.sql.python.filterPushdown.enabled`` off, which
                                Spark refuses for a reader that implements ``pushFilters``
``commitOffsetsToGroup``        streaming: after each micro-batch, commit its end offsets as the
                                committed offsets of this consumer group, so that lag tooling
                                (``logstore groups describe``) sees the query; the query's own
                                position stays in its checkpoint
``groupIdPrefix``               streaming: the same, to the group ``<prefix>-<random id>``, new for
                                every run of the query (as Spark's Kafka source names its groups)
==============================  ==============================================================

Reporting to a group is best effort: a commit the broker refuses (e.g. the
group has active members: NON_EMPTY_GROUP) or cannot take is logged as a
warning and never fails the query. The reported offsets are those of the last
micro-batch Spark completed (sent from ``commit(end)`` and when the next batch
is planned), so they trail the running batch by at most one.

Security (issue 12): ``logstore.security.protocol`` (PLAINTEXT | SSL | SASL_PLAINTEXT |
SASL_SSL), ``logstore.ssl.ca.location``, ``logstore.ssl.certificate.location``,
``logstore.ssl.key.location``, ``logstore.sasl.mechanism`` (SCRAM-SHA-256 | SCRAM-SHA-512),
``logstore.sasl.username``, ``logstore.sasl.password``, and the same names behind ``kafka.``
(plus ``kafka.sasl.jaas.config``), see
:func:`logstore.client.security.security_from_prefixed_options`. The password is never
shown: ``SourceOptions``' repr hides it, Spark redacts option keys and values matching
``spark.redaction.regex`` (``password``) in plans, and options never reach the checkpoint.

Spark's Kafka spellings are synonyms (:data:`SYNONYMS`):
``kafka.bootstrap.servers`` = ``logstore.bootstrap.servers``,
``kafka.isolation.level`` = ``isolationLevel``, ``kafkaConsumer.pollTimeoutMs`` =
``fetchTimeoutMs``. Both spellings of one option with different values is an
error; with the same value, harmless.

A ``startingOffsets``/``endingOffsets`` JSON that names a topic must list every
partition of it (as Spark's Kafka source requires; checked by the planner,
which knows the partitions); topics it does not name start at earliest and end
at latest.

Precedence of starting positions (as in Spark's Kafka source):
``startingOffsetsByTimestamp`` > ``startingTimestamp`` > ``startingOffsets``;
likewise for the ending ones.

Every error is a :class:`SourceOptionError` naming the option and saying
what to do. Nothing else in ``spark_source`` reads raw option strings.

Thread-safety: instances are frozen and picklable.
"""

from __future__ import annotations

import json
import re
from collections.abc import Mapping
from dataclasses import dataclass

from logstore.client.bootstrap import parse_bootstrap_list
from logstore.client.security import ClientSecurity, security_from_prefixed_options
from logstore.defaults import default_bootstrap
from logstore.errors import InvalidBootstrapError, InvalidConfigError

__all__ = [
    "SourceOptions",
    "SourceOptionError",
    "EARLIEST",
    "LATEST",
    "OffsetSpec",
    "parse_source_options",
    "parse_duration_ms",
]

EARLIEST = -2
LATEST = -1

KNOWN_OPTIONS = {
    "logstore.bootstrap.servers",
    "subscribe",
    "subscribepattern",
    "assign",
    "startingoffsets",
    "startingtimestamp",
    "startingoffsetsbytimestamp",
    "startingoffsetsbytimestampstrategy",
    "endingoffsets",
    "endingtimestamp",
    "endingoffsetsbytimestamp",
    "minpartitions",
    "maxrecordsperpartition",
    "maxoffsetspertrigger",
    "minoffsetspertrigger",
    "maxtriggerdelay",
    "failondataloss",
    "includeheaders",
    "isolationlevel",
    "fetchmaxbytes",
    "fetchtimeoutms",
    "commitoffsetstogroup",
    "groupidprefix",
    "fetchoffset.numretries",
    "fetchoffset.retryintervalms",
    "pushfilters",
    # Sink options share the format name; the sink validates them.
    "topic",
}
# Spark's Kafka connector spellings (lower-cased) -> ours: the same option under another name.
SYNONYMS = {
    "kafka.bootstrap.servers": "logstore.bootstrap.servers",
    "kafka.isolation.level": "isolationlevel",
    "kafkaconsumer.polltimeoutms": "fetchtimeoutms",
}
# Spark's Kafka options that logstore answers differently; a clear hint beats "unknown".
_HINTS = {
    "kafka.group.id": "the query's offsets stay in its checkpoint; to report its progress as a consumer "
                      "group's committed offsets, use commitOffsetsToGroup (or groupIdPrefix)",
}


class SourceOptionError(InvalidConfigError):
    """An option of the logstore Spark source is unknown, malformed or contradicts another."""


@dataclass(frozen=True, slots=True)
class OffsetSpec:
    """Where to start or end: one of the ``kind`` values below.

    * ``"earliest"`` / ``"latest"`` — every partition;
    * ``"offsets"`` — ``offsets[topic][partition]``, with -2/-1 for earliest/latest;
      partitions not listed use ``default`` (earliest for starting, latest for ending);
    * ``"timestamp"`` — ``timestamp_ms`` for every partition;
    * ``"timestamps"`` — ``offsets[topic][partition]`` holds a timestamp per partition.
    """

    kind: str
    offsets: Mapping[str, Mapping[int, int]] | None = None
    timestamp_ms: int | None = None

    def describe(self) -> str:
        if self.kind in ("earliest", "latest"):
            return self.kind
        if self.kind == "timestamp":
            return f"timestamp {self.timestamp_ms}"
        return json.dumps({t: {str(p): o for p, o in ps.items()} for t, ps in (self.offsets or {}).items()})


@dataclass(frozen=True, slots=True)
class SourceOptions:
    bootstrap: str
    subscribe: tuple[str, ...] | None
    subscribe_pattern: str | None
    assign: Mapping[str, tuple[int, ...]] | None
    starting: OffsetSpec
    ending: OffsetSpec
    timestamp_strategy: str
    min_partitions: int | None
    max_records_per_partition: int | None
    max_offsets_per_trigger: int | None
    min_offsets_per_trigger: int | None
    max_trigger_delay_ms: int
    fail_on_data_loss: bool
    include_headers: bool
    isolation_level: str
    fetch_max_bytes: int
    fetch_timeout_ms: int
    commit_offsets_to_group: str | None = None
    group_id_prefix: str | None = None
    fetch_offset_num_retries: int = 3
    fetch_offset_retry_interval_ms: int = 10
    # TLS/SCRAM of every connection, the driver's and the tasks' (its repr hides the password).
    security: ClientSecurity | None = None
    push_filters: bool = True

    @property
    def read_committed(self) -> bool:
        return self.isolation_level == "read_committed"

    def matches(self, topic: str) -> bool:
        """Whether ``topic`` belongs to the subscription."""
        if self.subscribe is not None:
            return topic in self.subscribe
        if self.assign is not None:
            return topic in self.assign
        assert self.subscribe_pattern is not None
        return re.fullmatch(self.subscribe_pattern, topic) is not None


def parse_duration_ms(text: str, *, option: str) -> int:
    """``"15m"``, ``"30s"``, ``"500ms"``, ``"2h"``, ``"1d"`` or a plain number of ms."""
    m = re.fullmatch(r"\s*(\d+)\s*(ms|s|m|min|h|d)?\s*", text.lower())
    if not m:
        raise SourceOptionError(
            f"option {option} = {text!r} is not a duration; use e.g. 500ms, 30s, 15m, 2h"
        )
    n = int(m.group(1))
    unit = m.group(2) or "ms"
    return n * {"ms": 1, "s": 1000, "m": 60_000, "min": 60_000, "h": 3_600_000, "d": 86_400_000}[unit]


def _int(opts: Mapping[str, str], key: str, name: str, *, minimum: int) -> int | None:
    raw = opts.get(key)
    if raw is None:
        return None
    try:
        value = int(str(raw).strip())
    except ValueError:
        raise SourceOptionError(f"option {name} = {raw!r} is not an integer") from None
    if value < minimum:
        raise SourceOptionError(f"option {name} must be >= {minimum}, got {value}")
    return value


def _bool(opts: Mapping[str, str], key: str, name: str, default: bool) -> bool:
    raw = opts.get(key)
    if raw is None:
        return default
    text = str(raw).strip().lower()
    if text not in ("true", "false"):
        raise SourceOptionError(f"option {name} must be true or false, got {raw!r}")
    return text == "true"


def _json_partition_map(raw: str, name: str, *, what: str) -> dict[str, dict[int, int]]:
    try:
        doc = json.loads(raw)
        if not isinstance(doc, dict):
            raise ValueError("not an object")
        out: dict[str, dict[int, int]] = {}
        for topic, parts in doc.items():
            if not isinstance(parts, dict):
                raise ValueError(f"value for topic {topic!r} is not an object")
            out[str(topic)] = {int(p): int(v) for p, v in parts.items()}
        return out
    except (ValueError, TypeError) as e:
        raise SourceOptionError(
            f"option {name} = {raw!r} is not valid JSON of the form "
            f'{{"topic": {{"0": {what}}}}}: {e}'
        ) from None


def _offsets_spec(raw: str, name: str, *, allow_earliest: bool, allow_latest: bool) -> OffsetSpec:
    text = raw.strip()
    if text.lower() == "earliest":
        if not allow_earliest:
            raise SourceOptionError(f"option {name} cannot be 'earliest' here")
        return OffsetSpec("earliest")
    if text.lower() == "latest":
        if not allow_latest:
            raise SourceOptionError(f"option {name} cannot be 'latest' here")
        return OffsetSpec("latest")
    offsets = _json_partition_map(text, name, what="offset")
    for topic, parts in offsets.items():
        for p, o in parts.items():
            if o < EARLIEST:
                raise SourceOptionError(
                    f"option {name}: offset {o} for {topic}-{p} is invalid; use -2 (earliest), "
                    "-1 (latest) or a non-negative offset"
                )
            if o == EARLIEST and not allow_earliest:
                raise SourceOptionError(f"option {name}: -2 (earliest) is not allowed for {topic}-{p}")
            if o == LATEST and not allow_latest:
                raise SourceOptionError(f"option {name}: -1 (latest) is not allowed for {topic}-{p}")
    return OffsetSpec("offsets", offsets=offsets)


def _position(
    opts: Mapping[str, str], prefix: str, *, default: OffsetSpec, allow_earliest: bool, allow_latest: bool
) -> OffsetSpec:
    by_ts = opts.get(f"{prefix}offsetsbytimestamp")
    if by_ts is not None:
        return OffsetSpec("timestamps", offsets=_json_partition_map(str(by_ts), f"{prefix}OffsetsByTimestamp", what="timestamp"))
    ts = opts.get(f"{prefix}timestamp")
    if ts is not None:
        value = _int(opts, f"{prefix}timestamp", f"{prefix}Timestamp", minimum=0)
        return OffsetSpec("timestamp", timestamp_ms=value)
    raw = opts.get(f"{prefix}offsets")
    if raw is None:
        return default
    return _offsets_spec(str(raw), f"{prefix}Offsets", allow_earliest=allow_earliest, allow_latest=allow_latest)


def apply_synonyms(opts: Mapping[str, str]) -> dict[str, str]:
    """``opts`` (keys lower-cased) with Spark's Kafka spellings renamed to ours.

    Raises :class:`SourceOptionError` when both spellings of one option are
    given with different values.
    """
    out = {k: v for k, v in opts.items() if k not in SYNONYMS}
    for theirs, ours in SYNONYMS.items():
        if theirs not in opts:
            continue
        value = opts[theirs]
        if ours in out and out[ours].strip() != value.strip():
            raise SourceOptionError(
                f"options {theirs} = {value!r} and {ours} = {out[ours]!r} are the same option "
                "with different values; give one of them"
            )
        out[ours] = value
    return out


def parse_source_options(options: Mapping[str, str], *, streaming: bool) -> SourceOptions:
    """Validate ``options`` (as Spark passes them: keys lower-cased) for a stream or batch read."""
    opts = apply_synonyms({str(k).lower(): str(v) for k, v in options.items()})
    try:  # logstore.security.protocol, logstore.ssl.*, logstore.sasl.* and their kafka.* spellings
        security, security_keys = security_from_prefixed_options(opts)
    except InvalidConfigError as e:
        raise SourceOptionError(e.message) from None
    for key in opts.keys() - security_keys:
        if key in _HINTS:
            raise SourceOptionError(f"option {key} is not supported: {_HINTS[key]}")
        if key not in KNOWN_OPTIONS:
            raise SourceOptionError(
                f"unknown option {key!r} for format logstore; known options: "
                + ", ".join(sorted((KNOWN_OPTIONS - {"topic"}) | set(SYNONYMS)))
            )
    chosen = [k for k in ("subscribe", "subscribepattern", "assign") if k in opts]
    if len(chosen) != 1:
        raise SourceOptionError(
            "exactly one of the options subscribe, subscribePattern and assign must be given"
            + (f" (got {', '.join(chosen)})" if chosen else "")
        )
    subscribe = pattern = None
    assign = None
    if "subscribe" in opts:
        topics = tuple(t.strip() for t in opts["subscribe"].split(",") if t.strip())
        if not topics:
            raise SourceOptionError("option subscribe needs at least one topic name")
        subscribe = topics
    elif "subscribepattern" in opts:
        pattern = opts["subscribepattern"].strip()
        try:
            re.compile(pattern)
        except re.error as e:
            raise SourceOptionError(f"option subscribePattern {pattern!r} is not a valid regex: {e}") from None
        if not pattern:
            raise SourceOptionError("option subscribePattern is empty")
    else:
        try:
            doc = json.loads(opts["assign"])
            if not isinstance(doc, dict) or not doc:
                raise ValueError("expected a non-empty object")
            assign = {str(t): tuple(int(p) for p in ps) for t, ps in doc.items()}
            if any(not ps or min(ps) < 0 for ps in assign.values()):
                raise ValueError("every topic needs a list of non-negative partition numbers")
        except (ValueError, TypeError) as e:
            raise SourceOptionError(
                f'option assign = {opts["assign"]!r} must be JSON like {{"topic": [0, 1]}}: {e}'
            ) from None

    starting = _position(
        opts, "starting",
        default=OffsetSpec("latest" if streaming else "earliest"),
        allow_earliest=True, allow_latest=True,
    )
    if not streaming and starting.kind == "latest":
        raise SourceOptionError(
            "option startingOffsets = latest is not valid for batch queries; use earliest or JSON offsets"
        )
    ending_given = any(k in opts for k in ("endingoffsets", "endingtimestamp", "endingoffsetsbytimestamp"))
    if streaming and ending_given:
        raise SourceOptionError(
            "options endingOffsets, endingTimestamp and endingOffsetsByTimestamp are for batch "
            "queries only; a streaming query has no end"
        )
    ending = _position(opts, "ending", default=OffsetSpec("latest"), allow_earliest=False, allow_latest=True)

    strategy = opts.get("startingoffsetsbytimestampstrategy", "error").strip().lower()
    if strategy not in ("error", "latest"):
        raise SourceOptionError(
            f"option startingOffsetsByTimestampStrategy must be error or latest, got {strategy!r}"
        )
    isolation = opts.get("isolationlevel", "read_committed").strip().lower()
    if isolation not in ("read_committed", "read_uncommitted"):
        raise SourceOptionError(
            f"option isolationLevel must be read_committed or read_uncommitted, got {isolation!r}"
        )
    max_per_trigger = _int(opts, "maxoffsetspertrigger", "maxOffsetsPerTrigger", minimum=1)
    min_per_trigger = _int(opts, "minoffsetspertrigger", "minOffsetsPerTrigger", minimum=1)
    if not streaming:
        for key, name in (("maxoffsetspertrigger", "maxOffsetsPerTrigger"),
                          ("minoffsetspertrigger", "minOffsetsPerTrigger"),
                          ("maxtriggerdelay", "maxTriggerDelay")):
            if key in opts:
                raise SourceOptionError(f"option {name} applies to streaming queries only")
    if max_per_trigger is not None and min_per_trigger is not None and min_per_trigger > max_per_trigger:
        raise SourceOptionError(
            f"option minOffsetsPerTrigger ({min_per_trigger}) exceeds maxOffsetsPerTrigger ({max_per_trigger})"
        )
    delay = parse_duration_ms(opts.get("maxtriggerdelay", "15m"), option="maxTriggerDelay")
    bootstrap = opts.get("logstore.bootstrap.servers") or default_bootstrap()
    try:
        bootstrap = ",".join(parse_bootstrap_list(bootstrap))  # a cluster: several brokers
    except InvalidBootstrapError as e:
        raise SourceOptionError(
            f"option logstore.bootstrap.servers = {bootstrap!r} must be host:port[,host:port]: {e.message}"
        ) from None
    if "topic" in opts:
        raise SourceOptionError("option topic is for writing; to read, use subscribe")
    commit_group, prefix = _report_group(opts, streaming=streaming)
    retries = _int(opts, "fetchoffset.numretries", "fetchOffset.numRetries", minimum=0)
    retry_ms = _int(opts, "fetchoffset.retryintervalms", "fetchOffset.retryIntervalMs", minimum=0)
    return SourceOptions(
        bootstrap=bootstrap.strip(),
        subscribe=subscribe,
        subscribe_pattern=pattern,
        assign=assign,
        starting=starting,
        ending=ending,
        timestamp_strategy=strategy,
        min_partitions=_int(opts, "minpartitions", "minPartitions", minimum=1),
        max_records_per_partition=_int(opts, "maxrecordsperpartition", "maxRecordsPerPartition", minimum=1),
        max_offsets_per_trigger=max_per_trigger,
        min_offsets_per_trigger=min_per_trigger,
        max_trigger_delay_ms=delay,
        fail_on_data_loss=_bool(opts, "failondataloss", "failOnDataLoss", True),
        include_headers=_bool(opts, "includeheaders", "includeHeaders", False),
        isolation_level=isolation,
        fetch_max_bytes=_int(opts, "fetchmaxbytes", "fetchMaxBytes", minimum=1024) or 32 << 20,
        fetch_timeout_ms=_int(opts, "fetchtimeoutms", "fetchTimeoutMs", minimum=1) or 120_000,
        commit_offsets_to_group=commit_group,
        group_id_prefix=prefix,
        fetch_offset_num_retries=3 if retries is None else retries,
        fetch_offset_retry_interval_ms=10 if retry_ms is None else retry_ms,
        security=security,
        push_filters=_bool(opts, "pushfilters", "pushFilters", True),
    )


def _report_group(opts: Mapping[str, str], *, streaming: bool) -> tuple[str | None, str | None]:
    """commitOffsetsToGroup / groupIdPrefix: at most one, streaming only, a usable group id."""
    group = opts.get("commitoffsetstogroup")
    prefix = opts.get("groupidprefix")
    if group is None and prefix is None:
        return None, None
    if group is not None and prefix is not None:
        raise SourceOptionError("give commitOffsetsToGroup or groupIdPrefix, not both")
    name = "commitOffsetsToGroup" if group is not None else "groupIdPrefix"
    if not streaming:
        raise SourceOptionError(
            f"option {name} applies to streaming queries only: a batch query has no progress to report"
        )
    value = (group if group is not None else prefix or "").strip()
    longest = len(value) + (0 if group is not None else 33)  # a prefix gets "-<32 hex digits>"
    if not value or longest > 249 or any(ord(c) < 32 or ord(c) == 127 for c in value):
        raise SourceOptionError(
            f"option {name} = {value!r} is not a usable group id: it must be non-empty, without control "
            f"characters, and at most 249 characters{'' if group is not None else ' once a 33-character suffix is added'}"
        )
    return (value, None) if group is not None else (None, value)
