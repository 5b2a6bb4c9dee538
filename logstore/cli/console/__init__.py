"""``logstore console``: a web console for a broker or a cluster, served by a small aiohttp app.

Server-rendered HTML (no JavaScript build, no script at all: pages reload
themselves with a meta refresh), read-only, talking to the cluster only
through the public clients:

* ``/`` brokers and cluster health, ``/topics`` and ``/topics/NAME``
  (partitions with leader, ISR, size, log start/end, LSO, records/s),
  ``/topics/NAME/messages`` (the message browser), ``/groups`` and
  ``/groups/ID`` (members, assignment, lag and a lag-over-time chart),
  ``/jobs`` (the scheduler's last runs) — see :mod:`.pages`;
* rates and lag history come from the console's own samples every
  ``--sample-interval`` seconds (:mod:`.sampler`), kept in memory;
* HTML escaping is the default for everything (:mod:`.html`).

Security: the console reaches a TLS or SASL broker with the same ``--command-config``
file and ``LOGSTORE_*`` settings as every other verb. It serves loopback only unless
``--allow-remote`` is given, and then only with a login (``--login-token-file``: HTTP
basic with the token as the password, or a Bearer token) over HTTPS (``--tls-cert``,
``--tls-key``); every answer carries nosniff, a no-script CSP and ``X-Frame-Options``
(:func:`.app.guard`).

Modules: :mod:`.app` (the aiohttp app and server), :mod:`.pages`,
:mod:`.browse` (message browser), :mod:`.sampler`, :mod:`.jobs_status`,
:mod:`.html`.

Thread-safety: a command-line entry point.
"""

from __future__ import annotations

import asyncio
import ipaddress
import ssl
from pathlib import Path

import click

from logstore.cli.common import bootstrap_option, cli_errors
from logstore.cli_api.security_options import cli_security
from logstore.client.bootstrap import parse_bootstrap_list
from logstore.errors import InvalidConfigError

__all__ = ["console", "is_loopback", "read_login_token"]

_MIN_TOKEN_CHARS = 16


def is_loopback(host: str) -> bool:
    """Whether ``host`` names only this machine (``localhost``, 127.0.0.0/8, ``::1``)."""
    if host.strip().lower() == "localhost":
        return True
    try:
        return ipaddress.ip_address(host.strip("[]")).is_loopback
    except ValueError:
        return False  # a host name: it may resolve to any interface


def read_login_token(path: Path) -> str:
    """The console's login token: the file's first line, at least 16 characters."""
    try:
        token = path.read_text(encoding="utf-8").strip().splitlines()[0:1]
    except OSError as e:
        raise InvalidConfigError(f"--login-token-file: cannot read {path}: {e.strerror}") from None
    if not token or len(token[0].strip()) < _MIN_TOKEN_CHARS:
        raise InvalidConfigError(f"--login-token-file {path}: the token must be at least {_MIN_TOKEN_CHARS} "
                                 "characters on the first line (e.g. the output of: openssl rand -hex 24)")
    return token[0].strip()


def _tls_context(cert: Path, key: Path) -> ssl.SSLContext:
    context = ssl.create_default_context(ssl.Purpose.CLIENT_AUTH)
    try:
        context.load_cert_chain(str(cert), str(key))
    except (OSError, ssl.SSLError) as e:
        raise InvalidConfigError(f"--tls-cert {cert} / --tls-key {key}: cannot load the certificate and "
                                 f"its key ({e}); they must be PEM files of one key pair") from None
    return context


@click.command()
@click.option("--port", type=click.IntRange(0, 65535), default=8080, show_default=True,
              help="HTTP port of the console (0: any free port, printed at start).")
@click.option("--host", default="127.0.0.1", show_default=True,
              help="Address to listen on; not loopback only with --allow-remote.")
@click.option("--allow-remote", is_flag=True,
              help="Listen on a non-loopback address; needs --login-token-file, --tls-cert and --tls-key.")
@click.option("--login-token-file", type=click.Path(dir_okay=False, path_type=Path), default=None, metavar="FILE",
              help="Require this token (first line of FILE): HTTP basic with it as the password, or Bearer.")
@click.option("--tls-cert", type=click.Path(dir_okay=False, path_type=Path), default=None, metavar="PEM",
              help="Serve HTTPS with this certificate (with --tls-key).")
@click.option("--tls-key", type=click.Path(dir_okay=False, path_type=Path), default=None, metavar="PEM",
              help="The private key of --tls-cert.")
@click.option("--sample-interval", type=click.FloatRange(min=0.1), default=2.0, show_default=True,
              metavar="SECONDS", help="How often to sample end offsets and group lag (rates, lag chart).")
@click.option("--history", type=click.IntRange(min=2), default=300, show_default=True,
              help="Samples kept per group and partition (in memory).")
@click.option("--refresh", type=click.FloatRange(min=0), default=10.0, show_default=True, metavar="SECONDS",
              help="Pages reload themselves this often (0: never).")
@click.option("--jobs-status", type=click.Path(dir_okay=False, path_type=Path), default=None, metavar="FILE",
              help="The scheduler's status file (status_file in jobs.toml), shown at /jobs.")
@bootstrap_option
@cli_errors
def console(port: int, host: str, allow_remote: bool, login_token_file: Path | None, tls_cert: Path | None,
            tls_key: Path | None, sample_interval: float, history: int, refresh: float,
            jobs_status: Path | None, bootstrap: str) -> None:
    """Serve a web console for the cluster: brokers, topics, messages, groups (lag charts), jobs."""
    from logstore.cli.console.app import make_app, serve  # aiohttp only when the console runs

    parse_bootstrap_list(bootstrap)  # a malformed address is one line, before binding anything
    if (tls_cert is None) != (tls_key is None):
        raise InvalidConfigError("--tls-cert and --tls-key go together")
    if not is_loopback(host):
        if not allow_remote:
            raise InvalidConfigError(f"--host {host} is not a loopback address: the console would be open to the "
                                     "network; add --allow-remote with --login-token-file, --tls-cert and --tls-key")
        if login_token_file is None or tls_cert is None:
            raise InvalidConfigError("--allow-remote needs a login over HTTPS: --login-token-file, --tls-cert "
                                     "and --tls-key")
    token = read_login_token(login_token_file) if login_token_file is not None else None
    context = _tls_context(tls_cert, tls_key) if tls_cert is not None and tls_key is not None else None
    security = cli_security()

    async def main() -> None:
        app = make_app(bootstrap, sample_interval_s=sample_interval, history=history,
                       jobs_status=jobs_status, refresh_s=refresh or None, security=security,
                       login_token=token)
        await serve(app, host=host, port=port, announce=lambda line: click.echo(line, err=False),
                    ssl_context=context)

    asyncio.run(main())
