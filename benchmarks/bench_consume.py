"""Consume throughput: one Consumer against a broker in a child process, next to raw fetches (DESIGN §7).

Setup (not timed): ``--records`` (default 2,000,000) records of 100-byte random
values, no key, no headers, are written with ``Producer.send_batch`` to a new
one-partition topic; the broker is ``EmbeddedBroker(subprocess=True)``.

Measured in one run, best of ``--repeats``, each reading every record from offset 0:

(a) raw fetch    ``BrokerClient.fetch`` in a loop, answers not decoded (the records'
                 bytes as the broker serves them; the floor for (b) and (c));
(b) poll_arrow   ``Consumer.poll_arrow`` until every record is read (Arrow tables,
                 no per-record Python objects);
(c) poll()       ``Consumer.poll`` until every record is read, touching each
                 returned record's ``value`` (so a lazily built record is really built).

The consumer is read_committed with ``check_crcs`` on (the defaults). Ratios are
printed against (a). The issue's reference figure for confluent-kafka's per-record
``poll()`` on this machine is ~840,000 records/s (target: (c) >= 1.0x Kafka in the
same run; the Kafka side is added by the Kafka-baseline benchmarks).

Run: ``.venv/bin/python benchmarks/bench_consume.py [--records N] [--format json]``.
"""

from __future__ import annotations

import argparse
import json
import os
import sys

import numpy as np
import pyarrow as pa
from benchutil import Timer, child_pid, machine_line, process_cpu_s

from logstore.broker.embedded import EmbeddedBroker
from logstore.client.admin import Admin
from logstore.client.consumer import Consumer
from logstore.client.producer import Producer
from logstore.client.results import FetchRequestPartition
from logstore.client.rpc import BrokerClient
from logstore.types import TopicPartition

VALUE_BYTES = 100
TABLE_ROWS = 200_000
KAFKA_POLL_REFERENCE = 840_000  # confluent-kafka poll(), records/s, quoted by issue 16 (not this run)


def fill(bootstrap: str, topic: str, records: int) -> None:
    rng = np.random.default_rng(7)
    with Producer(bootstrap, acks=1, enable_idempotence=False) as producer:
        left = records
        while left:
            n = min(TABLE_ROWS, left)
            data = pa.py_buffer(rng.bytes(VALUE_BYTES * n))
            offsets = pa.py_buffer(np.arange(0, (n + 1) * VALUE_BYTES, VALUE_BYTES, dtype=np.int32).tobytes())
            values = pa.Array.from_buffers(pa.binary(), n, [None, offsets, data])
            producer.send_batch(topic, pa.table({"value": values}), partition=0)
            left -= n
        producer.flush()


def raw_fetch(bootstrap: str, tp: TopicPartition, records: int) -> tuple[float, float, int]:
    with BrokerClient(bootstrap) as client, Timer() as t:
        offset, total = 0, 0
        while offset < records:
            [answer] = client.fetch([FetchRequestPartition(tp, offset, 8 << 20)], max_wait_ms=0)
            total += len(answer.records)
            offset = answer.next_offset
    return t.wall, t.cpu, total


def poll_arrow(bootstrap: str, tp: TopicPartition, records: int) -> tuple[float, float]:
    with Consumer(bootstrap) as consumer:
        consumer.assign([tp])
        consumer.seek(tp, 0)
        with Timer() as t:
            got = 0
            while got < records:
                for table in consumer.poll_arrow(timeout_ms=1000).values():
                    got += table.num_rows
    return t.wall, t.cpu


def poll_records(bootstrap: str, tp: TopicPartition, records: int) -> tuple[float, float]:
    with Consumer(bootstrap) as consumer:
        consumer.assign([tp])
        consumer.seek(tp, 0)
        with Timer() as t:
            got = 0
            size = 0
            while got < records:
                batch = consumer.poll(timeout_ms=1000)
                for record in batch:
                    size += len(record.value)  # type: ignore[arg-type]
                got += len(batch)
        assert size == records * VALUE_BYTES, size
    return t.wall, t.cpu


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n", 1)[0])
    parser.add_argument("--records", type=int, default=2_000_000)
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--format", choices=("table", "json"), default="table")
    args = parser.parse_args(argv)
    n = args.records
    if args.format == "table":
        print(f"logstore consume: {n:,} records of {VALUE_BYTES} bytes, one partition, broker in a child process")
        print(machine_line(), flush=True)
    best: dict[str, tuple[float, float, float]] = {}
    with EmbeddedBroker(subprocess=True) as broker, Admin(broker.bootstrap) as admin:
        server = child_pid("logstore.broker")
        admin.create_topic("bench-consume", 1)
        tp = TopicPartition("bench-consume", 0)
        fill(broker.bootstrap, "bench-consume", n)
        for _ in range(args.repeats):
            for name, run in (("raw fetch", lambda: raw_fetch(broker.bootstrap, tp, n)[:2]),
                              ("poll_arrow", lambda: poll_arrow(broker.bootstrap, tp, n)),
                              ("poll()", lambda: poll_records(broker.bootstrap, tp, n))):
                server_cpu = process_cpu_s(server)
                wall, cpu = run()
                server_cpu = process_cpu_s(server) - server_cpu
                if name not in best or wall < best[name][0]:
                    best[name] = (wall, cpu, server_cpu)
    rates = {name: n / wall for name, (wall, _, _) in best.items()}
    if args.format == "json":
        print(json.dumps({"records": n, "records_per_s": rates, "loadavg": os.getloadavg(),
                          "kafka_poll_reference": KAFKA_POLL_REFERENCE}))
        return 0
    print()
    print(f"{'consume':<16}{'records/s':>14}{'MB/s values':>13}{'vs raw':>9}{'wall s':>9}"
          f"{'client cpu s':>14}{'server cpu s':>14}")
    for name, (wall, cpu, server_cpu) in best.items():
        print(f"{name:<16}{rates[name]:>14,.0f}{rates[name] * VALUE_BYTES / 1e6:>13.1f}"
              f"{rates[name] / rates['raw fetch']:>8.2f}x{wall:>9.2f}{cpu:>14.2f}{server_cpu:>14.2f}")
    print()
    print(f"poll() per record: {rates['poll()']:,.0f} records/s = "
          f"{rates['poll()'] / KAFKA_POLL_REFERENCE:.2f}x the issue's confluent-kafka figure "
          f"({KAFKA_POLL_REFERENCE:,}/s, not measured in this run); load average {os.getloadavg()[0]:.2f}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
