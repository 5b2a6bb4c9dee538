"""Building kio's responses: one handler answers every version of its API.

A version's response is built from the fields that version has (:func:`build`), its
nested entities taken from the same version's module (:func:`nested`): a handler passes
the values of the newest version and each older version keeps those it knows.

Thread-safety: pure functions.
"""

from __future__ import annotations

import dataclasses
import datetime
import sys
import uuid
from collections.abc import Awaitable, Callable, Iterable
from typing import Any, TypeVar

from kio.index import load_response_schema

from logstore.errors import LogstoreError

__all__ = ["NO_THROTTLE", "ZERO_UUID", "answer_each", "build", "nested", "response_of", "topic_uuid"]

NO_THROTTLE = datetime.timedelta(0)  # throttle_time: a quota's is set by the listener (.throttling)
E = TypeVar("E")
T = TypeVar("T")
ZERO_UUID = uuid.UUID(int=0)  # Kafka's "no topic id"


def response_of(request: Any) -> Any:
    """The response type of ``request``'s API and version."""
    return load_response_schema(request.__api_key__, request.__version__)


def nested(response_type: Any, name: str) -> Any:
    """The entity ``name`` of the module that defines ``response_type`` (the same version)."""
    return getattr(sys.modules[response_type.__module__], name)


def build(entity: Callable[..., E], **values: Any) -> E:
    """``entity`` from those of ``values`` it has fields for."""
    names = {f.name for f in dataclasses.fields(entity)}  # type: ignore[arg-type]
    return entity(**{k: v for k, v in values.items() if k in names})


def topic_uuid(topic_id: str) -> uuid.UUID:
    """A logstore topic id (32 hex digits) as Kafka's topic UUID; :data:`ZERO_UUID` if it is not one."""
    try:
        return uuid.UUID(topic_id)
    except ValueError:
        return ZERO_UUID


async def answer_each(items: Iterable[T], answer: Callable[[T], Awaitable[E]],
                      refused: Callable[[T, LogstoreError], E]) -> tuple[E, ...]:
    """Kafka's per-item answers: each of ``items`` answered by ``answer``, or by
    ``refused(item, error)`` when that raises a :class:`~logstore.errors.LogstoreError`."""
    out = []
    for item in items:
        try:
            out.append(await answer(item))
        except LogstoreError as e:
            out.append(refused(item, e))
    return tuple(out)
