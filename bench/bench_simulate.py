"""Speed of `gpushare simulate`: one policy, seeds 42..51, the bundled pod list.

Run: .venv/bin/python bench/bench_simulate.py [--policy NAME] [--workers N]
Target (issue 2): under 60 s of wall time on 2 cores.
"""

from __future__ import annotations

import argparse
import os
import time

from gpushare.placement.policies import DEFAULT_POLICY
from gpushare.sim.runner import SimulationSpec, simulate
from gpushare.sim.trace import DEFAULT_NODES, DEFAULT_PODS, load_nodes, load_pods


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--policy", default=DEFAULT_POLICY)
    parser.add_argument("--workers", type=int, default=os.cpu_count() or 1)
    args = parser.parse_args()

    started = time.perf_counter()
    nodes = load_nodes(DEFAULT_NODES)
    pods = load_pods(DEFAULT_PODS, nodes)
    loaded = time.perf_counter()
    spec = SimulationSpec(
        nodes=nodes,
        pods=pods,
        policies=[args.policy],
        seeds=list(range(42, 52)),
        inflate=1.3,
        nodes_path=DEFAULT_NODES,
        pods_path=DEFAULT_PODS,
        workers=args.workers,
    )
    (summary,) = simulate(spec)
    finished = time.perf_counter()
    print(f"policy {args.policy}, 10 seeds, {args.workers} worker(s), {os.cpu_count()} CPU(s)")
    print(f"  load trace      {loaded - started:6.2f} s")
    print(f"  simulate        {finished - loaded:6.2f} s wall ({summary.wall_s:.1f} s summed)")
    print(f"  per seed        {summary.wall_s / 10:6.2f} s")
    print(f"  total           {finished - started:6.2f} s")
    print(f"  unallocated at 100% arrival: {summary.unallocated_pct_at_100:.2f}%")


if __name__ == "__main__":
    main()
