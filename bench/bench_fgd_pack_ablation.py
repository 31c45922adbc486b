"""What each term of fgd-pack contributes: the policy with its terms switched off one by one.

Run: .venv/bin/python bench/bench_fgd_pack_ablation.py [--workloads default gpu-spec]
Prints unallocated GPU % at 100% arrival (mean ± std over seeds 42..51) per variant; the
workloads are those of bench_policies.py.
"""

from __future__ import annotations

import argparse
import os
import sys
from pathlib import Path

from gpushare.placement import policies
from gpushare.sim.runner import SimulationSpec, simulate
from gpushare.sim.trace import DEFAULT_NODES, DEFAULT_PODS, load_nodes, load_pods

sys.path.insert(0, str(Path(__file__).parent))
from bench_policies import workloads

# name: (stranding weight, packing order weight)
VARIANTS = {
    "fgd-pack": (policies.STRANDING_WEIGHT, policies.PACKING_ORDER_WEIGHT),
    "no packing order": (policies.STRANDING_WEIGHT, 0.0),
    "no stranding": (0.0, policies.PACKING_ORDER_WEIGHT),
    "exact FGD only": (0.0, 0.0),
}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--workloads", nargs="+", default=["default", "gpu-spec"])
    parser.add_argument("--workers", type=int, default=os.cpu_count() or 1)
    args = parser.parse_args()
    nodes = load_nodes(DEFAULT_NODES)
    pods = load_pods(DEFAULT_PODS, nodes)
    chosen = workloads(nodes, pods)
    print("unallocated GPU % at 100% arrival, mean ± std over 10 seeds")
    print(f"{'variant':18s}" + "".join(f"{w:>16s}" for w in args.workloads))
    for variant, (stranding, order) in VARIANTS.items():
        # Worker processes are forked, so they see the knobs as set here.
        policies.STRANDING_WEIGHT, policies.PACKING_ORDER_WEIGHT = stranding, order
        cells = []
        for name in args.workloads:
            workload_pods, seeds = chosen[name]
            spec = SimulationSpec(
                nodes=nodes,
                pods=workload_pods,
                policies=["fgd-pack"],
                seeds=seeds,
                inflate=1.3,
                nodes_path=DEFAULT_NODES,
                pods_path=Path(f"<{name}>"),
                workers=args.workers,
            )
            (summary,) = simulate(spec)
            mean, std = summary.unallocated_pct_at_100, summary.unallocated_pct_at_100_std
            cells.append(f"{mean:>9.2f} ± {std:4.2f}")
        print(f"{variant:18s}" + "".join(cells), flush=True)


if __name__ == "__main__":
    main()
