"""Latency of the extender's filter and prioritize, over HTTP, with 1000 nodes of 8 GPUs.

Run: .venv/bin/python bench/bench_extender.py [--nodes 1000] [--gpus 8] [--pods 500]
         [--candidate-nodes auto|N]
Target (issue 5): p99 of filter + prioritize under 10 ms.

The extender runs in this process (the HTTP server in its threads, as `gpushare extender`
does), its cache filled directly: N nodes of H200s, a quarter of their GPUs (--busy) already
holding a share. A client on one kept-alive connection, as kube-scheduler's, sends each pod's
filter then prioritize in node-cache-capable mode (the 1000 node names only) and times each call
from send to the whole answer read. The pods vary: 1..80 GiB, some with gpu-core, some
spread over 2 GPUs, some exclusive.
As kube-scheduler does, prioritize is called only when filter passes more than one node: with
the default --candidate-nodes auto filter passes the GPU policy's best node alone (these pods
state no soft preferences), and kube-scheduler then skips prioritize; --candidate-nodes 0 passes
every node that fits and times prioritize over all of them (what a pod with preferred
affinities costs).
"""

from __future__ import annotations

import argparse
import http.client
import json
import random
import statistics
import time

from gpushare import protocol
from gpushare.cli.extender import candidate_nodes
from gpushare.extender.cache import ClusterCache
from gpushare.extender.server import Extender, make_server, serve_in_thread

TARGET_MS = 10.0


def node(name: str, gpus: int) -> dict:
    inventory = [
        protocol.GpuInfo(f"GPU-{name}-{i}", i, "H200", 141 * 1024, i // 4) for i in range(gpus)
    ]
    return {
        "metadata": {
            "name": name,
            "labels": {protocol.LABEL_ENABLED: "true"},
            "annotations": {protocol.ANNOTATION_GPUS: protocol.encode_gpus(inventory)},
        }
    }


def pod(name: str, rng: random.Random) -> dict:
    kind = rng.random()
    annotations = {}
    if kind < 0.1:
        limits = {protocol.RESOURCE_GPU_COUNT: "1"}
    else:
        limits = {protocol.RESOURCE_GPU_MEMORY: str(rng.randint(1, 80))}
        if kind < 0.4:
            limits[protocol.RESOURCE_GPU_CORE] = str(rng.choice((10, 25, 50)))
        if kind > 0.9:
            limits[protocol.RESOURCE_GPU_MEMORY] = str(2 * rng.randint(1, 40))
            annotations[protocol.ANNOTATION_GPU_COUNT] = "2"
    return {
        "metadata": {
            "name": name,
            "namespace": "bench",
            "uid": f"uid-{name}",
            "annotations": annotations,
        },
        "spec": {"containers": [{"name": "main", "resources": {"limits": limits}}]},
    }


def bound_pod(name: str, node_name: str, gpu: int, mib: int) -> dict:
    share = protocol.ShareInfo(f"GPU-{node_name}-{gpu}", gpu, mib, 0)
    return {
        "metadata": {
            "name": name,
            "namespace": "busy",
            "uid": f"uid-{name}",
            "annotations": {
                protocol.ANNOTATION_ALLOCATION: protocol.encode_allocation({"main": [share]})
            },
        },
        "spec": {"nodeName": node_name, "containers": [{"name": "main"}]},
        "status": {"phase": "Running"},
    }


def percentile(values: list[float], q: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(q * len(ordered)))]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--nodes", type=int, default=1000)
    parser.add_argument("--gpus", type=int, default=8)
    parser.add_argument("--pods", type=int, default=500)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument(
        "--busy", type=float, default=0.25, help="fraction of GPUs already holding a share"
    )
    parser.add_argument(
        "--candidate-nodes",
        type=candidate_nodes,
        default="auto",
        metavar="N|auto",
        help="as the extender's option (default auto)",
    )
    options = parser.parse_args()
    rng = random.Random(options.seed)
    names = [f"node-{i:04d}" for i in range(options.nodes)]
    cache = ClusterCache()
    cache.replace_nodes([node(name, options.gpus) for name in names])
    busy = [
        bound_pod(f"busy-{n}-{g}", name, g, rng.randint(1, 100) * 1024)
        for n, name in enumerate(names)
        for g in range(options.gpus)
        if rng.random() < options.busy
    ]
    cache.replace_pods(busy)
    server = make_server(Extender(cache, candidate_limit=options.candidate_nodes), "127.0.0.1", 0)
    serve_in_thread(server)
    host, port = server.server_address[:2]
    connection = http.client.HTTPConnection(host, port, timeout=10)
    prefix = protocol.EXTENDER_PATH_PREFIX

    def call(verb: str, body: bytes) -> tuple[float, object]:
        began = time.perf_counter()
        connection.request("POST", f"{prefix}/{verb}", body, {"Content-Type": "application/json"})
        response = connection.getresponse()
        answer = json.loads(response.read())
        elapsed = (time.perf_counter() - began) * 1000
        assert response.status == 200, answer
        return elapsed, answer

    timings: dict[str, list[float]] = {"filter": [], "prioritize": [], "filter+prioritize": []}
    passed = 0
    for i in range(options.pods + 20):
        body = json.dumps({"pod": pod(f"p{i}", rng), "nodenames": names}).encode()
        filter_ms, result = call(protocol.EXTENDER_FILTER_VERB, body)
        prioritize_ms = 0.0
        fitting = result["nodenames"]  # type: ignore[index]
        if len(fitting) > 1:  # kube-scheduler scores only when more than one node fits
            body = json.dumps({"pod": json.loads(body)["pod"], "nodenames": fitting}).encode()
            prioritize_ms, _ = call(protocol.EXTENDER_PRIORITIZE_VERB, body)
        if i < 20:
            continue  # warm-up
        passed += len(fitting)
        timings["filter"].append(filter_ms)
        if prioritize_ms:
            timings["prioritize"].append(prioritize_ms)
        timings["filter+prioritize"].append(filter_ms + prioritize_ms)
    connection.close()
    server.shutdown()
    server.server_close()
    print(
        f"{options.nodes} nodes x {options.gpus} GPUs, {len(busy)} shares already placed, "
        f"{options.pods} pods (mean {passed / options.pods:.0f} nodes pass filter)"
    )
    print(f"{'verb':<18} {'p50 ms':>8} {'p99 ms':>8} {'max ms':>8}")
    for verb, values in timings.items():
        if not values:
            print(f"{verb:<18} {'not called':>8}")
            continue
        print(
            f"{verb:<18} {statistics.median(values):>8.2f} {percentile(values, 0.99):>8.2f} "
            f"{max(values):>8.2f}"
        )
    p99 = percentile(timings["filter+prioritize"], 0.99)
    verdict = "meets" if p99 < TARGET_MS else "misses"
    print(f"p99 filter+prioritize {p99:.2f} ms {verdict} the {TARGET_MS:.0f} ms target")


if __name__ == "__main__":
    main()
