"""The extender's link to the API server: watches that feed the cache, and the bind's calls.

Each of nodes and pods has a thread that lists once (a full replace of the cache's view),
then watches from the list's resourceVersion; a watch error (the version expired, the
connection dropped) or the resync interval leads to a fresh list. No verb ever lists.
"""

from __future__ import annotations

import logging
import threading
from typing import Any

from lightkube import Client
from lightkube.resources.core_v1 import Node, Pod

from gpushare.extender.binding import BindingClient
from gpushare.extender.cache import ClusterCache
from gpushare.kubewatch import Selection, keep_listing_and_watching, list_and_watch

log = logging.getLogger("gpushare.extender")

RESYNC_S = 300.0
RETRY_S = 1.0


class KubeBinder:
    """The bind's API calls: the Binding through ``bindings`` (binding.py), the rest with a
    lightkube client."""

    def __init__(self, client: Client, bindings: BindingClient) -> None:
        self.client = client
        self.bindings = bindings

    def annotate_node(self, name: str, annotations: dict[str, str]) -> None:
        self.client.patch(Node, name, {"metadata": {"annotations": annotations}})

    def bind(
        self, namespace: str, name: str, uid: str, node: str, annotations: dict[str, str]
    ) -> None:
        """Bind the pod and set its annotations in one update (the Binding carries them)."""
        self.bindings.bind(namespace, name, uid, node, annotations)

    def get_pod(self, namespace: str, name: str) -> dict[str, Any]:
        return self.client.get(Pod, name, namespace=namespace).to_dict()


class Watcher:
    """Two threads keeping ``cache`` in step with the cluster's nodes and pods."""

    def __init__(self, client: Client, cache: ClusterCache, resync_s: float = RESYNC_S) -> None:
        self.client = client
        self.cache = cache
        self.resync_s = resync_s
        self.stopping = threading.Event()
        self.threads = [
            threading.Thread(target=self._run, args=(Node,), name="watch-nodes", daemon=True),
            threading.Thread(target=self._run, args=(Pod,), name="watch-pods", daemon=True),
        ]

    def start(self) -> None:
        for thread in self.threads:
            thread.start()

    def stop(self) -> None:
        self.stopping.set()

    def _run(self, resource: Any) -> None:
        if resource is Node:
            selection = Selection(Node)
            on_list, on_event = self.cache.replace_nodes, self._node_event
        else:
            selection = Selection(Pod, namespaced=True)
            on_list, on_event = self.cache.replace_pods, self._pod_event

        def listed(objects: list[dict[str, Any]]) -> None:
            on_list(objects)
            log.info("listed %d %s(s)", len(objects), resource.__name__)

        keep_listing_and_watching(
            lambda: list_and_watch(
                self.client, selection, listed, on_event, self.stopping, self.resync_s
            ),
            self.stopping,
            f"watch {resource.__name__}",
            log,
            backoff_min_s=RETRY_S,
        )

    def _node_event(self, kind: str, data: dict[str, Any]) -> None:
        if kind == "DELETED":
            self.cache.delete_node(data["metadata"]["name"])
        else:
            self.cache.upsert_node(data)

    def _pod_event(self, kind: str, data: dict[str, Any]) -> None:
        if kind == "DELETED":
            self.cache.delete_pod(data)
        else:
            self.cache.upsert_pod(data)
