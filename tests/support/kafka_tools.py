"""Apache Kafka's own Java tools and clients, for tests of the Kafka listener.

``make kafka-jars`` (which ``make test`` runs) resolves Kafka's jars with Maven into
``$LOGSTORE_KAFKA_JARS`` or ``.cache/kafka-jars``; :func:`kafka_classpath` finds them.
"""

from __future__ import annotations

import os
import subprocess
import time
from collections.abc import Sequence

__all__ = ["CLIENT_CONF", "kafka_classpath", "kafka_values", "NO_KAFKA_JARS"]

# confluent-kafka settings of the tests: a broker that goes away is noticed, and found again, quickly.
CLIENT_CONF = {"socket.timeout.ms": 10_000, "reconnect.backoff.max.ms": 500}

NO_KAFKA_JARS = ("no Apache Kafka jars cached (make kafka-jars, which make test runs, resolves them "
                 "with mvn) or no java")


def kafka_classpath() -> str | None:
    """The classpath of Apache Kafka's jars if cached, and Java to run them; else None."""
    configured = os.environ.get("LOGSTORE_KAFKA_JARS")
    repo = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
    folder = configured if configured else os.path.join(repo, ".cache", "kafka-jars")
    folder = folder if os.path.isabs(folder) else os.path.join(repo, folder)
    if not any(n.startswith("kafka-clients-") for n in (os.listdir(folder) if os.path.isdir(folder) else ())):
        return None
    if subprocess.run(["java", "-version"], capture_output=True).returncode != 0:
        return None
    return os.path.join(folder, "*")


def kafka_values(kafka_bootstrap: str, topic: str, *, isolation: str, expected: int,
                 partitions: Sequence[int] = (0, 1)) -> list[bytes]:
    """Every value a confluent-kafka consumer with ``isolation.level`` ``isolation`` reads from
    ``partitions`` of ``topic``, sorted: read until ``expected`` came (at most 20 s), then 1.5 s
    more, so that a value beyond what is expected shows up too."""
    import confluent_kafka as ck

    consumer = ck.Consumer({"bootstrap.servers": kafka_bootstrap, "group.id": f"{isolation}-{topic}",
                            "isolation.level": isolation, "auto.offset.reset": "earliest",
                            "enable.auto.commit": False, **CLIENT_CONF})
    try:
        consumer.assign([ck.TopicPartition(topic, p, 0) for p in partitions])
        got: list[bytes] = []
        deadline = time.monotonic() + 20
        while time.monotonic() < deadline and len(got) < expected:
            message = consumer.poll(0.5)
            if message is not None and message.error() is None:
                got.append(message.value())
        end = time.monotonic() + 1.5
        while time.monotonic() < end:
            message = consumer.poll(0.3)
            if message is not None and message.error() is None:
                got.append(message.value())
        return sorted(got)
    finally:
        consumer.close()
