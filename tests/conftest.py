"""Shared pytest fixtures (keep them small and generic)."""

from __future__ import annotations

import pytest
from storage_helpers import ManualClock


@pytest.fixture
def clock() -> ManualClock:
    """A hand-moved clock to inject where code takes ``clock=``."""
    return ManualClock()


# ---------------------------------------------------------------- Spark and a shared broker


@pytest.fixture(scope="session")
def spark():  # type: ignore[no-untyped-def]
    """One SparkSession for the whole run: local[2], small shuffles, Delta enabled."""
    import spark_source
    from jobs.spark_session import local_session

    session = local_session("logstore-tests", delta=True)
    spark_source.register(session)
    yield session
    session.stop()


@pytest.fixture(scope="session")
def shared_broker():  # type: ignore[no-untyped-def]
    """A real embedded broker shared by tests that only create their own topics."""
    from logstore.broker.embedded import EmbeddedBroker

    with EmbeddedBroker(overrides={"retention_check_interval_ms": 200}) as broker:
        yield broker
