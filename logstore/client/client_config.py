"""Kafka-style ways to configure a client: a confluent-style config dict, kafka-python's security
keywords. :func:`accepts_client_config` wraps ``Producer``/``Consumer``/``Admin.__init__``:

* a **config dict** as the first positional argument, with librdkafka/Java dotted names::

      Producer({"bootstrap.servers": "h:9392", "security.protocol": "SSL",
                "ssl.ca.location": "ca.pem", "linger.ms": 5})

  A dotted key is the keyword of the same name with ``_`` for ``.`` (``linger.ms`` →
  ``linger_ms``, ``group.id`` → ``group_id``), plus the renames of :data:`RENAMED_KEYS`
  (``compression.type`` → ``compression``) and the security synonyms of
  :data:`~logstore.client.security.SECURITY_OPTION_NAMES` (``ssl.ca.location``, ...).
  String values are converted to the keyword's type (``"5"`` → 5, ``"true"`` → True),
  as properties files give them. ``client.id`` is accepted everywhere (ignored by
  clients without one). Any other key is an :class:`~logstore.errors.InvalidConfigError`
  (``INVALID_CONFIG``) naming it; so is a key given both in the dict and as a keyword.
* kafka-python's **security keywords** ``security_protocol``, ``ssl_cafile``,
  ``ssl_certfile``, ``ssl_keyfile``, ``sasl_mechanism``, ``sasl_plain_username``,
  ``sasl_plain_password`` become one :class:`~logstore.client.security.ClientSecurity`
  passed as ``security=`` (giving both is an error).
* kafka-python's keywords whose name is not ours (:data:`RENAMED_KEYWORDS`:
  ``compression_type`` → ``compression``); giving both names is an error.

Also :func:`poll_timeout_ms`: a poll's wait given either way (seconds or milliseconds).

Thread-safety: pure functions; the wrapper keeps no state.
"""

from __future__ import annotations

import functools
import inspect
from collections.abc import Callable, Mapping
from typing import Any, TypeVar

from logstore.client.security import SECURITY_OPTION_NAMES, security_from_options
from logstore.errors import InvalidConfigError

__all__ = ["RENAMED_KEYS", "RENAMED_KEYWORDS", "accepts_client_config", "keywords_from_config", "poll_timeout_ms"]

# Dotted names whose keyword is not the name with "_" for ".".
RENAMED_KEYS = {"compression.type": "compression", "compression.codec": "compression"}
# kafka-python's keywords whose name is not ours.
RENAMED_KEYWORDS = {"compression_type": "compression"}
# Accepted by every client, used by those that have the keyword.
_OPTIONAL_KEYS = {"client.id": "client_id"}
_SECURITY_SYNONYMS = {syn: name for name, syns in SECURITY_OPTION_NAMES.items() for syn in syns}
_TRUE = ("true", "1", "yes")
_FALSE = ("false", "0", "no")

_F = TypeVar("_F", bound=Callable[..., None])


def _convert(key: str, value: Any, default: Any) -> Any:
    if not isinstance(value, str) or default is None or isinstance(default, str):
        return value
    text = value.strip()
    if isinstance(default, bool):
        if text.lower() in _TRUE + _FALSE:
            return text.lower() in _TRUE
        raise InvalidConfigError(f"config {key!r} must be true or false, got {value!r}")
    if isinstance(default, int):
        try:
            return int(text)
        except ValueError:
            if key == "acks":  # "all" / "-1"
                return text
            raise InvalidConfigError(f"config {key!r} must be an integer, got {value!r}") from None
    return value


def keywords_from_config(config: Mapping[str, Any], signature: inspect.Signature, owner: str) -> dict[str, Any]:
    """The keywords that the dotted ``config`` stands for, for a callable of ``signature``."""
    params = signature.parameters
    out: dict[str, Any] = {}
    for key, value in config.items():
        if not isinstance(key, str):
            raise InvalidConfigError(f"{owner} config keys are strings, got {key!r}")
        name = _SECURITY_SYNONYMS.get(key) or RENAMED_KEYS.get(key) or _OPTIONAL_KEYS.get(key)
        if name is None:
            name = key.replace(".", "_")
        if name in SECURITY_OPTION_NAMES:
            out[name] = value
            continue
        if name not in params or name in ("self", "security"):
            if key in _OPTIONAL_KEYS:
                continue
            raise InvalidConfigError(f"{owner} has no config {key!r}")
        if name in out:
            raise InvalidConfigError(f"{owner} config names {name} twice (one of them as {key!r})")
        out[name] = _convert(key, value, params[name].default)
    return out


def accepts_client_config(init: _F) -> _F:
    """Let ``init`` take a config dict first and kafka-python's security keywords (module docstring)."""
    signature = inspect.signature(init)
    owner = init.__qualname__.split(".")[0]

    @functools.wraps(init)
    def wrapper(self: Any, *args: Any, **kwargs: Any) -> None:
        if args and isinstance(args[0], Mapping):
            from_config = keywords_from_config(args[0], signature, owner)
            args = args[1:]
            both = sorted(set(from_config) & set(kwargs))
            if both:
                raise InvalidConfigError(f"{owner}: {', '.join(both)} given in the config dict and as a keyword")
            kwargs.update(from_config)
        for theirs, ours in RENAMED_KEYWORDS.items():
            if theirs in kwargs and ours in signature.parameters:
                if ours in kwargs:
                    raise InvalidConfigError(f"{owner}: give {ours} or {theirs} (kafka-python's name), not both")
                kwargs[ours] = kwargs.pop(theirs)
        security_options = {k: kwargs.pop(k) for k in list(kwargs) if k in SECURITY_OPTION_NAMES}
        if security_options:
            if kwargs.get("security") is not None:
                raise InvalidConfigError(f"{owner}: give security= or the security options, not both")
            kwargs["security"] = security_from_options(security_options)
        init(self, *args, **kwargs)

    return wrapper  # type: ignore[return-value]


def poll_timeout_ms(timeout: float | None, timeout_ms: int | None) -> int:
    """The wait of a poll in ms from ``timeout`` (seconds, confluent-kafka's form) or ``timeout_ms``
    (kafka-python's); see :meth:`~logstore.client.consumer.Consumer.poll`."""
    if timeout is not None and timeout_ms is not None:
        raise ValueError(f"give timeout (seconds) or timeout_ms, not both (got {timeout!r} and {timeout_ms!r})")
    if timeout is not None:
        if isinstance(timeout, bool) or not isinstance(timeout, (int, float)) or not timeout >= 0:
            raise ValueError(f"timeout is in seconds and must be a number >= 0, got {timeout!r}")
        return int(timeout * 1000)
    if timeout_ms is not None:
        if isinstance(timeout_ms, bool) or not isinstance(timeout_ms, int) or timeout_ms < 0:
            raise ValueError(f"timeout_ms must be an integer >= 0, got {timeout_ms!r}")
        return timeout_ms
    return 0
