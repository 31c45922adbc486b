"""Simulated GPU nodes: Node objects with GPU capacity, a Ready condition and a Lease.

No kubelet runs. `up` registers each node as a kubelet would (the Node with its status,
then its Lease in kube-node-lease) and the heartbeat process (cluster/heartbeat.py) keeps
the Lease and the Ready condition fresh. The scheduler binds pods to these nodes; nothing
starts them.
"""

from __future__ import annotations

import asyncio
import datetime
import re
import uuid
from collections.abc import Iterable
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

from lightkube import ApiError, AsyncClient, KubeConfig
from lightkube.resources.coordination_v1 import Lease
from lightkube.resources.core_v1 import Namespace, Node

from gpushare import protocol
from gpushare.cluster.state import ClusterError
from gpushare.model import Gpu
from gpushare.model import Node as NodeModel
from gpushare.sim.trace import TraceError, load_nodes

# GPU memory by model; the Alibaba trace gives models but no sizes. Others: --gpu-memory-gib.
KNOWN_GPU_MEMORY_GIB = {
    "A10": 24,
    "A100": 80,
    "H100": 80,
    "H200": 141,
    "L4": 24,
    "L40S": 48,
    "P100": 16,
    "T4": 16,
    "V100M16": 16,
    "V100M32": 32,
}
FALLBACK_GPU_MEMORY_GIB = 16
DEFAULT_PODS_PER_NODE = 110
SIMULATED_VERSION = "v1.34.0-gpushare-simulated"
_NAME = re.compile(r"[a-z0-9]([-a-z0-9]*[a-z0-9])?(\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*")
_UUID_NAMESPACE = uuid.UUID("6f1d2b9e-3c4a-4e8f-9a61-0c7d52e4b1a3")


@dataclass(frozen=True, slots=True)
class NodeSpec:
    """How to make the simulated nodes: N alike, or the rows of a node list CSV."""

    count: int = 4
    gpus_per_node: int = 8
    gpu_model: str = "H200"
    gpu_memory_gib: int | None = None  # None: KNOWN_GPU_MEMORY_GIB, else the fallback
    cpu: int = 64
    memory_gib: int = 512
    pods_per_node: int = DEFAULT_PODS_PER_NODE
    name_prefix: str = "gpu-node-"
    node_list: Path | None = None  # the Alibaba trace format: sn,cpu_milli,memory_mib,gpu,model


def gpu_memory_gib(model: str, override: int | None) -> int:
    if override is not None:
        return override
    return KNOWN_GPU_MEMORY_GIB.get(model, FALLBACK_GPU_MEMORY_GIB)


def gpu_uuid(node: str, index: int) -> str:
    """A stable NVIDIA-style UUID for a simulated GPU."""
    return f"GPU-{uuid.uuid5(_UUID_NAMESPACE, f'{node}/{index}')}"


def _gpus(node: str, count: int, model: str, memory_gib: int) -> tuple[Gpu, ...]:
    # Half the GPUs on each of two NUMA nodes, as on a two-socket server.
    return tuple(
        Gpu(
            index=i,
            uuid=gpu_uuid(node, i),
            model=model,
            memory_mib=memory_gib * protocol.MIB_PER_GIB,
            numa_node=i * 2 // count if count > 1 else 0,
        )
        for i in range(count)
    )


def check_name(name: str, where: str) -> None:
    if len(name) > 253 or not _NAME.fullmatch(name):
        raise ClusterError(
            f"{where}: node name {name!r} is not a valid Kubernetes name "
            "(lowercase letters, digits, '-' and '.')"
        )


def build_nodes(spec: NodeSpec) -> list[NodeModel]:
    """The nodes ``spec`` describes; ClusterError (one line) for a bad option or node list."""
    if spec.node_list is not None:
        return _nodes_from_list(spec.node_list, spec.gpu_memory_gib)
    for option, value in (
        ("--nodes", spec.count),
        ("--cpu-per-node", spec.cpu),
        ("--memory-gib-per-node", spec.memory_gib),
        ("--pods-per-node", spec.pods_per_node),
    ):
        if value < 1:
            raise ClusterError(f"{option} {value}: must be at least 1")
    if spec.gpus_per_node < 0:
        raise ClusterError(f"--gpus-per-node {spec.gpus_per_node}: must not be negative")
    if spec.gpu_memory_gib is not None and spec.gpu_memory_gib < 1:
        raise ClusterError(f"--gpu-memory-gib {spec.gpu_memory_gib}: must be at least 1")
    if not spec.gpu_model.strip():
        raise ClusterError("--gpu-model: must not be empty")
    width = max(2, len(str(spec.count - 1)))
    memory = gpu_memory_gib(spec.gpu_model, spec.gpu_memory_gib)
    nodes = []
    for i in range(spec.count):
        name = f"{spec.name_prefix}{i:0{width}d}"
        check_name(name, "--node-prefix")
        nodes.append(
            NodeModel(
                name=name,
                gpus=_gpus(name, spec.gpus_per_node, spec.gpu_model, memory),
                cpu_milli=spec.cpu * 1000,
                memory_mib=spec.memory_gib * protocol.MIB_PER_GIB,
            )
        )
    return nodes


def _nodes_from_list(path: Path, memory_override: int | None) -> list[NodeModel]:
    try:
        trace_nodes = load_nodes(path)
    except TraceError as error:
        raise ClusterError(str(error)) from None
    nodes = []
    for node in trace_nodes:
        check_name(node.name, str(path))
        model = node.gpus[0].model if node.gpus else ""
        memory = gpu_memory_gib(model, memory_override)
        # The trace's own GPU objects have a notional size; give them a real one.
        gpus = _gpus(node.name, len(node.gpus), model, memory) if node.gpus else ()
        nodes.append(replace(node, gpus=gpus))
    return nodes


def _quantity_cpu(milli: int) -> str:
    return str(milli // 1000) if milli % 1000 == 0 else f"{milli}m"


def _quantity_memory(mib: int) -> str:
    """``mib`` MiB in the canonical form the apiserver stores (512Gi, not 524288Mi)."""
    for suffix in ("Ti", "Gi"):
        size = 1024 if suffix == "Gi" else 1024 * 1024
        if mib and mib % size == 0:
            return f"{mib // size}{suffix}"
    return f"{mib}Mi"


def resources(node: NodeModel, pods: int) -> dict[str, str]:
    """A node's capacity (= allocatable: nothing is reserved on a simulated node)."""
    gpu_mem_gib = sum(gpu.memory_mib // protocol.MIB_PER_GIB for gpu in node.gpus)
    return {
        "cpu": _quantity_cpu(node.cpu_milli),
        "memory": _quantity_memory(node.memory_mib),
        "pods": str(pods),
        protocol.RESOURCE_GPU_MEMORY: str(gpu_mem_gib),
        protocol.RESOURCE_GPU_CORE: str(protocol.CORE_PER_GPU * len(node.gpus)),
        protocol.RESOURCE_GPU_COUNT: str(len(node.gpus)),
    }


def gpu_infos(node: NodeModel) -> list[protocol.GpuInfo]:
    return [
        protocol.GpuInfo(
            uuid=gpu.uuid,
            index=gpu.index,
            model=gpu.model,
            memory_mib=gpu.memory_mib,
            numa=gpu.numa_node,
            healthy=gpu.healthy,
        )
        for gpu in node.gpus
    ]


def now_time() -> str:
    return datetime.datetime.now(datetime.UTC).strftime("%Y-%m-%dT%H:%M:%SZ")


def now_micro_time() -> str:
    return datetime.datetime.now(datetime.UTC).strftime("%Y-%m-%dT%H:%M:%S.%fZ")


def conditions(now: str) -> list[dict[str, str]]:
    """A healthy kubelet's node conditions, with heartbeat time ``now``."""
    rows = [
        ("MemoryPressure", "False", "KubeletHasSufficientMemory", "no memory pressure"),
        ("DiskPressure", "False", "KubeletHasNoDiskPressure", "no disk pressure"),
        ("PIDPressure", "False", "KubeletHasSufficientPID", "no PID pressure"),
        ("Ready", "True", "KubeletReady", "simulated by gpushare cluster; no kubelet"),
    ]
    return [
        {
            "type": kind,
            "status": status,
            "reason": reason,
            "message": message,
            "lastHeartbeatTime": now,
            "lastTransitionTime": now,
        }
        for kind, status, reason, message in rows
    ]


def node_manifest(node: NodeModel, pods: int) -> dict[str, Any]:
    """The Node object a kubelet would register for ``node``, status included."""
    labels = {
        "kubernetes.io/hostname": node.name,
        "kubernetes.io/os": "linux",
        "kubernetes.io/arch": "amd64",
        protocol.LABEL_SIMULATED: "true",
    }
    if node.gpus:
        labels[protocol.LABEL_ENABLED] = "true"
        labels[protocol.LABEL_GPU_MODEL] = protocol.label_value(node.gpus[0].model)
    capacity = resources(node, pods)
    system_uuid = str(uuid.uuid5(_UUID_NAMESPACE, node.name))
    return {
        "apiVersion": "v1",
        "kind": "Node",
        "metadata": {
            "name": node.name,
            "labels": labels,
            "annotations": {protocol.ANNOTATION_GPUS: protocol.encode_gpus(gpu_infos(node))},
        },
        "spec": {},
        "status": {
            "capacity": capacity,
            "allocatable": dict(capacity),
            "conditions": conditions(now_time()),
            "addresses": [{"type": "Hostname", "address": node.name}],
            "nodeInfo": {
                "machineID": system_uuid.replace("-", ""),
                "systemUUID": system_uuid,
                "bootID": system_uuid,
                "kernelVersion": "simulated",
                "osImage": "gpushare simulated node",
                "containerRuntimeVersion": "none://0",
                "kubeletVersion": SIMULATED_VERSION,
                "kubeProxyVersion": "",
                "operatingSystem": "linux",
                "architecture": "amd64",
            },
        },
    }


def lease_manifest(name: str, node_uid: str | None) -> dict[str, Any]:
    metadata: dict[str, Any] = {"name": name, "namespace": protocol.NODE_LEASE_NAMESPACE}
    if node_uid:
        # As a kubelet does: the Lease goes away with its Node.
        metadata["ownerReferences"] = [
            {"apiVersion": "v1", "kind": "Node", "name": name, "uid": node_uid}
        ]
    return {
        "apiVersion": "coordination.k8s.io/v1",
        "kind": "Lease",
        "metadata": metadata,
        "spec": {
            "holderIdentity": name,
            "leaseDurationSeconds": protocol.NODE_LEASE_DURATION_S,
            "renewTime": now_micro_time(),
        },
    }


def client_for(kubeconfig: Path) -> AsyncClient:
    return AsyncClient(config=KubeConfig.from_file(kubeconfig), field_manager="gpushare-cluster")


async def _ensure_namespace(client: AsyncClient, name: str) -> None:
    try:
        await client.create(Namespace.from_dict({"metadata": {"name": name}}))
    except ApiError as error:
        if error.status.code != 409:  # the apiserver made it first
            raise


async def _register(
    kubeconfig: Path, nodes: Iterable[NodeModel], pods: int, concurrency: int
) -> None:
    client = client_for(kubeconfig)
    try:
        await _ensure_namespace(client, protocol.NODE_LEASE_NAMESPACE)
        gate = asyncio.Semaphore(concurrency)

        async def register(node: NodeModel) -> None:
            async with gate:
                created = await client.create(Node.from_dict(node_manifest(node, pods)))
                uid = created.metadata.uid if created.metadata else None
                await client.create(Lease.from_dict(lease_manifest(node.name, uid)))

        await asyncio.gather(*(register(node) for node in nodes))
    finally:
        await client.close()


def register_nodes(
    kubeconfig: Path, nodes: list[NodeModel], pods: int, concurrency: int = 48
) -> None:
    """Create each node and its Lease, ``concurrency`` requests at a time."""
    try:
        asyncio.run(_register(kubeconfig, nodes, pods, concurrency))
    except ApiError as error:
        raise ClusterError(f"cannot create a simulated node: {error.status.message}") from None
