"""``logstore leaders elect``: move leadership back to the preferred replicas (or, when asked,
elect an out-of-sync replica of a partition no in-sync replica of which is alive).

``--preferred`` is Kafka's ``kafka-leader-election --election-type PREFERRED``: after brokers
restarted, their partitions are led by whichever replica took over; this hands each partition
back to its first replica when that one is alive and in sync, so leadership spreads again.
``--unclean`` elects any live replica for partitions without a live in-sync one: the records
only the lost ISR had are gone (consumers then see OFFSET_OUT_OF_RANGE past the new end).

Output: one line per partition elected, and a count of those that needed nothing; a partition
whose preferred replica cannot lead yet is listed with its code, and the exit code is then 1.

Thread-safety: a command-line entry point.
"""

from __future__ import annotations

import sys

import click

from logstore.cli.common import CliError, bootstrap_option, cli_errors, format_option, print_json
from logstore.cli_api.security_options import cli_security
from logstore.client.admin import Admin
from logstore.errors import ElectionNotNeededError
from logstore.types import TopicPartition

__all__ = ["leaders"]


@click.group()
def leaders() -> None:
    """Elect partition leaders: preferred (spread leadership back) or unclean."""


@leaders.command("elect")
@click.option("--preferred", is_flag=True, help="Hand leadership to each partition's first replica.")
@click.option("--unclean", is_flag=True, help="Elect an out-of-sync replica where no in-sync one is alive "
                                              "(records may be lost).")
@click.option("--topic", help="Only this topic's partitions (default: every partition).")
@click.option("--partition", type=click.IntRange(min=0), help="With --topic: only this partition.")
@format_option()
@bootstrap_option
@cli_errors
def elect(preferred: bool, unclean: bool, topic: str | None, partition: int | None, output_format: str,
          bootstrap: str) -> None:
    """Elect leaders for every partition, a topic's, or one partition."""
    if preferred == unclean:
        raise CliError("give exactly one of --preferred and --unclean", code="INVALID_REQUEST")
    if partition is not None and topic is None:
        raise CliError("--partition needs --topic", code="INVALID_REQUEST")
    with Admin(bootstrap, security=cli_security()) as admin:
        wanted: list[TopicPartition] | None = None
        if topic is not None:
            desc = admin.describe_topics([topic])[topic]
            wanted = [TopicPartition(topic, p.partition) for p in desc.partitions
                      if partition is None or p.partition == partition]
            if not wanted:
                raise CliError(f"topic {topic!r} has no partition {partition}", code="UNKNOWN_TOPIC_OR_PARTITION")
        results = admin.elect_leaders("unclean" if unclean else "preferred", wanted)
    elected = [tp for tp, e in results.items() if e is None]
    not_needed = [tp for tp, e in results.items() if isinstance(e, ElectionNotNeededError)]
    failed = {tp: e for tp, e in results.items() if e is not None and not isinstance(e, ElectionNotNeededError)}
    if output_format == "json":
        print_json({"elected": [str(tp) for tp in elected], "not_needed": [str(tp) for tp in not_needed],
                    "failed": {str(tp): {"code": e.code, "message": e.message} for tp, e in failed.items()}})
    else:
        for tp in elected:
            click.echo(f"{tp}: elected")
        click.echo(f"{len(elected)} partition(s) elected, {len(not_needed)} already led by the "
                   f"{'preferred' if preferred else 'a live in-sync'} replica")
        for e in failed.values():
            click.echo(f"error: [{e.code}] {e.message}", err=True)
    if failed:
        sys.exit(1)
