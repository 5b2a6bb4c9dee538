"""Defaults shared by the broker and its clients.

The default broker listens on ``DEFAULT_HOST:DEFAULT_PORT``; clients connect
there unless told otherwise (``$LOGSTORE_BOOTSTRAP`` overrides it for every
client, the CLI and the Spark options alike).
"""

from __future__ import annotations

import os

__all__ = ["DEFAULT_HOST", "DEFAULT_PORT", "default_bootstrap"]

DEFAULT_HOST = "127.0.0.1"
# The embedded/default broker's port; clients connect here unless told otherwise.
DEFAULT_PORT = 9392


def default_bootstrap() -> str:
    """``$LOGSTORE_BOOTSTRAP`` if set, else the default broker's ``host:port``."""
    return os.environ.get("LOGSTORE_BOOTSTRAP") or f"{DEFAULT_HOST}:{DEFAULT_PORT}"
