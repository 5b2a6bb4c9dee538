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
Content-Security-Policy that allows no script, no frame and nothing from elsewhere.

Every error is an HTML page in the console's style (:func:`error_response`) with the
status as its title and a sentence that says what was wrong, never repeating the
request's raw input: 400 (a bad query parameter, or a request that is not HTTP at all,
which aiohttp answers before any page runs: :class:`ConsoleRunner` gives that answer
the console's page too), 401 (login required), 404 (unknown page, topic or group),
405, and 500 (a page failed: the error's type on the page, the traceback in the log).

Thread-safety: everything runs on one event loop; blocking client calls go to
worker threads.
"""

from __future__ import annotations

import asyncio
import base64
import binascii
import contextlib
import hmac
import logging
import signal
import ssl
from collections.abc import AsyncIterator, Awaitable, Callable
from http import HTTPStatus
from pathlib import Path
from typing import Any

from aiohttp import web
from aiohttp.typedefs import Middleware
from aiohttp.web_protocol import RequestHandler

from logstore.cli.console.html import Markup, esc, page
from logstore.cli.console.pages import STATE, ConsoleState, routes
from logstore.cli.console.sampler import Sampler
from logstore.client.admin import Admin
from logstore.client.security import ClientSecurity

__all__ = ["ConsoleRunner", "error_response", "make_app", "serve", "guard", "SECURITY_HEADERS"]

log = logging.getLogger("logstore.console")

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


def error_response(status: int, said: str, *, bootstrap: str = "") -> web.Response:
    """The error page: ``status`` and its reason as the title, ``said`` (escaped) under it, the
    console's header, style and security headers."""
    reason = HTTPStatus(status).phrase
    body = Markup(f"<p class=bad id=error>{esc(said)}</p>"
                  '<p class=muted><a href="/">Back to the cluster overview</a></p>')
    text = page(f"{status} {reason}", body, active="", bootstrap=bootstrap)
    return web.Response(text=str(text), status=status, content_type="text/html", charset="utf-8",
                        headers=SECURITY_HEADERS)


def guard(token: str | None) -> Middleware:
    """The middleware of the module docstring: login (when ``token``), headers, error pages."""

    @web.middleware
    async def middleware(request: web.Request, handler: _Handler) -> web.StreamResponse:
        state = request.app[STATE]
        if token is not None and not _logged_in(request, token):
            response: web.StreamResponse = error_response(
                401, "login required: the console's login token, as the password of HTTP basic "
                     "(any user name) or as a Bearer token", bootstrap=state.bootstrap)
            response.headers["WWW-Authenticate"] = _REALM
        else:
            try:
                response = await handler(request)
            except web.HTTPException as e:
                if e.status < 400:
                    raise
                # e.text is ours (the page's own words, never the raw request); escaped anyway.
                said = e.text if e.text and not e.text.startswith(f"{e.status}:") else e.reason
                response = error_response(e.status, said, bootstrap=state.bootstrap)
            except Exception as e:  # a page failed: the page says so, the log has the traceback
                log.exception("console: %s %s failed", request.method, request.path)
                response = error_response(
                    500, f"the console failed while answering ({type(e).__name__}); its log has the details",
                    bootstrap=state.bootstrap)
        response.headers.update(SECURITY_HEADERS)
        return response

    return middleware


class _ErrorPageHandler(RequestHandler):
    """aiohttp's connection handler, answering the errors it meets before any page runs (a
    request that is not HTTP: 400) with the console's error page. aiohttp's own answer is
    plain text that repeats the raw request line."""

    def handle_error(self, request: Any, status: int = 500, exc: BaseException | None = None,
                     message: str | None = None) -> web.StreamResponse:
        super().handle_error(request, status, exc, message)  # logs it; raises if an answer was sent
        said = ("the request is not valid HTTP, so the console did not read it" if status == 400
                else "the console could not answer this request; its log has the details")
        response = error_response(status, said)
        response.force_close()
        return response


class _ErrorPageServer(web.Server):
    def __call__(self) -> RequestHandler:
        return _ErrorPageHandler(self, loop=self._loop, **self._kwargs)


class ConsoleRunner(web.AppRunner):
    """An :class:`aiohttp.web.AppRunner` whose connections answer HTTP-level errors with the
    console's error page (:class:`_ErrorPageHandler`)."""

    async def _make_server(self) -> web.Server:
        server = await super()._make_server()
        server.__class__ = _ErrorPageServer  # the app's own Server, handing out the handler above
        return server


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
    runner = ConsoleRunner(app, handle_signals=False, access_log=None)
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
