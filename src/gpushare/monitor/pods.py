"""The node's GPU containers, from its pods' ``gpushare.io/allocation`` annotations.

Pure: takes pod and node objects in the Kubernetes JSON shape (``to_dict()`` of lightkube
objects) and returns plain records, parsed once when a pod changes rather than on each scrape.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass
from typing import Any

from gpushare import protocol
from gpushare.monitor.cgroup import runtime_id

log = logging.getLogger("gpushare.monitor")

MIB = 1 << 20


@dataclass(frozen=True, slots=True)
class Container:
    """One container of a pod on this node that holds GPU shares."""

    namespace: str
    pod: str
    pod_uid: str
    name: str
    container_id: str | None  # the runtime's ID once kubelet reports it
    shares: tuple[protocol.ShareInfo, ...]

    @property
    def exclusive(self) -> bool:
        return any(share.exclusive for share in self.shares)

    def share_on(self, uuid: str) -> protocol.ShareInfo | None:
        return next((share for share in self.shares if share.uuid == uuid), None)

    def device_index(self, uuid: str) -> int | None:
        """The index of GPU ``uuid`` inside the container (its state file's device index).

        The container sees only its GPUs, numbered in the node's order (NVML and CUDA agree
        inside a container without a reordering CUDA_VISIBLE_DEVICES; docs/isolation.md).
        """
        ordered = sorted(self.shares, key=lambda share: share.index)
        return next((i for i, share in enumerate(ordered) if share.uuid == uuid), None)


def containers_of(pod: dict[str, Any]) -> tuple[Container, ...]:
    """The GPU containers of a pod; none for an ended pod or one without a valid allocation."""
    metadata = pod.get("metadata") or {}
    text = (metadata.get("annotations") or {}).get(protocol.ANNOTATION_ALLOCATION)
    if not text or protocol.pod_ended(pod):
        return ()
    namespace = str(metadata.get("namespace") or "default")
    name = str(metadata.get("name") or "")
    try:
        allocation = protocol.decode_allocation(text)
    except protocol.ProtocolError as error:
        log.warning("pod %s/%s: ignoring its allocation: %s", namespace, name, error)
        return ()
    status = pod.get("status") or {}
    ids: dict[str, str] = {}
    for key in ("initContainerStatuses", "containerStatuses"):
        for entry in status.get(key) or ():
            if entry.get("containerID"):
                ids[entry["name"]] = runtime_id(entry["containerID"])
    uid = str(metadata.get("uid") or "")
    return tuple(
        Container(namespace, name, uid, container, ids.get(container), tuple(shares))
        for container, shares in sorted(allocation.items())
    )


def gpu_health(node: dict[str, Any] | None) -> dict[str, bool]:
    """GPU UUID → healthy, from the node's ``gpushare.io/gpus`` annotation (the device plugin
    keeps it from NVML's health events); empty when the node or annotation is missing."""
    if not node:
        return {}
    text = ((node.get("metadata") or {}).get("annotations") or {}).get(protocol.ANNOTATION_GPUS)
    if not text:
        return {}
    try:
        return {gpu.uuid: gpu.healthy for gpu in protocol.decode_gpus(text)}
    except protocol.ProtocolError as error:
        log.warning("node annotation ignored: %s", error)
        return {}


class StaticPodSource:
    """Fixed pods and node (``gpushare monitor --pods-file``, tests, the benchmark)."""

    def __init__(self, pods: list[dict[str, Any]], node: dict[str, Any] | None = None) -> None:
        self._containers = [c for pod in pods for c in containers_of(pod)]
        self._health = gpu_health(node)

    @property
    def synced(self) -> bool:
        return True

    def containers(self) -> list[Container]:
        return self._containers

    def gpu_health(self) -> dict[str, bool]:
        return self._health


def load_pods_file(text: str, where: str) -> tuple[list[dict[str, Any]], dict[str, Any] | None]:
    """Pods and the node from a JSON or YAML file holding a List (``kubectl get -o json``
    output) or a single object; ValueError naming ``where`` if it is not one."""
    import yaml

    try:
        documents = [d for d in yaml.safe_load_all(text) if d is not None]
    except yaml.YAMLError as error:
        problem = str(error).splitlines()[0]
        raise ValueError(f"{where}: not JSON or YAML: {problem}") from None
    items: list[Any] = []
    for document in documents:
        if not isinstance(document, dict):
            raise ValueError(f"{where}: expected Kubernetes objects, got {type(document).__name__}")
        items.extend(document.get("items") or () if "items" in document else [document])
    pods, node = [], None
    for item in items:
        kind = item.get("kind") if isinstance(item, dict) else None
        if kind == "Pod":
            pods.append(item)
        elif kind == "Node":
            node = item
        else:
            raise ValueError(f"{where}: expected Pod or Node objects, got kind {kind!r}")
    return pods, node
