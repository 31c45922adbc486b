"""Why pods fail: one seed of the bundled trace replayed up to 100% arrival, per policy.

For each policy: the pods that failed by kind and by cause, where the free GPU capacity sits
at 100% arrival, and a lower bound on the unallocated share that no policy can beat.

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
        f"seed {args.seed}: lower bound from 810-milli pods alone: "
        f"{floor_pct(pods, order, capacity_milli):.2f}% unallocated at 100% arrival"
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
