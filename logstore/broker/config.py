"""Broker configuration: ``conf/broker.toml``, ``LOGSTORE_*`` environment variables, flags.

Precedence, highest first: explicit overrides (command-line flags), the
environment (``LOGSTORE_<KEY>`` with the key in upper case, e.g.
``LOGSTORE_DATA_DIR``, ``LOGSTORE_PORT``), the TOML file, the defaults of
:class:`BrokerConfig`. Topic defaults live in the file's ``[topic_defaults]``
table under Kafka's names and are validated by
:meth:`logstore.storage.config.LogConfig.from_properties`.

Thread-safety: instances are frozen.
"""

from __future__ import annotations

import dataclasses
import os
import sys
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from logstore.broker.quota_config import QuotaConfig, QuotaOverride, parse_quota_overrides
from logstore.broker.tls_rules import PrincipalMapper, check_listener, read_pem
from logstore.defaults import DEFAULT_HOST, DEFAULT_PORT
from logstore.errors import InvalidConfigError
from logstore.scram import MAX_ITERATIONS, MECHANISMS, MIN_ITERATIONS
from logstore.storage.config import LogConfig
from logstore.storage.file_cache import DEFAULT_MAX_OPEN_SEGMENT_FILES
from logstore.storage.log_manager import DEFAULT_MAX_PARTITIONS_PER_BROKER

if sys.version_info >= (3, 11):
    import tomllib
else:  # pragma: no cover - exercised on 3.10 only
    import tomli as tomllib

__all__ = ["BrokerConfig", "kafka_listener_address", "load_broker_config"]

ENV_PREFIX = "LOGSTORE_"


@dataclass(frozen=True, slots=True)
class BrokerConfig:
    node_id: int = 0
    host: str = DEFAULT_HOST
    port: int = DEFAULT_PORT
    data_dir: str = "data"
    max_request_bytes: int = 64 << 20
    max_decompressed_bytes: int = 256 << 20
    retention_check_interval_ms: int = 30_000
    flush_check_interval_ms: int = 1_000
    # How often each partition's high-water mark is checkpointed (logstore.storage.checkpoint).
    hwm_checkpoint_interval_ms: int = 5_000
    num_partitions: int = 1
    io_threads: int = 8
    # Consumer groups (logstore.broker.groups.coordinator): a member silent for the session
    # timeout is evicted; an in-sync member's heartbeat is held up to the interval.
    group_session_timeout_ms: int = 45_000
    group_heartbeat_interval_ms: int = 5_000
    group_assignor: str = "uniform"  # the default of groups whose members name none: uniform | range
    offsets_topic_num_partitions: int = 10  # of __consumer_offsets, when it is created
    # On a cluster, __consumer_offsets is replicated: this many replicas, at most the live brokers.
    offsets_topic_replication_factor: int = 3
    transaction_state_num_partitions: int = 10  # of __transaction_state, when it is created
    # Bounded work per request (logstore.broker.request_bounds): the entries of all the
    # lists of one request, counted together; and the size of a Fetch's answer.
    max_request_entries: int = 10_000
    max_fetch_reply_bytes: int = 64 << 20
    # Descriptor pressure (logstore.storage.file_cache): segment files open at once, closed
    # least-recently-used beyond this; and the partitions this broker may hold, all topics.
    max_open_segment_files: int = DEFAULT_MAX_OPEN_SEGMENT_FILES
    max_partitions_per_broker: int = DEFAULT_MAX_PARTITIONS_PER_BROKER
    # A cluster (replication/): empty ``metadata`` is the single broker of today, which needs
    # nothing else. ``etcd://HOST:PORT[,HOST:PORT]`` joins the cluster whose metadata that
    # etcd holds, as broker ``node_id``, reachable at ``advertised_address`` (default
    # host:port as bound). ``peer_addresses`` ("2=HOST:PORT,3=HOST:PORT") overrides how this
    # broker reaches a peer for replication (a separate replication network; the fault
    # harness routes each pair of brokers through its own proxy this way).
    metadata: str = ""
    cluster_id: str = "logstore"
    advertised_address: str = ""
    rack: str = ""
    peer_addresses: str = ""
    default_replication_factor: int = 1
    # The broker's etcd lease: a broker silent this long is dead to the controller.
    broker_session_timeout_ms: int = 6_000
    # A follower not caught up with its leader for this long leaves the ISR.
    replica_lag_time_max_ms: int = 10_000
    replica_fetch_wait_max_ms: int = 500
    # SIGTERM: how long the broker waits for its leaderships to move before it stops anyway.
    controlled_shutdown_timeout_ms: int = 10_000
    # Operations (logstore.broker.metrics, logstore.broker.log_lines): Prometheus' /metrics on
    # this port (0: off), and the log's line format, "text" or "json" (one JSON object a line).
    metrics_port: int = 0
    log_format: str = "text"
    # Kafka's wire protocol beside gRPC (logstore.broker.kafka): "HOST:PORT" serves Kafka
    # clients there (port 0 picks a free one), on the same data plane; empty: off. On a cluster
    # each broker publishes its Kafka address with its registration (Metadata routes Kafka
    # clients to leaders and coordinators), so give every broker one. It speaks the broker's
    # security_protocol with the same TLS keys, SCRAM users, ACLs and quotas as the gRPC
    # listener (logstore.broker.kafka.security); plaintext on a non-loopback host needs
    # allow_plaintext. Needs Python >= 3.11.
    kafka_listener: str = ""
    # Authentication (logstore.broker.security.scram_service): the listener's protocol as Kafka
    # names it; SASL_PLAINTEXT / SASL_SSL require a SCRAM session on every call but
    # SaslAuthenticate and the health service. The mechanisms offered (comma-separated), how
    # long a session lasts, the fixed pause before a failed login answers, and the iteration
    # count an unknown user appears to have (set it to your users' count).
    security_protocol: str = "PLAINTEXT"
    sasl_enabled_mechanisms: str = "SCRAM-SHA-256,SCRAM-SHA-512"
    sasl_session_lifetime_ms: int = 3_600_000
    sasl_failure_delay_ms: int = 500
    scram_iterations: int = 4096
    # A SASL cluster's brokers log in to each other (replication links) as this user
    # (Kafka's inter-broker JAAS credentials); the password is kept out of repr.
    sasl_inter_broker_username: str = ""
    sasl_inter_broker_password: str = field(default="", repr=False)
    sasl_inter_broker_mechanism: str = "SCRAM-SHA-512"
    # Security, TLS (logstore.broker.security.tls): tls_cert + tls_key (PEM) make the listener
    # TLS; tls_client_ca requires client certificates signed by it (mTLS), whose subject the
    # ssl_principal_mapping_rules (Kafka's syntax) turn into User:<name>. tls_ca is the CA the
    # broker trusts when it calls peers over TLS (default: tls_client_ca). A plaintext listener
    # on a non-loopback address needs allow_plaintext. etcd_ca/etcd_cert/etcd_key: TLS to an
    # etcd serving https (TLS is on when etcd_ca is set; metadata stays etcd://HOST:PORT).
    tls_cert: str = ""
    tls_key: str = ""
    tls_client_ca: str = ""
    tls_ca: str = ""
    ssl_principal_mapping_rules: str = "DEFAULT"
    allow_plaintext: bool = False
    etcd_ca: str = ""
    etcd_cert: str = ""
    etcd_key: str = ""
    # Authorization (logstore.broker.security.acls): with ``authorizer`` on, every RPC is
    # checked against the ACLs (deny by default unless ``allow_everyone_if_no_acl_found``);
    # ``super_users`` (e.g. ["User:admin", "User:broker"]) may do everything, and are the only
    # ones that may touch internal topics. The brokers of a cluster fetch from each other as
    # their own principal (their mTLS certificate's): list it here.
    authorizer: bool = False
    super_users: tuple[str, ...] = ()
    allow_everyone_if_no_acl_found: bool = False
    # Quotas (logstore.broker.security.quotas): default produce/fetch byte rates (bytes/s) and
    # request rate (requests/s) of each principal and client id, 0 = no limit; the sliding
    # window they are measured over; the longest throttle time a request is answered with.
    # Per-entity overrides are the file's [quotas] table ("User:alice" = { ... }).
    quota_producer_byte_rate: int = 0
    quota_consumer_byte_rate: int = 0
    quota_request_rate: int = 0
    quota_window_num: int = 11
    quota_window_size_ms: int = 1_000
    quota_max_throttle_ms: int = 30_000
    quotas: tuple[QuotaOverride, ...] = ()
    topic_defaults: LogConfig = field(default_factory=LogConfig)

    @property
    def listen_address(self) -> str:
        return f"{self.host}:{self.port}"

    def quota_config(self) -> QuotaConfig:
        """The quotas as :class:`~logstore.broker.quota_config.QuotaConfig`."""
        return QuotaConfig(
            producer_byte_rate=self.quota_producer_byte_rate, consumer_byte_rate=self.quota_consumer_byte_rate,
            request_rate=self.quota_request_rate, overrides=self.quotas, window_num=self.quota_window_num,
            window_size_ms=self.quota_window_size_ms, max_throttle_ms=self.quota_max_throttle_ms,
        )

    @property
    def sasl(self) -> bool:
        """Whether the listener requires SCRAM authentication (``SASL_PLAINTEXT``/``SASL_SSL``)."""
        return self.security_protocol in ("SASL_PLAINTEXT", "SASL_SSL")

    @property
    def sasl_mechanisms(self) -> tuple[str, ...]:
        return tuple(m.strip().upper() for m in self.sasl_enabled_mechanisms.split(",") if m.strip())

    @property
    def tls(self) -> bool:
        """Whether the listener (and this broker's calls to its peers) use TLS."""
        return bool(self.tls_cert)

    @property
    def peer_ca(self) -> str:
        """The CA this broker trusts when it calls a peer over TLS."""
        return self.tls_ca or self.tls_client_ca

    @property
    def clustered(self) -> bool:
        """Whether this broker is part of a cluster (its metadata lives in etcd)."""
        return bool(self.metadata)

    def peer_address_overrides(self) -> dict[int, str]:
        """``peer_addresses`` as {node id: "host:port"}."""
        out: dict[int, str] = {}
        for entry in filter(None, (e.strip() for e in self.peer_addresses.split(","))):
            node, sep, address = entry.partition("=")
            if not sep or not node.strip().isdigit() or ":" not in address:
                raise InvalidConfigError(
                    f"peer_addresses entry {entry!r} is not NODE_ID=HOST:PORT (e.g. 2=10.0.0.2:9392)"
                )
            out[int(node)] = address.strip()
        return out


_SCALARS = {f.name: f.type for f in dataclasses.fields(BrokerConfig) if f.name not in ("topic_defaults", "quotas")}


def _coerce(key: str, value: Any, source: str) -> Any:
    kind = _SCALARS[key]
    if kind == "tuple[str, ...]":
        return _coerce_list(key, value, source)
    try:
        if kind in ("bool", bool):
            if isinstance(value, bool):
                return value
            text = str(value).strip().lower()
            if text not in ("true", "false", "1", "0", "yes", "no"):
                raise InvalidConfigError(f"{source}: {key} must be true or false, got {value!r}")
            return text in ("true", "1", "yes")
        if kind in ("int", int):
            if isinstance(value, bool):
                raise ValueError
            return int(value)
        return str(value)
    except (TypeError, ValueError):
        raise InvalidConfigError(f"{source}: {key} must be an integer, got {value!r}") from None


def _coerce_list(key: str, value: Any, source: str) -> tuple[str, ...]:
    """A list of strings: a TOML array, or a comma-separated string (environment, flags)."""
    items = value.split(",") if isinstance(value, str) else value
    if not isinstance(items, (list, tuple)) or not all(isinstance(i, str) for i in items):
        raise InvalidConfigError(f"{source}: {key} must be a list of strings, got {value!r}")
    return tuple(i.strip() for i in items if i.strip())


def load_broker_config(
    path: str | None = None,
    *,
    overrides: Mapping[str, Any] | None = None,
    env: Mapping[str, str] | None = None,
) -> BrokerConfig:
    """Build the broker config from a TOML file, the environment and ``overrides``.

    ``path`` None means no file. Unknown keys anywhere raise
    :class:`InvalidConfigError` naming the key and where it came from.
    """
    values: dict[str, Any] = {}
    topic_props: dict[str, Any] = {}
    if path is not None:
        try:
            with open(path, "rb") as f:
                doc = tomllib.load(f)
        except OSError as e:
            raise InvalidConfigError(f"cannot read broker config {path}: {e.strerror}") from None
        except tomllib.TOMLDecodeError as e:
            raise InvalidConfigError(f"broker config {path} is not valid TOML: {e}") from None
        for key, value in doc.items():
            if key == "topic_defaults":
                if not isinstance(value, dict):
                    raise InvalidConfigError(f"{path}: [topic_defaults] must be a table")
                topic_props.update(value)
            elif key == "quotas":
                if not isinstance(value, dict):
                    raise InvalidConfigError(f"{path}: [quotas] must be a table")
                values["quotas"] = parse_quota_overrides(value, path)
            elif key in _SCALARS:
                values[key] = _coerce(key, value, path)
            else:
                raise InvalidConfigError(f"{path}: unknown broker config key {key!r}")
    environ = os.environ if env is None else env
    for key in _SCALARS:
        raw = environ.get(ENV_PREFIX + key.upper())
        if raw is not None and raw != "":
            values[key] = _coerce(key, raw, f"${ENV_PREFIX}{key.upper()}")
    for key, value in (overrides or {}).items():
        if value is None:
            continue
        if key == "topic_defaults":
            topic_props.update(value)
        elif key == "quotas":
            values["quotas"] = parse_quota_overrides(value, "flag")
        elif key in _SCALARS:
            values[key] = _coerce(key, value, "flag")
        else:
            raise InvalidConfigError(f"unknown broker config key {key!r}")
    for key in ("max_open_segment_files", "max_partitions_per_broker", "default_replication_factor",
                "offsets_topic_replication_factor", "transaction_state_num_partitions",
                "broker_session_timeout_ms", "replica_lag_time_max_ms"):
        if key in values and values[key] < 1:
            raise InvalidConfigError(f"{key} must be a positive integer, got {values[key]}")
    config = BrokerConfig(**values, topic_defaults=LogConfig.from_properties(topic_props))
    _check_request_bounds(config)
    _check_cluster(config)
    _check_sasl(config)
    _check_security(config)
    _check_quotas(config)
    _check_kafka_listener(config)
    return config


def _check_kafka_listener(config: BrokerConfig) -> None:
    """A parseable ``kafka_listener`` on Python 3.11+, not in plaintext on a non-loopback address
    unless ``allow_plaintext`` (a single broker or a broker of a cluster alike)."""
    if not config.kafka_listener:
        return
    host, port = kafka_listener_address(config)
    if sys.version_info < (3, 11):
        raise InvalidConfigError("kafka_listener needs Python 3.11 or later (its message codecs, the kio "
                                 f"package, do); this is Python {sys.version_info[0]}.{sys.version_info[1]}")
    # The listener speaks the broker's security_protocol with its TLS material (logstore.broker.kafka.security).
    check_listener(host, tls=config.tls, allow_plaintext=config.allow_plaintext, warn=False)


def kafka_listener_address(config: BrokerConfig) -> tuple[str, int]:
    """``kafka_listener`` as (host, port); raises :class:`InvalidConfigError` unless HOST:PORT."""
    host, sep, port = config.kafka_listener.rpartition(":")
    if not sep or not host or not port.isdigit() or not 0 <= int(port) <= 65535:
        raise InvalidConfigError(
            f"kafka_listener must be HOST:PORT (e.g. 127.0.0.1:9092; port 0 picks one), got {config.kafka_listener!r}")
    return host.strip("[]"), int(port)


def _check_sasl(config: BrokerConfig) -> None:
    protocols = ("PLAINTEXT", "SSL", "SASL_PLAINTEXT", "SASL_SSL")
    if config.security_protocol not in protocols:
        raise InvalidConfigError(
            f"security_protocol must be one of {', '.join(protocols)}, got {config.security_protocol!r}")
    unknown = [m for m in config.sasl_mechanisms if m not in MECHANISMS]
    if unknown or not config.sasl_mechanisms:
        raise InvalidConfigError(
            f"sasl_enabled_mechanisms must list some of {', '.join(MECHANISMS)}, got {config.sasl_enabled_mechanisms!r}")
    if config.sasl_session_lifetime_ms < 1:
        raise InvalidConfigError(f"sasl_session_lifetime_ms must be positive, got {config.sasl_session_lifetime_ms}")
    if config.sasl_failure_delay_ms < 0:
        raise InvalidConfigError(f"sasl_failure_delay_ms must be 0 or more, got {config.sasl_failure_delay_ms}")
    if config.sasl_inter_broker_mechanism not in MECHANISMS:
        raise InvalidConfigError(f"sasl_inter_broker_mechanism must be one of {', '.join(MECHANISMS)}, "
                                 f"got {config.sasl_inter_broker_mechanism!r}")
    if config.sasl and config.clustered and not config.sasl_inter_broker_username:
        raise InvalidConfigError(
            f"security_protocol {config.security_protocol} on a cluster needs sasl_inter_broker_username and "
            "sasl_inter_broker_password (LOGSTORE_SASL_INTER_BROKER_PASSWORD): the user brokers log in to each "
            "other as, for replication")
    if not MIN_ITERATIONS <= config.scram_iterations <= MAX_ITERATIONS:
        raise InvalidConfigError(
            f"scram_iterations must be {MIN_ITERATIONS} to {MAX_ITERATIONS} (Kafka's bounds), got {config.scram_iterations}")


def _check_security(config: BrokerConfig) -> None:
    """TLS keys that belong together, parseable mapping rules, no careless plaintext listener."""
    if bool(config.tls_cert) != bool(config.tls_key):
        raise InvalidConfigError("give tls_cert and tls_key together (the listener's certificate and its key)")
    if config.tls_client_ca and not config.tls_cert:
        raise InvalidConfigError("tls_client_ca (mTLS) needs tls_cert and tls_key (a TLS listener)")
    # The listener's protocol and its TLS keys agree; tls_cert with the default PLAINTEXT is SSL.
    if config.security_protocol in ("SSL", "SASL_SSL") and not config.tls_cert:
        raise InvalidConfigError(f"security_protocol {config.security_protocol} needs tls_cert and tls_key")
    if config.tls_cert and config.security_protocol == "SASL_PLAINTEXT":
        raise InvalidConfigError("tls_cert with security_protocol SASL_PLAINTEXT: use SASL_SSL (SCRAM over TLS)")
    if bool(config.etcd_cert) != bool(config.etcd_key):
        raise InvalidConfigError("give etcd_cert and etcd_key together (the client certificate for etcd)")
    for key in ("tls_cert", "tls_key", "tls_client_ca", "tls_ca", "etcd_ca", "etcd_cert", "etcd_key"):
        if getattr(config, key):
            read_pem(getattr(config, key), key)
    PrincipalMapper(config.ssl_principal_mapping_rules)
    check_listener(config.host, tls=config.tls, allow_plaintext=config.allow_plaintext, warn=False)


def _check_quotas(config: BrokerConfig) -> None:
    for key in ("quota_producer_byte_rate", "quota_consumer_byte_rate", "quota_request_rate"):
        if getattr(config, key) < 0:
            raise InvalidConfigError(f"{key} must be 0 (no limit) or more, got {getattr(config, key)}")
    for key in ("quota_window_num", "quota_window_size_ms", "quota_max_throttle_ms"):
        if getattr(config, key) < 1:
            raise InvalidConfigError(f"{key} must be at least 1, got {getattr(config, key)}")
    if config.quota_window_num < 2:
        raise InvalidConfigError(f"quota_window_num must be at least 2, got {config.quota_window_num}")


def _check_cluster(config: BrokerConfig) -> None:
    if config.metadata and not config.metadata.startswith("etcd://"):
        raise InvalidConfigError(
            f"metadata must be etcd://HOST:PORT[,HOST:PORT], got {config.metadata!r}"
        )
    if config.advertised_address and ":" not in config.advertised_address:
        raise InvalidConfigError(
            f"advertised_address must be HOST:PORT, got {config.advertised_address!r}"
        )
    if config.node_id < 0:
        raise InvalidConfigError(f"node_id must be 0 or more, got {config.node_id}")
    config.peer_address_overrides()
    if config.log_format not in ("text", "json"):
        raise InvalidConfigError(f"log_format must be text or json, got {config.log_format!r}")
    if not 0 <= config.metrics_port <= 65535:
        raise InvalidConfigError(f"metrics_port must be 0 (off) to 65535, got {config.metrics_port}")


def _check_request_bounds(config: BrokerConfig) -> None:
    for key in ("max_request_entries", "max_fetch_reply_bytes"):
        if getattr(config, key) < 1:
            raise InvalidConfigError(f"{key} must be at least 1, got {getattr(config, key)}")
