"""Pods bound per second end to end, through the real kube-scheduler, with and without the extender.

Run: .venv/bin/python bench/bench_extender_e2e.py [--nodes 100] [--gpus 8] [--pods 1000]
         [--repeat N]
Target (issue 5): gpushare pods bound at least 80% as fast as plain pods.

Two local clusters (`gpushare cluster up`, each in a fresh temporary state dir, torn down with
`gpushare cluster down` at the end even on error), N simulated nodes of 8 H200s each:

- `up` (no extender): N plain pods (100m CPU, 128 MiB, no GPU), placed and bound by
  kube-scheduler alone;
- `up --extender`: N gpushare pods (`gpushare.io/gpu-mem` 1..4 GiB, one in five with
  `gpushare.io/gpu-core`), which kube-scheduler sends to the extender's filter (with its
  default `--candidate-nodes auto` filter passes one node, so prioritize is not called) and
  bind (the extender posts the Binding, which carries the pod's annotations).

Scheduling, not creating, is measured: every node is cordoned (spec.unschedulable) while
--writers threads create the N pods, and the clock starts when the nodes are uncordoned
(kube-scheduler then has N pods queued). A watch on the namespace, started from the
resourceVersion of a list made before the first create, counts pods as their spec.nodeName
appears; no sleeps. The rate is N over the time from the first uncordon to the last bind seen.
With --no-cordon pods are created into a schedulable cluster and the clock starts at the first
create (the create rate is then printed too: if it were the limit, both rates would be near
it). Both clusters use deploy/scheduler/kube-scheduler-config.yaml, whose clientConnection
qps/burst bound how fast kube-scheduler itself posts Bindings (plain pods); the extender binds
gpushare pods through its own client.
"""

from __future__ import annotations

import argparse
import json
import os
import random
import statistics
import subprocess
import sys
import tempfile
import threading
import time
import urllib.request
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

from lightkube import Client, KubeConfig
from lightkube.resources.core_v1 import Namespace, Node, Pod
from prometheus_client.parser import text_string_to_metric_families

from gpushare import protocol
from gpushare.cluster.binaries import find_bin_dir
from gpushare.cluster.processes import tls_context

TARGET_RATIO = 0.8
NAMESPACE = "bench"


def gpushare(env: dict[str, str], *args: str) -> float:
    started = time.perf_counter()
    result = subprocess.run(
        [sys.executable, "-m", "gpushare.cli.main", "cluster", *args],
        capture_output=True,
        text=True,
        env=env,
        check=False,
    )
    if result.returncode != 0:
        raise RuntimeError(f"gpushare cluster {' '.join(args)} failed: {result.stderr.strip()}")
    return time.perf_counter() - started


def plain_pod(name: str, rng: random.Random) -> dict:
    limits = {"cpu": "100m", "memory": "128Mi"}
    return container_pod(name, limits)


def gpushare_pod(name: str, rng: random.Random) -> dict:
    limits = {protocol.RESOURCE_GPU_MEMORY: str(rng.randint(1, 4))}
    if rng.random() < 0.2:
        limits[protocol.RESOURCE_GPU_CORE] = str(rng.choice((10, 25, 50)))
    return container_pod(name, limits)


def container_pod(name: str, limits: dict[str, str]) -> dict:
    return {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {"name": name, "namespace": NAMESPACE, "labels": {"app": "bench"}},
        "spec": {
            "containers": [
                {
                    "name": "main",
                    "image": "registry.k8s.io/pause:3.10",
                    "resources": {"limits": limits, "requests": limits},
                }
            ]
        },
    }


def cpu_seconds(state_dir: Path) -> dict[str, float]:
    """CPU time (user + system) each process of the cluster has used so far."""
    ticks = os.sysconf("SC_CLK_TCK")
    state = json.loads((state_dir / "state.json").read_text())
    used = {}
    for name, record in state["processes"].items():
        try:
            fields = Path(f"/proc/{record['pid']}/stat").read_text().rsplit(")", 1)[1].split()
        except OSError:
            continue
        used[name] = (int(fields[11]) + int(fields[12])) / ticks
    return used


def extender_verb_ms() -> dict[str, float]:
    """Mean time the extender took to answer each verb, from its /metrics (server side)."""
    url = f"http://127.0.0.1:{protocol.EXTENDER_DEFAULT_PORT}/metrics"
    text = urllib.request.urlopen(url, timeout=5).read().decode()
    sums: dict[str, float] = {}
    counts: dict[str, float] = {}
    names = {"gpushare_extender_request_seconds", "gpushare_extender_binding_api_seconds"}
    for family in text_string_to_metric_families(text):
        for sample in family.samples if family.name in names else ():
            verb = sample.labels.get("verb", "Binding API call")
            if sample.name.endswith("_sum"):
                sums[verb] = sample.value
            elif sample.name.endswith("_count"):
                counts[verb] = sample.value
    return {verb: 1000 * sums[verb] / counts[verb] for verb in counts if counts[verb]}


def scheduler_algorithm(state_dir: Path) -> tuple[float, float]:
    """kube-scheduler's scheduling_algorithm_duration_seconds so far: (sum s, attempts). The
    algorithm (its filter plugins, the extender's filter and prioritize, its score plugins)
    runs once per attempt in its one scheduling loop: the time per attempt bounds pods/s."""
    state = json.loads((state_dir / "state.json").read_text())
    url = state["processes"]["kube-scheduler"]["url"] + "/metrics"
    context = tls_context(state_dir / "pki" / "ca.crt")
    text = urllib.request.urlopen(url, context=context, timeout=5).read().decode()
    total = count = 0.0
    for family in text_string_to_metric_families(text):
        if family.name != "scheduler_scheduling_algorithm_duration_seconds":
            continue
        for sample in family.samples:
            if sample.name.endswith("_sum"):
                total += sample.value
            elif sample.name.endswith("_count"):
                count += sample.value
    return total, count


def set_cordon(config: KubeConfig, nodes: list[str], cordoned: bool, writers: int) -> None:
    local = threading.local()

    def patch(name: str) -> None:
        if not hasattr(local, "client"):
            local.client = Client(config=config, field_manager="bench")
        local.client.patch(Node, name, {"spec": {"unschedulable": cordoned or None}})

    with ThreadPoolExecutor(max_workers=writers) as pool:
        list(pool.map(patch, nodes))


def measure(
    state_dir: Path, count: int, make_pod, writers: int, timeout: float, cordon: bool
) -> dict:
    """Create ``count`` pods; return timings, counting binds with a watch."""
    config = KubeConfig.from_file(state_dir / "kubeconfig")
    client = Client(config=config, field_manager="bench")
    client.create(Namespace(metadata={"name": NAMESPACE}))  # type: ignore[arg-type]
    nodes = [node.metadata.name for node in client.list(Node)]
    if cordon:
        set_cordon(config, nodes, True, writers)
    listing = client.list(Pod, namespace=NAMESPACE)
    list(listing)
    version = listing.resourceVersion
    bound: dict[str, float] = {}
    done = threading.Event()
    failure: list[BaseException] = []

    def watch() -> None:
        watcher = Client(config=config, field_manager="bench-watch", timeout=None)
        try:
            for _, obj in watcher.watch(Pod, namespace=NAMESPACE, resource_version=version):
                if obj.spec and obj.spec.nodeName and obj.metadata.name not in bound:
                    bound[obj.metadata.name] = time.perf_counter()
                    if len(bound) >= count:
                        done.set()
                        return
        except BaseException as error:  # surfaced to the main thread
            failure.append(error)
            done.set()

    threading.Thread(target=watch, name="bench-watch", daemon=True).start()
    rng = random.Random(0)
    pods = [make_pod(f"pod-{i:05d}", rng) for i in range(count)]
    local = threading.local()

    def create(obj: dict) -> float:
        if not hasattr(local, "client"):
            local.client = Client(config=config, field_manager="bench")
        local.client.create(Pod.from_dict(obj))
        return time.perf_counter()

    began = time.perf_counter()
    with ThreadPoolExecutor(max_workers=writers) as pool:
        created = list(pool.map(create, pods))
    created_s = max(created) - began
    cpu_before = cpu_seconds(state_dir)
    algorithm_before = scheduler_algorithm(state_dir)
    if cordon:
        if bound:
            raise RuntimeError(f"{len(bound)} pod(s) bound while every node was cordoned")
        began = time.perf_counter()
        set_cordon(config, nodes, False, writers)
    if not done.wait(timeout):
        raise RuntimeError(f"only {len(bound)} of {count} pods bound after {timeout:.0f} s")
    if failure:
        raise RuntimeError(f"watch failed: {failure[0]}")
    last = max(bound.values())
    cpu_after = cpu_seconds(state_dir)
    algorithm_s, attempts = (
        after - before
        for after, before in zip(scheduler_algorithm(state_dir), algorithm_before, strict=True)
    )
    verb_ms = extender_verb_ms() if "extender" in cpu_after else {}
    window = last - began
    # Share of one core each component used while the pods were scheduled.
    cpu = {
        name: (cpu_after[name] - cpu_before.get(name, 0.0)) / window
        for name in cpu_after
        if name in cpu_before
    }
    return {
        "algorithm_ms": 1000 * algorithm_s / attempts if attempts else 0.0,
        "attempts": int(attempts),
        "verb_ms": verb_ms,
        "cpu": cpu,
        "pods": count,
        "create_s": created_s,
        "bound_s": last - began,
        "create_rate": count / created_s,
        "bind_rate": count / (last - began),
    }


def run_cluster(env: dict[str, str], tmp: str, label: str, options, extender: bool, make_pod):
    state_dir = Path(tmp) / label
    where = ("--state-dir", str(state_dir))
    flags = ["--nodes", str(options.nodes), "--gpus-per-node", str(options.gpus)]
    flags.append("--extender" if extender else "--no-extender")
    try:
        up_s = gpushare(env, "up", *where, *flags)
        print(f"{label}: cluster up in {up_s:.1f} s", flush=True)
        result = measure(
            state_dir,
            options.pods,
            make_pod,
            options.writers,
            options.timeout,
            options.cordon,
        )
    finally:
        try:
            gpushare(env, "down", *where)
        except RuntimeError as error:
            print(error, file=sys.stderr)
    print(
        f"{label}: {result['pods']} pods created in {result['create_s']:.1f} s "
        f"({result['create_rate']:.0f}/s), all bound after {result['bound_s']:.1f} s "
        f"({result['bind_rate']:.1f} pods/s); CPU (cores): "
        + ", ".join(f"{name} {share:.2f}" for name, share in sorted(result["cpu"].items()))
        + f"; kube-scheduler algorithm {result['algorithm_ms']:.2f} ms mean over "
        f"{result['attempts']} attempts"
        + "".join(
            f"; {verb} {ms:.2f} ms mean (server side)" for verb, ms in result["verb_ms"].items()
        ),
        flush=True,
    )
    return result


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--nodes", type=int, default=100)
    parser.add_argument("--gpus", type=int, default=8)
    parser.add_argument("--pods", type=int, default=1000)
    parser.add_argument("--writers", type=int, default=8, help="threads creating pods")
    parser.add_argument("--timeout", type=float, default=300.0, help="seconds to wait for binds")
    parser.add_argument(
        "--no-cordon",
        dest="cordon",
        action="store_false",
        help="create pods into a schedulable cluster (clock from the first create)",
    )
    parser.add_argument(
        "--repeat",
        type=int,
        default=1,
        help="rounds of both runs; the ratio reported is their median (a busy 2-core "
        "machine varies by 10-20%% from run to run)",
    )
    options = parser.parse_args()
    if options.repeat < 1:
        parser.error("--repeat must be at least 1")

    bin_dir = find_bin_dir()
    env = {**os.environ, "GPUSHARE_K8S_BIN_DIR": str(bin_dir)}
    print(
        f"{os.cpu_count()} CPU(s); {options.nodes} nodes x {options.gpus} GPUs, "
        f"{options.pods} pods per run, {options.writers} writers",
        flush=True,
    )
    rounds: list[tuple[dict, dict]] = []
    for round_number in range(1, options.repeat + 1):
        if options.repeat > 1:
            print(f"round {round_number} of {options.repeat}", flush=True)
        with tempfile.TemporaryDirectory(prefix="bench-extender-e2e-") as tmp:
            plain = run_cluster(env, tmp, "plain", options, False, plain_pod)
            shared = run_cluster(env, tmp, "gpushare", options, True, gpushare_pod)
        rounds.append((plain, shared))
    start = "first uncordon" if options.cordon else "first create"
    print(f"| round | pods | scheduler | pods/s bound ({start} to last bind) | create rate |")
    print("| --- | --- | --- | --- | --- |")
    for round_number, (plain, shared) in enumerate(rounds, 1):
        for name, label, result in (
            ("plain (no GPU)", "kube-scheduler", plain),
            ("gpushare.io/gpu-mem", "kube-scheduler + extender", shared),
        ):
            print(
                f"| {round_number} | {name} | {label} | {result['bind_rate']:.1f} "
                f"({result['pods']} in {result['bound_s']:.1f} s) | "
                f"{result['create_rate']:.0f}/s |"
            )
    ratios = [shared["bind_rate"] / plain["bind_rate"] for plain, shared in rounds]
    ratio = statistics.median(ratios)
    verdict = "meets" if ratio >= TARGET_RATIO else "misses"
    each = ", ".join(f"{r:.0%}" for r in ratios)
    print(
        f"ratio gpushare / plain {ratio:.0%} (median of {len(ratios)}: {each}) "
        f"{verdict} the {TARGET_RATIO:.0%} target"
    )


if __name__ == "__main__":
    main()
