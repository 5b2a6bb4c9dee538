"""Save the web console's screenshots (docs/operations.md): ``make screenshots`` (about 30 s).

Starts a broker with :func:`console_helpers.seed`'s data, a consumer group
``billing`` with a member that reads slowly (its lag rises while records
arrive in bursts and falls when it commits), a jobs status file as the
scheduler writes it, and the real ``logstore console``; then headless
chromium saves one PNG per page into ``--out`` (default
``tests/screenshots``). Not a test: it rewrites committed files, so it runs
only when asked.
"""

from __future__ import annotations

import argparse
import sys
import tempfile
import threading
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

from console_helpers import (  # noqa: E402 - after the path set-up above
    headless_chromium,
    produce_more,
    repo_root,
    running_console,
    seed,
)

from jobs.run_status import RunStatusFile  # noqa: E402
from jobs.scheduler import RunRecord  # noqa: E402
from logstore import Consumer, TopicPartition  # noqa: E402
from logstore.broker.embedded import EmbeddedBroker  # noqa: E402

PAGES = (
    ("cluster", "/"),
    ("topics", "/topics"),
    ("topic", "/topics/orders"),
    ("messages", "/topics/orders/messages?partition=0&offset=0&limit=8"),
    ("messages-typed", "/topics/customers/messages"),
    ("groups", "/groups"),
    ("group", "/groups/billing"),
    ("jobs", "/jobs"),
)


def slow_member(bootstrap: str, stop: threading.Event) -> None:
    """A member of ``billing`` that reads 4 records a second and commits every 3 seconds."""
    with Consumer(bootstrap, group_id="billing", subscribe=["orders"], enable_auto_commit=False,
                  max_poll_records=2, client_id="billing-worker") as member:
        last_commit = time.monotonic()
        while not stop.is_set():
            member.poll(timeout_ms=500)
            if time.monotonic() - last_commit > 3:
                member.commit()
                last_commit = time.monotonic()
            time.sleep(0.5)


def write_jobs_status(path: Path) -> None:
    status = RunStatusFile(path, config="conf/jobs.toml")
    status.record(RunRecord("plan", "compaction", True, 0.4, "due: customers[0]"))
    status.record(RunRecord("compaction", "customers[0]", True, 6.8,
                            "customers: 1 partition, 4 records -> 4, 1 segment replaced"))
    status.record(RunRecord("view", "users -> data/views/users", False, 1.2,
                            "UnknownTopicOrPartitionError: topic 'users' does not exist; retry in 10s"))
    status.record(RunRecord("view", "customers -> data/views/customers", True, 9.1, "started"))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", type=Path, default=repo_root() / "tests" / "screenshots")
    args = parser.parse_args()
    args.out.mkdir(parents=True, exist_ok=True)
    with EmbeddedBroker() as broker, tempfile.TemporaryDirectory() as tmp:
        seed(broker.bootstrap, orders=60)
        jobs_status = Path(tmp) / "jobs-status.json"
        write_jobs_status(jobs_status)
        with Consumer(broker.bootstrap, group_id="billing") as c:  # start it 10 records in
            c.commit({TopicPartition("orders", p): 10 for p in range(3)})
        stop = threading.Event()
        member = threading.Thread(target=slow_member, args=(broker.bootstrap, stop), daemon=True)
        with running_console(broker.bootstrap, "--sample-interval", "0.5", "--refresh", "0",
                             "--jobs-status", str(jobs_status)) as base:
            member.start()
            for _ in range(8):  # bursts faster than the member reads: the lag rises, then falls
                produce_more(broker.bootstrap, 9)
                time.sleep(1.0)
            time.sleep(4)
            with headless_chromium(width=1200, height=760) as driver:
                for name, path in PAGES:
                    driver.set_window_size(1200, 400)  # scrollHeight is at least the viewport's
                    driver.get(base + path)
                    height = driver.execute_script("return document.documentElement.scrollHeight")
                    # the window's height includes what headless chromium keeps for its own frame
                    chrome = driver.execute_script("return window.outerHeight - window.innerHeight")
                    driver.set_window_size(1200, min(max(500, height + chrome + 16), 1600))
                    target = args.out / f"console-{name}.png"
                    driver.save_screenshot(str(target))
                    print(f"saved {target}")
            stop.set()
            member.join(timeout=10)


if __name__ == "__main__":
    main()
