"""Two identical containers that kubelet admits in another order than they were assumed: the
plugin reads kubelet's pod resources record and rewrites each pod's gpushare.io/allocation to
what its container really got. The pure swap detection, then through the kubelet peer (its
pod resources API on a unix socket)."""

from __future__ import annotations

import logging
from collections import Counter
from typing import Any

import pytest
from deviceplugin_helpers import make_pod, share, start_harness, stop_harness
from deviceplugin_peer import wait_until

from gpushare import protocol
from gpushare.deviceplugin import matching
from gpushare.deviceplugin.podresources import held_devices
from gpushare.deviceplugin.podresources_v1 import api_pb2 as pr_pb2
from gpushare.deviceplugin.swaps import Held, find_swaps
from gpushare.extender.cache import allocations_from_pod

MEM = protocol.RESOURCE_GPU_MEMORY
GPU = protocol.RESOURCE_GPU_COUNT
UUIDS = [f"GPU-{i:08d}-0000-0000-0000-000000000000" for i in range(4)]


def shares(index: int, memory_mib: int = 2048) -> list[protocol.ShareInfo]:
    return [protocol.ShareInfo(UUIDS[index], index, memory_mib, 0)]


def pending_of(pods: list[dict[str, Any]]) -> dict[str, matching.Pending]:
    found = matching.pending_containers(pods, "node-a", 1024).containers
    return {p.key.split("/")[1]: p for p in found}


def allocation(pod: dict[str, Any]) -> dict[str, list[protocol.ShareInfo]]:
    return protocol.decode_allocation(
        pod["metadata"]["annotations"][protocol.ANNOTATION_ALLOCATION]
    )


def two_pods() -> tuple[list[dict[str, Any]], dict[str, matching.Pending]]:
    pods = [
        make_pod("older", {"c": {MEM: 2}}, {"c": shares(1)}, 100),
        make_pod("newer", {"c": {MEM: 2}}, {"c": shares(3)}, 200),
    ]
    return pods, pending_of(pods)


X = (MEM, frozenset({"1-0", "1-1"}))
Y = (MEM, frozenset({"3-0", "3-1"}))


# -- the pure detection ----------------------------------------------------------------------


def test_a_reported_swap_rewrites_both_pods():
    pods, pending = two_pods()
    given = {X: pending["older"], Y: pending["newer"]}  # older's decision served for X
    held = [Held("ns/newer", "c", *X), Held("ns/older", "c", *Y)]  # but newer holds X
    found = find_swaps(given, held, pods)
    assert found.settled == {X, Y}
    assert len(found.cycles) == 1
    rewrites = {r.name: protocol.decode_allocation(r.allocation) for r in found.rewrites}
    assert rewrites == {"newer": {"c": shares(1)}, "older": {"c": shares(3)}}
    assert {(r.namespace, r.uid) for r in found.rewrites} == {
        ("ns", "uid-newer"),
        ("ns", "uid-older"),
    }
    assert found.problems == ()


def test_the_right_order_settles_without_rewrites():
    pods, pending = two_pods()
    given = {X: pending["older"], Y: pending["newer"]}
    held = [Held("ns/older", "c", *X), Held("ns/newer", "c", *Y)]
    found = find_swaps(given, held, pods)
    assert (found.settled, found.cycles, found.rewrites) == ({X, Y}, (), ())


def test_half_a_swap_is_left_alone_until_kubelet_reports_both():
    pods, pending = two_pods()
    given = {X: pending["older"], Y: pending["newer"]}
    found = find_swaps(given, [Held("ns/newer", "c", *X)], pods)
    assert (found.settled, found.cycles, found.rewrites) == (frozenset(), (), ())
    # Nothing reported, or IDs this plugin never served: nothing either.
    other = Held("ns/x", "c", MEM, frozenset({"0-0", "0-1"}))
    assert find_swaps(given, [other], pods).settled == frozenset()


def test_a_three_way_cycle_and_an_already_rewritten_pod():
    pods = [
        make_pod(name, {"c": {MEM: 2}}, {"c": shares(index)}, time)
        for name, index, time in (("a", 0, 1), ("b", 1, 2), ("c", 2, 3))
    ]
    pending = pending_of(pods)
    ids = {name: (MEM, frozenset({f"{i}-0", f"{i}-1"})) for i, name in enumerate("abc")}
    given = {ids[name]: pending[name] for name in "abc"}
    # a holds b's decision, b holds c's, c holds a's.
    held = [Held(f"ns/{h}", "c", *ids[d]) for h, d in (("a", "b"), ("b", "c"), ("c", "a"))]
    found = find_swaps(given, held, pods)
    assert found.settled == set(ids.values())
    got = {r.name: protocol.decode_allocation(r.allocation)["c"] for r in found.rewrites}
    assert got == {"a": shares(1), "b": shares(2), "c": shares(0)}
    # Once the annotations say so, the same record needs no rewrite.
    for pod in pods:
        text = next(r.allocation for r in found.rewrites if r.uid == pod["metadata"]["uid"])
        pod["metadata"]["annotations"][protocol.ANNOTATION_ALLOCATION] = text
    again = find_swaps(given, held, pods)
    assert again.settled == set(ids.values()) and again.rewrites == ()


def test_a_gone_or_malformed_pod_is_reported_and_the_rest_rewritten():
    pods, pending = two_pods()
    given = {X: pending["older"], Y: pending["newer"]}
    held = [Held("ns/newer", "c", *X), Held("ns/older", "c", *Y)]
    pods[0]["metadata"]["annotations"][protocol.ANNOTATION_ALLOCATION] = "{"
    found = find_swaps(given, held, [*pods[1:], pods[0]])
    assert [r.name for r in found.rewrites] == ["newer"]
    assert len(found.problems) == 1 and found.problems[0].startswith("ns/older: ")
    found = find_swaps(given, held, pods[1:])
    assert found.problems == ("ns/older: gone (uid uid-older); nothing to rewrite",)


def test_held_devices_reads_a_list_response():
    response = pr_pb2.ListPodResourcesResponse()
    pod = response.pod_resources.add(name="p", namespace="ns")
    container = pod.containers.add(name="c")
    container.devices.add(resource_name=MEM, device_ids=["1-0", "1-1"])
    container.devices.add(resource_name=protocol.RESOURCE_GPU_CORE, device_ids=["1-0"])
    container.devices.add(resource_name="nvidia.com/gpu", device_ids=["GPU-x"])
    response.pod_resources.add(name="cpu-only", namespace="ns").containers.add(name="c")
    assert held_devices(response, matching.DECIDING_RESOURCES) == [
        Held("ns/p", "c", MEM, frozenset({"1-0", "1-1"}))
    ]


def test_one_shot_init_containers_are_not_awaited():
    pod = make_pod("p", {"i": {MEM: 1}, "s": {MEM: 1}, "c": {MEM: 1}}, None, 1, init=("i", "s"))
    one = shares(0, 1024)
    pod["metadata"]["annotations"][protocol.ANNOTATION_ALLOCATION] = protocol.encode_allocation(
        {"i": one, "s": one, "c": one}
    )
    pod["spec"]["initContainers"][1]["restartPolicy"] = "Always"  # a sidecar: reported
    found = matching.pending_containers([pod], "node-a", 1024).containers
    assert {p.container: p.one_shot for p in found} == {"i": True, "s": False, "c": False}


# -- through the kubelet peer ----------------------------------------------------------------


def gpu_memory_from_annotations(pods: list[dict[str, Any]]) -> Counter[str]:
    """MiB per GPU as the extender charges it from the pods' annotations."""
    used: Counter[str] = Counter()
    for pod in pods:
        for charge in (allocations_from_pod(pod) or {}).values():
            for gpu_share in charge.gpu_shares:
                used[gpu_share.uuid] += gpu_share.memory_mib
    return used


def decision(nvml, index: int, resource: str) -> list[protocol.ShareInfo]:
    if resource == GPU:
        return [protocol.ShareInfo(nvml.gpus[index].uuid, index, 16384, 100, exclusive=True)]
    return [share(nvml.gpus, index, 2048)]


def admit_newer_first(harness, nvml, resource: str = MEM) -> dict[str, Any]:
    """Two identical pods, assumed on GPUs 1 (older) and 3 (newer); kubelet admits the newer
    first, so each container is served the other's decision. What each container got."""
    size = 2 if resource == MEM else 1
    harness.pods.items.extend(
        [
            make_pod("older", {"c": {resource: size}}, {"c": decision(nvml, 1, resource)}, 100),
            make_pod("newer", {"c": {resource: size}}, {"c": decision(nvml, 3, resource)}, 200),
        ]
    )
    newer = harness.kubelet.admit(resource, size, pod="ns/newer", container="c")
    older = harness.kubelet.admit(resource, size, pod="ns/older", container="c")
    return {"newer": newer, "older": older}


def visible(response: Any) -> str:
    return response.envs[protocol.ENV_NVIDIA_VISIBLE_DEVICES]


@pytest.mark.parametrize("resource", [MEM, GPU])
def test_pods_admitted_in_the_other_order_end_with_the_gpus_they_got(
    harness, nvml, caplog, resource
):
    caplog.set_level(logging.WARNING, logger="gpushare.deviceplugin")
    got = admit_newer_first(harness, nvml, resource)
    # The swap itself: each container was served the other's decision.
    assert visible(got["newer"]) == nvml.gpus[1].uuid
    assert visible(got["older"]) == nvml.gpus[3].uuid
    pods = {p["metadata"]["name"]: p for p in harness.pods.items}
    wait_until(lambda: len(harness.pods.rewritten) == 2, 10, "both allocations rewritten")
    assert allocation(pods["newer"]) == {"c": decision(nvml, 1, resource)}
    assert allocation(pods["older"]) == {"c": decision(nvml, 3, resource)}
    for name in ("newer", "older"):  # each annotation names what its container got
        assert [s.uuid for s in allocation(pods[name])["c"]] == [visible(got[name])]
    # The extender's accounting from the annotations is what the containers hold.
    memory = 2048 if resource == MEM else 16384
    held = Counter({nvml.gpus[1].uuid: memory, nvml.gpus[3].uuid: memory})
    assert gpu_memory_from_annotations(list(pods.values())) == held
    assert {(ns, name, uid) for ns, name, uid, _ in harness.pods.rewritten} == {
        ("ns", "newer", "uid-newer"),
        ("ns", "older", "uid-older"),
    }
    assert harness.plugin.unreported() == 0
    swaps = [r for r in caplog.records if "another order than assumed" in r.getMessage()]
    assert len(swaps) == 1 and "\n" not in swaps[0].getMessage()
    # Each shared container keeps the files it was served (whole GPUs get none); a marker
    # says whose they now are, for the monitor (statefile.owners).
    containers = harness.plugin.files.containers
    marker = protocol.HOST_OWNER_FILE
    if resource == MEM:
        assert (containers / "uid-older" / "c" / marker).read_text() == "uid-newer/c\n"
        assert (containers / "uid-newer" / "c" / marker).read_text() == "uid-older/c\n"
    else:
        assert not list(containers.glob(f"*/*/{marker}"))
    # The older pod's files (served to the newer pod's container) live while it does.
    pods["older"]["status"]["phase"] = "Succeeded"
    assert "uid-older" in harness.plugin.live_uids()


def test_the_right_order_rewrites_nothing(harness, nvml):
    harness.pods.items.extend(
        [
            make_pod("older", {"c": {MEM: 2}}, {"c": [share(nvml.gpus, 1, 2048)]}, 100),
            make_pod("newer", {"c": {MEM: 2}}, {"c": [share(nvml.gpus, 3, 2048)]}, 200),
        ]
    )
    before = {p["metadata"]["name"]: allocation(p) for p in harness.pods.items}
    older = harness.kubelet.admit(MEM, 2, pod="ns/older", container="c")
    newer = harness.kubelet.admit(MEM, 2, pod="ns/newer", container="c")
    assert visible(older) == nvml.gpus[1].uuid and visible(newer) == nvml.gpus[3].uuid
    wait_until(lambda: harness.plugin.unreported() == 0, 10, "kubelet's record looked at")
    assert harness.pods.rewritten == []
    assert {p["metadata"]["name"]: allocation(p) for p in harness.pods.items} == before


def test_without_pod_resources_allocate_works_and_the_swap_is_fixed_later(nvml, short_dir, caplog):
    caplog.set_level(logging.INFO, logger="gpushare.deviceplugin")
    harness = start_harness(short_dir, nvml.gpus, pod_resources=False, reconcile_interval_s=0.2)
    try:
        got = admit_newer_first(harness, nvml)  # Allocate does not need kubelet's record
        assert visible(got["newer"]) == nvml.gpus[1].uuid
        assert harness.pods.allocated  # and phases are written as ever
        failures = lambda: [  # noqa: E731
            r for r in caplog.records if "kubelet pod resources:" in r.getMessage()
        ]
        wait_until(failures, 10, "the missing socket logged")
        assert harness.pods.rewritten == []
        harness.peer.serve_pod_resources()  # kubelet's API comes (back): the safety net looks
        wait_until(lambda: len(harness.pods.rewritten) == 2, 10, "both allocations rewritten")
        messages = [r.getMessage() for r in failures()]
        assert len([m for m in messages if "trying again later" in m]) == 1  # logged once
        assert "no such socket" in messages[0]
        assert any("readable again" in m for m in messages)
    finally:
        stop_harness(harness)
    names = {p["metadata"]["name"]: allocation(p)["c"][0].uuid for p in harness.pods.items}
    assert names == {"newer": visible(got["newer"]), "older": visible(got["older"])}
