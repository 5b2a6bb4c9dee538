"""Byte counts for people: ``human_bytes(1536)`` is ``1.5 KiB``. One formatter for the CLI, the
web console, the compaction job and the scheduler.

Thread-safety: a pure function.
"""

from __future__ import annotations

__all__ = ["human_bytes"]


def human_bytes(n: int) -> str:
    """``n`` bytes in the binary unit that keeps one decimal meaningful: B, KiB, MiB, GiB or TiB."""
    size = float(n)
    for unit in ("B", "KiB", "MiB", "GiB", "TiB"):
        if size < 1024 or unit == "TiB":
            return f"{size:.0f} {unit}" if unit == "B" else f"{size:.1f} {unit}"
        size /= 1024
    raise AssertionError("unreachable")
