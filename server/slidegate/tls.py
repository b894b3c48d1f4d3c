"""gRPC server TLS (and mutual TLS) whose certificate files are re-read when they change, without a restart."""

from __future__ import annotations

import logging
import os
import ssl
from pathlib import Path

import grpc

log = logging.getLogger(__name__)


def check(cert: str, key: str, client_ca: str = "") -> None:
    """Raise ValueError naming the setting unless the files hold a certificate, its key and (if given) CA
    certificates."""
    context = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
    try:
        context.load_cert_chain(cert, key)
    except (OSError, ssl.SSLError) as exc:
        raise ValueError(f"GRPC_SERVER_TLS_CERT/GRPC_SERVER_TLS_KEY ({cert}, {key}): {exc}") from exc
    if client_ca:
        try:
            context.load_verify_locations(client_ca)
        except (OSError, ssl.SSLError) as exc:
            raise ValueError(f"GRPC_CLIENT_TLS_CACERT ({client_ca}): {exc}") from exc


def server_credentials(cert: str, key: str, client_ca: str = "") -> grpc.ServerCredentials:
    """Credentials serving ``cert``/``key`` (PEM files); with ``client_ca`` clients must present a certificate
    it signed. The files are checked on every new connection and re-read when their modification time
    changes (files that are not usable then are logged and the certificate in use kept). Raises ValueError
    when the files are not usable at start."""
    files = [Path(p) for p in (cert, key, client_ca) if p]
    check(cert, key, client_ca)

    def stamp() -> tuple[float, ...]:
        return tuple(os.stat(p).st_mtime_ns for p in files)

    def configuration() -> grpc.ServerCertificateConfiguration:
        return grpc.ssl_server_certificate_configuration(
            [(Path(key).read_bytes(), Path(cert).read_bytes())],
            root_certificates=Path(client_ca).read_bytes() if client_ca else None,
        )

    seen = [stamp()]
    initial = configuration()

    def fetch() -> grpc.ServerCertificateConfiguration | None:
        # called by gRPC for each new handshake; None keeps the configuration in use
        try:
            now = stamp()
            if now == seen[0]:
                return None
            check(cert, key, client_ca)
            fresh = configuration()
        except (OSError, ValueError) as exc:
            log.error("TLS files not usable, keeping the certificate in use: %s", exc)
            return None
        seen[0] = now
        log.info("TLS certificate reloaded from %s", cert)
        return fresh

    # grpc-stubs says the fetcher must always return a configuration; gRPC's docs say None keeps the current one
    return grpc.dynamic_ssl_server_credentials(
        initial, fetch, require_client_authentication=bool(client_ca))  # type: ignore[arg-type]
