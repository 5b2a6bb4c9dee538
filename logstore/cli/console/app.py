"""The console's aiohttp application and server: :func:`make_app` and :func:`serve`.

:func:`make_app` wires the pages (:mod:`.pages`) to one shared
:class:`~logstore.client.admin.Admin` and a :class:`~.sampler.Sampler` that
starts with the app (first sample at once, then every interval) and stops
with it; the admin client is closed on cleanup. :func:`serve` binds the HTTP
port (0: any free one), prints one line with the address, and runs until
SIGINT or SIGTERM, then shuts down (stops sampling, closes connections) and
returns.

Thread-safety: everything runs on one event loop; blocking client calls go to
worker threads.
"""

from __future__ import annotations

import asyncio
import contextlib
import signal
from collections.abc import AsyncIterator, Callable
from pathlib import Path

from aiohttp import web

from logstore.cli.console.pages import STATE, ConsoleState, routes
from logstore.cli.console.sampler import Sampler
from logstore.client.admin import Admin

__all__ = ["make_app", "serve"]


def make_app(bootstrap: str, *, sample_interval_s: float = 2.0, history: int = 300,
             jobs_status: Path | None = None, refresh_s: float | None = 10.0) -> web.Application:
    """The console for the cluster at ``bootstrap`` (see the module docstring)."""
    admin = Admin(bootstrap)
    sampler = Sampler(admin, interval_s=sample_interval_s, history=history)
    app = web.Application()
    app[STATE] = ConsoleState(admin=admin, sampler=sampler, bootstrap=admin.bootstrap,
                              jobs_status=jobs_status, refresh_s=refresh_s)
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
                announce: Callable[[str], None] = print) -> None:
    """Serve ``app`` on ``host:port`` until SIGINT/SIGTERM; ``announce`` gets the one line
    ``console: http://HOST:PORT/ (broker BOOTSTRAP)`` once the port is bound."""
    runner = web.AppRunner(app, handle_signals=False, access_log=None)
    await runner.setup()
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGINT, signal.SIGTERM):
        with contextlib.suppress(NotImplementedError, RuntimeError):
            loop.add_signal_handler(sig, stop.set)
    try:
        site = web.TCPSite(runner, host, port)
        await site.start()
        bound = runner.addresses[0][1] if runner.addresses else port
        announce(f"console: http://{host}:{bound}/ (broker {app[STATE].bootstrap})")
        await stop.wait()
    finally:
        await runner.cleanup()
