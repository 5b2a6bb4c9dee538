"""``logstore partitions``: move partitions between brokers (``reassign``), repair an offline one (``recover``).

``reassign`` is Kafka's ``kafka-reassign-partitions``: the plan is Kafka's reassignment JSON
(``--plan FILE``: ``{"version": 1, "partitions": [{"topic": .., "partition": .., "replicas":
[..]}]}``) or a whole topic spread evenly over ``--to-brokers`` (the placement new topics get,
:func:`replication.placement.assign_replicas`, its replication factor kept unless
``--replication-factor``). ``--throttle 10MB`` caps each new replica's copy rate (bytes/s) while
the move runs. Without ``--no-wait`` the command waits for the move to finish, with a progress
bar on a terminal and one line per change otherwise; ``--verify`` prints each running move's
progress and exits 0 when none is left for the plan's partitions, 1 while some run;
``--cancel`` puts the partitions back on their old replicas.

``recover`` repairs an offline partition on a stopped broker's data directory; with
``--rebuild-metadata`` (and ``--dry-run``) it rebuilds a topic's lost ``meta/topics/<t>.json``
from its partition directories instead (:mod:`logstore.storage.topic_rebuild`). An offline command, not an RPC: the damage it repairs keeps the partition
from opening, so there is no running partition to ask, and the files must
not change under a running broker (stop it first). See
:mod:`logstore.storage.partition_recovery` for what is repaired and what is
left to a person. Exit code 0 when the partition opens afterwards, 1 (with
one ``error: [LOG_OFFLINE] ...`` line) when it still does not, and 1 (with
``error: [CORRUPT_MESSAGE] ...`` naming the offsets and records lost) when a
batch anywhere in the log, a closed segment included, fails its CRC.

Thread-safety: a command-line entry point.
"""

from __future__ import annotations

import click

from logstore.cli.common import CliError, cli_errors, format_option, print_json
from logstore.cli.reassign_plan import reassign
from logstore.record import value_schema_of
from logstore.schema_text import format_schema
from logstore.storage.partition_recovery import recover_partition
from logstore.storage.topic_rebuild import rebuild_topic_metadata

__all__ = ["partitions"]


@click.group()
def partitions() -> None:
    """Move partitions between brokers; repair partitions a broker keeps offline."""


partitions.add_command(reassign)


@partitions.command("recover")
@click.option("--data-dir", required=True, type=click.Path(exists=True, file_okay=False),
              help="The stopped broker's data directory.")
@click.option("--topic", required=True, help="The partition's topic.")
@click.option("--partition", type=click.IntRange(min=0), default=None,
              help="The partition number (required unless --rebuild-metadata).")
@click.option("--accept-data-loss", is_flag=True, default=False,
              help="Truncate damaged records even below the checkpointed high-water mark; the lost "
                   "offsets are recorded and never reused (consumers get OFFSET_OUT_OF_RANGE there).")
@click.option("--rebuild-metadata", is_flag=True, default=False,
              help="Rebuild the topic's missing or damaged meta/topics/<topic>.json from its partition "
                   "directories (topic id, partition count, schema; its configs become the defaults).")
@click.option("--dry-run", is_flag=True, default=False,
              help="With --rebuild-metadata: say what would be written, write nothing.")
@format_option()
@cli_errors
def recover(data_dir: str, topic: str, partition: int | None, accept_data_loss: bool, rebuild_metadata: bool,
            dry_run: bool, output_format: str) -> None:
    """Open a partition as the broker would; with --accept-data-loss, repair it at the cost of records.
    With --rebuild-metadata, rebuild the topic's lost metadata file from what is on disk."""
    if rebuild_metadata:
        _rebuild(data_dir, topic, dry_run=dry_run, output_format=output_format)
        return
    if partition is None:
        raise click.UsageError("--partition is required (unless --rebuild-metadata)")
    out = recover_partition(data_dir, topic, partition, accept_data_loss=accept_data_loss)
    if output_format == "json":
        print_json({"directory": out.directory, "checkpointed_high_watermark": out.checkpointed_hwm,
                    "log_start_offset": out.log_start_offset, "log_end_offset": out.log_end_offset,
                    "error": out.error, "lost_offsets": [list(r) for r in out.lost],
                    "damaged_batches": [{"segment": d.segment, "position": d.position,
                                         "first_offset": d.first_offset, "end_offset": d.end_offset,
                                         "reason": d.reason} for d in out.damaged]})
    if out.damaged:
        records = sum(d.end_offset - d.first_offset for d in out.damaged)
        ranges = "; ".join(f"offsets {d.first_offset}..{d.end_offset - 1} in {d.segment} ({d.reason})"
                           for d in out.damaged)
        raise CliError(
            f"{topic}-{partition}: {len(out.damaged)} batches fail their CRC; {records} records are lost: "
            f"{ranges}. A reader reaching them takes the partition offline; --accept-data-loss does not "
            "rewrite a closed segment: restore the file from a copy or a replica", code="CORRUPT_MESSAGE")
    if out.error is not None:
        hint = "" if accept_data_loss else " (rerun with --accept-data-loss to accept losing it)"
        raise CliError(f"{topic}-{partition} still cannot be opened: {out.error}{hint}", code="LOG_OFFLINE")
    if output_format != "json":
        lost = ", ".join(f"{a}..{b - 1}" for a, b in out.lost) or "none"
        click.echo(f"{topic}-{partition}: opens; offsets {out.log_start_offset}..{out.log_end_offset - 1} "
                   f"(log end {out.log_end_offset}, checkpointed high-water mark {out.checkpointed_hwm}); "
                   f"offsets recorded as lost: {lost}")


def _rebuild(data_dir: str, topic: str, *, dry_run: bool, output_format: str) -> None:
    out = rebuild_topic_metadata(data_dir, topic, dry_run=dry_run)
    info = out.info
    value_schema = value_schema_of(info.schema)
    schema_text = format_schema(value_schema) if value_schema is not None else ""
    if output_format == "json":
        print_json({"path": out.path, "exists": out.existed or out.written, "written": out.written,
                    "topic_id": info.topic_id, "partitions": info.partitions, "schema": schema_text,
                    "directories": list(out.directories), "configs_lost": out.configs_lost})
        return
    if out.existed:
        click.echo(f"{out.path} is present and readable: nothing to rebuild")
        return
    verb = "would write" if dry_run else "wrote"
    click.echo(f"{verb} {out.path}: topic id {info.topic_id}, {info.partitions} partitions "
               f"(directories {', '.join(out.directories)}), schema {schema_text or '(untyped)'}; the topic's "
               "own configs were lost and are the broker's defaults now (set them again with 'logstore "
               "topics alter')")
