"""``logstore offsets``: the positions of a topic's partitions.

Per partition: its state (``online``; ``offline`` with the broker's reason,
its offsets unknown and shown as ``-``/null, never 0; in JSON only a partition
that is not online has ``state`` and ``reason``), log start offset, end
(HWM), LSO, LEO and, with ``--time``, the first offset whose timestamp is at
or after that time.

Thread-safety: a command-line entry point.
"""

from __future__ import annotations

from typing import Any

import click

from logstore.cli.common import (
    bootstrap_option,
    cli_errors,
    format_option,
    iso_ms,
    parse_time,
    print_json,
    print_table,
    topic_argument,
)
from logstore.cli_api.security_options import cli_security
from logstore.client.admin import Admin

__all__ = ["offsets"]


def _time_option(ctx: click.Context, param: click.Parameter, value: str | None) -> str | int | None:
    if value is None:
        return None
    try:
        return parse_time(value)
    except ValueError as e:
        raise click.BadParameter(str(e)) from None


@click.command()
@topic_argument()
@click.option("--time", "time_spec", default=None, callback=_time_option, metavar="TIME",
              help="Also find each partition's first offset at or after TIME: earliest, latest, "
                   "milliseconds since the epoch, or ISO-8601 (UTC unless it has an offset).")
@format_option()
@bootstrap_option
@cli_errors
def offsets(topic: str, time_spec: str | int | None, output_format: str, bootstrap: str) -> None:
    """Show the offsets of TOPIC's partitions: log start, end (HWM), LSO, LEO."""
    with Admin(bootstrap, security=cli_security()) as admin:
        desc = admin.describe_topics([topic])[topic]
        found = (admin.list_offsets({p.topic_partition: time_spec for p in desc.partitions})
                 if time_spec is not None else {})
    rows = []
    for p in desc.partitions:
        if p.error is not None:  # offline (or undescribable): its offsets are unknown, never 0
            code = getattr(p.error, "code", "")
            rows.append({"partition": p.partition, "state": "offline" if code == "LOG_OFFLINE" else "error",
                         "reason": getattr(p.error, "message", str(p.error)), "log_start_offset": None,
                         "high_watermark": None, "last_stable_offset": None, "log_end_offset": None,
                         **({"offset_for_time": None} if time_spec is not None else {})})
            continue
        doc: dict[str, Any] = {
            "partition": p.partition,
            "log_start_offset": p.log_start_offset,
            "high_watermark": p.high_watermark,
            "last_stable_offset": p.last_stable_offset,
            "log_end_offset": p.log_end_offset,
        }
        if time_spec is not None:
            # (The broker's ListOffsets echoes the asked time, not the found record's: not shown.)
            doc["offset_for_time"] = found[p.topic_partition].offset
        rows.append(doc)
    if output_format == "json":
        print_json({"topic": topic, "time": time_spec, "partitions": rows})
        return
    columns = ["partition", "state", "log start", "end (HWM)", "LSO", "LEO"]
    if time_spec is not None:
        label = time_spec if isinstance(time_spec, str) else iso_ms(time_spec)
        columns.append(f"offset at {label}")
    print_table(topic, columns, (
        [d["partition"], d.get("state", "online"), d["log_start_offset"], d["high_watermark"], d["last_stable_offset"],
         d["log_end_offset"]]
        + ([d["offset_for_time"]] if time_spec is not None else [])
        for d in rows
    ), numeric=[c for c in columns if c != "state"])
    for d in rows:
        if "state" in d:
            click.echo(f"partition {d['partition']} is {d['state']}: {d['reason']}", err=True)
