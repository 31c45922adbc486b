"""The monitor's HTTP endpoint: GET /metrics (Prometheus text format) and /healthz."""

from __future__ import annotations

import logging
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

from prometheus_client import CONTENT_TYPE_LATEST, CollectorRegistry, generate_latest

log = logging.getLogger("gpushare.monitor")


def make_server(registry: CollectorRegistry, host: str, port: int) -> ThreadingHTTPServer:
    """A server of ``registry``; OSError if the address cannot be bound."""

    class Handler(BaseHTTPRequestHandler):
        def do_GET(self) -> None:
            path = self.path.split("?", 1)[0]
            if path == "/metrics":
                try:
                    body, status, kind = generate_latest(registry), 200, CONTENT_TYPE_LATEST
                except Exception as error:  # a failed scrape answers 500 and says why
                    log.warning("scrape failed: %s", error)
                    body, status, kind = f"{error}\n".encode(), 500, "text/plain"
            elif path == "/healthz":
                body, status, kind = b"ok\n", 200, "text/plain"
            else:
                body, status, kind = b"not found\n", 404, "text/plain"
            self.send_response(status)
            self.send_header("Content-Type", kind)
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)

        def log_message(self, format: str, *args: object) -> None:
            log.debug("%s " + format, self.address_string(), *args)

    server = ThreadingHTTPServer((host, port), Handler)
    server.daemon_threads = True
    return server
