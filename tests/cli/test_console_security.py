"""The web console's security (issue 22): it reaches a TLS broker with ``--command-config``,
serves only loopback unless told otherwise (and then only with a login over HTTPS), sends
headers that forbid script, framing and sniffing, and its error pages repeat no raw input."""

from __future__ import annotations

import asyncio
import base64
import ssl
import subprocess
import sys
import urllib.error
import urllib.request
from collections.abc import Awaitable, Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
from aiohttp.test_utils import TestClient, TestServer
from click.testing import CliRunner
from security_helpers import Certificates, tls_dir  # noqa: F401 - the fixture

from logstore import Admin, NewTopic
from logstore.broker.embedded import EmbeddedBroker
from logstore.cli import main
from logstore.cli.console.app import SECURITY_HEADERS, make_app

pytestmark = pytest.mark.timeout(90)

TOKEN = "0123456789abcdef-console-token"


@pytest.fixture(scope="module")
def broker() -> Iterator[EmbeddedBroker]:
    with EmbeddedBroker() as b:
        with Admin(b.bootstrap) as admin:
            admin.create_topics([NewTopic("orders", 1)])
        yield b


def run(broker: EmbeddedBroker, check: Callable[[TestClient[Any, Any]], Awaitable[None]], **kw: Any) -> None:
    async def go() -> None:
        app = make_app(broker.bootstrap, sample_interval_s=0.5, **kw)
        async with TestClient(TestServer(app)) as client:
            await check(client)

    asyncio.run(go())


def test_every_answer_has_the_security_headers_and_errors_repeat_no_input(broker: EmbeddedBroker) -> None:
    raw = '<script>alert("x")</script>'

    async def check(client: TestClient[Any, Any]) -> None:
        for path, status in (("/", 200), ("/topics", 200), ("/no-such-page", 404),
                             (f"/topics/orders/messages?offset={raw}", 400)):
            resp = await client.get(path)
            text = await resp.text()
            assert resp.status == status, (path, text[:300])
            for name, value in SECURITY_HEADERS.items():
                assert resp.headers.get(name) == value, (path, name)
            assert resp.headers["Content-Type"].startswith("text/html"), path
            assert "script" not in text.lower(), (path, text)  # neither the raw input nor its escape
        resp = await client.get("/topics/orders/messages?limit=abc")
        assert "the query parameter limit must be an integer" in await resp.text()

    run(broker, check)


def test_a_login_token_is_required_when_set(broker: EmbeddedBroker) -> None:
    basic = base64.b64encode(f"anyone:{TOKEN}".encode()).decode()
    wrong = base64.b64encode(b"anyone:guess").decode()

    async def check(client: TestClient[Any, Any]) -> None:
        for headers in ({}, {"Authorization": f"Basic {wrong}"}, {"Authorization": "Bearer guess"},
                        {"Authorization": "Basic !!!"}):
            resp = await client.get("/topics", headers=headers)
            assert resp.status == 401, headers
            assert resp.headers["WWW-Authenticate"].startswith("Basic realm=")
            assert resp.headers["X-Frame-Options"] == "DENY"
            assert "orders" not in await resp.text()
        for headers in ({"Authorization": f"Basic {basic}"}, {"Authorization": f"Bearer {TOKEN}"}):
            resp = await client.get("/topics", headers=headers)
            assert resp.status == 200 and "orders" in await resp.text(), headers

    run(broker, check, login_token=TOKEN)


@pytest.mark.parametrize(("args", "said"), [
    (["--host", "0.0.0.0"], "not a loopback address"),
    (["--host", "192.0.2.1", "--allow-remote"], "needs a login over HTTPS"),
    (["--host", "::", "--allow-remote", "--login-token-file", "TOKEN"], "needs a login over HTTPS"),
    (["--tls-cert", "x.pem"], "--tls-cert and --tls-key go together"),
    (["--login-token-file", "SHORT"], "at least 16 characters"),
])
def test_remote_binding_needs_allow_remote_and_a_login_over_https(tmp_path: Path, args: list[str], said: str) -> None:
    (tmp_path / "TOKEN").write_text(TOKEN + "\n")
    (tmp_path / "SHORT").write_text("short\n")
    args = [str(tmp_path / a) if a in ("TOKEN", "SHORT") else a for a in args]
    result = CliRunner().invoke(main, ["console", "-b", "127.0.0.1:1", "--port", "0", *args])
    assert result.exit_code != 0
    lines = result.output.strip().splitlines()
    assert len(lines) == 1 and "[INVALID_CONFIG]" in lines[0] and said in lines[0], result.output


def test_the_console_reaches_a_tls_broker_and_serves_https_with_a_login(
        tls_dir: Certificates, tmp_path: Path) -> None:  # noqa: F811
    with EmbeddedBroker(overrides={"tls_cert": tls_dir.server_cert, "tls_key": tls_dir.server_key}) as broker:
        with Admin(broker.bootstrap, security_protocol="SSL", ssl_cafile=tls_dir.ca) as admin:
            admin.create_topics([NewTopic("tls-orders", 1)])
        props = tmp_path / "client.properties"
        props.write_text(f"security.protocol=SSL\nssl.ca.location={tls_dir.ca}\n")
        token = tmp_path / "token"
        token.write_text(TOKEN)
        proc = subprocess.Popen(
            [sys.executable, "-c", "from logstore.cli import main; main()", "console", "-b", broker.bootstrap,
             "--port", "0", "--command-config", str(props), "--login-token-file", str(token),
             "--tls-cert", tls_dir.server_cert, "--tls-key", tls_dir.server_key],
            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
        try:
            assert proc.stdout is not None
            line = proc.stdout.readline()
            assert line.startswith("console: https://127.0.0.1:"), line + (proc.stderr.read() if proc.stderr else "")
            address = line.split()[1].replace("127.0.0.1", "localhost")  # the certificate's name
            context = ssl.create_default_context(cafile=tls_dir.ca)
            with pytest.raises(urllib.error.HTTPError) as refused:
                urllib.request.urlopen(address + "topics", timeout=10, context=context)
            assert refused.value.code == 401
            request = urllib.request.Request(address + "topics", headers={"Authorization": f"Bearer {TOKEN}"})
            with urllib.request.urlopen(request, timeout=10, context=context) as resp:
                assert b"tls-orders" in resp.read()
            proc.terminate()
            assert proc.wait(timeout=15) == 0
        finally:
            proc.kill()
            proc.wait()
