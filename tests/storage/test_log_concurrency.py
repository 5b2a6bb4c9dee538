"""One writer and many readers on one partition log (logstore.storage.log thread-safety contract).

Readers run concurrently with appends, rolls and (in the second test) the log
start offset moving forward and segments being deleted. They must never see a
partial or corrupt batch, and must see offsets in order with no gap and with
the content the writer put at each offset (DESIGN §1 I1, I2).
"""

from __future__ import annotations

import pytest
from concurrent_log import batch_at, run
from storage_helpers import SCHEMA, config

from logstore.storage.log import Log

pytestmark = pytest.mark.timeout(120)


def test_readers_see_whole_batches_in_order_while_the_writer_appends_and_rolls(tmp_path) -> None:
    log = Log.open(str(tmp_path / "t-0"), config=config(segment_bytes=32 * 1024, index_interval_bytes=1024),
                   schema=SCHEMA)

    def step(i: int) -> None:
        log.append(batch_at(log.log_end_offset, 1 + i % 23), compression=[None, "lz4"][i % 2])

    checked = run(log, step)
    total = log.log_end_offset
    assert len(log.segments) > 10
    assert all(c == total for c in checked), (checked, total)


def test_readers_survive_the_log_start_moving_and_segments_being_deleted(tmp_path) -> None:
    log = Log.open(str(tmp_path / "t-0"), config=config(segment_bytes=16 * 1024, retention_bytes=64 * 1024,
                                                        retention_ms=-1), schema=SCHEMA)

    def step(i: int) -> None:
        log.append(batch_at(log.log_end_offset, 1 + i % 17))
        if i % 50 == 49:
            log.delete_records_before(log.log_end_offset - 40)
        if i % 20 == 0:
            log.enforce_retention()

    checked = run(log, step)
    assert log.log_start_offset > 0
    assert all(c > 0 for c in checked)
