"""`gpushare monitor` on a node of 8 GPUs with 160 containers: scrape time and memory.

Run: .venv/bin/python bench/bench_monitor.py [--gpus 8] [--containers 160] [--scrapes 100]
Targets (issue 7): a scrape under 100 ms, the monitor under 100 MiB.

The node is as real as this machine allows: the mock NVML (native/build/mock, built by
`make -C native`) with 8 devices; one real process per container holding a context and memory
on its GPU through the mock driver (native/build/tests/mock_hold), so NVML's process list has
160 entries; a fixture /proc whose cgroup files put each process in its container (cgroup v2,
systemd driver, containerd); one state file per container (version 1, written with
gpushare.monitor.statefile.encode, the layout the tests check against the C library's files);
and a pods file with the 160 pods (one GPU container each, a 20 % share of one GPU) that the
API server would send. The monitor runs as a separate process (`gpushare monitor`, watchdog
on, as deployed) and is scraped over HTTP as Prometheus would, one scrape after another.
Reported: client-side time per scrape (HTTP included), the exporter's own
gpushare_monitor_collect_seconds, the response size and series count, and the monitor's
VmRSS/VmHWM after the scrapes.

With ``--kube`` the pods come from a real API server instead of the file: a local control
plane (`gpushare cluster up`, one simulated node of 8 H200) where the 160 pods are created
bound to the node, their container IDs set through the status subresource (kubelet's part);
the monitor lists and watches them (fieldSelector spec.nodeName) as on a real node, and its
memory then includes the Kubernetes client and the watch threads.
"""

from __future__ import annotations

import argparse
import contextlib
import hashlib
import json
import os
import re
import statistics
import subprocess
import sys
import tempfile
import threading
import time
import urllib.request
from pathlib import Path

from gpushare import protocol
from gpushare.monitor import statefile

ROOT = Path(__file__).resolve().parents[1]
MOCK = ROOT / "native" / "build" / "mock"
HOLD = ROOT / "native" / "build" / "tests" / "mock_hold"
MIB = 1 << 20
TARGET_MS = 100.0
TARGET_MIB = 100.0


def _uid(seed: str) -> str:
    d = hashlib.md5(seed.encode()).hexdigest()
    return f"{d[:8]}-{d[8:12]}-{d[12:16]}-{d[16:20]}-{d[20:32]}"


def _status_mib(pid: int, field: str) -> float:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith(field + ":"):
            return int(line.split()[1]) / 1024
    raise KeyError(field)


def make_pods(uuids: list[str], containers: int, node: str) -> list[dict]:
    """One pod per container, a 20 % share of one GPU each, bound to ``node``, started."""
    limit_mib = 143771 // 20
    pods = []
    for i in range(containers):
        gpu = i % len(uuids)
        name = f"job-{i:03d}"
        cid = hashlib.sha256(name.encode()).hexdigest()
        share = protocol.ShareInfo(uuids[gpu], gpu, limit_mib, 20)
        pods.append(
            {
                "apiVersion": "v1",
                "kind": "Pod",
                "metadata": {
                    "name": name,
                    "namespace": f"team-{i % 10}",
                    "uid": _uid(name),
                    "annotations": {
                        protocol.ANNOTATION_ALLOCATION: protocol.encode_allocation(
                            {"main": [share]}
                        )
                    },
                },
                "spec": {"nodeName": node, "containers": [{"name": "main", "image": "x"}]},
                "status": {
                    "phase": "Running",
                    "containerStatuses": [{"name": "main", "containerID": f"containerd://{cid}"}],
                },
            }
        )
    return pods


def build_node(
    tmp: Path, uuids: list[str], pods: list[dict]
) -> tuple[dict[str, str], list[subprocess.Popen[str]]]:
    """The mock GPUs; per container a process holding memory on its GPU (mock_hold), its
    cgroup in the fixture /proc and its state file."""
    config = tmp / "mock.json"
    devices = [
        {"name": "NVIDIA H200", "uuid": u, "memory_mib": 143771, "sm_count": 132} for u in uuids
    ]
    config.write_text(json.dumps({"driver_version": 12080, "devices": devices}))
    env = {k: v for k, v in os.environ.items() if not k.startswith("GPUSHARE_")}
    env.update(GPUSHARE_MOCK_CONFIG=str(config), LD_LIBRARY_PATH=str(MOCK))
    holders = []
    for i, item in enumerate(pods):
        uid = item["metadata"]["uid"]
        cid = item["status"]["containerStatuses"][0]["containerID"].rpartition("://")[2]
        (share,) = protocol.decode_allocation(
            item["metadata"]["annotations"][protocol.ANNOTATION_ALLOCATION]
        )["main"]
        mib = 64 + i % 7 * 32
        holder = subprocess.Popen(
            [str(HOLD), str(share.index), str(mib)],
            env=env,
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            text=True,
        )
        holders.append(holder)
        assert holder.stdout is not None and holder.stdout.readline().startswith("ready")
        (tmp / "proc" / str(holder.pid)).mkdir(parents=True)
        (tmp / "proc" / str(holder.pid) / "cgroup").write_text(
            "0::/kubepods.slice/kubepods-burstable.slice/kubepods-burstable-pod"
            f"{uid.replace('-', '_')}.slice/cri-containerd-{cid}.scope\n"
        )
        directory = statefile.container_dir(tmp / "states", uid, "main")
        directory.mkdir(parents=True)
        used = (300 + mib) * MIB
        (directory / statefile.FILE_NAME).write_bytes(
            statefile.encode([(share.memory_mib * MIB, used)], [(1, 1, [used])], refused=i % 3)
        )
    return env, holders


def create_pods(kubeconfig: Path, pods: list[dict]) -> None:
    """The pods in the API server, bound, with the container IDs kubelet would report."""
    from lightkube import Client, KubeConfig
    from lightkube.resources.core_v1 import Namespace, Pod

    client = Client(config=KubeConfig.from_file(kubeconfig), field_manager="bench")
    try:
        for namespace in sorted({p["metadata"]["namespace"] for p in pods}):
            client.create(Namespace.from_dict({"metadata": {"name": namespace}}))
        for item in pods:
            status = item["status"]
            body = {k: v for k, v in item.items() if k != "status"}
            body["metadata"] = {k: v for k, v in item["metadata"].items() if k != "uid"}
            created = client.create(Pod.from_dict(body))
            item["metadata"]["uid"] = created.metadata.uid
            statuses = [
                {**c, "image": "x", "imageID": "", "ready": True, "restartCount": 0}
                for c in status["containerStatuses"]
            ]
            client.patch(
                Pod.Status,
                created.metadata.name,
                {"status": {"phase": "Running", "containerStatuses": statuses}},
                namespace=created.metadata.namespace,
            )
    finally:
        client.close()


def monitor_args(tmp: Path, node: str, pods: list[dict], kubeconfig: Path | None) -> list[str]:
    args = ["--node-name", node, "--state-root", str(tmp / "states")]
    args += ["--proc-root", str(tmp / "proc")]
    if kubeconfig is not None:
        return [*args, "--kubeconfig", str(kubeconfig)]
    pods_file = tmp / "pods.json"
    pods_file.write_text(json.dumps({"kind": "List", "items": pods}))
    return [*args, "--pods-file", str(pods_file)]


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--gpus", type=int, default=8)
    parser.add_argument("--containers", type=int, default=160)
    parser.add_argument("--scrapes", type=int, default=100)
    parser.add_argument(
        "--kube", action="store_true", help="pods from a local control plane, not a file"
    )
    options = parser.parse_args()
    if not HOLD.exists():
        print("bench_monitor: build the mock first: make -C native", file=sys.stderr)
        return 2
    with tempfile.TemporaryDirectory() as directory, contextlib.ExitStack() as stack:
        tmp = Path(directory)
        node = "bench-node"
        uuids = [f"GPU-{i:08x}-0000-4000-8000-{i:012x}" for i in range(options.gpus)]
        pods = make_pods(uuids, options.containers, node)
        kubeconfig = None
        if options.kube:
            from gpushare.cluster import NodeSpec, down, up
            from gpushare.cluster.nodes import gpu_uuid

            spec = NodeSpec(count=1, gpus_per_node=options.gpus, gpu_model="H200")
            info = up(tmp / "cluster", spec, tie_to_parent=True, say=lambda _: None)
            stack.callback(down, tmp / "cluster")
            kubeconfig = info.kubeconfig
            node = "gpu-node-00"
            uuids = [gpu_uuid(node, i) for i in range(options.gpus)]
            pods = make_pods(uuids, options.containers, node)
            create_pods(kubeconfig, pods)
        env, holders = build_node(tmp, uuids, pods)
        args = monitor_args(tmp, node, pods, kubeconfig)
        monitor = subprocess.Popen(
            [str(ROOT / ".venv" / "bin" / "gpushare"), "monitor", "--listen", "127.0.0.1:0", *args],
            env=env,
            stderr=subprocess.PIPE,
            text=True,
        )
        try:
            assert monitor.stderr is not None
            port = None
            while port is None:
                line = monitor.stderr.readline()
                if not line:
                    raise SystemExit("bench_monitor: the monitor exited")
                found = re.search(r"serving http://[^:]+:(\d+)/metrics", line)
                port = int(found.group(1)) if found else None
            threading.Thread(target=monitor.stderr.read, daemon=True).start()
            url = f"http://127.0.0.1:{port}/metrics"
            deadline = time.monotonic() + 60
            while True:  # until the watch has listed all the pods
                with urllib.request.urlopen(url, timeout=30) as response:
                    body = response.read()
                listed = body.count(b"gpushare_container_memory_allocated_bytes{")
                if listed == options.containers:
                    break
                if time.monotonic() > deadline:
                    raise SystemExit(f"bench_monitor: {listed} containers listed after 60 s")
                time.sleep(0.1)
            times, collect = [], []
            for _ in range(options.scrapes + 3):
                started = time.perf_counter()
                with urllib.request.urlopen(url, timeout=30) as response:
                    body = response.read()
                times.append((time.perf_counter() - started) * 1000)
                found = re.search(rb"^gpushare_monitor_collect_seconds\{[^}]*\} (\S+)$", body, re.M)
                assert found is not None
                collect.append(float(found.group(1)) * 1000)
            times, collect = times[3:], collect[3:]  # the first scrapes warm the caches
            rss = _status_mib(monitor.pid, "VmRSS")
            hwm = _status_mib(monitor.pid, "VmHWM")
        finally:
            monitor.terminate()
            monitor.wait(timeout=30)
            for holder in holders:
                holder.communicate("", timeout=30)
    series = sum(1 for line in body.splitlines() if line and not line.startswith(b"#"))
    processes = options.containers
    quantiles = statistics.quantiles(times, n=20)
    print(
        f"pods from {'the API server' if options.kube else 'a file'}; "
        f"node: {options.gpus} GPUs, {options.containers} containers, {processes} GPU "
        f"processes; {options.scrapes} scrapes; response {len(body) / 1024:.0f} KiB, "
        f"{series} series"
    )
    print(
        f"scrape (client, HTTP included): median {statistics.median(times):.1f} ms, "
        f"p95 {quantiles[18]:.1f} ms, max {max(times):.1f} ms (target < {TARGET_MS:.0f} ms)"
    )
    print(
        f"collect (exporter's gpushare_monitor_collect_seconds): median "
        f"{statistics.median(collect):.1f} ms, max {max(collect):.1f} ms"
    )
    print(f"monitor memory: VmRSS {rss:.1f} MiB, VmHWM {hwm:.1f} MiB (target < {TARGET_MIB:.0f})")
    ok = quantiles[18] < TARGET_MS and hwm < TARGET_MIB
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
