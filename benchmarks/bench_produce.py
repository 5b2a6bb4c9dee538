"""Produce throughput: one Producer against a broker in a child process, next to raw gRPC (DESIGN §7).

Measured in one run, best of ``--repeats`` (the runs of (a), (b) and (c)
alternate, then those of (d) and (e)):

(a) raw gRPC     a bytes-in/8-bytes-out unary call (``benchmarks/grpc_echo.py``:
                 generic handler, identity serializers, ``grpc.aio`` server in a
                 child process, client channel with BrokerClient's options)
                 sending the same number of bytes as a (b) run puts on the wire, in
                 requests of the size (b) sends (its mean produce request) with as
                 many calls in flight as (b) had at most;
(b) send_batch   ``Producer.send_batch`` of pyarrow Tables (``--records``, default
                 4,000,000, in tables of 200,000 rows: a ``value`` column of
                 100-byte random values, no key, so the producer spreads
                 ``batch_size`` chunks round-robin over the partitions), then
                 ``flush()``; acks=1, enable_idempotence=False;
(c) send_batch   the same with enable_idempotence=True (the default);
(d) send()       ``Producer.send`` of ``--send-records`` (default 300,000) 100-byte
                 values one by one, then ``flush()``; acks=1, idempotence off;
(e) send()       the same with idempotence on.

Every run writes to a new topic of ``--partitions`` partitions (default 4),
deleted afterwards; the broker (``EmbeddedBroker(subprocess=True)``: its own
interpreter, so broker and client do not share a GIL) keeps its data in a
temporary directory; acks=1 means no fsync. The data is built before the
clock starts; a one-record send before it fetches metadata and, with
idempotence, the producer id. Every record's outcome is checked.

MB/s: "values" counts the 100-byte values only; "wire" counts the bytes of the
produce requests (schema message, batch metadata, offsets, timestamps, value
offsets and the values), measured by wrapping the client's request encoder —
the same bytes (a) sends. The ratio (b)/(a) compares wire MB/s, i.e. the same
bytes moved by the producer + broker and by bare gRPC.
CPU seconds of this process (client) and of the server child are printed next
to the wall time: on a shared machine other processes stretch wall time.

Targets (issue "Broker/clients"): (b) >= 2,000,000 records/s and (b)/(a) >= 0.7;
(d) >= 300,000 records/s.

With ``--kafka`` (``make bench-kafka``) the same shapes then run against a real
Apache Kafka as well, our producer next to confluent-kafka's: ``produce_vs_kafka.py``.

Run: ``make bench`` or ``.venv/bin/python benchmarks/bench_produce.py [--records N] [--kafka]``;
``--only-send [--keyed] [--partitions 1]`` runs (d) and (e) alone (``--keyed``: one of
1,000 keys per record).
"""

from __future__ import annotations

import argparse
import concurrent.futures
import gc
import sys
import threading
import time
from dataclasses import dataclass, field

import numpy as np
import pyarrow as pa
from benchutil import Timer, child_pid, machine_line, process_cpu_s, verdict
from grpc_echo import EchoClient, EchoServer
from kafka_server import add_kafka_flag

import logstore.client.rpc as client_module
from logstore.broker.embedded import EmbeddedBroker
from logstore.client.admin import Admin
from logstore.client.producer import Producer
from logstore.client.rpc import BrokerClient
from logstore.types import RecordMetadata, TopicPartition

VALUE_BYTES = 100
TABLE_ROWS = 200_000


class RequestMeter:
    """Counts produce requests, their bytes and how many are in flight.

    Wraps :func:`logstore.client.rpc.encode_produce_request` (bytes) and
    :meth:`BrokerClient.produce_async` (in flight): a counter per request of
    ~3-4 MB, nothing per record.
    """

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self.reset()
        encode = client_module.encode_produce_request
        produce_async = BrokerClient.produce_async
        meter = self

        def counting_encode(*args, **kwargs):  # type: ignore[no-untyped-def]
            data = encode(*args, **kwargs)
            with meter._lock:
                meter.requests += 1
                meter.bytes += len(data)
            return data

        def tracking_produce_async(self, *args, **kwargs):  # type: ignore[no-untyped-def]
            future = produce_async(self, *args, **kwargs)
            meter._moved(+1)
            future.add_done_callback(lambda _: meter._moved(-1))
            return future

        client_module.encode_produce_request = counting_encode
        BrokerClient.produce_async = tracking_produce_async  # type: ignore[method-assign]

    def reset(self) -> None:
        with self._lock:
            self.requests = 0
            self.bytes = 0
            self.in_flight = 0
            self.max_in_flight = 0
            self._area = 0.0
            self._since = self._start = time.perf_counter()

    def _moved(self, delta: int) -> None:
        with self._lock:
            now = time.perf_counter()
            self._area += self.in_flight * (now - self._since)
            self._since = now
            self.in_flight += delta
            self.max_in_flight = max(self.max_in_flight, self.in_flight)

    def mean_in_flight(self) -> float:
        with self._lock:
            elapsed = self._since - self._start
            return self._area / elapsed if elapsed > 0 else 0.0


@dataclass
class Run:
    wall: float
    cpu: float
    server_cpu: float
    records: int = 0
    wire_bytes: int = 0
    requests: int = 0
    max_in_flight: int = 0
    mean_in_flight: float = 0.0
    gc_count: list[int] = field(default_factory=lambda: [0, 0, 0])
    gc_seconds: list[float] = field(default_factory=lambda: [0.0, 0.0, 0.0])


@dataclass
class Best:
    runs: list[Run] = field(default_factory=list)

    def add(self, run: Run) -> None:
        self.runs.append(run)

    @property
    def best(self) -> Run:
        return min(self.runs, key=lambda r: r.wall)


def make_tables(records: int, seed: int = 1) -> list[pa.Table]:
    """Tables of one ``value`` column: 100-byte random values, built straight from buffers."""
    rng = np.random.default_rng(seed)
    out = []
    for start in range(0, records, TABLE_ROWS):
        n = min(TABLE_ROWS, records - start)
        offsets = np.arange(0, (n + 1) * VALUE_BYTES, VALUE_BYTES, dtype=np.int32)
        values = pa.Array.from_buffers(pa.binary(), n, [None, pa.py_buffer(offsets),
                                                        pa.py_buffer(rng.bytes(n * VALUE_BYTES))])
        out.append(pa.table({"value": values}))
    return out


def make_values(records: int, seed: int = 2) -> list[bytes]:
    data = np.random.default_rng(seed).bytes(records * VALUE_BYTES)
    return [data[i:i + VALUE_BYTES] for i in range(0, len(data), VALUE_BYTES)]


class Topics:
    """A new topic per run, deleted afterwards (its files go, and with them their dirty pages)."""

    def __init__(self, bootstrap: str, partitions: int) -> None:
        self.admin = Admin(bootstrap)
        self.partitions = partitions
        self.count = 0

    def new(self) -> str:
        self.count += 1
        name = f"bench-produce-{self.count}"
        self.admin.create_topic(name, self.partitions)
        return name

    def drop(self, name: str) -> None:
        self.admin.delete_topics([name])


def run_send_batch(bootstrap: str, topics: Topics, tables: list[pa.Table], *, idempotence: bool,
                   meter: RequestMeter, broker_pid: int | None) -> Run:
    topic = topics.new()
    records = sum(t.num_rows for t in tables)
    try:
        with Producer(bootstrap, acks=1, enable_idempotence=idempotence) as producer:
            producer.send_batch(topic, tables[0].slice(0, 1)).result()  # metadata, producer id
            meter.reset()
            server0 = process_cpu_s(broker_pid)
            with Timer() as t:
                futures = [producer.send_batch(topic, table) for table in tables]
                producer.flush()
            server = process_cpu_s(broker_pid) - server0
            sent = sum(b.record_count for f in futures for b in f.result().batches)
            assert sent == records, (sent, records)
    finally:
        topics.drop(topic)
    return Run(t.wall, t.cpu, server, records, meter.bytes, meter.requests, meter.max_in_flight,
               meter.mean_in_flight())


class GcMeter:
    """Collections of the cyclic garbage collector, and the time spent in them, per generation."""

    def __init__(self) -> None:
        self.count = [0, 0, 0]
        self.seconds = [0.0, 0.0, 0.0]
        self._started = 0.0

    def _callback(self, phase: str, info: dict) -> None:
        if phase == "start":
            self._started = time.perf_counter()
        else:
            self.count[info["generation"]] += 1
            self.seconds[info["generation"]] += time.perf_counter() - self._started

    def __enter__(self) -> GcMeter:
        gc.callbacks.append(self._callback)
        return self

    def __exit__(self, *exc: object) -> None:
        gc.callbacks.remove(self._callback)


def run_send(bootstrap: str, topics: Topics, values: list[bytes], *, idempotence: bool,
             meter: RequestMeter, broker_pid: int | None, keys: list[bytes] | None = None) -> Run:
    """send() every value, then flush(); the futures are not kept (as an application that
    only flushes), and the topic's end offsets are checked afterwards instead."""
    topic = topics.new()
    try:
        with Producer(bootstrap, acks=1, enable_idempotence=idempotence) as producer:
            producer.send(topic, values[0]).result()  # metadata, producer id
            meter.reset()
            server0 = process_cpu_s(broker_pid)
            send = producer.send
            with GcMeter() as collector, Timer() as t:
                if keys is None:
                    for v in values:
                        send(topic, v)
                else:
                    for k, v in zip(keys, values, strict=True):
                        send(topic, v, key=k)
                producer.flush()
            server = process_cpu_s(broker_pid) - server0
        ends = topics.admin.list_offsets({TopicPartition(topic, p): "latest"
                                          for p in range(topics.partitions)})
        appended = sum(o.offset or 0 for o in ends.values()) - 1  # minus the warm-up record
        assert appended == len(values), (appended, len(values))
    finally:
        topics.drop(topic)
    run = Run(t.wall, t.cpu, server, len(values), meter.bytes, meter.requests, meter.max_in_flight,
              meter.mean_in_flight())
    run.gc_count, run.gc_seconds = collector.count, collector.seconds
    return run


def python_floor(records: int) -> float:
    """Seconds for the per-record minimum of a futures API in one thread: a Future made,
    set running and given a RecordMetadata, nothing else (futures not kept)."""
    with Timer() as t:
        for i in range(records):
            f: concurrent.futures.Future[RecordMetadata] = concurrent.futures.Future()
            f.set_running_or_notify_cancel()
            f.set_result(RecordMetadata("t", 0, i, 0))
    return t.wall


def run_echo(echo: EchoClient, server_pid: int | None, *, request_bytes: int, total_bytes: int,
             concurrency: int) -> Run:
    payload = np.random.default_rng(3).bytes(request_bytes)
    count = max(1, round(total_bytes / request_bytes))
    server0 = process_cpu_s(server_pid)
    with Timer() as t:
        acked = echo.pump(payload, count, concurrency=concurrency)
    assert acked == count * request_bytes
    return Run(t.wall, t.cpu, process_cpu_s(server_pid) - server0, 0, acked, count, concurrency,
               float(concurrency))


def send_only(bootstrap: str, topics: Topics, values: list[bytes], repeats: int,
              meter: RequestMeter, broker_pid: int | None, *, keyed: bool) -> int:
    """Runs (d) and (e) alone (``--only-send``), next to the Python floor of a futures API.

    ``keyed``: every record has one of 1,000 keys (partitioned by murmur2)."""
    keys = [b"key-%d" % (i % 1000) for i in range(len(values))] if keyed else None
    for key, idempotence in (("d", False), ("e", True)):
        runs = [run_send(bootstrap, topics, values, idempotence=idempotence, meter=meter,
                         broker_pid=broker_pid, keys=keys) for _ in range(repeats)]
        r = min(runs, key=lambda run: run.wall)
        print(f"({key}) send(){', keyed' if keyed else ''}{', idempotent' if idempotence else ''}: best of {repeats} "
              f"{r.wall:.3f}s = {r.records / r.wall:,.0f} records/s; client CPU "
              f"{r.cpu / r.records * 1e6:.2f} us/record; {r.requests} requests, "
              f"{r.mean_in_flight:.2f}/{r.max_in_flight} in flight; cyclic GC "
              f"{sum(r.gc_count)} collections, {sum(r.gc_seconds):.3f}s", flush=True)
    floor = min(python_floor(len(values)) for _ in range(repeats))
    print(f"(Python floor of a Future per record: {floor / len(values) * 1e6:.2f} us per record)")
    return 0


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n", 1)[0])
    parser.add_argument("--records", type=int, default=4_000_000, help="records of the send_batch runs")
    parser.add_argument("--send-records", type=int, default=300_000, help="records of the send() runs")
    parser.add_argument("--partitions", type=int, default=4)
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--only-send", action="store_true",
                        help="run only the send() runs (d) and (e), without send_batch and raw gRPC")
    parser.add_argument("--keyed", action="store_true",
                        help="with --only-send: records carry one of 1,000 keys")
    add_kafka_flag(parser)
    args = parser.parse_args(argv)

    print(f"logstore produce benchmark: one producer, acks=1, {VALUE_BYTES}-byte values, "
          f"{'send() keys from 1,000' if args.keyed else 'no keys'}, "
          f"{args.partitions} partitions, broker in a child process")
    print(machine_line())
    print("preparing the data (not timed) ...", flush=True)
    tables = [] if args.only_send else make_tables(args.records)
    values = make_values(args.send_records)
    meter = RequestMeter()
    results: dict[str, Best] = {k: Best() for k in "abcde"}

    with EmbeddedBroker(subprocess=True) as broker, EchoServer() as echo_server, \
            EchoClient(echo_server.target) as echo:
        broker_pid = child_pid("logstore.broker")
        echo_pid = child_pid("grpc_echo.py")
        topics = Topics(broker.bootstrap, args.partitions)
        if args.only_send:
            return send_only(broker.bootstrap, topics, values, args.repeats, meter, broker_pid,
                             keyed=args.keyed)
        # Warm-up (not reported): the broker's first appends, and the request shape for (a).
        shape = run_send_batch(broker.bootstrap, topics, tables, idempotence=False, meter=meter,
                               broker_pid=broker_pid)
        request_bytes = max(1, shape.wire_bytes // max(1, shape.requests))
        concurrency = max(1, shape.max_in_flight)
        wire_per_record = shape.wire_bytes / shape.records
        echo.pump(b"x" * request_bytes, 4, concurrency=concurrency)
        print(f"request shape from a warm-up send_batch run: {shape.requests} requests of "
              f"{request_bytes / 2**20:.2f} MiB on average, at most {shape.max_in_flight} in flight "
              f"(mean {shape.mean_in_flight:.2f}); {wire_per_record:.1f} wire bytes per record", flush=True)

        for i in range(args.repeats):
            a = run_echo(echo, echo_pid, request_bytes=request_bytes,
                         total_bytes=int(wire_per_record * args.records), concurrency=concurrency)
            results["a"].add(a)
            b = run_send_batch(broker.bootstrap, topics, tables, idempotence=False, meter=meter,
                               broker_pid=broker_pid)
            results["b"].add(b)
            c = run_send_batch(broker.bootstrap, topics, tables, idempotence=True, meter=meter,
                               broker_pid=broker_pid)
            results["c"].add(c)
            print(f"  run {i + 1}/{args.repeats}: raw gRPC {a.wall:.3f}s, send_batch {b.wall:.3f}s, "
                  f"send_batch+idempotence {c.wall:.3f}s", flush=True)
        for i in range(args.repeats):
            d = run_send(broker.bootstrap, topics, values, idempotence=False, meter=meter,
                         broker_pid=broker_pid)
            results["d"].add(d)
            e = run_send(broker.bootstrap, topics, values, idempotence=True, meter=meter,
                         broker_pid=broker_pid)
            results["e"].add(e)
            print(f"  run {i + 1}/{args.repeats}: send() {d.wall:.3f}s, send()+idempotence {e.wall:.3f}s",
                  flush=True)
        floor = min(python_floor(args.send_records) for _ in range(args.repeats))

    names = {
        "a": "(a) raw gRPC, same bytes",
        "b": "(b) send_batch",
        "c": "(c) send_batch, idempotent",
        "d": "(d) send()",
        "e": "(e) send(), idempotent",
    }
    print()
    print(f"{'best of ' + str(args.repeats):<30}{'seconds':>9}{'records/s':>13}{'MB/s values':>13}"
          f"{'MB/s wire':>11}{'requests':>10}{'in flight':>10}{'client CPU':>12}{'server CPU':>12}")
    for key, name in names.items():
        r = results[key].best
        rps = f"{r.records / r.wall:,.0f}" if r.records else "-"
        values_mb = f"{r.records * VALUE_BYTES / r.wall / 1e6:.1f}" if r.records else "-"
        print(f"{name:<30}{r.wall:>9.3f}{rps:>13}{values_mb:>13}{r.wire_bytes / r.wall / 1e6:>11.1f}"
              f"{r.requests:>10}{f'{r.mean_in_flight:.2f}/{r.max_in_flight}':>10}"
              f"{r.cpu:>11.2f}s{r.server_cpu:>11.2f}s")
    a, b, c, d, e = (results[k].best for k in "abcde")
    echo_mbs = a.wire_bytes / a.wall
    ratio_b = (b.wire_bytes / b.wall) / echo_mbs
    ratio_c = (c.wire_bytes / c.wall) / echo_mbs
    print("(in flight = mean/max produce requests in flight; CPU = seconds of this process / of the "
          "server child: broker for (b)-(e), echo server for (a))")
    print()
    print(f"send_batch records/s = {b.records / b.wall:,.0f}   target >= 2,000,000: "
          f"{verdict(b.records / b.wall >= 2_000_000)}")
    print(f"ratio (b)/(a) wire MB/s = {ratio_b:.2f}   target >= 0.70: {verdict(ratio_b >= 0.7)}")
    print(f"ratio (c)/(a) wire MB/s = {ratio_c:.2f}")
    print(f"cost of idempotence, send_batch: (c)/(b) records/s = {b.wall / c.wall:.2f}")
    print(f"send() records/s = {d.records / d.wall:,.0f}   target >= 300,000: "
          f"{verdict(d.records / d.wall >= 300_000)}")
    print(f"cost of idempotence, send(): (e)/(d) records/s = {d.wall / e.wall:.2f}")
    print(f"(send() CPU per record: {d.cpu / d.records * 1e6:.1f} us in this process, "
          f"{d.server_cpu / d.records * 1e6:.1f} us in the broker; cyclic GC during (d): "
          f"{d.gc_count[2]} full collections taking {d.gc_seconds[2]:.2f}s, "
          f"{d.gc_count[0] + d.gc_count[1]} young ones {d.gc_seconds[0] + d.gc_seconds[1]:.2f}s, "
          f"of {d.wall:.2f}s)")
    print(f"(Python floor of a futures API on this machine: Future() + set_running + set_result("
          f"RecordMetadata) alone = {floor / d.records * 1e6:.2f} us per record, "
          f"{d.records / floor:,.0f} records/s in one thread)")
    if args.kafka:
        from produce_vs_kafka import compare

        compare(args)
    return 0


if __name__ == "__main__":
    sys.exit(main())
