"""Apache Kafka's own Java tools and clients, for tests of the Kafka listener.

``make kafka-jars`` (which ``make test`` runs) resolves Kafka's jars with Maven into
``$LOGSTORE_KAFKA_JARS`` or ``.cache/kafka-jars``; :func:`kafka_classpath` finds them.
"""

from __future__ import annotations

import os
import subprocess

__all__ = ["kafka_classpath", "NO_KAFKA_JARS"]

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
