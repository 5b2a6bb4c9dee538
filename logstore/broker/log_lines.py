"""The broker's log lines: one event a line, as text or as JSON (``log_format``).

Events are ordinary :mod:`logging` records with fields in ``extra``: code that
reports an event (storage, replication, the broker) writes::

    log.info("topic %s created with %d partitions", name, n,
             extra={"event": "topic_created", "topic": name, "partitions": n})

and needs nothing from this module (storage may not import the broker). The
formatters find the fields as the record's attributes that a plain
:class:`logging.LogRecord` does not have:

* ``text`` (the default): ``TS LEVEL LOGGER: MESSAGE`` and, for an event,
  `` [event=topic_created topic=orders partitions=3]``; a traceback follows on
  its own lines, as Python prints it;
* ``json``: one JSON object a line, ``{"ts": "2026-11-26T12:00:00.123Z",
  "level": "INFO", "logger": "logstore.storage", "message": "...",
  "event": "topic_created", "topic": "orders", "partitions": 3}``, a traceback
  in ``"exc"`` (one string: the line stays one line). Values that JSON cannot
  hold are written as ``str(value)``.

Why the standard library and not structlog: every module already logs through
:mod:`logging` (storage, replication, gRPC, the rate limiter
:class:`~logstore.log_limits.RepeatedMessageFilter`); a formatter makes all of
them JSON at once, with no dependency and no second logging API to learn.

Thread-safety: formatters keep no state; :func:`configure_logging` is for the
program's start.
"""

from __future__ import annotations

import json
import logging
import sys
import time
from typing import Any, TextIO

__all__ = ["JsonFormatter", "TextFormatter", "configure_logging", "event_fields"]

# The attributes every LogRecord has (and "message"/"asctime", set by formatting): not event fields.
_STANDARD = frozenset(vars(logging.LogRecord("", 0, "", 0, "", (), None))) | {"message", "asctime", "taskName"}


def event_fields(record: logging.LogRecord) -> dict[str, Any]:
    """The fields a record carries from ``extra`` (``event`` first, when present)."""
    fields = {k: v for k, v in vars(record).items() if k not in _STANDARD and not k.startswith("_")}
    if "event" in fields:
        fields = {"event": fields.pop("event"), **fields}
    return fields


class TextFormatter(logging.Formatter):
    """``TS LEVEL LOGGER: MESSAGE [event=... key=value ...]``."""

    def __init__(self) -> None:
        super().__init__("%(asctime)s %(levelname)s %(name)s: %(message)s")

    def formatMessage(self, record: logging.LogRecord) -> str:  # noqa: N802 - logging's name
        line = super().formatMessage(record)
        fields = event_fields(record)
        if fields:
            line += " [" + " ".join(f"{k}={v}" for k, v in fields.items()) + "]"
        return line


class JsonFormatter(logging.Formatter):
    """One JSON object a line: ts (UTC, ms), level, logger, message, the event's fields, exc."""

    def format(self, record: logging.LogRecord) -> str:
        ts = time.strftime("%Y-%m-%dT%H:%M:%S", time.gmtime(record.created)) + f".{int(record.msecs):03d}Z"
        doc: dict[str, Any] = {"ts": ts, "level": record.levelname, "logger": record.name,
                               "message": record.getMessage()}
        for key, value in event_fields(record).items():
            doc.setdefault(key, value)
        if record.exc_info:
            doc["exc"] = self.formatException(record.exc_info)
        elif record.exc_text:
            doc["exc"] = record.exc_text
        return json.dumps(doc, default=str, ensure_ascii=False)


def configure_logging(level: str, log_format: str, *, stream: TextIO | None = None) -> None:
    """Log to ``stream`` (stderr) at ``level`` in ``log_format`` ("text" or "json")."""
    handler = logging.StreamHandler(stream or sys.stderr)
    handler.setFormatter(JsonFormatter() if log_format == "json" else TextFormatter())
    logging.basicConfig(level=level, handlers=[handler], force=True)
