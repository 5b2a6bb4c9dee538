"""The producer retries like Kafka's and never reports a written record as failed (issue 14, finding 6).

A child broker is SIGKILLed for 5 s (or SIGSTOPped) while a producer sends
continuously with acks=all; then every send reported successful must be in
the log at its offset, every send reported failed must not be in the log,
and with idempotence no send fails at all.
"""

from __future__ import annotations

import concurrent.futures
import os
import signal
import threading
import time
from collections.abc import Iterator

import pytest
from child_helpers import child_broker

from logstore import BrokerClient, Producer, TopicPartition
from logstore.broker.embedded import EmbeddedBroker
from logstore.client.fetcher import fetch_range
from logstore.errors import LogstoreError, UnknownProducerOutcomeError

PARTITIONS = 2


@pytest.fixture
def broker(tmp_path) -> Iterator[EmbeddedBroker]:
    with child_broker(str(tmp_path), topic="t", partitions=PARTITIONS) as b:
        yield b


def _log_contents(broker: EmbeddedBroker) -> dict[TopicPartition, dict[int, bytes]]:
    """Offset -> value of every record of topic t, read back from the broker."""
    out: dict[TopicPartition, dict[int, bytes]] = {}
    with BrokerClient(broker.bootstrap) as client:
        tps = [TopicPartition("t", p) for p in range(PARTITIONS)]
        ends = client.list_offsets(dict.fromkeys(tps, -1))
        for tp in tps:
            end = ends[tp]
            assert not isinstance(end, LogstoreError), end
            assert end.offset is not None
            records: dict[int, bytes] = {}
            for batch in fetch_range(client, tp, 0, end.offset, isolation_level="read_uncommitted"):
                for offset, value in zip(batch.column("offset").to_pylist(),
                                         batch.column("value").to_pylist(), strict=True):
                    records[offset] = value
            out[tp] = records
    return out


class _Sender:
    """A thread sending unique values round-robin over the partitions until stopped."""

    def __init__(self, producer: Producer) -> None:
        self.producer = producer
        self.sent: list[tuple[bytes, int, concurrent.futures.Future]] = []
        self.stop = threading.Event()
        self.error: BaseException | None = None
        self.thread = threading.Thread(target=self._run, daemon=True)

    def _run(self) -> None:
        try:
            n = 0
            while not self.stop.is_set():
                value = b"v-%06d" % n
                part = n % PARTITIONS
                self.sent.append((value, part, self.producer.send("t", value, partition=part)))
                n += 1
                time.sleep(0.004)
        except BaseException as e:  # surfaced by the test
            self.error = e

    def acked(self) -> int:
        return sum(1 for _, _, f in self.sent if f.done() and f.exception() is None)

    def wait_acked(self, count: int, timeout_s: float) -> None:
        deadline = time.monotonic() + timeout_s
        while self.acked() < count:
            assert time.monotonic() < deadline, f"only {self.acked()} sends acknowledged"
            time.sleep(0.02)


def _outcomes(sender: _Sender) -> tuple[list, list, list]:
    ok, unknown, failed = [], [], []
    for value, part, fut in sender.sent:
        error = fut.exception(timeout=60)
        if error is None:
            ok.append((value, part, fut.result().offset))
        elif isinstance(error, UnknownProducerOutcomeError):
            unknown.append((value, part, error))
        else:
            failed.append((value, part, error))
    return ok, unknown, failed


def _check_against_log(broker: EmbeddedBroker, ok: list, failed: list) -> dict[bytes, int]:
    log = _log_contents(broker)
    counts: dict[bytes, int] = {}
    for records in log.values():
        for value in records.values():
            counts[value] = counts.get(value, 0) + 1
    for value, part, offset in ok:
        assert log[TopicPartition("t", part)].get(offset) == value, (value, part, offset)
    wrongly_failed = [(v, e) for v, _, e in failed if v in counts]
    assert not wrongly_failed, f"{len(wrongly_failed)} sends reported failed are in the log: {wrongly_failed[:3]}"
    return counts


@pytest.mark.timeout(120)
@pytest.mark.parametrize("idempotent", [True, False], ids=["idempotent", "not-idempotent"])
def test_producer_rides_through_a_5s_broker_outage(broker: EmbeddedBroker, idempotent: bool) -> None:
    with Producer(broker.bootstrap, acks="all", linger_ms=2, enable_idempotence=idempotent) as producer:
        sender = _Sender(producer)
        sender.thread.start()
        sender.wait_acked(50, timeout_s=30)
        broker.kill()
        time.sleep(5)
        broker.start()
        in_outage = len(sender.sent)
        sender.wait_acked(in_outage + 50, timeout_s=60)
        sender.stop.set()
        sender.thread.join(10)
        assert sender.error is None, sender.error
        producer.flush(timeout=60)
    ok, unknown, failed = _outcomes(sender)
    counts = _check_against_log(broker, ok, failed)
    duplicates = sum(c - 1 for c in counts.values() if c > 1)
    print(f"idempotent={idempotent}: {len(sender.sent)} sends, {len(ok)} ok, {len(unknown)} unknown, "
          f"{len(failed)} failed, {duplicates} duplicated in the log")
    assert not failed, f"{len(failed)} sends failed across a 5 s outage: {failed[:3]}"
    if idempotent:
        assert not unknown, unknown[:3]
        assert duplicates == 0


@pytest.mark.timeout(120)
def test_sends_that_may_have_been_written_are_reported_unknown_not_failed(broker: EmbeddedBroker) -> None:
    """A stopped broker takes requests and answers nothing: they time out, yet are appended later."""
    assert broker._proc is not None
    with Producer(broker.bootstrap, acks="all", linger_ms=2, enable_idempotence=False,
                  request_timeout_ms=500, delivery_timeout_ms=1500) as producer:
        sender = _Sender(producer)
        sender.thread.start()
        sender.wait_acked(20, timeout_s=30)
        os.kill(broker._proc.pid, signal.SIGSTOP)
        time.sleep(4)
        sender.stop.set()
        sender.thread.join(10)
        assert sender.error is None, sender.error
        os.kill(broker._proc.pid, signal.SIGCONT)
        producer.flush(timeout=60)
    ok, unknown, failed = _outcomes(sender)
    _check_against_log(broker, ok, failed)
    print(f"{len(sender.sent)} sends, {len(ok)} ok, {len(unknown)} unknown, {len(failed)} failed")
    assert unknown, "sends in flight while the broker was stopped must be reported unknown"
    for _, _, error in unknown:
        assert "may or may not have been written" in error.message


# ---------------------------------------------------------------- without a broker (fake client)

_REFUSED = ("broker b:1 is unavailable (Produce: failed to connect to all addresses; last error: "
            "UNKNOWN: ipv4:127.0.0.1:1: Failed to connect to remote host: Connection refused)")
_RESET = "broker b:1 is unavailable (Produce: Socket closed)"


def test_a_lost_connection_then_refusals_is_unknown_not_failed() -> None:
    from producer_fakes import UNTYPED, FakeClient, make_producer

    from logstore.errors import BrokerUnavailableError

    fake = FakeClient({"t": (1, UNTYPED)})
    fake.script.append(lambda tps: BrokerUnavailableError(_RESET))
    for _ in range(3):
        fake.script.append(lambda tps: BrokerUnavailableError(_REFUSED))
    with make_producer(fake, linger_ms=0, retries=3, retry_backoff_ms=1) as producer:
        fut = producer.send("t", b"x")
        with pytest.raises(UnknownProducerOutcomeError, match="may or may not have been written"):
            fut.result(timeout=5)


def test_refusals_only_is_failed_and_default_retries_ride_through() -> None:
    from producer_fakes import UNTYPED, FakeClient, make_producer

    from logstore.errors import BrokerUnavailableError

    fake = FakeClient({"t": (1, UNTYPED)})
    for _ in range(20):  # far more than the old default of 5 retries
        fake.script.append(lambda tps: BrokerUnavailableError(_REFUSED))
    started = time.monotonic()
    with make_producer(fake, linger_ms=0, retry_backoff_ms=1, retry_backoff_max_ms=8) as producer:
        assert producer.send("t", b"x").result(timeout=10).offset == 0
    # Exponential backoff capped at 8 ms (±20 %): 20 retries take well under a second.
    assert time.monotonic() - started < 5
    fake = FakeClient({"t": (1, UNTYPED)})
    for _ in range(10):
        fake.script.append(lambda tps: BrokerUnavailableError(_REFUSED))
    with make_producer(fake, linger_ms=0, retries=2, retry_backoff_ms=1) as producer, \
            pytest.raises(BrokerUnavailableError) as failed:
        producer.send("t", b"x").result(timeout=5)
    assert not isinstance(failed.value, UnknownProducerOutcomeError)
