"""The web console against a real 3-broker cluster on etcd (logstore/dev/local_cluster.py).

The same pages as ``tests/cli/test_console.py``, where a cluster differs: three
brokers and the active controller on ``/``, replicas and ISR per partition,
messages read from each partition's leader, a group's lag, and a killed
broker showing as under-replicated partitions and gone from the brokers.
"""

from __future__ import annotations

import asyncio
import re
import time
from collections.abc import Iterator
from typing import Any

import pytest
from aiohttp.test_utils import TestClient, TestServer

from logstore import Admin, Consumer, NewTopic, Producer, TopicPartition
from logstore.cli.console.app import make_app
from logstore.dev.local_cluster import LocalCluster

pytestmark = pytest.mark.timeout(180)


@pytest.fixture(scope="module")
def cluster() -> Iterator[LocalCluster]:
    c = LocalCluster(3, session_timeout_ms=2000, replica_lag_time_max_ms=2000).start_all()
    try:
        with Admin(c.bootstrap) as admin:
            admin.create_topics([NewTopic("web", 2, replication_factor=3)])
        with Producer(c.bootstrap, acks="all") as producer:
            for i in range(10):
                producer.send("web", {"n": i}, partition=i % 2)
            producer.flush()
        with Consumer(c.bootstrap, group_id="web-readers") as consumer:
            consumer.commit({TopicPartition("web", 0): 2, TopicPartition("web", 1): 5})
        yield c
    finally:
        c.close(graceful=False)  # SIGKILL: what the console shows is checked; a graceful stop takes 11 s


async def _get(client: TestClient[Any, Any], path: str) -> str:
    resp = await client.get(path)
    text = await resp.text()
    assert resp.status == 200, (path, resp.status, text[:500])
    return text


def _card(text: str, name: str) -> str:
    found = re.search(rf'id="card-{name}"><b class="[a-z]*">([^<]*)</b>', text)
    assert found, name
    return found.group(1)


def test_console_on_a_cluster(cluster: LocalCluster) -> None:
    with Admin(cluster.bootstrap) as admin:
        md = admin.describe_cluster()
    controller = md.controller_id
    victim = next(n for n in (1, 2, 3) if n != controller)

    async def main() -> None:
        app = make_app(cluster.bootstrap, sample_interval_s=0.5)
        async with TestClient(TestServer(app)) as client:
            text = await _get(client, "/")
            assert _card(text, "brokers") == "3" and _card(text, "controller") == f"node {controller}"
            assert _card(text, "under-replicated") == "0" and _card(text, "offline-partitions") == "0"
            for node in (1, 2, 3):
                assert cluster.address(node) in text
            text = await _get(client, "/topics/web")
            for p in md.topics["web"].partitions:  # leader, replicas and ISR as the admin client has them
                assert (f"<td class=num>{p.partition}</td><td class=num>{p.leader}</td>"
                        f"<td>{','.join(map(str, p.replicas))}</td>") in text
                assert len(p.replicas) == 3
            # log start, HWM, LSO, LEO: the leaders' (a follower's Metadata answer says HWM 0)
            assert text.count("<td class=num>0</td><td class=num>5</td><td class=num>5</td>"
                              "<td class=num>5</td>") == 2
            text = await _get(client, "/topics/web/messages?partition=1&offset=0")
            assert "&quot;n&quot;: 1" in text and "&quot;n&quot;: 9" in text and "&quot;n&quot;: 0" not in text
            text = await _get(client, "/groups/web-readers")
            assert _card(text, "total-lag") == "3"  # 5 records each: (5 - 2) + (5 - 5)
            cluster.kill(victim)  # the last step: the module's cluster is not used after this test
            deadline = time.monotonic() + 60
            while True:
                text = await _get(client, "/")
                if _card(text, "under-replicated") != "0" and _card(text, "brokers") == "2":
                    break
                assert time.monotonic() < deadline, "the killed broker never showed"
                await asyncio.sleep(0.5)
            assert 'id="under-replicated"' in text and "/topics/web" in text
            assert cluster.address(victim) not in text.split('id="brokers"')[1].split("</table>")[0]

    asyncio.run(main())
