"""Why pods fail: one seed of the bundled trace replayed up to 100% arrival, per policy.

For each policy: the pods that failed by kind and by cause, and where the free GPU capacity
sits at 100% arrival. Before that, two lower bounds on the unallocated share that no policy
can beat: the gaps that 810-milli pods leave, and the optimum of the bin-packing problem that
remains when CPU, host memory, GPU models, node boundaries and arrival order are all ignored
(a configuration LP solved with scipy's HiGHS; every feasible schedule is a solution of it).

Run: .venv/bin/python bench/analyse_failures.py [--seed 42] [--policies fgd fgd-pack]
"""

from __future__ import annotations

import argparse
from collections import Counter, defaultdict
from dataclasses import replace

import numpy as np

from gpushare.model import Ledger
from gpushare.placement.engine import Placement, Placer
from gpushare.placement.fragmentation import TargetWorkload
from gpushare.sim.simulator import arrival_order, gpu_capacity
from gpushare.sim.trace import (
    DEFAULT_NODES,
    DEFAULT_PODS,
    MILLI_PER_GPU,
    SIM_GPU_MEMORY_MIB,
    load_nodes,
    load_pods,
)


def kind(request) -> str:
    if not request.uses_gpu:
        return "cpu-only"
    if request.exclusive:
        return f"{request.gpu_count} whole GPU(s)"
    return "shared"


def cause(placer: Placer, request) -> str:
    if (
        request.uses_gpu
        and not (placer.eligible_gpus(request).sum(axis=1) >= request.gpu_count).any()
    ):
        return "no node has the GPUs free"
    return "GPUs free only where CPU or host memory is short"


def floor_pct(pods, order, capacity_milli: int) -> float:
    """Each GPU holding an 810-milli pod keeps 190 milli that only pods of at most 190 can use."""
    arrived = big = small = 0
    for index in order:
        arrived += pods[index].requested_gpu_milli
        if arrived > capacity_milli:
            break
        request = pods[index].request
        if request.gpu_count == 1 and not request.exclusive:
            milli = request.memory_mib_per_gpu * MILLI_PER_GPU // SIM_GPU_MEMORY_MIB
            big += milli == 810
            small += milli if milli <= 190 else 0
    return 100 * (190 * big - small) / capacity_milli


def packing_bound_pct(pods, order, capacity_gpus: int) -> float:
    """Unallocated % at 100% arrival if every pod could go on any GPU of the cluster.

    Whole-GPU pods waste nothing, so all of them are placed; the shared pods are packed into
    the remaining GPUs by the configuration LP: one variable per multiset of shared sizes
    that fits in one GPU, at most as many of each size as arrived, at most one per GPU left.
    """
    from scipy.optimize import linprog

    arrived = exclusive_gpus = 0
    sizes: Counter[int] = Counter()
    for index in order:
        arrived += pods[index].requested_gpu_milli
        if arrived > capacity_gpus * MILLI_PER_GPU:
            break
        request = pods[index].request
        if request.exclusive:
            exclusive_gpus += request.gpu_count
        elif request.uses_gpu:
            milli = request.memory_mib_per_gpu * MILLI_PER_GPU // SIM_GPU_MEMORY_MIB
            sizes[milli] += request.gpu_count
    kinds = sorted(sizes)
    configurations: list[list[int]] = []

    def enumerate_from(i: int, room: int, counts: list[int]) -> None:
        if i == len(kinds):
            if any(counts):
                configurations.append(counts)
            return
        k = 0
        while k * kinds[i] <= room and k <= sizes[kinds[i]]:
            enumerate_from(i + 1, room - k * kinds[i], [*counts, k])
            k += 1

    enumerate_from(0, MILLI_PER_GPU, [])
    uses = np.array(configurations, dtype=float).T  # size x configuration
    volume = np.array(kinds, dtype=float) @ uses
    limits = np.vstack([uses, np.ones(uses.shape[1])])
    available = np.array([sizes[k] for k in kinds] + [capacity_gpus - exclusive_gpus])
    result = linprog(-volume, A_ub=limits, b_ub=available, bounds=(0, None), method="highs")
    if result.status != 0:
        raise RuntimeError(f"packing LP failed: {result.message}")
    packed = exclusive_gpus * MILLI_PER_GPU - result.fun
    return 100 * (capacity_gpus * MILLI_PER_GPU - packed) / (capacity_gpus * MILLI_PER_GPU)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--seed", type=int, default=42)
    parser.add_argument("--policies", nargs="+", default=["fgd", "fgd-pack"])
    args = parser.parse_args()
    nodes = load_nodes(DEFAULT_NODES)
    pods = load_pods(DEFAULT_PODS, nodes)
    workload = TargetWorkload.from_requests(
        (p.request for p in pods), gpu_memory_mib=SIM_GPU_MEMORY_MIB
    )
    capacity_milli = gpu_capacity(nodes) * MILLI_PER_GPU
    order = arrival_order(pods, args.seed, 1.3, gpu_capacity(nodes))
    print(
        f"seed {args.seed}: lower bounds on unallocated % at 100% arrival: "
        f"{floor_pct(pods, order, capacity_milli):.2f} (810-milli gaps), "
        f"{packing_bound_pct(pods, order, gpu_capacity(nodes)):.2f} (bin packing)"
    )
    for policy in args.policies:
        ledger = Ledger(nodes)
        placer = Placer(ledger, policy, workload=workload, seed=args.seed)
        arrived = 0
        failures: Counter[tuple[str, str]] = Counter()
        failed_milli = 0
        for k, index in enumerate(order):
            arrived += pods[index].requested_gpu_milli
            if arrived > capacity_milli:
                break
            request = replace(pods[index].request, name=str(k))
            if not isinstance(placer.place(request, explain=False), Placement):
                failures[(kind(request), cause(placer, request))] += 1
                failed_milli += pods[index].requested_gpu_milli
        print(
            f"\n{policy}: {100 * failed_milli / capacity_milli:.2f}% of capacity failed "
            "before 100% arrival"
        )
        for (what, why), count in sorted(failures.items()):
            print(f"  {count:5d} {what:16s} {why}")
        memory = np.maximum(ledger.gpu_memory_mib, 1)
        free = np.where(ledger.gpu_present, ledger.gpu_free_memory_mib / memory, 0)
        by_type: dict[str, list[float]] = defaultdict(lambda: [0.0, 0.0])
        for i, node in enumerate(nodes):
            label = f"{node.gpus[0].model}x{len(node.gpus)} {node.cpu_milli // 1000} cores"
            by_type[label][0] += free[i].sum()
            by_type[label][1] += ledger.cpu_free_milli[i] / 1000
        print("  free at 100% arrival, by node type (GPUs, cores):")
        for label, (gpus, cores) in sorted(by_type.items(), key=lambda item: -item[1][0])[:6]:
            print(f"    {label:24s} {gpus:7.1f} GPUs {cores:8.0f} cores")


if __name__ == "__main__":
    main()
