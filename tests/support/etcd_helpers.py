"""pytest fixtures for a real etcd server (logstore/dev/etcd_process.py).

Import the fixtures into a test module with ``from etcd_helpers import etcd  # noqa: F401``.
``etcd`` is module-scoped: one server per test module (starting one takes ~0.3 s, but tests
would otherwise see each other's keys), and each test uses its own ``cluster_id`` from
:func:`cluster_id` so keys never collide within a module.
"""

from __future__ import annotations

import itertools
from collections.abc import Iterator

import pytest

from logstore.dev.etcd_process import EtcdServer

_ids = itertools.count()


@pytest.fixture(scope="module")
def etcd() -> Iterator[EtcdServer]:
    """A running single-member etcd on a free loopback port, stopped after the module."""
    with EtcdServer(start_timeout_s=30.0) as server:
        yield server


@pytest.fixture
def cluster_id(request: pytest.FixtureRequest) -> str:
    """A key prefix of this test's own (``/logstore/<cluster_id>/``)."""
    return f"t{next(_ids)}-{request.node.name[:40]}".replace("[", "-").replace("]", "")
