"""ASGI middleware for Starlette, FastAPI and any ASGI app, with the options of slidegate.contrib.common as
keyword arguments (lower case)::

    app.add_middleware(SlidegateMiddleware, domain="web", target="127.0.0.1:8081", descriptors=[["client"]])

The user comes from ``scope["user"]`` (Starlette's AuthenticationMiddleware) when it is authenticated, or from
``get_user(scope)`` when given. Nothing blocks the event loop: remote mode uses the asyncio gRPC client.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable, MutableMapping
from typing import Any

from slidegate.client import AsyncRateLimitClient
from slidegate.contrib.common import (
    Options,
    RequestView,
    answer,
    applies,
    build_descriptors,
    client_ip,
    failure,
    log,
)
from slidegate.inprocess import InProcessLimiter

Scope = MutableMapping[str, Any]
Message = MutableMapping[str, Any]
Receive = Callable[[], Awaitable[Message]]
Send = Callable[[Message], Awaitable[None]]


def _scope_user(scope: Scope) -> str | None:
    """The authenticated user's ``identity`` (Starlette's BaseUser), else None."""
    user = scope.get("user")
    if user is None or not getattr(user, "is_authenticated", False):
        return None
    try:
        identity = user.identity
    except (AttributeError, NotImplementedError):  # BaseUser leaves identity to subclasses
        identity = getattr(user, "display_name", None)
    return str(identity) if identity else None


class SlidegateMiddleware:
    """Limits HTTP requests to ``app`` (see the module docstring); other scopes pass untouched."""

    def __init__(self, app: Callable[..., Awaitable[None]],
                 *, get_user: Callable[[Scope], str | None] = _scope_user, **options: Any) -> None:
        self.app = app
        self.get_user = get_user
        self.options = Options.parse(options)
        if self.options.mode == "in-process":
            self._decide: Callable[..., Awaitable[Any]] = InProcessLimiter(
                self.options.config_dir, self.options.redis_url, key_prefix=self.options.key_prefix,
                timeout=self.options.timeout, clock=self.options.clock).should_rate_limit
        else:
            self._decide = AsyncRateLimitClient(self.options.target, timeout=self.options.timeout).should_rate_limit

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http" or not applies(self.options, scope["path"]):
            await self.app(scope, receive, send)
            return
        headers: dict[str, str] = {}
        for raw_key, raw_value in scope.get("headers", []):
            key, value = raw_key.decode("latin-1").lower(), raw_value.decode("latin-1")
            # repeated lines of one header are one list (RFC 9110 5.3): X-Forwarded-For from several proxies
            headers[key] = f"{headers[key]}, {value}" if key in headers else value
        peer = (scope.get("client") or ("", 0))[0]
        try:
            user = self.get_user(scope)
        except Exception as exc:  # a user object we cannot read: treat as anonymous rather than fail the request
            log.warning("cannot read the user (%s): limiting by address", exc)
            user = None
        view = RequestView(path=scope["path"], method=scope["method"], headers=headers,
                           client_ip=client_ip(peer, headers.get("x-forwarded-for"), self.options.trusted_proxies),
                           user_id=user)
        descriptors = build_descriptors(self.options, view)
        if not descriptors:
            await self.app(scope, receive, send)
            return
        try:
            result = answer(await self._decide(self.options.domain, descriptors))
        except Exception as exc:  # unavailable, or anything unexpected: the configured failure mode decides
            result = failure(self.options, f"{type(exc).__name__}: {exc}")
        extra = [(k.lower().encode("latin-1"), v.encode("latin-1")) for k, v in result.headers]
        if result.status is not None:
            await send({"type": "http.response.start", "status": result.status,
                        "headers": [*extra, (b"content-length", str(len(result.body)).encode())]})
            await send({"type": "http.response.body", "body": result.body})
            return

        async def send_with_headers(message: Message) -> None:
            if message["type"] == "http.response.start":
                message = {**message, "headers": [*message.get("headers", []), *extra]}
            await send(message)

        await self.app(scope, receive, send_with_headers)
