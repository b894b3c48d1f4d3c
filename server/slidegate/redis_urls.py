"""The REDIS_URL forms of the three Redis topologies (REDIS_TYPE), checked and shown without passwords: what the
settings check at start and slidegate.backends.redis_connect connects to (no I/O here).

- ``single``: ``redis://[user:password@]host:port/db``, ``rediss://`` (TLS) or ``unix:///path``;
- ``sentinel``: ``master_name,host:port[,host:port...]`` — the name Sentinel knows the master by, then the
  Sentinel addresses;
- ``cluster``: ``host:port[,host:port...]`` — any nodes of the cluster (the client learns the rest).
"""

from __future__ import annotations

from urllib.parse import parse_qsl, urlencode, urlsplit, urlunsplit

from redis.asyncio import connection

TYPES = ("single", "sentinel", "cluster")


def redact(url: str) -> str:
    """``url`` with any password (in the user part or a ``password=`` query parameter) replaced by ``***``."""
    parts = urlsplit(url)
    if "@" in parts.netloc:
        user = (parts.username or "") if parts.password is not None else ""
        parts = parts._replace(netloc=f"{user}:***@{parts.netloc.rsplit('@', 1)[1]}")
    if parts.query:
        pairs = parse_qsl(parts.query, keep_blank_values=True)
        query = [(k, "***" if k.lower() == "password" else v) for k, v in pairs]
        parts = parts._replace(query=urlencode(query, safe="*"))
    text = urlunsplit(parts)
    # urlunsplit writes unix:///path as unix:/path (no host): keep the form the URL was given in
    return "unix://" + text.removeprefix("unix:") if parts.scheme == "unix" and not parts.netloc else text


def check_url(url: str, redis_type: str = "single") -> None:
    """Raise ValueError naming the problem unless ``url`` has the form ``redis_type`` takes."""
    if redis_type == "sentinel":
        parse_sentinel_url(url)
    elif redis_type == "cluster":
        parse_cluster_url(url)
    elif redis_type == "single":
        _check_single_url(url)
    else:
        raise ValueError(f"Redis type {redis_type!r} is not one of {', '.join(TYPES)}")


def _check_single_url(url: str) -> None:
    parts = urlsplit(url)
    if parts.scheme not in ("redis", "rediss", "unix"):
        raise ValueError(f"Redis URL {redact(url)!r} must start with redis://, rediss:// or unix://")
    try:
        parts.port  # noqa: B018 - urllib checks the port when it is read
        connection.parse_url(url)
    except ValueError as exc:
        raise ValueError(f"Redis URL {redact(url)!r}: {exc}") from exc
    if parts.scheme != "unix" and not parts.hostname:
        raise ValueError(f"Redis URL {redact(url)!r} names no host")
    if parts.scheme == "unix" and not parts.path:
        raise ValueError(f"Redis URL {redact(url)!r} names no socket path (unix:///path/to/redis.sock)")
    database = parts.path.strip("/") if parts.scheme != "unix" else ""
    if database and not database.isdecimal():
        # redis-py would read /abc as database 0 and /1/5 as 15
        raise ValueError(f"Redis URL {redact(url)!r}: the database {database!r} is not a whole number")


def parse_address(text: str, what: str) -> tuple[str, int]:
    """``host:port`` or ``[v6 address]:port`` → (host, port). Raises ValueError naming ``what`` (and never
    showing a password: credentials belong in REDIS_AUTH / REDIS_SENTINEL_AUTH)."""
    text = text.strip()
    if "@" in text:
        raise ValueError(f"{what} {text.rpartition('@')[2]!r} comes with credentials: put them in REDIS_AUTH "
                         "(REDIS_SENTINEL_AUTH for the Sentinels), not in REDIS_URL")
    host, sep, port = text.rpartition(":")
    bracketed = host.startswith("[") and host.endswith("]")
    if bracketed:
        host = host[1:-1]
    valid_host = bool(host) and not any(c in host for c in "[] /") and (bracketed or ":" not in host)
    if not sep or not valid_host or not (port.isascii() and port.isdigit()) or not 0 < int(port) < 65536:
        raise ValueError(f"{what} {text!r} is not host:port (an IPv6 address in brackets: [::1]:6379)")
    return host, int(port)


def parse_sentinel_url(url: str) -> tuple[str, list[tuple[str, int]]]:
    """``master_name,host:port,...`` → (master name, Sentinel addresses). Raises ValueError."""
    name, *addresses = url.split(",")
    if "://" in url or not name.strip() or any(c in name.strip() for c in ": @/"):
        raise ValueError(f"sentinel REDIS_URL {redact(url)!r} must be master_name,host:port[,host:port...]")
    if not addresses:
        raise ValueError(f"sentinel REDIS_URL {url!r} names no Sentinel: master_name,host:port[,host:port...]")
    return name.strip(), [parse_address(a, "Sentinel address") for a in addresses]


def parse_cluster_url(url: str) -> list[tuple[str, int]]:
    """``host:port,...`` → cluster node addresses. Raises ValueError."""
    if "://" in url or not url.strip():
        raise ValueError(f"cluster REDIS_URL {redact(url)!r} must be host:port[,host:port...]")
    return [parse_address(a, "cluster node") for a in url.split(",")]
