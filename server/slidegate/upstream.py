"""A tiny HTTP upstream for the demo and the end-to-end tests: answers every request with 200 and a line of text."""

from __future__ import annotations

import argparse
import sys
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer


class _Handler(BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"

    def _answer(self) -> None:
        body = f"hello from the upstream: {self.command} {self.path}\n".encode()
        self.send_response(200)
        self.send_header("content-type", "text/plain")
        self.send_header("content-length", str(len(body)))
        self.end_headers()
        if self.command != "HEAD":
            self.wfile.write(body)

    do_GET = do_POST = do_PUT = do_DELETE = do_HEAD = _answer  # noqa: N815 - http.server's handler names

    def log_message(self, format: str, *args: object) -> None:  # noqa: A002 - the base class's name
        pass


class _Server(ThreadingHTTPServer):
    daemon_threads = True

    def handle_error(self, request: object, client_address: object) -> None:
        # Envoy resets idle or cancelled upstream connections: routine, not worth a traceback in the demo
        if not isinstance(sys.exc_info()[1], ConnectionError):
            super().handle_error(request, client_address)  # type: ignore[arg-type]


def start(host: str = "127.0.0.1", port: int = 0) -> ThreadingHTTPServer:
    """Start the upstream in a daemon thread; ``server.server_address[1]`` is the port. Stop with
    ``shutdown()``."""
    server = _Server((host, port), _Handler)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    return server


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--host", default="0.0.0.0")
    parser.add_argument("--port", type=int, default=8080)
    opts = parser.parse_args()
    _Server((opts.host, opts.port), _Handler).serve_forever()


if __name__ == "__main__":
    main()
