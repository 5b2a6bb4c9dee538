"""Decoding Kafka producers' JSON values into a typed topic's columns (value.format=json, issue 25).

What the broker adds to a Kafka produce to a typed topic, without the network:
``--records`` (default 200,000) JSON objects of about 100 bytes (an int64, a string, a
float64, a UTC timestamp, a boolean), decoded in batches of ``--batch`` (default 10,000,
about what a linger of a few ms gathers), best of ``--repeats`` (default 3):

(a) raw reader       ``pyarrow.json.read_json`` over the newline-joined values with the
                     topic's schema (timestamps read as strings): the floor
(b) vectorized       :func:`~logstore.broker.kafka.json_produce.decode_json_values`
(c) one by one       its per-value path (``json.loads`` and the reference rules), taken
                     when the vectorized read fails or the schema has a type it lacks

The ratios (b)/(a) (what the checks and conversions cost over the reader) and (b)/(c)
(what vectorizing buys) are printed with the records/s of each. No target.

Run: ``.venv/bin/python benchmarks/bench_kafka_json_produce.py [--records N]``.
"""

from __future__ import annotations

import argparse
import io
import json

import pyarrow as pa
import pyarrow.json as pa_json
from benchutil import Timer, machine_line

from logstore.broker.kafka import json_produce

VALUE_TYPE = pa.struct([pa.field("id", pa.int64(), nullable=False), pa.field("name", pa.string()),
                        pa.field("score", pa.float64()), pa.field("at", pa.timestamp("ms", tz="UTC")),
                        pa.field("ok", pa.bool_())])


def _values(n: int) -> list[bytes]:
    return [json.dumps({"id": i, "name": f"customer-{i:09d}", "score": i / 8,
                        "at": f"2026-11-29T01:02:{i % 60:02d}.{i % 1000:03d}000+00:00", "ok": i % 2 == 0},
                       separators=(",", ":")).encode() for i in range(n)]


def _raw(batch: list[bytes]) -> None:
    schema = pa.schema([pa.field(f.name, pa.string() if pa.types.is_timestamp(f.type) else f.type)
                        for f in VALUE_TYPE])
    options = pa_json.ParseOptions(explicit_schema=schema, unexpected_field_behavior="error")
    pa_json.read_json(io.BytesIO(b"\n".join(batch)), parse_options=options)


def _vectorized(batch: list[bytes]) -> None:
    json_produce.decode_json_values(batch, VALUE_TYPE, where="bench-0")


def _one_by_one(batch: list[bytes]) -> None:
    rows, errors = json_produce._one_by_one(batch, VALUE_TYPE)
    assert rows is not None and not errors


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--records", type=int, default=200_000)
    parser.add_argument("--batch", type=int, default=10_000)
    parser.add_argument("--repeats", type=int, default=3)
    args = parser.parse_args()
    values = _values(args.records)
    batches = [values[i:i + args.batch] for i in range(0, len(values), args.batch)]
    print(machine_line())
    print(f"{args.records} values of {sum(map(len, values)) / len(values):.0f} bytes, batches of {args.batch}")
    rates = {}
    for name, decode in (("raw reader", _raw), ("vectorized", _vectorized), ("one by one", _one_by_one)):
        best = float("inf")
        for _ in range(args.repeats):
            with Timer() as t:
                for batch in batches:
                    decode(batch)
            best = min(best, t.wall)
        rates[name] = args.records / best
        print(f"  {name:<12} {rates[name]:>12,.0f} records/s")
    print(f"vectorized / raw reader: {rates['vectorized'] / rates['raw reader']:.2f}x; "
          f"vectorized / one by one: {rates['vectorized'] / rates['one by one']:.1f}x")


if __name__ == "__main__":
    main()
