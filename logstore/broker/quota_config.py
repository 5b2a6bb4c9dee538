"""Quota settings: the defaults, the ``[quotas]`` overrides of ``conf/broker.toml`` and their lookup.

The values :mod:`logstore.broker.config` reads and :mod:`logstore.broker.security.quotas`
enforces (its module docstring has the model: what is limited, who, how it is
measured and enforced). Kept apart from both so that the config does not import
the security package.

Thread-safety: instances are frozen after construction.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from logstore.errors import InvalidConfigError

__all__ = ["FETCH", "KINDS", "PRODUCE", "REQUEST", "QuotaConfig", "QuotaOverride", "parse_quota_overrides"]

PRODUCE = "producer_byte_rate"
FETCH = "consumer_byte_rate"
REQUEST = "request_rate"
KINDS = (PRODUCE, FETCH, REQUEST)


@dataclass(frozen=True, slots=True)
class QuotaOverride:
    """The ``[quotas]`` entry of one entity: ``User:NAME``, ``client-id:ID`` or both comma-joined;
    a rate that is None falls through to the next, less specific entity."""

    entity: str
    producer_byte_rate: int | None = None
    consumer_byte_rate: int | None = None
    request_rate: int | None = None


def parse_quota_overrides(table: Mapping[str, Any], source: str) -> tuple[QuotaOverride, ...]:
    """The ``[quotas]`` table of ``conf/broker.toml`` as overrides; raises :class:`InvalidConfigError`
    naming ``source`` and the entry for unknown entities, keys or negative rates."""
    out = []
    for entity, rates in table.items():
        user, client = _split_entity(entity)
        if user is None and client is None:
            raise InvalidConfigError(
                f'{source}: quota entity {entity!r} must be "User:NAME", "client-id:ID" or '
                f'"User:NAME,client-id:ID"'
            )
        if not isinstance(rates, Mapping):
            raise InvalidConfigError(f"{source}: [quotas] {entity!r} must be a table of rates, got {rates!r}")
        values: dict[str, int] = {}
        for key, value in rates.items():
            if key not in KINDS:
                raise InvalidConfigError(
                    f"{source}: [quotas] {entity!r}: unknown quota {key!r} (one of {', '.join(KINDS)})"
                )
            if isinstance(value, bool) or not isinstance(value, int) or value < 0:
                raise InvalidConfigError(
                    f"{source}: [quotas] {entity!r}: {key} must be an integer >= 0 (0: no limit), got {value!r}"
                )
            values[key] = value
        out.append(QuotaOverride(entity, **values))
    return tuple(out)


def _split_entity(entity: str) -> tuple[str | None, str | None]:
    """(principal, client id) of an entity name; (None, None) when it is neither."""
    user: str | None = None
    client: str | None = None
    for part in entity.split(","):
        part = part.strip()
        if part.startswith("User:") and len(part) > 5 and user is None:
            user = part
        elif part.startswith("client-id:") and len(part) > 10 and client is None:
            client = part[len("client-id:"):]
        else:
            return None, None
    return user, client


@dataclass(frozen=True)
class QuotaConfig:
    """The broker's quotas: defaults (0 = none), per-entity overrides and the window."""

    producer_byte_rate: int = 0
    consumer_byte_rate: int = 0
    request_rate: int = 0
    overrides: tuple[QuotaOverride, ...] = ()
    window_num: int = 11
    window_size_ms: int = 1000
    max_throttle_ms: int = 30_000
    _by_entity: dict[tuple[str | None, str | None], QuotaOverride] = field(
        init=False, repr=False, compare=False, default_factory=dict)

    def __post_init__(self) -> None:
        for o in self.overrides:
            self._by_entity[_split_entity(o.entity)] = o

    @property
    def enabled(self) -> bool:
        """Whether any quota is set at all (no: the broker installs no hook)."""
        return any(getattr(self, k) for k in KINDS) or any(
            getattr(o, k) for o in self.overrides for k in KINDS)

    def resolve(self, kind: str, principal: str, client_id: str) -> tuple[tuple[str, str], int]:
        """The entity whose rate ``kind`` applies to this caller, and that rate (0: none).

        Most specific first: user and client id, user, client id, then the default (whose
        entity is the (principal, client id) pair itself: each client gets the default).
        """
        for key in ((principal, client_id), (principal, None), (None, client_id)):
            o = self._by_entity.get(key)
            if o is not None:
                rate = getattr(o, kind)
                if rate is not None:
                    return (key[0] or "", "" if key[1] is None else key[1]), rate
        return (principal, client_id), getattr(self, kind)
