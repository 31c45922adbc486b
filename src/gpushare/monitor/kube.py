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
from typing import Any

from lightkube import Client
from lightkube.resources.core_v1 import Event, Node, Pod

from gpushare.kubewatch import Selection, keep_listing_and_watching, list_and_watch
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

    def _loop(self, round_: Any) -> None:
        keep_listing_and_watching(round_, self.stopping, "watch", log, backoff_min_s=RETRY_S)

    def _pods_once(self) -> None:
        selection = Selection(Pod, namespaced=True, fields={"spec.nodeName": self.node})
        list_and_watch(
            self.client,
            selection,
            self._replace_pods,
            self._pod_event,
            self.stopping,
            self.resync_s,
        )

    def _replace_pods(self, objects: list[dict[str, Any]]) -> None:
        groups = {pod["metadata"]["uid"]: containers_of(pod) for pod in objects}
        with self._lock:
            self._pods = {uid: group for uid, group in groups.items() if group}
            self._flat = None
            self._synced = True

    def _pod_event(self, kind: str, pod: dict[str, Any]) -> None:
        uid = pod["metadata"]["uid"]
        group = () if kind == "DELETED" else containers_of(pod)
        with self._lock:
            if group:
                self._pods[uid] = group
            else:
                self._pods.pop(uid, None)
            self._flat = None

    def _node_once(self) -> None:
        selection = Selection(Node, fields={"metadata.name": self.node})
        list_and_watch(
            self.client,
            selection,
            self._replace_node,
            self._node_event,
            self.stopping,
            self.resync_s,
        )

    def _replace_node(self, objects: list[dict[str, Any]]) -> None:
        for node in objects:
            self._node_event("ADDED", node)

    def _node_event(self, kind: str, node: dict[str, Any]) -> None:
        health = {} if kind == "DELETED" else gpu_health(node)
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
