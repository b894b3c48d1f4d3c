"""The HTTP endpoints (aiohttp): ``POST /json`` (a RateLimitRequest in proto-JSON, answered with the
RateLimitResponse: 200 OK, 429 over limit, 400 bad request with the reason, 503 storage unavailable),
``GET /healthcheck``, ``GET /rlconfig`` (the loaded limits), ``GET /metrics`` (Prometheus) and ``GET /stats``
(every counter's total by its envoyproxy/ratelimit name, as the reference's debug port prints them)."""

from __future__ import annotations

import json
import logging
from collections.abc import Awaitable, Callable

from aiohttp import web
from aiohttp.http_exceptions import ContentEncodingError, HttpProcessingError
from aiohttp.web_protocol import RequestPayloadError
from google.protobuf import json_format

from slidegate._proto.envoy.service.ratelimit.v3 import rls_pb2
from slidegate.config import Config
from slidegate.config.describe import describe_config
from slidegate.decider import UNDECIDED, LimitRequest, Refused, refusal
from slidegate.health import Health
from slidegate.logs import Repeated
from slidegate.request import InvalidRequest, parse_request
from slidegate.service import RateLimitService
from slidegate.text import printable

JSON = "application/json"
# the HTTP status of each refusal (decider.refusal)
HTTP_STATUS = {Refused.INVALID_ARGUMENT: 400, Refused.UNAVAILABLE: 503, Refused.UNKNOWN: 500,
               Refused.DEADLINE_EXCEEDED: 504}
ROUTES = ("json", "explain", "healthcheck", "rlconfig", "metrics", "stats")
log = logging.getLogger(__name__)


def make_app(service: RateLimitService, config: Callable[[], Config], health: Health,
             routes: tuple[str, ...] = ROUTES, *, metrics_path: str = "/metrics") -> web.Application:
    """An application serving ``routes`` (names from ROUTES), the metrics at ``metrics_path``."""
    endpoints = _Endpoints(service, config, health)
    table = {"json": web.post("/json", endpoints.decide), "explain": web.post("/explain", endpoints.explain),
             "healthcheck": web.get("/healthcheck", endpoints.healthcheck),
             "rlconfig": web.get("/rlconfig", endpoints.rlconfig), "metrics": web.get(metrics_path, endpoints.metrics),
             "stats": web.get("/stats", endpoints.stats)}
    app = web.Application(middlewares=[_errors_as_json])
    app.add_routes([table[name] for name in routes])
    return app


class _Endpoints:
    """The handlers of the HTTP API, over one service, its config and its health."""

    def __init__(self, service: RateLimitService, config: Callable[[], Config], health: Health) -> None:
        self.service = service
        self.config = config
        self.health = health

    async def decide(self, request: web.Request) -> web.Response:
        read = await self._limit_request(request)
        if isinstance(read, web.Response):
            return read
        try:
            decision = await self.service.decider.decide(read)
        except UNDECIDED as exc:
            code, details = refusal(exc)
            return _error(details, HTTP_STATUS[code])
        status = 429 if decision.rejected else 200
        response = self.service.response(decision)
        # every field, zeros included: limitRemaining 0 is an answer, not an absent one
        text = json_format.MessageToJson(response, indent=None, always_print_fields_with_no_presence=True)
        return web.Response(text=text, status=status, content_type=JSON)

    async def explain(self, request: web.Request) -> web.Response:
        """What /json would answer now and why (slidegate.explain), the body read as /json reads it; nothing is
        counted, a malformed body neither: the client's error, answered 400 with its reason."""
        read = await self._limit_request(request, refusals_counted=False)
        if isinstance(read, web.Response):
            return read
        try:
            explanation = await self.service.decider.explain(read)
        except UNDECIDED as exc:
            code, details = refusal(exc)
            return _error(details, HTTP_STATUS[code])
        return web.json_response(explanation.as_json())

    async def _limit_request(self, request: web.Request, *,
                             refusals_counted: bool = True) -> LimitRequest | web.Response:
        """The request in the body (a RateLimitRequest in proto-JSON), or the error response that answers it;
        ``refusals_counted``: an invalid request is counted as a refused call (service_error), as /json's is."""
        if self.health.draining:
            return _error("shutting down", 503)
        if request.headers.get("Content-Encoding", "identity").strip().lower() not in ("", "identity"):
            return _error("compressed bodies are not accepted (Content-Encoding)", 415)
        decider = self.service.decider
        try:
            message = await _read_request(request)
            domain, descriptors = parse_request(message, decider.policy)
        except json.JSONDecodeError as exc:
            return _error(f"the body is not JSON: {exc}", 400)
        except InvalidRequest as exc:  # the reference's service_error, as over gRPC
            if refusals_counted:
                decider.refused(exc)
            return _error(str(exc), 400)
        except (json_format.ParseError, UnicodeDecodeError) as exc:
            return _error(str(exc), 400)
        except web.HTTPRequestEntityTooLarge as exc:  # every answer of /json is JSON
            return web.json_response({"error": exc.text}, status=exc.status)
        except web.HTTPException:
            raise
        except Exception as exc:  # a body aiohttp cannot read (bad encoding, bad compression): the client's fault
            return _error(f"unreadable body: {exc}", 400)
        return LimitRequest(domain, descriptors, message.hits_addend)

    async def healthcheck(self, _: web.Request) -> web.Response:
        serving = self.health.serving
        return web.Response(text="OK" if serving else "NOT SERVING", status=200 if serving else 503)

    async def rlconfig(self, _: web.Request) -> web.Response:
        # file names that are not UTF-8 arrive as surrogate escapes
        text = describe_config(self.config()).encode("utf-8", "surrogateescape").decode("utf-8", "replace")
        return web.Response(text=text)

    async def metrics(self, _: web.Request) -> web.Response:
        return web.Response(body=self.service.metrics.render(),
                            headers={"Content-Type": "text/plain; version=0.0.4; charset=utf-8"})

    async def stats(self, _: web.Request) -> web.Response:
        return web.Response(text=self.service.metrics.render_stats())


async def _read_request(request: web.Request) -> rls_pb2.RateLimitRequest:
    """The body of ``request``: a RateLimitRequest in proto-JSON. Raises
    json.JSONDecodeError, json_format.ParseError (a JSON value that is not a RateLimitRequest),
    UnicodeDecodeError, and aiohttp's errors reading the body."""
    body = (await request.read()).decode("utf-8")
    document = json.loads(body)
    if not isinstance(document, dict):
        kind = "null" if document is None else type(document).__name__
        raise json_format.ParseError(f"the body must be a JSON object (a RateLimitRequest), not {kind}")
    return json_format.Parse(body, rls_pb2.RateLimitRequest())  # again: it refuses repeated names


def _error(error: str, status: int) -> web.Response:
    return web.json_response({"error": error}, status=status)


@web.middleware
async def _errors_as_json(request: web.Request, handler: Callable[[web.Request], Awaitable[web.StreamResponse]],
                          ) -> web.StreamResponse:
    """Every error of the HTTP API is JSON, aiohttp's own too (405 for a GET of /json, 404)."""
    try:
        return await handler(request)
    except web.HTTPException as exc:
        if exc.status < 400:
            raise
        return web.json_response({"error": exc.reason}, status=exc.status, headers={
            k: v for k, v in exc.headers.items() if k.lower() == "allow"})


# a client's malformed request, answered 400 by aiohttp itself: one line now and then, never a traceback each
_malformed = Repeated(log, "malformed HTTP requests answered 400 (a request line or header too long, a bad "
                      "header …); the last: %s")


def _no_client_tracebacks(record: logging.LogRecord) -> bool:
    error = record.exc_info[1] if record.exc_info else None
    # a body that cannot be decoded (say a gzip header on plain text) is answered 400 by /json; aiohttp then
    # meets the same error again while draining the body and logs it as an unhandled exception
    if isinstance(error, RequestPayloadError | ContentEncodingError):
        return False
    if isinstance(error, HttpProcessingError):  # aiohttp logs each with its traceback (9 lines)
        first = error.message.splitlines()[0] if error.message else ""
        _malformed(f"{type(error).__name__} from {record.getMessage().rsplit(' ', 1)[-1]}: {printable(first[:120])}")
        return False
    return True


logging.getLogger("aiohttp.server").addFilter(_no_client_tracebacks)


async def start_app(app: web.Application, host: str | None, port: int, *,
                    reuse_port: bool = False) -> tuple[web.AppRunner, int]:
    """Serve ``app`` on ``host:port`` (host None: every address; shared with other processes with
    ``reuse_port``); return the runner (``await runner.cleanup()`` stops it) and the bound port. Raises OSError
    when the address cannot be bound."""
    # bodies are never inflated: aiohttp would do it on the event loop as they arrive, past the size limit (a 1 MB
    # gzip body of 1 GiB took 3 s, and every gRPC call waited, missing Envoy's deadline)
    runner = web.AppRunner(app, access_log=None, auto_decompress=False)
    await runner.setup()
    site = web.TCPSite(runner, host, port, reuse_port=reuse_port or None)
    try:
        await site.start()
    except OSError as exc:
        await runner.cleanup()
        raise OSError(f"cannot listen for HTTP on {host}:{port}: {exc}") from exc
    addresses = runner.addresses  # the listening sockets' own: port 0's choice
    bound = addresses[0][1] if addresses else port
    return runner, int(bound)
