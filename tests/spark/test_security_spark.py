"""The Spark source and sink over TLS (issue 12): security options in both spellings
(``logstore.ssl.*`` and Spark's Kafka ``kafka.ssl.*``) reach the driver's and the tasks'
connections, and a password given as an option appears in no plan, checkpoint file or log.
A Java client's PKCS12 trust and key stores (``kafka.ssl.truststore.*``, ``kafka.ssl.keystore.*``,
issue 27) work the same way.

One mTLS broker per module; the session's SparkSession (tests/conftest.py).
"""

from __future__ import annotations

import logging
from collections.abc import Iterator
from pathlib import Path

import pytest
from pyspark.sql import SparkSession
from security_helpers import Certificates, make_java_stores, tls_dir  # noqa: F401 - the session fixture

from logstore import Admin, Consumer, NewTopic, Producer, TopicPartition
from logstore.broker.embedded import EmbeddedBroker

pytestmark = pytest.mark.timeout(300)

SECRET = "s3cret-Pa55word"


@pytest.fixture(scope="module")
def mtls(tls_dir: Certificates, tmp_path_factory: pytest.TempPathFactory) -> Iterator[EmbeddedBroker]:  # noqa: F811
    broker = EmbeddedBroker(str(tmp_path_factory.mktemp("spark-mtls")), overrides={
        "tls_cert": tls_dir.server_cert, "tls_key": tls_dir.server_key, "tls_client_ca": tls_dir.ca})
    broker.start()
    yield broker
    broker.stop()


def _client_options(certs: Certificates) -> dict[str, str]:
    cert, key = certs.client("alice")
    return {"security_protocol": "SSL", "ssl_cafile": certs.ca, "ssl_certfile": cert, "ssl_keyfile": key}


def test_spark_reads_and_writes_over_mtls_without_leaking_the_password(
        spark: SparkSession, mtls: EmbeddedBroker, tls_dir: Certificates,  # noqa: F811
        tmp_path: Path, capsys: pytest.CaptureFixture[str], caplog: pytest.LogCaptureFixture) -> None:
    client = _client_options(tls_dir)
    with Admin(mtls.bootstrap, **client) as admin:
        admin.create_topics([NewTopic("spark-in", num_partitions=2), NewTopic("spark-out", num_partitions=1)])
    with Producer(mtls.bootstrap, linger_ms=0, **client) as producer:
        for i in range(20):
            producer.send("spark-in", key=str(i).encode(), value=str(i).encode())
        producer.flush(timeout=30)
    cert, key = tls_dir.client("alice")
    # Spark's Kafka spellings for the read; ours for the write. The SASL credentials ride along
    # unused (security.protocol SSL) so that a password is there to leak.
    read_options = {"kafka.bootstrap.servers": mtls.bootstrap, "subscribe": "spark-in",
                    "startingOffsets": "earliest", "kafka.security.protocol": "SSL",
                    "kafka.ssl.truststore.location": tls_dir.ca, "kafka.ssl.certificate.location": cert,
                    "kafka.ssl.key.location": key, "kafka.sasl.mechanism": "SCRAM-SHA-256",
                    "kafka.sasl.jaas.config": 'org.apache.kafka.common.security.scram.ScramLoginModule '
                                              f'required username="alice" password="{SECRET}";'}
    write_options = {"logstore.bootstrap.servers": mtls.bootstrap, "topic": "spark-out",
                     "logstore.security.protocol": "SSL", "logstore.ssl.ca.location": tls_dir.ca,
                     "logstore.ssl.certificate.location": cert, "logstore.ssl.key.location": key,
                     "logstore.sasl.username": "alice", "logstore.sasl.password": SECRET}
    caplog.set_level(logging.DEBUG, logger="logstore")
    caplog.set_level(logging.DEBUG, logger="spark_source")
    caplog.set_level(logging.DEBUG, logger="spark_sink")

    batch = spark.read.format("logstore").options(**read_options).load()
    assert sorted(int(bytes(r["value"])) for r in batch.select("value").collect()) == list(range(20))
    batch.explain(extended=True)

    checkpoint = tmp_path / "checkpoint"
    stream = spark.readStream.format("logstore").options(**read_options).load()
    query = (stream.selectExpr("key", "value").writeStream.format("logstore").options(**write_options)
             .option("checkpointLocation", str(checkpoint)).trigger(availableNow=True).start())
    try:
        assert query.awaitTermination(180)
        query.explain(extended=True)
    finally:
        query.stop()
    assert query.exception() is None

    with Consumer(mtls.bootstrap, **client) as consumer:
        consumer.assign([TopicPartition("spark-out", 0)])
        consumer.seek_to_beginning()
        got: list[bytes] = []
        for _ in range(100):
            got.extend(r.value for r in consumer.poll(0.2))
            if len(got) >= 20:
                break
    assert sorted(int(v) for v in got) == list(range(20))

    plans = capsys.readouterr().out
    assert "logstore" in plans.lower() or "BatchScan" in plans or "Scan" in plans, plans[:500]
    assert SECRET not in plans
    assert SECRET not in caplog.text
    files = [p for p in checkpoint.rglob("*") if p.is_file()]
    assert files, "the query wrote no checkpoint"
    for path in files:
        assert SECRET.encode() not in path.read_bytes(), path


def test_spark_reads_with_java_pkcs12_stores_without_leaking_their_passwords(
        spark: SparkSession, mtls: EmbeddedBroker, tls_dir: Certificates,  # noqa: F811
        tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    stores = make_java_stores(tls_dir, tmp_path / "stores", SECRET)
    cert, key = tls_dir.client("alice")
    client = {"security_protocol": "SSL", "ssl_cafile": tls_dir.ca, "ssl_certfile": cert, "ssl_keyfile": key}
    with Admin(mtls.bootstrap, **client) as admin:
        admin.create_topics([NewTopic("spark-p12", num_partitions=2)])
    with Producer(mtls.bootstrap, linger_ms=0, **client) as producer:
        for i in range(10):
            producer.send("spark-p12", value=str(i).encode())
        producer.flush(timeout=30)
    options = {"kafka.bootstrap.servers": mtls.bootstrap, "subscribe": "spark-p12", "startingOffsets": "earliest",
               "kafka.security.protocol": "SSL",
               "kafka.ssl.truststore.location": str(stores / "truststore.p12"), "kafka.ssl.truststore.type": "PKCS12",
               "kafka.ssl.truststore.password": SECRET,
               "kafka.ssl.keystore.location": str(stores / "alice.p12"), "kafka.ssl.keystore.type": "PKCS12",
               "kafka.ssl.keystore.password": SECRET, "kafka.ssl.key.password": SECRET}
    batch = spark.read.format("logstore").options(**options).load()
    assert sorted(int(bytes(r["value"])) for r in batch.select("value").collect()) == list(range(10))
    batch.explain(extended=True)
    assert SECRET not in capsys.readouterr().out
