"""Shared pytest fixtures (keep them small and generic)."""

from __future__ import annotations

import pytest
from storage_helpers import ManualClock


@pytest.fixture
def clock() -> ManualClock:
    """A hand-moved clock to inject where code takes ``clock=``."""
    return ManualClock()
