"""The device plugin's view of the API server: the pods bound to its node, and its writes.

Reads: one thread lists the node's pods (field selector ``spec.nodeName``) and watches from the
list's version, listing again after any error or every ``resync_s``; Allocate reads the last
view, so an API server outage does not stop the plugin serving what it knows. Writes (a pod's
phase ``allocated``, a pod's rewritten ``gpushare.io/allocation`` after kubelet exchanged two
containers' decisions, the node's ``gpushare.io/gpus``) go through a queue that another thread
retries with exponential backoff (0.5 s doubling to 30 s) until they succeed or the pod is
gone; the node annotation is coalesced (the latest wins).
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Iterable
from typing import Any, Protocol

import httpx2 as httpx
from lightkube import ApiError, Client
from lightkube.resources.core_v1 import Node, Pod

from gpushare import protocol
from gpushare.kubewatch import Selection, keep_listing_and_watching, list_and_watch, list_objects

log = logging.getLogger("gpushare.deviceplugin")

RESYNC_S = 300.0
BACKOFF_MIN_S = 0.5
BACKOFF_MAX_S = 30.0
REFRESH_TIMEOUT_S = 2.0


class PodSource(Protocol):
    """Pods bound to this node, as plain dicts in the Kubernetes JSON shape."""

    def pods(self) -> list[dict[str, Any]]: ...

    def refresh(self) -> bool:
        """Reads the pods again now; False if the API server could not be reached."""
        ...

    def synced(self) -> bool:
        """True while the view comes from a list or watch that is still running."""
        ...


class NodeWriter(Protocol):
    def set_phase_allocated(self, namespace: str, name: str, uid: str) -> None: ...

    def set_allocation(self, namespace: str, name: str, uid: str, allocation: str) -> None:
        """Rewrites the pod's gpushare.io/allocation (only the pod ``uid``)."""
        ...

    def set_gpus(self, gpus: list[protocol.GpuInfo]) -> None: ...


class StaticPods:
    """A pod source that is a given list (benchmarks, tests); writes are recorded."""

    def __init__(self, pods: Iterable[dict[str, Any]] = ()) -> None:
        self.items = list(pods)
        self.lock = threading.Lock()
        self.allocated: list[tuple[str, str, str]] = []
        self.rewritten: list[tuple[str, str, str, str]] = []
        self.gpus: list[protocol.GpuInfo] = []

    def pods(self) -> list[dict[str, Any]]:
        with self.lock:
            return list(self.items)

    def refresh(self) -> bool:
        return True

    def synced(self) -> bool:
        return True

    def set_phase_allocated(self, namespace: str, name: str, uid: str) -> None:
        with self.lock:
            self.allocated.append((namespace, name, uid))
            for pod in self.items:
                metadata = pod.get("metadata") or {}
                if metadata.get("uid") == uid:
                    annotations = metadata.setdefault("annotations", {})
                    annotations[protocol.ANNOTATION_PHASE] = protocol.PHASE_ALLOCATED

    def set_allocation(self, namespace: str, name: str, uid: str, allocation: str) -> None:
        with self.lock:
            self.rewritten.append((namespace, name, uid, allocation))
            for pod in self.items:
                metadata = pod.get("metadata") or {}
                if metadata.get("uid") == uid:
                    annotations = metadata.setdefault("annotations", {})
                    annotations[protocol.ANNOTATION_ALLOCATION] = allocation

    def set_gpus(self, gpus: list[protocol.GpuInfo]) -> None:
        with self.lock:
            self.gpus = list(gpus)


def _uid(pod: dict[str, Any]) -> str:
    metadata = pod.get("metadata") or {}
    return str(metadata.get("uid") or f"{metadata.get('namespace')}/{metadata.get('name')}")


class KubeNode:
    """PodSource and NodeWriter on a lightkube client."""

    def __init__(self, client: Client, node: str, resync_s: float = RESYNC_S) -> None:
        self.client = client
        self.node = node
        self.resync_s = resync_s
        self.lock = threading.Lock()
        self._selection = Selection(Pod, namespaced=True, fields={"spec.nodeName": node})
        self._pods: dict[str, dict[str, Any]] = {}
        self._watching = False
        self._writes: dict[tuple[str, str], dict[str, Any]] = {}
        self._wake = threading.Event()
        self.stopping = threading.Event()
        self.threads = [
            threading.Thread(target=self._watch_loop, name="pods-watch", daemon=True),
            threading.Thread(target=self._write_loop, name="api-writes", daemon=True),
        ]

    def start(self) -> None:
        for thread in self.threads:
            thread.start()

    def stop(self) -> None:
        self.stopping.set()
        self._wake.set()

    # -- reads ---------------------------------------------------------------------------

    def pods(self) -> list[dict[str, Any]]:
        with self.lock:
            return list(self._pods.values())

    def synced(self) -> bool:
        with self.lock:
            return self._watching

    def _overlay(self, uid: str, data: dict[str, Any]) -> dict[str, Any]:
        """The pod with our writes still in flight applied (the lock is held), so that a list
        made before a write lands does not make a served pod assumed again, nor bring back an
        allocation already rewritten."""
        notes: dict[str, str] = {}
        if ("pod", uid) in self._writes:
            notes[protocol.ANNOTATION_PHASE] = protocol.PHASE_ALLOCATED
        if ("allocation", uid) in self._writes:
            notes[protocol.ANNOTATION_ALLOCATION] = self._writes[("allocation", uid)]["text"]
        if notes:
            metadata = data.setdefault("metadata", {})
            metadata["annotations"] = {**(metadata.get("annotations") or {}), **notes}
        return data

    def _store(self, listed: list[dict[str, Any]]) -> None:
        with self.lock:
            self._pods = {_uid(data): self._overlay(_uid(data), data) for data in listed}

    def refresh(self) -> bool:
        try:
            self._store(list_objects(self.client, self._selection)[0])
        except (ApiError, httpx.HTTPError) as error:
            log.warning("listing pods of node %s: %s", self.node, error)
            return False
        return True

    def _watch_loop(self) -> None:
        keep_listing_and_watching(
            lambda: list_and_watch(
                self.client,
                self._selection,
                self._listed,
                self._event,
                self.stopping,
                self.resync_s,
            ),
            self.stopping,
            f"pods of node {self.node}",
            log,
            BACKOFF_MIN_S,
            BACKOFF_MAX_S,
            on_error=self._not_watching,
        )

    def _listed(self, listed: list[dict[str, Any]]) -> None:
        self._store(listed)
        with self.lock:
            self._watching = True

    def _not_watching(self) -> None:
        with self.lock:
            self._watching = False

    def _event(self, kind: str, data: dict[str, Any]) -> None:
        with self.lock:
            if kind == "DELETED":
                self._pods.pop(_uid(data), None)
            else:
                self._pods[_uid(data)] = self._overlay(_uid(data), data)

    # -- writes --------------------------------------------------------------------------

    def set_phase_allocated(self, namespace: str, name: str, uid: str) -> None:
        with self.lock:
            self._writes[("pod", uid)] = {"namespace": namespace, "name": name, "uid": uid}
            if uid in self._pods:  # the local view moves on at once; the API follows
                self._overlay(uid, self._pods[uid])
        self._wake.set()

    def set_allocation(self, namespace: str, name: str, uid: str, allocation: str) -> None:
        with self.lock:
            self._writes[("allocation", uid)] = {
                "namespace": namespace,
                "name": name,
                "uid": uid,
                "text": allocation,
            }
            if uid in self._pods:
                self._overlay(uid, self._pods[uid])
        self._wake.set()

    def set_gpus(self, gpus: list[protocol.GpuInfo]) -> None:
        with self.lock:
            self._writes[("node", self.node)] = {"gpus": protocol.encode_gpus(gpus)}
        self._wake.set()

    def _write(self, kind: str, write: dict[str, Any]) -> None:
        if kind == "node":
            patch = {"metadata": {"annotations": {protocol.ANNOTATION_GPUS: write["gpus"]}}}
            self.client.patch(Node, self.node, patch)
            return
        if kind == "allocation":
            annotations = {protocol.ANNOTATION_ALLOCATION: write["text"]}
        else:
            annotations = {protocol.ANNOTATION_PHASE: protocol.PHASE_ALLOCATED}
        patch = {
            "metadata": {
                "uid": write["uid"],  # a precondition: never a namesake pod's annotations
                "annotations": annotations,
            }
        }
        self.client.patch(Pod, write["name"], patch, namespace=write["namespace"])

    def _write_loop(self) -> None:
        backoff = BACKOFF_MIN_S
        while not self.stopping.is_set():
            self._wake.wait()
            self._wake.clear()
            with self.lock:
                writes = dict(self._writes)
            failed = False
            for key, write in writes.items():
                try:
                    self._write(key[0], write)
                except ApiError as error:
                    if error.status.code in (404, 409, 422) and key[0] != "node":
                        what = "phase" if key[0] == "pod" else key[0]
                        log.info("pod %s: %s not written (%s)", write["name"], what, error)
                    else:
                        log.warning("writing %s %s: %s", *key, error)
                        failed = True
                        continue
                except httpx.HTTPError as error:
                    log.warning("writing %s %s: %s", *key, error)
                    failed = True
                    continue
                with self.lock:
                    if self._writes.get(key) is write:
                        del self._writes[key]
            if failed:
                self.stopping.wait(backoff)
                backoff = min(backoff * 2, BACKOFF_MAX_S)
                self._wake.set()
            else:
                backoff = BACKOFF_MIN_S

    def pending_writes(self) -> int:
        with self.lock:
            return len(self._writes)
