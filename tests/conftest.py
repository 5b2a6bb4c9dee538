"""Shared pytest fixtures (keep them small and generic), and the order of the test files."""

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


# ---------------------------------------------------------------- order of files

# make test runs pytest-xdist with --dist loadfile: each worker takes whole files in collection
# order. These files take the longest (each 3 to 12 minutes of a worker in fc 27); started last,
# one of them kept a worker busy alone for minutes after the other had finished. They go first.
_LONGEST_FIRST = ("tests/project/test_readme.py", "tests/chaos/test_cluster_exactly_once.py",
                  "tests/e2e/test_spark_standalone.py", "tests/jobs/test_materialize.py")


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    rank = {path: i for i, path in enumerate(_LONGEST_FIRST)}
    items.sort(key=lambda item: rank.get(item.nodeid.split("::")[0], len(rank)))  # stable within a file
