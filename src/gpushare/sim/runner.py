"""Runs the simulator for several policies and seeds, in parallel, and sums the results up."""

from __future__ import annotations

import multiprocessing
import os
from collections.abc import Callable, Sequence
from concurrent.futures import ProcessPoolExecutor, as_completed
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np

from gpushare.model import Node
from gpushare.placement.fragmentation import TargetWorkload
from gpushare.sim.simulator import REPORT_POINTS_PCT, SeedResult, run_seed
from gpushare.sim.trace import SIM_GPU_MEMORY_MIB, TracePod

CURVE_ARRIVAL_PCT = tuple(float(x) for x in range(0, 131))


@dataclass(frozen=True)
class PolicySummary:
    """A policy's figures, averaged over seeds."""

    policy: str
    seeds: tuple[int, ...]
    unallocated_pct_at_100: float
    unallocated_pct_at_100_std: float
    alloc_pct: dict[str, float]
    alloc_pct_std: dict[str, float]
    frag_rate_pct_at_100: float
    failed_pods: float  # mean per seed
    wall_s: float  # summed over seeds: the time one core spends on this policy
    curve_alloc_pct: tuple[float, ...]  # mean allocation at each of CURVE_ARRIVAL_PCT

    @classmethod
    def of(cls, policy: str, results: Sequence[SeedResult]) -> PolicySummary:
        def stats(arrival: float) -> tuple[float, float]:
            values = np.array([r.allocated_at(arrival) for r in results])
            std = float(values.std(ddof=1)) if len(values) > 1 else 0.0
            return float(values.mean()), std

        points = {str(p): stats(p) for p in REPORT_POINTS_PCT}
        mean_100, std_100 = stats(100)
        curve = tuple(
            float(np.mean([r.allocated_at(a) for r in results])) for a in CURVE_ARRIVAL_PCT
        )
        return cls(
            policy=policy,
            seeds=tuple(r.seed for r in results),
            unallocated_pct_at_100=100.0 - mean_100,
            unallocated_pct_at_100_std=std_100,
            alloc_pct={k: v[0] for k, v in points.items()},
            alloc_pct_std={k: v[1] for k, v in points.items()},
            frag_rate_pct_at_100=float(np.mean([r.frag_rate_pct_at_100 for r in results])),
            failed_pods=float(np.mean([r.failed_pods for r in results])),
            wall_s=float(sum(r.wall_s for r in results)),
            curve_alloc_pct=curve,
        )


@dataclass(frozen=True)
class SimulationSpec:
    nodes: Sequence[Node]
    pods: Sequence[TracePod]
    policies: Sequence[str]
    seeds: Sequence[int]
    inflate: float
    nodes_path: Path
    pods_path: Path
    workers: int = field(default_factory=lambda: os.cpu_count() or 1)


def _run_task(
    spec: SimulationSpec, workload: TargetWorkload, policy: str, seed: int
) -> tuple[str, SeedResult]:
    return policy, run_seed(spec.nodes, spec.pods, policy, seed, spec.inflate, workload)


ProgressCallback = Callable[[str, SeedResult, int, int], None]


def simulate(
    spec: SimulationSpec, on_seed_done: ProgressCallback | None = None
) -> list[PolicySummary]:
    """Every (policy, seed) pair, spread over worker processes; summaries in policy order."""
    workload = TargetWorkload.from_requests(
        (pod.request for pod in spec.pods), gpu_memory_mib=SIM_GPU_MEMORY_MIB
    )
    tasks = [(policy, seed) for policy in spec.policies for seed in spec.seeds]
    results: dict[str, list[SeedResult]] = {policy: [] for policy in spec.policies}
    workers = max(1, min(spec.workers, len(tasks)))
    if workers == 1:
        done = (_run_task(spec, workload, policy, seed) for policy, seed in tasks)
        for finished, (policy, result) in enumerate(done, start=1):
            results[policy].append(result)
            if on_seed_done:
                on_seed_done(policy, result, finished, len(tasks))
    else:
        context = multiprocessing.get_context("fork" if os.name == "posix" else "spawn")
        with ProcessPoolExecutor(workers, mp_context=context) as pool:
            futures = [pool.submit(_run_task, spec, workload, p, s) for p, s in tasks]
            for finished, future in enumerate(as_completed(futures), start=1):
                policy, result = future.result()
                results[policy].append(result)
                if on_seed_done:
                    on_seed_done(policy, result, finished, len(tasks))
    summaries = []
    for policy in spec.policies:
        ordered = sorted(results[policy], key=lambda r: list(spec.seeds).index(r.seed))
        summaries.append(PolicySummary.of(policy, ordered))
    return summaries
