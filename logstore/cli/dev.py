"""``logstore dev cluster``: etcd and N brokers on this machine, for trying the cluster out.

Starts a :class:`~logstore.dev.local_cluster.LocalCluster` (etcd and each broker its own
process, on free loopback ports, under ``--data-dir``), prints what a user needs to reach
it, and runs until SIGINT (Ctrl-C) or SIGTERM, then stops the brokers (SIGTERM: controlled
shutdown) and etcd. Output, one line each, flushed as it goes::

    bootstrap: 127.0.0.1:41231,127.0.0.1:41233,127.0.0.1:41235
    kafka bootstrap: 127.0.0.1:41232,127.0.0.1:41234,127.0.0.1:41236
    broker 1: 127.0.0.1:41231 pid 12345 log DIR/broker-1.log
    ...
    etcd: 127.0.0.1:2379 (etcd://127.0.0.1:2379) log DIR/etcd/etcd.log
    running; Ctrl-C or SIGTERM stops the cluster
    ...
    stopped 3 brokers and etcd

The first line's form is fixed (scripts read it); the second is the brokers' Kafka
listeners (Kafka's protocol, for Kafka clients: ``bootstrap.servers``), each on a free
loopback port; it is absent on Python 3.10, which the Kafka listener does not support.
``kill -9 PID`` on a broker's line shows leadership moving (``logstore topics describe``).

Thread-safety: a command-line entry point.
"""

from __future__ import annotations

import signal
import sys
import threading
from types import FrameType

import click

from logstore.cli.common import CliError, cli_errors

__all__ = ["dev"]


@click.group()
def dev() -> None:
    """Development tools: a local cluster to try replication with."""


@dev.command("cluster")
@click.option("--brokers", type=click.IntRange(1, 9), default=3, show_default=True,
              help="How many brokers (node ids 1..N).")
@click.option("--data-dir", required=True, type=click.Path(file_okay=False),
              help="Where etcd's and every broker's data and logs go (created if missing).")
@click.option("--session-timeout-ms", type=click.IntRange(min=100), default=6000, show_default=True,
              help="broker_session_timeout_ms: how long a silent broker keeps its leaderships.")
@click.option("--replica-lag-time-max-ms", type=click.IntRange(min=100), default=10000, show_default=True,
              help="replica_lag_time_max_ms: how far behind a follower may fall before leaving the ISR.")
@click.option("--proxies", is_flag=True, default=False,
              help="Route replication between brokers through TCP proxies (what the fault harness cuts).")
@cli_errors
def cluster(brokers: int, data_dir: str, session_timeout_ms: int, replica_lag_time_max_ms: int,
            proxies: bool) -> None:
    """Run etcd and a cluster of brokers until Ctrl-C; the first line is 'bootstrap: ...'."""
    from logstore.dev.etcd_process import EtcdNotFoundError
    from logstore.dev.local_cluster import LocalCluster

    stop = threading.Event()

    def on_signal(signum: int, frame: FrameType | None) -> None:
        stop.set()

    previous = {s: signal.signal(s, on_signal) for s in (signal.SIGINT, signal.SIGTERM)}
    # A topic created without --replication-factor is replicated, as someone trying
    # replication expects (Kafka's own default of 1 suits a single broker).
    local = LocalCluster(brokers, data_dir, session_timeout_ms=session_timeout_ms,
                         replica_lag_time_max_ms=replica_lag_time_max_ms, proxies=proxies,
                         extra_config={"default_replication_factor": min(3, brokers)},
                         kafka=sys.version_info >= (3, 11))  # the Kafka listener's codecs need 3.11
    try:
        try:
            local.start_all()
        except EtcdNotFoundError as e:
            raise CliError(str(e), code="ETCD_NOT_FOUND") from None
        except (RuntimeError, TimeoutError) as e:
            raise CliError(str(e), code="CLUSTER_START_FAILED") from None
        click.echo(f"bootstrap: {local.bootstrap}")
        if local.kafka:
            click.echo(f"kafka bootstrap: {local.kafka_bootstrap}")
        for n in local.node_ids:
            click.echo(f"broker {n}: {local.address(n)} pid {local.pid(n)} log {local.log_path(n)}")
        assert local.etcd is not None
        click.echo(f"etcd: {local.etcd.endpoint} ({local.etcd.url}) log {local.etcd.log_path}")
        click.echo("running; Ctrl-C or SIGTERM stops the cluster")
        while not stop.wait(0.5):
            pass
    finally:
        running = sum(local.running(n) for n in local.node_ids)  # a broker killed meanwhile is not stopped
        local.close()
        for s, handler in previous.items():
            signal.signal(s, handler)
    click.echo(f"stopped {running} broker{'s' if running != 1 else ''} and etcd")
