"""Running a broker: :func:`serve` (in an event loop), :func:`run_broker` and :func:`main`
(in the foreground, for ``logstore broker start`` and ``python -m logstore.broker``).

Start-up: the config is loaded and checked (:func:`~logstore.broker.config.load_broker_config`),
then :meth:`Broker.start <logstore.broker.service.Broker.start>` recovers the logs
and the coordinators' state and binds; once bound, ``ready(port)`` is called
(the foreground runner prints ``listening on HOST:PORT``, the line
:class:`~logstore.broker.embedded.EmbeddedBroker` waits for, after ``kafka listener on
HOST:PORT`` when ``kafka_listener`` is set). Shutdown, on
SIGTERM/SIGINT or the given event: running calls get a grace period, then the
logs are closed cleanly.

The foreground runner logs to stderr (level ``LOGSTORE_LOG_LEVEL``, INFO by
default; ``log_format`` text or json, :mod:`logstore.broker.log_lines`) with repeated
warnings and errors rate-limited (:func:`limit_repeated_messages`).

Exit codes of :func:`run_broker`: 0 after a clean shutdown, 2 for a bad
config, 1 when the broker cannot start (``error: ...`` on stderr).
"""

from __future__ import annotations

import argparse
import asyncio
import logging
import os
import signal
import sys
from collections.abc import Callable
from typing import Any

from logstore.broker.config import BrokerConfig, kafka_listener_address, load_broker_config
from logstore.broker.log_lines import configure_logging
from logstore.broker.service import Broker
from logstore.errors import LogstoreError
from logstore.log_limits import RepeatedMessageFilter

__all__ = ["serve", "main", "run_broker"]

log = logging.getLogger("logstore.broker")


async def serve(config: BrokerConfig, *, ready: Callable[[int], None] | None = None,
                stop_event: asyncio.Event | None = None,
                kafka_ready: Callable[[int], None] | None = None) -> None:
    """Run a broker until ``stop_event`` is set (or SIGTERM/SIGINT when it is None).
    ``kafka_ready(port)`` is called before ``ready`` when there is a Kafka listener."""
    broker = Broker(config)
    port = await broker.start()
    if kafka_ready is not None and broker.kafka is not None:
        kafka_ready(broker.kafka_port)
    if ready is not None:
        ready(port)
    stop = stop_event or asyncio.Event()
    if stop_event is None:
        loop = asyncio.get_running_loop()
        for sig in (signal.SIGTERM, signal.SIGINT):
            loop.add_signal_handler(sig, stop.set)
    await stop.wait()
    log.info("shutting down")
    await broker.stop()


LOG_REPEAT_BURST = 10
LOG_REPEAT_INTERVAL_S = 60.0


def limit_repeated_messages() -> None:
    """Rate-limit repeated warnings and errors on every handler of the root logger.

    At most ``LOG_REPEAT_BURST`` (10) records of one (logger, level, message
    template) per ``LOG_REPEAT_INTERVAL_S`` (60 s) reach the log; the next one
    let through says how many were suppressed (:class:`RepeatedMessageFilter`).
    Info lines are not limited. A flood of bad requests (each refused with a
    warning) costs a few lines a minute, not megabytes.
    """
    for handler in logging.getLogger().handlers:
        if not any(isinstance(f, RepeatedMessageFilter) for f in handler.filters):
            handler.addFilter(RepeatedMessageFilter(burst=LOG_REPEAT_BURST, interval_s=LOG_REPEAT_INTERVAL_S))


def main(argv: list[str] | None = None) -> int:
    """``python -m logstore.broker``: the same as ``logstore broker start``."""
    parser = argparse.ArgumentParser(prog="logstore-broker")
    parser.add_argument("--config", default=None)
    parser.add_argument("--data-dir", default=None)
    parser.add_argument("--host", default=None)
    parser.add_argument("--port", type=int, default=None)
    parser.add_argument("--node-id", type=int, default=None)
    parser.add_argument("--metadata", default=None)
    parser.add_argument("--advertised-address", default=None)
    parser.add_argument("--rack", default=None)
    parser.add_argument("--metrics-port", type=int, default=None)
    parser.add_argument("--kafka-listener", default=None)
    parser.add_argument("--log-format", choices=("text", "json"), default=None)
    parser.add_argument("--security-protocol", choices=("PLAINTEXT", "SSL", "SASL_PLAINTEXT", "SASL_SSL"), default=None)
    # Security (logstore.broker.security.tls)
    parser.add_argument("--tls-cert", default=None)
    parser.add_argument("--tls-key", default=None)
    parser.add_argument("--tls-client-ca", default=None)
    parser.add_argument("--allow-plaintext", action="store_true", default=None)
    parser.add_argument("--authorizer", action=argparse.BooleanOptionalAction, default=None)
    parser.add_argument("--super-users", default=None)
    args = parser.parse_args(argv)
    return run_broker(args.config, data_dir=args.data_dir, host=args.host, port=args.port, extra={
        "node_id": args.node_id, "metadata": args.metadata,
        "advertised_address": args.advertised_address, "rack": args.rack,
        "metrics_port": args.metrics_port, "log_format": args.log_format, "kafka_listener": args.kafka_listener,
        "security_protocol": args.security_protocol,
        "tls_cert": args.tls_cert, "tls_key": args.tls_key, "tls_client_ca": args.tls_client_ca,
        "allow_plaintext": args.allow_plaintext,
        "authorizer": args.authorizer, "super_users": args.super_users,
    })


def run_broker(config_path: str | None, *, data_dir: str | None = None, host: str | None = None,
               port: int | None = None, extra: dict[str, Any] | None = None) -> int:
    """Start a broker in the foreground; print ``listening on HOST:PORT`` once bound."""
    try:
        config = load_broker_config(
            config_path, overrides={"data_dir": data_dir, "host": host, "port": port, **(extra or {})}
        )
    except LogstoreError as e:
        print(f"error: {e}", file=sys.stderr)
        return 2
    configure_logging(os.environ.get("LOGSTORE_LOG_LEVEL", "INFO"), config.log_format)
    limit_repeated_messages()

    def ready(bound: int) -> None:
        print(f"listening on {config.host}:{bound}", flush=True)

    def kafka_ready(bound: int) -> None:  # before "listening on", the line starters wait for
        print(f"kafka listener on {kafka_listener_address(config)[0]}:{bound}", flush=True)

    try:
        asyncio.run(serve(config, ready=ready, kafka_ready=kafka_ready))
    except LogstoreError as e:
        print(f"error: {e}", file=sys.stderr)
        return 1
    except OSError as e:
        print(f"error: [BROKER_START_FAILED] cannot start the broker: {e}", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
