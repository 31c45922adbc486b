"""The extender's HTTP server: the kube-scheduler verbs, health and Prometheus metrics.

POST {prefix}/filter, {prefix}/prioritize, {prefix}/bind (prefix ``/gpushare-scheduler``);
GET /healthz (the process answers), /readyz (the cache has listed nodes and pods and, with
leader election, this replica leads), /metrics. With leader election a replica that does not
lead answers every verb 503 (kube-scheduler retries the pod).
A threaded stdlib server: kube-scheduler binds asynchronously, so calls overlap; the cache's
lock orders them. A body that is not JSON, not the verb's shape, or larger than
``MAX_BODY_BYTES`` gets a 4xx and a log line.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any, Protocol

import orjson
from prometheus_client import (
    CONTENT_TYPE_LATEST,
    CollectorRegistry,
    Counter,
    Histogram,
    generate_latest,
)

from gpushare import protocol
from gpushare.extender import verbs
from gpushare.extender.cache import ClusterCache
from gpushare.extender.nudge import CapacityNudger

log = logging.getLogger("gpushare.extender")

MAX_BODY_BYTES = 16 * 1024 * 1024  # a pod and 5,000 node names fit many times over
NOT_SYNCED = "the gpushare extender has not yet listed nodes and pods; try again"
NOT_LEADER = "this gpushare extender replica is not the leader; try again"


class Binder(Protocol):
    """The bind's API calls (watch.KubeBinder against a real API server)."""

    def bind(
        self, namespace: str, name: str, uid: str, node: str, annotations: dict[str, str]
    ) -> None: ...

    def get_pod(self, namespace: str, name: str) -> dict[str, Any]: ...


class Metrics:
    def __init__(self) -> None:
        self.registry = CollectorRegistry()
        self.latency = Histogram(
            "gpushare_extender_request_seconds",
            "Time to answer a kube-scheduler call, by verb",
            ["verb"],
            registry=self.registry,
            buckets=(0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 1, 2.5, 5),
        )
        self.binding_api = Histogram(
            "gpushare_extender_binding_api_seconds",
            "Time the API server took to answer a bind's Binding call",
            registry=self.registry,
            buckets=(0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 1, 2.5, 5),
        )
        self.placements = Counter(
            "gpushare_extender_placements", "Pods bound by the extender", registry=self.registry
        )
        self.failures = Counter(
            "gpushare_extender_failures",
            "Calls that did not place a pod, by reason",
            ["reason"],
            registry=self.registry,
        )


class Extender:
    """The verbs with their side effects: the bind's API calls and the metrics."""

    def __init__(
        self,
        cache: ClusterCache,
        binder: Binder | None = None,
        is_leader: Callable[[], bool] | None = None,
        nudger: CapacityNudger | None = None,
        candidate_limit: int = 0,
    ) -> None:
        self.cache = cache
        self.binder = binder
        self.nudger = nudger
        # > 0: filter passes at most this many nodes, the GPU policy's best (0: all that fit).
        self.candidate_limit = candidate_limit
        # None: no leader election (one replica), always answer.
        self.is_leader = is_leader
        self.metrics = Metrics()

    @property
    def leading(self) -> bool:
        return self.is_leader is None or self.is_leader()

    def filter(self, body: Any) -> dict[str, Any]:
        if not self.cache.ready:
            # Before the first list an empty cache would call every node unusable and
            # kube-scheduler would park the pod as unschedulable; an error makes it retry.
            verbs.filter_args(body)
            self.metrics.failures.labels("not_synced").inc()
            return {"nodenames": [], "failedNodes": {}, "error": NOT_SYNCED}
        result = verbs.filter_nodes(self.cache, body, self.candidate_limit)
        if not result["nodenames"]:
            if result.get("failedNodes") and self.nudger is not None:
                self.nudger.refused()  # waits for room: say when some comes free
            unresolvable = bool(result.get("failedAndUnresolvableNodes"))
            self.metrics.failures.labels("unresolvable" if unresolvable else "no_fit").inc()
            log.info("filter: %s", verbs.no_fit_message(result))
        return result

    def prioritize(self, body: Any) -> list[dict[str, Any]]:
        return verbs.prioritize(self.cache, body)

    def bind(self, body: Any) -> dict[str, Any]:
        args = verbs.bind_args(body)
        if not self.cache.ready:
            self.metrics.failures.labels("not_synced").inc()
            return {"error": NOT_SYNCED}
        binder = self.binder
        fetch = binder.get_pod if binder is not None else None
        try:
            _, annotations = verbs.decide_bind(self.cache, args, fetch)
        except verbs.BindError as error:
            self.metrics.failures.labels("bind_no_fit").inc()
            log.warning("bind %s to %s: %s", args.key, args.node, error)
            return {"error": str(error)}
        except Exception as error:  # the API server could not give the pod
            self.metrics.failures.labels("api_error").inc()
            log.warning("bind %s to %s: %s", args.key, args.node, error)
            return {"error": f"pod {args.key}: {error}"}
        if binder is None:
            self.cache.forget(args.key, args.uid)
            return {"error": "the extender has no API client; cannot bind"}
        try:
            if not self.leading:  # lost the lease since the verb began: no Binding
                raise RuntimeError(NOT_LEADER)
            # One call: the API server sets spec.nodeName and the Binding's annotations on the
            # pod in the same update, so a pod is never bound without its allocation, nor
            # annotated without being bound.
            with self.metrics.binding_api.time():
                binder.bind(args.namespace, args.name, args.uid, args.node, dict(annotations))
        except Exception as error:
            self.cache.forget(args.key, args.uid)
            self.metrics.failures.labels("api_error").inc()
            log.warning(
                "bind %s to %s failed, assumption rolled back: %s", args.key, args.node, error
            )
            return {"error": f"binding pod {args.key} to {args.node}: {error}"}
        self.metrics.placements.inc()
        log.info(
            "bound %s to %s: %s", args.key, args.node, annotations[protocol.ANNOTATION_ALLOCATION]
        )
        return {}


def _handler(extender: Extender, prefix: str) -> type[BaseHTTPRequestHandler]:
    routes: dict[str, Callable[[Any], Any]] = {
        f"{prefix}/{protocol.EXTENDER_FILTER_VERB}": extender.filter,
        f"{prefix}/{protocol.EXTENDER_PRIORITIZE_VERB}": extender.prioritize,
        f"{prefix}/{protocol.EXTENDER_BIND_VERB}": extender.bind,
    }

    class Handler(BaseHTTPRequestHandler):
        protocol_version = "HTTP/1.1"
        server_version = "gpushare-extender"
        # Headers and body go out in separate writes: with Nagle's algorithm on, the body
        # waits for the client's delayed ACK (40 ms) on a kept-alive connection.
        disable_nagle_algorithm = True

        def log_message(self, format: str, *args: Any) -> None:
            log.debug("%s %s", self.address_string(), format % args)

        def _send(self, status: int, body: bytes, content_type: str = "application/json"):
            self.send_response(status)
            self.send_header("Content-Type", content_type)
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)

        def _reject(self, status: int, message: str, close: bool = False) -> None:
            log.warning("%s %s: %d %s", self.command, self.path, status, message)
            if close:
                self.close_connection = True
            self._send(status, orjson.dumps({"error": message}))

        def do_GET(self) -> None:
            if self.path == "/healthz":
                self._send(200, b"ok", "text/plain")
            elif self.path == "/readyz":
                if not extender.cache.ready:
                    self._send(503, b"syncing", "text/plain")
                elif not extender.leading:
                    self._send(503, b"not leader", "text/plain")
                else:
                    self._send(200, b"ok", "text/plain")
            elif self.path == "/metrics":
                self._send(200, generate_latest(extender.metrics.registry), CONTENT_TYPE_LATEST)
            else:
                self._reject(404, f"no such path {self.path}")

        def do_POST(self) -> None:
            route = routes.get(self.path)
            if route is None:
                self._reject(404, f"no such verb {self.path}", close=True)
                return
            length_text = self.headers.get("Content-Length")
            if length_text is None or not length_text.isdigit():
                self._reject(411, "a Content-Length is needed", close=True)
                return
            length = int(length_text)
            if length > MAX_BODY_BYTES:
                self._reject(413, f"body of {length} bytes over {MAX_BODY_BYTES}", close=True)
                return
            raw = self.rfile.read(length)
            verb = self.path.rsplit("/", 1)[-1]
            if not extender.leading:
                extender.metrics.failures.labels("not_leader").inc()
                self._reject(503, NOT_LEADER)
                return
            began = time.perf_counter()
            try:
                body = orjson.loads(raw)
                result = route(body)
            except orjson.JSONDecodeError as error:  # also bad UTF-8
                self._reject(400, f"body is not JSON: {error}")
                return
            except verbs.VerbError as error:
                self._reject(400, str(error))
                return
            except Exception as error:  # a bug must not take the extender down
                log.exception("%s failed", verb)
                self._reject(500, f"{verb}: internal error: {error}")
                return
            finally:
                extender.metrics.latency.labels(verb).observe(time.perf_counter() - began)
            self._send(200, orjson.dumps(result))

    return Handler


class ExtenderServer(ThreadingHTTPServer):
    daemon_threads = True
    allow_reuse_address = True


def make_server(
    extender: Extender,
    host: str = "127.0.0.1",
    port: int = protocol.EXTENDER_DEFAULT_PORT,
    prefix: str = protocol.EXTENDER_PATH_PREFIX,
) -> ExtenderServer:
    return ExtenderServer((host, port), _handler(extender, prefix.rstrip("/")))


def serve_in_thread(server: ExtenderServer) -> threading.Thread:
    thread = threading.Thread(target=server.serve_forever, name="extender-http", daemon=True)
    thread.start()
    return thread
