"""``logstore broker start``: run a broker in the foreground.

Configuration precedence, highest first: the flags, ``LOGSTORE_*``
environment variables, the config file (``--config``, else
``conf/broker.toml`` when it exists in the working directory), built-in
defaults (see :mod:`logstore.broker.config`). The broker prints
``listening on HOST:PORT`` on stdout once it accepts connections (with
``--port 0`` the port is the one the system picked), after ``kafka listener on
HOST:PORT`` with ``--kafka-listener``; its log goes to stderr.
SIGTERM and Ctrl-C (SIGINT) shut it down gracefully: running requests end,
logs are closed cleanly.
"""

from __future__ import annotations

import os

import click

from logstore.broker.server import run_broker

__all__ = ["broker", "DEFAULT_CONFIG_PATH"]

DEFAULT_CONFIG_PATH = os.path.join("conf", "broker.toml")


@click.group()
def broker() -> None:
    """Run a broker."""


@broker.command("start")
@click.option("--data-dir", type=click.Path(file_okay=False), default=None,
              help="Directory of the partition logs (default: the config's data_dir).")
@click.option("--port", type=click.IntRange(0, 65535), default=None,
              help="Port to listen on; 0 picks a free one (default: the config's, 9392).")
@click.option("--host", default=None, help="Address to listen on (default: the config's, 127.0.0.1).")
@click.option("--config", "config_path", type=click.Path(dir_okay=False), default=None,
              help=f"Broker config file (default: {DEFAULT_CONFIG_PATH} if it exists, else built-in defaults).")
@click.option("--node-id", type=click.IntRange(0), default=None,
              help="This broker's id in its cluster (default: the config's node_id, 0).")
@click.option("--metadata", default=None, metavar="etcd://HOST:PORT[,HOST:PORT]",
              help="Join the cluster whose metadata this etcd holds (default: none, a single broker).")
@click.option("--advertised-address", default=None, metavar="HOST:PORT",
              help="Where clients and other brokers reach this broker (default: host:port as bound).")
@click.option("--rack", default=None, help="This broker's rack, for rack-aware replica placement.")
@click.option("--metrics-port", type=click.IntRange(0, 65535), default=None,
              help="Serve Prometheus metrics at http://HOST:PORT/metrics (default: the config's, 0 = off).")
@click.option("--kafka-listener", default=None, metavar="HOST:PORT",
              help="Also serve Kafka's wire protocol there, for Kafka clients (port 0 picks one; default: "
              "the config's kafka_listener, off). Needs Python 3.11+.")
@click.option("--log-format", type=click.Choice(["text", "json"]), default=None,
              help="Log lines as text or one JSON object each (default: the config's, text).")
@click.option("--security-protocol", type=click.Choice(["PLAINTEXT", "SSL", "SASL_PLAINTEXT", "SASL_SSL"]),
              default=None, help="The listener's protocol; SASL_* require a SCRAM login on every call "
              "(default: the config's, PLAINTEXT; SSL with --tls-cert). Users: logstore users create.")
@click.option("--tls-cert", type=click.Path(dir_okay=False), default=None,
              help="PEM certificate of a TLS listener (with --tls-key; default: the config's tls_cert).")
@click.option("--tls-key", type=click.Path(dir_okay=False), default=None,
              help="PEM private key of --tls-cert.")
@click.option("--tls-client-ca", type=click.Path(dir_okay=False), default=None,
              help="Require client certificates signed by this CA (mTLS); their subject is the principal.")
@click.option("--allow-plaintext", is_flag=True, default=None,
              help="Accept a plaintext listener on a non-loopback address (logged as a warning).")
@click.option("--authorizer/--no-authorizer", default=None,
              help="Check every call against the ACLs, deny by default (default: the config's, off).")
@click.option("--super-users", default=None, metavar="User:A,User:B",
              help="Principals that bypass the ACLs (default: the config's super_users).")
def start(data_dir: str | None, port: int | None, host: str | None, config_path: str | None,
          node_id: int | None, metadata: str | None, advertised_address: str | None, rack: str | None,
          metrics_port: int | None, kafka_listener: str | None, log_format: str | None, security_protocol: str | None, tls_cert: str | None,
          tls_key: str | None, tls_client_ca: str | None, allow_plaintext: bool | None,
          authorizer: bool | None = None, super_users: str | None = None) -> None:
    """Start a broker in the foreground; it prints 'listening on HOST:PORT' once ready."""
    if config_path is None and os.path.isfile(DEFAULT_CONFIG_PATH):
        config_path = DEFAULT_CONFIG_PATH
    try:
        code = run_broker(config_path, data_dir=data_dir, host=host, port=port, extra={
            "node_id": node_id, "metadata": metadata, "advertised_address": advertised_address, "rack": rack,
            "metrics_port": metrics_port, "kafka_listener": kafka_listener, "log_format": log_format,
            "security_protocol": security_protocol,
            "tls_cert": tls_cert, "tls_key": tls_key, "tls_client_ca": tls_client_ca,
            "allow_plaintext": allow_plaintext or None,
            "authorizer": authorizer, "super_users": super_users,
        })
    except KeyboardInterrupt:  # Ctrl-C before the signal handlers were installed (recovery)
        code = 130
    if code:
        # run_broker has printed its one-line error already.
        raise click.exceptions.Exit(code)
