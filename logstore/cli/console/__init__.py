"""``logstore console``: a web console for a broker or a cluster, served by a small aiohttp app.

Server-rendered HTML (no JavaScript build, no script at all: pages reload
themselves with a meta refresh), read-only, talking to the cluster only
through the public clients:

* ``/`` brokers and cluster health, ``/topics`` and ``/topics/NAME``
  (partitions with leader, ISR, size, log start/end, LSO, records/s),
  ``/topics/NAME/messages`` (the message browser), ``/groups`` and
  ``/groups/ID`` (members, assignment, lag and a lag-over-time chart),
  ``/jobs`` (the scheduler's last runs) — see :mod:`.pages`;
* rates and lag history come from the console's own samples every
  ``--sample-interval`` seconds (:mod:`.sampler`), kept in memory;
* HTML escaping is the default for everything (:mod:`.html`).

Modules: :mod:`.app` (the aiohttp app and server), :mod:`.pages`,
:mod:`.browse` (message browser), :mod:`.sampler`, :mod:`.jobs_status`,
:mod:`.html`.

Thread-safety: a command-line entry point.
"""

from __future__ import annotations

import asyncio
from pathlib import Path

import click

from logstore.cli.common import bootstrap_option, cli_errors
from logstore.client.bootstrap import parse_bootstrap_list

__all__ = ["console"]


@click.command()
@click.option("--port", type=click.IntRange(0, 65535), default=8080, show_default=True,
              help="HTTP port of the console (0: any free port, printed at start).")
@click.option("--host", default="127.0.0.1", show_default=True,
              help="Address to listen on (0.0.0.0: every interface; the console has no login).")
@click.option("--sample-interval", type=click.FloatRange(min=0.1), default=2.0, show_default=True,
              metavar="SECONDS", help="How often to sample end offsets and group lag (rates, lag chart).")
@click.option("--history", type=click.IntRange(min=2), default=300, show_default=True,
              help="Samples kept per group and partition (in memory).")
@click.option("--refresh", type=click.FloatRange(min=0), default=10.0, show_default=True, metavar="SECONDS",
              help="Pages reload themselves this often (0: never).")
@click.option("--jobs-status", type=click.Path(dir_okay=False, path_type=Path), default=None, metavar="FILE",
              help="The scheduler's status file (status_file in jobs.toml), shown at /jobs.")
@bootstrap_option
@cli_errors
def console(port: int, host: str, sample_interval: float, history: int, refresh: float,
            jobs_status: Path | None, bootstrap: str) -> None:
    """Serve a web console for the cluster: brokers, topics, messages, groups (lag charts), jobs."""
    from logstore.cli.console.app import make_app, serve  # aiohttp only when the console runs

    parse_bootstrap_list(bootstrap)  # a malformed address is one line, before binding anything

    async def main() -> None:
        app = make_app(bootstrap, sample_interval_s=sample_interval, history=history,
                       jobs_status=jobs_status, refresh_s=refresh or None)
        await serve(app, host=host, port=port, announce=lambda line: click.echo(line, err=False))

    asyncio.run(main())
