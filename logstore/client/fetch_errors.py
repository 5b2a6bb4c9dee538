"""Retriable fetch errors, told once: the consumer's log of a partition's trouble.

A partition whose leader moves answers NOT_LEADER_OR_FOLLOWER (or
FENCED_LEADER_EPOCH, LEADER_NOT_AVAILABLE, ...) to every fetch until the
client's metadata names the new leader; a consumer polling meanwhile would log
the same warning once per fetch (50-70 times for one offset, issue 22).
:class:`FetchErrorLog` logs the first error of such an *episode* of a
partition at WARNING and its repeats at DEBUG; an episode ends when the
partition is fetched without error (:meth:`FetchErrorLog.clear`) or its error
changes (a new error code starts a new episode, logged again).

Thread-safety: used by the consumer's polling thread only.
"""

from __future__ import annotations

import logging

from logstore.errors import LogstoreError
from logstore.types import TopicPartition

__all__ = ["FetchErrorLog"]


class FetchErrorLog:
    """The error code of each partition's current episode; see the module docstring."""

    def __init__(self, logger: logging.Logger) -> None:
        self._log = logger
        self._episodes: dict[TopicPartition, str] = {}

    def note(self, tp: TopicPartition, offset: int, error: LogstoreError) -> None:
        """A fetch of ``tp`` at ``offset`` answered the retriable ``error``: log it if it starts an episode."""
        level = logging.DEBUG if self._episodes.get(tp) == error.code else logging.WARNING
        self._episodes[tp] = error.code
        self._log.log(level, "fetch of %s at %d: %s; retrying until the metadata names its leader",
                      tp, offset, error)

    def clear(self, tp: TopicPartition) -> None:
        """``tp`` was fetched without error: its episode (if any) is over."""
        self._episodes.pop(tp, None)

    @property
    def troubled(self) -> int:
        """How many partitions are in an episode."""
        return len(self._episodes)
