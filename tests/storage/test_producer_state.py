"""Producer state of one partition (logstore.storage.producer_state) on its own: the sequence
rules of the module docstring, open and aborted transactions, max_producer_id and the snapshot."""

from __future__ import annotations

import json
import os

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from logstore.errors import OutOfOrderSequenceError, ProducerFencedError
from logstore.producer_id_layout import BOUND_BIT, MAC_BITS
from logstore.record import (
    ATTR_ABORT_MARKER,
    ATTR_CONTROL,
    ATTR_TRANSACTIONAL,
    NO_PRODUCER_ID,
    BatchHeader,
)
from logstore.storage.producer_state import (
    DEDUP_WINDOW,
    PRODUCER_STATE_FILE,
    AbortedTxn,
    BatchAppend,
    ProducerStateManager,
)

pytestmark = pytest.mark.timeout(60)

_SEQ_MOD = 2**31


def header(pid: int, epoch: int, seq: int, n: int = 1, *, at: int = 0, attributes: int = 0) -> BatchHeader:
    return BatchHeader(base_offset=at, last_offset_delta=n - 1, record_count=n, max_timestamp=0,
                       producer_id=pid, producer_epoch=epoch, base_sequence=seq, attributes=attributes)


def marker(pid: int, epoch: int, *, at: int, commit: bool) -> BatchHeader:
    attributes = ATTR_CONTROL | ATTR_TRANSACTIONAL | (0 if commit else ATTR_ABORT_MARKER)
    return header(pid, epoch, -1, at=at, attributes=attributes)


class Appender:
    """Drives a manager the way a partition does: check, and apply at the log end if not a duplicate."""

    def __init__(self, psm: ProducerStateManager) -> None:
        self.psm = psm
        self.leo = 0

    def send(self, pid: int, epoch: int, seq: int, n: int = 1, *, attributes: int = 0) -> int:
        """The base offset the batch got (its original one for a duplicate)."""
        dup = self.psm.check(header(pid, epoch, seq, n), n)
        if dup is not None:
            return dup.base_offset
        at = self.leo
        self.psm.apply(header(pid, epoch, seq, n, at=at, attributes=attributes))
        self.leo += n
        return at

    def end_txn(self, pid: int, epoch: int, *, commit: bool) -> int:
        at = self.leo
        self.psm.apply(marker(pid, epoch, at=at, commit=commit))
        self.leo += 1
        return at


@pytest.fixture
def app(tmp_path) -> Appender:  # type: ignore[no-untyped-def]
    return Appender(ProducerStateManager(str(tmp_path)))


def test_a_plain_producer_is_never_checked_or_remembered(app: Appender) -> None:
    assert app.send(NO_PRODUCER_ID, -1, -1, 3) == 0
    assert app.send(NO_PRODUCER_ID, -1, -1, 3) == 3  # the same batch again is appended again
    assert app.psm.applied_until == 6
    assert app.psm.max_producer_id == -1
    assert app.psm.first_unstable_offset() is None


def test_an_unknown_producer_must_start_at_sequence_zero(app: Appender) -> None:
    with pytest.raises(OutOfOrderSequenceError, match="must start at sequence 0") as e:
        app.psm.check(header(7, 0, 5), 1)
    assert e.value.code == "OUT_OF_ORDER_SEQUENCE_NUMBER"
    assert app.psm.check(header(7, 0, 0), 1) is None


def test_sequences_must_follow_without_gaps(app: Appender) -> None:
    app.send(7, 0, 0, 3)
    for seq in (4, 2, 1):  # a gap; overlapping the last batch; an unremembered shape
        with pytest.raises(OutOfOrderSequenceError, match="expected sequence 3"):
            app.psm.check(header(7, 0, seq, 2), 2)
    assert app.send(7, 0, 3, 2) == 3


def test_an_older_epoch_is_fenced(app: Appender) -> None:
    app.send(7, 0, 0)
    app.send(7, 2, 0)
    for epoch, seq in ((1, 0), (0, 1), (0, 0)):  # even a retry of a batch of the old epoch
        with pytest.raises(ProducerFencedError) as e:
            app.psm.check(header(7, epoch, seq), 1)
        assert e.value.code == "PRODUCER_FENCED"


def test_a_new_epoch_must_start_at_zero_and_forgets_the_old_batches(app: Appender) -> None:
    app.send(7, 0, 0, 4)
    with pytest.raises(OutOfOrderSequenceError, match="a new epoch must start at 0"):
        app.psm.check(header(7, 1, 4), 1)
    assert app.send(7, 1, 0, 4) == 4  # the same sequences as epoch 0's batch: not a duplicate
    assert app.send(7, 1, 0, 4) == 4  # but now it is, within epoch 1


def test_retries_within_the_dedup_window_get_their_original_offsets(app: Appender) -> None:
    offsets = [app.send(7, 0, 2 * i, 2) for i in range(DEDUP_WINDOW + 1)]
    leo = app.leo
    for i in range(1, DEDUP_WINDOW + 1):  # the last DEDUP_WINDOW batches, oldest first
        assert app.psm.check(header(7, 0, 2 * i, 2), 2) == BatchAppend(2 * i, 2 * i + 1, offsets[i], offsets[i] + 1)
    assert app.leo == leo
    with pytest.raises(OutOfOrderSequenceError):  # the first batch has left the window
        app.psm.check(header(7, 0, 0, 2), 2)
    with pytest.raises(OutOfOrderSequenceError):  # same first sequence, other length: not a retry
        app.psm.check(header(7, 0, 2 * DEDUP_WINDOW, 1), 1)


def test_sequences_wrap_at_2_pow_31(app: Appender) -> None:
    app.psm.apply(header(7, 0, 0, at=0))
    app.psm.apply(header(7, 0, 1, _SEQ_MOD - 2, at=1))  # last sequence 2^31 - 2
    assert app.psm.check(header(7, 0, _SEQ_MOD - 1, 3), 3) is None  # 2^31-1, 0, 1
    app.psm.apply(header(7, 0, _SEQ_MOD - 1, 3, at=_SEQ_MOD - 1))
    assert app.psm.check(header(7, 0, 2), 1) is None
    with pytest.raises(OutOfOrderSequenceError, match="expected sequence 2"):
        app.psm.check(header(7, 0, 3), 1)


# One step: (producer id, epoch, sequence, record count). The sequence is None for the next one
# the model expects, -k for a retry of the k-th last batch of that producer (its sequences and
# count) or a sequence as it is.
steps = st.lists(st.tuples(st.sampled_from([1, 1, 1, 2]), st.sampled_from([0] * 8 + [1, 2]),
                           st.one_of(st.none(), st.none(), st.integers(-DEDUP_WINDOW - 2, 14)),
                           st.integers(1, 2)),
                 min_size=10, max_size=60)


@settings(max_examples=200, deadline=None)
@given(steps=steps)
def test_check_agrees_with_a_model_of_the_sequence_rules(tmp_path_factory, steps) -> None:  # type: ignore[no-untyped-def]
    app = Appender(ProducerStateManager(str(tmp_path_factory.getbasetemp())))
    # pid -> (epoch, [(first, last, base offset) of the batches appended in that epoch])
    model: dict[int, tuple[int, list[tuple[int, int, int]]]] = {}
    for pid, epoch, chosen, n in steps:
        known = model.get(pid)
        sent = known[1] if known is not None else []
        if chosen is None:
            seq = sent[-1][1] + 1 if sent else 0
        elif chosen < 0 and len(sent) >= -chosen:
            seq, n = sent[chosen][0], sent[chosen][1] - sent[chosen][0] + 1
        else:
            seq = abs(chosen)
        last = seq + n - 1
        if known is not None and epoch < known[0]:
            expected: object = ProducerFencedError
        elif known is None or epoch > known[0]:
            expected = "append" if seq == 0 else OutOfOrderSequenceError
        else:
            remembered = {(f, la): b for f, la, b in known[1][-DEDUP_WINDOW:]}
            if (seq, last) in remembered:
                expected = remembered[(seq, last)]
            else:
                expected = "append" if seq == (known[1][-1][1] + 1 if known[1] else 0) else OutOfOrderSequenceError

        if isinstance(expected, type):
            with pytest.raises(expected):
                app.send(pid, epoch, seq, n)
        elif expected == "append":
            leo = app.leo
            assert app.send(pid, epoch, seq, n) == leo
            batches = known[1] if known is not None and known[0] == epoch else []
            model[pid] = (epoch, [*batches, (seq, last, leo)])
        else:
            leo = app.leo
            assert app.send(pid, epoch, seq, n) == expected
            assert app.leo == leo
    assert app.psm.max_producer_id == max(model, default=-1)


def test_is_ahead_tells_a_batch_that_overtook_its_predecessor(app: Appender) -> None:
    assert app.psm.is_ahead(header(7, 0, 3))  # unknown producer, not at 0
    assert not app.psm.is_ahead(header(7, 0, 0))
    app.send(7, 0, 0, 2)
    assert app.psm.is_ahead(header(7, 0, 5))
    assert not app.psm.is_ahead(header(7, 0, 2))  # the next one: acceptable now
    assert not app.psm.is_ahead(header(7, 0, 0))  # behind: a duplicate or an error, never ahead
    assert app.psm.is_ahead(header(7, 1, 1)) and not app.psm.is_ahead(header(7, 1, 0))
    assert not app.psm.is_ahead(header(7, -1, 9))  # fenced
    assert not app.psm.is_ahead(header(NO_PRODUCER_ID, -1, 9))


def test_open_transactions_bound_the_first_unstable_offset(app: Appender) -> None:
    app.send(1, 0, 0, 2)  # idempotent, not transactional
    assert app.psm.first_unstable_offset() is None
    a = app.send(2, 0, 0, 2, attributes=ATTR_TRANSACTIONAL)
    b = app.send(3, 5, 0, 1, attributes=ATTR_TRANSACTIONAL)
    app.send(2, 0, 2, 1, attributes=ATTR_TRANSACTIONAL)  # a later batch of an open transaction
    assert app.psm.first_unstable_offset() == a == 2
    assert app.psm.has_open_transaction(2) and not app.psm.has_open_transaction(1)
    assert app.psm.in_open_transaction(3, 5) and not app.psm.in_open_transaction(3, 4)

    app.end_txn(2, 0, commit=True)
    assert app.psm.first_unstable_offset() == b
    assert not app.psm.has_open_transaction(2)
    app.end_txn(3, 5, commit=True)
    assert app.psm.first_unstable_offset() is None
    assert app.psm.aborted_between(0, app.leo) == []


def test_aborted_transactions_span_first_record_to_marker(app: Appender) -> None:
    app.send(1, 0, 0, 2)
    first = app.send(2, 0, 0, 2, attributes=ATTR_TRANSACTIONAL)
    app.send(2, 0, 2, 2, attributes=ATTR_TRANSACTIONAL)
    end = app.end_txn(2, 0, commit=False)
    app.send(2, 0, 4, 1)  # after the abort, not transactional
    txn = AbortedTxn(2, first, end)
    assert (first, end) == (2, 6)
    assert app.psm.first_unstable_offset() is None
    assert app.psm.aborted_between(0, 100) == [txn]
    assert app.psm.aborted_between(6, 7) == [txn]  # only the marker is in range
    assert app.psm.aborted_between(0, 2) == []  # [start, end) is exclusive at end
    assert app.psm.aborted_between(7, 100) == []
    # A marker for a producer without an open transaction records nothing.
    app.end_txn(1, 0, commit=False)
    assert app.psm.aborted_between(0, 100) == [txn]

    app.psm.truncate_from(6)
    assert app.psm.aborted_between(0, 100) == [txn]  # the marker is still in the log
    app.psm.truncate_from(7)
    assert app.psm.aborted_between(0, 100) == []


def test_an_abort_at_a_bumped_epoch_ends_the_older_epochs_transaction(app: Appender) -> None:
    first = app.send(2, 0, 0, 2, attributes=ATTR_TRANSACTIONAL)
    end = app.end_txn(2, 1, commit=False)  # the coordinator fenced epoch 0 and aborted with epoch 1
    assert app.psm.aborted_between(0, 100) == [AbortedTxn(2, first, end)]
    assert app.psm.first_unstable_offset() is None
    with pytest.raises(ProducerFencedError):
        app.psm.check(header(2, 0, 2), 1)


def test_max_producer_id_counts_bound_ids_by_their_counter_and_is_never_lowered(tmp_path) -> None:  # type: ignore[no-untyped-def]
    psm = ProducerStateManager(str(tmp_path))
    bound = BOUND_BIT | (41 << MAC_BITS) | 12345  # counter 41, a MAC in the low bits
    psm.apply(header(bound, 0, 0, at=0))
    psm.apply(header(9, 0, 0, at=1))
    assert psm.max_producer_id == 41
    psm.write_snapshot()
    psm.reset()
    assert psm.max_producer_id == 41  # a reset forgets the producers, not the high mark
    assert psm.first_unstable_offset() is None and psm.applied_until == 0

    again = ProducerStateManager(str(tmp_path))
    again.load_snapshot(log_end_offset=0)  # beyond the log end: the producers are ignored...
    assert again.max_producer_id == 41  # ...but never the high mark
    with pytest.raises(OutOfOrderSequenceError, match="unknown"):
        again.check(header(9, 0, 1), 1)


def test_a_snapshot_restores_the_state_it_was_written_from(app: Appender, tmp_path) -> None:  # type: ignore[no-untyped-def]
    app.send(1, 3, 0, 2)
    app.send(1, 3, 2, 2)
    first = app.send(2, 0, 0, 1, attributes=ATTR_TRANSACTIONAL)
    end = app.end_txn(2, 0, commit=False)
    open_at = app.send(4, 0, 0, 1, attributes=ATTR_TRANSACTIONAL)
    app.psm.write_snapshot()
    assert os.path.exists(tmp_path / PRODUCER_STATE_FILE)

    loaded = ProducerStateManager(str(tmp_path))
    loaded.load_snapshot(log_end_offset=app.leo)
    assert loaded.applied_until == app.leo
    assert loaded.max_producer_id == 4
    assert loaded.check(header(1, 3, 2, 2), 2) == BatchAppend(2, 3, 2, 3)  # still a duplicate
    assert loaded.check(header(1, 3, 4), 1) is None
    with pytest.raises(ProducerFencedError):
        loaded.check(header(1, 2, 4), 1)
    assert loaded.aborted_between(0, 100) == [AbortedTxn(2, first, end)]
    assert loaded.first_unstable_offset() == open_at
    assert loaded.in_open_transaction(4, 0)


def test_a_snapshot_beyond_the_log_end_is_ignored(app: Appender, tmp_path) -> None:  # type: ignore[no-untyped-def]
    app.send(1, 0, 0, 3)
    app.send(2, 0, 0, 1, attributes=ATTR_TRANSACTIONAL)
    app.psm.write_snapshot()

    loaded = ProducerStateManager(str(tmp_path))
    loaded.load_snapshot(log_end_offset=app.leo - 1)  # the log was truncated below the snapshot
    assert loaded.applied_until == 0
    assert loaded.first_unstable_offset() is None
    with pytest.raises(OutOfOrderSequenceError, match="must start at sequence 0"):
        loaded.check(header(1, 0, 3), 1)  # producer 1 is unknown again: replay will teach it
    assert loaded.max_producer_id == 2


@pytest.mark.parametrize("text", ["{not json", "[]", '{"applied_until": 1}', '{"producers": {"x": {}}}'])
def test_a_damaged_snapshot_means_an_empty_state(tmp_path, text: str) -> None:  # type: ignore[no-untyped-def]
    (tmp_path / PRODUCER_STATE_FILE).write_text(text)
    psm = ProducerStateManager(str(tmp_path))
    psm.load_snapshot(log_end_offset=100)
    assert (psm.applied_until, psm.first_unstable_offset(), psm.aborted_between(0, 100)) == (0, None, [])
    with pytest.raises(OutOfOrderSequenceError):
        psm.check(header(1, 0, 1), 1)


def test_no_snapshot_file_means_an_empty_state(tmp_path) -> None:  # type: ignore[no-untyped-def]
    psm = ProducerStateManager(str(tmp_path))
    psm.apply(header(5, 0, 0, at=0))
    psm.load_snapshot(log_end_offset=10)  # replaces what was in memory
    assert psm.applied_until == 0
    assert not psm.has_open_transaction(5)
    with pytest.raises(OutOfOrderSequenceError, match="must start at sequence 0"):
        psm.check(header(5, 0, 1), 1)


def test_the_snapshot_file_is_json_with_the_documented_high_mark(app: Appender, tmp_path) -> None:  # type: ignore[no-untyped-def]
    app.send(8, 0, 0, 1)
    app.psm.write_snapshot()
    doc = json.loads((tmp_path / PRODUCER_STATE_FILE).read_text())
    assert (doc["applied_until"], doc["max_producer_id"]) == (1, 8)
