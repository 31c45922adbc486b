"""Builders for the monitor's tests: pods with allocations, fixture /proc trees, mock configs."""

from __future__ import annotations

import hashlib
import json
import os
import re
import subprocess
import sys
import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from gpushare import protocol
from gpushare.monitor.nvml import GpuProcess, GpuSample
from gpushare.protocol import ShareInfo

ROOT = Path(__file__).resolve().parents[2]
NATIVE = ROOT / "native"
MIB = 1 << 20
GIB = 1 << 30
NODE = "gpu-node-00"
GPU0 = "GPU-12345678-1234-1234-1234-123456789abc"
GPU1 = "GPU-aaaaaaaa-bbbb-cccc-dddd-eeeeeeeeeeee"
DEVICES = [
    {"name": "NVIDIA H200", "uuid": GPU0, "memory_mib": 8192, "sm_count": 132},
    {"name": "NVIDIA H200", "uuid": GPU1, "memory_mib": 8192, "sm_count": 132},
]
CONTEXT_MIB = 300  # the mock's default charge per context


def container_id(name: str) -> str:
    """A 64-hex runtime ID, stable per name."""
    return hashlib.sha256(name.encode()).hexdigest()


def pod_uid(name: str) -> str:
    digest = hashlib.md5(name.encode()).hexdigest()
    return f"{digest[:8]}-{digest[8:12]}-{digest[12:16]}-{digest[16:20]}-{digest[20:32]}"


def share(uuid: str, index: int, memory_mib: int, core: int = 0, exclusive: bool = False):
    return ShareInfo(uuid, index, memory_mib, core, exclusive)


def pod(
    name: str,
    containers: dict[str, list[ShareInfo]],
    *,
    namespace: str = "default",
    node: str = NODE,
    started: bool = True,
    phase: str = "Running",
) -> dict[str, Any]:
    """A pod bound to ``node`` with this allocation; ``started``: kubelet reported its IDs."""
    statuses = [
        {"name": c, "containerID": f"containerd://{container_id(f'{namespace}/{name}/{c}')}"}
        for c in containers
    ]
    return {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {
            "name": name,
            "namespace": namespace,
            "uid": pod_uid(f"{namespace}/{name}"),
            "annotations": {protocol.ANNOTATION_ALLOCATION: protocol.encode_allocation(containers)},
        },
        "spec": {"nodeName": node, "containers": [{"name": c, "image": "x"} for c in containers]},
        "status": {"phase": phase, "containerStatuses": statuses if started else []},
    }


def node_object(healthy: dict[str, bool] | None = None) -> dict[str, Any]:
    gpus = [
        protocol.GpuInfo(
            d["uuid"], i, "H200", d["memory_mib"], 0, (healthy or {}).get(d["uuid"], True)
        )
        for i, d in enumerate(DEVICES)
    ]
    return {
        "apiVersion": "v1",
        "kind": "Node",
        "metadata": {
            "name": NODE,
            "annotations": {protocol.ANNOTATION_GPUS: protocol.encode_gpus(gpus)},
        },
    }


def cgroup_text(namespace: str, name: str, container: str, style: str = "v2-systemd") -> str:
    """/proc/<pid>/cgroup of a process of that container, as containerd would place it."""
    uid = pod_uid(f"{namespace}/{name}")
    cid = container_id(f"{namespace}/{name}/{container}")
    if style == "v2-systemd":
        under = uid.replace("-", "_")
        return (
            "0::/kubepods.slice/kubepods-burstable.slice/"
            f"kubepods-burstable-pod{under}.slice/cri-containerd-{cid}.scope\n"
        )
    path = f"/kubepods/besteffort/pod{uid}/{cid}"
    return f"12:memory:{path}\n11:cpu,cpuacct:{path}\n"


def write_proc(root: Path, pid: int, cgroup: str) -> None:
    """Fixture /proc: ``root/<pid>/cgroup``."""
    (root / str(pid)).mkdir(parents=True, exist_ok=True)
    (root / str(pid) / "cgroup").write_text(cgroup)


def write_config(path: Path, devices: list[dict[str, Any]] = DEVICES) -> Path:
    path.write_text(json.dumps({"driver_version": 12080, "devices": devices}))
    return path


def mock_env(config: Path) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("GPUSHARE_")}
    env["GPUSHARE_MOCK_CONFIG"] = str(config)
    env["LD_LIBRARY_PATH"] = str(NATIVE / "build" / "mock")
    return env


def hold(config: Path, device: int, mib: int, kernel_us: int = 0) -> subprocess.Popen[str]:
    """A mock_hold process (no interception library): a context and ``mib`` on ``device``,
    and with ``kernel_us`` one kernel that keeps the device busy that long."""
    args = [str(device), str(mib)] + ([str(kernel_us)] if kernel_us else [])
    process = subprocess.Popen(
        [str(NATIVE / "build" / "tests" / "mock_hold"), *args],
        env=mock_env(config),
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    assert process.stdout is not None
    line = process.stdout.readline()
    if not line.startswith("ready"):
        process.kill()
        _, err = process.communicate()
        raise AssertionError(f"mock_hold {device} {mib}: {line!r} {err}")
    return process


def release(processes: list[subprocess.Popen[str]]) -> None:
    for process in processes:
        if process.poll() is None:
            process.kill()
        process.communicate(timeout=10)


SERVING = re.compile(r"serving http://[^:]+:(\d+)/metrics")


def start_monitor(
    args: list[str], env: dict[str, str], deadline_s: float = 20
) -> tuple[subprocess.Popen[str], int]:
    """`gpushare monitor ARGS` on a free port; the process and the port it serves on."""
    process = subprocess.Popen(
        [str(ROOT / ".venv" / "bin" / "gpushare"), "monitor", "--listen", "127.0.0.1:0", *args],
        env=env,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.PIPE,
        text=True,
    )
    assert process.stderr is not None
    deadline = time.monotonic() + deadline_s
    lines = []
    while time.monotonic() < deadline:
        line = process.stderr.readline()
        if not line:
            break
        lines.append(line)
        found = SERVING.search(line)
        if found:
            # Keep reading its log so that a full pipe never blocks it.
            threading.Thread(target=process.stderr.read, daemon=True).start()
            return process, int(found.group(1))
    process.kill()
    process.wait()
    raise AssertionError(f"the monitor did not start serving: {''.join(lines)}")


_SAMPLE = (
    "import json, dataclasses\n"
    "from gpushare.monitor.nvml import NvmlSource\n"
    "print(json.dumps([dataclasses.asdict(s) for s in NvmlSource().sample()]))\n"
)


def sampler(config: Path) -> Callable[[], list[GpuSample]]:
    """NvmlSource.sample() through the mock NVML, run in a child process: which NVML a process
    uses is fixed when it first loads one, and the test process must not load the mock."""

    def sample() -> list[GpuSample]:
        out = subprocess.run(
            [sys.executable, "-c", _SAMPLE],
            env=mock_env(config),
            capture_output=True,
            text=True,
            check=True,
            timeout=30,
        ).stdout
        samples = []
        for item in json.loads(out):
            item["processes"] = tuple(GpuProcess(**p) for p in item["processes"])
            if item["process_utilization"] is not None:  # JSON made the pids strings
                item["process_utilization"] = {
                    int(pid): ratio for pid, ratio in item["process_utilization"].items()
                }
            samples.append(GpuSample(**item))
        return samples

    return sample
