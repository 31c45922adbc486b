"""Speed of a warm `gpushare cluster up` (binaries already built), and what the cluster costs idle.

Run: .venv/bin/python bench/bench_cluster_up.py [--nodes 4 1000] [--repeat 3] [--idle 30]
Targets (issue 4): 4 nodes under 20 s, 1000 nodes under 90 s.

Each run is the command a person types, `gpushare cluster up`, in a fresh state dir, timed
from start to exit; then `gpushare cluster down`, timed too. With --idle N it also measures,
over N seconds after the largest `up`, the CPU each process of the cluster uses while nothing
happens but the node heartbeat.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from gpushare.cluster.binaries import find_bin_dir

TARGETS_S = {4: 20.0, 1000: 90.0}


def gpushare(env: dict[str, str], *args: str) -> float:
    started = time.perf_counter()
    result = subprocess.run(
        [sys.executable, "-m", "gpushare.cli.main", "cluster", *args],
        capture_output=True,
        text=True,
        env=env,
        check=False,
    )
    elapsed = time.perf_counter() - started
    if result.returncode != 0:
        sys.exit(f"gpushare cluster {' '.join(args)} failed: {result.stderr.strip()}")
    return elapsed


def cpu_seconds(pid: int) -> float:
    with open(f"/proc/{pid}/stat") as file:
        fields = file.read().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def idle_cost(state_dir: Path, seconds: float) -> dict[str, float]:
    """Percent of one core each process uses over ``seconds``."""
    state = json.loads((state_dir / "state.json").read_text())
    pids = {name: record["pid"] for name, record in state["processes"].items()}
    before = {name: cpu_seconds(pid) for name, pid in pids.items()}
    time.sleep(seconds)
    return {name: 100 * (cpu_seconds(pid) - before[name]) / seconds for name, pid in pids.items()}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--nodes", type=int, nargs="+", default=[4, 1000])
    parser.add_argument("--repeat", type=int, default=3)
    parser.add_argument("--idle", type=float, default=30.0, help="0: skip the idle measurement")
    args = parser.parse_args()

    bin_dir = find_bin_dir()  # build or check once, so that every timed run is warm
    env = {**os.environ, "GPUSHARE_K8S_BIN_DIR": str(bin_dir)}
    print(f"{os.cpu_count()} CPU(s); binaries in {bin_dir}")
    print("| nodes | `cluster up` (median, min..max) | target | `cluster down` |")
    print("| --- | --- | --- | --- |")
    with tempfile.TemporaryDirectory(prefix="bench-cluster-") as tmp:
        idle: dict[str, float] = {}
        for count in args.nodes:
            ups, downs = [], []
            for run in range(args.repeat):
                state_dir = Path(tmp) / f"state-{count}-{run}"
                where = ("--state-dir", str(state_dir))
                try:
                    ups.append(gpushare(env, "up", *where, "--nodes", str(count)))
                    if args.idle and count == max(args.nodes) and run == args.repeat - 1:
                        idle = idle_cost(state_dir, args.idle)
                finally:
                    downs.append(gpushare(env, "down", *where))
            target = TARGETS_S.get(count)
            print(
                f"| {count} | {statistics.median(ups):.1f} s ({min(ups):.1f}..{max(ups):.1f}) "
                f"| {f'< {target:.0f} s' if target else '-'} | {statistics.median(downs):.1f} s |"
            )
        if idle:
            print(f"\nidle CPU with {max(args.nodes)} nodes over {args.idle:.0f} s (% of a core):")
            for name, percent in idle.items():
                print(f"  {name:<15} {percent:5.1f}")


if __name__ == "__main__":
    main()
