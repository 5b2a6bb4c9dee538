"""A cluster broker serves no partition and no map of the cluster before it has joined.

A broker restarts with the partitions it hosted on disk, binds its listener, then joins:
connects to etcd, registers, applies the first view. Until then its local copies may be
stale (another broker may lead them now): a produce must not be appended there (its
partitions refuse writes until the replica manager makes them leaders), and Metadata must
not describe the cluster from its own files. Before the fix, Metadata answered as a single
broker would: itself as the only broker and the leader of every partition it hosts, so a
client bootstrapping through it was sent back to it; now the answer is BROKER_NOT_AVAILABLE
and the client asks another broker.
"""

from __future__ import annotations

import asyncio
import threading
import time
from pathlib import Path

import pytest

from logstore.broker.config import load_broker_config
from logstore.broker.embedded import EmbeddedBroker
from logstore.broker.service import Broker
from logstore.client.admin import Admin
from logstore.client.producer import Producer
from logstore.client.rpc import BrokerClient
from logstore.dev.etcd_process import EtcdServer
from logstore.errors import BrokerUnavailableError, NotLeaderError
from logstore.record import build_batch, encode_batch, encode_schema, untyped_schema
from logstore.types import NewTopic, TopicPartition

pytestmark = pytest.mark.timeout(180)


def _records(value: bytes) -> bytes:
    schema = untyped_schema()
    batch = build_batch(schema, values=[value], timestamps_ms=[1_000])
    return encode_schema(schema) + encode_batch(batch, base_offset=0).to_bytes()


def test_a_broker_waiting_to_join_takes_no_write_and_answers_no_metadata(tmp_path: Path) -> None:
    with EtcdServer(start_timeout_s=30.0) as etcd:
        overrides = {"metadata": etcd.url, "cluster_id": "join", "node_id": 1, "broker_session_timeout_ms": 2000,
                     "data_dir": str(tmp_path / "b1")}
        first = EmbeddedBroker(overrides=overrides).start()
        try:
            with Admin(first.bootstrap) as admin:
                admin.create_topics([NewTopic("t", 1, replication_factor=1)])
            with Producer(first.bootstrap, acks="all") as producer:
                producer.send("t", b"before", partition=0)
                assert producer.flush(30) == 0
        finally:
            first.close()

        etcd.pause()  # the restarted broker binds its listener, then waits for etcd to join
        broker = Broker(load_broker_config(None, overrides={**overrides, "port": 0}, env={}))
        loop = asyncio.new_event_loop()
        threading.Thread(target=loop.run_forever, daemon=True).start()
        started = asyncio.run_coroutine_threadsafe(broker.start(), loop)
        try:
            deadline = time.monotonic() + 30
            while broker._server is None:  # bound and serving, not joined
                assert time.monotonic() < deadline, "the broker did not bind its listener"
                time.sleep(0.05)
            assert not started.done()
            with BrokerClient(f"127.0.0.1:{broker.port}", request_timeout_ms=5000) as client:
                (answer,) = client.produce_async([(TopicPartition("t", 0), _records(b"while joining"))],
                                                 acks=-1).result(10)
                assert isinstance(answer.error, NotLeaderError), answer
                with pytest.raises(BrokerUnavailableError, match="not joined"):
                    client.metadata(["t"])
            etcd.resume()
            started.result(60)
            with Producer(f"127.0.0.1:{broker.port}", acks="all") as producer:
                producer.send("t", b"after", partition=0)
                assert producer.flush(30) == 0
            with BrokerClient(f"127.0.0.1:{broker.port}") as client:
                (end,) = client.list_offsets({TopicPartition("t", 0): -1}).values()
            assert not isinstance(end, Exception) and end.offset == 2  # "before" and "after", nothing else
        finally:
            if etcd.running:
                etcd.resume()
            asyncio.run_coroutine_threadsafe(broker.stop(grace_s=0), loop).result(60)
            loop.call_soon_threadsafe(loop.stop)
