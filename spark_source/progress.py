"""How far a query is behind its topics: Spark Kafka source's ``offsetsBehindLatest`` metrics.

Spark's Kafka source reports, in each source's ``metrics`` of a query's progress,
``offsetsBehindLatest`` (the sum over partitions of the latest offset minus the
offset the batch ended at) and ``minOffsetsBehindLatest``,
``avgOffsetsBehindLatest``, ``maxOffsetsBehindLatest``, through the Java
interface ``ReportsSourceMetrics``. PySpark 4.2's Python Data Source API has no
such hook: its stream reader can report the latest offset
(:meth:`LogstoreStreamReader.reportLatestOffset
<spark_source.source.LogstoreStreamReader.reportLatestOffset>`, which fills the
progress's ``latestOffset``) but not custom metrics, so ``metrics`` stays empty.

:func:`offsets_behind_latest` computes the same four numbers from what the
progress does carry (``endOffset`` and ``latestOffset``), with Kafka's names
and string values::

    progress = query.lastProgress
    spark_source.offsets_behind_latest(progress["sources"][0])
    # {'offsetsBehindLatest': '35', 'minOffsetsBehindLatest': '15',
    #  'avgOffsetsBehindLatest': '17.5', 'maxOffsetsBehindLatest': '20'}

A partition in ``latestOffset`` that the batch's ``endOffset`` does not name
yet (a topic or partition that appeared meanwhile) is left out: where its
reading starts is not known here.

Thread-safety: pure functions.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from typing import Any

__all__ = ["offsets_behind_latest"]


def _offsets(value: Any) -> dict[tuple[str, str], int]:
    """``{"topic": {"0": 12}}`` (a dict or its JSON text, as progress holds it) flattened."""
    if value is None:
        return {}
    doc = json.loads(value) if isinstance(value, (str, bytes)) else value
    if not isinstance(doc, Mapping):
        return {}
    return {(topic, str(p)): int(o) for topic, parts in doc.items() if isinstance(parts, Mapping)
            for p, o in parts.items()}


def offsets_behind_latest(source: Any) -> dict[str, str]:
    """Kafka's four ``*OffsetsBehindLatest`` metrics for one source of a query's progress.

    ``source`` is an element of ``query.lastProgress["sources"]`` (a dict), or a
    :class:`pyspark.sql.streaming.listener.SourceProgress` (a listener's event).
    Empty when the progress has no ``latestOffset`` (no batch planned yet).
    """
    if isinstance(source, Mapping):
        end, latest = source.get("endOffset"), source.get("latestOffset")
    else:
        end, latest = getattr(source, "endOffset", None), getattr(source, "latestOffset", None)
    ended = _offsets(end)
    behind = [max(offset - ended[key], 0) for key, offset in sorted(_offsets(latest).items()) if key in ended]
    if not behind:
        return {}
    return {
        "offsetsBehindLatest": str(sum(behind)),
        "minOffsetsBehindLatest": str(min(behind)),
        "avgOffsetsBehindLatest": f"{sum(behind) / len(behind):.1f}",
        "maxOffsetsBehindLatest": str(max(behind)),
    }
