"""The monitor's link to the API server: the pods on this node, the node, and Events.

Pods are listed once and then watched with ``fieldSelector=spec.nodeName=<node>`` (the
API server filters; a node sees its own pods only), and parsed into ``pods.Container``
records when they change, so a scrape never calls the API server nor parses JSON. The node is
watched for its ``gpushare.io/gpus`` annotation (GPU health). A watch error or the resync
interval leads to a fresh list; until the first list succeeds the source is not ``synced``
(``gpushare_monitor_pods_synced`` 0) and has no containers.
"""

from __future__ import annotations

import datetime
import logging
import threading
import time
from typing import Any

from lightkube import Client
from lightkube.resources.core_v1 import Event, Node, Pod

from gpushare.monitor.pods import Container, containers_of, gpu_health

log = logging.getLogger("gpushare.monitor")

RESYNC_S = 300.0
RETRY_S = 1.0
COMPONENT = "gpushare-monitor"


class KubePodSource:
    """Two watch threads keeping the node's GPU containers and the node object current."""

    def __init__(self, client: Client, node: str, resync_s: float = RESYNC_S) -> None:
        self.client = client
        self.node = node
        self.resync_s = resync_s
        self.stopping = threading.Event()
        self._lock = threading.Lock()
        self._pods: dict[str, tuple[Container, ...]] = {}  # by pod uid
        self._flat: list[Container] | None = []
        self._health: dict[str, bool] = {}
        self._synced = False
        self.threads = [
            threading.Thread(target=self._loop, args=(self._pods_once,), daemon=True),
            threading.Thread(target=self._loop, args=(self._node_once,), daemon=True),
        ]

    @property
    def synced(self) -> bool:
        return self._synced

    def start(self) -> None:
        for thread in self.threads:
            thread.start()

    def stop(self) -> None:
        self.stopping.set()

    def containers(self) -> list[Container]:
        with self._lock:
            if self._flat is None:
                self._flat = [c for group in self._pods.values() for c in group]
            return self._flat

    def gpu_health(self) -> dict[str, bool]:
        with self._lock:
            return self._health

    def _loop(self, once: Any) -> None:
        while not self.stopping.is_set():
            try:
                once()
            except Exception as error:
                log.warning("watch: %s; listing again", error)
                self.stopping.wait(RETRY_S)

    def _pods_once(self) -> None:
        fields = {"spec.nodeName": self.node}
        listing = self.client.list(Pod, namespace="*", fields=fields)
        pods = {}
        for pod in listing:
            data = pod.to_dict()
            pods[data["metadata"]["uid"]] = containers_of(data)
        with self._lock:
            self._pods = {uid: group for uid, group in pods.items() if group}
            self._flat = None
            self._synced = True
        resync_at = time.monotonic() + self.resync_s
        for kind, pod in self.client.watch(
            Pod,
            namespace="*",
            fields=fields,
            resource_version=listing.resourceVersion,
            server_timeout=60,
        ):
            if self.stopping.is_set():
                return
            data = pod.to_dict()
            uid = data["metadata"]["uid"]
            group = () if kind == "DELETED" else containers_of(data)
            with self._lock:
                if group:
                    self._pods[uid] = group
                else:
                    self._pods.pop(uid, None)
                self._flat = None
            if time.monotonic() > resync_at:
                return

    def _node_once(self) -> None:
        fields = {"metadata.name": self.node}
        for _, node in self.client.watch(Node, fields=fields, server_timeout=60):
            if self.stopping.is_set():
                return
            health = gpu_health(node.to_dict())
            with self._lock:
                self._health = health


class EventRecorder:
    """Writes a Warning Event on a container's pod, as ``kubectl describe pod`` shows it."""

    def __init__(self, client: Client, node: str) -> None:
        self.client = client
        self.node = node

    def record(self, container: Container, reason: str, message: str) -> None:
        now = datetime.datetime.now(datetime.UTC)
        event = Event.from_dict(
            {
                "metadata": {
                    "generateName": f"{container.pod}.",
                    "namespace": container.namespace,
                },
                "involvedObject": {
                    "apiVersion": "v1",
                    "kind": "Pod",
                    "name": container.pod,
                    "namespace": container.namespace,
                    "uid": container.pod_uid,
                    "fieldPath": f"spec.containers{{{container.name}}}",
                },
                "reason": reason,
                "message": message[:1024],
                "type": "Warning",
                "source": {"component": COMPONENT, "host": self.node},
                "reportingComponent": COMPONENT,
                "reportingInstance": self.node,
                "firstTimestamp": now,
                "lastTimestamp": now,
                "count": 1,
            }
        )
        self.client.create(event, namespace=container.namespace)
