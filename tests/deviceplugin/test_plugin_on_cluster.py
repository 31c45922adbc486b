"""On the local control plane: the real kube-scheduler places pods through the extender, then
a simulated kubelet on each node admits every container through `gpushare device-plugin`
(a process per node, NVML from the mock with the node's GPU UUIDs, pods from the API server)
and each container must get exactly the GPUs and limits of its gpushare.io/allocation."""

from __future__ import annotations

import json
import signal
import subprocess
from collections import defaultdict
from pathlib import Path
from typing import Any

from deviceplugin_helpers import build_mock, command, mock_devices, plugin_env
from deviceplugin_peer import KubeletPeer, SimulatedKubelet
from lightkube.resources.core_v1 import Node, Pod

from gpushare import protocol

MEM = protocol.RESOURCE_GPU_MEMORY
CORE = protocol.RESOURCE_GPU_CORE
GPU = protocol.RESOURCE_GPU_COUNT
T4_MIB = 16 * 1024


def pod(
    name: str,
    containers: dict[str, dict[str, int]],
    init: tuple[str, ...] = (),
    annotations: dict[str, str] | None = None,
) -> Pod:
    def spec(cname: str) -> dict[str, Any]:
        limits = {resource: str(amount) for resource, amount in containers[cname].items()}
        return {"name": cname, "image": "busybox", "resources": {"limits": limits}}

    return Pod.from_dict(
        {
            "metadata": {"name": name, "annotations": annotations or {}},
            "spec": {
                "initContainers": [spec(c) for c in containers if c in init],
                "containers": [spec(c) for c in containers if c not in init],
            },
        }
    )


PODS = [
    ("whole", {"main": {GPU: 1}}, (), {}),
    ("solo", {"main": {MEM: 4, CORE: 30}}, (), {}),
    ("pair", {"main": {MEM: 8}}, (), {protocol.ANNOTATION_GPU_COUNT: "2"}),
    ("staged", {"setup": {MEM: 2}, "main": {MEM: 3}}, ("setup",), {}),
    ("twin-a", {"main": {MEM: 5}}, (), {}),
    ("twin-b", {"main": {MEM: 5}}, (), {}),
]
SPECS = {spec[0]: spec for spec in PODS}


def start_plugin(directory: Path, node: str, kubeconfig: Path) -> subprocess.Popen[str]:
    config = directory / "mock.json"
    config.write_text(json.dumps({"devices": mock_devices(node, 2, T4_MIB, "T4")}))
    return subprocess.Popen(
        command(
            "--node-name",
            node,
            "--kubeconfig",
            str(kubeconfig),
            "--device-plugin-dir",
            str(directory / "dp"),
            "--host-state-dir",
            str(directory / "host"),
        ),
        env=plugin_env(config),
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )


def test_simulated_kubelet_gets_what_the_extender_decided(
    extender_cluster, ekube, ens, ewatch, short_dir
):
    build_mock()
    bound = {}
    for name, containers, init, notes in PODS:
        ekube.create(pod(name, containers, init, notes), namespace=ens)
        bound[name] = ewatch(Pod, name, lambda p: bool(p.spec.nodeName), namespace=ens, timeout=30)
    by_node: dict[str, list[str]] = defaultdict(list)
    for name, placed in bound.items():
        assert placed.metadata.annotations[protocol.ANNOTATION_PHASE] == protocol.PHASE_ASSUMED
        by_node[placed.spec.nodeName].append(name)

    plugins: dict[str, subprocess.Popen[str]] = {}
    peers: dict[str, KubeletPeer] = {}
    kubelets: dict[str, SimulatedKubelet] = {}
    try:
        for node in by_node:
            directory = short_dir / node
            (directory / "dp").mkdir(parents=True)
            peers[node] = KubeletPeer(directory / "dp")
            plugins[node] = start_plugin(directory, node, extender_cluster.info.kubeconfig)
            kubelets[node] = SimulatedKubelet(peers[node])
        for node, names in by_node.items():
            peers[node].wait_registered(3, timeout_s=60)
            for name in names:
                placed = bound[name]
                allocation = protocol.decode_allocation(
                    placed.metadata.annotations[protocol.ANNOTATION_ALLOCATION]
                )
                _, containers, init, _ = SPECS[name]
                order = [
                    *(c for c in containers if c in init),
                    *(c for c in containers if c not in init),
                ]
                for container in order:
                    check_container(kubelets[node], containers[container], allocation[container])
        for name in bound:
            ewatch(
                Pod,
                name,
                lambda p: (
                    p.metadata.annotations.get(protocol.ANNOTATION_PHASE)
                    == protocol.PHASE_ALLOCATED
                ),
                namespace=ens,
                timeout=30,
            )
        for node in by_node:
            gpus = protocol.decode_gpus(
                ekube.get(Node, node).metadata.annotations[protocol.ANNOTATION_GPUS]
            )
            assert [(g.uuid, g.model, g.memory_mib, g.healthy) for g in gpus] == [
                (d["uuid"], "T4", T4_MIB, True) for d in mock_devices(node, 2, T4_MIB, "T4")
            ]
        for process in plugins.values():
            process.send_signal(signal.SIGTERM)
        for node, process in plugins.items():
            _, stderr = process.communicate(timeout=30)
            assert process.returncode == 0, stderr
            assert "Traceback" not in stderr
            served = [line for line in stderr.splitlines() if " served " in line]
            assert len(served) == sum(len(SPECS[n][1]) for n in by_node[node])
    finally:
        for kubelet in kubelets.values():
            kubelet.close()
        for process in plugins.values():
            if process.poll() is None:
                process.kill()
                process.communicate()
        for peer in peers.values():
            peer.stop()


def check_container(
    kubelet: SimulatedKubelet, requests: dict[str, int], shares: list[protocol.ShareInfo]
) -> None:
    """Admits one container resource by resource; its GPUs and limits are the annotation's."""
    served = None
    for resource, amount in requests.items():
        response = kubelet.admit(resource, amount)
        if resource in (MEM, GPU):
            served = response
        else:
            assert not response.envs and not response.mounts
    assert served is not None
    uuids = ",".join(share.uuid for share in shares)
    assert served.envs[protocol.ENV_NVIDIA_VISIBLE_DEVICES] == uuids
    mounts = {m.container_path: m.host_path for m in served.mounts}
    if GPU in requests:
        assert protocol.CONTAINER_LIMITS_PATH not in mounts
        return
    assert Path(mounts[protocol.CONTAINER_LIBRARY_PATH]).is_file()  # the built library
    preload = Path(mounts[protocol.CONTAINER_LD_SO_PRELOAD]).read_text()
    assert preload == protocol.CONTAINER_LIBRARY_PATH + "\n"
    assert Path(mounts[protocol.CONTAINER_STATE_DIR]).is_dir()
    limits = Path(mounts[protocol.CONTAINER_LIMITS_PATH]).read_text().splitlines()
    for index, share in enumerate(sorted(shares, key=lambda s: s.index)):  # PCI order
        assert f"memory_limit_bytes.{index}={share.memory_mib}MiB" in limits
    core = requests.get(CORE, 0)
    assert f"core_limit_percent={core}" in limits
    assert sum(share.memory_mib for share in shares) == requests[MEM] * 1024
