"""A broker in a child process, for tests that SIGKILL or SIGSTOP it."""

from __future__ import annotations

import contextlib
import os
import signal
from collections.abc import Iterator

from logstore.broker.embedded import EmbeddedBroker
from logstore.client.admin import Admin
from logstore.types import NewTopic


@contextlib.contextmanager
def child_broker(data_dir: str, *, topic: str, partitions: int) -> Iterator[EmbeddedBroker]:
    """A broker in a child process with ``topic`` created; resumed if stopped, then stopped, at the end."""
    broker = EmbeddedBroker(data_dir, subprocess=True)
    broker.start()
    try:
        with Admin(broker.bootstrap) as admin:
            admin.create_topics([NewTopic(topic, partitions)])
        yield broker
    finally:
        if broker._proc is not None and broker._proc.poll() is None:
            os.kill(broker._proc.pid, signal.SIGCONT)
        broker.stop()
