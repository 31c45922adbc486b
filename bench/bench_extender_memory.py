"""Memory of the extender's cache with 1000 nodes of 8 GPUs and 50,000 pods holding shares.

Run: .venv/bin/python bench/bench_extender_memory.py [--nodes 1000] [--gpus 8] [--pods 50000]
Target (issue 5): extender memory under 500 MiB with 50,000 pods.

The cache is fed as the watch feeds it (watch.py): the nodes' full list through
``replace_nodes``, then the pods as ``upsert_pod`` calls, one per watch event, each pod a dict
as lightkube's ``to_dict()`` gives it: bound to a node (``spec.nodeName``), Running, with a
``gpushare.io/allocation`` annotation of one container holding a share of one GPU (one pod in
ten: of 2 GPUs). Shares are small enough (1..2 GiB of 141) that every pod fits and enters the
ledger. Then the same pods once more through ``replace_pods`` (a relist). Prints the process's
RSS (VmRSS, and VmHWM, its peak) before and after, and the time each step took.

The pod dicts are built in batches and dropped once fed, so that the RSS measured is the
cache's, not the benchmark's input; a real extender's watch also holds one event at a time.
The relist step does hold the whole list (as lightkube's list does), so its peak includes it.
"""

from __future__ import annotations

import argparse
import gc
import random
import sys
import time

from gpushare import protocol
from gpushare.extender import server, watch  # noqa: F401  (the real process imports them)
from gpushare.extender.cache import ClusterCache

TARGET_MIB = 500.0


def status_mib(field: str) -> float:
    with open("/proc/self/status") as file:
        for line in file:
            if line.startswith(field + ":"):
                return int(line.split()[1]) / 1024
    raise KeyError(field)


def node(name: str, gpus: int) -> dict:
    inventory = [
        protocol.GpuInfo(f"GPU-{name}-{i}", i, "H200", 141 * 1024, i // (gpus // 2 or 1))
        for i in range(gpus)
    ]
    return {
        "metadata": {
            "name": name,
            "uid": f"uid-{name}",
            "labels": {protocol.LABEL_ENABLED: "true", "gpushare.io/gpu-model": "H200"},
            "annotations": {protocol.ANNOTATION_GPUS: protocol.encode_gpus(inventory)},
        }
    }


def pod(i: int, node_name: str, gpus: int, rng: random.Random) -> dict:
    mib = rng.randint(1, 2) * 1024
    first = rng.randrange(gpus)
    count = 2 if i % 10 == 0 else 1
    shares = [
        protocol.ShareInfo(f"GPU-{node_name}-{g}", g, mib, 0)
        for g in ((first + k) % gpus for k in range(count))
    ]
    name = f"pod-{i:06d}"
    return {
        "metadata": {
            "name": name,
            "namespace": "bench",
            "uid": f"uid-{name}",
            "resourceVersion": str(1000 + i),
            "labels": {"app": "bench"},
            "annotations": {
                protocol.ANNOTATION_ALLOCATION: protocol.encode_allocation({"main": shares})
            },
        },
        "spec": {
            "nodeName": node_name,
            "schedulerName": "default-scheduler",
            "containers": [
                {
                    "name": "main",
                    "image": "registry.example/bench:1",
                    "resources": {
                        "limits": {protocol.RESOURCE_GPU_MEMORY: str(mib // 1024 * count)}
                    },
                }
            ],
        },
        "status": {"phase": "Running"},
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--nodes", type=int, default=1000)
    parser.add_argument("--gpus", type=int, default=8)
    parser.add_argument("--pods", type=int, default=50_000)
    parser.add_argument("--batch", type=int, default=1000)
    parser.add_argument("--seed", type=int, default=0)
    options = parser.parse_args()
    rng = random.Random(options.seed)
    names = [f"gpu-node-{i:04d}" for i in range(options.nodes)]

    gc.collect()
    rss_start = status_mib("VmRSS")
    cache = ClusterCache()
    began = time.perf_counter()
    cache.replace_nodes([node(name, options.gpus) for name in names])
    nodes_s = time.perf_counter() - began
    gc.collect()
    rss_nodes = status_mib("VmRSS")

    ingest_s = 0.0
    for start in range(0, options.pods, options.batch):
        batch = [
            pod(i, names[i % len(names)], options.gpus, rng)
            for i in range(start, min(options.pods, start + options.batch))
        ]
        began = time.perf_counter()
        for obj in batch:
            cache.upsert_pod(obj)
        ingest_s += time.perf_counter() - began
        del batch
    gc.collect()
    rss_pods = status_mib("VmRSS")
    counted = sum(state.in_ledger for state in cache.pods.values())
    if len(cache.pods) != options.pods or counted != options.pods:
        sys.exit(f"expected {options.pods} pods in the ledger, got {counted} of {len(cache.pods)}")

    rng = random.Random(options.seed)
    relist = [pod(i, names[i % len(names)], options.gpus, rng) for i in range(options.pods)]
    began = time.perf_counter()
    cache.replace_pods(relist)
    relist_s = time.perf_counter() - began
    del relist
    gc.collect()
    rss_relist = status_mib("VmRSS")
    peak = status_mib("VmHWM")

    print(
        f"{options.nodes} nodes x {options.gpus} GPUs, {options.pods} pods "
        f"({options.pods // 10} of them on 2 GPUs), all in the ledger"
    )
    print(f"{'step':<42} {'time s':>8} {'RSS MiB':>9}")
    print(f"{'python + imports (extender, lightkube)':<42} {'':>8} {rss_start:>9.1f}")
    print(f"{'replace_nodes (list of nodes)':<42} {nodes_s:>8.2f} {rss_nodes:>9.1f}")
    rate = options.pods / ingest_s
    print(
        f"{f'upsert_pod x {options.pods} ({rate:,.0f} pods/s)':<42} {ingest_s:>8.2f} "
        f"{rss_pods:>9.1f}"
    )
    print(f"{'replace_pods (relist of all pods)':<42} {relist_s:>8.2f} {rss_relist:>9.1f}")
    print(f"peak RSS (VmHWM) {peak:.1f} MiB; cache's pods add {rss_pods - rss_nodes:.1f} MiB")
    verdict = "meets" if max(rss_relist, rss_pods) < TARGET_MIB else "misses"
    print(
        f"RSS with {options.pods} pods {max(rss_pods, rss_relist):.1f} MiB {verdict} the "
        f"{TARGET_MIB:.0f} MiB target"
    )


if __name__ == "__main__":
    main()
