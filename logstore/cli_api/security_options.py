"""How a CLI verb learns the client's security: ``--command-config FILE`` and ``LOGSTORE_*``.

Every verb that talks to a broker takes ``--command-config FILE`` (the flag of
Kafka's tools, added by :func:`~logstore.cli_api.bootstrap_option`): a Java
properties file of ``key=value`` (or ``key: value``) lines, ``#``/``!``
comments, with the dotted names of Kafka's clients::

    security.protocol=SASL_SSL
    ssl.ca.location=certs/ca.pem            # or ssl.truststore.location, ssl.cafile
    ssl.certificate.location=certs/alice.pem
    ssl.key.location=certs/alice.key
    sasl.mechanism=SCRAM-SHA-256
    sasl.username=alice
    sasl.password=alice-secret
    # Java's form is understood too:
    # sasl.jaas.config=org.apache.kafka.common.security.scram.ScramLoginModule required \
    #     username="alice" password="alice-secret";
    # and so are a Java client's stores (PKCS12 or PEM; JKS: convert with keytool):
    # ssl.truststore.location=certs/truststore.p12
    # ssl.truststore.type=PKCS12
    # ssl.truststore.password=...
    # ssl.keystore.location=certs/alice.p12
    # ssl.keystore.type=PKCS12
    # ssl.keystore.password=...
    # ssl.key.password=...
    # ssl.endpoint.identification.algorithm=https   # empty: do not check the broker's host name

Without the file (or for keys it leaves out) the environment is read:
``LOGSTORE_SECURITY_PROTOCOL``, ``LOGSTORE_SSL_CAFILE``, ``LOGSTORE_SSL_CERTFILE``,
``LOGSTORE_SSL_KEYFILE``, ``LOGSTORE_SASL_MECHANISM``, ``LOGSTORE_SASL_USERNAME``,
``LOGSTORE_SASL_PASSWORD``. The file wins over the environment. Relative paths in
the file are relative to the working directory (as Kafka's tools read them). A key
the file does not know is ``error: [INVALID_CONFIG] ...`` naming it and the line.
Passwords never go on the command line (they would show in ``ps`` and shell history).

Thread-safety: reads the process environment and the current click context.
"""

from __future__ import annotations

import os
import re
from collections.abc import Mapping
from typing import Any

import click

from logstore.client.security import SECURITY_OPTION_NAMES, ClientSecurity, security_from_options
from logstore.errors import InvalidConfigError

__all__ = ["ENV_NAMES", "cli_security", "command_config_option", "read_command_config", "security_from_env"]

# kafka-python name -> environment variable.
ENV_NAMES = {
    "security_protocol": "LOGSTORE_SECURITY_PROTOCOL",
    "ssl_cafile": "LOGSTORE_SSL_CAFILE",
    "ssl_certfile": "LOGSTORE_SSL_CERTFILE",
    "ssl_keyfile": "LOGSTORE_SSL_KEYFILE",
    "sasl_mechanism": "LOGSTORE_SASL_MECHANISM",
    "sasl_plain_username": "LOGSTORE_SASL_USERNAME",
    "sasl_plain_password": "LOGSTORE_SASL_PASSWORD",
}
_META_KEY = "logstore.command_config"
_DOTTED = {syn: name for name, syns in SECURITY_OPTION_NAMES.items() for syn in syns}
_JAAS_VALUE = re.compile(r'\b(username|password)\s*=\s*"((?:\\.|[^"\\])*)"')


def read_command_config(path: str) -> dict[str, str]:
    """The security options (kafka-python names) of the properties file ``path``."""
    try:
        with open(path, encoding="utf-8") as f:
            text = f.read()
    except OSError as e:
        raise InvalidConfigError(f"--command-config: cannot read {path}: {e.strerror}") from None
    out: dict[str, str] = {}
    logical = re.sub(r"\\\n\s*", "", text)  # properties continuation lines
    for number, raw in enumerate(logical.splitlines(), 1):
        line = raw.strip()
        if not line or line.startswith(("#", "!")):
            continue
        m = re.match(r"([^=:\s]+)(?:\s*[=:]\s*|\s+)(.*)$", line)
        if m is None:  # the line is not echoed: it may hold a password
            raise InvalidConfigError(f"--command-config {path} line {number} is not key=value")
        key, value = m.group(1), m.group(2)
        if key == "sasl.jaas.config":
            for field, found in _JAAS_VALUE.findall(value):
                out["sasl_plain_username" if field == "username" else "sasl_plain_password"] = found
            continue
        name = _DOTTED.get(key) or (key if key in SECURITY_OPTION_NAMES else None)
        if name is None:
            raise InvalidConfigError(f"--command-config {path} line {number}: unknown key {key!r} (known: "
                                     f"{', '.join(sorted(_DOTTED))}, sasl.jaas.config)")
        out[name] = value
    return out


def security_from_env(environ: Mapping[str, str] | None = None) -> dict[str, str]:
    """The security options (kafka-python names) set by ``LOGSTORE_*`` variables."""
    env = os.environ if environ is None else environ
    return {name: env[var] for name, var in ENV_NAMES.items() if env.get(var)}


def _remember(ctx: click.Context, _param: click.Parameter, value: str | None) -> None:
    if value is not None:
        ctx.meta[_META_KEY] = value


def command_config_option(fn: Any) -> Any:
    """``--command-config FILE`` (see the module docstring); read by :func:`cli_security`."""
    return click.option(
        "--command-config", type=click.Path(dir_okay=False), default=None, expose_value=False,
        callback=_remember, is_eager=True, metavar="FILE",
        help="Client security properties (security.protocol, ssl.*, sasl.*), as Kafka's tools; "
             "else LOGSTORE_SECURITY_PROTOCOL, LOGSTORE_SSL_* and LOGSTORE_SASL_* are read.",
    )(fn)


def cli_security(environ: Mapping[str, str] | None = None) -> ClientSecurity | None:
    """The running verb's client security: its ``--command-config`` file over ``LOGSTORE_*``."""
    options: dict[str, Any] = security_from_env(environ)
    ctx = click.get_current_context(silent=True)
    path = ctx.meta.get(_META_KEY) if ctx is not None else None
    if path:
        options.update(read_command_config(path))
    return security_from_options(options)
