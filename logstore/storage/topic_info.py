"""A topic's identity and configuration as the log manager keeps it: :class:`TopicInfo`.

On disk it is ``meta/topics/<topic>.json`` (:meth:`TopicInfo.to_json`): name, topic id,
partition count, the topic's own config overrides, the Arrow schema (IPC-encoded, base64),
the creation time and, for a cluster topic, its replication factor. The file is the commit
point of a topic's creation (see :mod:`logstore.storage.log_manager`).

Thread-safety: immutable values.
"""

from __future__ import annotations

import base64
import json
from collections.abc import Mapping
from dataclasses import dataclass

import pyarrow as pa

from logstore.record import decode_schema, encode_schema, value_schema_of
from logstore.schema_text import format_schema
from logstore.storage.config import LogConfig

__all__ = ["TopicInfo", "SCHEMA_CONFIG"]

SCHEMA_CONFIG = "schema"


@dataclass(frozen=True, slots=True)
class TopicInfo:
    """A topic's identity and configuration. ``overrides`` are its own configs only."""

    name: str
    topic_id: str
    partitions: int
    overrides: Mapping[str, str]
    config: LogConfig
    schema: pa.Schema
    created_ms: int
    # A cluster topic (see the module docstring): only some partitions are local.
    replicated: bool = False
    replication_factor: int = 1

    @property
    def typed(self) -> bool:
        return value_schema_of(self.schema) is not None

    def describe_configs(self) -> dict[str, str]:
        """Every effective config, plus ``schema`` (the value columns as DDL, empty if untyped)."""
        props = self.config.to_properties()
        value_schema = value_schema_of(self.schema)
        props[SCHEMA_CONFIG] = format_schema(value_schema) if value_schema is not None else ""
        return props

    def to_json(self) -> bytes:
        doc = {
            "name": self.name,
            "topic_id": self.topic_id,
            "partitions": self.partitions,
            "configs": dict(self.overrides),
            "schema": base64.b64encode(encode_schema(self.schema)).decode(),
            "created_ms": self.created_ms,
        }
        if self.replicated:
            doc.update(replicated=True, replication_factor=self.replication_factor)
        return json.dumps(doc, indent=2).encode()

    @classmethod
    def from_json(cls, data: bytes, *, defaults: LogConfig, where: str) -> TopicInfo:
        doc = json.loads(data)
        schema, _ = decode_schema(base64.b64decode(doc["schema"]), where=where)
        overrides = dict(doc.get("configs", {}))
        return cls(
            name=doc["name"],
            topic_id=doc["topic_id"],
            partitions=int(doc["partitions"]),
            overrides=overrides,
            config=LogConfig.from_properties(overrides, base=defaults),
            schema=schema,
            created_ms=int(doc.get("created_ms", 0)),
            replicated=bool(doc.get("replicated", False)),
            replication_factor=int(doc.get("replication_factor", 1)),
        )
