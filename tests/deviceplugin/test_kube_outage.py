"""KubeNode through an API server outage (a fake lightkube client): the last view of the
node's pods keeps being served, and the plugin's writes are retried until they land."""

from __future__ import annotations

import copy
import threading
from typing import Any

import httpx2 as httpx
from deviceplugin_helpers import make_pod
from deviceplugin_peer import wait_until

from gpushare import protocol
from gpushare.deviceplugin.kube import KubeNode


class _Obj:
    def __init__(self, data: dict[str, Any]) -> None:
        self.data = data

    def to_dict(self) -> dict[str, Any]:
        return copy.deepcopy(self.data)  # fresh each time, as lightkube's


class _Listing(list):
    resourceVersion = "7"


class FlakyClient:
    """Lists succeed only while ``up`` is set, patches while ``writes_up`` is; a watch ends
    when the API server goes (``down``)."""

    def __init__(self, pods: list[dict[str, Any]]) -> None:
        self.pods = pods
        self.up = threading.Event()
        self.up.set()
        self.writes_up = threading.Event()
        self.writes_up.set()
        self.down = threading.Event()
        self.patches: list[tuple[str, dict[str, Any]]] = []
        self.failed_patches = 0

    def _check(self) -> None:
        if not self.up.is_set():
            raise httpx.ConnectError("connection refused")

    def list(self, resource: Any, **kwargs: Any) -> _Listing:
        self._check()
        assert kwargs["fields"] == {"spec.nodeName": "node-a"}
        return _Listing(_Obj(p) for p in self.pods)

    def watch(self, resource: Any, **kwargs: Any):
        self.down.wait()
        raise httpx.RemoteProtocolError("the API server went away")
        yield  # a generator, like lightkube's

    def patch(self, resource: Any, name: str, patch: dict[str, Any], **kwargs: Any) -> None:
        if not self.writes_up.is_set():
            self.failed_patches += 1
            raise httpx.ConnectError("connection refused")
        self.patches.append((name, patch))


def test_serves_the_last_view_and_retries_writes_through_an_outage():
    pod = make_pod("p", {"c": {protocol.RESOURCE_GPU_MEMORY: 1}}, {"c": []}, 1)
    client = FlakyClient([pod])
    node = KubeNode(client, "node-a")  # type: ignore[arg-type]
    node.start()
    try:
        wait_until(node.synced, 10, "the first list")
        assert [p["metadata"]["name"] for p in node.pods()] == ["p"]
        client.up.clear()
        client.writes_up.clear()
        client.down.set()  # the watch breaks; listing again fails
        wait_until(lambda: not node.synced(), 10, "the view to be marked stale")
        assert [p["metadata"]["name"] for p in node.pods()] == ["p"]  # still served
        assert not node.refresh()
        node.set_phase_allocated("ns", "p", "uid-p")
        node.set_gpus([protocol.GpuInfo("GPU-1", 0, "T4", 16384)])
        phase = node.pods()[0]["metadata"]["annotations"][protocol.ANNOTATION_PHASE]
        assert phase == protocol.PHASE_ALLOCATED  # the local view moves on at once
        wait_until(lambda: client.failed_patches >= 2, 10, "a retried write")
        client.up.set()
        assert node.refresh()  # a list made before the write lands...
        phase = node.pods()[0]["metadata"]["annotations"][protocol.ANNOTATION_PHASE]
        assert phase == protocol.PHASE_ALLOCATED  # ...keeps the pod served
        assert node.pending_writes() == 2
        client.writes_up.set()  # the API server takes writes again
        wait_until(lambda: node.pending_writes() == 0, 30, "the writes to land")
        by_name = dict(client.patches)
        assert by_name["p"]["metadata"] == {
            "uid": "uid-p",
            "annotations": {protocol.ANNOTATION_PHASE: protocol.PHASE_ALLOCATED},
        }
        assert protocol.ANNOTATION_GPUS in by_name["node-a"]["metadata"]["annotations"]
    finally:
        node.stop()
        client.down.set()
        client.up.set()
        client.writes_up.set()


def test_a_rewritten_allocation_is_patched_on_that_pod_only_and_shown_until_it_lands():
    pod = make_pod("p", {"c": {protocol.RESOURCE_GPU_MEMORY: 1}}, {"c": []}, 1)
    client = FlakyClient([pod])
    node = KubeNode(client, "node-a")  # type: ignore[arg-type]
    node.start()
    try:
        wait_until(node.synced, 10, "the first list")
        client.writes_up.clear()
        moved = protocol.encode_allocation({"c": [protocol.ShareInfo("GPU-9", 3, 1024, 0)]})
        node.set_allocation("ns", "p", "uid-p", moved)
        wait_until(lambda: client.failed_patches >= 1, 10, "a failed write")
        assert node.refresh()  # a list made before the write lands keeps the new value
        notes = node.pods()[0]["metadata"]["annotations"]
        assert notes[protocol.ANNOTATION_ALLOCATION] == moved
        assert notes[protocol.ANNOTATION_PHASE] == protocol.PHASE_ASSUMED  # not the phase
        client.writes_up.set()
        wait_until(lambda: node.pending_writes() == 0, 30, "the write to land")
        assert client.patches == [
            (
                "p",
                {
                    "metadata": {
                        "uid": "uid-p",  # a precondition: never a namesake pod's annotation
                        "annotations": {protocol.ANNOTATION_ALLOCATION: moved},
                    }
                },
            )
        ]
    finally:
        node.stop()
        client.down.set()
