"""The web console (``logstore console``) against a real embedded broker, through aiohttp's test client.

One broker for the module with an untyped topic (JSON, text and binary values,
a value that tries to inject a script), a typed topic and a group that
committed offsets behind the end. Each test builds the console app
(:func:`logstore.cli.console.app.make_app`) and requests pages as a browser
would; the headless-browser test is ``tests/cli/test_console_browser.py``.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import subprocess
import sys
from collections.abc import Awaitable, Callable, Iterator
from pathlib import Path
from typing import Any

import pyarrow as pa
import pytest
from aiohttp.test_utils import TestClient, TestServer

from jobs.run_status import RunStatusFile
from jobs.scheduler import RunRecord
from logstore import Admin, Consumer, NewTopic, Producer, TopicPartition
from logstore.broker.embedded import EmbeddedBroker
from logstore.cli.console.app import make_app
from logstore.cli.console.browse import render_bytes
from logstore.cli.console.html import line_chart
from logstore.cli.console.pages import STATE
from logstore.cli.console.sampler import Sampler

pytestmark = pytest.mark.timeout(60)

XSS = '<script>alert("pwned")</script>'
SCHEMA = pa.schema([("customer_id", pa.int64()), ("name", pa.string()), ("tier", pa.string())])


@pytest.fixture(scope="module")
def broker() -> Iterator[EmbeddedBroker]:
    with EmbeddedBroker() as b:
        with Admin(b.bootstrap) as admin:
            admin.create_topics([NewTopic("orders", 2), NewTopic("customers", 1, value_schema=SCHEMA)])
        with Producer(b.bootstrap) as producer:
            producer.send("orders", {"order": 1, "item": "book"}, key="k1", partition=0)
            producer.send("orders", "plain text", key="k2", partition=0)
            producer.send("orders", b"\x00\xff\x10binary", key="k3", partition=0)
            producer.send("orders", XSS, key=XSS, partition=0)
            for i in range(6):
                producer.send("orders", {"order": 10 + i}, partition=1)
            producer.send("customers", {"customer_id": 7, "name": "Ada", "tier": "gold"}, key="7")
            producer.send("customers", {"customer_id": 8, "name": XSS, "tier": None}, key="8")
            producer.flush()
        with Consumer(b.bootstrap, group_id="billing", auto_offset_reset="earliest") as c:
            c.commit({TopicPartition("orders", 0): 1, TopicPartition("orders", 1): 4})
        yield b


def run(broker: EmbeddedBroker, check: Callable[[TestClient[Any, Any]], Awaitable[None]], **kw: Any) -> None:
    async def main() -> None:
        app = make_app(broker.bootstrap, sample_interval_s=kw.pop("sample_interval_s", 0.2), **kw)
        async with TestClient(TestServer(app)) as client:
            await check(client)

    asyncio.run(main())


async def get(client: TestClient[Any, Any], path: str, status: int = 200) -> str:
    resp = await client.get(path)
    text = await resp.text()
    assert resp.status == status, (path, resp.status, text[:500])
    assert resp.headers["Content-Type"].startswith("text/html")
    return text


def test_overview_shows_the_broker_and_health(broker: EmbeddedBroker) -> None:
    async def check(client: TestClient[Any, Any]) -> None:
        text = await get(client, "/")
        assert broker.bootstrap in text  # the brokers table lists its address
        assert 'id="card-offline-partitions"><b class="ok">0</b>' in text
        assert 'id="card-under-replicated"><b class="ok">0</b>' in text
        assert 'id="card-controller"><b class="">node 0</b>' in text  # not a bare 0: "no controller"

    run(broker, check)


def test_topics_and_a_topic_show_partitions_and_offsets(broker: EmbeddedBroker) -> None:
    async def check(client: TestClient[Any, Any]) -> None:
        text = await get(client, "/topics")
        assert '<a href="/topics/orders">orders</a>' in text
        assert '<a href="/topics/customers">customers</a>' in text
        text = await get(client, "/topics/orders")
        # partition 0: log start 0, HWM 4, LSO 4, LEO 4; partition 1: 6 records
        assert "<td class=num>0</td><td class=num>0</td><td>0</td><td>0</td>" in text
        assert "<td class=num>0</td><td class=num>4</td><td class=num>4</td><td class=num>4</td>" in text
        assert "<td class=num>0</td><td class=num>6</td><td class=num>6</td><td class=num>6</td>" in text
        assert "untyped" in text
        text = await get(client, "/topics/customers")
        assert "customer_id" in text and "tier" in text  # the value schema
        await get(client, "/topics/nope", status=404)

    run(broker, check)


def test_message_browser_untyped_json_text_binary_and_escaped(broker: EmbeddedBroker) -> None:
    async def check(client: TestClient[Any, Any]) -> None:
        text = await get(client, "/topics/orders/messages?partition=0&offset=0&limit=10")
        assert "<pre class=json>{\n  &quot;order&quot;: 1,\n  &quot;item&quot;: &quot;book&quot;\n}</pre>" in text
        assert "<pre>plain text</pre>" in text
        assert "00 ff 10 62 69 6e 61 72 79" in text  # hex dump of the binary value
        assert XSS not in text and "&lt;script&gt;alert(&quot;pwned&quot;)&lt;/script&gt;" in text
        text = await get(client, "/topics/orders/messages?partition=1&offset=2&limit=3")
        assert "offsets 2 to 5 (exclusive)" in text
        assert text.count("<tr><td class=num>") == 3
        assert "&quot;order&quot;: 12" in text and "&quot;order&quot;: 15" not in text
        await get(client, "/topics/orders/messages?partition=9", status=404)
        resp = await client.get("/topics/orders/messages?offset=x")
        assert resp.status == 400

    run(broker, check)


def _is_error_page(text: str, status: str, said: str) -> bool:
    """The console's own page (its style and header), titled ``status``, saying ``said``."""
    return (text.startswith("<!doctype html>") and f"<title>{status} · logstore console</title>" in text
            and "<span class=brand>logstore</span>" in text and f"<h1>{status}</h1>" in text
            and f"<p class=bad id=error>{said}" in text)


def test_error_pages_are_the_consoles_html_with_the_message(broker: EmbeddedBroker) -> None:
    async def fails(request: Any) -> Any:
        raise RuntimeError("a page bug")

    async def main() -> None:
        app = make_app(broker.bootstrap, sample_interval_s=3600)
        app.router.add_get("/fails", fails)
        async with TestClient(TestServer(app)) as client:
            for path, status, said in (
                    ("/topics/orders/messages?offset=x", "400 Bad Request",
                     "the query parameter offset must be an integer"),
                    ("/no/such/page", "404 Not Found", "Not Found"),
                    ("/fails", "500 Internal Server Error",
                     "the console failed while answering (RuntimeError); its log has the details")):
                resp = await client.get(path)
                text = await resp.text()
                assert resp.status == int(status[:3]) and resp.headers["Content-Type"].startswith("text/html")
                assert _is_error_page(text, status, said), text[-400:]
                assert resp.headers["X-Frame-Options"] == "DENY" and "a page bug" not in text

    asyncio.run(main())


def test_a_request_that_is_not_http_gets_the_consoles_400_page(broker: EmbeddedBroker) -> None:
    """aiohttp answers a request it cannot parse before any page runs, in plain text that
    repeats the raw request line; the console's runner gives it the console's page."""
    from logstore.cli.console.app import serve

    async def main() -> bytes:
        bound: asyncio.Future[int] = asyncio.get_running_loop().create_future()
        app = make_app(broker.bootstrap, sample_interval_s=3600)
        server = asyncio.create_task(serve(app, host="127.0.0.1", port=0,
                                           announce=lambda line: bound.set_result(int(line.split("/")[2].rsplit(":")[1]))))
        try:
            reader, writer = await asyncio.open_connection("127.0.0.1", await asyncio.wait_for(bound, 30))
            writer.write(b"GET /\x01<b>raw</b> HTTP/1.1\r\nHost: x\r\n\r\n")
            answer = await asyncio.wait_for(reader.read(), 30)
            writer.close()
            return answer
        finally:
            server.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await server

    head, _, body = asyncio.run(main()).partition(b"\r\n\r\n")
    text = body.decode()
    assert head.startswith(b"HTTP/1.1 400") or head.startswith(b"HTTP/1.0 400"), head
    assert b"Content-Type: text/html" in head and b"X-Frame-Options: DENY" in head
    assert _is_error_page(text, "400 Bad Request", "the request is not valid HTTP"), text
    assert "raw" not in text


def test_message_browser_typed_topic_is_a_table_of_its_columns(broker: EmbeddedBroker) -> None:
    async def check(client: TestClient[Any, Any]) -> None:
        text = await get(client, "/topics/customers/messages")  # default: the last records
        assert "<th>customer_id</th><th>name</th><th>tier</th>" in text
        assert "<td>7</td><td>Ada</td><td>gold</td>" in text
        assert XSS not in text and "&lt;script&gt;" in text

    run(broker, check)


def test_groups_show_members_offsets_lag_and_chart(broker: EmbeddedBroker) -> None:
    async def check(client: TestClient[Any, Any]) -> None:
        await asyncio.sleep(0.5)  # a few samples (every 0.2 s)
        text = await get(client, "/groups")
        assert '<a href="/groups/billing">billing</a>' in text
        text = await get(client, "/groups/billing")
        assert 'id="card-total-lag"><b class="">5</b>' in text  # (4 - 1) + (6 - 4)
        assert "<td class=num>1</td><td class=num>4</td><td class=num>3</td>" in text
        assert '<polyline data-series="total"' in text
        await get(client, "/groups/nobody", status=404)

    run(broker, check)


def test_the_lag_card_and_the_chart_legend_say_one_number(broker: EmbeddedBroker) -> None:
    """The card is read when the page is asked for; the legend's "now" was the sampler's last
    point, up to one interval older (here an hour): records produced since made them differ."""
    with Admin(broker.bootstrap) as admin:
        admin.create_topics([NewTopic("lagging", 1)])
    with Consumer(broker.bootstrap, group_id="laggard") as c:
        c.commit({TopicPartition("lagging", 0): 0})

    def produce(n: int) -> None:
        with Producer(broker.bootstrap) as p:
            for i in range(n):
                p.send("lagging", {"n": i}, partition=0)
            p.flush()

    produce(2)

    async def check(client: TestClient[Any, Any]) -> None:
        await asyncio.to_thread(produce, 5)  # after the app's first (and, for an hour, only) sample
        text = await get(client, "/groups/laggard")
        assert 'id="card-total-lag"><b class="">7</b>' in text
        assert ">total (now 7)</text>" in text and ">lagging-0 (now 7)</text>" in text

    run(broker, check, sample_interval_s=3600)


def test_the_chart_legend_writes_large_numbers_in_full() -> None:
    chart = str(line_chart({"total": [(0.0, 1234567.0)], "rate": [(0.0, 2.5)]}))
    assert ">total (now 1234567)</text>" in chart and ">rate (now 2.5)</text>" in chart


def test_lag_history_moves_while_a_group_lags(broker: EmbeddedBroker) -> None:
    """Produce while the group stays put: the sampled total lag grows."""

    async def check(client: TestClient[Any, Any]) -> None:
        sampler: Sampler = client.app[STATE].sampler
        await sampler.sample_once()
        before = sampler.lag_history("billing")[-1].total
        with Producer(broker.bootstrap) as p:
            for i in range(3):
                p.send("orders", {"more": i}, partition=1)
            p.flush()
        await sampler.sample_once()
        after = sampler.lag_history("billing")[-1].total
        assert after == before + 3

    run(broker, check)


def test_jobs_page_without_and_with_a_status_file(broker: EmbeddedBroker, tmp_path: Path) -> None:
    status = tmp_path / "jobs-status.json"

    async def missing(client: TestClient[Any, Any]) -> None:
        text = await get(client, "/jobs")
        assert "does not exist yet" in text and "status_file" in text

    run(broker, missing, jobs_status=status)
    writer = RunStatusFile(status, config="conf/jobs.toml")
    writer.record(RunRecord("compaction", "profiles", True, 4.2, "compacted 3 partitions"))
    writer.record(RunRecord("view", "users -> data/views/users", False, 0.3, XSS))
    doc = json.loads(status.read_text())
    assert doc["format"] == 1 and [j["kind"] for j in doc["jobs"]] == ["compaction", "view"]

    async def present(client: TestClient[Any, Any]) -> None:
        text = await get(client, "/jobs")
        assert "<td>compaction</td><td>profiles</td><td><span class=ok>ok</span></td>" in text
        assert "compacted 3 partitions" in text and "4.2s" in text
        assert "<span class=bad>FAILED</span>" in text
        assert XSS not in text

    run(broker, present, jobs_status=status)

    async def none(client: TestClient[Any, Any]) -> None:
        assert "--jobs-status" in await get(client, "/jobs")

    run(broker, none)


def test_render_bytes_and_chart_units() -> None:
    assert str(render_bytes(b"[1, 2]")) == "<pre class=json>[\n  1,\n  2\n]</pre>"
    assert str(render_bytes(b"{not json")) == "<pre>{not json</pre>"
    assert str(render_bytes(None)) == "<span class=muted>null</span>"
    chart = str(line_chart({"total": [(0.0, 0.0), (10.0, 5.0)]}, width=200, height=100))
    assert 'points="56.0,72.0 188.0,12.0"' in chart  # (0,0) bottom left, (10,5) top right
    assert "no samples yet" in str(line_chart({"total": []}))


def test_cli_serves_and_stops_on_sigterm(broker: EmbeddedBroker) -> None:
    """The real command: prints its address, serves a page, exits 0 on SIGTERM."""
    import urllib.request

    proc = subprocess.Popen(
        [sys.executable, "-c", "from logstore.cli import main; main()", "console", "-b", broker.bootstrap,
         "--port", "0"], stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        assert proc.stdout is not None
        line = proc.stdout.readline()
        assert line.startswith("console: http://127.0.0.1:"), line + (proc.stderr.read() if proc.stderr else "")
        address = line.split()[1]
        with urllib.request.urlopen(address + "topics", timeout=10) as resp:
            assert b"orders" in resp.read()
        proc.terminate()
        assert proc.wait(timeout=15) == 0
    finally:
        proc.kill()
        proc.wait()


def test_scheduler_writes_its_runs_to_the_status_file(tmp_path: Path) -> None:
    """``status_file`` in jobs.toml: each run of a round lands in the file the console reads."""
    from jobs.scheduler import CompactionOutcome, Scheduler
    from jobs.scheduler_config import parse_config
    from jobs.scheduler_decisions import DirtyPartition

    status = tmp_path / "state" / "jobs-status.json"
    config = parse_config({"bootstrap": "h:1", "status_file": str(status), "compaction": {"topics": ["a"]}})

    def plan(topics: Any) -> tuple[list[DirtyPartition], dict[str, str]]:
        return [DirtyPartition("a", 0, 0.9)], {}

    def compact(topic: str, partitions: Any) -> CompactionOutcome:
        return CompactionOutcome(True, "1 partition compacted")

    def start_view(view: Any, *, available_now: bool) -> Any:
        raise AssertionError("no views configured")

    scheduler = Scheduler(config, plan=plan, compact=compact, start_view=start_view)
    records = scheduler.run_round(once=True)
    doc = json.loads(status.read_text())
    assert [(j["kind"], j["name"], j["runs"], j["last"]["ok"]) for j in doc["jobs"]] == [
        (r.kind, r.name, 1, True) for r in records]
    assert doc["jobs"][-1]["last"]["detail"] == "1 partition compacted"
    assert not parse_config({"bootstrap": "h:1"}).status_file  # off unless configured


def test_sampler_rate_is_the_slope_of_the_end_offsets_over_its_window() -> None:
    sampler = Sampler(admin=None, interval_s=1.0, history=100, rate_window_s=10.0)  # type: ignore[arg-type]
    tp = TopicPartition("t", 0)
    assert sampler.rate(tp) is None
    sampler.record_ends({tp: 100}, at_s=0.0)
    assert sampler.rate(tp) is None  # one sample: no rate yet
    for t in range(1, 21):  # 5 records a second for 20 s, then 50 a second for 5 s
        sampler.record_ends({tp: 100 + 5 * t}, at_s=float(t))
    assert sampler.rate(tp) == pytest.approx(5.0)
    for t in range(21, 26):
        sampler.record_ends({tp: 200 + 50 * (t - 20)}, at_s=float(t))
    assert sampler.rate(tp) == pytest.approx((450 - 175) / 10)  # only the last 10 s count
    sampler.record_ends({}, at_s=26.0)  # a deleted topic is forgotten
    assert sampler.rate(tp) is None


def test_a_group_id_with_markup_and_a_slash_is_escaped_and_linked(broker: EmbeddedBroker) -> None:
    weird = '<img src=x onerror=alert(1)>/"g"'
    with Consumer(broker.bootstrap, group_id=weird) as c:
        c.commit({TopicPartition("orders", 0): 2})

    async def check(client: TestClient[Any, Any]) -> None:
        text = await get(client, "/groups")
        assert weird not in text and "&lt;img src=x onerror=alert(1)&gt;/&quot;g&quot;" in text
        href = "/groups/%3Cimg%20src%3Dx%20onerror%3Dalert%281%29%3E%2F%22g%22"
        assert f'<a href="{href}">' in text
        text = await get(client, href)
        assert weird not in text and "Group &lt;img" in text
        assert "<td class=num>0</td><td class=num>2</td><td class=num>4</td><td class=num>2</td>" in text

    run(broker, check)


def test_help_lists_the_console_and_other_verbs_do_not_load_aiohttp() -> None:
    code = ("import sys\nfrom logstore.cli import main\n"
            "try:\n    main(['--help'], prog_name='logstore')\nexcept SystemExit as e:\n    assert e.code == 0\n"
            "print('aiohttp loaded' if 'aiohttp' in sys.modules else 'aiohttp not loaded')")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=50)
    assert out.returncode == 0, out.stderr
    assert "  console " in out.stdout and "web console" in out.stdout
    assert out.stdout.strip().endswith("aiohttp not loaded")
