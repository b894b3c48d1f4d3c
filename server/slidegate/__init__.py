"""slidegate: an Envoy-compatible global rate-limit service with sliding windows.

Envoy's HTTP rate-limit filter calls ``envoy.service.ratelimit.v3.RateLimitService/ShouldRateLimit``;
slidegate matches the request's descriptors against limits from YAML config and decides them atomically in
Redis with Lua.
"""

__version__ = "0.1.0"
