"""The extender's HTTP server: the kube-scheduler verbs, health and Prometheus metrics.

POST {prefix}/filter, {prefix}/prioritize, {prefix}/bind (prefix ``/gpushare-scheduler``);
GET /healthz (the process answers), /readyz (the cache has listed nodes and pods and, with
leader election, this replica leads), /metrics. With leader election a replica that does not
lead answers every verb 503 (kube-scheduler retries the pod).
An aiohttp server on one asyncio loop: filter and prioritize, kube-scheduler's critical path,
run on the loop; each bind waits for its Binding call on a pool thread (kube-scheduler binds
asynchronously, dozens at once), and the cache's lock orders them all. A body that is not
JSON, not the verb's shape, or larger than ``MAX_BODY_BYTES`` gets a 4xx and a log line.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import socket
import threading
import time
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from typing import Any, Protocol

import orjson
from aiohttp import web
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
# Binds in flight at once, each waiting for its Binding call on a pool thread, with a kept-alive
# connection each (binding.BindingClient). A busy API server answers a Binding in about 0.1 s:
# 64 in flight keep up with over 500 binds a second.
BIND_THREADS = 64


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
        candidate_limit: int | None = verbs.AUTO_CANDIDATES,
    ) -> None:
        self.cache = cache
        self.binder = binder
        self.nudger = nudger
        # > 0: filter passes at most this many nodes, the GPU policy's best (0: all that fit;
        # None: by the pod, verbs.candidates_for).
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


def _answer(status: int, body: bytes, content_type: str = "application/json") -> web.Response:
    return web.Response(status=status, body=body, content_type=content_type)


def _app(extender: Extender, prefix: str, bind_pool: ThreadPoolExecutor) -> web.Application:
    """One handler for every path, so that unknown paths and methods get the same JSON errors."""
    routes: dict[str, Callable[[Any], Any]] = {
        f"{prefix}/{protocol.EXTENDER_FILTER_VERB}": extender.filter,
        f"{prefix}/{protocol.EXTENDER_PRIORITIZE_VERB}": extender.prioritize,
        f"{prefix}/{protocol.EXTENDER_BIND_VERB}": extender.bind,
    }
    bind_path = f"{prefix}/{protocol.EXTENDER_BIND_VERB}"

    def reject(
        request: web.Request, status: int, message: str, close: bool = False
    ) -> web.Response:
        log.warning("%s %s: %d %s", request.method, request.path, status, message)
        response = _answer(status, orjson.dumps({"error": message}))
        if close:
            response.force_close()
        return response

    def get(request: web.Request) -> web.Response:
        if request.path == "/healthz":
            return _answer(200, b"ok", "text/plain")
        if request.path == "/readyz":
            if not extender.cache.ready:
                return _answer(503, b"syncing", "text/plain")
            if not extender.leading:
                return _answer(503, b"not leader", "text/plain")
            return _answer(200, b"ok", "text/plain")
        if request.path == "/metrics":
            response = web.Response(body=generate_latest(extender.metrics.registry))
            response.headers["Content-Type"] = CONTENT_TYPE_LATEST
            return response
        return reject(request, 404, f"no such path {request.path}")

    async def handle(request: web.Request) -> web.StreamResponse:
        if request.method == "GET":
            return get(request)
        if request.method != "POST":
            return reject(request, 405, f"method {request.method} not allowed", close=True)
        route = routes.get(request.path)
        if route is None:
            return reject(request, 404, f"no such verb {request.path}", close=True)
        length = request.content_length
        if length is None:
            return reject(request, 411, "a Content-Length is needed", close=True)
        if length > MAX_BODY_BYTES:
            return reject(request, 413, f"body of {length} bytes over {MAX_BODY_BYTES}", True)
        raw = await request.read()
        verb = request.path.rsplit("/", 1)[-1]
        if not extender.leading:
            extender.metrics.failures.labels("not_leader").inc()
            return reject(request, 503, NOT_LEADER)
        began = time.perf_counter()
        try:
            body = orjson.loads(raw)
            if request.path == bind_path:
                # A bind waits for the API server: on a pool thread, so that filter and
                # prioritize (kube-scheduler's critical path) never queue behind it.
                loop = asyncio.get_running_loop()
                result = await loop.run_in_executor(bind_pool, route, body)
            else:
                result = route(body)
        except orjson.JSONDecodeError as error:  # also bad UTF-8
            return reject(request, 400, f"body is not JSON: {error}")
        except verbs.VerbError as error:
            return reject(request, 400, str(error))
        except Exception as error:  # a bug must not take the extender down
            log.exception("%s failed", verb)
            return reject(request, 500, f"{verb}: internal error: {error}")
        finally:
            extender.metrics.latency.labels(verb).observe(time.perf_counter() - began)
        return _answer(200, orjson.dumps(result))

    app = web.Application(client_max_size=MAX_BODY_BYTES)
    app.router.add_route("*", "/{path:.*}", handle)
    return app


class ExtenderServer:
    """The HTTP server on its own asyncio loop: ``serve_forever`` runs it in the calling
    thread until ``shutdown`` (from another thread) stops it; the socket is bound at once,
    so a taken port fails in ``make_server``."""

    def __init__(self, extender: Extender, host: str, port: int, prefix: str) -> None:
        self.socket = socket.create_server((host, port), reuse_port=False)
        self.server_address = self.socket.getsockname()
        self._bind_pool = ThreadPoolExecutor(BIND_THREADS, thread_name_prefix="extender-bind")
        self._app = _app(extender, prefix, self._bind_pool)
        self._loop: asyncio.AbstractEventLoop | None = None
        self._stop: asyncio.Event | None = None
        self._started = threading.Event()
        self._stopped = threading.Event()

    def serve_forever(self) -> None:
        try:
            asyncio.run(self._serve())
        finally:
            self._stopped.set()
            self._started.set()  # a server that failed to start must not hang shutdown()

    async def _serve(self) -> None:
        self._loop = asyncio.get_running_loop()
        self._stop = asyncio.Event()
        runner = web.AppRunner(self._app, access_log=None, handle_signals=False)
        await runner.setup()
        await web.SockSite(runner, self.socket).start()
        self._started.set()
        try:
            await self._stop.wait()
        finally:
            await runner.cleanup()

    def shutdown(self) -> None:
        """Stop serving and wait until ``serve_forever`` has returned."""
        self._started.wait()
        loop, stop = self._loop, self._stop
        if loop is not None and stop is not None and not self._stopped.is_set():
            with contextlib.suppress(RuntimeError):  # the loop closed meanwhile: stopped
                loop.call_soon_threadsafe(stop.set)
        self._stopped.wait()

    def server_close(self) -> None:
        self._bind_pool.shutdown(wait=False, cancel_futures=True)
        self.socket.close()


def make_server(
    extender: Extender,
    host: str = "127.0.0.1",
    port: int = protocol.EXTENDER_DEFAULT_PORT,
    prefix: str = protocol.EXTENDER_PATH_PREFIX,
) -> ExtenderServer:
    return ExtenderServer(extender, host, port, prefix.rstrip("/"))


def serve_in_thread(server: ExtenderServer) -> threading.Thread:
    thread = threading.Thread(target=server.serve_forever, name="extender-http", daemon=True)
    thread.start()
    return thread
