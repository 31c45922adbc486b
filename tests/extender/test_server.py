from __future__ import annotations

import http.client
import json
from collections.abc import Iterator

import pytest
from extender_helpers import FakeBinder, args, container, node, pod

from gpushare import protocol
from gpushare.extender.cache import ClusterCache
from gpushare.extender.server import MAX_BODY_BYTES, Extender, make_server, serve_in_thread

PREFIX = protocol.EXTENDER_PATH_PREFIX


@pytest.fixture
def server() -> Iterator[tuple[str, int]]:
    cache = ClusterCache()
    cache.replace_nodes([node("n1")])
    cache.replace_pods([])
    httpd = make_server(Extender(cache, FakeBinder()), "127.0.0.1", 0)
    serve_in_thread(httpd)
    yield httpd.server_address[:2]
    httpd.shutdown()
    httpd.server_close()


def call(address, method: str, path: str, body: bytes | None = None, headers=None):
    connection = http.client.HTTPConnection(*address, timeout=5)
    try:
        connection.request(method, path, body=body, headers=headers or {})
        response = connection.getresponse()
        return response.status, response.read()
    finally:
        connection.close()


def test_verbs_over_http(server, caplog) -> None:
    body = json.dumps(args(pod("p", container(mem=4)), "n1")).encode()
    status, answer = call(server, "POST", f"{PREFIX}/filter", body)
    assert status == 200 and json.loads(answer)["nodenames"] == ["n1"]
    status, answer = call(server, "POST", f"{PREFIX}/prioritize", body)
    assert status == 200 and json.loads(answer) == [{"host": "n1", "score": 10}]
    bind = {"podName": "p", "podNamespace": "default", "podUID": "uid-default-p", "node": "n1"}
    status, answer = call(server, "POST", f"{PREFIX}/bind", json.dumps(bind).encode())
    assert status == 200 and json.loads(answer) == {}


def test_health_and_metrics(server) -> None:
    assert call(server, "GET", "/healthz") == (200, b"ok")
    assert call(server, "GET", "/readyz") == (200, b"ok")
    call(server, "POST", f"{PREFIX}/filter", json.dumps(args(pod("p"), "n1")).encode())
    status, text = call(server, "GET", "/metrics")
    assert status == 200
    assert b'gpushare_extender_request_seconds_count{verb="filter"} 1.0' in text


@pytest.mark.parametrize(
    ("path", "body", "status"),
    [
        (f"{PREFIX}/filter", b"{not json", 400),
        (f"{PREFIX}/filter", b"\xff\xfe", 400),
        (f"{PREFIX}/filter", b"[]", 400),
        (f"{PREFIX}/filter", b'{"pod": 3}', 400),
        (f"{PREFIX}/filter", b'{"pod": {}, "nodenames": [1]}', 400),
        (f"{PREFIX}/prioritize", b"null", 400),
        (f"{PREFIX}/bind", b'{"podName": "p"}', 400),
        (f"{PREFIX}/nope", b"{}", 404),
    ],
)
def test_malformed_bodies_get_4xx_and_a_log_line(server, caplog, path, body, status) -> None:
    got, answer = call(server, "POST", path, body)
    assert got == status
    assert "error" in json.loads(answer)
    assert any(str(status) in record.getMessage() for record in caplog.records)
    assert call(server, "GET", "/healthz") == (200, b"ok")  # still serving


def test_oversized_body_is_refused_unread(server) -> None:
    headers = {"Content-Length": str(MAX_BODY_BYTES + 1)}
    connection = http.client.HTTPConnection(*server, timeout=5)
    connection.putrequest("POST", f"{PREFIX}/filter")
    for name, value in headers.items():
        connection.putheader(name, value)
    connection.endheaders()
    response = connection.getresponse()
    assert response.status == 413
    connection.close()
    assert call(server, "GET", "/healthz") == (200, b"ok")


def test_not_ready_until_synced() -> None:
    httpd = make_server(Extender(ClusterCache()), "127.0.0.1", 0)
    serve_in_thread(httpd)
    try:
        address = httpd.server_address[:2]
        assert call(address, "GET", "/readyz") == (503, b"syncing")
        # Before the first list the verbs answer with an error (kube-scheduler retries the
        # pod), not with every node failed (kube-scheduler would park it as unschedulable).
        body = json.dumps(args(pod("p", container(mem=4)), "n1")).encode()
        status, answer = call(address, "POST", f"{PREFIX}/filter", body)
        assert status == 200 and "not yet listed" in json.loads(answer)["error"]
        bind = {"podName": "p", "podNamespace": "default", "podUID": "u", "node": "n1"}
        status, answer = call(address, "POST", f"{PREFIX}/bind", json.dumps(bind).encode())
        assert status == 200 and "not yet listed" in json.loads(answer)["error"]
    finally:
        httpd.shutdown()
        httpd.server_close()
