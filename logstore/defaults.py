"""Defaults shared by the broker and its clients.

The default broker listens on ``DEFAULT_HOST:DEFAULT_PORT``; clients connect
there unless told otherwise (``$LOGSTORE_BOOTSTRAP`` overrides it for every
client, the CLI and the Spark options alike).
"""

from __future__ import annotations

import os

__all__ = ["CLIENT_ID_METADATA_KEY", "DEFAULT_HOST", "DEFAULT_PORT", "THROTTLE_METADATA_KEY", "default_bootstrap"]

DEFAULT_HOST = "127.0.0.1"
# The embedded/default broker's port; clients connect here unless told otherwise.
DEFAULT_PORT = 9392
# gRPC call metadata (lower-case keys, as gRPC requires) between clients and brokers, for quotas
# (logstore.broker.security.quotas): the client's ``client_id`` on every call, and the time in
# milliseconds the broker asks the client to wait before its next request (trailing metadata).
CLIENT_ID_METADATA_KEY = "logstore-client-id"
THROTTLE_METADATA_KEY = "logstore-throttle-ms"


def default_bootstrap() -> str:
    """``$LOGSTORE_BOOTSTRAP`` if set, else the default broker's ``host:port``."""
    return os.environ.get("LOGSTORE_BOOTSTRAP") or f"{DEFAULT_HOST}:{DEFAULT_PORT}"
