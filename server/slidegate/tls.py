"""gRPC server TLS (and mutual TLS) whose certificate files are re-read when they change, without a restart; with
mutual TLS, optionally only for clients whose certificate names a given SAN (GRPC_CLIENT_TLS_SAN)."""

from __future__ import annotations

import inspect
import ipaddress
import logging
import os
import ssl
from collections.abc import AsyncIterator, Awaitable, Callable, Iterable
from pathlib import Path
from typing import TYPE_CHECKING, Any

import grpc

from slidegate.logs import Repeated

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


def names_san(wanted: str, dns_names: Iterable[str], addresses: Iterable[str]) -> bool:
    """Whether a certificate whose DNS SANs are ``dns_names`` and IP SANs ``addresses`` carries ``wanted``, as
    envoyproxy/ratelimit's GRPC_CLIENT_TLS_SAN checks it (Go's host name verification): an IP address against the
    IP SANs, a host name against the DNS SANs, ignoring case and a final dot, a certificate's leftmost ``*`` label
    standing for any one label (``*.example.com`` names ``a.example.com``, not ``example.com`` nor
    ``a.b.example.com``). The common name is not looked at (nor by Go)."""
    try:
        wanted_address = ipaddress.ip_address(wanted.strip("[]"))
    except ValueError:
        wanted_address = None
    if wanted_address is not None:
        for text in addresses:
            try:
                if ipaddress.ip_address(text) == wanted_address:
                    return True
            except ValueError:
                continue
        return False
    host = wanted.lower().removesuffix(".").split(".")
    for name in dns_names:
        pattern = name.lower().removesuffix(".").split(".")
        # a "*" alone would name every one-label host: a wildcard needs a domain under it
        if len(pattern) != len(host) or "" in pattern or pattern == ["*"]:
            continue
        if all(p == h or (i == 0 and p == "*") for i, (p, h) in enumerate(zip(pattern, host, strict=True))):
            return True
    return False


Behavior = Callable[[Any, grpc.aio.ServicerContext[Any, Any]], Any]
# grpc-stubs makes the interceptor generic; grpcio's class cannot be subscripted
if TYPE_CHECKING:
    Interceptor = grpc.aio.ServerInterceptor[Any, Any]
else:
    Interceptor = grpc.aio.ServerInterceptor
# (request streaming, response streaming) -> the handler's attribute and the function that makes one
_KINDS = {(False, False): ("unary_unary", grpc.unary_unary_rpc_method_handler),
          (False, True): ("unary_stream", grpc.unary_stream_rpc_method_handler),
          (True, False): ("stream_unary", grpc.stream_unary_rpc_method_handler),
          (True, True): ("stream_stream", grpc.stream_stream_rpc_method_handler)}


class ClientSanCheck(Interceptor):
    """Refuse every call (UNAUTHENTICATED) whose client certificate does not carry ``san`` (see names_san): the
    reference checks it in the TLS handshake, which grpcio offers no hook into, so here each call's peer is
    checked before its handler runs, for every service of the server (rate limit, health, reflection). Handlers
    must be coroutines or async generators, as grpc.aio's are."""

    def __init__(self, san: str) -> None:
        self._san = san
        self._refused = Repeated(log, f"a client certificate without the SAN {san!r} (GRPC_CLIENT_TLS_SAN) was "
                                      "refused: %s")

    def allowed(self, context: grpc.aio.ServicerContext[Any, Any]) -> bool:
        """Whether the call's client certificate carries the SAN; a refusal is logged (at most every 10 s)."""
        properties = context.auth_context()
        dns = [v.decode(errors="replace") for v in properties.get("peer_dns", [])]
        addresses = [v.decode(errors="replace") for v in properties.get("peer_ip", [])]
        if names_san(self._san, dns, addresses):
            return True
        self._refused(f"{context.peer()} named {', '.join(dns + addresses) or 'no DNS or IP SAN'}")
        return False

    async def _refuse(self, context: grpc.aio.ServicerContext[Any, Any]) -> None:
        await context.abort(grpc.StatusCode.UNAUTHENTICATED,
                            "the client certificate does not carry the SAN this server requires")

    async def intercept_service(
        self, continuation: Callable[[grpc.HandlerCallDetails], Awaitable[grpc.RpcMethodHandler[Any, Any]]],
        handler_call_details: grpc.HandlerCallDetails,
    ) -> grpc.RpcMethodHandler[Any, Any]:
        handler = await continuation(handler_call_details)
        if handler is None:  # no such method: gRPC answers UNIMPLEMENTED
            return handler
        name, make = _KINDS[handler.request_streaming, handler.response_streaming]
        inner: Behavior = getattr(handler, name)
        guarded: grpc.RpcMethodHandler[Any, Any] = make(
            self._guarded(inner), request_deserializer=handler.request_deserializer,
            response_serializer=handler.response_serializer)
        return guarded

    def _guarded(self, inner: Behavior) -> Behavior:
        # the same kind of function as the handler's: grpc.aio streams an async generator's items, and lets a
        # coroutine write its own (the health service's Watch does)
        if inspect.isasyncgenfunction(inner):
            async def stream(request: Any, context: grpc.aio.ServicerContext[Any, Any]) -> AsyncIterator[Any]:
                if not self.allowed(context):
                    await self._refuse(context)
                async for item in inner(request, context):
                    yield item

            return stream

        async def call(request: Any, context: grpc.aio.ServicerContext[Any, Any]) -> Any:
            if not self.allowed(context):
                await self._refuse(context)
            return await inner(request, context)

        return call
