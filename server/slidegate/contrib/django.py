"""Django middleware: ``MIDDLEWARE = [..., "slidegate.contrib.django.SlidegateMiddleware"]`` after the
authentication middleware, configured by the ``SLIDEGATE`` setting (see slidegate.contrib.common)."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from django.conf import settings
from django.http import HttpRequest, HttpResponse

from slidegate.client import RateLimitClient
from slidegate.contrib.common import (
    Answer,
    Options,
    RequestView,
    answer,
    applies,
    build_descriptors,
    client_ip,
    failure,
)
from slidegate.inprocess import InProcessLimiter


class SlidegateMiddleware:
    """Limits requests per the SLIDEGATE setting: 429 (JSON body, Retry-After, X-RateLimit-* and IETF
    RateLimit fields) over limit, the informational headers otherwise."""

    def __init__(self, get_response: Callable[[HttpRequest], HttpResponse]) -> None:
        self.get_response = get_response
        self.options = Options.parse(getattr(settings, "SLIDEGATE", {}))
        if self.options.mode == "in-process":
            limiter = InProcessLimiter(self.options.config_dir, self.options.redis_url,
                                       key_prefix=self.options.key_prefix, timeout=self.options.timeout,
                                       clock=self.options.clock)
            self._decide: Callable[..., Any] = limiter.should_rate_limit_blocking
        else:
            self._decide = RateLimitClient(self.options.target, timeout=self.options.timeout).should_rate_limit

    def __call__(self, request: HttpRequest) -> HttpResponse:
        if not applies(self.options, request.path):
            return self.get_response(request)
        user = getattr(request, "user", None)
        view = RequestView(
            path=request.path, method=request.method or "GET",
            headers={k.lower(): v for k, v in request.headers.items()},
            client_ip=client_ip(request.META.get("REMOTE_ADDR", ""), request.META.get("HTTP_X_FORWARDED_FOR"),
                                self.options.trusted_proxies),
            user_id=str(user.pk) if user is not None and user.is_authenticated else None,
        )
        descriptors = build_descriptors(self.options, view)
        if not descriptors:
            return self.get_response(request)
        try:
            result = answer(self._decide(self.options.domain, descriptors))
        except Exception as exc:  # unavailable, or anything unexpected: the configured failure mode decides
            result = failure(self.options, f"{type(exc).__name__}: {exc}")
        return self._respond(request, result)

    def _respond(self, request: HttpRequest, result: Answer) -> HttpResponse:
        response = self.get_response(request) if result.status is None else HttpResponse(
            result.body, status=result.status)
        for key, value in result.headers:
            response[key] = value
        return response
