"""Pods placed by the real kube-scheduler through the extender, on the local control plane."""

from __future__ import annotations

import json
import time
from typing import Any

from lightkube import Client
from lightkube.resources.core_v1 import Pod
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
    for i in range(4):
        place(ekube, ewatch, ens, gpu_pod(f"full{i}", gpu=1))
    ekube.create(gpu_pod("waiting", gpu=1), namespace=ens)
    note = _failed_scheduling(ekube, ens, "waiting")
    assert "0 whole free GPU(s), need 1" in note
    ekube.delete(Pod, "full2", namespace=ens, grace_period=0)
    bound = ewatch(Pod, "waiting", lambda p: bool(p.spec.nodeName), namespace=ens, timeout=60)
    assert bound.metadata.annotations[protocol.ANNOTATION_ALLOCATION]
