"""What the console's browser test and screenshot script share: data, the console, a browser.

* :func:`seed` fills a broker with a small, readable data set: an untyped
  ``orders`` topic (JSON values), a typed ``customers`` topic and a group
  ``billing`` whose committed offsets are behind the end.
* :func:`running_console` starts the real ``logstore console`` command on a
  free port (a child process, as a user runs it) and stops it with SIGTERM.
* :func:`headless_chromium` starts Debian's chromium through chromedriver
  with selenium, headless, with the flags this machine's closed network
  needs (without ``--disable-background-networking`` and friends chromium
  hangs on connections it cannot make) and a fresh profile directory.
  Selenium is given both paths, so Selenium Manager never downloads
  anything. ``make chromium`` installs the two packages.

Used by ``tests/cli/test_console_browser.py`` and ``tests/support/console_screenshots.py``.
"""

from __future__ import annotations

import contextlib
import os
import shutil
import subprocess
import sys
import tempfile
import threading
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pyarrow as pa

from logstore import Admin, Consumer, NewTopic, Producer, TopicPartition

CHROMIUM = os.environ.get("LOGSTORE_CHROMIUM", "/usr/bin/chromium")
CHROMEDRIVER = os.environ.get("LOGSTORE_CHROMEDRIVER", "/usr/bin/chromedriver")
CHROMIUM_FLAGS = ("--headless", "--no-sandbox", "--disable-gpu", "--disable-quic", "--no-first-run",
                  "--disable-background-networking", "--disable-component-update", "--disable-sync",
                  "--disable-dev-shm-usage", "--hide-scrollbars")
CUSTOMERS_SCHEMA = pa.schema([("customer_id", pa.int64()), ("name", pa.string()), ("tier", pa.string())])
ITEMS = ("book", "lamp", "chair", "pen", "mug", "desk")


def chromium_missing() -> str | None:
    """Why the browser cannot run here (None when it can)."""
    for path in (CHROMIUM, CHROMEDRIVER):
        if not os.access(path, os.X_OK):
            return f"{path} is missing: run `make chromium` (apt-get install chromium chromium-driver)"
    return None


def seed(bootstrap: str, *, orders: int = 30) -> None:
    """The data set described in the module docstring (``orders`` records over 3 partitions)."""
    with Admin(bootstrap) as admin:
        admin.create_topics([NewTopic("orders", 3), NewTopic("customers", 1, value_schema=CUSTOMERS_SCHEMA,
                                                            configs={"cleanup.policy": "compact"})])
    with Producer(bootstrap) as producer:
        for i in range(orders):
            producer.send("orders", {"order_id": i, "item": ITEMS[i % len(ITEMS)], "qty": 1 + i % 3},
                          key=f"customer-{i % 5}", partition=i % 3)
        for cid, name, tier in ((1, "Ada Lovelace", "gold"), (2, "Grace Hopper", "silver"),
                                (3, "Edsger Dijkstra", None), (4, "Barbara Liskov", "gold")):
            producer.send("customers", {"customer_id": cid, "name": name, "tier": tier}, key=str(cid))
        producer.flush()
    commit_behind(bootstrap, "billing", {0: 4, 1: 6, 2: 2})


def commit_behind(bootstrap: str, group: str, offsets: dict[int, int]) -> None:
    """Commit ``offsets`` of ``orders`` for ``group`` (from outside the group: it has no members)."""
    with Consumer(bootstrap, group_id=group) as consumer:
        consumer.commit({TopicPartition("orders", p): o for p, o in offsets.items()})


def produce_more(bootstrap: str, n: int) -> None:
    with Producer(bootstrap) as producer:
        for i in range(n):
            producer.send("orders", {"order_id": 1000 + i, "item": "extra"}, partition=i % 3)
        producer.flush()


@contextlib.contextmanager
def running_console(bootstrap: str, *extra: str) -> Iterator[str]:
    """``logstore console -b BOOTSTRAP --port 0 EXTRA...`` as a child; yields its base URL."""
    cmd = [sys.executable, "-c", "from logstore.cli import main; main()", "console", "-b", bootstrap,
           "--port", "0", *extra]
    proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        assert proc.stdout is not None
        line = ""
        timer = threading.Timer(20, proc.kill)  # a console that never starts must not hang the test
        timer.start()
        try:
            line = proc.stdout.readline()
        finally:
            timer.cancel()
        if not line.startswith("console: http://"):
            raise RuntimeError(f"logstore console did not start: {line!r} "
                               f"{proc.stderr.read() if proc.stderr else ''}")
        yield line.split()[1].rstrip("/")
        proc.terminate()
        proc.wait(timeout=15)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()


@contextlib.contextmanager
def headless_chromium(*, width: int = 1280, height: int = 900) -> Iterator[Any]:
    """A selenium WebDriver on headless chromium (see the module docstring)."""
    from selenium import webdriver
    from selenium.webdriver.chrome.service import Service

    profile = tempfile.mkdtemp(prefix="logstore-chromium-")
    options = webdriver.ChromeOptions()
    options.binary_location = CHROMIUM
    for flag in (*CHROMIUM_FLAGS, f"--user-data-dir={profile}", f"--window-size={width},{height}"):
        options.add_argument(flag)
    driver = webdriver.Chrome(service=Service(CHROMEDRIVER), options=options)
    try:
        driver.set_page_load_timeout(20)
        yield driver
    finally:
        driver.quit()
        shutil.rmtree(profile, ignore_errors=True)


def table_rows(driver: Any, table_id: str) -> list[list[str]]:
    """The text of each body cell of the table ``table_id``, row by row."""
    from selenium.webdriver.common.by import By

    table = driver.find_element(By.ID, table_id)
    return [[td.text for td in tr.find_elements(By.TAG_NAME, "td")]
            for tr in table.find_elements(By.CSS_SELECTOR, "tbody tr")]


def repo_root() -> Path:
    return Path(__file__).resolve().parents[2]
