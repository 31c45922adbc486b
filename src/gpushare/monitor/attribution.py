"""GPU processes to containers: NVML's process list, each pid's cgroup, the node's pods.

Pure apart from ``owner_of`` (a pid → cgroup reference lookup, ``cgroup.container_of`` on a
node), so the collector and the watchdog see the same attribution and tests can feed both.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable
from dataclasses import dataclass, field

from gpushare.monitor.cgroup import ContainerRef
from gpushare.monitor.nvml import GpuSample
from gpushare.monitor.pods import Container


@dataclass(slots=True)
class Usage:
    """What one container's processes hold on one GPU, as NVML sees them."""

    container: Container
    uuid: str
    used_bytes: int = 0
    unknown: bool = False  # some process's memory was not reported by the driver
    pids: list[int] = field(default_factory=list)


@dataclass(slots=True)
class Attribution:
    # (pod uid, container name, GPU UUID) → usage
    usage: dict[tuple[str, str, str], Usage]
    # GPU UUID → bytes of processes that belong to no known GPU container
    unattributed_bytes: dict[str, int]
    # GPU UUID → pids of those processes
    unattributed_pids: dict[str, list[int]]


def index_containers(containers: Iterable[Container]) -> dict[tuple[str, str], Container]:
    """(pod uid, runtime container ID) → container, for the containers kubelet has started."""
    return {(c.pod_uid, c.container_id): c for c in containers if c.container_id}


def attribute(
    gpus: Iterable[GpuSample],
    containers: Iterable[Container],
    owner_of: Callable[[int], ContainerRef | None],
) -> Attribution:
    """Each GPU process's container, by its cgroup's pod UID and container ID; processes of
    other cgroups (the host, pods without GPU shares) stay unattributed, never guessed."""
    by_id = index_containers(containers)
    usage: dict[tuple[str, str, str], Usage] = {}
    unattributed: dict[str, int] = {}
    unattributed_pids: dict[str, list[int]] = {}
    owners: dict[int, ContainerRef | None] = {}
    for gpu in gpus:
        unattributed.setdefault(gpu.uuid, 0)
        for process in gpu.processes:
            if process.pid not in owners:
                owners[process.pid] = owner_of(process.pid)
            ref = owners[process.pid]
            container = by_id.get((ref.pod_uid, ref.container_id)) if ref else None
            if container is None:
                unattributed[gpu.uuid] += process.used_bytes or 0
                unattributed_pids.setdefault(gpu.uuid, []).append(process.pid)
                continue
            key = (container.pod_uid, container.name, gpu.uuid)
            entry = usage.get(key)
            if entry is None:
                entry = usage[key] = Usage(container, gpu.uuid)
            entry.pids.append(process.pid)
            if process.used_bytes is None:
                entry.unknown = True
            else:
                entry.used_bytes += process.used_bytes
    return Attribution(usage, unattributed, unattributed_pids)
