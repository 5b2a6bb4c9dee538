"""The transaction coordinator's :class:`~logstore.broker.transactions.coordinator.DecisionLog`
in the internal topic ``__sink_commits``.

Each committed batch of a transaction group is one record (key: the group id,
value: :meth:`GroupDecision.to_json`) of the one-partition topic
``__sink_commits`` (``retention.ms=-1``: decisions are never deleted), appended
with fsync — the commit point of the group's batch. On start-up the topic is
created if missing and every decision is read back in the order written (see
:mod:`logstore.broker.internal_log`).

Thread-safety: as :class:`~logstore.broker.internal_log.InternalTopicLog`.
"""

from __future__ import annotations

from logstore.broker.internal_log import InternalRecord, InternalTopicLog
from logstore.broker.transactions.coordinator import SINK_COMMITS_TOPIC, DecisionLog, GroupDecision
from logstore.storage.log_manager import LogManager

__all__ = ["TopicDecisionLog"]


class TopicDecisionLog(DecisionLog):
    """Group decisions as records of ``__sink_commits`` (key = group id); see the module docstring."""

    def __init__(self, manager: LogManager) -> None:
        self._log = InternalTopicLog(manager, SINK_COMMITS_TOPIC, partitions=1, configs={"retention.ms": "-1"})

    def append(self, decision: GroupDecision) -> None:
        self._log.append([InternalRecord(decision.group_id, decision.group_id.encode(), decision.to_json())],
                         fsync=True)

    def read_all(self) -> list[GroupDecision]:
        self._log.partitions()  # the topic exists from the first start-up on
        return [GroupDecision.from_json(value) for _, value in self._log.read_all() if value is not None]
