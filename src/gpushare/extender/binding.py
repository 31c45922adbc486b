"""The Binding call: the extender's one API request per pod, over kept-alive connections.

The extender posts a Binding for every pod it places, dozens at once while the API server is
busy; through lightkube (httpx) each cost about twice the CPU it does through urllib3's
connection pool (bench/bench_binding.py; figures in docs/performance.md). Authentication
stays lightkube's: the TLS context it builds from the kubeconfig (CA, client certificate)
and the Authorization header its auth flow gives (a token, a service account's token file
re-read after a 401, an exec plugin).
"""

from __future__ import annotations

import urllib.parse
from typing import Any

import httpx2
import orjson
import urllib3
from lightkube.config.client_adapter import user_auth, verify_cluster
from lightkube.config.kubeconfig import SingleConfig

TIMEOUT_S = 10.0  # lightkube's default


class BindingFailed(RuntimeError):
    """The API server refused the Binding (or could not be reached); says why in one line."""

    def __init__(self, message: str, status: int | None = None) -> None:
        super().__init__(message)
        self.status = status


class BindingClient:
    """Posts Bindings with a pool of up to ``connections`` kept-alive connections."""

    def __init__(self, config: SingleConfig, connections: int) -> None:
        server = urllib.parse.urlsplit(config.cluster.server)
        if server.hostname is None:
            raise ValueError(f"kubeconfig server {config.cluster.server!r} has no host")
        self.url = config.cluster.server.rstrip("/")
        self.path_prefix = server.path.rstrip("/")
        self.auth = user_auth(config.user)
        timeout = urllib3.Timeout(total=TIMEOUT_S)
        # A pooled connection the server has closed is replaced before use; a request that
        # failed to connect is tried again. One that reached the server is never re-sent.
        retries = urllib3.Retry(total=2, connect=2, read=False, redirect=0, status=0, other=0)
        pooling: dict[str, Any] = {
            "maxsize": connections,
            "block": False,
            "timeout": timeout,
            "retries": retries,
        }
        if server.scheme == "https":
            context = verify_cluster(config.cluster, config.user, config.abs_file)
            self.pool: urllib3.HTTPConnectionPool = urllib3.HTTPSConnectionPool(
                server.hostname, server.port or 443, ssl_context=context, **pooling
            )
        else:
            self.pool = urllib3.HTTPConnectionPool(server.hostname, server.port or 80, **pooling)

    def bind(
        self, namespace: str, name: str, uid: str, node: str, annotations: dict[str, str]
    ) -> None:
        """Bind the pod and set its annotations in one update (the Binding carries them)."""
        path = f"{self.path_prefix}/api/v1/namespaces/{namespace}/pods/{name}/binding"
        body = orjson.dumps(
            {
                "apiVersion": "v1",
                "kind": "Binding",
                "metadata": {
                    "name": name,
                    "namespace": namespace,
                    "uid": uid,
                    "annotations": annotations,
                },
                "target": {"apiVersion": "v1", "kind": "Node", "name": node},
            }
        )
        headers = {"Content-Type": "application/json", "Accept": "application/json"}
        flow = request = None
        if self.auth is not None:
            request = httpx2.Request("POST", self.url + path)
            flow = self.auth.sync_auth_flow(request)
            request = next(flow)
            headers.update(_authorization(request))
        response = self._post(path, body, headers)
        if response.status == 401 and flow is not None and request is not None:
            # The auth flow's answer to a 401: a fresh token, or nothing more to try.
            try:
                request = flow.send(httpx2.Response(401, request=request))
            except StopIteration:
                pass
            else:
                headers.update(_authorization(request))
                response = self._post(path, body, headers)
        if response.status >= 300:
            raise BindingFailed(_status_message(response), response.status)

    def _post(self, path: str, body: bytes, headers: dict[str, str]) -> Any:
        try:
            return self.pool.urlopen("POST", path, body=body, headers=headers)
        except urllib3.exceptions.HTTPError as error:
            raise BindingFailed(f"API server {self.url}: {error}") from None

    def close(self) -> None:
        self.pool.close()


def _authorization(request: httpx2.Request) -> dict[str, str]:
    value = request.headers.get("Authorization")
    return {"Authorization": value} if value else {}


def _status_message(response: Any) -> str:
    """The API server's one-line reason (a Status object's message), or the HTTP status."""
    try:
        message = orjson.loads(response.data).get("message")
    except (orjson.JSONDecodeError, AttributeError):
        message = None
    return f"{response.status}: {message or response.reason or 'no reason given'}"
