"""A pod's gpushare requests: one placement Request per container that asks for a GPU.

A container asks in its resources (limits, or requests when no limit is given):

- ``gpushare.io/gpu-mem``: GPU memory, its total over its GPUs, in the cluster's unit (GiB by
  default, MiB as a setting), split evenly over ``gpushare.io/gpu-count`` GPUs (a pod
  annotation, default 1);
- ``gpushare.io/gpu-core``: percent of each of those GPUs' compute, 1..100 (default: none
  reserved);
- ``gpushare.io/gpu``: whole GPUs, held exclusively (not together with ``gpu-mem``).

The pod annotation ``gpushare.io/gpu-model`` limits the GPU models (``|``-separated) and
``gpushare.io/policy`` overrides the node's placement policy. Host CPU and memory stay with
kube-scheduler: the requests built here ask for none.

Pods are plain dicts in the Kubernetes JSON shape (what the extender receives, and what a
lightkube object's ``to_dict()`` gives).
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Any

from gpushare import protocol
from gpushare.model import FULL_CORE_PERCENT, ModelError, Request
from gpushare.protocol import pod_key, regular_init_names


class RequestError(ValueError):
    """A pod whose gpushare requests are malformed or can never be met; one line, says why."""


@dataclass(frozen=True, slots=True)
class Units:
    """How a cluster counts gpushare.io/gpu-mem: MiB per unit (1024: GiB, the default)."""

    memory_mib_per_unit: int = protocol.MIB_PER_GIB
    # Also place containers that ask for Alibaba gpushare's aliyun.com/gpu-mem (GiB per GPU)
    # and aliyun.com/gpu-count (GPUs); without it such a container is refused with a reason.
    compat_aliyun: bool = False


@dataclass(frozen=True, slots=True)
class ContainerRequest:
    container: str
    init: bool  # a regular init container (not a sidecar): runs alone, before the apps
    request: Request


@dataclass(frozen=True, slots=True)
class PodRequest:
    """A pod's GPU containers, each with its placement request, and the pod's policy."""

    key: str  # namespace/name
    containers: tuple[ContainerRequest, ...]
    policy: str | None  # the pod's gpushare.io/policy annotation, if any
    # The pod states preferences that kube-scheduler's score plugins weigh (preferred node
    # or pod (anti-)affinity, a ScheduleAnyway spread constraint): see has_soft_preferences.
    soft_preferences: bool = False

    @property
    def uses_gpu(self) -> bool:
        return bool(self.containers)


_INTEGER = re.compile(r"^[0-9]+$")


def request_name(key: str, container: str) -> str:
    """The ledger name of one container's request: namespace/pod/container."""
    return f"{key}/{container}"


def _quantity(value: Any, resource: str, container: str) -> int:
    """A whole, non-negative quantity; anything else (1.5, 500m, 1Gi, -1) is an error."""
    text = str(value).strip() if isinstance(value, str | int) else None
    if isinstance(value, bool) or text is None or not _INTEGER.match(text):
        raise RequestError(
            f"container {container}: {resource} must be a whole number, got {value!r}"
        )
    return int(text)


def _resources(container: dict[str, Any]) -> dict[str, Any]:
    resources = container.get("resources") or {}
    found: dict[str, Any] = {}
    # Extended resources must have limits; requests default to them and must equal them.
    for part in ("requests", "limits"):
        for name, value in (resources.get(part) or {}).items():
            if name in protocol.SCHEDULER_MANAGED_RESOURCES:
                found[name] = value
    return found


def _annotation_int(annotations: dict[str, str], name: str, low: int) -> int | None:
    if name not in annotations:
        return None
    text = str(annotations[name]).strip()
    if not _INTEGER.match(text) or int(text) < low:
        raise RequestError(f"annotation {name} must be a whole number >= {low}, got {text!r}")
    return int(text)


def parse_pod(pod: dict[str, Any], units: Units | None = None) -> PodRequest:
    """The pod's gpushare requests, or RequestError naming the container and the problem."""
    units = units or Units()
    key = pod_key(pod)
    metadata = pod.get("metadata") or {}
    annotations = metadata.get("annotations") or {}
    spec = pod.get("spec") or {}
    gpu_count = _annotation_int(annotations, protocol.ANNOTATION_GPU_COUNT, 1)
    models_text = str(annotations.get(protocol.ANNOTATION_GPU_MODEL, "")).strip()
    models = frozenset(m.strip() for m in models_text.split("|") if m.strip())
    policy = annotations.get(protocol.ANNOTATION_POLICY) or None
    containers: list[ContainerRequest] = []
    seen: set[str] = set()
    init_names = regular_init_names(pod)
    for field in ("initContainers", "containers"):
        for container in spec.get(field) or []:
            name = str(container.get("name") or "")
            if name in seen:
                raise RequestError(f"container {name}: name used twice")
            seen.add(name)
            request = _container_request(key, name, _resources(container), gpu_count, models, units)
            if request is not None:
                containers.append(ContainerRequest(name, name in init_names, request))
    if gpu_count is not None and not any(not c.request.exclusive for c in containers):
        raise RequestError(
            f"annotation {protocol.ANNOTATION_GPU_COUNT} set but no container asks for "
            f"{protocol.RESOURCE_GPU_MEMORY}"
        )
    return PodRequest(key, tuple(containers), policy, has_soft_preferences(spec))


def has_soft_preferences(spec: dict[str, Any]) -> bool:
    """True if the pod spec asks kube-scheduler to prefer some nodes over others that fit.

    Such pods need kube-scheduler's score plugins to see every node that fits, so the
    extender's filter passes them all (verbs.filter_nodes); hard rules (required affinity,
    DoNotSchedule spread) are kube-scheduler's filters, applied before the extender is asked.
    """
    affinity = spec.get("affinity") or {}
    for kind in ("nodeAffinity", "podAffinity", "podAntiAffinity"):
        if (affinity.get(kind) or {}).get("preferredDuringSchedulingIgnoredDuringExecution"):
            return True
    return any(
        (constraint or {}).get("whenUnsatisfiable") == "ScheduleAnyway"
        for constraint in spec.get("topologySpreadConstraints") or []
    )


def _container_request(
    key: str,
    name: str,
    resources: dict[str, Any],
    gpu_count: int | None,
    models: frozenset[str],
    units: Units,
) -> Request | None:
    if not resources:
        return None
    values = {res: _quantity(value, res, name) for res, value in resources.items()}
    if any(res in values for res in protocol.ALIYUN_RESOURCES):
        return _aliyun_request(key, name, values, gpu_count, models, units)
    memory = values.get(protocol.RESOURCE_GPU_MEMORY)
    core = values.get(protocol.RESOURCE_GPU_CORE)
    whole = values.get(protocol.RESOURCE_GPU_COUNT)
    where = f"container {name}"
    if whole is not None:
        if memory is not None or core is not None:
            raise RequestError(
                f"{where}: {protocol.RESOURCE_GPU_COUNT} (whole GPUs) cannot be combined with "
                f"{protocol.RESOURCE_GPU_MEMORY} or {protocol.RESOURCE_GPU_CORE}"
            )
        if whole == 0:
            return None
        return _request(key, name, gpu_count=whole, exclusive=True, allowed_models=models)
    if memory is None:
        if core is not None:
            raise RequestError(
                f"{where}: {protocol.RESOURCE_GPU_CORE} needs {protocol.RESOURCE_GPU_MEMORY}"
            )
        return None
    if memory == 0:
        raise RequestError(f"{where}: {protocol.RESOURCE_GPU_MEMORY} must be > 0")
    if core is not None and not 1 <= core <= FULL_CORE_PERCENT:
        raise RequestError(f"{where}: {protocol.RESOURCE_GPU_CORE} must be 1..100, got {core}")
    count = gpu_count or 1
    total_mib = memory * units.memory_mib_per_unit
    if total_mib % count:
        raise RequestError(
            f"{where}: {protocol.RESOURCE_GPU_MEMORY} {memory} cannot be split evenly over "
            f"{count} GPUs"
        )
    return _request(
        key,
        name,
        gpu_count=count,
        memory_mib_per_gpu=total_mib // count,
        core_percent_per_gpu=core or 0,
        allowed_models=models,
    )


def _request(key: str, name: str, **fields: Any) -> Request:
    try:
        return Request(name=request_name(key, name), **fields)
    except ModelError as error:
        raise RequestError(f"container {name}: {error}") from None


def _aliyun_request(
    key: str,
    name: str,
    values: dict[str, int],
    gpu_count: int | None,
    models: frozenset[str],
    units: Units,
) -> Request | None:
    """A container written for Alibaba's gpushare: aliyun.com/gpu-mem GiB on each GPU."""
    where = f"container {name}"
    if not units.compat_aliyun:
        raise RequestError(
            f"{where}: {'/'.join(sorted(set(values) & set(protocol.ALIYUN_RESOURCES)))} "
            f"is understood only with gpushare extender --compat-aliyun"
        )
    if set(values) - set(protocol.ALIYUN_RESOURCES):
        raise RequestError(
            f"{where}: {protocol.ALIYUN_RESOURCE_GPU_MEMORY} cannot be combined with "
            f"gpushare.io resources"
        )
    memory = values.get(protocol.ALIYUN_RESOURCE_GPU_MEMORY)
    count = values.get(protocol.ALIYUN_RESOURCE_GPU_COUNT)
    if memory is None:
        if count == 0:
            return None
        raise RequestError(
            f"{where}: {protocol.ALIYUN_RESOURCE_GPU_COUNT} needs "
            f"{protocol.ALIYUN_RESOURCE_GPU_MEMORY}"
        )
    if memory == 0:
        raise RequestError(f"{where}: {protocol.ALIYUN_RESOURCE_GPU_MEMORY} must be > 0")
    if count is not None and gpu_count is not None and count != gpu_count:
        raise RequestError(
            f"{where}: {protocol.ALIYUN_RESOURCE_GPU_COUNT} {count} disagrees with annotation "
            f"{protocol.ANNOTATION_GPU_COUNT} {gpu_count}"
        )
    count = count or gpu_count or 1
    return _request(
        key,
        name,
        gpu_count=count,
        memory_mib_per_gpu=memory * protocol.MIB_PER_GIB,
        allowed_models=models,
    )
