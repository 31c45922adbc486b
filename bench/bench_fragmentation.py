"""The fragmentation measure, the simulator's hot spot: before and after its optimisations.

1. One node evaluation: a plain-Python loop over shapes and GPUs (the straightforward
   implementation, kept here as the "before") against the numpy batch in
   gpushare.placement.fragmentation.
2. FGD placements on the bundled trace (seed 42, the first pods): the cache disabled (every
   feasible node re-evaluated for every pod) against memoised node states and per-shape
   vectors refreshed only where a node changed.

Run: .venv/bin/python bench/bench_fragmentation.py
"""

from __future__ import annotations

import time
from dataclasses import replace

import numpy as np

from gpushare.model import Ledger
from gpushare.placement.engine import Placer
from gpushare.placement.frag_cache import FragmentationCache
from gpushare.placement.fragmentation import TargetWorkload, WorkloadArrays, fragmentation
from gpushare.sim.simulator import arrival_order, gpu_capacity
from gpushare.sim.trace import (
    DEFAULT_NODES,
    DEFAULT_PODS,
    SIM_GPU_MEMORY_MIB,
    load_nodes,
    load_pods,
)

PLACEMENTS = 1500


def python_fragmentation(workload: TargetWorkload, cpu_free: int, free_mib: list[int]) -> float:
    """The measure written as loops, for one node whose GPUs are all of one allowed model."""
    total = sum(free / SIM_GPU_MEMORY_MIB for free in free_mib)
    frag = 0.0
    for shape, weight in zip(workload.shapes, workload.weights, strict=True):
        if shape.gpu_count == 0:
            frag += weight * total
            continue
        need = SIM_GPU_MEMORY_MIB if shape.exclusive else shape.memory_mib_per_gpu
        fitting = [free for free in free_mib if free >= need]
        if len(fitting) >= shape.gpu_count and cpu_free >= shape.cpu_milli:
            frag += weight * sum(free / SIM_GPU_MEMORY_MIB for free in free_mib if free < need)
        else:
            frag += weight * total
    return frag


def bench_single(workload: TargetWorkload) -> None:
    rng = np.random.default_rng(0)
    states = [
        (int(rng.integers(0, 96_000)), rng.integers(0, 1001, 8).tolist()) for _ in range(2000)
    ]
    started = time.perf_counter()
    for cpu, free in states:
        python_fragmentation(workload, cpu, [f * 16 for f in free])
    python_us = (time.perf_counter() - started) / len(states) * 1e6

    arrays = WorkloadArrays(workload, ("G2",))
    memory = np.full(8, SIM_GPU_MEMORY_MIB)
    model = np.zeros(8, dtype=np.int64)
    usable = np.ones(8, dtype=bool)
    batch = 8  # a node's candidate GPUs are evaluated together
    started = time.perf_counter()
    for start in range(0, len(states), batch):
        chunk = states[start : start + batch]
        free = np.array([[f * 16 for f in s[1]] for s in chunk])
        fragmentation(
            arrays,
            np.array([s[0] for s in chunk]),
            free,
            free // 160,
            free == SIM_GPU_MEMORY_MIB,
            memory,
            model,
            usable,
        )
    numpy_us = (time.perf_counter() - started) / len(states) * 1e6
    print(f"one 8-GPU node state, {len(workload.shapes)} typical shapes:")
    print(f"  python loops       {python_us:8.1f} us per state")
    print(f"  numpy, batch of 8  {numpy_us:8.1f} us per state")


def bench_placements(nodes, pods, workload: TargetWorkload) -> None:
    order = arrival_order(pods, 42, 1.3, gpu_capacity(nodes))[:PLACEMENTS]
    for memoize in (False, True):
        ledger = Ledger(nodes)
        placer = Placer(ledger, "fgd", workload=workload, seed=42)
        placer.context.fragmentation = FragmentationCache(ledger, workload, memoize=memoize)
        started = time.perf_counter()
        for k, index in enumerate(order):
            placer.place(replace(pods[index].request, name=str(k)), explain=False)
        elapsed = time.perf_counter() - started
        label = "cached" if memoize else "no cache"
        print(f"  {label:9s} {elapsed / len(order) * 1e3:8.2f} ms per placement")


def main() -> None:
    nodes = load_nodes(DEFAULT_NODES)
    pods = load_pods(DEFAULT_PODS, nodes)
    workload = TargetWorkload.from_requests(p.request for p in pods)
    bench_single(workload)
    print(f"fgd, first {PLACEMENTS} placements of seed 42 on {len(nodes)} nodes:")
    bench_placements(nodes, pods, workload)


if __name__ == "__main__":
    main()
