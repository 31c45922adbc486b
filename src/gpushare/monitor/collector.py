"""The metrics, built on each scrape from NVML, the pods on the node and the state files.

A custom collector (``collect`` runs when Prometheus scrapes) rather than gauges set by a
thread: nothing is sampled between scrapes, a container that is gone is gone from the next
scrape without bookkeeping, and a scrape sees one consistent look at the node. The metric
names and labels are documented in docs/metrics.md; ``METRICS`` lists them for that document's
test and the dashboard's.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Protocol

from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, Metric
from prometheus_client.registry import Collector

from gpushare.monitor import statefile
from gpushare.monitor.attribution import Attribution, attribute
from gpushare.monitor.cgroup import ContainerRef, container_of
from gpushare.monitor.nvml import GpuSample
from gpushare.monitor.pods import MIB, Container
from gpushare.protocol import ShareInfo

log = logging.getLogger("gpushare.monitor")

GPU_LABELS = ("node", "gpu_uuid", "gpu_index", "gpu_model")
CONTAINER_LABELS = ("node", "namespace", "pod", "container", "gpu_uuid")
POD_LABELS = ("node", "namespace", "pod", "container")
MODES = ("shared", "exclusive", "idle")


@dataclass(frozen=True, slots=True)
class MetricSpec:
    name: str  # as exposed (counters with _total)
    kind: str  # gauge | counter
    labels: tuple[str, ...]
    help: str


METRICS = (
    MetricSpec("gpushare_gpu_memory_total_bytes", "gauge", GPU_LABELS, "GPU memory"),
    MetricSpec("gpushare_gpu_memory_used_bytes", "gauge", GPU_LABELS, "GPU memory in use (NVML)"),
    MetricSpec(
        "gpushare_gpu_memory_allocated_bytes",
        "gauge",
        GPU_LABELS,
        "GPU memory the scheduler allocated to containers (gpushare.io/allocation)",
    ),
    MetricSpec(
        "gpushare_gpu_memory_unattributed_bytes",
        "gauge",
        GPU_LABELS,
        "GPU memory of processes that belong to no GPU container of this node",
    ),
    MetricSpec(
        "gpushare_gpu_utilization_ratio",
        "gauge",
        GPU_LABELS,
        "Fraction of the last sample period the GPU ran kernels",
    ),
    MetricSpec("gpushare_gpu_temperature_celsius", "gauge", GPU_LABELS, "GPU temperature"),
    MetricSpec("gpushare_gpu_power_watts", "gauge", GPU_LABELS, "GPU power draw"),
    MetricSpec(
        "gpushare_gpu_healthy",
        "gauge",
        GPU_LABELS,
        "1 if the GPU is healthy (NVML answers and the node annotation says so), else 0",
    ),
    MetricSpec(
        "gpushare_gpu_mode",
        "gauge",
        (*GPU_LABELS, "mode"),
        "1 for the GPU's current mode (shared, exclusive, idle), 0 for the others",
    ),
    MetricSpec(
        "gpushare_gpu_containers",
        "gauge",
        GPU_LABELS,
        "Containers holding a share of the GPU",
    ),
    MetricSpec(
        "gpushare_container_memory_limit_bytes",
        "gauge",
        CONTAINER_LABELS,
        "GPU memory limit the interception library enforces (state file; else the allocation)",
    ),
    MetricSpec(
        "gpushare_container_memory_allocated_bytes",
        "gauge",
        CONTAINER_LABELS,
        "GPU memory the scheduler allocated (gpushare.io/allocation)",
    ),
    MetricSpec(
        "gpushare_container_state_memory_used_bytes",
        "gauge",
        CONTAINER_LABELS,
        "GPU memory the container's processes are charged in the interception library's state file",
    ),
    MetricSpec(
        "gpushare_container_nvml_memory_used_bytes",
        "gauge",
        CONTAINER_LABELS,
        "GPU memory NVML reports for the container's processes",
    ),
    MetricSpec(
        "gpushare_container_compute_limit_ratio",
        "gauge",
        CONTAINER_LABELS,
        "Share of the GPU's compute the container may use (1: no limit)",
    ),
    MetricSpec(
        "gpushare_container_compute_utilization_ratio",
        "gauge",
        CONTAINER_LABELS,
        "Share of the GPU's compute the container's processes used",
    ),
    MetricSpec(
        "gpushare_container_over_memory_limit",
        "gauge",
        CONTAINER_LABELS,
        "1 while the watchdog sees the container above its memory limit",
    ),
    MetricSpec(
        "gpushare_container_refused_allocations_total",
        "counter",
        POD_LABELS,
        "GPU allocations the interception library refused (state file)",
    ),
    MetricSpec(
        "gpushare_container_watchdog_stops_total",
        "counter",
        POD_LABELS,
        "Times the watchdog stopped the container's GPU processes",
    ),
    MetricSpec(
        "gpushare_monitor_state_file_errors",
        "gauge",
        ("node",),
        "State files that could not be read at this scrape (the log says why)",
    ),
    MetricSpec(
        "gpushare_monitor_pods_synced",
        "gauge",
        ("node",),
        "1 once the pods on the node have been listed from the API server",
    ),
    MetricSpec(
        "gpushare_monitor_collect_seconds",
        "gauge",
        ("node",),
        "Time this scrape took to collect",
    ),
)
SPECS = {spec.name: spec for spec in METRICS}


class PodSource(Protocol):
    """The node's GPU containers and GPU health (kube.KubePodSource on a node)."""

    @property
    def synced(self) -> bool: ...

    def containers(self) -> list[Container]: ...

    def gpu_health(self) -> dict[str, bool]: ...


class WatchdogView(Protocol):
    def stops(self) -> dict[tuple[str, str, str], int]: ...

    def over(self) -> set[tuple[str, str, str]]: ...


class _Families:
    """The metric families of one scrape, made from METRICS."""

    def __init__(self) -> None:
        self.by_name: dict[str, GaugeMetricFamily | CounterMetricFamily] = {}
        for spec in METRICS:
            if spec.kind == "counter":
                family: GaugeMetricFamily | CounterMetricFamily = CounterMetricFamily(
                    spec.name, spec.help, labels=spec.labels
                )
            else:
                family = GaugeMetricFamily(spec.name, spec.help, labels=spec.labels)
            self.by_name[spec.name] = family

    def add(self, name: str, labels: list[str], value: float) -> None:
        self.by_name[name].add_metric(labels, value)


class MonitorCollector(Collector):
    def __init__(
        self,
        node: str,
        sample: Callable[[], list[GpuSample]],
        pods: PodSource,
        *,
        state_root: Path | None,
        proc_root: Path,
        watchdog: WatchdogView | None = None,
    ) -> None:
        self.node = node
        self.sample = sample
        self.pods = pods
        self.state_root = state_root
        self.proc_root = proc_root
        self.watchdog = watchdog
        self._reported: set[str] = set()  # state file problems already logged

    def describe(self) -> Iterator[Metric]:
        # Without describe, registering would call collect (and NVML) once at start-up.
        yield from _Families().by_name.values()

    def collect(self) -> Iterator[Metric]:
        started = time.perf_counter()
        families = _Families()
        gpus = self.sample()
        containers = self.pods.containers()
        health = self.pods.gpu_health()
        attribution = attribute(gpus, containers, self._owner)
        by_gpu: dict[str, list[ShareInfo]] = {}  # GPU → the shares on it, one per container
        for container in containers:
            for share in container.shares:
                by_gpu.setdefault(share.uuid, []).append(share)
        for gpu in gpus:
            self._gpu(families, gpu, by_gpu.get(gpu.uuid, []), health, attribution)
        gpu_samples = {gpu.uuid: gpu for gpu in gpus}
        users: dict[str, int] = {}  # GPU → containers with processes on it
        for _, _, uuid in attribution.usage:
            users[uuid] = users.get(uuid, 0) + 1
        errors = 0
        stops = self.watchdog.stops() if self.watchdog else {}
        over = self.watchdog.over() if self.watchdog else set()
        moved = statefile.owners(self.state_root) if self.state_root is not None else {}
        for container in containers:
            state, failed = self._state(container, moved)
            errors += failed
            pod_labels = [self.node, container.namespace, container.pod, container.name]
            if state is not None:
                families.add(
                    "gpushare_container_refused_allocations_total",
                    pod_labels,
                    state.refused_allocations,
                )
            families.add(
                "gpushare_container_watchdog_stops_total",
                pod_labels,
                stops.get((container.namespace, container.pod, container.name), 0),
            )
            for share in container.shares:
                labels = [*pod_labels, share.uuid]
                key = (container.pod_uid, container.name, share.uuid)
                allocated = share.memory_mib * MIB
                limit = allocated
                index = container.device_index(share.uuid)
                if state is not None and index is not None:
                    device = state.devices[index]
                    limit = device.limit_bytes or allocated
                    families.add(
                        "gpushare_container_state_memory_used_bytes", labels, device.used_bytes
                    )
                families.add("gpushare_container_memory_limit_bytes", labels, limit)
                families.add("gpushare_container_memory_allocated_bytes", labels, allocated)
                families.add(
                    "gpushare_container_compute_limit_ratio",
                    labels,
                    share.core / 100 if 0 < share.core < 100 else 1.0,
                )
                families.add(
                    "gpushare_container_over_memory_limit", labels, 1.0 if key in over else 0.0
                )
                if container.container_id is None:
                    continue  # not started: its processes cannot be recognised yet
                usage = attribution.usage.get(key)
                used = usage.used_bytes if usage else 0
                families.add("gpushare_container_nvml_memory_used_bytes", labels, used)
                alone = users.get(share.uuid, 0) == 1 and not attribution.unattributed_pids.get(
                    share.uuid
                )
                ratio = _container_utilization(
                    gpu_samples.get(share.uuid), usage.pids if usage else [], alone
                )
                if ratio is not None:
                    families.add("gpushare_container_compute_utilization_ratio", labels, ratio)
        families.add("gpushare_monitor_state_file_errors", [self.node], errors)
        families.add("gpushare_monitor_pods_synced", [self.node], 1.0 if self.pods.synced else 0.0)
        families.add("gpushare_monitor_collect_seconds", [self.node], time.perf_counter() - started)
        yield from families.by_name.values()

    def _owner(self, pid: int) -> ContainerRef | None:
        return container_of(self.proc_root, pid)

    def _gpu(
        self,
        families: _Families,
        gpu: GpuSample,
        shares: list[ShareInfo],
        health: dict[str, bool],
        attribution: Attribution,
    ) -> None:
        labels = [self.node, gpu.uuid, str(gpu.index), gpu.name]
        if gpu.responding:
            families.add("gpushare_gpu_memory_total_bytes", labels, gpu.memory_total_bytes)
            families.add("gpushare_gpu_memory_used_bytes", labels, gpu.memory_used_bytes)
            families.add(
                "gpushare_gpu_memory_unattributed_bytes",
                labels,
                attribution.unattributed_bytes.get(gpu.uuid, 0),
            )
        families.add(
            "gpushare_gpu_memory_allocated_bytes",
            labels,
            sum(share.memory_mib * MIB for share in shares),
        )
        optional = (
            ("gpushare_gpu_utilization_ratio", gpu.utilization_ratio),
            ("gpushare_gpu_temperature_celsius", gpu.temperature_celsius),
            ("gpushare_gpu_power_watts", gpu.power_watts),
        )
        for name, value in optional:
            if value is not None:
                families.add(name, labels, value)
        healthy = gpu.responding and health.get(gpu.uuid, True)
        families.add("gpushare_gpu_healthy", labels, 1.0 if healthy else 0.0)
        mode = gpu_mode(shares)
        for name in MODES:
            families.add("gpushare_gpu_mode", [*labels, name], 1.0 if name == mode else 0.0)
        families.add("gpushare_gpu_containers", labels, len(shares))

    def _state(
        self, container: Container, moved: dict[tuple[str, str], Path]
    ) -> tuple[statefile.ContainerState | None, int]:
        if self.state_root is None:
            return None, 0
        directory = statefile.state_dir_of(
            self.state_root, container.pod_uid, container.name, moved
        )
        if directory is None:
            return None, 0  # its directory serves another container (owners)
        path = directory / statefile.FILE_NAME
        try:
            return statefile.read(path), 0
        except statefile.StateFileError as error:
            message = str(error)
            if message not in self._reported:
                if len(self._reported) > 1000:
                    self._reported.clear()  # bounded: a long-lived agent sees many files
                self._reported.add(message)
                log.warning("%s", message)
            return None, 1


def gpu_mode(shares: list[ShareInfo]) -> str:
    """exclusive: a whole-GPU allocation holds it; shared: shares hold it; idle otherwise."""
    if any(share.exclusive for share in shares):
        return "exclusive"
    return "shared" if shares else "idle"


def _container_utilization(gpu: GpuSample | None, pids: list[int], alone: bool) -> float | None:
    """The container's share of the GPU's compute: with NVML's per-process figures, the sum
    of its processes' SM utilisation over the period since the previous scrape (0 for a
    process that ran no kernel in it); without them, the GPU's utilisation when this
    container's processes are the only ones on the GPU (``alone``): a GPU with several users
    cannot be split without per-process figures, so the series is then left out rather than
    guessed."""
    if gpu is None:
        return None
    if not pids:
        return 0.0
    if gpu.process_utilization is not None:
        return min(1.0, sum(gpu.process_utilization.get(pid, 0.0) for pid in pids))
    if not alone or gpu.utilization_ratio is None:
        return None
    return gpu.utilization_ratio
