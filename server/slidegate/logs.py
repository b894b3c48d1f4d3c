"""Logging set-up: plain text, or one JSON object per line (LOG_FORMAT=json) for log pipelines."""

from __future__ import annotations

import json
import logging
import time
from collections.abc import Callable
from typing import Any

_STANDARD = set(vars(logging.LogRecord("", 0, "", 0, "", (), None))) | {"message", "asctime"}


class JsonFormatter(logging.Formatter):
    """``{"time", "level", "logger", "message", ...extra fields}`` on one line; extra fields come from
    ``log.info(..., extra={...})``."""

    def format(self, record: logging.LogRecord) -> str:
        out: dict[str, Any] = {
            "time": time.strftime("%Y-%m-%dT%H:%M:%S", time.gmtime(record.created)) + f".{int(record.msecs):03d}Z",
            "level": record.levelname.lower(),
            "logger": record.name,
            "message": record.getMessage(),
        }
        out.update({k: v for k, v in vars(record).items() if k not in _STANDARD})
        if record.exc_info:
            out["exception"] = self.formatException(record.exc_info)
        return json.dumps(out, default=str)


def _with_pid(record: logging.LogRecord) -> bool:
    record.pid = record.process  # an extra field: JsonFormatter writes it
    return True


def configure_logging(level: str, fmt: str, *, worker: bool = False) -> None:
    """Send slidegate's logs to stderr at ``level`` (debug … error) as ``fmt`` (text or json); the libraries'
    own logs (gRPC, redis-py, watchfiles) at ``level`` but never below INFO, watchfiles's never below
    WARNING. A ``worker`` (of WORKERS) names its process id in each line (``pid`` in JSON)."""
    handler = logging.StreamHandler()
    if fmt == "json":
        handler.setFormatter(JsonFormatter())
        if worker:
            handler.addFilter(_with_pid)
    else:
        where = "%(name)s[%(process)d]" if worker else "%(name)s"
        handler.setFormatter(logging.Formatter(f"%(asctime)s %(levelname)s {where}: %(message)s"))
    root = logging.getLogger()
    root.handlers[:] = [handler]
    wanted = logging.getLevelName(level.upper())
    root.setLevel(max(wanted, logging.INFO))
    logging.getLogger("slidegate").setLevel(wanted)
    # watchfiles logs each change it sees (debug) and each reload (info): a log file written inside the watched
    # directory would make every line it logs another change to log, without end
    logging.getLogger("watchfiles").setLevel(max(wanted, logging.WARNING))


class Repeated:
    """A warning that may come many times a second: the first at once, then at most one line every ``every``
    seconds, with the count of those not written since."""

    def __init__(self, logger: logging.Logger, message: str, every: float = 10.0,
                 clock: Callable[[], float] = time.monotonic) -> None:
        self._logger = logger
        self._message = message  # formatted with one argument, the detail of the last occurrence
        self._every = every
        self._clock = clock
        self._last_line: float | None = None
        self._unwritten = 0

    def __call__(self, detail: str) -> None:
        now = self._clock()
        if self._last_line is not None and now - self._last_line < self._every:
            self._unwritten += 1
            return
        more = ""
        if self._unwritten and self._last_line is not None:
            more = f" ({self._unwritten} more like it in the last {now - self._last_line:.0f} s)"
        self._logger.warning(self._message + more, detail)
        self._last_line, self._unwritten = now, 0
