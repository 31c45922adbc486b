"""Hand-made node and pod objects, in the Kubernetes JSON shape, for the extender's tests."""

from __future__ import annotations

from typing import Any

from gpushare import protocol
from gpushare.protocol import GpuInfo

GIB = 1024


def node(
    name: str,
    gpus: int = 2,
    memory_gib: int = 16,
    model: str = "T4",
    *,
    unhealthy: tuple[int, ...] = (),
    policy: str | None = None,
    enabled: bool = True,
) -> dict[str, Any]:
    inventory = [
        GpuInfo(f"GPU-{name}-{i}", i, model, memory_gib * GIB, i % 2, i not in unhealthy)
        for i in range(gpus)
    ]
    labels = {protocol.LABEL_GPU_MODEL: model}
    if enabled:
        labels[protocol.LABEL_ENABLED] = "true"
    if policy:
        labels[protocol.LABEL_POLICY] = policy
    return {
        "metadata": {
            "name": name,
            "labels": labels,
            "annotations": {protocol.ANNOTATION_GPUS: protocol.encode_gpus(inventory)},
        },
        "status": {"allocatable": {protocol.RESOURCE_GPU_MEMORY: str(gpus * memory_gib)}},
    }


def container(name: str = "main", **resources: Any) -> dict[str, Any]:
    names = {
        "mem": protocol.RESOURCE_GPU_MEMORY,
        "core": protocol.RESOURCE_GPU_CORE,
        "gpu": protocol.RESOURCE_GPU_COUNT,
    }
    limits = {names[key]: value for key, value in resources.items()}
    return {"name": name, "image": "busybox", "resources": {"limits": limits}}


def pod(
    name: str,
    *containers: dict[str, Any],
    namespace: str = "default",
    uid: str | None = None,
    annotations: dict[str, str] | None = None,
    init: tuple[dict[str, Any], ...] = (),
    node_name: str | None = None,
    phase: str = "Pending",
) -> dict[str, Any]:
    spec: dict[str, Any] = {"containers": list(containers) or [container(mem=1)]}
    if init:
        spec["initContainers"] = list(init)
    if node_name:
        spec["nodeName"] = node_name
    return {
        "metadata": {
            "name": name,
            "namespace": namespace,
            "uid": uid or f"uid-{namespace}-{name}",
            "annotations": dict(annotations or {}),
        },
        "spec": spec,
        "status": {"phase": phase},
    }


def args(the_pod: dict[str, Any], *names: str) -> dict[str, Any]:
    return {"pod": the_pod, "nodenames": list(names)}


class FakeBinder:
    """Records the bind's API calls; can be told to fail the Binding."""

    def __init__(self) -> None:
        self.annotations: dict[str, dict[str, str | None]] = {}
        self.bound: dict[str, str] = {}
        self.fail_bind: Exception | None = None
        self.pods: dict[str, dict[str, Any]] = {}

    def bind(
        self, namespace: str, name: str, uid: str, node: str, annotations: dict[str, str]
    ) -> None:
        if self.fail_bind is not None:
            raise self.fail_bind
        self.bound[f"{namespace}/{name}"] = node
        self.annotations.setdefault(f"{namespace}/{name}", {}).update(annotations)

    def get_pod(self, namespace: str, name: str) -> dict[str, Any]:
        return self.pods[f"{namespace}/{name}"]
