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
from redis.exceptions import RedisError

TYPES = ("single", "sentinel", "cluster")


def redact(url: str) -> str:
    """``url`` with any password (in the user part or a ``password=`` query parameter) replaced by ``***``, even
    in a URL too malformed to parse (a password with an unescaped ``/``, ``?`` or ``#``)."""
    scheme, sep, rest = url.partition("://")
    if sep and "@" in rest:
        # everything before the last @ may be a password: a user is kept only where a colon ends it
        userinfo, _, after = rest.rpartition("@")
        user = userinfo.split(":", 1)[0] if ":" in userinfo else ""
        url = f"{scheme}://{user}:***@{after}"
    parts = urlsplit(url)
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
        port = parts.port  # urllib checks the port when it is read
    except ValueError as exc:
        if "out of range" in str(exc):
            raise ValueError(f"Redis URL {redact(url)!r}: {exc}") from exc
        # urllib's message quotes what it read as the port: part of a password that holds a / ? or #
        raise ValueError(f"Redis URL {redact(url)!r}: the port is not a number (a password's / ? # and @ must be "
                         "percent-encoded, or the password given in REDIS_AUTH)") from None
    try:
        connection.parse_url(url)
    except ValueError as exc:
        raise ValueError(f"Redis URL {redact(url)!r}: {exc}") from exc
    if parts.scheme == "unix":
        if not parts.path:
            raise ValueError(f"Redis URL {redact(url)!r} names no socket path (unix:///path/to/redis.sock)")
        if parts.hostname:
            raise ValueError(f"Redis URL {redact(url)!r} names a host: a socket path is unix:///path/to/redis.sock")
    else:
        _check_host_and_port(url, parts.hostname, port)
    database = parts.path.strip("/") if parts.scheme != "unix" else ""
    if database and not database.isdecimal():
        # redis-py would read /abc as database 0 and /1/5 as 15
        raise ValueError(f"Redis URL {redact(url)!r}: the database {database!r} is not a whole number")
    _check_query(url)


def _check_host_and_port(url: str, host: str | None, port: int | None) -> None:
    if not host:
        raise ValueError(f"Redis URL {redact(url)!r} names no host")
    if any(c in host for c in " \t[]"):
        raise ValueError(f"Redis URL {redact(url)!r}: the host {host!r} is not a host name or address")
    if port is None and url.partition("://")[2].split("/", 1)[0].split("?", 1)[0].endswith(":"):
        raise ValueError(f"Redis URL {redact(url)!r} names no port after its colon")
    if port is not None and not 0 < port < 65536:
        raise ValueError(f"Redis URL {redact(url)!r}: the port {port} is not from 1 to 65535")


def _check_query(url: str) -> None:
    """The URL's query parameters are what redis-py passes to each connection it makes: one it does not take (a
    misspelling, ssl_* on redis://) would fail every call, never the start, so the connection is made here
    (made, not connected: no I/O)."""
    try:
        connection.ConnectionPool.from_url(url).make_connection()
    except (TypeError, ValueError, KeyError, RedisError) as exc:
        raise ValueError(f"Redis URL {redact(url)!r}: a query parameter is not one redis-py takes for this "
                         f"scheme ({exc})") from exc


def parse_address(text: str, what: str) -> tuple[str, int]:
    """``host:port`` or ``[v6 address]:port`` → (host, port). Raises ValueError naming ``what`` (and never
    showing a password: credentials belong in REDIS_AUTH / REDIS_SENTINEL_AUTH)."""
    text = text.strip()
    if "?" in text or "#" in text:
        raise ValueError(f"{what} {text.partition('?')[0].partition('#')[0]!r} comes with a query or fragment: "
                         "REDIS_URL takes none here (credentials go in REDIS_AUTH / REDIS_SENTINEL_AUTH)")
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
        raise ValueError(f"sentinel REDIS_URL {redact(url)!r} names no Sentinel: master_name,host:port[,host:port...]")
    return name.strip(), [parse_address(a, "Sentinel address") for a in addresses]


def parse_cluster_url(url: str) -> list[tuple[str, int]]:
    """``host:port,...`` → cluster node addresses. Raises ValueError."""
    if "://" in url or not url.strip():
        raise ValueError(f"cluster REDIS_URL {redact(url)!r} must be host:port[,host:port...]")
    return [parse_address(a, "cluster node") for a in url.split(",")]
