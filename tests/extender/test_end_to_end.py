"""Pods placed by the real kube-scheduler through the extender, on the local control plane."""

from __future__ import annotations

import dataclasses
import json
import threading
import time
from typing import Any

from lightkube import Client
from lightkube.resources.core_v1 import Node, Pod
from lightkube.resources.events_v1 import Event

from gpushare import protocol

GIB = 1024


def gpu_pod(name: str, annotations: dict[str, str] | None = None, **limits: int) -> Pod:
    names = {
        "mem": protocol.RESOURCE_GPU_MEMORY,
        "core": protocol.RESOURCE_GPU_CORE,
        "gpu": protocol.RESOURCE_GPU_COUNT,
    }
    resources = {names[k]: str(v) for k, v in limits.items()}
    return Pod.from_dict(
        {
            "metadata": {"name": name, "annotations": annotations or {}},
            "spec": {
                "containers": [
                    {"name": "main", "image": "busybox", "resources": {"limits": resources}}
                ]
            },
        }
    )


def place(kube: Client, ewatch, namespace: str, pod: Pod) -> tuple[str, list[dict[str, Any]]]:
    """Create the pod and wait until it is bound; its node and its GPU shares."""
    kube.create(pod, namespace=namespace)
    name = pod.metadata.name
    bound = ewatch(Pod, name, lambda p: bool(p.spec.nodeName), namespace=namespace, timeout=30)
    allocation = json.loads(bound.metadata.annotations[protocol.ANNOTATION_ALLOCATION])
    assert bound.metadata.annotations[protocol.ANNOTATION_PHASE] == protocol.PHASE_ASSUMED
    return bound.spec.nodeName, allocation["main"]


def test_binpack_fills_a_gpu_then_a_node_before_the_next(ekube, ewatch, ens) -> None:
    placed = [place(ekube, ewatch, ens, gpu_pod(f"p{i}", mem=6)) for i in range(3)]
    (node_a, (a,)), (node_b, (b,)), (node_c, (c,)) = placed
    assert node_a == node_b == node_c
    assert a["uuid"] == b["uuid"] != c["uuid"]
    assert a["memoryMiB"] == 6 * GIB


def test_multi_gpu_share_lands_on_distinct_gpus_of_one_node(ekube, ewatch, ens) -> None:
    annotations = {protocol.ANNOTATION_GPU_COUNT: "2"}
    _, shares = place(ekube, ewatch, ens, gpu_pod("multi", annotations, mem=8, core=20))
    assert len({s["uuid"] for s in shares}) == 2
    assert {(s["memoryMiB"], s["core"]) for s in shares} == {(4 * GIB, 20)}


def test_exclusive_pod_gets_a_whole_gpu(ekube, ewatch, ens) -> None:
    _, (whole,) = place(ekube, ewatch, ens, gpu_pod("whole", gpu=1))
    assert whole["exclusive"] is True
    assert (whole["memoryMiB"], whole["core"]) == (16 * GIB, 100)


def _failed_scheduling(kube: Client, namespace: str, name: str, timeout: float = 30) -> str:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        for event in kube.list(Event, namespace=namespace):
            if event.reason == "FailedScheduling" and event.regarding.name == name:
                return event.note or ""
        time.sleep(0.2)
    raise AssertionError(f"no FailedScheduling event for {name} in {timeout} s")


def test_unschedulable_pod_says_why(ekube, ens) -> None:
    ekube.create(gpu_pod("huge", mem=100), namespace=ens)
    note = _failed_scheduling(ekube, ens, "huge")
    assert "0/2 nodes are available" in note
    assert "no GPU with 100 GiB free (largest free:" in note


def test_deleting_pods_frees_their_share(ekube, ewatch, ens) -> None:
    nodes = [place(ekube, ewatch, ens, gpu_pod(f"full{i}", gpu=1))[0] for i in range(4)]
    ekube.create(gpu_pod("waiting", gpu=1), namespace=ens)
    note = _failed_scheduling(ekube, ens, "waiting")
    assert "0 whole free GPU(s), need 1" in note
    deleted_ns = time.time_ns()
    ekube.delete(Pod, "full2", namespace=ens, grace_period=0)
    # kube-scheduler retries a refused pod on the next cluster event, at most 10 s of backoff
    # later. If the deletion reaches it before the extender's cache, that retry is refused
    # again; the extender's node annotation once its cache has let the share go makes the
    # next retry (extender/nudge.py). Without it the pod could wait 5 minutes.
    bound = ewatch(Pod, "waiting", lambda p: bool(p.spec.nodeName), namespace=ens, timeout=45)
    assert bound.metadata.annotations[protocol.ANNOTATION_ALLOCATION]

    # The refused pod was waiting, so the freed node was nudged: its annotation is written
    # after the cache let the share go (it may land after the bind, which a retry of
    # kube-scheduler's own can make first).
    def nudged(obj: Node) -> bool:
        text = (obj.metadata.annotations or {}).get(protocol.ANNOTATION_CAPACITY_FREED, "0")
        return int(text) > deleted_ns

    ewatch(Node, nodes[2], nudged, timeout=30)


def _label_nodes_policy(kube: Client, cache: Any, policy: str | None) -> None:
    """Set (None: remove) every node's gpushare.io/policy label; return once the cache has it."""
    names = list(cache.nodes)
    for name in names:
        kube.patch(Node, name, {"metadata": {"labels": {protocol.LABEL_POLICY: policy}}})
    want = policy or protocol.DEFAULT_NODE_POLICY
    pause = threading.Event()  # never set: a bounded wait between looks at the cache
    deadline = time.monotonic() + 10
    while not all(cache.nodes[name].policy == want for name in names):
        assert time.monotonic() < deadline, "the extender's cache did not see the node labels"
        pause.wait(0.02)


def test_spread_does_the_opposite_of_binpack(ekube, ewatch, ens, extender_cluster) -> None:
    _label_nodes_policy(ekube, extender_cluster.cache, "spread")
    try:
        placed = [place(ekube, ewatch, ens, gpu_pod(f"s{i}", mem=2)) for i in range(4)]
    finally:
        _label_nodes_policy(ekube, extender_cluster.cache, None)
    # 2 nodes of 2 GPUs: spread puts each of the 4 shares on a GPU of its own (binpack, in
    # test_binpack_fills_a_gpu_then_a_node_before_the_next, stacks them on one).
    uuids = [share["uuid"] for _, (share,) in placed]
    assert len(set(uuids)) == 4
    assert len({node for node, _ in placed}) == 2


def test_two_gpu_containers_and_a_gpu_init_container_each_get_an_allocation(
    ekube, ewatch, ens
) -> None:
    def container(name: str, **limits: str) -> dict[str, Any]:
        return {"name": name, "image": "busybox", "resources": {"limits": limits}}

    mem, core = protocol.RESOURCE_GPU_MEMORY, protocol.RESOURCE_GPU_CORE
    pod = Pod.from_dict(
        {
            "metadata": {"name": "two"},
            "spec": {
                "initContainers": [container("setup", **{mem: "1"})],
                "containers": [
                    container("a", **{mem: "3"}),
                    container("b", **{mem: "5", core: "30"}),
                    container("plain"),
                ],
            },
        }
    )
    ekube.create(pod, namespace=ens)
    bound = ewatch(Pod, "two", lambda p: bool(p.spec.nodeName), namespace=ens, timeout=30)
    allocation = protocol.decode_allocation(
        bound.metadata.annotations[protocol.ANNOTATION_ALLOCATION]
    )
    assert set(allocation) == {"setup", "a", "b"}
    (setup,), (a,), (b,) = allocation["setup"], allocation["a"], allocation["b"]
    assert (setup.memory_mib, a.memory_mib, b.memory_mib) == (GIB, 3 * GIB, 5 * GIB)
    assert (a.core, b.core) == (0, 30)
    node_gpus = {
        gpu.uuid
        for gpu in protocol.decode_gpus(
            ekube.get(Node, bound.spec.nodeName).metadata.annotations[protocol.ANNOTATION_GPUS]
        )
    }
    assert {setup.uuid, a.uuid, b.uuid} <= node_gpus


def test_compat_aliyun_places_a_pod_written_for_the_old_system(
    ekube, ewatch, ens, extender_cluster
) -> None:
    cache = extender_cluster.cache
    before = cache.units
    cache.units = dataclasses.replace(before, compat_aliyun=True)  # --compat-aliyun
    try:
        limits = {protocol.ALIYUN_RESOURCE_GPU_MEMORY: "3"}
        old = Pod.from_dict(
            {
                "metadata": {"name": "old-style"},
                "spec": {
                    "containers": [
                        {"name": "main", "image": "busybox", "resources": {"limits": limits}}
                    ]
                },
            }
        )
        ekube.create(old, namespace=ens)
        pod = ewatch(Pod, "old-style", lambda p: bool(p.spec.nodeName), namespace=ens, timeout=30)
    finally:
        cache.units = before
    annotations = pod.metadata.annotations
    (share,) = protocol.decode_allocation(annotations[protocol.ANNOTATION_ALLOCATION])["main"]
    assert share.memory_mib == 3 * GIB
    assert annotations[protocol.ALIYUN_ANNOTATION_GPU_INDEX] == str(share.index)
    assert annotations[protocol.ALIYUN_ANNOTATION_POD_MEMORY] == "3"
    assert annotations[protocol.ALIYUN_ANNOTATION_ASSIGNED] == "false"
    assert int(annotations[protocol.ALIYUN_ANNOTATION_ASSUME_TIME]) > 0
