"""The monitor's API server side on the local control plane: the node's pods and Events."""

from __future__ import annotations

import json
import threading
import time
from collections.abc import Callable
from typing import Any

from lightkube import Client
from lightkube.resources.core_v1 import Event, Node, Pod
from monitor_helpers import container_id, hold, mock_env, release, start_monitor, write_proc

from gpushare import protocol
from gpushare.monitor.kube import COMPONENT, EventRecorder, KubePodSource
from gpushare.monitor.pods import containers_of


def _until(predicate: Callable[[], Any], what: str, deadline_s: float = 30) -> Any:
    deadline = time.monotonic() + deadline_s
    pause = threading.Event()  # never set: a bounded wait between looks
    while True:
        value = predicate()
        if value:
            return value
        assert time.monotonic() < deadline, f"{what}: not within {deadline_s} s"
        pause.wait(0.05)


def _gpu_pod(name: str, mem: int) -> Pod:
    return Pod.from_dict(
        {
            "metadata": {"name": name},
            "spec": {
                "containers": [
                    {
                        "name": "main",
                        "image": "busybox",
                        "resources": {"limits": {protocol.RESOURCE_GPU_MEMORY: str(mem)}},
                    }
                ]
            },
        }
    )


def test_pod_source_follows_the_nodes_gpu_pods(ekube: Client, ewatch, ens: str) -> None:
    ekube.create(_gpu_pod("a", 2), namespace=ens)
    bound = ewatch(Pod, "a", lambda p: bool(p.spec.nodeName), namespace=ens, timeout=30)
    node = bound.spec.nodeName
    other = next(n.metadata.name for n in ekube.list(Node) if n.metadata.name != node)
    # A pod of another node (bound there directly) must not show on this node.
    elsewhere = _gpu_pod("elsewhere", 1)
    elsewhere.spec.nodeName = other
    ekube.create(elsewhere, namespace=ens)
    source = KubePodSource(ekube, node, resync_s=30)
    source.start()
    try:
        containers = _until(
            lambda: [c for c in source.containers() if c.namespace == ens], "pod a listed"
        )
        assert source.synced
        assert containers == list(containers_of(bound.to_dict()))
        (a,) = containers
        share = json.loads(bound.metadata.annotations[protocol.ANNOTATION_ALLOCATION])["main"][0]
        assert (a.pod, a.name, a.shares[0].uuid, a.shares[0].memory_mib) == (
            "a",
            "main",
            share["uuid"],
            2048,
        )
        ekube.create(_gpu_pod("b", 1), namespace=ens)
        placed = ewatch(Pod, "b", lambda p: bool(p.spec.nodeName), namespace=ens, timeout=30)
        expected = {"a"} | ({"b"} if placed.spec.nodeName == node else set())
        _until(
            lambda: {c.pod for c in source.containers() if c.namespace == ens} == expected,
            "pod b seen",
        )
        ekube.delete(Pod, "a", namespace=ens, grace_period=0)
        _until(
            lambda: "a" not in {c.pod for c in source.containers() if c.namespace == ens},
            "pod a gone",
        )
    finally:
        source.stop()


def test_gpu_health_follows_the_node_annotation(ekube: Client, extender_cluster) -> None:
    node = sorted(extender_cluster.cache.nodes)[0]
    original = ekube.get(Node, node).metadata.annotations[protocol.ANNOTATION_GPUS]
    gpus = protocol.decode_gpus(original)
    sick = [
        protocol.GpuInfo(g.uuid, g.index, g.model, g.memory_mib, g.numa, g.index != 1) for g in gpus
    ]
    source = KubePodSource(ekube, node, resync_s=30)
    source.start()
    try:
        _until(lambda: source.gpu_health() == {g.uuid: True for g in gpus}, "health listed")
        patch = {
            "metadata": {"annotations": {protocol.ANNOTATION_GPUS: protocol.encode_gpus(sick)}}
        }
        ekube.patch(Node, node, patch)
        _until(
            lambda: source.gpu_health() == {g.uuid: g.index != 1 for g in gpus},
            "GPU 1 unhealthy",
        )
    finally:
        ekube.patch(Node, node, {"metadata": {"annotations": {protocol.ANNOTATION_GPUS: original}}})
        source.stop()


def test_event_on_the_pod_carries_the_figures(ekube: Client, ewatch, ens: str) -> None:
    ekube.create(_gpu_pod("victim", 1), namespace=ens)
    bound = ewatch(Pod, "victim", lambda p: bool(p.spec.nodeName), namespace=ens, timeout=30)
    (container,) = containers_of(bound.to_dict())
    message = "container main used 2.00 GiB of GPU x (NVML) against its limit of 1.00 GiB"
    EventRecorder(ekube, bound.spec.nodeName).record(container, "GPUMemoryOverLimit", message)
    (event,) = [e for e in ekube.list(Event, namespace=ens) if e.reason == "GPUMemoryOverLimit"]
    assert event.involvedObject.name == "victim" and event.involvedObject.kind == "Pod"
    assert event.involvedObject.uid == bound.metadata.uid
    assert event.message == message and event.type == "Warning"
    assert event.source.component == COMPONENT and event.source.host == bound.spec.nodeName


def test_the_agent_on_the_cluster_stops_an_over_limit_pod_and_records_an_event(
    native_build, tmp_path, proc_root, ekube: Client, ewatch, ens: str, extender_cluster
) -> None:
    """`gpushare monitor` as deployed: pods from the API server, a process of a placed pod
    (kubelet's part played by a status patch and a fixture /proc) holding more than its
    share on the mock GPU is stopped, and the Event is on the pod."""
    ekube.create(_gpu_pod("hog", 1), namespace=ens)
    bound = ewatch(Pod, "hog", lambda p: bool(p.spec.nodeName), namespace=ens, timeout=30)
    node = bound.spec.nodeName
    share = json.loads(bound.metadata.annotations[protocol.ANNOTATION_ALLOCATION])["main"][0]
    cid = container_id(f"{ens}/hog/main")
    status = {
        "name": "main",
        "image": "busybox",
        "imageID": "",
        "ready": True,
        "restartCount": 0,
        "containerID": f"containerd://{cid}",
        "state": {"running": {}},
    }
    ekube.patch(
        Pod.Status,
        "hog",
        {"status": {"phase": "Running", "containerStatuses": [status]}},
        namespace=ens,
    )
    # The mock GPU at the share's node index, with the share's UUID, so NVML's view and the
    # allocation agree.
    devices = [
        {
            "name": "Tesla T4",
            "uuid": f"GPU-{i:08x}-0000-4000-8000-000000000000",
            "memory_mib": 16384,
            "sm_count": 40,
        }
        for i in range(2)
    ]
    devices[share["index"]]["uuid"] = share["uuid"]
    config = tmp_path / "mock.json"
    config.write_text(json.dumps({"driver_version": 12080, "devices": devices}))
    hog = hold(config, share["index"], 2048)  # 1 GiB share: 2 GiB + a context is over
    bystander = hold(config, share["index"], 4096)  # a host process: never touched
    uid = bound.metadata.uid.replace("-", "_")
    write_proc(
        proc_root,
        hog.pid,
        f"0::/kubepods.slice/kubepods-pod{uid}.slice/cri-containerd-{cid}.scope\n",
    )
    write_proc(proc_root, bystander.pid, "0::/system.slice/render.service\n")
    env = mock_env(config)
    env["KUBECONFIG"] = str(extender_cluster.info.kubeconfig)
    monitor, _ = start_monitor(
        [
            "--node-name",
            node,
            "--proc-root",
            str(proc_root),
            "--state-root",
            str(tmp_path),
            "--grace",
            "0.5",
            "--interval",
            "0.2",
            "--tolerance-mib",
            "0",
        ],
        env,
    )
    try:
        assert hog.wait(timeout=60) == -9
        events = _until(
            lambda: [
                e for e in ekube.list(Event, namespace=ens) if e.reason == "GPUMemoryOverLimit"
            ],
            "the Event",
        )
        (event,) = events
        assert event.involvedObject.name == "hog" and event.type == "Warning"
        assert "used 2.29 GiB of GPU" in event.message and "limit of 1.00 GiB" in event.message
        assert f"stopped its GPU processes [{hog.pid}] (SIGKILL)" in event.message
        assert bystander.poll() is None
    finally:
        monitor.terminate()
        monitor.communicate(timeout=20)
        release([hog, bystander])
