"""The name a broker's certificate holds, for ``ssl.endpoint.identification.algorithm=`` (empty).

Kafka's empty value skips one check: that the broker's certificate names the host the
client connects to (a broker reached by an IP address or a load balancer's name, with
a certificate for its own host name). gRPC Python always makes that check and has no
switch for it; it can only check the certificate against another name
(``grpc.ssl_target_name_override``). :func:`certificate_name` learns that name: a TLS
handshake with Python's ``ssl`` that **verifies the certificate chain** against the
client's trusted CAs (not the host name), then the certificate's first DNS
subjectAltName (else its IP subjectAltName, else its common name). gRPC then verifies
the chain again and checks the name, so a certificate that no trusted CA signed is
refused as with ``https``. The client presents its certificate in this handshake too
(mTLS brokers would otherwise log a refused handshake); Python's ``ssl`` reads it from a
file, written for the call in a private temporary directory and removed at once.

It costs one extra handshake per broker address a client connects to, and only with
the empty value.

Thread-safety: a pure function (it opens and closes its own socket).
"""

from __future__ import annotations

import os
import socket
import ssl
import tempfile
from typing import Any

from logstore.errors import BrokerUnavailableError

__all__ = ["certificate_name"]


def certificate_name(address: str, trusted_pem: bytes | None, identity: tuple[bytes, bytes] | None = None, *,
                     timeout_s: float = 10.0) -> str:
    """The name in the certificate that the broker at ``address`` (``host:port``) presents,
    after verifying it against ``trusted_pem`` (the system's CAs when None); ``identity`` is the
    client's (key, certificate chain) as PEM, presented when given. Raises
    :class:`~logstore.errors.BrokerUnavailableError` when no verified handshake happens."""
    host, _, port = address.rpartition(":")
    host = host.strip("[]")
    context = ssl.create_default_context(cadata=trusted_pem.decode("ascii") if trusted_pem else None)
    context.check_hostname = False  # the point of the empty algorithm; the chain stays verified
    context.set_alpn_protocols(["h2"])
    if identity is not None:
        with tempfile.TemporaryDirectory(prefix="logstore-tls-") as private:  # mode 0700
            path = os.path.join(private, "client.pem")
            with open(os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600), "wb") as f:
                f.write(identity[0] + identity[1])
            context.load_cert_chain(path)
    try:
        with socket.create_connection((host, int(port)), timeout=timeout_s) as raw, \
                context.wrap_socket(raw, server_hostname=host) as tls:
            certificate: dict[str, Any] = tls.getpeercert() or {}
    except (OSError, ssl.SSLError) as e:
        raise BrokerUnavailableError(
            f"{address}: the TLS handshake that reads the broker's certificate name "
            f"(ssl.endpoint.identification.algorithm is empty) failed: {e}") from None
    alt_names: tuple[tuple[str, str], ...] = certificate.get("subjectAltName", ())
    for kind in ("DNS", "IP Address"):
        for k, value in alt_names:
            if k == kind:
                return value
    subject: tuple[tuple[tuple[str, str], ...], ...] = certificate.get("subject", ())
    for rdn in subject:
        for key, value in rdn:
            if key == "commonName":
                return value
    raise BrokerUnavailableError(f"{address}: the broker's certificate names no host (no subjectAltName, "
                                 "no common name)")
