"""Helpers for the device plugin's tests: the mock NVML's devices, pods as the extender leaves
them, the plugin in this process with a kubelet peer, and the plugin as a process."""

from __future__ import annotations

import ctypes
import json
import os
import subprocess
import sys
import threading
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
from deviceplugin_peer import KubeletPeer, SimulatedKubelet

from gpushare import protocol
from gpushare.cluster.nodes import gpu_uuid
from gpushare.deviceplugin.discovery import Gpu
from gpushare.deviceplugin.health import HealthMonitor, HealthTracker
from gpushare.deviceplugin.inventory import Inventory
from gpushare.deviceplugin.kube import StaticPods
from gpushare.deviceplugin.kubelet import Lifecycle
from gpushare.deviceplugin.matching import DECIDING_RESOURCES
from gpushare.deviceplugin.podresources import PodResourcesClient, Reconciler
from gpushare.deviceplugin.service import DevicePlugin, Settings

ROOT = Path(__file__).resolve().parents[2]
NATIVE = ROOT / "native"
MOCK_DIR = NATIVE / "build" / "mock"
NODE = "node-a"
GPU_MEMORY_MIB = 16384
NUMA = (0, 0, 1, 1)


LIBRARY = NATIVE / "build" / "libgpushare.so"


def build_mock() -> Path:
    """native/build/mock/libnvidia-ml.so.1 and native/build/libgpushare.so, built if needed."""
    result = subprocess.run(
        [
            "make",
            "-C",
            str(NATIVE),
            "--no-print-directory",
            "build/mock/libnvidia-ml.so.1",
            "build/libgpushare.so",
        ],
        capture_output=True,
        text=True,
        check=False,
    )
    if result.returncode != 0:
        pytest.fail(f"native build failed:\n{result.stdout}\n{result.stderr}")
    return MOCK_DIR / "libnvidia-ml.so.1"


def mock_devices(node: str, count: int, memory_mib: int, model: str) -> list[dict[str, Any]]:
    """Mock NVML devices with the simulated node's GPU UUIDs (two NUMA nodes, NVLink pairs)."""
    return [
        {
            "name": f"NVIDIA {model}",
            "uuid": gpu_uuid(node, i),
            "memory_mib": memory_mib,
            "sm_count": 40,
            "numa": i * 2 // count if count > 1 else 0,
            "nvlink_peers": [i ^ 1] if (i ^ 1) < count else [],
        }
        for i in range(count)
    ]


@dataclass
class Nvml:
    """The in-process mock NVML: the session's GPUs and its health injection."""

    library: Any
    gpus: list[Gpu]
    driver: str

    def inject_xid(self, index: int, xid: int) -> None:
        rc = self.library.gpushareMockInjectXid(ctypes.c_uint(index), ctypes.c_ulonglong(xid))
        assert rc == 0, f"gpushareMockInjectXid returned {rc}"

    def set_retirement_pending(self, index: int, pending: bool) -> None:
        rc = self.library.gpushareMockSetRetirementPending(ctypes.c_uint(index), int(pending))
        assert rc == 0, f"gpushareMockSetRetirementPending returned {rc}"


def make_pod(
    name: str,
    containers: dict[str, dict[str, int]],
    allocation: dict[str, list[protocol.ShareInfo]] | None,
    assume_time_ns: int | None = 1_000,
    *,
    node: str = NODE,
    phase: str = protocol.PHASE_ASSUMED,
    init: tuple[str, ...] = (),
    annotations: dict[str, str] | None = None,
) -> dict[str, Any]:
    """A pod in the Kubernetes JSON shape, bound to ``node``, annotated as the extender does."""
    notes = {protocol.ANNOTATION_PHASE: phase}
    if allocation is not None:
        notes[protocol.ANNOTATION_ALLOCATION] = protocol.encode_allocation(allocation)
    if assume_time_ns is not None:
        notes[protocol.ANNOTATION_ASSUME_TIME] = str(assume_time_ns)
    notes.update(annotations or {})

    def spec(cname: str) -> dict[str, Any]:
        limits = {resource: str(amount) for resource, amount in containers[cname].items()}
        return {"name": cname, "image": "x", "resources": {"limits": limits}}

    return {
        "metadata": {"name": name, "namespace": "ns", "uid": f"uid-{name}", "annotations": notes},
        "spec": {
            "nodeName": node,
            "initContainers": [spec(c) for c in containers if c in init],
            "containers": [spec(c) for c in containers if c not in init],
        },
        "status": {"phase": "Pending"},
    }


def share(gpus: list[Gpu], index: int, memory_mib: int, core: int = 0) -> protocol.ShareInfo:
    return protocol.ShareInfo(gpus[index].uuid, index, memory_mib, core)


@dataclass
class Harness:
    plugin: DevicePlugin
    pods: StaticPods
    lifecycle: Lifecycle
    peer: KubeletPeer
    kubelet: SimulatedKubelet
    monitor: HealthMonitor
    directory: Path
    host_root: Path
    reconciler: Reconciler


def start_harness(
    directory: Path,
    gpus: list[Gpu],
    *,
    unit_mib: int = protocol.MIB_PER_GIB,
    strategies: tuple[str, ...] = ("envvar",),
    recovery_s: float = 60.0,
    pods: list[dict[str, Any]] | None = None,
    gc_interval_s: float = 60.0,
    gc_grace_s: float = 300.0,
    pod_resources: bool = True,
    reconcile_interval_s: float = 30.0,
) -> Harness:
    """The plugin with its threads and a kubelet peer; ``pod_resources`` False: the peer's pod
    resources API is not started (its socket is missing)."""
    plugin_dir = directory / "device-plugins"
    plugin_dir.mkdir()
    host_root = directory / "host"
    source = StaticPods(pods or [])
    settings = Settings(
        node=NODE,
        memory_mib_per_unit=unit_mib,
        strategies=strategies,
        library_host_path="/opt/gpushare/libgpushare.so",
        host_state_root=host_root,
    )
    plugin = DevicePlugin(settings, Inventory(tuple(gpus), unit_mib), source, source)
    monitor = HealthMonitor(
        HealthTracker([g.uuid for g in gpus], recovery_s), plugin.set_health, wait_ms=50
    )
    peer = KubeletPeer(plugin_dir)
    if pod_resources:
        peer.serve_pod_resources()
    lifecycle = Lifecycle(plugin, plugin_dir, gc_interval_s=gc_interval_s, gc_grace_s=gc_grace_s)
    reconciler = Reconciler(
        PodResourcesClient(peer.pod_resources_socket),
        DECIDING_RESOURCES,
        plugin.reconcile,
        interval_s=reconcile_interval_s,
    )
    plugin.on_served = reconciler.wake
    threading.Thread(target=lifecycle.run, name="lifecycle", daemon=True).start()
    reconciler.start()
    monitor.start()
    assert monitor.registered.wait(10), "the health monitor did not register for events"
    peer.wait_registered(3)
    return Harness(
        plugin,
        source,
        lifecycle,
        peer,
        SimulatedKubelet(peer),
        monitor,
        plugin_dir,
        host_root,
        reconciler,
    )


def stop_harness(harness: Harness) -> None:
    harness.reconciler.stop()
    harness.kubelet.close()
    harness.monitor.stop()
    harness.lifecycle.stop()
    harness.peer.stop()


def unreachable_kubeconfig(path: Path) -> Path:
    path.write_text(
        json.dumps(
            {
                "apiVersion": "v1",
                "kind": "Config",
                "clusters": [
                    {
                        "name": "c",
                        "cluster": {
                            "server": "https://127.0.0.1:1",
                            "insecure-skip-tls-verify": True,
                        },
                    }
                ],
                "users": [{"name": "u", "user": {"token": "t"}}],
                "contexts": [{"name": "x", "context": {"cluster": "c", "user": "u"}}],
                "current-context": "x",
            }
        )
    )
    return path


def plugin_env(config: Path | None) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("GPUSHARE_")}
    env["LD_LIBRARY_PATH"] = str(MOCK_DIR)
    if config is not None:
        env["GPUSHARE_MOCK_CONFIG"] = str(config)
    return env


def command(*args: str) -> list[str]:
    """`gpushare device-plugin ARGS`, with the interception library built here."""
    return [
        sys.executable,
        "-m",
        "gpushare.cli.main",
        "device-plugin",
        "--library-host-path",
        str(LIBRARY),
        *args,
    ]
