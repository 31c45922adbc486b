"""The contract between gpushare components: resource names, labels, annotations, endpoints.

Every component that reads or writes a gpushare name on a Kubernetes object takes it from
here, so that the node agent, the scheduler extender, the device plugin and the simulated
cluster cannot drift apart. docs/protocol.md describes each name and its unit.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from typing import Any

DOMAIN = "gpushare.io"

# Extended resources a node advertises in status.capacity/allocatable and a pod requests.
RESOURCE_GPU_MEMORY = f"{DOMAIN}/gpu-mem"  # GPU memory in GiB, summed over the node's GPUs
RESOURCE_GPU_CORE = f"{DOMAIN}/gpu-core"  # GPU compute in percent of one GPU: 100 per GPU
RESOURCE_GPU_COUNT = f"{DOMAIN}/gpu"  # whole GPUs
MANAGED_RESOURCES = (RESOURCE_GPU_MEMORY, RESOURCE_GPU_CORE, RESOURCE_GPU_COUNT)
CORE_PER_GPU = 100
MIB_PER_GIB = 1024

# Node labels.
LABEL_ENABLED = f"{DOMAIN}/enabled"  # "true": gpushare manages this node's GPUs
LABEL_GPU_MODEL = f"{DOMAIN}/gpu-model"  # the model of the node's GPUs (label-safe form)
LABEL_SIMULATED = f"{DOMAIN}/simulated"  # "true": a node of `gpushare cluster`, no kubelet

# Node annotation: the node's GPUs as a JSON list of GpuInfo.to_json() objects.
ANNOTATION_GPUS = f"{DOMAIN}/gpus"
# Node annotation written by the extender when its cache frees a share while a pod waits:
# nanoseconds since the epoch. Its change makes kube-scheduler retry the pods it refused.
ANNOTATION_CAPACITY_FREED = f"{DOMAIN}/capacity-freed"

# The scheduler extender's HTTP endpoint (deploy/scheduler/kube-scheduler-config.yaml).
EXTENDER_DEFAULT_PORT = 39999
# The node agent's Prometheus endpoint (`gpushare monitor`, deploy/node-agent.yaml).
MONITOR_DEFAULT_PORT = 9445
EXTENDER_PATH_PREFIX = "/gpushare-scheduler"
EXTENDER_FILTER_VERB = "filter"
EXTENDER_PRIORITIZE_VERB = "prioritize"
EXTENDER_BIND_VERB = "bind"

# Where node heartbeats live, as for a kubelet.
NODE_LEASE_NAMESPACE = "kube-node-lease"
NODE_LEASE_DURATION_S = 40


# -- compatibility with Alibaba's gpushare (AliyunContainerService/gpushare-scheduler-extender) --
# Understood only with `gpushare extender --compat-aliyun`. A container's aliyun.com/gpu-mem is
# GPU memory in GiB on each of its GPUs; aliyun.com/gpu-count, if given, the number of GPUs.
ALIYUN_RESOURCE_GPU_MEMORY = "aliyun.com/gpu-mem"
ALIYUN_RESOURCE_GPU_COUNT = "aliyun.com/gpu-count"
ALIYUN_RESOURCES = (ALIYUN_RESOURCE_GPU_MEMORY, ALIYUN_RESOURCE_GPU_COUNT)
# Pod annotations its device plugin reads, written by bind in addition to ours.
ALIYUN_ANNOTATION_GPU_INDEX = "ALIYUN_COM_GPU_MEM_IDX"  # GPU index(es), comma-separated
ALIYUN_ANNOTATION_POD_MEMORY = "ALIYUN_COM_GPU_MEM_POD"  # the pod's GPU memory in GiB
ALIYUN_ANNOTATION_DEV_MEMORY = "ALIYUN_COM_GPU_MEM_DEV"  # the (first) GPU's memory in GiB
ALIYUN_ANNOTATION_ASSIGNED = "ALIYUN_COM_GPU_MEM_ASSIGNED"  # "false"; the device plugin: "true"
ALIYUN_ANNOTATION_ASSUME_TIME = "ALIYUN_COM_GPU_MEM_ASSUME_TIME"  # ns since the epoch
# What kube-scheduler leaves to the extender (managedResources, ignoredByScheduler).
SCHEDULER_MANAGED_RESOURCES = MANAGED_RESOURCES + ALIYUN_RESOURCES


class ProtocolError(ValueError):
    """A gpushare annotation or label that does not follow this contract."""


@dataclass(frozen=True, slots=True)
class GpuInfo:
    """One GPU of a node as the ANNOTATION_GPUS annotation describes it."""

    uuid: str
    index: int
    model: str
    memory_mib: int
    numa: int = 0
    healthy: bool = True

    def to_json(self) -> dict[str, object]:
        return {
            "uuid": self.uuid,
            "index": self.index,
            "model": self.model,
            "memoryMiB": self.memory_mib,
            "numa": self.numa,
            "healthy": self.healthy,
        }

    @classmethod
    def from_json(cls, item: object) -> GpuInfo:
        if not isinstance(item, dict):
            raise ProtocolError(f"{ANNOTATION_GPUS}: expected an object per GPU, got {item!r}")
        fields = {
            "uuid": str,
            "index": int,
            "model": str,
            "memoryMiB": int,
            "numa": int,
            "healthy": bool,
        }
        for key, kind in fields.items():
            value = item.get(key)
            # bool is an int in Python; a count given as true/false is still wrong.
            if not isinstance(value, kind) or (kind is int and isinstance(value, bool)):
                raise ProtocolError(
                    f"{ANNOTATION_GPUS}: GPU {item.get('index', '?')}: {key} must be "
                    f"{kind.__name__}, got {value!r}"
                )
        return cls(
            uuid=item["uuid"],
            index=item["index"],
            model=item["model"],
            memory_mib=item["memoryMiB"],
            numa=item["numa"],
            healthy=item["healthy"],
        )


def encode_gpus(gpus: list[GpuInfo]) -> str:
    """The ANNOTATION_GPUS value for these GPUs."""
    return json.dumps([gpu.to_json() for gpu in gpus], separators=(",", ":"))


def decode_gpus(text: str) -> list[GpuInfo]:
    """The GPUs of an ANNOTATION_GPUS value; ProtocolError (one line) if it is malformed."""
    try:
        items = json.loads(text)
    except json.JSONDecodeError as error:
        raise ProtocolError(f"{ANNOTATION_GPUS}: not JSON: {error}") from None
    if not isinstance(items, list):
        raise ProtocolError(f"{ANNOTATION_GPUS}: expected a JSON list")
    return [GpuInfo.from_json(item) for item in items]


def label_value(text: str) -> str:
    """``text`` as a valid label value: at most 63 of [A-Za-z0-9._-], alphanumeric at the ends."""
    cleaned = "".join(c if c.isascii() and (c.isalnum() or c in "._-") else "-" for c in text)
    return cleaned[:63].strip("._-")


# -- the scheduler extender's side (docs/protocol.md, "Pods") ---------------------------------

# Node label: the node's GPU placement policy (a name of gpushare.placement.policies).
LABEL_POLICY = f"{DOMAIN}/policy"
LABEL_ISOLATION = f"{DOMAIN}/isolation"  # memory | memory-core | none
DEFAULT_NODE_POLICY = "binpack"

# Pod annotations set by users.
ANNOTATION_GPU_COUNT = f"{DOMAIN}/gpu-count"  # spread each shared container over N GPUs
ANNOTATION_GPU_MODEL = f"{DOMAIN}/gpu-model"  # allowed models, "|"-separated
ANNOTATION_POLICY = f"{DOMAIN}/policy"  # overrides the node's LABEL_POLICY for this pod

# Pod annotations written by the extender when it binds a pod.
ANNOTATION_ALLOCATION = f"{DOMAIN}/allocation"  # {container: [{uuid, index, memoryMiB, core}]}
ANNOTATION_ASSUME_TIME = f"{DOMAIN}/assume-time"  # nanoseconds since the epoch, as a string
ANNOTATION_PHASE = f"{DOMAIN}/phase"
PHASE_ASSUMED = "assumed"  # the extender chose the GPUs; the device plugin has not served it
PHASE_ALLOCATED = "allocated"  # the device plugin has served it


@dataclass(frozen=True, slots=True)
class ShareInfo:
    """One GPU's part of a container's allocation, as ANNOTATION_ALLOCATION lists it."""

    uuid: str
    index: int
    memory_mib: int
    core: int
    exclusive: bool = False

    def to_json(self) -> dict[str, object]:
        item: dict[str, object] = {
            "uuid": self.uuid,
            "index": self.index,
            "memoryMiB": self.memory_mib,
            "core": self.core,
        }
        if self.exclusive:
            item["exclusive"] = True
        return item


def encode_allocation(containers: dict[str, list[ShareInfo]]) -> str:
    """The ANNOTATION_ALLOCATION value: each GPU container's name to its GPU shares."""
    return json.dumps(
        {name: [share.to_json() for share in shares] for name, shares in containers.items()},
        separators=(",", ":"),
        sort_keys=True,
    )


def pod_key(pod: dict[str, Any]) -> str:
    """``namespace/name`` of a pod in the Kubernetes JSON shape: how components name pods."""
    metadata = pod.get("metadata") or {}
    return f"{metadata.get('namespace') or 'default'}/{metadata.get('name') or ''}"


def pod_ended(pod: dict[str, Any]) -> bool:
    """A pod that has run to its end (Succeeded or Failed) holds no GPU any more."""
    return (pod.get("status") or {}).get("phase") in ("Succeeded", "Failed")


def regular_init_names(pod: dict[str, Any]) -> frozenset[str]:
    """The init containers of a pod (Kubernetes JSON) that run to completion before its app
    containers start: their ANNOTATION_ALLOCATION entries follow the max rule (docs/protocol.md).

    Sidecars (``restartPolicy: Always``) keep running beside the app containers, so they are
    not among them: they hold their share like an app container (model/charges.py).
    """
    spec = pod.get("spec") or {}
    containers = spec.get("initContainers") if isinstance(spec, dict) else None
    return frozenset(
        str(container.get("name") or "")
        for container in containers or []
        if isinstance(container, dict) and container.get("restartPolicy") != "Always"
    )


def decode_allocation(text: str) -> dict[str, list[ShareInfo]]:
    """The shares of an ANNOTATION_ALLOCATION value; ProtocolError (one line) if malformed."""
    where = ANNOTATION_ALLOCATION
    try:
        value = json.loads(text)
    except json.JSONDecodeError as error:
        raise ProtocolError(f"{where}: not JSON: {error}") from None
    if not isinstance(value, dict):
        raise ProtocolError(f"{where}: expected a JSON object of container names")
    result: dict[str, list[ShareInfo]] = {}
    for name, items in value.items():
        if not isinstance(items, list):
            raise ProtocolError(f"{where}: container {name}: expected a list of GPUs")
        shares = []
        for item in items:
            if not isinstance(item, dict):
                raise ProtocolError(f"{where}: container {name}: expected an object per GPU")
            for key, kind in (("uuid", str), ("index", int), ("memoryMiB", int), ("core", int)):
                field = item.get(key)
                if not isinstance(field, kind) or (kind is int and isinstance(field, bool)):
                    raise ProtocolError(
                        f"{where}: container {name}: {key} must be {kind.__name__}, got {field!r}"
                    )
            exclusive = item.get("exclusive", False)
            if not isinstance(exclusive, bool):
                raise ProtocolError(f"{where}: container {name}: exclusive must be bool")
            shares.append(
                ShareInfo(item["uuid"], item["index"], item["memoryMiB"], item["core"], exclusive)
            )
        result[name] = shares
    return result


# -- the device plugin's side (docs/protocol.md, "Device plugin") -----------------------------

# The kubelet device plugin API (k8s.io/kubelet/pkg/apis/deviceplugin/v1beta1).
DEVICE_PLUGIN_API_VERSION = "v1beta1"
KUBELET_DEVICE_PLUGIN_DIR = "/var/lib/kubelet/device-plugins"
KUBELET_SOCKET_NAME = "kubelet.sock"
# kubelet's pod resources API (k8s.io/kubelet/pkg/apis/podresources/v1): who holds which devices.
KUBELET_POD_RESOURCES_SOCKET = "/var/lib/kubelet/pod-resources/kubelet.sock"
# One socket (and one registration) per resource, in KUBELET_DEVICE_PLUGIN_DIR.
DEVICE_PLUGIN_SOCKETS = {
    RESOURCE_GPU_MEMORY: "gpushare-gpu-mem.sock",
    RESOURCE_GPU_CORE: "gpushare-gpu-core.sock",
    RESOURCE_GPU_COUNT: "gpushare-gpu.sock",
}
DEVICE_HEALTHY = "Healthy"
DEVICE_UNHEALTHY = "Unhealthy"

# What Allocate gives a container, on the container's side.
CONTAINER_LIMITS_PATH = "/etc/gpushare/limits.conf"  # read-only; docs/isolation.md "Limits"
CONTAINER_STATE_DIR = "/var/run/gpushare"  # where the library keeps gpushare.state
CONTAINER_LD_SO_PRELOAD = "/etc/ld.so.preload"  # read-only, names CONTAINER_LIBRARY_PATH
CONTAINER_LIBRARY_PATH = "/usr/local/gpushare/lib/libgpushare.so"
# On the host: where native/build/libgpushare.so is installed, and the per-container files.
HOST_LIBRARY_PATH = "/usr/local/gpushare/lib/libgpushare.so"
HOST_STATE_ROOT = "/var/lib/gpushare"  # <root>/containers/<pod uid>/<container>/
# In such a directory, after kubelet admitted two identical containers the other way round:
# "<pod uid>/<container>" of the container that really uses it (written by the device plugin,
# read by the monitor to attribute the state file).
HOST_OWNER_FILE = "owner"

# The NVIDIA container runtime's inputs.
ENV_NVIDIA_VISIBLE_DEVICES = "NVIDIA_VISIBLE_DEVICES"  # GPU UUIDs, comma-separated
NVIDIA_DEVICE_LIST_VOLUME_DIR = "/var/run/nvidia-container-devices"  # .../<uuid> mounts
NVIDIA_CDI_KIND = "nvidia.com/gpu"  # CDI device names: nvidia.com/gpu=<uuid>
# Set on every container the device plugin serves, for the programs in it (informational).
ENV_GPUSHARE_POD = "GPUSHARE_POD"  # namespace/name of the pod whose allocation was served
