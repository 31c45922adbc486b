"""Trace replay with the method of the FGD paper (Weng et al., USENIX ATC'23).

Per seed: shuffle the pod list, append pods drawn uniformly with replacement until the requested
GPU reaches ``inflate`` times the cluster's GPU capacity, then place each pod once, in order,
through the placement engine. A pod that fits nowhere fails; nothing departs.
"""

from __future__ import annotations

import time
from collections.abc import Sequence
from dataclasses import dataclass, replace

import numpy as np

from gpushare.model import Ledger, Node
from gpushare.placement.engine import Placement, Placer
from gpushare.placement.frag_cache import FragmentationCache
from gpushare.placement.fragmentation import TargetWorkload
from gpushare.sim.trace import MILLI_PER_GPU, TracePod

REPORT_POINTS_PCT = (90, 100, 110, 130)
CURVE_STEP_PCT = 1.0


@dataclass(frozen=True)
class SeedResult:
    """One seed's run: allocation against arrival after each pod."""

    seed: int
    arrived_pct: np.ndarray  # cumulative requested GPU after each pod, % of capacity
    allocated_pct: np.ndarray  # allocated GPU after each pod, % of capacity
    failed_pods_at_100: int  # pods that failed before arrival reached 100%
    failed_pods: int
    frag_rate_pct_at_100: float
    wall_s: float

    def allocated_at(self, arrived_pct: float) -> float:
        """Allocation once arrival first reaches ``arrived_pct`` (the last value if never)."""
        index = int(np.searchsorted(self.arrived_pct, arrived_pct - 1e-9, side="left"))
        return float(self.allocated_pct[min(index, len(self.allocated_pct) - 1)])


def arrival_order(
    pods: Sequence[TracePod], seed: int, inflate: float, capacity_gpus: int
) -> list[int]:
    """Pod indices in arrival order: a shuffle of all pods, then draws with replacement until
    the requested GPU reaches ``inflate`` times the capacity. Sums are in whole thousandths
    of a GPU so that no rounding decides when to stop."""
    if not any(pod.requested_gpu_milli for pod in pods):
        raise ValueError("no pod asks for a GPU: arrival would never reach the target")
    rng = np.random.default_rng(seed)
    order = rng.permutation(len(pods)).tolist()
    requested_milli = sum(pod.requested_gpu_milli for pod in pods)
    target_milli = round(inflate * capacity_gpus * MILLI_PER_GPU)
    while requested_milli < target_milli:
        index = int(rng.integers(len(pods)))
        order.append(index)
        requested_milli += pods[index].requested_gpu_milli
    return order


def gpu_capacity(nodes: Sequence[Node]) -> int:
    return sum(len(node.gpus) for node in nodes)


def run_seed(
    nodes: Sequence[Node],
    pods: Sequence[TracePod],
    policy: str,
    seed: int,
    inflate: float,
    workload: TargetWorkload,
) -> SeedResult:
    started = time.perf_counter()
    node_policy, _, gpu_policy = policy.partition("/")
    ledger = Ledger(nodes)
    placer = Placer(ledger, node_policy, gpu_policy or None, workload=workload, seed=seed)
    measure = FragmentationCache(ledger, workload)
    capacity = gpu_capacity(nodes)
    order = arrival_order(pods, seed, inflate, capacity)
    arrived_pct = np.empty(len(order))
    allocated_pct = np.empty(len(order))
    capacity_milli = capacity * MILLI_PER_GPU
    arrived_milli = allocated_milli = 0
    failed = failed_at_100 = 0
    frag_rate_at_100: float | None = None
    drawn: set[int] = set()
    for k, index in enumerate(order):
        pod = pods[index]
        request = pod.request
        if index in drawn:  # a pod drawn again is a new pod with the same shape
            request = replace(request, name=f"{request.name}#{k}")
        drawn.add(index)
        arrived_milli += pod.requested_gpu_milli
        if isinstance(placer.place(request, explain=False), Placement):
            allocated_milli += pod.requested_gpu_milli
        else:
            failed += 1
            if arrived_milli <= capacity_milli:
                failed_at_100 += 1
        arrived_pct[k] = 100.0 * arrived_milli / capacity_milli
        allocated_pct[k] = 100.0 * allocated_milli / capacity_milli
        if frag_rate_at_100 is None and arrived_milli >= capacity_milli:
            unallocated = (capacity_milli - allocated_milli) / MILLI_PER_GPU
            frag_rate_at_100 = _fragmentation_rate_pct(measure, unallocated)
    if frag_rate_at_100 is None:
        unallocated = (capacity_milli - allocated_milli) / MILLI_PER_GPU
        frag_rate_at_100 = _fragmentation_rate_pct(measure, unallocated)
    return SeedResult(
        seed=seed,
        arrived_pct=arrived_pct,
        allocated_pct=allocated_pct,
        failed_pods_at_100=failed_at_100,
        failed_pods=failed,
        frag_rate_pct_at_100=frag_rate_at_100,
        wall_s=time.perf_counter() - started,
    )


def _fragmentation_rate_pct(measure: FragmentationCache, unallocated_gpus: float) -> float:
    """Fragmented GPU capacity as a share of all unallocated GPU capacity (the paper's rate)."""
    if unallocated_gpus <= 1e-9:
        return 0.0
    return 100.0 * measure.cluster_fragmentation() / unallocated_gpus
