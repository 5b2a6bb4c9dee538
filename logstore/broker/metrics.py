"""The broker's Prometheus metrics: ``/metrics`` on ``metrics_port`` (0, the default: off).

What a scrape shows (names follow Prometheus' conventions: ``_total`` counters,
``_bytes`` and ``_seconds`` units; rates are the scraper's ``rate()``):

* per partition (labels ``topic``, ``partition``), read **at scrape time** by a
  custom collector, so an append costs no gauge update:
  ``logstore_log_size_bytes``, ``logstore_log_start_offset``,
  ``logstore_log_end_offset`` (LEO), ``logstore_high_watermark``;
* per partition, counted **once per request and partition** (never per record):
  ``logstore_produce_bytes_in_total``, ``logstore_produce_records_in_total``
  (records appended), ``logstore_fetch_bytes_out_total``,
  ``logstore_fetch_records_out_total`` (offsets a consumer fetch moved past:
  the records sent, plus any compaction gaps and transaction markers they
  span; replica fetches are not counted);
* ``logstore_request_latency_seconds{rpc}``: a histogram of every request's time, one
  ``rpc`` per method of the service (``Produce``, ``Fetch``, ``Metadata``, ...;
  ``Fetch`` is consumers' fetches, ``FetchFollower`` replicas'), timed around its
  handler by :func:`timed_handlers` (a fetch's time includes its long-poll wait, as
  Kafka's; a quota's throttle hold comes after the answer and is not included, as
  in Kafka). Per request: two clock reads and one observe of a cached child;
* ``logstore_request_errors_total{rpc, code}``: a request that failed as a whole
  (gRPC status with ``logstore-error-code``), and each Produce/Fetch partition
  answered with an error;
* ``logstore_throttle_time_seconds{principal, quota}``: a histogram of the throttle
  times given to requests over a quota (:mod:`logstore.broker.security.quotas`;
  ``quota`` is ``producer_byte_rate``, ``consumer_byte_rate`` or ``request_rate``;
  requests within their quotas are not observed);
* ``logstore_group_lag{group, topic, partition}``: the high-water mark minus the
  group's committed offset, at scrape time (groups without commits: none);
* ``logstore_under_replicated_partitions`` (partitions this broker leads whose ISR
  is smaller than their replica set),
  ``logstore_offline_partitions`` (this broker's logs offline after damage, plus,
  on the active controller, the cluster's partitions without a leader),
  ``logstore_is_controller`` (0 or 1; 1 on a single broker, its own controller) and
  ``logstore_open_transactions`` (transactions not yet complete). Summed over the
  brokers of a cluster, each of these is the cluster's count, as in Kafka.

The same values under the names Kafka's JMX exporter gives, which Kafka dashboards and
alerts are built on (made at scrape time from the series above: nothing more on the
hot path):

* ``kafka_server_brokertopicmetrics_messagesin_total``, ``..._bytesin_total`` and
  ``..._bytesout_total``: per ``topic``, and one series without the label for all
  topics (Kafka's ``BrokerTopicMetrics`` with and without ``topic``);
* ``kafka_server_replicamanager_underreplicatedpartitions`` and
  ``kafka_controller_kafkacontroller_activecontrollercount`` (1 on a single broker and
  on a cluster's active controller: the cluster's sum is 1);
* ``kafka_network_requestmetrics_totaltimems{request}``: the request latency histogram
  in milliseconds (``_bucket``/``_sum``/``_count``; ``histogram_quantile`` gives the
  percentiles Kafka's ``TotalTimeMs`` shows), ``request`` named as Kafka names it:
  ``Produce``, ``FetchConsumer``, ``FetchFollower``, ``Metadata``,
  ``OffsetForLeaderEpoch``, ...; methods Kafka does not have keep their own name
  (``ReplaceSegments``, ``DescribeCleaning``, ...).

Each broker has its own :class:`~prometheus_client.CollectorRegistry` (tests run
several brokers in one process). The HTTP server is prometheus_client's own
(a daemon thread), stopped with the broker.

Thread-safety: the counters are prometheus_client's (locked); the collector runs
on the HTTP server's thread and reads the partitions' offsets, which are plain
attribute reads of ints (consistent enough for a gauge; never a torn value).
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable, Iterator, Mapping
from typing import TYPE_CHECKING, Any, Protocol
from wsgiref.simple_server import WSGIServer

import grpc
from prometheus_client import CollectorRegistry, Counter, Histogram, start_http_server
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, Metric
from prometheus_client.registry import Collector
from prometheus_client.utils import floatToGoString

from logstore._proto import logstore_pb2 as pb

if TYPE_CHECKING:
    from logstore.broker.config import BrokerConfig
    from logstore.broker.groups.coordinator import GroupCoordinator
    from logstore.broker.membership import ClusterMembership
    from logstore.broker.transactions.coordinator import TransactionCoordinator
    from logstore.storage.log_manager import LogManager
    from logstore.storage.validation import ValidatedRecords

__all__ = ["BrokerMetrics", "KAFKA_REQUEST_NAMES", "timed_handlers"]

log = logging.getLogger("logstore.broker")

# The rpc label -> Kafka's request name in RequestMetrics, where they differ.
KAFKA_REQUEST_NAMES = {"Fetch": "FetchConsumer", "OffsetsForLeaderEpoch": "OffsetForLeaderEpoch"}

class Broker(Protocol):
    """What the collector reads of :class:`logstore.broker.service.Broker` (no import cycle)."""

    config: BrokerConfig
    manager: LogManager
    groups: GroupCoordinator
    coordinator: TransactionCoordinator
    cluster: ClusterMembership


_LATENCY_BUCKETS = (0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0)
_TP = ("topic", "partition")
_THROTTLE_BUCKETS = (0.001, 0.01, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0)


class BrokerMetrics:
    """The counters the request handlers bump, the scrape-time collector, the HTTP server."""

    def __init__(self, broker: Broker) -> None:
        self.registry = CollectorRegistry(auto_describe=True)
        r = self.registry
        self.bytes_in = Counter("logstore_produce_bytes_in", "Bytes of records appended by produce requests",
                                _TP, registry=r)
        self.records_in = Counter("logstore_produce_records_in", "Records appended by produce requests",
                                  _TP, registry=r)
        self.bytes_out = Counter("logstore_fetch_bytes_out", "Bytes of records sent to consumer fetches",
                                 _TP, registry=r)
        self.records_out = Counter("logstore_fetch_records_out",
                                   "Offsets consumer fetches moved past (records, plus compaction gaps "
                                   "and transaction markers)", _TP, registry=r)
        self.latency = Histogram("logstore_request_latency_seconds", "Time to answer a request",
                                 ("rpc",), buckets=_LATENCY_BUCKETS, registry=r)
        self.errors = Counter("logstore_request_errors", "Failed requests and partitions, by RPC and error code",
                              ("rpc", "code"), registry=r)
        self.throttle = Histogram("logstore_throttle_time_seconds",
                                  "Throttle time given to requests over a quota, by principal and quota",
                                  ("principal", "quota"), buckets=_THROTTLE_BUCKETS, registry=r)
        self._fetch_latency = (self.latency.labels("Fetch").observe, self.latency.labels("FetchFollower").observe)
        # Children cached per partition: labels() takes a lock and hashes the label values.
        self._in: dict[tuple[str, int], tuple[Any, Any]] = {}
        self._out: dict[tuple[str, int], tuple[Any, Any]] = {}
        r.register(_ScrapeCollector(broker))
        r.register(_KafkaNamesCollector(self))
        self._server: WSGIServer | None = None
        self._thread: threading.Thread | None = None
        self.port = 0

    # ------------------------------------------------------------------ hot path

    def produced(self, topic: str, partition: int, nbytes: int, valid: ValidatedRecords) -> None:
        """One partition of a produce request appended ``valid`` (``nbytes`` bytes on the wire)."""
        children = self._in.get((topic, partition))
        if children is None:
            children = self._in[(topic, partition)] = (self.bytes_in.labels(topic, str(partition)),
                                                       self.records_in.labels(topic, str(partition)))
        children[0].inc(nbytes)
        children[1].inc(sum(stored.header.record_count for stored, _ in valid.batches))  # per batch

    def fetched(self, request: pb.FetchRequest, responses: list[tuple[pb.FetchPartitionResponse, memoryview]]
                ) -> None:
        """A consumer fetch's answer: bytes and offsets per partition, errors by code."""
        fetch_offsets = {(p.topic, p.partition): p.fetch_offset for p in request.partitions}
        for resp, records in responses:
            if resp.error.code:
                self.error("Fetch", resp.error.code)
            if not records:
                continue
            key = (resp.topic, resp.partition)
            children = self._out.get(key)
            if children is None:
                children = self._out[key] = (self.bytes_out.labels(resp.topic, str(resp.partition)),
                                             self.records_out.labels(resp.topic, str(resp.partition)))
            children[0].inc(len(records))
            children[1].inc(max(resp.next_offset - fetch_offsets.get(key, resp.next_offset), 0))

    def fetch_latency(self, seconds: float, *, follower: bool) -> None:
        """A fetch answered after ``seconds`` (Fetch times itself: only it knows a follower's)."""
        self._fetch_latency[follower](seconds)

    def latency_observer(self, rpc: str) -> Callable[[float], None]:
        """``observe(seconds)`` of the ``rpc``'s request latency (a cached child: no lock, no hashing)."""
        return self.latency.labels(rpc).observe

    def throttled(self, principal: str, quota: str, throttle_ms: int) -> None:
        """A request of ``principal`` over its ``quota`` was given ``throttle_ms``."""
        self.throttle.labels(principal, quota).observe(throttle_ms / 1000)

    def error(self, rpc: str, code: str | int) -> None:
        self.errors.labels(rpc, str(code)).inc()

    # ------------------------------------------------------------------ HTTP

    def serve(self, host: str, port: int) -> int:
        """Serve ``/metrics`` on ``host:port`` (0 picks a free port); return the bound port."""
        try:
            server, thread = start_http_server(port, addr=host, registry=self.registry)
        except OSError as e:  # the broker does not start: say which port, not only "address in use"
            error = OSError(f"cannot serve metrics on {host}:{port} (metrics_port): {e.strerror}")
            error.errno = e.errno  # one line when printed: no "[Errno N]" in front
            raise error from None
        self._server, self._thread = server, thread
        self.port = server.server_address[1]
        log.info("metrics on http://%s:%d/metrics", host, self.port,
                 extra={"event": "metrics_serving", "port": self.port})
        return self.port

    def close(self) -> None:
        if self._server is not None:
            self._server.shutdown()
            self._server.server_close()
            self._server = None
        if self._thread is not None:
            self._thread.join(5)
            self._thread = None


class _ScrapeCollector(Collector):
    """Gauges read from the broker's state when Prometheus scrapes (nothing on the hot path)."""

    def __init__(self, broker: Broker) -> None:
        self._broker = broker

    def describe(self) -> list[Any]:
        return []  # computed at scrape time; no fixed set of series to pre-register

    def collect(self) -> Iterator[GaugeMetricFamily]:
        b = self._broker
        size = GaugeMetricFamily("logstore_log_size_bytes", "Bytes of the partition's segment files", labels=_TP)
        start = GaugeMetricFamily("logstore_log_start_offset", "The partition's first offset", labels=_TP)
        end = GaugeMetricFamily("logstore_log_end_offset", "The partition's log end offset (LEO, exclusive)",
                                labels=_TP)
        hwm = GaugeMetricFamily("logstore_high_watermark", "The partition's high-water mark", labels=_TP)
        offline_local = 0
        hwms: dict[tuple[str, int], int] = {}
        for part in b.manager.all_partitions():
            labels = [part.topic, str(part.partition)]
            if part.log.offline_reason is not None:
                offline_local += 1
                continue
            try:
                size.add_metric(labels, part.log.size_bytes)
                start.add_metric(labels, part.log.log_start_offset)
                end.add_metric(labels, part.log.log_end_offset)
            except Exception:  # noqa: BLE001 - closed or deleted since listed: skip it this scrape
                continue
            hwm.add_metric(labels, part.high_watermark)
            hwms[(part.topic, part.partition)] = part.high_watermark
        yield from (size, start, end, hwm)

        lag = GaugeMetricFamily("logstore_group_lag", "High-water mark minus the group's committed offset",
                                labels=("group", "topic", "partition"))
        for summary in b.groups.list_groups():
            for tp, committed in b.groups.fetch_offsets(summary.group_id).items():
                end_offset = hwms.get((tp.topic, tp.partition))
                if end_offset is not None:
                    lag.add_metric([summary.group_id, tp.topic, str(tp.partition)],
                                   max(end_offset - committed.offset, 0))
        yield lag

        under, offline, controller = 0, offline_local, int(b.cluster.is_controller())
        view = b.cluster.view
        if view is not None:
            from replication.state import NO_LEADER

            for state in view.partitions.values():
                if state.leader == NO_LEADER:
                    offline += controller  # the controller reports these, as Kafka's does
                elif len(state.isr) < len(state.replicas) and state.leader == b.config.node_id:
                    under += 1  # counted by the leader only, as Kafka: the cluster's sum is the count
        yield GaugeMetricFamily("logstore_under_replicated_partitions",
                                "Partitions this broker leads whose ISR is smaller than their replicas",
                                value=under)
        yield GaugeMetricFamily("logstore_offline_partitions",
                                "Partitions without a leader (cluster) or offline after damage (here)",
                                value=offline)
        yield GaugeMetricFamily("logstore_is_controller", "1 on the active controller", value=controller)
        yield GaugeMetricFamily("kafka_server_replicamanager_underreplicatedpartitions",
                                "Kafka's name of logstore_under_replicated_partitions", value=under)
        yield GaugeMetricFamily("kafka_controller_kafkacontroller_activecontrollercount",
                                "Kafka's name of logstore_is_controller", value=controller)
        yield GaugeMetricFamily("logstore_open_transactions", "Transactions begun and not yet complete",
                                value=b.coordinator.open_transaction_count())


def timed_handlers(handlers: Mapping[str, grpc.RpcMethodHandler], metrics: BrokerMetrics, *,
                   skip: frozenset[str] = frozenset({"Fetch"})) -> dict[str, grpc.RpcMethodHandler]:
    """``handlers`` (method name → gRPC handler) each observing its request's time in
    ``logstore_request_latency_seconds{rpc=name}``, failed calls too. ``skip``: methods that
    time themselves (Fetch: consumer or follower is known once its request is parsed). A
    client-streaming call's time runs from its start to its answer."""
    out: dict[str, grpc.RpcMethodHandler] = {}
    for name, handler in handlers.items():
        if name in skip:
            out[name] = handler
        elif handler.unary_unary is not None:
            out[name] = handler._replace(unary_unary=_timed(handler.unary_unary, metrics.latency_observer(name)))
        elif handler.stream_unary is not None:
            out[name] = handler._replace(stream_unary=_timed(handler.stream_unary, metrics.latency_observer(name)))
        else:  # ProduceStream: its handler times each request as Produce (DataRpcs.produce_stream)
            out[name] = handler
    return out


def _timed(inner: Callable[[Any, Any], Any], observe: Callable[[float], None]) -> Callable[[Any, Any], Any]:
    clock = time.perf_counter

    async def handle(request: Any, context: grpc.aio.ServicerContext) -> Any:
        started = clock()
        try:
            return await inner(request, context)
        finally:
            observe(clock() - started)
    return handle


class _KafkaNamesCollector(Collector):
    """The series Kafka's JMX exporter names, read from ``metrics``' own at scrape time
    (see the module docstring)."""

    _TOPIC_COUNTERS = (("kafka_server_brokertopicmetrics_messagesin", "records_in",
                        "Records appended by produce requests (Kafka's MessagesInPerSec)"),
                       ("kafka_server_brokertopicmetrics_bytesin", "bytes_in",
                        "Bytes appended by produce requests (Kafka's BytesInPerSec)"),
                       ("kafka_server_brokertopicmetrics_bytesout", "bytes_out",
                        "Bytes sent to consumer fetches (Kafka's BytesOutPerSec)"))

    def __init__(self, metrics: BrokerMetrics) -> None:
        self._metrics = metrics

    def describe(self) -> list[Any]:
        return []

    def collect(self) -> Iterator[Metric]:
        for name, attribute, documentation in self._TOPIC_COUNTERS:
            by_topic: dict[str, float] = {}
            for family in getattr(self._metrics, attribute).collect():
                for sample in family.samples:
                    if sample.name.endswith("_total"):
                        topic = sample.labels["topic"]
                        by_topic[topic] = by_topic.get(topic, 0.0) + sample.value
            counter = CounterMetricFamily(name, documentation, labels=("topic",))
            for topic, value in sorted(by_topic.items()):
                counter.add_metric([topic], value)
            counter.add_metric([], sum(by_topic.values()))  # all topics: no topic label, as Kafka's
            yield counter
        latency = Metric("kafka_network_requestmetrics_totaltimems",
                         "Request time in ms by Kafka's request name (Kafka's RequestMetrics TotalTimeMs)",
                         "histogram")
        for family in self._metrics.latency.collect():
            for sample in family.samples:
                suffix = sample.name[len(family.name):]
                if suffix not in ("_bucket", "_count", "_sum"):
                    continue  # _created: not Kafka's
                labels = {"request": KAFKA_REQUEST_NAMES.get(sample.labels["rpc"], sample.labels["rpc"])}
                value = sample.value
                if suffix == "_bucket":
                    labels["le"] = floatToGoString(float(sample.labels["le"]) * 1000)
                elif suffix == "_sum":
                    value *= 1000
                latency.add_sample(latency.name + suffix, labels, value)
        yield latency
