"""Raw gRPC helpers for tests that speak the broker's protocol directly: a stub, records, produce, fetch, create."""

from __future__ import annotations

import grpc
import pyarrow as pa

from logstore._proto import logstore_pb2 as pb
from logstore._proto import logstore_pb2_grpc as pb_grpc
from logstore.broker.embedded import EmbeddedBroker
from logstore.record import (
    build_batch,
    decode_schema,
    encode_batch,
    encode_schema,
    untyped_schema,
)
from logstore.record_reader import iter_batches

SCHEMA = untyped_schema()


def stub_for(broker: EmbeddedBroker) -> pb_grpc.LogstoreStub:
    channel = grpc.insecure_channel(
        broker.bootstrap, options=[("grpc.max_send_message_length", 256 << 20),
                                   ("grpc.max_receive_message_length", 256 << 20),
                                   ("grpc.use_local_subchannel_pool", 1)]
    )
    return pb_grpc.LogstoreStub(channel)


def records(values: list[bytes], *, schema: pa.Schema = SCHEMA, ts: int = 1_000,
            compression: str | None = None) -> bytes:
    batch = build_batch(schema, values=values, timestamps_ms=[ts + i for i in range(len(values))],
                        keys=[b"k%d" % i for i in range(len(values))])
    return encode_schema(schema) + encode_batch(batch, base_offset=0, compression=compression).to_bytes()


def produce(stub: pb_grpc.LogstoreStub, topic: str, partition: int, data: bytes, *, acks: int = -1) -> pb.ProducePartitionResponse:
    resp = stub.Produce(pb.ProduceRequest(acks=acks, partitions=[
        pb.ProducePartition(topic=topic, partition=partition, records=data)]), timeout=30)
    return resp.partitions[0]


def fetch_values(stub: pb_grpc.LogstoreStub, topic: str, partition: int, offset: int = 0) -> list[tuple[int, bytes]]:
    """Every (offset, value) from ``offset`` to the HWM, checking CRCs on the way."""
    out: list[tuple[int, bytes]] = []
    while True:
        resp = stub.Fetch(pb.FetchRequest(max_wait_ms=0, partitions=[
            pb.FetchPartition(topic=topic, partition=partition, fetch_offset=offset)]), timeout=30)
        p = resp.partitions[0]
        assert not p.error.code, p.error
        if not p.records:
            return out
        schema, _ = decode_schema(p.schema)
        for stored in iter_batches(memoryview(p.records)):
            stored.verify_crc()
            batch = stored.decode(schema)
            for o, v in zip(batch.column("offset").to_pylist(), batch.column("value").to_pylist(), strict=True):
                if o >= offset:
                    out.append((o, v))
        offset = p.next_offset


def create(stub: pb_grpc.LogstoreStub, name: str, partitions: int = 1, **configs: str) -> pb.Error:
    resp = stub.CreateTopics(pb.CreateTopicsRequest(topics=[
        pb.NewTopic(name=name, partitions=partitions, configs=configs)]), timeout=30)
    return resp.results[0].error
