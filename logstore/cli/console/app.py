"""The console's aiohttp application and server: :func:`make_app` and :func:`serve`.

:func:`make_app` wires the pages (:mod:`.pages`) to one shared
:class:`~logstore.client.admin.Admin` and a :class:`~.sampler.Sampler` that
starts with the app (first sample at once, then every interval) and stops
with it; the admin client is closed on cleanup. :func:`serve` binds the HTTP
port (0: any free one), prints one line with the address, and runs until
SIGINT or SIGTERM, then shuts down (stops sampling, closes connections) and
returns.

Every answer goes through :func:`guard` (an aiohttp middleware): with a login token
set, a request without it gets 401 (HTTP basic, any user name and the token as the
password, or ``Authorization: Bearer TOKEN``), compared in constant time; every
answer carries ``X-Content-Type-Options: nosniff``, ``X-Frame-Options: DENY`` and a
Content-Security-Policy that allows no script, no frame and nothing from elsewhere;
HTTP errors (unknown page, bad query parameter) are HTML pages that say what was
wrong without repeating the request's raw input.

Thread-safety: everything runs on one event loop; blocking client calls go to
worker threads.
"""

from __future__ import annotations

import asyncio
import base64
import binascii
import contextlib
import hmac
import signal
import ssl
from collections.abc import AsyncIterator, Awaitable, Callable
from pathlib import Path

from aiohttp import web
from aiohttp.typedefs import Middleware

from logstore.cli.console.html import Markup, esc
from logstore.cli.console.pages import STATE, ConsoleState, render, routes
from logstore.cli.console.sampler import Sampler
from logstore.client.admin import Admin
from logstore.client.security import ClientSecurity

__all__ = ["make_app", "serve", "guard", "SECURITY_HEADERS"]

# No script, no plugin, no frame, nothing fetched from elsewhere: pages are server-rendered
# HTML with one inline <style> and inline SVG charts, and the browser form submits here.
SECURITY_HEADERS = {
    "X-Content-Type-Options": "nosniff",
    "X-Frame-Options": "DENY",
    "Content-Security-Policy": ("default-src 'none'; style-src 'unsafe-inline'; img-src 'self' data:; "
                                "form-action 'self'; frame-ancestors 'none'; base-uri 'none'"),
    "Referrer-Policy": "no-referrer",
}
_REALM = 'Basic realm="logstore console", charset="UTF-8"'
_Handler = Callable[[web.Request], Awaitable[web.StreamResponse]]


def _logged_in(request: web.Request, token: str) -> bool:
    """Whether the request carries ``token`` (Bearer, or as the password of HTTP basic)."""
    header = request.headers.get("Authorization", "")
    scheme, _, value = header.partition(" ")
    given = ""
    if scheme.lower() == "bearer":
        given = value.strip()
    elif scheme.lower() == "basic":
        try:
            given = base64.b64decode(value.strip(), validate=True).decode("utf-8").partition(":")[2]
        except (binascii.Error, UnicodeDecodeError):
            return False
    return hmac.compare_digest(given.encode(), token.encode())


def guard(token: str | None) -> Middleware:
    """The middleware of the module docstring: login (when ``token``), headers, error pages."""

    @web.middleware
    async def middleware(request: web.Request, handler: _Handler) -> web.StreamResponse:
        if token is not None and not _logged_in(request, token):
            response: web.StreamResponse = web.Response(
                status=401, text="login required", headers={"WWW-Authenticate": _REALM})
        else:
            try:
                response = await handler(request)
            except web.HTTPException as e:
                if e.status < 400:
                    raise
                state = request.app[STATE]
                # e.text is ours (the page's own words, never the raw request); escaped anyway.
                said = e.text if e.text and not e.text.startswith(f"{e.status}:") else e.reason
                body = Markup(f"<p class=bad id=error>{esc(said)}</p>")
                response = render(state, f"{e.status} {e.reason}", body, active="", status=e.status)
        response.headers.update(SECURITY_HEADERS)
        return response

    return middleware


def make_app(bootstrap: str, *, sample_interval_s: float = 2.0, history: int = 300,
             jobs_status: Path | None = None, refresh_s: float | None = 10.0,
             security: ClientSecurity | None = None, login_token: str | None = None) -> web.Application:
    """The console for the cluster at ``bootstrap`` (see the module docstring); ``security`` is
    the clients' (TLS, SASL), ``login_token`` the console's own login (None: no login)."""
    admin = Admin(bootstrap, security=security)
    sampler = Sampler(admin, interval_s=sample_interval_s, history=history)
    app = web.Application(middlewares=[guard(login_token)])
    app[STATE] = ConsoleState(admin=admin, sampler=sampler, bootstrap=admin.bootstrap,
                              jobs_status=jobs_status, refresh_s=refresh_s, security=security)
    app.add_routes(routes)

    async def lifecycle(app: web.Application) -> AsyncIterator[None]:
        await sampler.sample_once()
        sampler.start()
        try:
            yield
        finally:
            await sampler.stop()
            await asyncio.to_thread(admin.close)

    app.cleanup_ctx.append(lifecycle)
    return app


async def serve(app: web.Application, *, host: str, port: int,
                announce: Callable[[str], None] = print, ssl_context: ssl.SSLContext | None = None) -> None:
    """Serve ``app`` on ``host:port`` (HTTPS with ``ssl_context``) until SIGINT/SIGTERM;
    ``announce`` gets the one line ``console: http(s)://HOST:PORT/ (broker BOOTSTRAP)`` once
    the port is bound."""
    runner = web.AppRunner(app, handle_signals=False, access_log=None)
    await runner.setup()
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGINT, signal.SIGTERM):
        with contextlib.suppress(NotImplementedError, RuntimeError):
            loop.add_signal_handler(sig, stop.set)
    try:
        site = web.TCPSite(runner, host, port, ssl_context=ssl_context)
        await site.start()
        bound = runner.addresses[0][1] if runner.addresses else port
        scheme = "https" if ssl_context is not None else "http"
        announce(f"console: {scheme}://{host}:{bound}/ (broker {app[STATE].bootstrap})")
        await stop.wait()
    finally:
        await runner.cleanup()
