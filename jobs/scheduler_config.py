"""The jobs scheduler's configuration: ``jobs.toml`` parsed once into frozen dataclasses.

:func:`load_config` reads a TOML file (see ``conf/jobs.toml`` for every key)
and :func:`parse_config` validates a parsed document into a
:class:`JobsConfig`; nothing else reads raw configuration values. Durations
are ``"500ms"``, ``"30s"``, ``"10 seconds"``, ``"5m"``, ``"2h"``, ``"1d"`` or a
number of seconds (:func:`parse_duration_s`). Errors
(:class:`JobsConfigError`) name the file and the key, e.g. ``conf/jobs.toml:
compaction.interval: expected a duration such as "30s" or "5m", got "soon"``;
unknown keys are refused with the list of known ones.

Thread-safety: pure functions and immutable values.
"""

from __future__ import annotations

import math
import re
import sys
from collections.abc import Collection, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from logstore.defaults import default_bootstrap
from logstore.errors import InvalidConfigError, LogstoreError

if sys.version_info >= (3, 11):
    import tomllib
else:  # pragma: no cover - exercised on Python 3.10 only
    import tomli as tomllib

__all__ = [
    "JobsConfig",
    "JobsConfigError",
    "CompactionConfig",
    "ViewConfig",
    "RetryPolicy",
    "SparkConfig",
    "load_config",
    "parse_config",
    "parse_duration_s",
]


class JobsConfigError(InvalidConfigError):
    """The jobs configuration file is unreadable, or a key is unknown, missing or malformed."""


@dataclass(frozen=True, slots=True)
class RetryPolicy:
    """Exponential backoff of a failing job (seconds)."""

    initial_backoff_s: float = 10.0
    max_backoff_s: float = 600.0
    multiplier: float = 2.0
    reset_after_s: float = 300.0


@dataclass(frozen=True, slots=True)
class CompactionConfig:
    """``[compaction]``: whether, how often, and which topics (None = every compacted topic)."""

    enabled: bool = True
    interval_s: float = 300.0
    topics: tuple[str, ...] | None = None


@dataclass(frozen=True, slots=True)
class ViewConfig:
    """One ``[[materialize]]`` entry: the arguments of :func:`jobs.materialize.materialize`."""

    topic: str
    table: str
    checkpoint: str | None = None
    json_schema: str | None = None
    trigger_interval_s: float | None = 10.0
    max_offsets_per_trigger: int | None = None
    source_options: Mapping[str, str] = field(default_factory=dict)

    @property
    def name(self) -> str:
        return f"{self.topic} -> {self.table}"


@dataclass(frozen=True, slots=True)
class SparkConfig:
    """``[spark]``: the SparkSession the scheduler builds (Delta is always on)."""

    master: str = "local[2]"
    app_name: str = "logstore-jobs"
    conf: Mapping[str, str] = field(default_factory=dict)


@dataclass(frozen=True, slots=True)
class JobsConfig:
    """The whole ``jobs.toml``; ``tick_s`` is how often views are looked after; ``status_file``
    (None: none) the JSON file of each job's last run (:mod:`jobs.run_status`)."""

    bootstrap: str
    compaction: CompactionConfig = CompactionConfig()
    views: tuple[ViewConfig, ...] = ()
    retry: RetryPolicy = RetryPolicy()
    spark: SparkConfig = SparkConfig()
    tick_s: float = 5.0
    source: str = "<config>"
    status_file: str | None = None


_UNITS_S = {
    "ms": 0.001, "millisecond": 0.001, "milliseconds": 0.001,
    "s": 1.0, "sec": 1.0, "secs": 1.0, "second": 1.0, "seconds": 1.0,
    "m": 60.0, "min": 60.0, "mins": 60.0, "minute": 60.0, "minutes": 60.0,
    "h": 3600.0, "hour": 3600.0, "hours": 3600.0,
    "d": 86400.0, "day": 86400.0, "days": 86400.0,
}
_DURATION = re.compile(r"\s*(\d+(?:\.\d+)?)\s*([a-z]+)\s*")


def parse_duration_s(value: object, *, where: str, allow_zero: bool = False) -> float:
    """``"500ms"``, ``"30s"``, ``"10 seconds"``, ``"5m"``, ``"2h"``, ``"1d"``, or a number of seconds."""
    if isinstance(value, bool):
        raise JobsConfigError(f"{where}: expected a duration such as \"30s\" or \"5m\", got {value!r}")
    if isinstance(value, (int, float)):
        seconds = float(value)
    else:
        m = _DURATION.fullmatch(str(value).lower()) if isinstance(value, str) else None
        if m is None or m.group(2) not in _UNITS_S:
            raise JobsConfigError(
                f"{where}: expected a duration such as \"30s\" or \"5m\", got {value!r}"
            )
        seconds = float(m.group(1)) * _UNITS_S[m.group(2)]
    if not math.isfinite(seconds) or seconds < 0 or (seconds == 0 and not allow_zero):
        raise JobsConfigError(f"{where}: must be a positive duration, got {value!r}")
    return seconds


def _check_keys(table: Mapping[str, Any], allowed: Collection[str], *, where: str, source: str) -> None:
    unknown = sorted(set(table) - set(allowed))
    if unknown:
        raise JobsConfigError(
            f"{source}: {where + ': ' if where else ''}unknown key{'s' if len(unknown) > 1 else ''} "
            f"{', '.join(unknown)}; known keys: {', '.join(sorted(allowed))}"
        )


def _table(doc: Mapping[str, Any], key: str, *, source: str) -> Mapping[str, Any]:
    value = doc.get(key, {})
    if not isinstance(value, Mapping):
        raise JobsConfigError(f"{source}: [{key}] must be a table, got {value!r}")
    return value


def _str(table: Mapping[str, Any], key: str, *, where: str, source: str, required: bool = False,
         default: str | None = None) -> str | None:
    value = table.get(key)
    if value is None:
        if required:
            raise JobsConfigError(f"{source}: {where}{key} is required")
        return default
    if not isinstance(value, str) or not value.strip():
        raise JobsConfigError(f"{source}: {where}{key}: expected a non-empty string, got {value!r}")
    return value.strip()


def parse_config(doc: Mapping[str, Any], *, source: str = "<config>") -> JobsConfig:
    """Validate a parsed TOML document into a :class:`JobsConfig` (see ``conf/jobs.toml``)."""
    _check_keys(doc, ("bootstrap", "tick", "spark", "compaction", "retry", "materialize", "status_file"),
                where="", source=source)
    bootstrap = _str(doc, "bootstrap", where="", source=source) or default_bootstrap()
    if not re.fullmatch(r"[^\s:,]+:\d+", bootstrap):
        raise JobsConfigError(f"{source}: bootstrap: expected host:port, got {bootstrap!r}")
    tick_s = parse_duration_s(doc.get("tick", 5), where=f"{source}: tick")

    spark_doc = _table(doc, "spark", source=source)
    _check_keys(spark_doc, ("master", "app_name", "conf"), where="[spark]", source=source)
    spark_conf = _table(spark_doc, "conf", source=f"{source}: [spark]")
    spark = SparkConfig(
        master=_str(spark_doc, "master", where="spark.", source=source, default="local[2]") or "local[2]",
        app_name=_str(spark_doc, "app_name", where="spark.", source=source,
                      default="logstore-jobs") or "logstore-jobs",
        conf={str(k): str(v).lower() if isinstance(v, bool) else str(v) for k, v in spark_conf.items()},
    )

    comp = _table(doc, "compaction", source=source)
    _check_keys(comp, ("enabled", "interval", "topics"), where="[compaction]", source=source)
    enabled = comp.get("enabled", True)
    if not isinstance(enabled, bool):
        raise JobsConfigError(f"{source}: compaction.enabled: expected true or false, got {enabled!r}")
    topics_raw = comp.get("topics", "all")
    topics: tuple[str, ...] | None
    if topics_raw == "all":
        topics = None
    elif isinstance(topics_raw, list) and topics_raw and all(isinstance(t, str) and t for t in topics_raw):
        topics = tuple(dict.fromkeys(topics_raw))
    else:
        raise JobsConfigError(
            f'{source}: compaction.topics: expected "all" or a non-empty list of topic names, '
            f"got {topics_raw!r}"
        )
    compaction = CompactionConfig(
        enabled=enabled,
        interval_s=parse_duration_s(comp.get("interval", "5m"), where=f"{source}: compaction.interval"),
        topics=topics,
    )

    retry_doc = _table(doc, "retry", source=source)
    _check_keys(retry_doc, ("initial_backoff", "max_backoff", "multiplier", "reset_after"),
                where="[retry]", source=source)
    multiplier = retry_doc.get("multiplier", 2.0)
    if isinstance(multiplier, bool) or not isinstance(multiplier, (int, float)) or multiplier < 1:
        raise JobsConfigError(f"{source}: retry.multiplier: expected a number >= 1, got {multiplier!r}")
    retry = RetryPolicy(
        initial_backoff_s=parse_duration_s(retry_doc.get("initial_backoff", "10s"),
                                           where=f"{source}: retry.initial_backoff"),
        max_backoff_s=parse_duration_s(retry_doc.get("max_backoff", "10m"),
                                       where=f"{source}: retry.max_backoff"),
        multiplier=float(multiplier),
        reset_after_s=parse_duration_s(retry_doc.get("reset_after", "5m"),
                                       where=f"{source}: retry.reset_after"),
    )
    if retry.max_backoff_s < retry.initial_backoff_s:
        raise JobsConfigError(
            f"{source}: retry.max_backoff ({retry.max_backoff_s:g}s) is shorter than "
            f"retry.initial_backoff ({retry.initial_backoff_s:g}s)"
        )

    entries = doc.get("materialize", [])
    if not isinstance(entries, list) or not all(isinstance(e, Mapping) for e in entries):
        raise JobsConfigError(f"{source}: materialize must be an array of tables ([[materialize]])")
    views = tuple(_parse_view(e, i, source=source) for i, e in enumerate(entries))
    for attr, what in (("table", "table"), ("checkpoint", "checkpoint")):
        seen: dict[str, int] = {}
        for i, v in enumerate(views):
            value = getattr(v, attr)
            if value is None:
                continue
            if value in seen:
                raise JobsConfigError(
                    f"{source}: materialize[{seen[value]}] and materialize[{i}] use the same {what} "
                    f"{value!r}; each view needs its own"
                )
            seen[value] = i
    return JobsConfig(bootstrap=bootstrap, compaction=compaction, views=views, retry=retry,
                      spark=spark, tick_s=tick_s, source=source,
                      status_file=_str(doc, "status_file", where="", source=source))


def _parse_view(entry: Mapping[str, Any], index: int, *, source: str) -> ViewConfig:
    where = f"materialize[{index}]."
    _check_keys(entry, ("topic", "table", "checkpoint", "json_schema", "trigger_interval",
                        "max_offsets_per_trigger", "source_options"),
                where=f"materialize[{index}]", source=source)
    topic = _str(entry, "topic", where=where, source=source, required=True)
    table = _str(entry, "table", where=where, source=source, required=True)
    assert topic is not None and table is not None
    from jobs.materialize import MaterializeConfigError, local_path, table_ref

    try:
        table = table_ref(table).value  # a path: absolute and resolved, as the view's log lines name it
    except MaterializeConfigError as e:
        raise JobsConfigError(f"{source}: {where}table: {e.message}") from None
    checkpoint = _str(entry, "checkpoint", where=where, source=source)
    json_schema = _str(entry, "json_schema", where=where, source=source)
    if json_schema is not None:
        from logstore.schema_text import parse_schema

        try:
            parse_schema(json_schema)
        except LogstoreError as e:
            raise JobsConfigError(f"{source}: {where}json_schema: {e.message}") from None
    # 0 = Spark's default trigger: the next batch as soon as the previous one ended.
    trigger_s: float | None = parse_duration_s(entry.get("trigger_interval", "10s"), allow_zero=True,
                                               where=f"{source}: {where}trigger_interval")
    if trigger_s == 0:
        trigger_s = None
    max_offsets = entry.get("max_offsets_per_trigger")
    if max_offsets is not None and (isinstance(max_offsets, bool) or not isinstance(max_offsets, int)
                                    or max_offsets < 1):
        raise JobsConfigError(
            f"{source}: {where}max_offsets_per_trigger: expected a positive integer, got {max_offsets!r}"
        )
    options = entry.get("source_options", {})
    if not isinstance(options, Mapping):
        raise JobsConfigError(f"{source}: {where}source_options must be a table of strings")
    return ViewConfig(
        topic=topic, table=table,
        checkpoint=local_path(checkpoint) if checkpoint is not None else None,
        json_schema=json_schema, trigger_interval_s=trigger_s, max_offsets_per_trigger=max_offsets,
        source_options={str(k): str(v).lower() if isinstance(v, bool) else str(v) for k, v in options.items()},
    )


def load_config(path: str | Path) -> JobsConfig:
    """Read and validate a jobs TOML file; :class:`JobsConfigError` names the file and the key."""
    p = Path(path)
    try:
        text = p.read_text(encoding="utf-8")
    except OSError as e:
        raise JobsConfigError(f"{p}: cannot read the jobs configuration: {e.strerror or e}") from None
    try:
        doc = tomllib.loads(text)
    except tomllib.TOMLDecodeError as e:
        raise JobsConfigError(f"{p}: not valid TOML: {e}") from None
    return parse_config(doc, source=str(p))

