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

``recover`` repairs an offline partition on a stopped broker's data directory. An offline command, not an RPC: the damage it repairs keeps the partition
from opening, so there is no running partition to ask, and the files must
not change under a running broker (stop it first). See
:mod:`logstore.storage.partition_recovery` for what is repaired and what is
left to a person. Exit code 0 when the partition opens afterwards, 1 (with
one ``error: [LOG_OFFLINE] ...`` line) when it still does not.

Thread-safety: a command-line entry point.
"""

from __future__ import annotations

import click

from logstore.cli.common import CliError, cli_errors, format_option, print_json
from logstore.cli.reassign_plan import reassign
from logstore.storage.partition_recovery import recover_partition

__all__ = ["partitions"]


@click.group()
def partitions() -> None:
    """Move partitions between brokers; repair partitions a broker keeps offline."""


partitions.add_command(reassign)


@partitions.command("recover")
@click.option("--data-dir", required=True, type=click.Path(exists=True, file_okay=False),
              help="The stopped broker's data directory.")
@click.option("--topic", required=True, help="The partition's topic.")
@click.option("--partition", required=True, type=click.IntRange(min=0), help="The partition number.")
@click.option("--accept-data-loss", is_flag=True, default=False,
              help="Truncate damaged records even below the checkpointed high-water mark; the lost "
                   "offsets are recorded and never reused (consumers get OFFSET_OUT_OF_RANGE there).")
@format_option()
@cli_errors
def recover(data_dir: str, topic: str, partition: int, accept_data_loss: bool, output_format: str) -> None:
    """Open a partition as the broker would; with --accept-data-loss, repair it at the cost of records."""
    out = recover_partition(data_dir, topic, partition, accept_data_loss=accept_data_loss)
    if output_format == "json":
        print_json({"directory": out.directory, "checkpointed_high_watermark": out.checkpointed_hwm,
                    "log_start_offset": out.log_start_offset, "log_end_offset": out.log_end_offset,
                    "error": out.error, "lost_offsets": [list(r) for r in out.lost]})
    if out.error is not None:
        hint = "" if accept_data_loss else " (rerun with --accept-data-loss to accept losing it)"
        raise CliError(f"{topic}-{partition} still cannot be opened: {out.error}{hint}", code="LOG_OFFLINE")
    if output_format != "json":
        lost = ", ".join(f"{a}..{b - 1}" for a, b in out.lost) or "none"
        click.echo(f"{topic}-{partition}: opens; offsets {out.log_start_offset}..{out.log_end_offset - 1} "
                   f"(log end {out.log_end_offset}, checkpointed high-water mark {out.checkpointed_hwm}); "
                   f"offsets recorded as lost: {lost}")
