"""Defaults shared by the broker and its clients.

The default broker listens on ``DEFAULT_HOST:DEFAULT_PORT``; clients connect
there unless told otherwise (``$LOGSTORE_BOOTSTRAP`` overrides it for every
client, the CLI and the Spark options alike).
"""

from __future__ import annotations

import os

__all__ = ["CLIENT_ID_METADATA_KEY", "DEFAULT_HOST", "DEFAULT_PORT", "RECONNECT_OPTIONS", "THROTTLE_METADATA_KEY",
           "default_bootstrap"]

DEFAULT_HOST = "127.0.0.1"
# The embedded/default broker's port; clients connect here unless told otherwise.
DEFAULT_PORT = 9392
# gRPC call metadata (lower-case keys, as gRPC requires) between clients and brokers, for quotas
# (logstore.broker.security.quotas): the client's ``client_id`` on every call, and the time in
# milliseconds the broker asks the client to wait before its next request (trailing metadata).
CLIENT_ID_METADATA_KEY = "logstore-client-id"
THROTTLE_METADATA_KEY = "logstore-throttle-ms"
# gRPC channel options of every connection between our processes (clients to brokers, brokers to
# brokers and to etcd). A peer that restarts answers again within a second: retry a refused
# connection 100 ms, then at most 1 s apart (gRPC's default backoff grows to 120 s). gRPC's core
# also takes min_reconnect_backoff_ms as the *minimum connect timeout* (its MIN_CONNECT_TIMEOUT,
# doc/connection-backoff.md; 20 s by default): 100 ms there failed handshakes that took longer
# on a loaded machine ("timed out before receiving SETTINGS frame", BROKER_NOT_AVAILABLE). 5 s
# gives a slow handshake time and still gives up on an unanswered one.
RECONNECT_OPTIONS: tuple[tuple[str, int], ...] = (
    ("grpc.initial_reconnect_backoff_ms", 100),
    ("grpc.min_reconnect_backoff_ms", 5000),
    ("grpc.max_reconnect_backoff_ms", 1000),
)


def default_bootstrap() -> str:
    """``$LOGSTORE_BOOTSTRAP`` if set, else the default broker's ``host:port``."""
    return os.environ.get("LOGSTORE_BOOTSTRAP") or f"{DEFAULT_HOST}:{DEFAULT_PORT}"
