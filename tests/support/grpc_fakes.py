"""A finished gRPC call that failed with UNAVAILABLE, for tests that inject connection faults.

:class:`UnavailableCall` is both the error a call raises (``grpc.RpcError``) and the call it
describes (``grpc.Call``), as gRPC's own errors are; the client maps it like a real reset.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import grpc

__all__ = ["UnavailableCall"]


class UnavailableCall(grpc.RpcError, grpc.Call):  # type: ignore[misc]
    """A call that ended with UNAVAILABLE and ``details``."""

    def __init__(self, details: str) -> None:
        super().__init__()
        self._details = details

    def code(self) -> grpc.StatusCode:
        return grpc.StatusCode.UNAVAILABLE

    def details(self) -> str:
        return self._details

    def initial_metadata(self) -> Any:
        return ()

    def trailing_metadata(self) -> Any:
        return ()

    def is_active(self) -> bool:
        return False

    def time_remaining(self) -> float | None:
        return None

    def cancel(self) -> bool:
        return False

    def add_callback(self, callback: Callable[[], None]) -> bool:
        return False
